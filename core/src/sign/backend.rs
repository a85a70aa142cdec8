//! Backends: what actually performs an operation, and on which executor
//! class it runs; [`Reply`], the answer channel a backend is handed; the
//! in-process [`SoftwareBackend`]; and [`HolderBackend`], which runs a key
//! held elsewhere on its holder.

use std::sync::atomic::Ordering;
use std::sync::Arc;
#[cfg(feature = "testing")]
use std::time::Duration;
use std::time::Instant;

use super::held_key::{Answer, KeyHolder};
use super::op_record::OpRecord;
use super::private_key::PrivateKey;
use super::types::{BackendFailure, ErrorKind, OpClass, Operation, Output, SignError};

/// Performs private-key operations for the engine.
///
/// The engine asks [`Backend::class`] which executor an operation belongs
/// on, then calls [`Backend::perform`] on one of that executor's threads.
/// `perform` may block (a remote key server, an offload device, an isolated
/// key process): that is what the [`OpClass::Slow`] executor is for, and why
/// its threads never serve RSA or ECDSA work.
///
/// Implementations must be thread-safe; the engine calls `perform`
/// concurrently from several threads.
pub trait Backend: Send + Sync + 'static {
    /// A short name for errors and metrics.
    fn name(&self) -> &str;

    /// The executor class that runs `op` with `key`.
    fn class(&self, key: &PrivateKey, op: &Operation) -> OpClass;

    /// Performs `op` with `key`. `deadline` is when the caller stops
    /// waiting: a backend that waits (network, device) should give up then
    /// and return [`SignError::TimedOut`]; the engine has already answered
    /// the caller by that time and discards late results.
    ///
    /// # Errors
    /// Any [`SignError`]; backends report their own failures as
    /// [`SignError::Backend`].
    fn perform(&self, key: &PrivateKey, op: &Operation, deadline: Instant) -> Result<Output, SignError>;

    /// Asked at submission: `Ok(true)` has the engine call
    /// [`Backend::start`] on the submitting thread instead of queueing the
    /// operation on an executor, `Ok(false)` (the default) queues it, and
    /// an error refuses it at once (say, [`SignError::Overloaded`] when the
    /// backend has no room).
    ///
    /// Only for backends whose `start` just hands the request on (a socket
    /// write) and does not wait: skipping the executor saves a thread
    /// hand-off per operation, which for a 20 µs ECDSA signature in another
    /// process is a fifth of the cost.
    ///
    /// # Errors
    /// Whatever should refuse the submission.
    fn admit(&self, _key: &PrivateKey, _op: &Operation) -> Result<bool, SignError> {
        Ok(false)
    }

    /// Whether a caller that waits for the result anyway
    /// ([`Engine::perform`](super::Engine::perform)) may run
    /// [`Backend::perform`] on its own thread instead of an executor's:
    /// only for a backend that computes in this process and never waits
    /// for anything (the software backend). The default is no.
    fn performs_in_place(&self) -> bool {
        false
    }

    /// Starts `op` with `key` and answers through `reply`, now or later and
    /// from any thread. The engine calls this (not [`Backend::perform`]) on
    /// an executor thread, or on the submitting thread when
    /// [`Backend::admit`] says so; the default performs the operation there and
    /// then replies.
    ///
    /// Backends that hand work to something outside the executor (an
    /// key process, an offload device) override it to send the
    /// request and return at once, so a handful of executor threads keep
    /// many operations in flight. Such a backend should bound what it has
    /// in flight and wait here for room when full: the executor's queue
    /// then fills and callers are told [`SignError::Overloaded`].
    ///
    /// A [`Reply`] dropped unanswered answers the caller with a
    /// [`SignError::Backend`] error, so an operation can never hang.
    fn start(&self, key: Arc<PrivateKey>, op: Operation, reply: Reply) {
        let result = self.perform(&key, &op, reply.deadline());
        // Inputs (a message, a premaster ciphertext) go before the caller
        // hears back, as they did before backends could answer later.
        drop((key, op));
        reply.send(result);
    }
}

/// The engine's side of an operation a backend has started: answer it once
/// with [`Reply::send`].
///
/// Dropping it unanswered answers the caller with a [`SignError::Backend`]
/// error naming the backend. Answers after the deadline, or after the
/// caller cancelled, are discarded.
pub struct Reply {
    record: Arc<OpRecord>,
    started: Instant,
    backend: Arc<dyn Backend>,
    sent: bool,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply").field("id", &self.record.id).field("backend", &self.backend.name()).finish()
    }
}

impl Reply {
    pub(crate) fn new(record: Arc<OpRecord>, backend: Arc<dyn Backend>) -> Self {
        record.stats.in_flight.fetch_add(1, Ordering::Relaxed);
        Reply { record, started: Instant::now(), backend, sent: false }
    }

