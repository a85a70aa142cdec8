//! Executors: one bounded queue and one pool of threads per class of
//! operation, so that slow operations (a remote key server, an offload
//! device) can never hold up RSA, and RSA can never hold up ECDSA. This is
//! the fix for the head-of-line blocking in the Geo Key Manager seed, where
//! 3 ms local signatures waited behind 200 ms remote ones in one serial
//! queue.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use super::backend::Reply;
use super::completion::{OpRecord, Work};
use super::error::SignError;
use super::metrics::{ClassMetrics, ClassStats};

/// A class of operations with its own executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpClass {
    /// RSA signing and decryption in software (about a millisecond each).
    Rsa,
    /// ECDSA and Ed25519 in software (tens of microseconds each).
    Ec,
    /// Operations that wait on something outside the process: offload
    /// devices, remote key servers, an isolated key process.
    Slow,
}

impl OpClass {
    /// Every class, in index order.
    pub const ALL: [OpClass; 3] = [OpClass::Rsa, OpClass::Ec, OpClass::Slow];

    /// `rsa`, `ec` or `slow`.
    pub fn name(self) -> &'static str {
        match self {
            OpClass::Rsa => "rsa",
            OpClass::Ec => "ec",
            OpClass::Slow => "slow",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for OpClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
    tx: Sender<Arc<OpRecord>>,
    rx: Receiver<Arc<OpRecord>>,
    pub(crate) stats: Arc<ClassStats>,
    config: ClassConfig,
}

impl Executor {
    pub(crate) fn start(class: OpClass, config: ClassConfig, shutdown: Arc<AtomicBool>) -> Result<Self, SignError> {
        let (tx, rx) = crossbeam_channel::bounded::<Arc<OpRecord>>(config.queue_capacity);
        let stats = Arc::new(ClassStats::new(class, config.threads));
        for i in 0..config.threads {
            let (rx, stats, shutdown) = (rx.clone(), stats.clone(), shutdown.clone());
            std::thread::Builder::new()
                .name(format!("keyfence-{class}-{i}"))
                .spawn(move || work(&rx, &stats, &shutdown))
                .map_err(|e| SignError::Io(format!("cannot start a {class} worker thread: {e}")))?;
        }
        Ok(Executor { class, tx, rx, stats, config })
    }

    /// Queues `record` without waiting.
    pub(crate) fn try_push(&self, record: Arc<OpRecord>) -> Result<(), SignError> {
        // Counted before the push so that a worker's decrement never
        // precedes it.
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        let refused = match self.tx.try_send(record) {
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
fn work(rx: &Receiver<Arc<OpRecord>>, stats: &ClassStats, shutdown: &AtomicBool) {
    while let Ok(record) = rx.recv() {
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
        let Work { key, op, backend } = work;
        let reply = Reply::new(record, backend.clone());
        // A panicking backend drops the reply while unwinding, which answers
        // the caller with an error; the worker lives on.
        let _ = catch_unwind(AssertUnwindSafe(move || backend.start(key, op, reply)));
    }
}
