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
pub(crate) fn seal<R: RngCore + CryptoRng>(public: &[u8; 32], aad_prefix: &dyn Fn(&[u8]) -> Vec<u8>, plaintext: &[u8], rng: &mut R) -> Result<(Vec<u8>, Vec<u8>, Vec<u8>)> {
    let pk = KemPublic::from_bytes(public).map_err(|_| WrapError::Malformed { object: "policy key", reason: "invalid X25519 public key".into() })?;
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
