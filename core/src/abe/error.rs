//! Errors of the CP-ABE layer.

use keyfence_policy::{AttributesError, ParseError};

use crate::codec::CodecError;
use crate::ErrorCode;

/// What went wrong in a CP-ABE operation.
///
/// Messages name the object and the field at fault (`ciphertext field
/// c3[4]: point is not in the G1 subgroup`) and never contain key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AbeError {
    /// Bytes that do not decode as the named object.
    #[error("malformed {object}: field {field}: {reason}")]
    Malformed {
        /// `public key`, `master secret key`, `attribute key` or `ciphertext`.
        object: &'static str,
        /// The field at fault, e.g. `c3[4]` or `policy.wires[2].label`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The key's attributes do not satisfy the ciphertext's policy.
    #[error("attributes do not satisfy the policy")]
    NotSatisfied,
    /// The ciphertext failed its integrity check: it was modified, or it
    /// was made for another public key.
    #[error("decryption failed: the ciphertext was tampered with or does not match this key's authority")]
    IntegrityCheckFailed,
    /// The policy text does not parse.
    #[error("{0}")]
    Policy(#[from] ParseError),
    /// Attributes a key cannot be issued for: an empty label or value, or
    /// text not in Unicode NFC.
    #[error("{0}")]
    Attributes(#[from] AttributesError),
    /// A policy or attribute uses a label keyfence reserves.
    #[error("label {0:?} is reserved for the Boneh-Katz transform")]
    ReservedLabel(String),
    /// An attribute label or value is too long for the format's 16-bit
    /// length fields.
    #[error("attribute {0:?} is too long for the key format (at most 65535 bytes)")]
    AttributeTooLong(String),
    /// An object would pass a limit of its binary format: an attribute key
    /// whose attribute block outgrows its 16-bit length, a message too long
    /// for the ciphertext's 32-bit fields.
    #[error("{object} too large for its format: {reason}")]
    TooLarge {
        /// `attribute key` or `ciphertext`.
        object: &'static str,
        /// Which limit, and by how much.
        reason: String,
    },
    /// The random number generator failed.
    #[error("random number generator failed: {0}")]
    Rng(String),
    /// An invariant of keyfence's own code did not hold: a bug, never the
    /// input's fault. Reported instead of panicking.
    #[error("internal error in keyfence (please report it): {0}")]
    Internal(&'static str),
}

impl AbeError {
    /// The byte offset in the policy text, when this is a policy that
    /// does not parse ([`AbeError::Policy`]): what a binding shows as a
    /// syntax error's position.
    ///
    /// ```
    /// let (pk, _) = keyfence::abe::setup().unwrap();
    /// let err = keyfence::abe::encrypt(&pk, "a: b or", b"x").unwrap_err();
    /// assert_eq!(err.policy_position(), Some(7));
    /// ```
    pub fn policy_position(&self) -> Option<usize> {
        match self {
            AbeError::Policy(e) => Some(e.offset()),
            _ => None,
        }
    }

    /// The stable code of this error (`docs/errors.md`).
    ///
    /// A malformed ciphertext is [`ErrorCode::InvalidCiphertext`], a
    /// malformed key [`ErrorCode::InvalidKey`].
    pub fn code(&self) -> ErrorCode {
        match self {
            AbeError::Malformed { object: "ciphertext", .. } => ErrorCode::InvalidCiphertext,
            AbeError::Malformed { .. } => ErrorCode::InvalidKey,
            AbeError::NotSatisfied => ErrorCode::PolicyNotSatisfied,
            AbeError::IntegrityCheckFailed => ErrorCode::InvalidCiphertext,
            AbeError::Policy(e) => ErrorCode::from(e),
            AbeError::Attributes(e) => ErrorCode::from(e),
            AbeError::ReservedLabel(_) => ErrorCode::ReservedLabel,
            AbeError::AttributeTooLong(_) | AbeError::TooLarge { .. } => ErrorCode::LimitExceeded,
            AbeError::Rng(_) => ErrorCode::Rng,
            AbeError::Internal(_) => ErrorCode::Internal,
        }
    }
}

pub(crate) fn malformed(object: &'static str, field: impl Into<String>, reason: impl Into<String>) -> AbeError {
    AbeError::Malformed { object, field: field.into(), reason: reason.into() }
}

/// Maps a field the shared codec could not read to [`AbeError::Malformed`]
/// on `object`.
pub(crate) fn codec(object: &'static str) -> impl Fn(CodecError) -> AbeError {
    move |e| AbeError::Malformed { object, field: e.field.into_owned(), reason: e.problem.to_string() }
}

/// An object that would not fit its format, reported instead of written
/// truncated.
pub(crate) fn too_large(object: &'static str, e: CodecError) -> AbeError {
    AbeError::TooLarge { object, reason: e.problem.to_string() }
}

/// Result of a CP-ABE operation.
pub type Result<T, E = AbeError> = std::result::Result<T, E>;
