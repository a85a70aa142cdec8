//! Executors: one bounded queue and one pool of threads per class of
//! operation, so that slow operations (a remote key server, an offload
//! device) can never hold up RSA, and RSA can never hold up ECDSA. This is
//! the fix for the head-of-line blocking in the Geo Key Manager seed, where
//! 3 ms local signatures waited behind 200 ms remote ones in one serial
//! queue.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};

use super::backend::{Backend, Reply};
use super::batch;
use super::metrics::{ClassMetrics, ClassStats};
use super::op_record::{OpRecord, Work};
use super::threads::Joined;
use super::types::{OpClass, Resource, SignError};

/// A queued operation and the backend that will run it.
pub(crate) type Queued = (Arc<OpRecord>, Arc<dyn Backend>);

/// The size of one class's executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassConfig {
    /// Worker threads (at least 1).
    pub threads: usize,
    /// Operations that may wait in the queue (at least 1); beyond that,
    /// submissions are answered [`SignError::Overloaded`] at once.
    pub queue_capacity: usize,
}

pub(crate) struct Executor {
    pub(crate) class: OpClass,
    tx: Sender<Queued>,
    rx: Receiver<Queued>,
    pub(crate) stats: Arc<ClassStats>,
    config: ClassConfig,
    workers: Joined,
    /// Workers whose loop has not returned: 0 once the executor is
    /// dropped (its drop joins them), which the tests hold it to.
    #[cfg(test)]
    pub(crate) live: Arc<std::sync::atomic::AtomicUsize>,
}

impl Executor {
    /// Starts the class's workers. On an error, those already started are
    /// ended and joined before it returns.
    pub(crate) fn start(class: OpClass, config: ClassConfig, shutdown: Arc<AtomicBool>) -> Result<Self, SignError> {
        let (tx, rx) = crossbeam_channel::bounded::<Queued>(config.queue_capacity);
        let stats = Arc::new(ClassStats::new(class, config.threads));
        let mut workers = Joined::new();
        #[cfg(test)]
        let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for i in 0..config.threads {
            let (rx, stats, shutdown) = (rx.clone(), stats.clone(), shutdown.clone());
            #[cfg(test)]
            let live = {
                live.fetch_add(1, Ordering::AcqRel);
                live.clone()
            };
            // On an error `tx` and `workers` drop in that order: the
            // workers started see the queue close, and are joined.
            workers
                .spawn(format!("keyfence-{class}-{i}"), move || {
                    work(class, &rx, &stats, &shutdown);
                    #[cfg(test)]
                    live.fetch_sub(1, Ordering::AcqRel);
                })
                .map_err(|e| SignError::io(Resource::Thread, format!("cannot start a {class} worker thread: {e}")))?;
        }
        Ok(Executor {
            class,
            tx,
            rx,
            stats,
            config,
            workers,
            #[cfg(test)]
            live,
        })
    }

    /// Queues an operation without waiting.
    /// Admits an operation that a backend starts on the submitting thread
    /// ([`Backend::admit`]), which never enters the queue. On the slow
    /// class it still counts against the class's size: at most `threads +
    /// queue_capacity` operations, queued, running or started directly,
    /// the bound a deployment sizes its remote work by (Little's law in
    /// `docs/remote.md`). The fast classes' direct work is bounded by the
    /// key process's own in-flight limit.
    pub(crate) fn admit_direct(&self) -> Result<(), SignError> {
        let capacity = self.config.threads + self.config.queue_capacity;
        let held = self.stats.in_flight.load(Ordering::Relaxed) + self.stats.queued.load(Ordering::Relaxed);
        if self.class == OpClass::Slow && held >= capacity {
            return Err(SignError::Overloaded { class: self.class, capacity });
        }
        Ok(())
    }

    pub(crate) fn try_push(&self, queued: Queued) -> Result<(), SignError> {
        // Counted before the push so that a worker's decrement never
        // precedes it.
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        let refused = match self.tx.try_send(queued) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(_)) => SignError::Overloaded { class: self.class, capacity: self.config.queue_capacity },
            Err(TrySendError::Disconnected(_)) => SignError::ShutDown,
        };
        self.stats.queued.fetch_sub(1, Ordering::Relaxed);
        Err(refused)
    }

    pub(crate) fn metrics(&self) -> ClassMetrics {
        ClassMetrics::snapshot(&self.stats, self.config.threads, self.config.queue_capacity, self.rx.len())
    }
}

