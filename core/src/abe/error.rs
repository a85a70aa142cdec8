//! Errors of the CP-ABE layer.

use keyfence_policy::ParseError;

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
    /// A policy or attribute uses a label keyfence reserves.
    #[error("label {0:?} is reserved for the Boneh-Katz transform")]
    ReservedLabel(String),
    /// An attribute label or value is too long for the format's 16-bit
    /// length fields.
    #[error("attribute {0:?} is too long for the key format (at most 65535 bytes)")]
    AttributeTooLong(String),
    /// Too many attributes for the key format.
    #[error("too many attributes: {0} (the key format holds at most 65534)")]
    TooManyAttributes(usize),
    /// The random number generator failed.
    #[error("random number generator failed: {0}")]
    Rng(String),
    /// An invariant of keyfence's own code did not hold: a bug, never the
    /// input's fault. Reported instead of panicking.
    #[error("internal error in keyfence (please report it): {0}")]
    Internal(&'static str),
}

impl AbeError {
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
            AbeError::ReservedLabel(_) => ErrorCode::ReservedLabel,
            AbeError::AttributeTooLong(_) | AbeError::TooManyAttributes(_) => ErrorCode::LimitExceeded,
            AbeError::Rng(_) => ErrorCode::Rng,
            AbeError::Internal(_) => ErrorCode::Internal,
        }
    }
}

pub(crate) fn malformed(object: &'static str, field: impl Into<String>, reason: impl Into<String>) -> AbeError {
    AbeError::Malformed { object, field: field.into(), reason: reason.into() }
}

/// Result of a CP-ABE operation.
pub type Result<T, E = AbeError> = std::result::Result<T, E>;
