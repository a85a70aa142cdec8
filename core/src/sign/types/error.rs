//! The errors of key loading and of private-key operations.

use std::fmt;
use std::time::Duration;

use super::algorithm::{Algorithm, AlgorithmError};
use super::key_kind::KeyKind;
use super::op_class::OpClass;
use crate::ErrorCode;

/// Why a private key could not be loaded.
///
/// No variant carries key material: a message may end up in a log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The bytes are neither a PEM nor a DER private key in a form AWS-LC
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
    /// Key generation failed inside AWS-LC.
    #[error("key generation failed: {0}")]
    Generate(String),
    /// The key is password-protected (encrypted PEM or an encrypted
    /// PKCS#8 `EncryptedPrivateKeyInfo`). keyfence never prompts: a
    /// signing service has no one to type the password.
    #[error("the private key is password-protected; keyfence does not ask for passwords (a signing service has no one to type one): give it the key unencrypted, readable by its owner only, or wrapped in a keyfence envelope")]
    Encrypted,
    /// A recognised private key that AWS-LC cannot read, so keyfence
    /// cannot sign with it: `what` it is and `why` it is refused.
    #[error("{what} is not supported: {why}")]
    Unsupported {
        /// What the key is, e.g. "a secp256k1 EC key".
        what: &'static str,
        /// Why it is refused, and what would work instead.
        why: &'static str,
    },
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
    /// AWS-LC or a backend failed.
    Failed,
}