impl Drop for Executor {
    /// Closes the queue (a worker answers what is still queued with
    /// `ShutDown` when the engine's shutdown flag is set, then finds the
    /// queue closed and ends) and joins the workers.
    fn drop(&mut self) {
        let (closed, _) = crossbeam_channel::bounded(0);
        drop(std::mem::replace(&mut self.tx, closed));
        self.workers.join();
    }
}

thread_local! {
    static ON_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is one of an executor's workers, where a backend's
/// [`Backend::start`] may wait (a connect, a backoff); on the submitting
/// thread it must not.
pub(crate) fn on_worker() -> bool {
    ON_WORKER.with(std::cell::Cell::get)
}

/// A worker: takes operations until the engine is dropped and the queue is
/// empty. After shutdown, queued operations are answered `ShutDown` rather
/// than performed.
///
/// An EC worker with more operations waiting runs them in a submission
/// batch ([`batch`]): what their completions write (a key server's
/// replies, a completion queue's wake-up byte) leaves when the worker
/// runs out of work, or after [`MAX_HELD`] operations or [`MAX_HOLD`],
/// in one write and one wake-up of the reader instead of one per
/// operation. A lone operation is never held. Never on the RSA class (one
/// operation is long enough that a wait would show) or the slow class
/// (its backends wait).
fn work(class: OpClass, rx: &Receiver<Queued>, stats: &ClassStats, shutdown: &AtomicBool) {
    ON_WORKER.with(|w| w.set(true));
    let holds = class == OpClass::Ec;
    // The open batch, when it opened, and the operations run in it.
    let mut held: Option<(batch::Scope, Instant, usize)> = None;
    loop {
        // Never wait for work with a batch open: another worker may have
        // taken what was queued, and what the batch holds would wait too.
        let (record, backend) = match rx.try_recv() {
            Ok(queued) => queued,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) => {
                held = None;
                match rx.recv() {
                    Ok(queued) => queued,
                    Err(_) => break,
                }
            }
        };
        if holds && held.is_none() && !rx.is_empty() {
            held = Some((batch::begin(), Instant::now(), 0));
        }
        run(record, backend, stats, shutdown);
        if let Some((_, since, n)) = &mut held {
            *n += 1;
            if rx.is_empty() || *n >= MAX_HELD || since.elapsed() >= MAX_HOLD {
                // Dropping the scope writes what it holds.
                held = None;
            }
        }
    }
}

/// Operations one EC worker runs at most before what their completions
/// hold is written...
const MAX_HELD: usize = 32;
/// ...and the longest the first of them waits, give or take the operation
/// under way when it passes (the key process holds its replies the same
/// way). 32 and 400 µs rather than 16 and 100 µs: on
/// alternated binaries the key server's signatures per CPU-second went
/// from 0.61x to 0.65x raw AWS-LC's for P-256 (0.68x to 0.70x for
/// Ed25519), the in-process engine and Python's asyncio path unchanged.
const MAX_HOLD: std::time::Duration = std::time::Duration::from_micros(400);

/// Runs one queued operation.
fn run(record: Arc<OpRecord>, backend: Arc<dyn Backend>, stats: &ClassStats, shutdown: &AtomicBool) {
    stats.queued.fetch_sub(1, Ordering::Relaxed);
    if shutdown.load(Ordering::Acquire) {
        record.finish(Err(SignError::ShutDown));
        return;
    }
    // Already ended (timed out or cancelled while queued): skip.
    let Some(work) = record.start() else { return };
    if Instant::now() >= record.deadline {
        drop(work);
        let timeout = record.timeout;
        record.finish(Err(SignError::TimedOut { timeout }));
        return;
    }
    let Work { key, op } = work;
    let reply = Reply::new(record, backend.clone());
    // A panicking backend drops the reply while unwinding, which answers
    // the caller with an error; the worker lives on.
    let _ = catch_unwind(AssertUnwindSafe(move || backend.start(key, op, reply)));
}
