//! The offload backend: routes each operation to the device or to software,
//! batches device requests, answers from their completions, and handles
//! device failure.

use crate::spawn::QuietSpawn;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Sender, TrySendError};

use super::batcher::{Batcher, Slots};
use super::device::{Device, DeviceCompletion, DeviceError, DeviceRequest};
use super::routing::Route;
use super::rsa_encoding::rsa_output_valid;
use super::stats::{Counters, OffloadStats};
use super::{open_device, OffloadConfig, OffloadMode, OnDeviceError, QatUnavailable};
use crate::sign::backend::{Backend, Reply};
use crate::sign::types::{BackendFailure, OpClass, Operation, Output, Resource, SignError};
use crate::sign::PrivateKey;

/// The backend name in errors and metrics.
const NAME: &str = "offload";

fn backend_error(failure: BackendFailure, reason: impl Into<String>) -> SignError {
    SignError::backend(NAME, failure, reason)
}

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A few threads that perform operations in software after the device
/// failed them, so that a device reset with hundreds of RSA operations in
/// flight does not hold up the device's completion thread.
struct FallbackPool {
    tx: Sender<Job>,
}

impl FallbackPool {
    fn start(threads: usize, capacity: usize) -> Result<Self, SignError> {
        let (tx, rx) = crossbeam_channel::bounded::<Job>(capacity);
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("keyfence-offload-fallback-{i}"))
                .spawn_quiet(move || {
                    while let Ok(job) = rx.recv() {
                        // A panicking job drops its reply while unwinding,
                        // which answers the caller; the thread lives on.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                })
                .map_err(|e| SignError::io(Resource::Thread, format!("cannot start an offload fallback thread: {e}")))?;
        }
        Ok(FallbackPool { tx })
    }

    /// Runs `job` on a pool thread, or on this thread if the pool is full
    /// (it holds one slot per operation the device may have in flight, so
    /// it is not) or gone.
    fn run(&self, job: Job) {
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => job(),
        }
    }
}

/// Who hears an operation's result: the engine's [`Reply`], or a
/// server's callback (the key process's and the agent's workers, which
/// hand their operations to the device without an engine).
pub(crate) trait Answer: Send + 'static {
    /// Whether nobody waits any more (the engine's caller gave up).
    fn abandoned(&self) -> bool {
        false
    }

    /// Answers with `result`.
    fn answer(self, result: Result<Output, SignError>);
}

impl Answer for Reply {
    fn abandoned(&self) -> bool {
        self.is_abandoned()
    }

    fn answer(self, result: Result<Output, SignError>) {
        self.send(result);
    }
}

