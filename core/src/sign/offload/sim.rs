//! A simulated offload device: the asynchronous path, batching, latency and
//! device failure, on machines without an accelerator.

use crate::spawn::QuietSpawn;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::device::{Device, DeviceError, DeviceRequest};
use crate::sign::types::{KeyKind, Operation, Output, Resource, SignError};
use crate::sign::PrivateKey;

/// How a [`SimDevice`] behaves.
///
/// ```
/// use std::time::Duration;
/// use keyfence::sign::offload::SimConfig;
/// let mut config = SimConfig::default();
/// config.latency = Duration::from_millis(50);
/// config.batch_size = 8;
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimConfig {
    /// The device's name in errors and stats. Default `sim`.
    pub name: String,
    /// Device time per batch, whatever its size (the operations themselves
    /// are then computed in software on the device thread, which adds their
    /// CPU time). Default 2 ms.
    pub latency: Duration,
    /// The most requests the device runs as one batch. Default 32.
    pub batch_size: usize,
    /// The most requests queued or running in the device; more are refused
    /// with [`DeviceError::Busy`]. Default 1024.
    pub max_in_flight: usize,
    /// Batches run at once, each on its own device thread (a QAT device has
    /// several engines). Default 1.
    pub engines: usize,
    /// Fail the device (as [`SimControl::fail`] does) once it has completed
    /// this many requests. Default `None`.
    pub fail_after: Option<u64>,
    /// Fail every n-th request with [`DeviceError::Failed`] without failing
    /// the device (a transient fault). Default `None`.
    pub fail_every: Option<u64>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            name: "sim".into(),
            latency: Duration::from_millis(2),
            batch_size: 32,
            max_in_flight: 1024,
            engines: 1,
            fail_after: None,
            fail_every: None,
        }
    }
}

impl SimConfig {
    /// Checks the sizes: a non-empty name, `batch_size` and
    /// `max_in_flight` at least 1, 1 to 64 engines, a latency of at most a
    /// minute, and `fail_every` at least 1 if set.
    ///
    /// # Errors
    /// [`SignError::Config`] naming the first bad field.
    pub fn validate(&self) -> Result<(), SignError> {
        let bad = |m: &str| Err(SignError::Config(format!("sim device: {m}")));
        if self.name.is_empty() {
            return bad("name must not be empty");
        }
        if self.batch_size == 0 || self.max_in_flight == 0 {
            return bad("batch_size and max_in_flight must be at least 1");
        }
        if !(1..=64).contains(&self.engines) {
            return bad("engines must be 1 to 64");
        }
        if self.latency > Duration::from_secs(60) {
            return bad("latency must be at most 60 s");
        }
        if self.fail_every == Some(0) {
            return bad("fail_every must be at least 1");
        }
        Ok(())
    }
}

/// What a [`SimDevice`] has done, from [`SimControl::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimStats {
    /// Requests accepted (queued, or run synchronously).
    pub accepted: u64,
    /// Batches run (a synchronous operation is a batch of one).
    pub batches: u64,
    /// The largest batch run.
    pub largest_batch: u64,
    /// Requests completed with a result (or the operation's own error).
    pub completed: u64,
    /// Requests failed by the device (down, reset in flight, transient
    /// fault, no room).
    pub failed: u64,
    /// Requests whose deadline passed before the device ran them.
    pub expired: u64,
    /// The most requests ever queued or running in the device at once.
    pub peak_in_device: u64,
    /// Times the device failed (by [`SimControl::fail`] or
    /// [`SimConfig::fail_after`]).
    pub resets: u64,
}

struct State {
    queue: VecDeque<DeviceRequest>,
    /// Requests queued or running.
    in_device: usize,
    failed: bool,
    closed: bool,
    /// Bumped by every failure, so a batch that was running when the device
    /// failed fails too, even if it has recovered since.
    generation: u64,
}

