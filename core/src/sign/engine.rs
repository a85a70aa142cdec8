//! The engine: submission, routing to executors, deadlines, metrics.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backend::{Backend, HolderBackend, Reply, SoftwareBackend};
use super::batch;
use super::completion_queue::CompletionQueue;
use super::deadline::Deadlines;
use super::executor::{ClassConfig, Executor};
use super::metrics::{EngineMetrics, MetricsSource, SourceMetrics};
use super::op_record::{Notify, OpHandle, OpRecord, SignFuture, Work};
use super::private_key::PrivateKey;
use super::request::Request;
use super::threads::Origin;
use super::types::{Algorithm, OpClass, Output, SignError};

/// How an [`Engine`] is sized. [`EngineConfig::default`] derives the sizes
/// from the number of cores; adjust fields from there.
///
/// ```
/// use keyfence::sign::EngineConfig;
/// let mut config = EngineConfig::default();
/// config.slow.threads = 64; // many remote operations in flight at once
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The RSA executor. Default: one thread per core, 256 queued per
    /// thread (a few hundred milliseconds of RSA-2048 work).
    pub rsa: ClassConfig,
    /// The ECDSA/Ed25519 executor. Default: one thread per core, 4096 queued
    /// per thread (about 100 ms of P-256 work).
    pub ec: ClassConfig,
    /// The slow executor (offload, remote, key process). Its threads mostly
    /// wait, so there are more of them: default 4 per core, at least 8, and
    /// 64 queued per thread. By Little's law, `threads / latency` is its
    /// throughput: 8 threads at 200 ms serve 40 operations a second.
    pub slow: ClassConfig,
    /// The PKCS#11 token executor ([`OpClass::Token`]): one thread per
    /// operation a token performs at once, each with its own session.
    /// Default 2 per core, at least 4, and 256 queued per thread.
    pub token: ClassConfig,
    /// The timeout of requests that do not set one. Default 2 s, an order
    /// of magnitude above a loaded RSA-4096 signature, as the seeds advise.
    pub default_timeout: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        EngineConfig {
            rsa: ClassConfig { threads: cores, queue_capacity: 256 * cores },
            ec: ClassConfig { threads: cores, queue_capacity: 4096 * cores },
            slow: ClassConfig { threads: (4 * cores).max(8), queue_capacity: 64 * (4 * cores).max(8) },
            token: ClassConfig { threads: (2 * cores).max(4), queue_capacity: 256 * (2 * cores).max(4) },
            default_timeout: Duration::from_secs(2),
        }
    }
}

impl EngineConfig {
    /// The configuration of `class`.
    pub fn class(&self, class: OpClass) -> &ClassConfig {
        match class {
            OpClass::Rsa => &self.rsa,
            OpClass::Ec => &self.ec,
            OpClass::Slow => &self.slow,
            OpClass::Token => &self.token,
        }
    }

    /// Checks the sizes: 1 to 4096 threads and at least one queue slot per
    /// class, and a non-zero default timeout.
    ///
    /// # Errors
    /// [`SignError::Config`] naming the first bad field.
    pub fn validate(&self) -> Result<(), SignError> {
        for class in OpClass::ALL {
            let c = self.class(class);
            if !(1..=4096).contains(&c.threads) {
                return Err(SignError::Config(format!("{class}.threads must be 1 to 4096, not {}", c.threads)));
            }
            if !(1..=1 << 24).contains(&c.queue_capacity) {
                return Err(SignError::Config(format!("{class}.queue_capacity must be 1 to 16777216, not {}", c.queue_capacity)));
            }
        }
        if self.default_timeout.is_zero() {
            return Err(SignError::Config("default_timeout must not be zero".into()));
        }
        Ok(())
    }
}

struct Core {
    origin: Origin,
    executors: Vec<Executor>,
    deadlines: Deadlines,
    backend: Arc<dyn Backend>,
    config: EngineConfig,
    shutdown: Arc<AtomicBool>,
    next_id: AtomicU64,
    sources: std::sync::Mutex<Vec<Arc<dyn MetricsSource>>>,
}

impl Drop for Core {
    fn drop(&mut self) {
        // Workers answer what is still queued with `ShutDown`, then exit
        // when the channels disconnect (the senders drop with `executors`).
        // Running operations finish and deliver their results.
        self.shutdown.store(true, Ordering::Release);
    }
}

