//! The per-operation record: one submitted operation's life, and the
//! three ways its result reaches the caller: a future ([`SignFuture`]), a
//! callback, or a completion queue. [`OpHandle`] cancels it.
//!
//! Every path that can end an operation (a worker finishing it, the deadline
//! thread, a cancellation, the engine shutting down) goes through
//! [`OpRecord::finish`], which lets exactly one of them win: the result is
//! delivered once, and the operation's inputs are released at that moment.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{self, Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use super::completion_queue::CqShared;
use super::metrics::ClassStats;
use super::private_key::PrivateKey;
use super::types::{OpClass, Operation, Output, SignError};

/// What the worker needs to perform the operation. Dropped as soon as the
/// operation ends, whichever way.
pub(crate) struct Work {
    pub(crate) key: Arc<PrivateKey>,
    pub(crate) op: Operation,
}

/// How the result is delivered.
pub(crate) enum Notify {
    /// Stored in the record for a [`SignFuture`] to take.
    Future,
    /// Called once with the result.
    Callback(Box<dyn FnOnce(Result<Output, SignError>) + Send>),
    /// Pushed onto a completion queue with the caller's token.
    Queue(Arc<CqShared>, u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Running,
    Done,
}

struct Slot {
    phase: Phase,
    work: Option<Work>,
    notify: Option<Notify>,
    /// The result, for [`Notify::Future`] until the future takes it.
    result: Option<Result<Output, SignError>>,
    waker: Option<Waker>,
}

/// A submitted operation.
pub(crate) struct OpRecord {
    pub(crate) id: u64,
    pub(crate) submitted: Instant,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
    pub(crate) stats: Arc<ClassStats>,
    /// Set once the operation has ended, for lock-free polling.
    pub(crate) done: AtomicBool,
    slot: Mutex<Slot>,
}

impl OpRecord {
    pub(crate) fn new(id: u64, submitted: Instant, timeout: Duration, stats: Arc<ClassStats>, work: Work, notify: Notify) -> Self {
        // A timeout too large for `Instant` means "never": a century will do.
        let deadline = submitted.checked_add(timeout).unwrap_or_else(|| submitted + Duration::from_secs(100 * 365 * 24 * 3600));
        OpRecord {
            id,
            submitted,
            deadline,
            timeout,
            stats,
            done: AtomicBool::new(false),
            slot: Mutex::new(Slot { phase: Phase::Queued, work: Some(work), notify: Some(notify), result: None, waker: None }),
        }
    }

    /// The slot, even if a thread panicked while holding it: every update
    /// under this lock leaves the slot consistent, so poisoning carries no
    /// meaning here.
    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves a queued operation to running and hands its work to the
    /// worker; `None` if it already ended (timed out or cancelled in the
    /// queue).
    pub(crate) fn start(&self) -> Option<Work> {
        let mut slot = self.slot();
        if slot.phase != Phase::Queued {
            return None;
        }
        slot.phase = Phase::Running;
        slot.work.take()
    }

    /// Whether the operation has ended.
    pub(crate) fn is_done(&self) -> bool {
        self.slot().phase == Phase::Done
    }

    /// Ends the operation with `result` unless it already ended; returns
    /// whether this call ended it. Updates the class metrics, releases the
    /// inputs, and delivers the result (outside the lock, so a callback may
    /// submit again).
    pub(crate) fn finish(&self, result: Result<Output, SignError>) -> bool {
        let mut slot = self.slot();
        if slot.phase == Phase::Done {
            return false;
        }
        slot.phase = Phase::Done;
        let work = slot.work.take();
        let notify = slot.notify.take();
        match &result {
            Ok(_) => {
                self.stats.completed.fetch_add(1, Relaxed);
                self.stats.latency.record(self.submitted.elapsed());
            }
            Err(e) => self.stats.error(e.kind()),
        }
        match notify {
            Some(Notify::Future) | None => {
                slot.result = Some(result);
                self.done.store(true, Ordering::Release);
                let waker = slot.waker.take();
                drop(slot);
                drop(work);
                if let Some(w) = waker {
                    w.wake();
                }
            }
            Some(Notify::Callback(cb)) => {
                self.done.store(true, Ordering::Release);
                drop(slot);
                drop(work);
                // A panicking callback must not take an engine thread down
                // with it; the operation has ended either way.
                let _ = catch_unwind(AssertUnwindSafe(move || cb(result)));
            }
            Some(Notify::Queue(queue, user_data)) => {
                self.done.store(true, Ordering::Release);
                drop(slot);
                drop(work);
                queue.push(user_data, self.id, result);
            }
        }
        true
    }
}

/// How long before an operation's expected completion [`SignFuture::wait`]
/// asks to be woken: Linux's default timer slack (50 µs) plus what a halted
/// virtual CPU takes to resume (about 20 µs), with a margin.
const WAIT_WAKE_AHEAD: Duration = Duration::from_micros(120);

/// How long past the expected completion [`SignFuture::wait`] polls before
/// going back to sleep.
const WAIT_SPIN: Duration = Duration::from_micros(100);

/// A handle on a submitted operation: cancel it or ask whether it ended.
/// Cheap to clone; holding it keeps no inputs alive once the operation ends.
#[derive(Clone)]
pub struct OpHandle {
    pub(crate) record: Arc<OpRecord>,
}

impl std::fmt::Debug for OpHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpHandle").field("id", &self.record.id).field("done", &self.is_done()).finish()
    }
}

