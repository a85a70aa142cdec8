//! Requests: an operation with a key, and optionally a backend and a
//! timeout, as the engine is asked for it.

use std::sync::Arc;
use std::time::Duration;

use super::backend::Backend;
use super::private_key::PrivateKey;
use super::types::{Algorithm, Input, Operation};

/// A request to the [`Engine`](super::Engine): a key, an operation, and
/// optionally a backend other than the engine's default and a timeout other
/// than the engine's default.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use keyfence::sign::{Algorithm, KeyKind, PrivateKey, Request};
/// let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
/// let req = Request::sign(key, Algorithm::EcdsaP256Sha256, b"hello".to_vec())
///     .with_timeout(Duration::from_millis(50));
/// assert_eq!(req.timeout(), Some(Duration::from_millis(50)));
/// ```
#[derive(Clone)]
pub struct Request {
    pub(crate) key: Arc<PrivateKey>,
    pub(crate) op: Operation,
    pub(crate) backend: Option<Arc<dyn Backend>>,
    pub(crate) timeout: Option<Duration>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("key", &self.key)
            .field("op", &self.op)
            .field("backend", &self.backend.as_ref().map(|b| b.name().to_string()))
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Request {
    /// A request for `op` with `key`.
    pub fn new(key: Arc<PrivateKey>, op: Operation) -> Self {
        Request { key, op, backend: None, timeout: None }
    }

    /// Sign the message `msg` with `alg`.
    pub fn sign(key: Arc<PrivateKey>, alg: Algorithm, msg: Vec<u8>) -> Self {
        Self::new(key, Operation::Sign { alg, input: Input::Message(msg) })
    }

    /// Sign the pre-computed `digest` with `alg`.
    pub fn sign_digest(key: Arc<PrivateKey>, alg: Algorithm, digest: Vec<u8>) -> Self {
        Self::new(key, Operation::Sign { alg, input: Input::Digest(digest) })
    }

    /// Raw RSA decryption of `ciphertext`.
    pub fn decrypt_raw(key: Arc<PrivateKey>, ciphertext: Vec<u8>) -> Self {
        Self::new(key, Operation::DecryptRaw { ciphertext })
    }

    /// Run on `backend` instead of the engine's default backend. Not for a
    /// key held elsewhere (a key process): such a key runs only
    /// on its holder, and the engine refuses the request with
    /// [`SignError::HeldElsewhere`](super::SignError::HeldElsewhere).
    pub fn with_backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Give up after `timeout` (from submission) instead of the engine's
    /// default.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The key.
    pub fn key(&self) -> &Arc<PrivateKey> {
        &self.key
    }

    /// The operation.
    pub fn operation(&self) -> &Operation {
        &self.op
    }

    /// The timeout, if one was set on the request.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }
}