impl ErrorKind {
    /// Every kind, in a fixed order (the order of the metrics' counters).
    pub const ALL: [ErrorKind; 6] =
        [ErrorKind::Overloaded, ErrorKind::TimedOut, ErrorKind::Cancelled, ErrorKind::ShutDown, ErrorKind::Invalid, ErrorKind::Failed];

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

/// How a PKCS#11 token failed ([`SignError::Token`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenFailure {
    /// The token or its module is gone, and opening a session again did not
    /// bring it back (`TOKEN_UNAVAILABLE`).
    Unavailable,
    /// The token needs a PIN none was given for, or refused the PIN
    /// (`TOKEN_LOGIN`). A refused PIN is not tried again.
    Login,
    /// No such token or key, several match, or a key keyfence cannot use
    /// (`INVALID_PRIVATE_KEY`).
    NotFound,
    /// The token declined the operation (`BACKEND_FAILED`).
    Refused,
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
        class: OpClass,
        /// That queue's capacity.
        capacity: usize,
    },
    /// Every remote key server that may hold the key refused the request
    /// for want of room (a full queue, the tenant's or the connection's
    /// in-flight limit), or the retry budget allowed no further attempt
    /// after such a refusal. Same code as [`SignError::Overloaded`]: shed
    /// load or retry later.
    #[error("overloaded: the remote key servers refused the request ({reason})")]
    PeerOverloaded {
        /// The last server's refusal, as it said it.
        reason: String,
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
    /// The object was made in another process, which this one forked from:
    /// a key loaded into a key process, an agent or key servers before
    /// `fork()`, an engine or a completion queue made before it (their
    /// threads, sockets and locks are the parent's). Its code is
    /// `SHUT_DOWN`: it never works here, and nothing waits on it.
    #[error("{what} was made in process {pid}, before this process ({here}) forked from it: {advice}")]
    Forked {
        /// What it is ("this key", "this engine").
        what: &'static str,
        /// The process it was made in.
        pid: u32,
        /// This process.
        here: u32,
        /// What to do instead.
        advice: &'static str,
    },
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
    /// The input is larger than what holds the key takes in one request
    /// (a key process's frame). Messages for algorithms with a
    /// hash are hashed on this side instead, so this is Ed25519 (which
    /// signs whole messages) or key bytes no key file is that long.
    #[error("{what} is {len} bytes; the key process takes at most {max} bytes in one request{hint}")]
    InputTooLarge {
        /// What was too large ("the message", "the key").
        what: &'static str,
        /// Its length.
        len: usize,
        /// The most the holder takes.
        max: usize,
        /// What to do instead, if anything (starts with "; ").
        hint: &'static str,
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
    /// The key is held elsewhere (a key process) and runs only
    /// there, but the request named another backend.
    #[error("the key is held by `{holder}`; a request for it cannot name the backend `{requested}`")]
    HeldElsewhere {
        /// The name of what holds the key.
        holder: String,
        /// The backend the request named.
        requested: String,
    },
    /// AWS-LC refused the operation (for raw RSA decryption this includes
    /// an input not smaller than the modulus).
    #[error("AWS-LC failed to {op}: {reason}")]
    Crypto {
        /// What AWS-LC was asked to do.
        op: CryptoOp,
        /// AWS-LC's reason (function and reason names, never key
        /// material).
        reason: String,
    },
    /// A backend failed.
    #[error("backend `{backend}` failed: {reason}")]
    Backend {
        /// The backend's name.
        backend: String,
        /// What kind of failure it was.
        failure: BackendFailure,
        /// What went wrong, in words.
        reason: String,
    },
    /// A PKCS#11 token failed or refused: gone and not back after one
    /// reopen, a refused PIN, no such key, or an operation the token
    /// declined. The code depends on `failure`.
    #[error("{token}: {reason}")]
    Token {
        /// The token (`pkcs11:token=LABEL`).
        token: String,
        /// What kind of failure it was.
        failure: TokenFailure,
        /// What went wrong, in words (PKCS#11's `CKR_` name where there is
        /// one; never a PIN).
        reason: String,
    },
    /// The process that holds the keys (an agent, a key process) declined
    /// to load one for a reason of the library's own: the machine's
    /// attributes do not satisfy the envelope's policy, its generation is
    /// retired, the machine is revoked, the envelope does not decode, the
    /// store cannot be read. `code` is the one the same load has in process,
    /// so a caller tells a "no" from a failure the same way wherever the
    /// key is opened.
    #[error("{reason}")]
    Declined {
        /// The library's code for the reason (`docs/errors.md`).
        code: ErrorCode,
        /// The holder's words (never key material).
        reason: String,
    },
    /// The engine configuration is unusable.
    #[error("invalid engine configuration: {0}")]
    Config(String),
    /// An argument a binding passed on is unusable before any work starts
    /// (a timeout that is not a positive whole number of milliseconds, a
    /// zero attempt count); the message names it.
    #[error("{0}")]
    InvalidArgument(String),
    /// The operating system refused a resource.
    #[error("system resource error ({resource}): {reason}")]
    Io {
        /// Which resource.
        resource: Resource,
        /// The operating system's reason.
        reason: String,
    },
}

/// What AWS-LC was doing when it failed ([`SignError::Crypto`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CryptoOp {
    /// Signing.
    Sign,
    /// Raw RSA decryption.
    Decrypt,
    /// Hashing a message.
    Digest,
    /// Encoding the public key.
    PublicKey,
    /// Padding a digest for an RSA device, or checking its result.
    Encode,
    /// Setting up a TLS context (certificate, algorithm list).
    Configure,
}

impl fmt::Display for CryptoOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CryptoOp::Sign => "sign",
            CryptoOp::Decrypt => "decrypt",
            CryptoOp::Digest => "hash",
            CryptoOp::PublicKey => "encode the public key",
            CryptoOp::Encode => "encode for the device",
            CryptoOp::Configure => "set up the TLS context",
        })
    }
}

/// How a backend failed ([`SignError::Backend`]), for callers that retry
/// or fail over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendFailure {
    /// The backend is not available: the key process is gone or
    /// restarting, a required device is missing.
    Unavailable,
    /// The backend died with the operation in flight.
    Died,
    /// The backend has no room for more operations in flight.
    NoRoom,
    /// The backend refused the request (a key it cannot load, a key it
    /// lost, an operation its device rejected).
    Refused,
    /// The backend answered something it should not have (a malformed
    /// reply).
    Protocol,
    /// The backend gave up: at the deadline, or dropped the operation
    /// without an answer.
    GaveUp,
}

