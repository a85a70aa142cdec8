//! Where a key comes from: what a program names when it loads a key, in
//! process, into a key process or through an agent
//! ([`ManagedEngine::load`](crate::sign::managed::ManagedEngine::load),
//! [`KeyProcess::load`](super::KeyProcess::load)).
//!
//! One public type for every holder. What each protocol carries on the
//! wire is its own ([`LoadBody`](super::protocol::LoadBody)): the client
//! turns an envelope into the envelope with the store's objects for a key
//! process, or the envelope alone for an agent.

use std::fmt;
use std::path::PathBuf;

use zeroize::Zeroizing;

/// A key to load. Every source is loaded again after a key process or
/// agent restarts.
#[derive(Clone)]
pub enum KeySource {
    /// A PEM or DER key file, read by whatever holds the keys (this
    /// process, or the key process, which this process then never reads).
    File(PathBuf),
    /// Key bytes (PEM or DER). The holder's client keeps them, zeroized,
    /// to load the key again after a restart: unlike a file or an
    /// envelope, such a key is also in the client's memory.
    Bytes(Zeroizing<Vec<u8>>),
    /// A keyfence envelope's bytes (an envelope is public), opened with
    /// `machine`'s machine key against its store; `None` for an engine
    /// whose keys are in an agent, which opens it with its own. The same
    /// bytes are sent again after a restart, so the key loaded is always
    /// the one they name, whatever happens to the file they came from.
    Envelope {
        /// The envelope (`keyfence authority wrap --out`).
        envelope: Vec<u8>,
        /// The machine key and store that open it; `None`: the agent's.
        machine: Option<MachineFiles>,
    },
    /// A key in a PKCS#11 token, named by its RFC 7512 URI
    /// ([`pkcs11`](crate::sign::pkcs11)). Whatever holds the engine's keys
    /// loads the module and reads the PIN: this process, the key process,
    /// or the agent (which loads only the module and PIN file it was
    /// started with). The URI holds no PIN (one with `pin-value` is
    /// refused), so it is safe to keep and to log.
    Pkcs11(String),
}

/// The machine key file and the store an envelope is opened with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineFiles {
    /// The store: a directory, or `etcd://HOST:PORT[,...]/PREFIX`.
    pub store: PathBuf,
    /// The machine key file (`keyfence authority issue --out`).
    pub machine_key: PathBuf,
}

impl KeySource {
    /// The envelope `envelope` (its bytes), opened with the machine key
    /// file `machine_key` against `store`.
    pub fn envelope(envelope: Vec<u8>, store: impl Into<PathBuf>, machine_key: impl Into<PathBuf>) -> Self {
        KeySource::Envelope { envelope, machine: Some(MachineFiles { store: store.into(), machine_key: machine_key.into() }) }
    }

    /// The envelope `envelope` for an agent to open with its own machine
    /// key and store.
    pub fn agent_envelope(envelope: Vec<u8>) -> Self {
        KeySource::Envelope { envelope, machine: None }
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::File(p) => f.debug_tuple("File").field(p).finish(),
            KeySource::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            KeySource::Envelope { envelope, machine } => {
                f.debug_struct("Envelope").field("envelope", &format_args!("{} bytes", envelope.len())).field("machine", machine).finish()
            }
            KeySource::Pkcs11(uri) => f.debug_tuple("Pkcs11").field(uri).finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_key_bytes() {
        let shown = format!("{:?}", KeySource::Bytes(Zeroizing::new(b"SECRET".to_vec())));
        assert_eq!(shown, "Bytes(6 bytes)");
        let shown = format!("{:?}", KeySource::envelope(vec![1; 9], "/s", "/m"));
        assert!(shown.contains("9 bytes") && shown.contains("/m"), "{shown}");
    }
}