/// A server's callback as an [`Answer`].
pub(crate) struct Callback(pub(crate) Box<dyn FnOnce(Result<Output, SignError>) + Send + 'static>);

impl Answer for Callback {
    fn answer(self, result: Result<Output, SignError>) {
        (self.0)(result)
    }
}

/// What the device completion callbacks need; the fallback threads and
/// the batching thread do not hold it, so it goes when the backend and the
/// last outstanding request are gone.
struct Shared {
    counters: Arc<Counters>,
    on_error: OnDeviceError,
    device_name: String,
    fallback: Option<FallbackPool>,
}

impl Shared {
    fn device_failure(&self, e: &DeviceError) -> SignError {
        backend_error(
            BackendFailure::Refused,
            format!("offload device `{}` failed the operation ({e}); on_device_error is fail", self.device_name),
        )
    }

    fn expired(&self) -> SignError {
        backend_error(BackendFailure::GaveUp, format!("the deadline passed before offload device `{}` ran the operation", self.device_name))
    }

    /// Answers `reply` from a device completion.
    fn finish<A: Answer>(&self, completion: DeviceCompletion, reply: A) {
        let DeviceCompletion { key, op, result, .. } = completion;
        let result = checked(&self.counters, &key, &op, result);
        match result {
            Ok(out) => {
                Counters::bump(&self.counters.completed);
                drop((key, op));
                reply.answer(Ok(out));
            }
            Err(DeviceError::Rejected(e)) => {
                Counters::bump(&self.counters.completed);
                drop((key, op));
                reply.answer(Err(e));
            }
            Err(DeviceError::Expired) => {
                Counters::bump(&self.counters.expired);
                drop((key, op));
                // Past the deadline, the engine reports `TimedOut`.
                reply.answer(Err(self.expired()));
            }
            Err(DeviceError::Unsupported(_)) => {
                Counters::bump(&self.counters.software);
                self.in_software(key, op, reply);
            }
            Err(e) => {
                Counters::bump(&self.counters.device_errors);
                match self.on_error {
                    OnDeviceError::Fail => {
                        Counters::bump(&self.counters.failed);
                        drop((key, op));
                        reply.answer(Err(self.device_failure(&e)));
                    }
                    OnDeviceError::Fallback if reply.abandoned() => {
                        // Nobody waits: skip the work.
                        drop((key, op));
                        reply.answer(Err(self.device_failure(&e)));
                    }
                    OnDeviceError::Fallback => {
                        Counters::bump(&self.counters.fallbacks);
                        self.in_software(key, op, reply);
                    }
                }
            }
        }
    }

    fn in_software<A: Answer>(&self, key: Arc<PrivateKey>, op: Operation, reply: A) {
        let job: Job = Box::new(move || {
            if reply.abandoned() {
                return;
            }
            let result = key.perform(&op);
            drop((key, op));
            reply.answer(result);
        });
        match &self.fallback {
            Some(pool) => pool.run(job),
            None => job(),
        }
    }
}

/// A device's result as the caller may see it: an RSA result that fails
/// the public-key check is counted and becomes a device failure (then
/// software or an error, as [`OnDeviceError`] says), never an answer.
fn checked(counters: &Counters, key: &PrivateKey, op: &Operation, result: Result<Output, DeviceError>) -> Result<Output, DeviceError> {
    match result {
        Ok(out) if rsa_output_valid(key, op, &out) == Some(false) => {
            Counters::bump(&counters.mismatches);
            Err(DeviceError::Failed("the device's RSA result failed the public-key check (a device fault); not used".into()))
        }
        r => r,
    }
}

struct Inner {
    config: OffloadConfig,
    device: Option<Arc<dyn Device>>,
    batcher: Option<Batcher>,
    slots: Arc<Slots>,
    shared: Arc<Shared>,
    /// Why there is no device, when there is none.
    software_reason: Option<String>,
    next_id: AtomicU64,
}

/// A [`Backend`] that sends RSA (and, if routed so, ECDSA) operations to an
/// offload device and keeps the rest in software.
///
/// - [`Backend::class`]: operations bound for the device run on the
///   [`OpClass::Slow`] executor (its threads only hand them over); the
///   others on [`OpClass::Rsa`] or [`OpClass::Ec`], as with
///   [`SoftwareBackend`](crate::sign::SoftwareBackend).
/// - [`Backend::start`] hands a device-bound operation to the batching
///   thread and returns; the batch goes to the device when it is full
///   ([`OffloadConfig::batch_size`]) or after
///   [`OffloadConfig::batch_window`], and the caller is answered from the
///   device's completion. At most [`OffloadConfig::max_in_flight`]
///   operations are outstanding at the device; `start` waits for room until
///   the operation's deadline, then answers with an error (reported as
///   [`SignError::TimedOut`]).
/// - When the device fails an operation, it is performed in software on a
///   small fallback pool ([`OnDeviceError::Fallback`]) or answered with a
///   [`SignError::Backend`] error from backend `offload` naming the device
///   ([`OnDeviceError::Fail`]). Nothing waits on a failed device.
/// - [`Backend::perform`] (synchronous) uses the device's synchronous entry
///   point ([`Device::perform_sync`]), with the same routing and failure
///   handling.
///
/// Keys held by a key process are performed by their key process
/// (the engine routes them there before any backend sees them).
///
/// Cheap to clone; clones share the device and the counters.
///
/// ```
/// use std::sync::Arc;
/// use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyKind, PrivateKey};
/// use keyfence::sign::offload::{OffloadBackend, OffloadConfig, SimConfig, SimDevice};
///
/// let device = Arc::new(SimDevice::new(SimConfig::default())?);
/// let offload = OffloadBackend::with_device(device, OffloadConfig::default())?;
/// let engine = Engine::with_backend(EngineConfig::default(), Arc::new(offload.clone()))?;
/// let key = Arc::new(PrivateKey::generate(KeyKind::Rsa { bits: 2048 })?);
/// let signature = engine.sign(&key, Algorithm::RsaPkcs1Sha256, b"hello")?.wait()?;
/// assert_eq!(signature.len(), 256);
/// assert_eq!(offload.stats().completed, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct OffloadBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for OffloadBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadBackend")
            .field("device", &self.device_name())
            .field("software_reason", &self.software_reason())
            .field("routing", &self.inner.config.routing)
            .field("on_device_error", &self.inner.config.on_device_error)
            .finish_non_exhaustive()
    }
}

