//! Stable error codes: the one table every binding maps.
//!
//! Each error type of the library ([`keyfence_policy::ParseError`],
//! [`keyfence_policy::AttributesError`], [`crate::abe::AbeError`],
//! [`crate::wrap::WrapError`], [`crate::wrap::StoreError`] and, with the
//! `sign` feature, `SignError` and `KeyError`) answers `code()` with an
//! [`ErrorCode`]. The C ABI returns its number as `keyfence_result`, Python
//! raises the exception class named for it, Node sets `err.code` to its
//! [`name`](ErrorCode::name). `docs/errors.md` is the table in prose.
//!
//! Numbers are allocated in blocks of 100 per area and never reused: a code
//! that is retired stays reserved here as a comment. New codes go at the end
//! of their block.

use std::fmt;

use keyfence_policy::{AttributesError, ParseError, ParseErrorKind};

/// A stable, documented error code.
///
/// ```
/// use keyfence::ErrorCode;
/// let err = keyfence::policy::parse("country: US)").unwrap_err();
/// let code = ErrorCode::from(&err);
/// assert_eq!(code, ErrorCode::PolicySyntax);
/// assert_eq!((code as u32, code.name()), (100, "POLICY_SYNTAX"));
/// assert_eq!(ErrorCode::from_u32(100), Some(code));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
#[non_exhaustive]
pub enum ErrorCode {
    // 1-99: not specific to one area.
    /// An argument is unusable before any work starts: a NULL pointer
    /// across the C ABI, a value of the wrong type in a binding, text that
    /// is not UTF-8.
    InvalidArgument = 1,
    /// An invariant of keyfence's own code did not hold: a bug, never the
    /// input's fault. Please report it.
    Internal = 2,
    /// The operating system's random number generator failed.
    Rng = 3,
    /// A panic was caught at a binding boundary (a bug; reported instead of
    /// unwinding into the caller).
    Panic = 4,
    /// The operating system refused a resource: a thread, a socket, a file.
    Io = 5,

    // 100-199: the policy language.
    /// The policy text does not parse; the message has the byte position.
    PolicySyntax = 100,
    /// The policy parses but is too large for the ciphertext format, or
    /// nested too deeply.
    PolicyTooLarge = 101,
    /// Attributes (`label=value,...`) that are malformed: no `=`, an empty
    /// label or value, a repeated label, text not in Unicode NFC.
    InvalidAttributes = 102,

    // 200-299: CP-ABE.
    /// A ciphertext is malformed, was tampered with, or belongs to another
    /// authority; the message names the field at fault.
    InvalidCiphertext = 200,
    /// Bytes that do not decode as the key they are said to be (public key,
    /// master secret key, attribute key, machine key).
    InvalidKey = 201,
    /// The key's attributes do not satisfy the policy.
    PolicyNotSatisfied = 202,
    /// A policy or attribute uses a label keyfence reserves.
    ReservedLabel = 203,
    /// An object would pass a limit of its binary format (attribute too
    /// long, too many attributes, a field over its length prefix).
    LimitExceeded = 204,

    // 300-399: policy-key wrapping.
    /// An envelope or sealed policy key is malformed or failed its
    /// integrity check.
    InvalidEnvelope = 300,
    /// The machine holds keys only for retired master generations.
    RetiredGeneration = 301,
    /// No sealed copy of the envelope's policy key is in the store for a
    /// generation the machine can use.
    UnknownPolicyKey = 302,
    /// An algorithm identifier this version does not know.
    UnknownAlgorithm = 303,
    /// The store holds no authority (run `authority init`).
    NoAuthority = 304,
    /// The store already holds an authority.
    AuthorityExists = 305,
    /// The authority's state contradicts itself (a live generation without
    /// its master key, a policy key that is not there).
    InconsistentState = 306,
    /// An envelope or sealed policy key was made by another authority than
    /// the one the machine key trusts (its signature names another key).
    WrongAuthority = 307,
    /// A store object the authority signed, but older than one the machine
    /// has already accepted (a generation list put back): the store was
    /// rolled back or replayed.
    ReplayedObject = 308,
    /// The machine id is revoked: the authority refuses to issue it a key
    /// again, and a revoked machine cannot open the policy keys sealed
    /// since.
    MachineRevoked = 309,