impl OpHandle {
    /// The operation's engine-wide id (also in [`Completion::id`](super::Completion::id)).
    pub fn id(&self) -> u64 {
        self.record.id
    }

    /// Cancels the operation: the caller gets [`SignError::Cancelled`] and
    /// its inputs are released. An operation still in the queue never runs;
    /// one already running finishes on its executor and the result is
    /// discarded (AWS-LC cannot be interrupted mid-operation). Returns
    /// false if the operation had already ended.
    pub fn cancel(&self) -> bool {
        self.record.finish(Err(SignError::Cancelled))
    }

    /// Whether the operation has ended (result delivered, timed out or
    /// cancelled).
    pub fn is_done(&self) -> bool {
        self.record.is_done()
    }

    /// When the operation times out.
    pub fn deadline(&self) -> Instant {
        self.record.deadline
    }
}

/// The result of an operation submitted with
/// [`Engine::submit`](super::Engine::submit), as a future.
///
/// Dropping the future before it completes cancels the operation. Polling
/// it again after it returned `Ready` yields [`SignError::Cancelled`].
#[must_use = "dropping the future cancels the operation"]
pub struct SignFuture {
    pub(crate) record: Arc<OpRecord>,
}

impl std::fmt::Debug for SignFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignFuture").field("id", &self.record.id).finish()
    }
}

impl SignFuture {
    /// A handle to cancel the operation from elsewhere.
    pub fn handle(&self) -> OpHandle {
        OpHandle { record: self.record.clone() }
    }

    /// Takes the result if the operation has ended, without waiting.
    pub fn try_take(&mut self) -> Option<Result<Output, SignError>> {
        let mut slot = self.record.slot();
        if slot.phase == Phase::Done {
            Some(slot.result.take().unwrap_or(Err(SignError::Cancelled)))
        } else {
            None
        }
    }

    /// Blocks the calling thread until the result arrives. For callers
    /// without an async runtime (the command line, tests, benchmarks); an
    /// event loop should poll the future or use a callback or a
    /// [`CompletionQueue`](super::CompletionQueue) instead.
    ///
    /// A thread that slept through a whole RSA signature can take tens of
    /// microseconds to wake (an idle virtual CPU halts), which would double
    /// the engine's added latency. So when the executor has spare workers,
    /// `wait` sleeps until shortly before the operation's typical completion
    /// time and then polls until at most 100 µs past it; when the
    /// executor is busy, that CPU belongs to the workers and `wait` just
    /// sleeps. It always sleeps for a PKCS#11 token's key
    /// ([`OpClass::Token`]), whose module needs the CPU or waits on a
    /// device.
    ///
    /// Inside a submission batch ([`Engine::batch`](super::Engine::batch)),
    /// `wait` first sends what the batch holds, so waiting there is safe.
    pub fn wait(mut self) -> Result<Output, SignError> {
        super::batch::flush_now();
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
            fn wake_by_ref(self: &Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(r) = Pin::new(&mut self).poll(&mut cx) {
                return r;
            }
            let stats = &self.record.stats;
            // A token key is never waited for by spinning: its module works
            // in this process on the very CPUs a spinning caller would take
            // (SoftHSM2: four waiters spinning beside four token threads
            // on two cores cut throughput fivefold), or waits on a network
            // HSM for milliseconds.
            let eta = match stats.service_estimate() {
                Some(est) if stats.mostly_idle() && stats.class != OpClass::Token => self.record.submitted + est,
                _ => {
                    std::thread::park();
                    continue;
                }
            };
            let now = Instant::now();
            if now + WAIT_WAKE_AHEAD < eta {
                // Unparked early if the result comes sooner.
                std::thread::park_timeout(eta - WAIT_WAKE_AHEAD - now);
            } else if now < eta + WAIT_SPIN {
                let until = eta + WAIT_SPIN;
                while !self.record.done.load(Ordering::Acquire) && Instant::now() < until {
                    std::hint::spin_loop();
                }
            } else {
                std::thread::park();
            }
        }
    }
}

impl Future for SignFuture {
    type Output = Result<Output, SignError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut slot = self.record.slot();
        if slot.phase == Phase::Done {
            return Poll::Ready(slot.result.take().unwrap_or(Err(SignError::Cancelled)));
        }
        match &slot.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => slot.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for SignFuture {
    fn drop(&mut self) {
        // Cancels if still pending; otherwise releases an untaken result
        // now rather than when the deadline thread lets go of the record.
        if !self.record.finish(Err(SignError::Cancelled)) {
            drop(self.record.slot().result.take());
        }
    }
}
