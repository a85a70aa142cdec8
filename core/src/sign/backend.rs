//! Backends: what actually performs an operation, and on which executor
//! class it runs.

use std::time::{Duration, Instant};

use super::error::SignError;
use super::executor::OpClass;
use super::key::PrivateKey;
use super::op::{Operation, Output};

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
}

/// In-process BoringSSL: RSA on the [`OpClass::Rsa`] executor, ECDSA and
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
}

/// A backend that waits `latency` and then signs in software, on the
/// [`OpClass::Slow`] executor: a stand-in for a remote key server or an
/// offload device in tests and load experiments (the head-of-line test
/// saturates it with 200 ms operations). Not for production use.
///
/// It gives up at the deadline, as a real remote backend would.
#[derive(Debug, Clone, Copy)]
pub struct LatencyBackend {
    latency: Duration,
}

impl LatencyBackend {
    /// A backend adding `latency` to every operation.
    pub fn new(latency: Duration) -> Self {
        LatencyBackend { latency }
    }
}

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
            return Err(SignError::Backend { backend: self.name().into(), reason: "gave up at the deadline".into() });
        }
        std::thread::sleep(self.latency);
        key.perform(op)
    }
}
