//! A master key generation's life cycle: active, decrypt-only, retired. A
//! plain type at the bottom of `wrap`, written in the authority's state and
//! in the replicated generation list.

/// The life cycle of a master key generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationState {
    /// The newest generation: seals policy keys, decrypts.
    Active,
    /// The previous generation: still decrypts, seals nothing new.
    DecryptOnly,
    /// Retired: its master secret key and sealed copies are deleted.
    Retired,
}

impl GenerationState {
    /// The state's byte in the authority state and the generation list.
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Active => 0,
            Self::DecryptOnly => 1,
            Self::Retired => 2,
        }
    }

    pub(crate) fn from_code(c: u8) -> Option<Self> {
        match c {
            0 => Some(Self::Active),
            1 => Some(Self::DecryptOnly),
            2 => Some(Self::Retired),
            _ => None,
        }
    }

    /// Whether keys of this generation still decrypt.
    pub fn is_live(self) -> bool {
        self != Self::Retired
    }
}