impl OffloadBackend {
    /// Starts the backend in `mode`:
    ///
    /// - [`OffloadMode::Off`]: software only.
    /// - [`OffloadMode::On`]: the QAT device, or an error.
    /// - [`OffloadMode::Auto`]: the QAT device if there is a usable one,
    ///   otherwise software; [`OffloadBackend::device_name`] says which, and
    ///   [`OffloadBackend::software_reason`] why.
    ///
    /// # Errors
    /// [`SignError::Config`] for a bad configuration, or in `On` mode when
    /// this build lacks the `qat` cargo feature; in `On` mode,
    /// [`SignError::Backend`] when there is no usable QAT device (QATlib
    /// missing, no crypto instance, or an instance that does not start;
    /// see the [module documentation](super)); [`SignError::Io`] if a
    /// thread cannot be started.
    pub fn start(mode: OffloadMode, config: OffloadConfig) -> Result<Self, SignError> {
        config.validate()?;
        match mode {
            OffloadMode::Off => Self::software(config, "offload mode is off".into()),
            OffloadMode::On => match open_device(&config) {
                Ok(device) => Self::with_device(device, config),
                Err(QatUnavailable::NotBuilt(why)) => Err(SignError::Config(format!("offload mode `on`: {why}"))),
                Err(QatUnavailable::NoDevice(why)) => Err(backend_error(BackendFailure::Unavailable, format!("offload mode `on`: {why}"))),
            },
            OffloadMode::Auto => match open_device(&config) {
                Ok(device) => Self::with_device(device, config),
                Err(QatUnavailable::NotBuilt(why) | QatUnavailable::NoDevice(why)) => {
                    Self::software(config, format!("offload mode `auto` fell back to software: {why}"))
                }
            },
        }
    }

    /// A backend on `device` (the simulated `SimDevice` in tests,
    /// or any other [`Device`]).
    ///
    /// # Errors
    /// [`SignError::Config`] for a bad configuration or a device that takes
    /// no requests (`max_batch` or `max_in_flight` of 0);
    /// [`SignError::Io`] if a thread cannot be started.
    pub fn with_device(device: Arc<dyn Device>, config: OffloadConfig) -> Result<Self, SignError> {
        config.validate()?;
        if device.max_batch() == 0 || device.max_in_flight() == 0 {
            return Err(SignError::Config(format!("offload device `{}` takes no requests", device.name())));
        }
        let capacity = config.max_in_flight.min(device.max_in_flight());
        let max_batch = config.batch_size.min(device.max_batch());
        let counters = Arc::new(Counters::default());
        let fallback = FallbackPool::start(config.fallback_threads, capacity)?;
        let batcher = Batcher::start(device.clone(), max_batch, config.batch_window, counters.clone())?;
        let shared = Arc::new(Shared {
            counters,
            on_error: config.on_device_error,
            device_name: device.name().to_string(),
            fallback: Some(fallback),
        });
        Ok(OffloadBackend {
            inner: Arc::new(Inner {
                config,
                device: Some(device),
                batcher: Some(batcher),
                slots: Slots::new(capacity),
                shared,
                software_reason: None,
                next_id: AtomicU64::new(1),
            }),
        })
    }

