//! The deadline thread: ends operations whose time is up, whether they are
//! still queued or already running, so the caller hears `TimedOut` on time
//! even when every worker of a class is stuck behind slow operations.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::op_record::OpRecord;
use super::threads::Joined;
use super::types::{Resource, SignError};

struct Entry(Arc<OpRecord>);

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Reversed, so the max-heap yields the earliest deadline.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.0.deadline, other.0.id).cmp(&(self.0.deadline, self.0.id))
    }
}

/// Most operations end long before their deadline and are left in the heap
/// (removing from the middle of a binary heap is O(n)); the heap is pruned
/// of ended ones whenever it doubles past its size after the last pruning,
/// which bounds it to about twice the live operations plus this floor.
const PRUNE_FLOOR: usize = 1024;

struct State {
    heap: BinaryHeap<Entry>,
    prune_at: usize,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The handle the engine keeps; dropping it stops the thread and joins it.
pub(crate) struct Deadlines {
    shared: Arc<Shared>,
    thread: Joined,
}

impl Deadlines {
    pub(crate) fn start() -> Result<Self, SignError> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State { heap: BinaryHeap::new(), prune_at: PRUNE_FLOOR }),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let mut thread = Joined::new();
        thread
            .spawn("keyfence-deadlines".into(), move || run(&s))
            .map_err(|e| SignError::io(Resource::Thread, format!("cannot start the deadline thread: {e}")))?;
        Ok(Deadlines { shared, thread })
    }

    /// Watches `record`'s deadline. One short lock; the thread is woken only
    /// when this deadline is the new earliest (with one timeout for every
    /// operation, only when the heap was empty).
    pub(crate) fn watch(&self, record: Arc<OpRecord>) {
        let mut st = self.shared.lock();
        let earliest = st.heap.peek().is_none_or(|top| record.deadline < top.0.deadline);
        st.heap.push(Entry(record));
        if st.heap.len() >= st.prune_at {
            st.heap.retain(|e| !e.0.is_done());
            st.prune_at = (2 * st.heap.len()).max(PRUNE_FLOOR);
        }
        drop(st);
        if earliest {
            self.shared.wake.notify_one();
        }
    }

    /// Operations watched now (ended ones included until pruned).
    #[cfg(test)]
    pub(crate) fn watched(&self) -> usize {
        self.shared.lock().heap.len()
    }
}

impl Drop for Deadlines {
    fn drop(&mut self) {
        {
            // Under the lock, so the thread is either waiting (and woken)
            // or will see the flag before it waits.
            let _st = self.shared.lock();
            self.shared.stop.store(true, AtomicOrdering::Release);
        }
        self.shared.wake.notify_one();
        self.thread.join();
    }
}

fn run(shared: &Shared) {
    let mut expired = Vec::new();
    let mut st = shared.lock();
    loop {
        if shared.stop.load(AtomicOrdering::Acquire) {
            return;
        }
        let now = Instant::now();
        while st.heap.peek().is_some_and(|top| top.0.deadline <= now) {
            if let Some(Entry(rec)) = st.heap.pop() {
                expired.push(rec);
            }
        }
        if !expired.is_empty() {
            // Deliver outside the lock: callbacks may submit again.
            drop(st);
            for rec in expired.drain(..) {
                let timeout = rec.timeout;
                rec.finish(Err(SignError::TimedOut { timeout }));
            }
            st = shared.lock();
            continue;
        }
        st = match st.heap.peek().map(|top| top.0.deadline) {
            None => shared.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
            Some(at) => shared.wake.wait_timeout(st, at.saturating_duration_since(now)).unwrap_or_else(|e| e.into_inner()).0,
        };
    }
}