    // 400-499: the store.
    /// The store could not read or write an object.
    StoreIo = 400,
    /// A store object name that is not allowed.
    InvalidStoreKey = 401,
    /// Another writer held the store's lock for longer than the wait.
    StoreLocked = 402,
    /// Another writer committed to the store between this writer's read and
    /// its commit (a replicated store's compare-and-swap failed); nothing
    /// of this commit was written. Re-run the operation.
    StoreConflict = 403,

    // 500-599: signing.
    /// The executor's queue is full: shed load or retry later.
    Overloaded = 500,
    /// The operation's deadline passed.
    TimedOut = 501,
    /// The operation was cancelled.
    Cancelled = 502,
    /// The engine has shut down.
    ShutDown = 503,
    /// The private key could not be loaded: not a key, an unsupported type,
    /// size or curve, or inconsistent; or a key file
    /// ([`crate::key_file`]) that does not parse.
    InvalidPrivateKey = 504,
    /// The request does not fit the key: wrong algorithm family, a digest
    /// or ciphertext of the wrong length, an unknown algorithm name, another
    /// backend named for a key held by a key process.
    InvalidRequest = 505,
    /// AWS-LC refused the operation.
    CryptoFailed = 506,
    /// The backend that holds or runs the key failed (the isolated key
    /// process died, an offload device failed).
    BackendFailed = 507,
    /// The engine's configuration is unusable.
    InvalidConfig = 508,
    /// A PKCS#11 token or its module is gone and did not come back after
    /// its sessions were opened again.
    TokenUnavailable = 509,
    /// A PKCS#11 token needs a PIN none was given for, or refused the PIN.
    TokenLogin = 510,
}