/// Which operating-system resource was refused ([`SignError::Io`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Resource {
    /// A thread.
    Thread,
    /// A socket or socket pair.
    Socket,
    /// A child process (the key process).
    Process,
    /// A per-connection slot in AWS-LC (`ex_data` index).
    TlsSlot,
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Thread => "thread",
            Resource::Socket => "socket",
            Resource::Process => "process",
            Resource::TlsSlot => "TLS ex_data slot",
        })
    }
}

impl From<AlgorithmError> for SignError {
    fn from(e: AlgorithmError) -> Self {
        match e {
            AlgorithmError::UnknownName(name) => SignError::UnknownAlgorithm(name),
            AlgorithmError::UnknownTlsScheme(code) => SignError::UnknownTlsScheme(code),
        }
    }
}

impl SignError {
    /// The broad kind of this error, for metrics and callers that only
    /// branch on the cause. Derived from [`SignError::code`], so the two
    /// classifications cannot disagree.
    pub fn kind(&self) -> ErrorKind {
        match self.code() {
            ErrorCode::Overloaded => ErrorKind::Overloaded,
            ErrorCode::TimedOut => ErrorKind::TimedOut,
            ErrorCode::Cancelled => ErrorKind::Cancelled,
            ErrorCode::ShutDown => ErrorKind::ShutDown,
            ErrorCode::InvalidRequest | ErrorCode::InvalidConfig | ErrorCode::InvalidArgument => ErrorKind::Invalid,
            _ => ErrorKind::Failed,
        }
    }

    /// The stable code bindings map this error to (`docs/errors.md`).
    pub fn code(&self) -> ErrorCode {
        match self {
            SignError::Overloaded { .. } | SignError::PeerOverloaded { .. } => ErrorCode::Overloaded,
            SignError::TimedOut { .. } => ErrorCode::TimedOut,
            SignError::Cancelled => ErrorCode::Cancelled,
            SignError::ShutDown | SignError::Forked { .. } => ErrorCode::ShutDown,
            SignError::KeyMismatch { .. }
            | SignError::DigestNotSupported(_)
            | SignError::DigestLength { .. }
            | SignError::CiphertextLength { .. }
            | SignError::DecryptNeedsRsa(_)
            | SignError::UnknownAlgorithm(_)
            | SignError::UnknownTlsScheme(_)
            | SignError::HeldElsewhere { .. }
            | SignError::InputTooLarge { .. } => ErrorCode::InvalidRequest,
            SignError::Crypto { .. } => ErrorCode::CryptoFailed,
            SignError::Backend { .. } => ErrorCode::BackendFailed,
            SignError::Token { failure, .. } => match failure {
                TokenFailure::Unavailable => ErrorCode::TokenUnavailable,
                TokenFailure::Login => ErrorCode::TokenLogin,
                TokenFailure::NotFound => ErrorCode::InvalidPrivateKey,
                TokenFailure::Refused => ErrorCode::BackendFailed,
            },
            SignError::Declined { code, .. } => *code,
            SignError::Config(_) => ErrorCode::InvalidConfig,
            SignError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            SignError::Io { .. } => ErrorCode::Io,
        }
    }

    /// A backend failure of `backend`.
    pub(crate) fn backend(backend: &str, failure: BackendFailure, reason: impl Into<String>) -> Self {
        SignError::Backend { backend: backend.to_string(), failure, reason: reason.into() }
    }

    /// `what`, made in process `pid`, used in a child forked from it.
    pub(crate) fn forked(what: &'static str, pid: u32, advice: &'static str) -> Self {
        SignError::Forked { what, pid, here: std::process::id(), advice }
    }

    /// An operating-system refusal of `resource`.
    pub(crate) fn io(resource: Resource, reason: impl fmt::Display) -> Self {
        SignError::Io { resource, reason: reason.to_string() }
    }
}