    /// When the caller stops waiting. Work still waiting to be sent
    /// somewhere can be dropped past this point.
    pub fn deadline(&self) -> Instant {
        self.record.deadline
    }

    /// Whether the operation has already ended (timed out or cancelled),
    /// so that a backend can skip work nobody waits for.
    pub fn is_abandoned(&self) -> bool {
        self.record.done.load(Ordering::Acquire)
    }

    /// Answers the operation. A backend that gave up at the deadline may
    /// send any error: the caller is told [`SignError::TimedOut`].
    pub fn send(mut self, result: Result<Output, SignError>) {
        self.sent = true;
        self.deliver(result);
    }

    fn deliver(&self, result: Result<Output, SignError>) {
        let stats = &self.record.stats;
        stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        if result.is_ok() {
            stats.record_service(self.started.elapsed());
        }
        // A backend that gave up at the deadline races the deadline thread;
        // either way the caller's deadline is what ended it.
        let result = match result {
            Err(e) if Instant::now() >= self.record.deadline && e.kind() != ErrorKind::Invalid => {
                Err(SignError::TimedOut { timeout: self.record.timeout })
            }
            r => r,
        };
        self.record.finish(result);
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.sent {
            self.deliver(Err(SignError::backend(
                self.backend.name(),
                BackendFailure::GaveUp,
                "the operation was dropped without an answer",
            )));
        }
    }
}

/// In-process AWS-LC: RSA on the [`OpClass::Rsa`] executor, ECDSA and
/// Ed25519 on [`OpClass::Ec`]. The engine's default backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct SoftwareBackend;

impl Backend for SoftwareBackend {
    fn name(&self) -> &str {
        "software"
    }

    fn class(&self, key: &PrivateKey, _op: &Operation) -> OpClass {
        if key.kind().is_rsa() {
            OpClass::Rsa
        } else {
            OpClass::Ec
        }
    }

    fn perform(&self, key: &PrivateKey, op: &Operation, _deadline: Instant) -> Result<Output, SignError> {
        key.perform(op)
    }

    fn performs_in_place(&self) -> bool {
        true
    }
}

/// A backend that waits `latency` and then signs in software, on the
/// [`OpClass::Slow`] executor: a stand-in for a remote key server or an
/// offload device in tests and load experiments (the head-of-line test
/// saturates it with 200 ms operations). Not for production use, hence
/// behind the `testing` feature.
///
/// It gives up at the deadline, as a real remote backend would.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy)]
pub struct LatencyBackend {
    latency: Duration,
}

#[cfg(feature = "testing")]
impl LatencyBackend {
    /// A backend adding `latency` to every operation.
    pub fn new(latency: Duration) -> Self {
        LatencyBackend { latency }
    }
}

#[cfg(feature = "testing")]
impl Backend for LatencyBackend {
    fn name(&self) -> &str {
        "latency"
    }

    fn class(&self, _key: &PrivateKey, _op: &Operation) -> OpClass {
        OpClass::Slow
    }

    fn perform(&self, key: &PrivateKey, op: &Operation, deadline: Instant) -> Result<Output, SignError> {
        let now = Instant::now();
        let ready = now + self.latency;
        if ready > deadline {
            std::thread::sleep(deadline.saturating_duration_since(now));
            return Err(SignError::backend(self.name(), BackendFailure::GaveUp, "gave up at the deadline"));
        }
        std::thread::sleep(self.latency);
        key.perform(op)
    }
}

/// The backend of a key held elsewhere: its holder. Requests for such a
/// key run here whatever the engine's default backend is.
pub(crate) struct HolderBackend(pub(crate) Arc<dyn KeyHolder>);

impl Backend for HolderBackend {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn class(&self, key: &PrivateKey, _op: &Operation) -> OpClass {
        self.0.class(key.kind())
    }

    fn admit(&self, key: &PrivateKey, op: &Operation) -> Result<bool, SignError> {
        match key.as_held() {
            Some(held) => self.0.admit(held.id(), self.class(key, op)),
            None => Ok(false),
        }
    }

    fn perform(&self, key: &PrivateKey, op: &Operation, deadline: Instant) -> Result<Output, SignError> {
        match key.as_held() {
            Some(held) => self.0.perform(held.id(), op, deadline),
            None => Err(SignError::backend(self.name(), BackendFailure::Refused, "the key is not held here")),
        }
    }

    fn performs_in_place(&self) -> bool {
        self.0.performs_in_place()
    }

    fn start(&self, key: Arc<PrivateKey>, op: Operation, reply: Reply) {
        let Some(held) = key.as_held() else {
            return reply.send(Err(SignError::backend(self.name(), BackendFailure::Refused, "the key is not held here")));
        };
        let (id, deadline) = (held.id(), reply.deadline());
        self.0.start(id, op, deadline, Answer::new(move |result| reply.send(result)));
    }
}
