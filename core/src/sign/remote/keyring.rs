//! The keys a server signs with: each opened from its envelope through the
//! wrap machine (so only keys the machine's attributes allow), or loaded
//! by the key process (checked first against the machine's public
//! view, which cannot decrypt), and filed under the envelope's
//! [`KeyId`], the name every machine can compute from its replicated copy.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::sign::key_process::{KeyProcess, KeySource};
use crate::sign::{KeyError, PrivateKey, SignError};
use crate::wrap::{Envelope, Machine, PublicMachine, WrapError};

/// A key's name on the wire: SHA-256 of its envelope's bytes, or, for a
/// key in a PKCS#11 token (which has no envelope), SHA-256 of its public
/// key (DER `SubjectPublicKeyInfo`), which a client computes from the
/// certificate it serves.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId(pub [u8; 32]);

impl KeyId {
    /// The id of the envelope `bytes`.
    pub fn of_envelope(bytes: &[u8]) -> Self {
        KeyId(openssl::sha::sha256(bytes))
    }

    /// The id of a key without an envelope (a token's): SHA-256 of its
    /// public key `spki_der`.
    pub fn of_public_key(spki_der: &[u8]) -> Self {
        KeyId(openssl::sha::sha256(spki_der))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

impl fmt::Display for KeyId {
    /// The first 8 bytes in hexadecimal: enough to tell keys apart in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0[..8].iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Why an envelope did not give the server a key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyRingError {
    /// The machine cannot open it (its attributes do not satisfy the
    /// policy, another authority, a retired generation...).
    #[error("cannot open the envelope: {0}")]
    Wrap(#[from] WrapError),
    /// What it holds is not a private key keyfence signs with.
    #[error("the envelope does not hold a usable key: {0}")]
    Key(#[from] KeyError),
    /// The key process refused the key, or the envelope file cannot be
    /// read.
    #[error("{0}")]
    Load(#[from] SignError),
    /// The machine key file cannot be read (the message names it).
    #[error("{0}")]
    Io(String),
}

impl KeyRingError {
    /// The stable code of this error ([`ErrorCode`]).
    pub fn code(&self) -> crate::ErrorCode {
        match self {
            KeyRingError::Wrap(e) => e.code(),
            KeyRingError::Key(e) => e.code(),
            KeyRingError::Load(e) => e.code(),
            KeyRingError::Io(_) => crate::ErrorCode::Io,
        }
    }
}

/// The keys a server holds, by [`KeyId`].
#[derive(Default, Clone)]
pub struct KeyRing {
    keys: HashMap<KeyId, Arc<PrivateKey>>,
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing").field("keys", &self.keys.len()).finish()
    }
}

impl KeyRing {
    /// An empty ring.
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens `envelope` with `machine` and holds the key in this process.
    ///
    /// # Errors
    /// [`KeyRingError::Wrap`] when the machine may not or cannot open it
    /// (the usual case for keys of another region: skip them),
    /// [`KeyRingError::Key`] when it does not hold a usable private key.
    /// [`KeyRingError::Load`] (isolated only) when the key process refuses it.
    pub fn open(&mut self, machine: &Machine, envelope: &[u8]) -> Result<KeyId, KeyRingError> {
        let secret = machine.open(envelope)?;
        let key = PrivateKey::from_bytes(&secret)?;
        let id = KeyId::of_envelope(envelope);
        self.keys.insert(id, Arc::new(key));
        Ok(id)
    }

    /// Has the key process open the envelope file with the
    /// machine key file against the store directory: neither the secret
    /// nor the machine key ever enters this process. `machine` (the public
    /// view of the same key and store) checks first that the key process
    /// would succeed, without opening anything.
    ///
    /// The envelope file is read once, here: its bytes name the key (its
    /// [`KeyId`]) and the same bytes go to the key process, now and after
    /// each of its restarts, so a file replaced later cannot put another
    /// key under this id.
    ///
    /// # Errors
    /// As [`KeyRing::open`]; [`KeyRingError::Load`] when the file cannot
    /// be read or the key process refuses the key.
    pub fn open_isolated(
        &mut self, machine: &PublicMachine, keys: &KeyProcess, store: &std::path::Path, machine_key: &std::path::Path,
        envelope: &std::path::Path,
    ) -> Result<KeyId, KeyRingError> {
        let bytes =
            std::fs::read(envelope).map_err(|e| SignError::Config(format!("cannot read the envelope {}: {e}", envelope.display())))?;
        self.open_isolated_bytes(machine, keys, store, machine_key, bytes)
    }

    /// [`KeyRing::open_isolated`] with the envelope's bytes.
    ///
    /// # Errors
    /// As [`KeyRing::open_isolated`].
    pub fn open_isolated_bytes(
        &mut self, machine: &PublicMachine, keys: &KeyProcess, store: &std::path::Path, machine_key: &std::path::Path, envelope: Vec<u8>,
    ) -> Result<KeyId, KeyRingError> {
        machine.can_open(&Envelope::parse(&envelope)?)?;
        let id = KeyId::of_envelope(&envelope);
        let key = keys.load(KeySource::envelope(envelope, store, machine_key))?;
        self.keys.insert(id, key);
        Ok(id)
    }

    /// Holds `key` under `id` (keys from elsewhere, for tests and tools).
    pub fn insert(&mut self, id: KeyId, key: Arc<PrivateKey>) {
        self.keys.insert(id, key);
    }

    /// The key under `id`.
    pub fn get(&self, id: &KeyId) -> Option<&Arc<PrivateKey>> {
        self.keys.get(id)
    }

    /// How many keys it holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}