/// The asynchronous signing engine.
///
/// Submit a [`Request`] and get the result later, through a future
/// ([`Engine::submit`]), a callback ([`Engine::submit_with_callback`]) or a
/// pollable completion queue ([`Engine::submit_to_queue`]). Submitting never
/// waits for work: it validates the request, puts it on its class's bounded
/// queue or answers [`SignError::Overloaded`] at once, and registers the
/// deadline. Each class ([`OpClass`]) has its own threads, so slow
/// operations never delay fast ones.
///
/// Cheap to clone; the engine shuts down when the last clone is dropped
/// (queued operations are answered [`SignError::ShutDown`]).
///
/// ```
/// use std::sync::Arc;
/// use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyKind, PrivateKey};
/// let engine = Engine::new(EngineConfig::default()).unwrap();
/// let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
/// let sig = engine.sign(&key, Algorithm::EcdsaP256Sha256, b"hello").unwrap().wait().unwrap();
/// assert!(sig.len() >= 8);
/// ```
#[derive(Clone)]
pub struct Engine {
    core: Arc<Core>,
}

impl Drop for Engine {
    /// In a forked child, the engine is left as it is: ending it would
    /// wait for threads that are not here and close queues another
    /// process's threads may hold locks in.
    fn drop(&mut self) {
        if self.core.origin.forked() {
            std::mem::forget(self.core.clone());
        }
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("config", &self.core.config).field("backend", &self.core.backend.name()).finish()
    }
}

impl Engine {
    /// Starts an engine with the in-process AWS-LC backend
    /// ([`SoftwareBackend`]).
    ///
    /// # Errors
    /// [`SignError::Config`] for a bad configuration, [`SignError::Io`] if
    /// threads cannot be started.
    pub fn new(config: EngineConfig) -> Result<Self, SignError> {
        Self::with_backend(config, Arc::new(SoftwareBackend))
    }

    /// Starts an engine whose requests run on `backend` unless they name
    /// another.
    ///
    /// # Errors
    /// As [`Engine::new`].
    pub fn with_backend(config: EngineConfig, backend: Arc<dyn Backend>) -> Result<Self, SignError> {
        config.validate()?;
        let shutdown = Arc::new(AtomicBool::new(false));
        let mut executors = Vec::with_capacity(OpClass::ALL.len());
        for class in OpClass::ALL {
            match Executor::start(class, *config.class(class), shutdown.clone()) {
                Ok(e) => executors.push(e),
                Err(e) => {
                    // Let the threads already started exit.
                    shutdown.store(true, Ordering::Release);
                    return Err(e);
                }
            }
        }
        let deadlines = match Deadlines::start() {
            Ok(d) => d,
            Err(e) => {
                shutdown.store(true, Ordering::Release);
                return Err(e);
            }
        };
        Ok(Engine {
            core: Arc::new(Core {
                origin: Origin::here(),
                executors,
                deadlines,
                backend,
                config,
                shutdown,
                next_id: AtomicU64::new(1),
                sources: std::sync::Mutex::new(Vec::new()),
            }),
        })
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.core.config
    }

