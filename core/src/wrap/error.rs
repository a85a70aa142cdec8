//! Errors of policy-key wrapping.

use crate::abe::AbeError;
use crate::ErrorCode;

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
    /// The envelope or a sealed policy key names this machine's authority
    /// but fails its signature or integrity check: it was modified.
    #[error("{object} failed its integrity check: it was modified after this authority made it")]
    Tampered {
        /// `envelope` or `sealed policy key`.
        object: &'static str,
    },
    /// The envelope or a sealed policy key was made by another authority
    /// than the one this machine key trusts (or forged by someone who can
    /// write the store and named another authority in it).
    #[error("{object} was made by another authority (signed by key {found}, this machine trusts {trusted})")]
    WrongAuthority {
        /// `envelope` or `sealed policy key`.
        object: &'static str,
        /// The first bytes of the authority key the object names, hex.
        found: String,
        /// The first bytes of the authority key the machine trusts, hex.
        trusted: String,
    },
    /// An object the authority did sign, but older than one this machine
    /// has already accepted: whoever can write the store put back (or
    /// withheld) a newer one. Nothing is opened on its word.
    #[error("{object} refused: it is older than one already seen ({reason}); the store was rolled back or replayed")]
    Replayed {
        /// `generation list`.
        object: &'static str,
        /// How it goes back on the newer one.
        reason: String,
    },
    /// The machine id is revoked: `issue` refuses to give it a key again,
    /// and the sealed policy keys made since its revocation exclude it.
    #[error("machine {id} is revoked")]
    Revoked {
        /// The machine id.
        id: String,
    },
    /// A machine id (given to `issue` or `revoke`) that a policy could not
    /// name.
    #[error("machine id {id:?} is not usable: {reason}")]
    InvalidMachineId {
        /// The id (at most its first 80 characters).
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Bytes that are not the named object.
    #[error("malformed {object}: {reason}")]
    Malformed {
        /// Which object: `envelope`, `sealed policy key`, `machine key`,
        /// `authority state`, `generation list`, `inventory`.
        object: &'static str,
        /// What is wrong, naming the field.
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
    /// An object would pass a limit of its binary format; refused when it
    /// is built, so that everything built can be written and read back.
    #[error("{what} is {len}, over the format's limit of {max}")]
    LimitExceeded {
        /// What is too large (`policy text length`, `attribute count`, ...).
        what: &'static str,
        /// Its size.
        len: usize,
        /// The largest the format holds.
        max: usize,
    },
    /// A line of a file given to the authority (an inventory to import, a
    /// traffic or latency table for `where`) that does not read: which
    /// file, which line (from 1), which field, and why, so that the
    /// operator fixes that line rather than guessing.
    #[error("{file}, line {line}, field {field}: {reason}")]
    InvalidLine {
        /// The file as named by the caller.
        file: String,
        /// The line, counted from 1.
        line: usize,
        /// The field (`id`, `attributes`, `group`, `rps`, `milliseconds`, ...).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A question put to the authority that does not make sense as asked
    /// (`where` with traffic but no `by` label to name its groups, a
    /// warning ratio that is not a positive number).
    #[error("{0}")]
    InvalidQuery(String),
    /// A master rotation refused because it would retire the newest
    /// generation that machines of the inventory (not revoked) hold keys
    /// of: they would open nothing afterwards. Issue them new keys first,
    /// or force it.
    #[error(
        "rotating now retires master generation {generation}, the newest one {count} machine(s) of the inventory hold keys of \
         (for example {}): they would open nothing afterwards; issue them new keys first (`keyfence authority issue` with \
         their `machine=` id), or rotate with --force",
        examples.join(", ")
    )]
    WouldStrand {
        /// The generation the rotation would retire.
        generation: u32,
        /// How many machines it would strand.
        count: usize,
        /// The ids of the first few, sorted.
        examples: Vec<String>,
    },
    /// The store holds no authority, already holds one, or holds one whose
    /// state contradicts itself.
    #[error(transparent)]
    State(#[from] StateError),
    /// A CP-ABE failure other than the ones above.
    #[error(transparent)]
    Abe(#[from] AbeError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What is wrong with the authority in the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// There is no authority in the store.
    #[error("no authority in this store (run `keyfence authority init`)")]
    NoAuthority,
    /// `init` on a store that already holds an authority.
    #[error("the store already holds an authority")]
    AuthorityExists,
    /// The authority's state contradicts itself (a live generation without
    /// its master key, a policy key missing while it is used).
    #[error("the authority's state is inconsistent: {0}")]
    Inconsistent(String),
    /// A policy-key rotation for a policy that has no policy key.
    #[error("no policy key for `{0}`")]
    NoPolicyKey(String),
}

impl StateError {
    /// The stable code of this error (`docs/errors.md`).
    pub fn code(&self) -> ErrorCode {
        match self {
            StateError::NoAuthority => ErrorCode::NoAuthority,
            StateError::AuthorityExists => ErrorCode::AuthorityExists,
            StateError::Inconsistent(_) => ErrorCode::InconsistentState,
            StateError::NoPolicyKey(_) => ErrorCode::UnknownPolicyKey,
        }
    }
}

impl WrapError {
    /// The byte offset in the policy text, when a policy given to the
    /// authority does not parse (see [`AbeError::policy_position`]).
    pub fn policy_position(&self) -> Option<usize> {
        match self {
            WrapError::Abe(e) => e.policy_position(),
            _ => None,
        }
    }

    /// The stable code of this error (`docs/errors.md`).
    ///
    /// A malformed machine key is [`ErrorCode::InvalidKey`], a malformed
    /// authority state or generation list [`ErrorCode::InconsistentState`],
    /// any other malformed object [`ErrorCode::InvalidEnvelope`]; CP-ABE and
    /// store failures keep their own codes.
    pub fn code(&self) -> ErrorCode {
        match self {
            WrapError::NotAuthorized { .. } => ErrorCode::PolicyNotSatisfied,
            WrapError::RetiredGeneration { .. } => ErrorCode::RetiredGeneration,
            WrapError::UnknownPolicyKey { .. } => ErrorCode::UnknownPolicyKey,
            WrapError::Tampered { .. } => ErrorCode::InvalidEnvelope,
            WrapError::WrongAuthority { .. } => ErrorCode::WrongAuthority,
            WrapError::Replayed { .. } => ErrorCode::ReplayedObject,
            WrapError::Revoked { .. } => ErrorCode::MachineRevoked,
            WrapError::InvalidMachineId { .. } => ErrorCode::InvalidAttributes,
            WrapError::Malformed { object: "machine key", .. } => ErrorCode::InvalidKey,
            WrapError::Malformed { object: "authority state" | "generation list" | "revocation list" | "inventory", .. } => {
                ErrorCode::InconsistentState
            }
            WrapError::Malformed { .. } => ErrorCode::InvalidEnvelope,
            WrapError::UnknownAlgorithm { .. } => ErrorCode::UnknownAlgorithm,
            WrapError::LimitExceeded { .. } => ErrorCode::LimitExceeded,
            WrapError::InvalidLine { .. } | WrapError::InvalidQuery(_) | WrapError::WouldStrand { .. } => ErrorCode::InvalidArgument,
            WrapError::State(e) => e.code(),
            WrapError::Abe(e) => e.code(),
            WrapError::Store(e) => e.code(),
        }
    }
}

/// Result of a wrapping operation.
pub type Result<T, E = WrapError> = std::result::Result<T, E>;

pub(crate) fn malformed(object: &'static str, reason: impl Into<String>) -> WrapError {
    WrapError::Malformed { object, reason: reason.into() }
}

/// [`WrapError::WrongAuthority`] for an object naming `found` when the
/// machine trusts `trusted`: eight bytes of each are enough to tell keys
/// apart in a message.
pub(crate) fn wrong_authority(object: &'static str, found: &[u8; 32], trusted: &[u8; 32]) -> WrapError {
    let short = |k: &[u8; 32]| format!("{}…", k[..8].iter().map(|x| format!("{x:02x}")).collect::<String>());
    WrapError::WrongAuthority { object, found: short(found), trusted: short(trusted) }
}

/// Maps a codec error to [`WrapError::Malformed`] for `object`; the
/// message names the field.
pub(crate) fn codec(object: &'static str) -> impl Fn(crate::codec::CodecError) -> WrapError {
    move |e| malformed(object, e.to_string())
}

/// Refuses `len` when it passes `max`.
pub(crate) fn limit(what: &'static str, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(WrapError::LimitExceeded { what, len, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_has_its_code() {
        let io = || StoreError::Io { key: "k".into(), source: std::io::Error::other("x") };
        let cases: Vec<(WrapError, ErrorCode)> = vec![
            (WrapError::NotAuthorized { policy: "a: b".into() }, ErrorCode::PolicyNotSatisfied),
            (WrapError::RetiredGeneration { have: vec![1], live: vec![2] }, ErrorCode::RetiredGeneration),
            (WrapError::UnknownPolicyKey { policy_id: "00".into(), version: 1 }, ErrorCode::UnknownPolicyKey),
            (WrapError::Tampered { object: "envelope" }, ErrorCode::InvalidEnvelope),
            (WrapError::Tampered { object: "sealed policy key" }, ErrorCode::InvalidEnvelope),
            (wrong_authority("envelope", &[1; 32], &[2; 32]), ErrorCode::WrongAuthority),
            (WrapError::Replayed { object: "generation list", reason: "x".into() }, ErrorCode::ReplayedObject),
            (WrapError::Revoked { id: "m1".into() }, ErrorCode::MachineRevoked),
            (WrapError::InvalidMachineId { id: "a-b".into(), reason: "x".into() }, ErrorCode::InvalidAttributes),
            (malformed("envelope", "x"), ErrorCode::InvalidEnvelope),
            (malformed("sealed policy key", "x"), ErrorCode::InvalidEnvelope),
            (malformed("machine key", "x"), ErrorCode::InvalidKey),
            (malformed("authority state", "x"), ErrorCode::InconsistentState),
            (malformed("generation list", "x"), ErrorCode::InconsistentState),
            (WrapError::UnknownAlgorithm { what: "HPKE suite", id: 9 }, ErrorCode::UnknownAlgorithm),
            (WrapError::LimitExceeded { what: "secret length", len: 2, max: 1 }, ErrorCode::LimitExceeded),
            (WrapError::InvalidLine { file: "f".into(), line: 1, field: "id", reason: "x".into() }, ErrorCode::InvalidArgument),
            (WrapError::InvalidQuery("x".into()), ErrorCode::InvalidArgument),
            (WrapError::WouldStrand { generation: 1, count: 1, examples: vec!["m".into()] }, ErrorCode::InvalidArgument),
            (StateError::NoAuthority.into(), ErrorCode::NoAuthority),
            (StateError::AuthorityExists.into(), ErrorCode::AuthorityExists),
            (StateError::Inconsistent("x".into()).into(), ErrorCode::InconsistentState),
            (StateError::NoPolicyKey("a: b".into()).into(), ErrorCode::UnknownPolicyKey),
            (AbeError::NotSatisfied.into(), ErrorCode::PolicyNotSatisfied),
            (AbeError::IntegrityCheckFailed.into(), ErrorCode::InvalidCiphertext),
            (AbeError::ReservedLabel("l".into()).into(), ErrorCode::ReservedLabel),
            (AbeError::Policy(keyfence_policy::parse("a:").unwrap_err()).into(), ErrorCode::PolicySyntax),
            (io().into(), ErrorCode::StoreIo),
            (StoreError::InvalidKey("..".into()).into(), ErrorCode::InvalidStoreKey),
            (StoreError::Conflict { key: "authority/state".into() }.into(), ErrorCode::StoreConflict),
            (StoreError::TooLarge { key: "k".into(), what: "bytes", len: 2, max: 1 }.into(), ErrorCode::LimitExceeded),
            (StoreError::InvalidName { name: "etcd://".into(), reason: "x".into() }.into(), ErrorCode::InvalidArgument),
        ];
        for (e, code) in cases {
            assert_eq!(e.code(), code, "{e:?}");
        }
    }

    #[test]
    fn policy_language_codes_name_the_core_codes() {
        let syntax = keyfence_policy::parse("a: b or").unwrap_err();
        let deep = keyfence_policy::parse(&format!("{}a: b{}", "(".repeat(80), ")".repeat(80))).unwrap_err();
        let large = keyfence_policy::parse(&format!("a: {}", "v".repeat(70_000))).unwrap_err();
        for e in [syntax, deep, large] {
            assert_eq!(e.code(), ErrorCode::from(&e).name(), "{e}");
        }
        for bad in ["a", "=b", "a=1,a=2"] {
            let e = bad.parse::<keyfence_policy::Attributes>().unwrap_err();
            assert_eq!(e.code(), ErrorCode::from(&e).name(), "{e}");
        }
    }
}
