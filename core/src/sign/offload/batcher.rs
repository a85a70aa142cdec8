//! Batching requests for the device, and bounding what is in flight there.

use crate::spawn::QuietSpawn;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::device::{Device, DeviceRequest};
use super::stats::Counters;
use crate::sign::types::{Resource, SignError};

/// Room at the device: at most `capacity` requests outstanding.
pub(crate) struct Slots {
    state: Mutex<SlotState>,
    freed: Condvar,
    capacity: usize,
}

struct SlotState {
    in_flight: usize,
    peak: usize,
}

impl Slots {
    pub(crate) fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Slots { state: Mutex::new(SlotState { in_flight: 0, peak: 0 }), freed: Condvar::new(), capacity })
    }

    fn state(&self) -> MutexGuard<'_, SlotState> {
        // Every update under this lock is a single counter change, so a
        // poisoned lock still holds consistent numbers.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a slot, waiting for one until `deadline`; `None` if there was
    /// no room by then. The slot is given back when the guard drops.
    pub(crate) fn acquire(self: &Arc<Self>, deadline: Instant) -> Option<SlotGuard> {
        let mut state = self.state();
        loop {
            if state.in_flight < self.capacity {
                state.in_flight += 1;
                state.peak = state.peak.max(state.in_flight);
                return Some(SlotGuard(self.clone()));
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            state = self.freed.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Requests outstanding now, and the most there have ever been.
    pub(crate) fn in_flight(&self) -> (usize, usize) {
        let state = self.state();
        (state.in_flight, state.peak)
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

/// One slot at the device, given back on drop.
pub(crate) struct SlotGuard(Arc<Slots>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.0.state().in_flight -= 1;
        self.0.freed.notify_one();
    }
}

/// Gathers requests from the executor threads into batches for the device:
/// a batch goes out when it holds `max_batch` requests or `window` after
/// its first request arrived, whichever comes first.
///
/// One thread; it exits when the [`Batcher`] is dropped and the requests
/// already pushed are submitted.
pub(crate) struct Batcher {
    tx: Sender<DeviceRequest>,
}

impl Batcher {
    pub(crate) fn start(device: Arc<dyn Device>, max_batch: usize, window: Duration, counters: Arc<Counters>) -> Result<Self, SignError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        std::thread::Builder::new()
            .name(format!("keyfence-offload-{}", device.name()))
            .spawn_quiet(move || run(&rx, &*device, max_batch.max(1), window, &counters))
            .map_err(|e| SignError::io(Resource::Thread, format!("cannot start the offload batching thread: {e}")))?;
        Ok(Batcher { tx })
    }

    /// Queues `req` for the next batch. Should the batching thread be gone,
    /// the request is dropped, which completes it with a device failure.
    pub(crate) fn push(&self, req: DeviceRequest) {
        let _ = self.tx.send(req);
    }
}

fn run(rx: &Receiver<DeviceRequest>, device: &dyn Device, max_batch: usize, window: Duration, counters: &Counters) {
    while let Ok(first) = rx.recv() {
        let mut batch = Vec::with_capacity(max_batch);
        batch.push(first);
        let until = Instant::now() + window;
        while batch.len() < max_batch {
            match rx.recv_deadline(until) {
                Ok(req) => batch.push(req),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        counters.batches.fetch_add(1, Relaxed);
        counters.batched.fetch_add(batch.len() as u64, Relaxed);
        // A panicking device drops the batch while unwinding, which fails
        // each request; the thread lives on for the next batch.
        let _ = catch_unwind(AssertUnwindSafe(|| device.submit(batch)));
    }
}