#[derive(Default)]
struct Counters {
    accepted: AtomicU64,
    batches: AtomicU64,
    largest_batch: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    expired: AtomicU64,
    peak_in_device: AtomicU64,
    resets: AtomicU64,
    /// Requests run, for `fail_every`.
    runs: AtomicU64,
    /// Results still to be corrupted ([`SimControl::corrupt_results`]).
    corrupt: AtomicU64,
}

struct Shared {
    config: SimConfig,
    state: Mutex<State>,
    /// Signalled when requests arrive, and when the device fails or closes
    /// (which interrupts the emulated device time).
    changed: Condvar,
    counters: Counters,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // Updates under this lock leave the state consistent; a panic
        // cannot happen while it is held (completions run outside it).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fail(&self) {
        let mut state = self.state();
        if !state.failed {
            state.failed = true;
            state.generation += 1;
            self.counters.resets.fetch_add(1, Relaxed);
        }
        drop(state);
        self.changed.notify_all();
    }

    fn failure(&self, why: &str) -> DeviceError {
        DeviceError::Failed(format!("device `{}` {why}", self.config.name))
    }

    fn busy(&self) -> DeviceError {
        DeviceError::Busy(format!("device `{}` is full ({} requests)", self.config.name, self.config.max_in_flight))
    }

    /// Fails `requests` (outside the lock).
    fn fail_all(&self, requests: impl IntoIterator<Item = DeviceRequest>, why: &str) {
        for req in requests {
            self.counters.failed.fetch_add(1, Relaxed);
            req.complete(Err(self.failure(why)));
        }
    }

    /// Waits for the emulated device time, until `end`; false if the device
    /// failed or closed meanwhile (or already had since `generation`).
    fn device_time(&self, end: Instant, generation: u64) -> bool {
        let mut state = self.state();
        loop {
            if state.failed || state.closed || state.generation != generation {
                return false;
            }
            let now = Instant::now();
            if now >= end {
                return true;
            }
            state = self.changed.wait_timeout(state, end - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Runs one request in software, as the device would in hardware.
    fn run(&self, key: &PrivateKey, op: &Operation, deadline: Instant) -> Result<Output, DeviceError> {
        if Instant::now() >= deadline {
            self.counters.expired.fetch_add(1, Relaxed);
            return Err(DeviceError::Expired);
        }
        let n = self.counters.runs.fetch_add(1, Relaxed) + 1;
        if self.config.fail_every.is_some_and(|every| n.is_multiple_of(every)) {
            self.counters.failed.fetch_add(1, Relaxed);
            return Err(self.failure("had a transient fault"));
        }
        let mut result = key.perform(op).map_err(DeviceError::Rejected);
        if let Ok(out) = &mut result {
            let take = |n: u64| n.checked_sub(1);
            if !out.is_empty() && self.counters.corrupt.fetch_update(Relaxed, Relaxed, take).is_ok() {
                // One flipped bit, as a fault in one CRT half would leave.
                let last = out.len() - 1;
                out[last] ^= 1;
            }
        }
        let done = self.counters.completed.fetch_add(1, Relaxed) + 1;
        if self.config.fail_after.is_some_and(|limit| done >= limit) {
            self.fail();
        }
        result
    }

    fn note_batch(&self, len: usize) {
        self.counters.batches.fetch_add(1, Relaxed);
        self.counters.largest_batch.fetch_max(len as u64, Relaxed);
    }

    fn release(&self, n: usize) {
        self.state().in_device -= n;
    }
}

/// One device thread ("engine"): takes up to `batch_size` queued requests,
/// waits the device latency, then computes and completes them.
fn engine(shared: &Shared) {
    loop {
        let (batch, generation) = {
            let mut state = shared.state();
            loop {
                if state.closed || state.failed {
                    // Down: nothing queued survives (a reset drops the
                    // rings), and later submissions fail at once.
                    let dropped: Vec<_> = state.queue.drain(..).collect();
                    state.in_device -= dropped.len();
                    let closed = state.closed;
                    if !dropped.is_empty() {
                        drop(state);
                        let why = if closed { "was shut down" } else { "failed (reset) with the request queued" };
                        shared.fail_all(dropped, why);
                        state = shared.state();
                        continue;
                    }
                    if closed {
                        return;
                    }
                } else if !state.queue.is_empty() {
                    break;
                }
                state = shared.changed.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            let n = state.queue.len().min(shared.config.batch_size);
            (state.queue.drain(..n).collect::<Vec<_>>(), state.generation)
        };
        shared.note_batch(batch.len());
        let len = batch.len();
        if !shared.device_time(Instant::now() + shared.config.latency, generation) {
            shared.release(len);
            shared.fail_all(batch, "failed (reset) with the request in flight");
            continue;
        }
        for req in batch {
            let result = if shared.state().generation != generation {
                shared.counters.failed.fetch_add(1, Relaxed);
                Err(shared.failure("failed (reset) with the request in flight"))
            } else {
                shared.run(req.key(), req.operation(), req.deadline())
            };
            shared.release(1);
            req.complete(result);
        }
    }
}

/// A simulated offload device for tests and experiments on machines
/// without an accelerator.
///
/// It runs the same asynchronous path a hardware device would: requests
/// are queued, taken in batches of up to [`SimConfig::batch_size`] by
/// [`SimConfig::engines`] device threads, held for
/// [`SimConfig::latency`] per batch (the device time), then computed with
/// [`PrivateKey::perform`] on the device thread, so results are real
/// signatures, and completed through their callbacks. Like QAT it does RSA
/// and ECDSA (P-256, P-384) but not Ed25519.
///
/// Failure injection: [`SimControl::fail`] fails the device as a reset
/// would (every queued and in-flight request completes at once with
/// [`DeviceError::Failed`], and so does every later one) until
/// [`SimControl::recover`]; [`SimConfig::fail_after`] and
/// [`SimConfig::fail_every`] fail it by count.
///
/// ```
/// use std::sync::Arc;
/// use keyfence::sign::offload::{OffloadBackend, OffloadConfig, SimConfig, SimDevice};
/// let device = SimDevice::new(SimConfig::default())?;
/// let control = device.control();
/// let backend = OffloadBackend::with_device(Arc::new(device), OffloadConfig::default())?;
/// assert_eq!(backend.device_name(), Some("sim"));
/// control.fail(); // later requests fall back to software (or fail)
/// # Ok::<(), keyfence::sign::SignError>(())
/// ```
pub struct SimDevice {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDevice").field("config", &self.shared.config).finish_non_exhaustive()
    }
}

impl SimDevice {
    /// Starts the device's threads.
    ///
    /// # Errors
    /// [`SignError::Config`] for a bad configuration
    /// ([`SimConfig::validate`]); [`SignError::Io`] if a thread cannot be
    /// started.
    pub fn new(config: SimConfig) -> Result<Self, SignError> {
        config.validate()?;
        let engines = config.engines;
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(State { queue: VecDeque::new(), in_device: 0, failed: false, closed: false, generation: 0 }),
            changed: Condvar::new(),
            counters: Counters::default(),
        });
        let device = SimDevice { shared };
        for i in 0..engines {
            let shared = device.shared.clone();
            std::thread::Builder::new()
                .name(format!("keyfence-sim-{i}"))
                .spawn_quiet(move || engine(&shared))
                // Dropping `device` closes it and lets started engines exit.
                .map_err(|e| SignError::io(Resource::Thread, format!("cannot start a sim device thread: {e}")))?;
        }
        Ok(device)
    }

    /// A handle that injects failures and reads the device's counters; it
    /// stays usable after the device is gone.
    pub fn control(&self) -> SimControl {
        SimControl { shared: self.shared.clone() }
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        self.shared.state().closed = true;
        self.shared.changed.notify_all();
    }
}