    fn software(config: OffloadConfig, reason: String) -> Result<Self, SignError> {
        let shared = Arc::new(Shared {
            counters: Arc::new(Counters::default()),
            on_error: config.on_device_error,
            device_name: String::new(),
            fallback: None,
        });
        Ok(OffloadBackend {
            inner: Arc::new(Inner {
                slots: Slots::new(config.max_in_flight),
                config,
                device: None,
                batcher: None,
                shared,
                software_reason: Some(reason),
                next_id: AtomicU64::new(1),
            }),
        })
    }

    /// The device in use (`qat`, `sim`, ...), or `None` when everything
    /// runs in software.
    pub fn device_name(&self) -> Option<&str> {
        self.inner.device.as_deref().map(|d| d.name())
    }

    /// Why no device is in use (`offload mode is off`, or why `auto` found
    /// none); `None` when a device is in use.
    pub fn software_reason(&self) -> Option<&str> {
        self.inner.software_reason.as_deref()
    }

    /// The configuration the backend runs with.
    pub fn config(&self) -> &OffloadConfig {
        &self.inner.config
    }

    /// How many operations may be outstanding at the device: the smaller of
    /// [`OffloadConfig::max_in_flight`] and the device's own limit.
    pub fn max_in_flight(&self) -> usize {
        self.inner.slots.capacity()
    }