impl ErrorCode {
    /// Every code, in numeric order.
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::InvalidArgument,
        ErrorCode::Internal,
        ErrorCode::Rng,
        ErrorCode::Panic,
        ErrorCode::Io,
        ErrorCode::PolicySyntax,
        ErrorCode::PolicyTooLarge,
        ErrorCode::InvalidAttributes,
        ErrorCode::InvalidCiphertext,
        ErrorCode::InvalidKey,
        ErrorCode::PolicyNotSatisfied,
        ErrorCode::ReservedLabel,
        ErrorCode::LimitExceeded,
        ErrorCode::InvalidEnvelope,
        ErrorCode::RetiredGeneration,
        ErrorCode::UnknownPolicyKey,
        ErrorCode::UnknownAlgorithm,
        ErrorCode::NoAuthority,
        ErrorCode::AuthorityExists,
        ErrorCode::InconsistentState,
        ErrorCode::WrongAuthority,
        ErrorCode::ReplayedObject,
        ErrorCode::MachineRevoked,
        ErrorCode::StoreIo,
        ErrorCode::InvalidStoreKey,
        ErrorCode::StoreLocked,
        ErrorCode::StoreConflict,
        ErrorCode::Overloaded,
        ErrorCode::TimedOut,
        ErrorCode::Cancelled,
        ErrorCode::ShutDown,
        ErrorCode::InvalidPrivateKey,
        ErrorCode::InvalidRequest,
        ErrorCode::CryptoFailed,
        ErrorCode::BackendFailed,
        ErrorCode::InvalidConfig,
        ErrorCode::TokenUnavailable,
        ErrorCode::TokenLogin,
    ];

    /// The code's stable name, `SCREAMING_SNAKE_CASE`: Node's `err.code`,
    /// the C `KEYFENCE_` constant without its prefix.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "INVALID_ARGUMENT",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::Rng => "RNG",
            ErrorCode::Panic => "PANIC",
            ErrorCode::Io => "IO",
            ErrorCode::PolicySyntax => "POLICY_SYNTAX",
            ErrorCode::PolicyTooLarge => "POLICY_TOO_LARGE",
            ErrorCode::InvalidAttributes => "INVALID_ATTRIBUTES",
            ErrorCode::InvalidCiphertext => "INVALID_CIPHERTEXT",
            ErrorCode::InvalidKey => "INVALID_KEY",
            ErrorCode::PolicyNotSatisfied => "POLICY_NOT_SATISFIED",
            ErrorCode::ReservedLabel => "RESERVED_LABEL",
            ErrorCode::LimitExceeded => "LIMIT_EXCEEDED",
            ErrorCode::InvalidEnvelope => "INVALID_ENVELOPE",
            ErrorCode::RetiredGeneration => "RETIRED_GENERATION",
            ErrorCode::UnknownPolicyKey => "UNKNOWN_POLICY_KEY",
            ErrorCode::UnknownAlgorithm => "UNKNOWN_ALGORITHM",
            ErrorCode::NoAuthority => "NO_AUTHORITY",
            ErrorCode::AuthorityExists => "AUTHORITY_EXISTS",
            ErrorCode::InconsistentState => "INCONSISTENT_STATE",
            ErrorCode::WrongAuthority => "WRONG_AUTHORITY",
            ErrorCode::ReplayedObject => "REPLAYED_OBJECT",
            ErrorCode::MachineRevoked => "MACHINE_REVOKED",
            ErrorCode::StoreIo => "STORE_IO",
            ErrorCode::InvalidStoreKey => "INVALID_STORE_KEY",
            ErrorCode::StoreLocked => "STORE_LOCKED",
            ErrorCode::StoreConflict => "STORE_CONFLICT",
            ErrorCode::Overloaded => "OVERLOADED",
            ErrorCode::TimedOut => "TIMED_OUT",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::ShutDown => "SHUT_DOWN",
            ErrorCode::InvalidPrivateKey => "INVALID_PRIVATE_KEY",
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::CryptoFailed => "CRYPTO_FAILED",
            ErrorCode::BackendFailed => "BACKEND_FAILED",
            ErrorCode::InvalidConfig => "INVALID_CONFIG",
            ErrorCode::TokenUnavailable => "TOKEN_UNAVAILABLE",
            ErrorCode::TokenLogin => "TOKEN_LOGIN",
        }
    }

    /// The code with this number, if there is one.
    pub fn from_u32(n: u32) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| *c as u32 == n)
    }

    /// The code with this [`name`](ErrorCode::name), if there is one.
    pub fn from_name(name: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.name() == name)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<&ParseError> for ErrorCode {
    fn from(e: &ParseError) -> Self {
        match e.kind() {
            ParseErrorKind::TooDeep { .. } | ParseErrorKind::TooManyLeaves { .. } | ParseErrorKind::TooLarge { .. } => {
                ErrorCode::PolicyTooLarge
            }
            _ => ErrorCode::PolicySyntax,
        }
    }
}

impl From<&AttributesError> for ErrorCode {
    fn from(_: &AttributesError) -> Self {
        ErrorCode::InvalidAttributes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for &c in ErrorCode::ALL {
            assert!(seen.insert(c as u32), "{c:?} reuses a number");
            assert_eq!(ErrorCode::from_u32(c as u32), Some(c));
            assert_eq!(ErrorCode::from_name(c.name()), Some(c));
        }
        assert!(ErrorCode::ALL.windows(2).all(|w| (w[0] as u32) < (w[1] as u32)), "ALL is in numeric order");
        assert_eq!(ErrorCode::from_u32(0), None);
    }

    #[test]
    fn policy_errors_map_to_their_codes() {
        assert_eq!(ErrorCode::from(&keyfence_policy::parse("a: b or").unwrap_err()), ErrorCode::PolicySyntax);
        let deep = format!("{}a: b{}", "(".repeat(80), ")".repeat(80));
        assert_eq!(ErrorCode::from(&keyfence_policy::parse(&deep).unwrap_err()), ErrorCode::PolicyTooLarge);
        let attrs = "a".parse::<keyfence_policy::Attributes>().unwrap_err();
        assert_eq!(ErrorCode::from(&attrs), ErrorCode::InvalidAttributes);
    }
}