impl KeyError {
    /// The stable code bindings map this error to (`docs/errors.md`):
    /// `InvalidPrivateKey`, or `CryptoFailed` when AWS-LC could not
    /// generate a key.
    pub fn code(&self) -> ErrorCode {
        match self {
            KeyError::Generate(_) => ErrorCode::CryptoFailed,
            _ => ErrorCode::InvalidPrivateKey,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_its_code() {
        let alg = Algorithm::EcdsaP256Sha256;
        let key = KeyKind::EcP256;
        let cases = [
            (SignError::Overloaded { class: OpClass::Ec, capacity: 1 }, ErrorCode::Overloaded),
            (SignError::TimedOut { timeout: Duration::from_secs(1) }, ErrorCode::TimedOut),
            (SignError::Cancelled, ErrorCode::Cancelled),
            (SignError::ShutDown, ErrorCode::ShutDown),
            (SignError::Forked { what: "x", pid: 1, here: 2, advice: "y" }, ErrorCode::ShutDown),
            (SignError::KeyMismatch { alg, key }, ErrorCode::InvalidRequest),
            (SignError::DigestNotSupported(Algorithm::Ed25519), ErrorCode::InvalidRequest),
            (SignError::DigestLength { alg, expected: 32, got: 1 }, ErrorCode::InvalidRequest),
            (SignError::CiphertextLength { expected: 256, got: 1 }, ErrorCode::InvalidRequest),
            (SignError::DecryptNeedsRsa(key), ErrorCode::InvalidRequest),
            (SignError::UnknownAlgorithm("x".into()), ErrorCode::InvalidRequest),
            (SignError::UnknownTlsScheme(1), ErrorCode::InvalidRequest),
            (SignError::HeldElsewhere { holder: "a".into(), requested: "b".into() }, ErrorCode::InvalidRequest),
            (SignError::Crypto { op: CryptoOp::Sign, reason: "r".into() }, ErrorCode::CryptoFailed),
            (SignError::backend("b", BackendFailure::Died, "r"), ErrorCode::BackendFailed),
            (SignError::Declined { code: ErrorCode::PolicyNotSatisfied, reason: "r".into() }, ErrorCode::PolicyNotSatisfied),
            (SignError::Declined { code: ErrorCode::StoreIo, reason: "r".into() }, ErrorCode::StoreIo),
            (SignError::Config("c".into()), ErrorCode::InvalidConfig),
            (SignError::InvalidArgument("a".into()), ErrorCode::InvalidArgument),
            (SignError::io(Resource::Thread, "r"), ErrorCode::Io),
        ];
        for (e, code) in cases {
            assert_eq!(e.code(), code, "{e}");
            // Errors the caller caused are `Invalid`; the others are not.
            assert_eq!(
                e.kind() == ErrorKind::Invalid,
                matches!(code, ErrorCode::InvalidRequest | ErrorCode::InvalidConfig | ErrorCode::InvalidArgument)
            );
        }
        let key_errors = [
            (KeyError::Parse, ErrorCode::InvalidPrivateKey),
            (KeyError::UnsupportedType("DSA".into()), ErrorCode::InvalidPrivateKey),
            (KeyError::RsaSize(1024), ErrorCode::InvalidPrivateKey),
            (KeyError::Curve("P-521".into()), ErrorCode::InvalidPrivateKey),
            (KeyError::Ed25519Length(31), ErrorCode::InvalidPrivateKey),
            (KeyError::Inconsistent, ErrorCode::InvalidPrivateKey),
            (KeyError::Generate("r".into()), ErrorCode::CryptoFailed),
            (KeyError::Encrypted, ErrorCode::InvalidPrivateKey),
            (KeyError::Unsupported { what: "an Ed448 key", why: "w" }, ErrorCode::InvalidPrivateKey),
        ];
        for (e, code) in key_errors {
            assert_eq!(e.code(), code, "{e}");
        }
    }
}
