//! HPKE (RFC 9180) base mode with suite 1, through the `hpke` crate.

use hpke::aead::ChaCha20Poly1305;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem, OpModeR, OpModeS, Serializable};
use rand_core::{CryptoRng, RngCore};
use zeroize::Zeroizing;

use super::error::{Result, WrapError};

/// HPKE `info`: binds every envelope to this protocol and version.
const INFO: &[u8] = b"keyfence/v2 envelope";

type KemPrivate = <X25519HkdfSha256 as Kem>::PrivateKey;
type KemPublic = <X25519HkdfSha256 as Kem>::PublicKey;
type KemEnc = <X25519HkdfSha256 as Kem>::EncappedKey;

/// A fresh X25519 key pair: (private, public).
pub(crate) fn keypair<R: RngCore + CryptoRng>(rng: &mut R) -> (Zeroizing<[u8; 32]>, [u8; 32]) {
    let (sk, pk) = X25519HkdfSha256::gen_keypair(rng);
    let mut private = Zeroizing::new([0u8; 32]);
    private.copy_from_slice(&sk.to_bytes());
    (private, pk.to_bytes().into())
}

/// The public key of a private key.
pub(crate) fn public_of(private: &[u8; 32]) -> Result<[u8; 32]> {
    let sk = KemPrivate::from_bytes(private).map_err(|_| WrapError::Tampered { object: "sealed policy key" })?;
    Ok(X25519HkdfSha256::sk_to_pk(&sk).to_bytes().into())
}

/// Seals `plaintext` to `public` with `aad`; returns (enc, ciphertext).
pub(crate) fn seal<R: RngCore + CryptoRng>(
    public: &[u8; 32], aad_prefix: &dyn Fn(&[u8]) -> Vec<u8>, plaintext: &[u8], rng: &mut R,
) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let pk = KemPublic::from_bytes(public)
        .map_err(|_| WrapError::Malformed { object: "policy key", reason: "invalid X25519 public key".into() })?;
    // The enc is part of the associated data, so encapsulate first.
    let (enc, mut ctx) = hpke::setup_sender::<ChaCha20Poly1305, HkdfSha256, X25519HkdfSha256, R>(&OpModeS::Base, &pk, INFO, rng)
        .map_err(|_| WrapError::Malformed { object: "policy key", reason: "HPKE encapsulation failed".into() })?;
    let enc = enc.to_bytes().to_vec();
    let aad = aad_prefix(&enc);
    let ct = ctx.seal(plaintext, &aad).map_err(|_| WrapError::Malformed { object: "envelope", reason: "HPKE seal failed".into() })?;
    Ok((enc, aad, ct))
}

/// Opens a ciphertext sealed by [`seal`].
pub(crate) fn open(private: &[u8; 32], enc: &[u8], aad: &[u8], ciphertext: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
    let tampered = || WrapError::Tampered { object: "envelope" };
    let sk = KemPrivate::from_bytes(private).map_err(|_| tampered())?;
    let enc = KemEnc::from_bytes(enc).map_err(|_| tampered())?;
    hpke::single_shot_open::<ChaCha20Poly1305, HkdfSha256, X25519HkdfSha256>(&OpModeR::Base, &sk, &enc, INFO, ciphertext, aad)
        .map(Zeroizing::new)
        .map_err(|_| tampered())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `enc` of small order (the identity, zero, and the other
    /// low-order points of Curve25519) gives an all-zero shared secret:
    /// RFC 9180 requires refusing it, and a forger would otherwise make a
    /// ciphertext anyone can open. The envelope's `Tampered` is the answer.
    #[test]
    fn small_order_encapsulations_are_refused() {
        let (private, public) = keypair(&mut rand_core::OsRng);
        let (enc, aad, ct) = seal(&public, &|e: &[u8]| e.to_vec(), b"s", &mut rand_core::OsRng).unwrap();
        assert_eq!(&open(&private, &enc, &aad, &ct).unwrap()[..], b"s");
        let mut one = [0u8; 32];
        one[0] = 1;
        let mut order8 = [0u8; 32];
        order8.copy_from_slice(&[
            0xe0, 0xeb, 0x7a, 0x7c, 0x3b, 0x41, 0xb8, 0xae, 0x16, 0x56, 0xe3, 0xfa, 0xf1, 0x9f, 0xc4, 0x6a, 0xda, 0x09, 0x8d, 0xeb, 0x9c,
            0x32, 0xb1, 0xfd, 0x86, 0x62, 0x05, 0x16, 0x5f, 0x49, 0xb8, 0x00,
        ]);
        for bad in [[0u8; 32], one, order8] {
            assert!(matches!(open(&private, &bad, &bad, &ct), Err(WrapError::Tampered { object: "envelope" })));
        }
    }
}