    /// Where `op` with `key` runs: [`Route::Device`] only if there is a
    /// device, the routing sends the algorithm there, the device does it
    /// and the key is in this process.
    pub fn route(&self, key: &PrivateKey, op: &Operation) -> Route {
        if self.device_for(key, op).is_some() {
            Route::Device
        } else {
            Route::Software
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> OffloadStats {
        let (in_flight, peak) = self.inner.slots.in_flight();
        self.inner.shared.counters.snapshot(in_flight as u64, peak as u64)
    }

    fn device_for(&self, key: &PrivateKey, op: &Operation) -> Option<&Arc<dyn Device>> {
        let device = self.inner.device.as_ref()?;
        let kind = key.kind();
        let wanted = key.is_local() && self.inner.config.routing.route(kind, op) == Route::Device;
        (wanted && device.supports(kind, op)).then_some(device)
    }

    fn no_room(&self) -> SignError {
        Counters::bump(&self.inner.shared.counters.no_room);
        backend_error(
            BackendFailure::NoRoom,
            format!(
                "no room at offload device `{}`: {} operations in flight until the deadline",
                self.inner.shared.device_name,
                self.inner.slots.capacity()
            ),
        )
    }
}

impl OffloadBackend {
    /// Hands `op` with `key` to the device, answering through `done`
    /// later (from the device's completion, or the fallback threads), if
    /// it goes there: a server's workers call this to sign without an
    /// engine, with the same routing, bound, checks and fallback as
    /// [`Backend::start`]. `Err` hands the parts back when it does not
    /// (software, or no device), for the caller to perform itself.
    ///
    /// # Errors
    /// The key, operation and callback back, when the device is not for them.
    #[allow(clippy::type_complexity)]
    pub(crate) fn offer(
        &self, key: Arc<PrivateKey>, op: Operation, deadline: Instant, done: Callback,
    ) -> Result<(), (Arc<PrivateKey>, Operation, Callback)> {
        let inner = &*self.inner;
        let (Some(_), Some(batcher)) = (self.device_for(&key, &op), inner.batcher.as_ref()) else {
            return Err((key, op, done));
        };
        let Some(slot) = inner.slots.acquire(deadline) else {
            drop((key, op));
            done.answer(Err(self.no_room()));
            return Ok(());
        };
        Counters::bump(&inner.shared.counters.submitted);
        let shared = inner.shared.clone();
        let id = inner.next_id.fetch_add(1, Relaxed);
        let complete = Box::new(move |completion: DeviceCompletion| {
            drop(slot);
            shared.finish(completion, done);
        });
        batcher.push(DeviceRequest::new(id, key, op, deadline, complete));
        Ok(())
    }
}

impl Backend for OffloadBackend {
    fn name(&self) -> &str {
        NAME
    }

    fn class(&self, key: &PrivateKey, op: &Operation) -> OpClass {
        if self.device_for(key, op).is_some() || !key.is_local() {
            OpClass::Slow
        } else if key.kind().is_rsa() {
            OpClass::Rsa
        } else {
            OpClass::Ec
        }
    }

    fn perform(&self, key: &PrivateKey, op: &Operation, deadline: Instant) -> Result<Output, SignError> {
        let counters = &self.inner.shared.counters;
        let Some(device) = self.device_for(key, op) else {
            Counters::bump(&counters.software);
            return key.perform(op);
        };
        // A request that is wrong for the key fails as it would in
        // software, whatever state the device is in. (The engine checked
        // already for `start`.)
        key.check(op)?;
        let called = Instant::now();
        let timed_out = || SignError::TimedOut { timeout: deadline.saturating_duration_since(called) };
        let Some(slot) = self.inner.slots.acquire(deadline) else {
            let e = self.no_room();
            return Err(if Instant::now() >= deadline { timed_out() } else { e });
        };
        Counters::bump(&counters.submitted);
        let result = checked(counters, key, op, device.perform_sync(key, op, deadline));
        drop(slot);
        let shared = &self.inner.shared;
        match result {
            Ok(out) => {
                Counters::bump(&counters.completed);
                Ok(out)
            }
            Err(DeviceError::Rejected(e)) => {
                Counters::bump(&counters.completed);
                Err(e)
            }
            Err(DeviceError::Expired) => {
                Counters::bump(&counters.expired);
                Err(timed_out())
            }
            Err(DeviceError::Unsupported(_)) => {
                Counters::bump(&counters.software);
                key.perform(op)
            }
            Err(e) => {
                Counters::bump(&counters.device_errors);
                match shared.on_error {
                    OnDeviceError::Fail => {
                        Counters::bump(&counters.failed);
                        Err(shared.device_failure(&e))
                    }
                    OnDeviceError::Fallback => {
                        Counters::bump(&counters.fallbacks);
                        key.perform(op)
                    }
                }
            }
        }
    }

    fn start(&self, key: Arc<PrivateKey>, op: Operation, reply: Reply) {
        let inner = &*self.inner;
        let (Some(_), Some(batcher)) = (self.device_for(&key, &op), inner.batcher.as_ref()) else {
            Counters::bump(&inner.shared.counters.software);
            let result = key.perform(&op);
            drop((key, op));
            return reply.send(result);
        };
        let deadline = reply.deadline();
        let Some(slot) = inner.slots.acquire(deadline) else {
            drop((key, op));
            return reply.send(Err(self.no_room()));
        };
        if reply.is_abandoned() {
            drop((slot, key, op));
            return reply.send(Err(backend_error(BackendFailure::GaveUp, "the operation ended before it reached the device")));
        }
        Counters::bump(&inner.shared.counters.submitted);
        let shared = inner.shared.clone();
        let id = inner.next_id.fetch_add(1, Relaxed);
        let done = Box::new(move |completion: DeviceCompletion| {
            // Room for the next request before anything else.
            drop(slot);
            shared.finish(completion, reply);
        });
        batcher.push(DeviceRequest::new(id, key, op, deadline, done));
    }
}
