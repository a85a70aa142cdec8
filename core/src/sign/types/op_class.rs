//! Operation classes: each has its own executor, so a slow class never
//! delays a fast one.

use std::fmt;

/// A class of operations with its own executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// RSA signing and decryption in software (about a millisecond each).
    Rsa,
    /// ECDSA and Ed25519 in software (tens of microseconds each).
    Ec,
    /// Operations that wait on something outside the process: offload
    /// devices, remote key servers, a key process.
    Slow,
}

impl OpClass {
    /// Every class, in index order.
    pub const ALL: [OpClass; 3] = [OpClass::Rsa, OpClass::Ec, OpClass::Slow];

    /// `rsa`, `ec` or `slow`.
    pub fn name(self) -> &'static str {
        match self {
            OpClass::Rsa => "rsa",
            OpClass::Ec => "ec",
            OpClass::Slow => "slow",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for OpClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
