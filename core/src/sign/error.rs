//! The errors of key loading and of private-key operations.

use std::fmt;
use std::time::Duration;

use super::alg::Algorithm;
use super::key::KeyKind;

/// Why a private key could not be loaded.
///
/// No variant carries key material: a message may end up in a log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The bytes are neither a PEM nor a DER private key in a form BoringSSL
    /// reads (PKCS#1, PKCS#8 or SEC1), or an encrypted PEM.
    #[error("not a private key in PEM or DER form (PKCS#1, PKCS#8 or SEC1); encrypted keys are not read")]
    Parse,
    /// The key parsed but is of a type keyfence does not sign with.
    #[error("unsupported key type {0}; RSA, ECDSA (P-256, P-384) and Ed25519 are supported")]
    UnsupportedType(String),
    /// RSA keys must have a modulus of 2048 to 4096 bits.
    #[error("RSA keys must be 2048 to 4096 bits; this one has {0} bits")]
    RsaSize(u32),
    /// The elliptic curve is not P-256 or P-384.
    #[error("unsupported elliptic curve {0}; P-256 and P-384 are supported")]
    Curve(String),
    /// An Ed25519 seed must be exactly 32 bytes.
    #[error("an Ed25519 private key (seed) is 32 bytes; got {0}")]
    Ed25519Length(usize),
    /// The key's parts are inconsistent (for RSA: `check_key` failed; for EC:
    /// the public point does not match the scalar).
    #[error("the private key failed its consistency check")]
    Inconsistent,
    /// Key generation failed inside BoringSSL.
    #[error("key generation failed: {0}")]
    Generate(String),
}

/// The kind of an operation error, for metrics and for callers that only
/// branch on the broad cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The class's queue was full ([`SignError::Overloaded`]).
    Overloaded,
    /// The deadline passed ([`SignError::TimedOut`]).
    TimedOut,
    /// The caller cancelled ([`SignError::Cancelled`]).
    Cancelled,
    /// The engine was shut down ([`SignError::ShutDown`]).
    ShutDown,
    /// The request was invalid (wrong algorithm for the key, bad digest or
    /// ciphertext length, unknown algorithm).
    Invalid,
    /// BoringSSL or a backend failed.
    Failed,
}

impl ErrorKind {
    /// Every kind, in a fixed order (the order of the metrics' counters).
    pub const ALL: [ErrorKind; 6] = [
        ErrorKind::Overloaded,
        ErrorKind::TimedOut,
        ErrorKind::Cancelled,
        ErrorKind::ShutDown,
        ErrorKind::Invalid,
        ErrorKind::Failed,
    ];

    /// A short snake_case name (`overloaded`, `timed_out`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::TimedOut => "timed_out",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::ShutDown => "shut_down",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Failed => "failed",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a private-key operation did not produce a result.
///
/// No variant carries key material, inputs or outputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    /// The executor queue of `class` held `capacity` operations already; the
    /// operation was not accepted. Shed load or retry later: waiting would
    /// only turn overload into timeouts (Little's law).
    #[error("overloaded: the {class} queue is full ({capacity} operations waiting)")]
    Overloaded {
        /// The executor class whose queue was full.
        class: super::OpClass,
        /// That queue's capacity.
        capacity: usize,
    },
    /// The operation's deadline passed before it completed; its resources
    /// have been released.
    #[error("timed out: the operation did not complete within {timeout:?}")]
    TimedOut {
        /// The timeout the operation was submitted with.
        timeout: Duration,
    },
    /// The operation was cancelled through its handle (or its future was
    /// dropped).
    #[error("cancelled")]
    Cancelled,
    /// The engine shut down before the operation ran.
    #[error("the signing engine has shut down")]
    ShutDown,
    /// The algorithm needs a different kind of key.
    #[error("{alg} cannot be used with {key} key")]
    KeyMismatch {
        /// The requested algorithm.
        alg: Algorithm,
        /// The key's kind.
        key: KeyKind,
    },
    /// The algorithm signs whole messages (Ed25519), not digests.
    #[error("{0} signs whole messages; it cannot sign a pre-computed digest")]
    DigestNotSupported(Algorithm),
    /// A pre-computed digest of the wrong length.
    #[error("{alg} expects a {expected}-byte digest, got {got} bytes")]
    DigestLength {
        /// The requested algorithm.
        alg: Algorithm,
        /// The digest length it needs.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// Raw RSA decryption needs an input exactly as long as the modulus.
    #[error("raw RSA decryption needs a {expected}-byte input, got {got} bytes")]
    CiphertextLength {
        /// The modulus length in bytes.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// Raw RSA decryption is only defined for RSA keys.
    #[error("raw RSA decryption needs an RSA key, not {0} key")]
    DecryptNeedsRsa(KeyKind),
    /// An algorithm name that is not one of [`Algorithm::ALL`]'s names.
    #[error("unknown signature algorithm `{0}`; known: rsa-pkcs1-sha256, rsa-pkcs1-sha384, rsa-pkcs1-sha512, rsa-pkcs1-md5-sha1, rsa-pss-sha256, rsa-pss-sha384, rsa-pss-sha512, ecdsa-p256-sha256, ecdsa-p384-sha384, ed25519")]
    UnknownAlgorithm(String),
    /// A TLS SignatureScheme code point keyfence does not sign with.
    #[error("unsupported TLS signature scheme {0:#06x}")]
    UnknownTlsScheme(u16),
    /// BoringSSL refused the operation (for raw RSA decryption this includes
    /// an input not smaller than the modulus).
    #[error("BoringSSL failed: {0}")]
    Crypto(String),
    /// A backend failed.
    #[error("backend `{backend}` failed: {reason}")]
    Backend {
        /// The backend's name.
        backend: String,
        /// What went wrong.
        reason: String,
    },
    /// The engine configuration is unusable.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// The operating system refused a resource (a thread, a socket).
    #[error("system resource error: {0}")]
    Io(String),
}

impl SignError {
    /// The broad kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            SignError::Overloaded { .. } => ErrorKind::Overloaded,
            SignError::TimedOut { .. } => ErrorKind::TimedOut,
            SignError::Cancelled => ErrorKind::Cancelled,
            SignError::ShutDown => ErrorKind::ShutDown,
            SignError::KeyMismatch { .. }
            | SignError::DigestNotSupported(_)
            | SignError::DigestLength { .. }
            | SignError::CiphertextLength { .. }
            | SignError::DecryptNeedsRsa(_)
            | SignError::UnknownAlgorithm(_)
            | SignError::UnknownTlsScheme(_)
            | SignError::Config(_) => ErrorKind::Invalid,
            SignError::Crypto(_) | SignError::Backend { .. } | SignError::Io(_) => ErrorKind::Failed,
        }
    }

    /// A BoringSSL error stack as an error. BoringSSL's reason strings name
    /// the failing function and reason, never key material.
    pub(crate) fn crypto(e: boring::error::ErrorStack) -> Self {
        SignError::Crypto(e.to_string())
    }
}
