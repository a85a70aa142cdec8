//! The one public private-key handle, over a key in this process
//! ([`LocalKey`]) or a key held elsewhere ([`HeldKey`]).

use std::fmt;
use std::time::{Duration, Instant};

use super::held_key::HeldKey;
use super::local_key::LocalKey;
use super::types::{Algorithm, Input, KeyError, KeyKind, Operation, Output, SignError};

/// How long [`PrivateKey::perform`] waits for a key held elsewhere.
const HELD_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

/// A private key: in this process's AWS-LC memory, or held by an
/// key process (this process then has only a handle).
///
/// Loaded from PEM or DER (PKCS#1, PKCS#8, SEC1) or from bytes in memory
/// (an opened envelope), so the secret need never touch disk. AWS-LC
/// frees key memory with `OPENSSL_free`, which overwrites it first, so the
/// secret is zeroized on drop; buffers keyfence itself builds from secrets
/// are zeroizing. `Debug` shows the kind only.
///
/// The operations here are synchronous and run on the calling thread; the
/// [`Engine`](super::Engine) runs them on its executors.
///
/// ```
/// use keyfence::sign::{Algorithm, KeyKind, PrivateKey};
/// let key = PrivateKey::generate(KeyKind::EcP256).unwrap();
/// let sig = key.sign(Algorithm::EcdsaP256Sha256, b"hello").unwrap();
/// assert!(sig.len() <= KeyKind::EcP256.max_output_len());
/// ```
pub struct PrivateKey {
    repr: Repr,
}

enum Repr {
    Local(LocalKey),
    Held(HeldKey),
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("PrivateKey");
        d.field("kind", &self.kind());
        if let Repr::Held(h) = &self.repr {
            d.field("held_by", &h.holder().name()).field("id", &h.id());
        }
        d.finish_non_exhaustive()
    }
}

impl PrivateKey {
    /// Loads a PEM private key: `RSA PRIVATE KEY` (PKCS#1), `EC PRIVATE KEY`
    /// (SEC1) or `PRIVATE KEY` (PKCS#8). Encrypted PEM is refused.
    ///
    /// # Errors
    /// [`KeyError::Parse`] for anything else; the other [`KeyError`]s for
    /// keys of an unsupported type or size, or inconsistent ones.
    pub fn from_pem(pem: &[u8]) -> Result<Self, KeyError> {
        LocalKey::from_pem(pem).map(Self::local)
    }

    /// Loads a DER private key: PKCS#8 `PrivateKeyInfo`, PKCS#1
    /// `RSAPrivateKey` or SEC1 `ECPrivateKey`.
    ///
    /// # Errors
    /// As [`PrivateKey::from_pem`].
    pub fn from_der(der: &[u8]) -> Result<Self, KeyError> {
        LocalKey::from_der(der).map(Self::local)
    }

