//! The authority's Ed25519 key. Every object the authority hands to
//! machines (sealed policy keys, envelopes) carries its signature, and every
//! machine key carries its public half, so a machine accepts only objects
//! its own authority made, whoever else can write the replicated store
//! (`docs/wrapping.md`, "Threat model").

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use rand_core::{OsRng, RngCore};
use zeroize::Zeroizing;

/// Length of a signature field.
pub(crate) const SIGNATURE_LEN: usize = 64;

/// What a signature covers, by object: the context is prepended to the
/// signed bytes so that a signature on one kind of object never verifies
/// as another, whatever their bytes.
pub(crate) const ENVELOPE_CONTEXT: &[u8] = b"keyfence/v2 envelope signature\0";
pub(crate) const SEALED_CONTEXT: &[u8] = b"keyfence/v2 sealed policy key signature\0";
pub(crate) const GENERATIONS_CONTEXT: &[u8] = b"keyfence/v2 generation list signature\0";
pub(crate) const REVOKED_CONTEXT: &[u8] = b"keyfence/v2 revocation list signature\0";

/// The authority's signing key (wiped on drop by `ed25519-dalek`, each
/// copy).
#[derive(Clone)]
pub(crate) struct AuthorityKey(SigningKey);

impl AuthorityKey {
    /// A fresh key from the operating system's generator.
    pub(crate) fn generate() -> Self {
        let mut seed = Zeroizing::new([0u8; 32]);
        OsRng.fill_bytes(&mut seed[..]);
        Self(SigningKey::from_bytes(&seed))
    }

    /// The key of a 32-byte seed (as [`AuthorityKey::to_bytes`] wrote it).
    pub(crate) fn from_bytes(seed: &[u8; 32]) -> Self {
        Self(SigningKey::from_bytes(seed))
    }

    /// The seed (secret).
    pub(crate) fn to_bytes(&self) -> Zeroizing<[u8; 32]> {
        Zeroizing::new(self.0.to_bytes())
    }

    /// The public half, as objects and machine keys carry it.
    pub(crate) fn public(&self) -> [u8; 32] {
        self.0.verifying_key().to_bytes()
    }

    /// Signs `context | body`.
    pub(crate) fn sign(&self, context: &[u8], body: &[u8]) -> [u8; SIGNATURE_LEN] {
        self.0.sign(&message(context, body)).to_bytes()
    }
}

fn message(context: &[u8], body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(context.len() + body.len());
    m.extend_from_slice(context);
    m.extend_from_slice(body);
    m
}

/// Whether `public` is a key a machine may trust: a valid point that is
/// not of small order (a small-order key would accept forgeries).
pub(crate) fn is_valid_public(public: &[u8; 32]) -> bool {
    VerifyingKey::from_bytes(public).is_ok_and(|k| !k.is_weak())
}

/// Whether `signature` is `public`'s signature of `context | body`, by
/// the strict rules (canonical encodings, no small-order components).
pub(crate) fn verify(public: &[u8; 32], context: &[u8], body: &[u8], signature: &[u8; SIGNATURE_LEN]) -> bool {
    let Ok(key) = VerifyingKey::from_bytes(public) else { return false };
    key.verify_strict(&message(context, body), &Signature::from_bytes(signature)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_only_for_their_key_context_and_bytes() {
        let k = AuthorityKey::generate();
        let other = AuthorityKey::generate();
        let sig = k.sign(ENVELOPE_CONTEXT, b"body");
        assert!(verify(&k.public(), ENVELOPE_CONTEXT, b"body", &sig));
        assert!(!verify(&other.public(), ENVELOPE_CONTEXT, b"body", &sig));
        assert!(!verify(&k.public(), SEALED_CONTEXT, b"body", &sig));
        assert!(!verify(&k.public(), ENVELOPE_CONTEXT, b"bodY", &sig));
        let back = AuthorityKey::from_bytes(&k.to_bytes());
        assert_eq!(back.public(), k.public());
        assert!(is_valid_public(&k.public()));
        // The identity and a point of order 4 (y = 0): small-order keys,
        // which would accept forged signatures, are refused.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert!(!is_valid_public(&identity));
        assert!(!is_valid_public(&[0; 32]));
    }
}