    fn submit_inner(&self, req: Request, notify: Notify) -> Result<Arc<OpRecord>, SignError> {
        let core = &*self.core;
        // In a forked child the engine's threads do not exist: nothing
        // would ever run or time out what is queued.
        if core.origin.forked() {
            return Err(SignError::forked(
                "this engine",
                core.origin.pid(),
                "its threads are that process's; make an engine in this process",
            ));
        }
        if let Some(held) = req.key.as_held() {
            held.usable_here()?;
        }
        // A key held elsewhere runs on its holder and nowhere else: a
        // request that names another backend is a mistake, said at once.
        let backend: Arc<dyn Backend> = match (req.key.as_held(), req.backend) {
            (Some(held), None) => Arc::new(HolderBackend(held.holder().clone())),
            (Some(held), Some(named)) => {
                let e = SignError::HeldElsewhere { holder: held.holder().name().to_string(), requested: named.name().to_string() };
                let class = held.holder().class(req.key.kind());
                core.executors[class.index()].stats.error(e.kind());
                return Err(e);
            }
            (None, named) => named.unwrap_or_else(|| core.backend.clone()),
        };
        let class = backend.class(&req.key, &req.op);
        let exec = &core.executors[class.index()];
        if let Err(e) = req.key.check(&req.op) {
            exec.stats.error(e.kind());
            return Err(e);
        }
        // Started here, it never enters the queue, so the class's bound is
        // checked apart (see `Executor::admit_direct`).
        let admitted = backend.admit(&req.key, &req.op);
        let direct = match admitted.and_then(|direct| if direct { exec.admit_direct().map(|()| true) } else { Ok(false) }) {
            Ok(direct) => direct,
            Err(e) => {
                exec.stats.error(e.kind());
                return Err(e);
            }
        };
        let timeout = req.timeout.unwrap_or(core.config.default_timeout);
        let id = core.next_id.fetch_add(1, Ordering::Relaxed);
        let work = Work { key: req.key, op: req.op };
        let record = Arc::new(OpRecord::new(id, Instant::now(), timeout, exec.stats.clone(), work, notify));
        if direct {
            exec.stats.submitted.fetch_add(1, Ordering::Relaxed);
            core.deadlines.watch(record.clone());
            if let Some(Work { key, op }) = record.start() {
                let reply = Reply::new(record.clone(), backend.clone());
                backend.start(key, op, reply);
            }
            return Ok(record);
        }
        if let Err(e) = exec.try_push((record.clone(), backend)) {
            // Never queued: the caller learns it here, and the callback (if
            // any) is dropped uncalled with the record.
            exec.stats.error(e.kind());
            return Err(e);
        }
        exec.stats.submitted.fetch_add(1, Ordering::Relaxed);
        core.deadlines.watch(record.clone());
        Ok(record)
    }

    /// Runs `submit` as one submission batch: requests it submits on this
    /// thread to a key process are written together when it returns (one
    /// system call and one wake-up of the key process for all of them)
    /// instead of one by one. What an event loop calls around the
    /// submissions of one wake-up. Every other backend starts each request
    /// as it is submitted, as outside a batch.
    ///
    /// Nothing submitted is held past the batch: it is written when
    /// `submit` returns or unwinds, and earlier when a request must wait
    /// for room in the key process or [`SignFuture::wait`] is called inside
    /// the batch. Admission is unchanged: past the key process's
    /// `max_in_flight` requests outstanding, a submission is refused with
    /// [`SignError::Overloaded`], as in any burst faster than the replies.
    /// Nested batches join the outermost.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyKind, PrivateKey};
    /// # let engine = Engine::new(EngineConfig::default())?;
    /// # let key = Arc::new(PrivateKey::generate(KeyKind::EcP256)?);
    /// let pending = engine.batch(|| {
    ///     (0..16).map(|_| engine.sign(&key, Algorithm::EcdsaP256Sha256, b"hello")).collect::<Result<Vec<_>, _>>()
    /// })?;
    /// for signature in pending {
    ///     assert!(!signature.wait()?.is_empty());
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn batch<R>(&self, submit: impl FnOnce() -> R) -> R {
        let _scope = batch::begin();
        submit()
    }

    /// Submits `req`; the result arrives through the returned future.
    /// Dropping the future cancels the operation.
    ///
    /// # Errors
    /// At once, without queueing: [`SignError::Overloaded`] when the class's
    /// queue is full, [`SignError::ShutDown`], and the request errors of
    /// [`PrivateKey::check`]. Later, through the future: the operation's
    /// own errors, [`SignError::TimedOut`], [`SignError::Cancelled`].
    pub fn submit(&self, req: Request) -> Result<SignFuture, SignError> {
        Ok(SignFuture { record: self.submit_inner(req, Notify::Future)? })
    }

