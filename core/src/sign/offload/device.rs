//! The offload device interface: batches of requests in, one completion per
//! request out, from any thread.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::sign::types::{KeyKind, Operation, Output, SignError};
use crate::sign::PrivateKey;

/// Why a device did not produce a result for a request.
///
/// Only [`DeviceError::Rejected`] is the operation's own answer (a bad
/// input the device refused the way software would); the others are the
/// device's failures, which the [`OffloadBackend`](super::OffloadBackend)
/// answers by falling back to software or failing, as its
/// [`OnDeviceError`](super::OnDeviceError) setting says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceError {
    /// The device failed or was reset while the request was queued or in
    /// flight, or it is down.
    Failed(String),
    /// The device had no room for the request (a full ring).
    Busy(String),
    /// The device does not do this operation with this key.
    Unsupported(String),
    /// The request's deadline passed before the device ran it; it was not
    /// run.
    Expired,
    /// The operation itself failed (for example a raw RSA input not smaller
    /// than the modulus). Passed to the caller as it is; never retried in
    /// software.
    Rejected(SignError),
}

impl DeviceError {
    /// True for the device's own failures ([`Failed`](Self::Failed),
    /// [`Busy`](Self::Busy), [`Unsupported`](Self::Unsupported)), which
    /// software can stand in for.
    pub fn is_device_fault(&self) -> bool {
        matches!(self, DeviceError::Failed(_) | DeviceError::Busy(_) | DeviceError::Unsupported(_))
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::Failed(r) => write!(f, "device failure: {r}"),
            DeviceError::Busy(r) => write!(f, "device busy: {r}"),
            DeviceError::Unsupported(r) => write!(f, "not supported by the device: {r}"),
            DeviceError::Expired => f.write_str("the deadline passed before the device ran the request"),
            DeviceError::Rejected(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for DeviceError {}

/// What a device hands back for one request: the request's parts (so that
/// the submitter can retry it in software without a copy) and the result.
#[derive(Debug)]
pub struct DeviceCompletion {
    /// The id the request was created with.
    pub id: u64,
    /// The key.
    pub key: Arc<PrivateKey>,
    /// The operation.
    pub op: Operation,
    /// The device's result.
    pub result: Result<Output, DeviceError>,
}

/// The callback a [`DeviceRequest`] completes through.
pub type CompletionFn = Box<dyn FnOnce(DeviceCompletion) + Send + 'static>;

/// One operation handed to a [`Device`]: a key, an operation, a deadline,
/// and the callback that receives its completion.
///
/// Completing it is the device's only duty: call
/// [`DeviceRequest::complete`] exactly once, from any thread. A request
/// dropped without completing completes itself with
/// [`DeviceError::Failed`], so a device bug or a device thread that dies
/// can never leave an operation hanging.
///
/// ```
/// use std::sync::Arc;
/// use std::time::{Duration, Instant};
/// use keyfence::sign::{Algorithm, Input, KeyKind, Operation, PrivateKey};
/// use keyfence::sign::offload::DeviceRequest;
///
/// let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
/// let op = Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: Input::Message(b"hi".to_vec()) };
/// let (tx, rx) = std::sync::mpsc::channel();
/// let req = DeviceRequest::new(7, key, op, Instant::now() + Duration::from_secs(1), Box::new(move |c| {
///     let _ = tx.send(c.result.is_ok());
/// }));
/// drop(req); // completes with a device failure
/// assert_eq!(rx.recv().unwrap(), false);
/// ```
pub struct DeviceRequest {
    id: u64,
    parts: Option<(Arc<PrivateKey>, Operation)>,
    deadline: Instant,
    done: Option<CompletionFn>,
}

impl fmt::Debug for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceRequest")
            .field("id", &self.id)
            .field("key", &self.parts.as_ref().map(|(k, _)| k.kind()))
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl DeviceRequest {
    /// A request for `op` with `key`, answered through `done`.
    pub fn new(id: u64, key: Arc<PrivateKey>, op: Operation, deadline: Instant, done: CompletionFn) -> Self {
        DeviceRequest { id, parts: Some((key, op)), deadline, done: Some(done) }
    }

    /// The submitter's id for this request.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The key (its kind, and for a device that computes in software, the
    /// key itself).
    pub fn key(&self) -> &PrivateKey {
        // `parts` is only taken by `finish`, which consumes the request.
        match &self.parts {
            Some((k, _)) => k,
            None => unreachable_parts(),
        }
    }

    /// The operation.
    pub fn operation(&self) -> &Operation {
        match &self.parts {
            Some((_, op)) => op,
            None => unreachable_parts(),
        }
    }

    /// When the submitter stops waiting: a device may skip a request whose
    /// deadline has passed and complete it with [`DeviceError::Expired`].
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Completes the request with `result`, calling its callback on this
    /// thread.
    pub fn complete(mut self, result: Result<Output, DeviceError>) {
        self.finish(result);
    }

    fn finish(&mut self, result: Result<Output, DeviceError>) {
        if let (Some(done), Some((key, op))) = (self.done.take(), self.parts.take()) {
            done(DeviceCompletion { id: self.id, key, op, result });
        }
    }
}

#[cold]
fn unreachable_parts() -> ! {
    // Only reachable through a bug in this file: `parts` lives until the
    // request is consumed.
    unreachable!("a DeviceRequest's parts are taken only when it is consumed")
}

impl Drop for DeviceRequest {
    fn drop(&mut self) {
        self.finish(Err(DeviceError::Failed("the device dropped the request without completing it".into())));
    }
}

/// An offload device: takes batches of requests and completes each one
/// later, from its own threads.
///
/// Object-safe, so a backend holds an `Arc<dyn Device>`: the simulated
/// `SimDevice` in tests, Intel QAT (see the module
/// documentation for what exists of it) in production.
///
/// # Contract
/// - [`Device::submit`] must not block for long (it runs on an engine
///   executor thread or the backend's batching thread) and must see that
///   every request is completed exactly once: done later, failed at once
///   when the device is down, or dropped (which fails it).
/// - Completion callbacks run on whichever thread completes; they are short
///   (they answer the caller or hand the work to a fallback thread).
/// - The backend never has more than [`Device::max_in_flight`] requests
///   outstanding at the device, and never passes a batch larger than
///   [`Device::max_batch`].
pub trait Device: Send + Sync + 'static {
    /// A short name for errors and stats (`sim`, `qat`).
    fn name(&self) -> &str;

    /// Whether the device can do `op` with a key of `kind`. The backend
    /// sends what it cannot do to software whatever the routing says.
    fn supports(&self, kind: KeyKind, op: &Operation) -> bool;

    /// The largest batch [`Device::submit`] takes.
    fn max_batch(&self) -> usize;

    /// How many requests may be outstanding at the device at once.
    fn max_in_flight(&self) -> usize;

    /// Queues `batch`; every request is completed later (or at once on
    /// failure) through its callback.
    fn submit(&self, batch: Vec<DeviceRequest>);

    /// Runs one operation synchronously on the calling thread, for
    /// [`Backend::perform`](crate::sign::Backend::perform), whose key is
    /// only borrowed and so cannot be queued to another thread. Gives up at
    /// `deadline` with [`DeviceError::Expired`].
    ///
    /// The default answers [`DeviceError::Unsupported`], and the backend
    /// then performs the operation in software.
    ///
    /// # Errors
    /// Any [`DeviceError`].
    fn perform_sync(&self, key: &PrivateKey, op: &Operation, deadline: Instant) -> Result<Output, DeviceError> {
        let _ = (key, op, deadline);
        Err(DeviceError::Unsupported("synchronous operations".into()))
    }
}