    /// Loads a key from bytes in memory, PEM or DER (told apart by the PEM
    /// armour). This is the path for a key that was just decrypted from a
    /// keyfence envelope: the caller keeps the bytes in a zeroizing buffer,
    /// and nothing is written to disk.
    ///
    /// # Errors
    /// As [`PrivateKey::from_pem`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        LocalKey::from_bytes(bytes).map(Self::local)
    }

    /// An Ed25519 key from its 32-byte seed (RFC 8032's private key).
    ///
    /// # Errors
    /// [`KeyError::Ed25519Length`] unless `seed` is 32 bytes.
    pub fn from_ed25519_seed(seed: &[u8]) -> Result<Self, KeyError> {
        LocalKey::from_ed25519_seed(seed).map(Self::local)
    }

    /// Generates a fresh key of `kind` (RSA with e = 65537).
    ///
    /// # Errors
    /// [`KeyError::RsaSize`] for RSA sizes outside 2048..=4096,
    /// [`KeyError::Generate`] if AWS-LC fails.
    pub fn generate(kind: KeyKind) -> Result<Self, KeyError> {
        LocalKey::generate(kind).map(Self::local)
    }

    fn local(key: LocalKey) -> Self {
        PrivateKey { repr: Repr::Local(key) }
    }

    /// A handle on a key held elsewhere; operations on it go to its holder.
    pub(crate) fn held(key: HeldKey) -> Self {
        PrivateKey { repr: Repr::Held(key) }
    }

    /// The key in this process, if it is one.
    #[cfg_attr(not(feature = "qat"), allow(dead_code))]
    pub(crate) fn as_local(&self) -> Option<&LocalKey> {
        match &self.repr {
            Repr::Local(k) => Some(k),
            Repr::Held(_) => None,
        }
    }

    /// The handle on a key held elsewhere, if it is one. The engine runs
    /// such a key's operations on its holder, and nowhere else.
    pub(crate) fn as_held(&self) -> Option<&HeldKey> {
        match &self.repr {
            Repr::Local(_) => None,
            Repr::Held(k) => Some(k),
        }
    }

    /// Whether the secret is in this process's memory (false for a key
    /// held by a key process).
    pub fn is_local(&self) -> bool {
        matches!(self.repr, Repr::Local(_))
    }

    /// The key's kind.
    pub fn kind(&self) -> KeyKind {
        match &self.repr {
            Repr::Local(k) => k.kind(),
            Repr::Held(k) => k.kind(),
        }
    }

    /// The public key as DER `SubjectPublicKeyInfo`, for verifiers and
    /// certificates.
    ///
    /// # Errors
    /// [`SignError::Crypto`] if AWS-LC cannot encode it.
    pub fn public_key_der(&self) -> Result<Vec<u8>, SignError> {
        match &self.repr {
            Repr::Local(key) => key.public_key_der(),
            Repr::Held(key) => Ok(key.public_key_der().to_vec()),
        }
    }

    /// Checks that `op` can run with this key: algorithm family, digest
    /// length, ciphertext length. The engine calls this at submission so a
    /// bad request fails at once instead of after queueing.
    ///
    /// # Errors
    /// [`SignError::KeyMismatch`], [`SignError::DigestNotSupported`],
    /// [`SignError::DigestLength`], [`SignError::DecryptNeedsRsa`],
    /// [`SignError::CiphertextLength`]; for a key held by an isolated key
    /// process, [`SignError::InputTooLarge`] for an Ed25519 message larger
    /// than one request can carry (messages for the other algorithms are
    /// hashed on this side first).
    pub fn check(&self, op: &Operation) -> Result<(), SignError> {
        self.check_op(op)?;
        match &self.repr {
            Repr::Held(key) => key.check_size(op),
            Repr::Local(_) => Ok(()),
        }
    }

    fn check_op(&self, op: &Operation) -> Result<(), SignError> {
        match op {
            Operation::Sign { alg, input } => {
                if !self.kind().supports(*alg) {
                    return Err(SignError::KeyMismatch { alg: *alg, key: self.kind() });
                }
                if let Input::Digest(d) = input {
                    let hash = alg.hash().ok_or(SignError::DigestNotSupported(*alg))?;
                    if d.len() != hash.len() {
                        return Err(SignError::DigestLength { alg: *alg, expected: hash.len(), got: d.len() });
                    }
                }
                Ok(())
            }
            Operation::DecryptRaw { ciphertext } => match self.kind() {
                KeyKind::Rsa { bits } => {
                    let expected = (bits / 8) as usize;
                    if ciphertext.len() != expected {
                        return Err(SignError::CiphertextLength { expected, got: ciphertext.len() });
                    }
                    Ok(())
                }
                other => Err(SignError::DecryptNeedsRsa(other)),
            },
        }
    }

    /// Runs `op` on the calling thread.
    ///
    /// # Errors
    /// Those of [`PrivateKey::check`], and [`SignError::Crypto`] if
    /// AWS-LC fails.
    ///
    /// A key held elsewhere (a key process) is used through its
    /// holder, waiting up to 10 seconds.
    pub fn perform(&self, op: &Operation) -> Result<Output, SignError> {
        self.check(op)?;
        match &self.repr {
            Repr::Local(key) => key.perform_checked(op),
            Repr::Held(key) => {
                // After a fork the holder (its sessions, socket, process)
                // is the parent's.
                key.usable_here()?;
                key.holder().perform(key.id(), op, Instant::now() + HELD_SYNC_TIMEOUT)
            }
        }
    }

    /// Signs `msg` with `alg` on the calling thread.
    ///
    /// # Errors
    /// [`SignError::KeyMismatch`] if `alg` does not fit the key;
    /// [`SignError::Crypto`] if AWS-LC fails.
    pub fn sign(&self, alg: Algorithm, msg: &[u8]) -> Result<Output, SignError> {
        self.perform(&Operation::Sign { alg, input: Input::Message(msg.to_vec()) })
    }

    /// Signs a pre-computed digest with `alg` on the calling thread (not for
    /// Ed25519, which signs messages).
    ///
    /// # Errors
    /// Those of [`PrivateKey::check`]; [`SignError::Crypto`] if AWS-LC
    /// fails.
    pub fn sign_digest(&self, alg: Algorithm, digest: &[u8]) -> Result<Output, SignError> {
        self.perform(&Operation::Sign { alg, input: Input::Digest(digest.to_vec()) })
    }

    /// Raw RSA decryption (no padding removed), as the TLS RSA key exchange
    /// hands it to a private-key method: AWS-LC removes the PKCS#1 padding
    /// itself, in constant time. The output is as long as the modulus.
    ///
    /// # Errors
    /// [`SignError::DecryptNeedsRsa`], [`SignError::CiphertextLength`];
    /// [`SignError::Crypto`] if the input is not smaller than the modulus.
    pub fn decrypt_raw(&self, ciphertext: &[u8]) -> Result<Output, SignError> {
        self.perform(&Operation::DecryptRaw { ciphertext: ciphertext.to_vec() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::types::{Family, Hash};
    use openssl::ec::{EcGroup, EcKey};
    use openssl::nid::Nid;
    use openssl::pkey::PKey;
    use openssl::rsa::{Padding, Rsa};
    use openssl::sign::{RsaPssSaltlen, Verifier};

    fn verify(key: &PrivateKey, alg: Algorithm, msg: &[u8], sig: &[u8]) -> bool {
        let public = PKey::public_key_from_der(&key.public_key_der().unwrap()).unwrap();
        let mut v = match alg.hash().and_then(Hash::message_digest) {
            Some(md) => Verifier::new(md, &public).unwrap(),
            None => Verifier::new_without_digest(&public).unwrap(),
        };
        if alg.family() == Family::RsaPss {
            v.set_rsa_padding(Padding::PKCS1_PSS).unwrap();
            v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).unwrap();
        }
        v.verify_oneshot(sig, msg).unwrap_or(false)
    }

    #[test]
    fn every_algorithm_signs_and_verifies_by_message_and_digest() {
        let rsa = PrivateKey::generate(KeyKind::Rsa { bits: 2048 }).unwrap();
        let p256 = PrivateKey::generate(KeyKind::EcP256).unwrap();
        let p384 = PrivateKey::generate(KeyKind::EcP384).unwrap();
        let ed = PrivateKey::generate(KeyKind::Ed25519).unwrap();
        let msg = b"keyfence signs this";
        for alg in Algorithm::ALL {
            let key = [&rsa, &p256, &p384, &ed].into_iter().find(|k| k.kind().supports(alg)).unwrap();
            let sig = key.sign(alg, msg).unwrap();
            assert!(sig.len() <= key.kind().max_output_len(), "{alg}");
            if alg != Algorithm::RsaPkcs1Md5Sha1 {
                assert!(verify(key, alg, msg, &sig), "{alg} does not verify");
                assert!(!verify(key, alg, b"another message", &sig), "{alg} verifies the wrong message");
            }
            match alg.hash() {
                Some(h) => {
                    let by_digest = key.sign_digest(alg, &h.digest(msg).unwrap()).unwrap();
                    if alg.family() == Family::RsaPkcs1 {
                        // Deterministic: the two paths must agree exactly.
                        assert_eq!(by_digest, sig, "{alg}");
                    } else if alg != Algorithm::RsaPkcs1Md5Sha1 {
                        assert!(verify(key, alg, msg, &by_digest), "{alg} by digest");
                    }
                }
                None => assert_eq!(key.sign_digest(alg, &[0; 32]).unwrap_err(), SignError::DigestNotSupported(alg)),
            }
        }
    }

    #[test]
    fn md5_sha1_signature_is_raw_pkcs1_over_the_36_bytes() {
        let rsa = PrivateKey::generate(KeyKind::Rsa { bits: 2048 }).unwrap();
        let sig = rsa.sign(Algorithm::RsaPkcs1Md5Sha1, b"tls 1.0").unwrap();
        let public = Rsa::public_key_from_der(&rsa.public_key_der().unwrap()).unwrap();
        let mut out = vec![0; 256];
        let n = public.public_decrypt(&sig, &mut out, Padding::PKCS1).unwrap();
        assert_eq!(&out[..n], &Hash::Md5Sha1.digest(b"tls 1.0").unwrap()[..]);
    }

    #[test]
    fn wrong_key_and_bad_lengths_are_typed_errors() {
        let p256 = PrivateKey::generate(KeyKind::EcP256).unwrap();
        assert!(matches!(p256.sign(Algorithm::EcdsaP384Sha384, b"x"), Err(SignError::KeyMismatch { .. })));
        assert!(matches!(p256.sign(Algorithm::RsaPssSha256, b"x"), Err(SignError::KeyMismatch { .. })));
        assert!(matches!(
            p256.sign_digest(Algorithm::EcdsaP256Sha256, &[0; 31]),
            Err(SignError::DigestLength { expected: 32, got: 31, .. })
        ));
        assert_eq!(p256.decrypt_raw(&[0; 256]).unwrap_err(), SignError::DecryptNeedsRsa(KeyKind::EcP256));
        let rsa = PrivateKey::generate(KeyKind::Rsa { bits: 2048 }).unwrap();
        assert!(matches!(rsa.decrypt_raw(&[1; 255]), Err(SignError::CiphertextLength { expected: 256, got: 255 })));
        // Not smaller than the modulus: AWS-LC refuses, no panic.
        assert!(matches!(rsa.decrypt_raw(&[0xff; 256]), Err(SignError::Crypto { .. })));
    }

    #[test]
    fn loading_rejects_garbage_and_unsupported_keys_and_debug_hides_the_key() {
        assert_eq!(PrivateKey::from_bytes(b"").unwrap_err(), KeyError::Parse);
        assert_eq!(PrivateKey::from_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap_err(), KeyError::Parse);
        assert_eq!(PrivateKey::from_der(&[0x30, 0x03, 0x02, 0x01]).unwrap_err(), KeyError::Parse);
        assert_eq!(PrivateKey::from_ed25519_seed(&[0; 31]).unwrap_err(), KeyError::Ed25519Length(31));
        assert_eq!(PrivateKey::generate(KeyKind::Rsa { bits: 1024 }).unwrap_err(), KeyError::RsaSize(1024));
        let small = PKey::from_rsa(Rsa::generate(1024).unwrap()).unwrap();
        assert_eq!(PrivateKey::from_der(&small.private_key_to_der().unwrap()).unwrap_err(), KeyError::RsaSize(1024));
        let p521 = EcKey::generate(&EcGroup::from_curve_name(Nid::SECP521R1).unwrap()).unwrap();
        assert!(matches!(PrivateKey::from_pem(&p521.private_key_to_pem().unwrap()), Err(KeyError::Curve(_))));

        let ed = PrivateKey::from_ed25519_seed(&[7; 32]).unwrap();
        let shown = format!("{ed:?}");
        assert_eq!(shown, "PrivateKey { kind: Ed25519, .. }");
    }

    #[test]
    fn loads_every_encoding() {
        let rsa = Rsa::generate(2048).unwrap();
        let ec = EcKey::generate(&EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap()).unwrap();
        let ed = PKey::generate_ed25519().unwrap();
        let rsa_pkey = PKey::from_rsa(rsa.clone()).unwrap();
        let ec_pkey = PKey::from_ec_key(ec.clone()).unwrap();
        let cases: Vec<(Vec<u8>, KeyKind)> = vec![
            (rsa.private_key_to_pem().unwrap(), KeyKind::Rsa { bits: 2048 }), // PKCS#1 PEM
            (rsa.private_key_to_der().unwrap(), KeyKind::Rsa { bits: 2048 }), // PKCS#1 DER
            (rsa_pkey.private_key_to_pem_pkcs8().unwrap(), KeyKind::Rsa { bits: 2048 }),
            (rsa_pkey.private_key_to_pkcs8().unwrap(), KeyKind::Rsa { bits: 2048 }),
            (ec.private_key_to_pem().unwrap(), KeyKind::EcP256), // SEC1 PEM
            (ec.private_key_to_der().unwrap(), KeyKind::EcP256), // SEC1 DER
            (ec_pkey.private_key_to_pem_pkcs8().unwrap(), KeyKind::EcP256),
            (ec_pkey.private_key_to_pkcs8().unwrap(), KeyKind::EcP256),
            (ed.private_key_to_pem_pkcs8().unwrap(), KeyKind::Ed25519),
            (ed.private_key_to_pkcs8().unwrap(), KeyKind::Ed25519),
        ];
        for (bytes, kind) in cases {
            let key = PrivateKey::from_bytes(&bytes).unwrap();
            assert_eq!(key.kind(), kind);
        }
    }
}
