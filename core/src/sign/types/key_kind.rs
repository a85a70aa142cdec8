//! Key kinds: what a key is, and which algorithms it signs with.

use std::fmt;

use super::algorithm::{Algorithm, Family};

/// What kind of private key this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// RSA with a modulus of `bits` bits (2048 to 4096).
    Rsa {
        /// Modulus size in bits.
        bits: u32,
    },
    /// ECDSA on NIST P-256.
    EcP256,
    /// ECDSA on NIST P-384.
    EcP384,
    /// Ed25519.
    Ed25519,
}

impl KeyKind {
    /// True for RSA keys.
    pub fn is_rsa(self) -> bool {
        matches!(self, KeyKind::Rsa { .. })
    }

    /// Whether `alg` can be used with a key of this kind.
    pub fn supports(self, alg: Algorithm) -> bool {
        matches!(
            (self, alg.family()),
            (KeyKind::Rsa { .. }, Family::RsaPkcs1 | Family::RsaPss)
                | (KeyKind::EcP256, Family::EcdsaP256)
                | (KeyKind::EcP384, Family::EcdsaP384)
                | (KeyKind::Ed25519, Family::Ed25519)
        )
    }

    /// The largest output an operation with this key produces, in bytes
    /// (signature or raw decryption).
    pub fn max_output_len(self) -> usize {
        match self {
            KeyKind::Rsa { bits } => (bits as usize).div_ceil(8),
            // DER ECDSA-Sig-Value: SEQUENCE { INTEGER r, INTEGER s }.
            KeyKind::EcP256 => 72,
            KeyKind::EcP384 => 104,
            KeyKind::Ed25519 => 64,
        }
    }
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyKind::Rsa { bits } => write!(f, "an RSA-{bits}"),
            KeyKind::EcP256 => f.write_str("a P-256 ECDSA"),
            KeyKind::EcP384 => f.write_str("a P-384 ECDSA"),
            KeyKind::Ed25519 => f.write_str("an Ed25519"),
        }
    }
}
