//! Operations: what a key is asked to do, and what comes back.

use zeroize::Zeroizing;

use super::algorithm::Algorithm;

/// The result of an operation: a signature, or the raw RSA decryption
/// (a TLS premaster secret), zeroized when dropped.
pub type Output = Zeroizing<Vec<u8>>;

/// What a signature is computed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// The whole message; the engine hashes it.
    Message(Vec<u8>),
    /// A digest computed by the caller, as long as the algorithm's hash (not
    /// for Ed25519).
    Digest(Vec<u8>),
}

/// A private-key operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// Sign with `alg`.
    Sign {
        /// The algorithm.
        alg: Algorithm,
        /// The message or digest.
        input: Input,
    },
    /// Raw RSA decryption without padding removal (TLS RSA key exchange).
    DecryptRaw {
        /// The ciphertext, as long as the modulus.
        ciphertext: Vec<u8>,
    },
}

impl Operation {
    /// The bytes of input this operation holds (for memory accounting).
    pub fn input_len(&self) -> usize {
        match self {
            Operation::Sign { input: Input::Message(b) | Input::Digest(b), .. } => b.len(),
            Operation::DecryptRaw { ciphertext } => ciphertext.len(),
        }
    }
}