    /// Performs `req` and waits for its outcome. When the engine would
    /// queue it for an executor thread of a backend that computes in this
    /// process (the software backend, with a key in this process's
    /// memory), the calling thread performs it instead: it waits either
    /// way, and a synchronous caller (the OpenSSL provider signing for a
    /// handshake, `keyfence_engine_sign`) then pays no hand-off to another
    /// thread and back, which on two busy cores is a tenth of a P-256 TLS
    /// handshake. The class's counters and latency count it as any other
    /// operation; it is bounded by the callers' threads, not the queue.
    /// A key in a PKCS#11 token this process opened is performed in place
    /// too, by at most as many callers at once as the token class has
    /// workers (more are queued, with their deadline). Anything else (a
    /// key held by a key process or an agent, another backend) is
    /// submitted and waited for: `submit(req)?.wait()`.
    ///
    /// # Errors
    /// As [`Engine::submit`] and [`SignFuture::wait`].
    pub fn perform(&self, req: Request) -> Result<Output, SignError> {
        let core = &*self.core;
        if core.origin.forked() {
            return self.submit(req)?.wait();
        }
        // A key in a PKCS#11 token this process opened: the token's call
        // blocks whichever thread makes it, so a caller that waits anyway
        // makes it, as a PKCS#11 provider does, saving two thread
        // hand-offs per signature. A caller goes in place only while fewer
        // operations than the class has workers are in flight (in place
        // or on the workers): past that (a token that hangs holds them
        // all) calls are queued, so every caller but those few keeps its
        // deadline. In place, the token's call itself has no deadline.
        // What performs the operation on this thread: a token key's holder,
        // or a backend that computes in this process.
        enum InPlace<'a> {
            Holder(&'a crate::sign::held_key::HeldKey),
            Backend(Arc<dyn Backend>),
        }
        let here = match req.key.as_held() {
            None => {
                let backend = req.backend.clone().unwrap_or_else(|| core.backend.clone());
                if !backend.performs_in_place() {
                    return self.submit(req)?.wait();
                }
                InPlace::Backend(backend)
            }
            Some(held) if req.backend.is_none() && held.holder().performs_in_place() && held.usable_here().is_ok() => InPlace::Holder(held),
            Some(_) => return self.submit(req)?.wait(),
        };
        let (class, bounded) = match &here {
            InPlace::Holder(h) => (h.holder().class(req.key.kind()), true),
            InPlace::Backend(b) => (b.class(&req.key, &req.op), false),
        };
        let exec = &core.executors[class.index()];
        if let Err(e) = req.key.check(&req.op) {
            exec.stats.error(e.kind());
            return Err(e);
        }
        /// Gives the in-flight count back however the call ends.
        struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let in_flight = &exec.stats.in_flight;
        if bounded && in_flight.fetch_add(1, Ordering::AcqRel) >= exec.stats.workers {
            in_flight.fetch_sub(1, Ordering::Relaxed);
            return self.submit(req)?.wait();
        }
        if !bounded {
            in_flight.fetch_add(1, Ordering::Relaxed);
        }
        let counted = InFlight(in_flight);
        exec.stats.submitted.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let timeout = req.timeout.unwrap_or(core.config.default_timeout);
        let deadline = started.checked_add(timeout).unwrap_or(started + Duration::from_secs(86_400 * 365));
        let result = match &here {
            InPlace::Holder(h) => h.holder().perform(h.id(), &req.op, deadline),
            InPlace::Backend(b) => b.perform(&req.key, &req.op, deadline),
        };
        drop(counted);
        match &result {
            Ok(_) => {
                exec.stats.completed.fetch_add(1, Ordering::Relaxed);
                exec.stats.latency.record(started.elapsed());
                exec.stats.record_service(started.elapsed());
            }
            Err(e) => exec.stats.error(e.kind()),
        }
        result
    }

    /// Submits `req`; `callback` is called once with the result, on an
    /// engine thread (a worker or the deadline thread) or on the thread that
    /// cancels. Keep it short: hand the result to your own loop. If this
    /// returns an error the callback is never called.
    ///
    /// # Errors
    /// As [`Engine::submit`], at once.
    pub fn submit_with_callback<F>(&self, req: Request, callback: F) -> Result<OpHandle, SignError>
    where
        F: FnOnce(Result<Output, SignError>) + Send + 'static,
    {
        let record = self.submit_inner(req, Notify::Callback(Box::new(callback)))?;
        Ok(OpHandle { record })
    }

    /// Submits `req`; the result is pushed onto `queue` with `user_data`,
    /// and the queue's descriptor becomes readable.
    ///
    /// # Errors
    /// As [`Engine::submit`], at once.
    pub fn submit_to_queue(&self, req: Request, queue: &CompletionQueue, user_data: u64) -> Result<OpHandle, SignError> {
        if queue.shared.origin.forked() {
            return Err(SignError::forked(
                "this completion queue",
                queue.shared.origin.pid(),
                "its descriptor is shared with that process; make a queue in this process",
            ));
        }
        let record = self.submit_inner(req, Notify::Queue(queue.shared.clone(), user_data))?;
        Ok(OpHandle { record })
    }

