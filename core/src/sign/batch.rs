//! Submission batches: while a thread is inside
//! [`Engine::batch`](super::Engine::batch), a backend that sends each
//! request somewhere (the key process) queues the request instead of
//! writing it, and everything queued leaves together when the batch ends:
//! one system call, and one wake-up of the other side, for many requests.
//!
//! Why a scope on the submitting thread and not a timer or a writer
//! thread: an event loop knows when it has submitted everything one
//! wake-up produced, and nothing else does. A writer thread that waited
//! for company was measured to double the added latency of one request
//! (see `key_process::server::writer`); a scope adds none, since it ends when the
//! caller has nothing more to submit.
//!
//! The state is per thread and holds no request: only what to flush.
//! Nothing in it can be left behind: the scope's guard flushes on every
//! exit, unwinding included, and a backend that would have to wait for
//! room while holding its own unsent requests flushes them first
//! ([`flush_now`]).

use std::cell::RefCell;
use std::sync::Arc;

/// Something that holds writes or wake-ups back during a batch: a
/// connection's queued requests, a completion channel's wake-up of its
/// event loop.
pub trait Flush: Send + Sync {
    /// Sends whatever is held (writes it, wakes the reader).
    fn flush(&self);
}

/// Whether this thread is in a batch (an [`Engine::batch`](super::Engine::batch)
/// scope, or an executor worker with more operations waiting, where
/// completion callbacks run); if it is, `target` is flushed when the batch
/// ends, and the caller may hold its write or wake-up back until then.
/// Outside a batch it returns false: flush now.
///
/// What a binding's completion channel calls before waking its event loop,
/// so that a worker finishing a run of operations wakes the loop once for
/// them all (the C ABI's completion queue does the same).
pub fn flush_later(target: &Arc<dyn Flush>) -> bool {
    defer(|| target.clone(), |t| std::ptr::addr_eq(Arc::as_ptr(t), Arc::as_ptr(target)))
}

thread_local! {
    /// `Some` inside a batch: what to flush when it ends (a handful of
    /// connections at most, so a list).
    static OPEN: RefCell<Option<Vec<Arc<dyn Flush>>>> = const { RefCell::new(None) };
}

/// Whether this thread is inside a batch; if it is, `target` is flushed
/// when the batch ends and the caller may queue without writing.
pub(crate) fn defer(target: impl FnOnce() -> Arc<dyn Flush>, same: impl Fn(&Arc<dyn Flush>) -> bool) -> bool {
    OPEN.with(|open| {
        let mut open = open.borrow_mut();
        let Some(list) = open.as_mut() else { return false };
        if !list.iter().any(same) {
            list.push(target());
        }
        true
    })
}

/// [`defer`] for a target held in an `Arc`: a clone of it is registered
/// the first time it joins the batch.
pub(crate) fn defer_arc<T: Flush + 'static>(target: &Arc<T>) -> bool {
    defer(|| -> Arc<dyn Flush> { target.clone() }, |t| std::ptr::addr_eq(Arc::as_ptr(t), Arc::as_ptr(target)))
}

/// Flushes everything this thread's batch has queued so far, and keeps
/// the batch open.
pub(crate) fn flush_now() {
    let list = OPEN.with(|open| open.borrow().clone());
    for target in list.iter().flatten() {
        target.flush();
    }
}

/// The scope of one batch: flushes when dropped. Nested scopes join the
/// outermost one.
pub(crate) struct Scope {
    outermost: bool,
}

/// Opens a batch on this thread.
pub(crate) fn begin() -> Scope {
    let outermost = OPEN.with(|open| {
        let mut open = open.borrow_mut();
        if open.is_some() {
            return false;
        }
        *open = Some(Vec::new());
        true
    });
    Scope { outermost }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if !self.outermost {
            return;
        }
        // Closed before flushing, so that a flush that submits (a
        // callback run inline) writes at once instead of queueing into a
        // batch nobody will end.
        let list = OPEN.with(|open| open.borrow_mut().take());
        for target in list.into_iter().flatten() {
            target.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counter(AtomicUsize);

    impl Flush for Counter {
        fn flush(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn register(c: &Arc<Counter>) -> bool {
        defer_arc(c)
    }

    #[test]
    fn outside_a_batch_nothing_is_deferred() {
        let c = Arc::new(Counter(AtomicUsize::new(0)));
        assert!(!register(&c));
        assert_eq!(c.0.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_batch_flushes_each_target_once_when_it_ends_even_nested() {
        let (a, b) = (Arc::new(Counter(AtomicUsize::new(0))), Arc::new(Counter(AtomicUsize::new(0))));
        {
            let _outer = begin();
            assert!(register(&a));
            {
                let _inner = begin();
                assert!(register(&a));
                assert!(register(&b));
            }
            // The inner scope joined the outer one: nothing flushed yet.
            assert_eq!((a.0.load(Ordering::Relaxed), b.0.load(Ordering::Relaxed)), (0, 0));
        }
        assert_eq!((a.0.load(Ordering::Relaxed), b.0.load(Ordering::Relaxed)), (1, 1));
        // The batch is over: the next request is not deferred.
        assert!(!register(&a));
    }

    #[test]
    fn a_batch_left_by_a_panic_still_flushes() {
        let c = Arc::new(Counter(AtomicUsize::new(0)));
        let c2 = c.clone();
        let r = std::panic::catch_unwind(move || {
            let _scope = begin();
            register(&c2);
            panic!("the caller failed mid-batch");
        });
        assert!(r.is_err());
        assert_eq!(c.0.load(Ordering::Relaxed), 1);
        assert!(!register(&c));
    }

    #[test]
    fn flush_now_keeps_the_batch_open() {
        let c = Arc::new(Counter(AtomicUsize::new(0)));
        let _scope = begin();
        register(&c);
        flush_now();
        assert_eq!(c.0.load(Ordering::Relaxed), 1);
        assert!(register(&c));
    }
}