impl Device for SimDevice {
    fn name(&self) -> &str {
        &self.shared.config.name
    }

    fn supports(&self, kind: KeyKind, _op: &Operation) -> bool {
        kind != KeyKind::Ed25519
    }

    fn max_batch(&self) -> usize {
        self.shared.config.batch_size
    }

    fn max_in_flight(&self) -> usize {
        self.shared.config.max_in_flight
    }

    fn submit(&self, batch: Vec<DeviceRequest>) {
        let shared = &*self.shared;
        let mut refused = Vec::new();
        let mut state = shared.state();
        let down = state.failed || state.closed;
        for req in batch {
            if down || state.in_device >= shared.config.max_in_flight {
                refused.push(req);
                continue;
            }
            state.in_device += 1;
            state.queue.push_back(req);
            shared.counters.accepted.fetch_add(1, Relaxed);
        }
        shared.counters.peak_in_device.fetch_max(state.in_device as u64, Relaxed);
        drop(state);
        shared.changed.notify_all();
        if refused.is_empty() {
            return;
        }
        if down {
            shared.fail_all(refused, "is down");
            return;
        }
        for req in refused {
            shared.counters.failed.fetch_add(1, Relaxed);
            req.complete(Err(shared.busy()));
        }
    }

    fn perform_sync(&self, key: &PrivateKey, op: &Operation, deadline: Instant) -> Result<Output, DeviceError> {
        let shared = &*self.shared;
        let generation = {
            let mut state = shared.state();
            if state.failed || state.closed {
                shared.counters.failed.fetch_add(1, Relaxed);
                return Err(shared.failure("is down"));
            }
            if state.in_device >= shared.config.max_in_flight {
                shared.counters.failed.fetch_add(1, Relaxed);
                return Err(shared.busy());
            }
            state.in_device += 1;
            shared.counters.peak_in_device.fetch_max(state.in_device as u64, Relaxed);
            state.generation
        };
        shared.counters.accepted.fetch_add(1, Relaxed);
        shared.note_batch(1);
        let ready = Instant::now() + shared.config.latency;
        let result = if !shared.device_time(ready.min(deadline), generation) {
            shared.counters.failed.fetch_add(1, Relaxed);
            Err(shared.failure("failed (reset) with the request in flight"))
        } else if ready > deadline {
            shared.counters.expired.fetch_add(1, Relaxed);
            Err(DeviceError::Expired)
        } else {
            shared.run(key, op, deadline)
        };
        shared.release(1);
        result
    }
}

