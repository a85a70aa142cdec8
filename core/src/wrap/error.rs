//! Errors of policy-key wrapping.

use crate::abe::AbeError;

use super::store::StoreError;

/// What went wrong wrapping, opening or rotating.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WrapError {
    /// This machine's attributes do not satisfy the envelope's policy.
    #[error("this machine's attributes do not satisfy the policy `{policy}`")]
    NotAuthorized {
        /// The envelope's policy.
        policy: String,
    },
    /// The machine holds keys only for retired master generations.
    #[error("this machine's keys are for retired master generation(s) {have:?}; the live ones are {live:?}: issue it a new key")]
    RetiredGeneration {
        /// Generations the machine has keys for.
        have: Vec<u32>,
        /// Generations that still decrypt.
        live: Vec<u32>,
    },
    /// No sealed copy of the policy key is in the store for any generation
    /// the machine can use.
    #[error("unknown policy key {policy_id} version {version}: no sealed copy in the store for a live generation")]
    UnknownPolicyKey {
        /// Hex policy id.
        policy_id: String,
        /// Policy key version.
        version: u32,
    },
    /// The envelope or a sealed policy key was modified, or belongs to
    /// another authority.
    #[error("{object} failed its integrity check: it was modified or does not belong to this authority")]
    Tampered {
        /// `envelope` or `sealed policy key`.
        object: &'static str,
    },
    /// Bytes that are not the named object.
    #[error("malformed {object}: {reason}")]
    Malformed {
        /// Which object.
        object: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// An unknown algorithm identifier.
    #[error("unknown {what} algorithm {id}")]
    UnknownAlgorithm {
        /// Which algorithm slot.
        what: &'static str,
        /// The identifier found.
        id: u16,
    },
    /// No authority in the store, or one already there.
    #[error("{0}")]
    State(String),
    /// A CP-ABE failure other than the ones above.
    #[error(transparent)]
    Abe(#[from] AbeError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Result of a wrapping operation.
pub type Result<T, E = WrapError> = std::result::Result<T, E>;

pub(crate) fn malformed(object: &'static str, reason: impl Into<String>) -> WrapError {
    WrapError::Malformed { object, reason: reason.into() }
}
