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
    /// Operations on keys in a PKCS#11 token this process loaded: each
    /// call blocks its thread until the token answers, so they get threads
    /// of their own and never hold up software keys or the slow class.
    Token,
}

impl OpClass {
    /// Every class, in index order.
    pub const ALL: [OpClass; 4] = [OpClass::Rsa, OpClass::Ec, OpClass::Slow, OpClass::Token];

    /// `rsa`, `ec`, `slow` or `token`.
    pub fn name(self) -> &'static str {
        match self {
            OpClass::Rsa => "rsa",
            OpClass::Ec => "ec",
            OpClass::Slow => "slow",
            OpClass::Token => "token",
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