    /// Shorthand: sign `msg` with `key` and `alg` under the default backend
    /// and timeout.
    ///
    /// # Errors
    /// As [`Engine::submit`].
    pub fn sign(&self, key: &Arc<PrivateKey>, alg: Algorithm, msg: &[u8]) -> Result<SignFuture, SignError> {
        self.submit(Request::sign(key.clone(), alg, msg.to_vec()))
    }

    /// A snapshot of every class's counters and latency percentiles, and
    /// of the attached sources' figures.
    pub fn metrics(&self) -> EngineMetrics {
        let sources: Vec<Arc<dyn MetricsSource>> = self.core.sources.lock().unwrap_or_else(|e| e.into_inner()).clone();
        EngineMetrics {
            classes: self.core.executors.iter().map(Executor::metrics).collect(),
            sources: sources.iter().map(|s| SourceMetrics { name: s.name(), prometheus: s.prometheus() }).collect(),
        }
    }

    /// Reports `source`'s figures with this engine's metrics from now on
    /// (a [`RemoteSigner`](super::remote::RemoteSigner)'s per-peer
    /// counters, say), so one scrape of [`EngineMetrics::prometheus`]
    /// shows the queues and the hop behind them.
    pub fn attach_metrics(&self, source: Arc<dyn MetricsSource>) {
        self.core.sources.lock().unwrap_or_else(|e| e.into_inner()).push(source);
    }

    #[cfg(test)]
    pub(crate) fn watched_deadlines(&self) -> usize {
        self.core.deadlines.watched()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::KeyKind;

    /// Dropping the last handle ends and joins every worker before it
    /// returns, also with an operation under way and work still queued: a
    /// library unloaded right after (OpenSSL's providers at exit) must
    /// find none of its threads running.
    #[cfg(feature = "testing")]
    #[test]
    fn dropping_the_engine_joins_every_worker() {
        use crate::sign::LatencyBackend;
        for busy in [false, true] {
            let config = EngineConfig { slow: ClassConfig { threads: 2, queue_capacity: 8 }, ..EngineConfig::default() };
            let backend = Arc::new(LatencyBackend::new(Duration::from_millis(100)));
            let engine = Engine::with_backend(config, backend).unwrap();
            let live: Vec<_> = engine.core.executors.iter().map(|e| e.live.clone()).collect();
            let futures = if busy {
                let key = Arc::new(PrivateKey::generate(KeyKind::Ed25519).unwrap());
                (0..4).map(|_| engine.sign(&key, Algorithm::Ed25519, b"m").unwrap()).collect()
            } else {
                Vec::new()
            };
            if busy {
                // Two running, two queued.
                std::thread::sleep(Duration::from_millis(20));
            }
            drop(engine);
            let left: Vec<usize> = live.iter().map(|l| l.load(Ordering::Acquire)).collect();
            assert_eq!(left, [0, 0, 0, 0], "workers still running after the drop (busy: {busy})");
            for f in futures {
                // The two under way finished; the two queued were answered.
                let r = f.wait();
                assert!(matches!(r, Ok(_) | Err(SignError::ShutDown)), "{r:?}");
            }
        }
    }

    #[test]
    fn finished_operations_do_not_accumulate_in_the_deadline_heap() {
        let engine = Engine::new(EngineConfig::default()).unwrap();
        let key = Arc::new(PrivateKey::generate(KeyKind::Ed25519).unwrap());
        for _ in 0..20 {
            let futs: Vec<_> = (0..500).map(|_| engine.sign(&key, Algorithm::Ed25519, b"m").unwrap()).collect();
            for f in futs {
                f.wait().unwrap();
            }
        }
        // 10 000 operations with a 2 s timeout all ended long before their
        // deadlines; pruning keeps the heap near its floor, not at 10 000.
        let watched = engine.watched_deadlines();
        assert!(watched <= 2 * 500 + 1024, "{watched} deadlines still watched");
        assert_eq!(engine.metrics().class(OpClass::Ec).completed, 10_000);
    }
}