/// Failure injection and counters for a [`SimDevice`]. Cheap to clone.
#[derive(Clone)]
pub struct SimControl {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SimControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimControl").field("failed", &self.is_failed()).finish_non_exhaustive()
    }
}

impl SimControl {
    /// Fails the device, as a reset would: every queued and in-flight
    /// request completes at once with [`DeviceError::Failed`], and so does
    /// every later one until [`SimControl::recover`].
    pub fn fail(&self) {
        self.shared.fail();
    }

    /// Brings a failed device back: later requests run again.
    pub fn recover(&self) {
        self.shared.state().failed = false;
        self.shared.changed.notify_all();
    }

    /// Makes the next `n` results the device computes wrong (one bit
    /// flipped, as a faulty device would return them) without saying so:
    /// what the offload backend's public-key check exists for.
    pub fn corrupt_results(&self, n: u64) {
        self.shared.counters.corrupt.store(n, Relaxed);
    }

    /// Whether the device is failed.
    pub fn is_failed(&self) -> bool {
        self.shared.state().failed
    }

    /// A snapshot of the device's counters.
    pub fn stats(&self) -> SimStats {
        let c = &self.shared.counters;
        SimStats {
            accepted: c.accepted.load(Relaxed),
            batches: c.batches.load(Relaxed),
            largest_batch: c.largest_batch.load(Relaxed),
            completed: c.completed.load(Relaxed),
            failed: c.failed.load(Relaxed),
            expired: c.expired.load(Relaxed),
            peak_in_device: c.peak_in_device.load(Relaxed),
            resets: c.resets.load(Relaxed),
        }
    }
}
