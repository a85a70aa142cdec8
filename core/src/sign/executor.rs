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

use crossbeam_channel::{Receiver, Sender, TrySendError};

use super::backend::{Backend, Reply};
use super::metrics::{ClassMetrics, ClassStats};
use super::op_record::{OpRecord, Work};
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
}

impl Executor {
    pub(crate) fn start(class: OpClass, config: ClassConfig, shutdown: Arc<AtomicBool>) -> Result<Self, SignError> {
        let (tx, rx) = crossbeam_channel::bounded::<Queued>(config.queue_capacity);
        let stats = Arc::new(ClassStats::new(class, config.threads));
        for i in 0..config.threads {
            let (rx, stats, shutdown) = (rx.clone(), stats.clone(), shutdown.clone());
            std::thread::Builder::new()
                .name(format!("keyfence-{class}-{i}"))
                .spawn(move || work(&rx, &stats, &shutdown))
                .map_err(|e| SignError::io(Resource::Thread, format!("cannot start a {class} worker thread: {e}")))?;
        }
        Ok(Executor { class, tx, rx, stats, config })
    }

    /// Queues an operation without waiting.
    pub(crate) fn try_push(&self, queued: Queued) -> Result<(), SignError> {
        // Counted before the push so that a worker's decrement never
        // precedes it.
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        let refused = match self.tx.try_send(queued) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(_)) => {
                SignError::Overloaded { class: self.class, capacity: self.config.queue_capacity }
            }
            Err(TrySendError::Disconnected(_)) => SignError::ShutDown,
        };
        self.stats.queued.fetch_sub(1, Ordering::Relaxed);
        Err(refused)
    }

    pub(crate) fn metrics(&self) -> ClassMetrics {
        ClassMetrics::snapshot(&self.stats, self.config.threads, self.config.queue_capacity, self.rx.len())
    }
}

/// A worker: takes operations until the engine is dropped and the queue is
/// empty. After shutdown, queued operations are answered `ShutDown` rather
/// than performed.
fn work(rx: &Receiver<Queued>, stats: &ClassStats, shutdown: &AtomicBool) {
    while let Ok((record, backend)) = rx.recv() {
        stats.queued.fetch_sub(1, Ordering::Relaxed);
        if shutdown.load(Ordering::Acquire) {
            record.finish(Err(SignError::ShutDown));
            continue;
        }
        // Already ended (timed out or cancelled while queued): skip.
        let Some(work) = record.start() else { continue };
        if Instant::now() >= record.deadline {
            drop(work);
            let timeout = record.timeout;
            record.finish(Err(SignError::TimedOut { timeout }));
            continue;
        }
        let Work { key, op } = work;
        let reply = Reply::new(record, backend.clone());
        // A panicking backend drops the reply while unwinding, which answers
        // the caller with an error; the worker lives on.
        let _ = catch_unwind(AssertUnwindSafe(move || backend.start(key, op, reply)));
    }
}
