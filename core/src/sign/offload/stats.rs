//! The offload backend's counters.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of an [`OffloadBackend`](super::OffloadBackend)'s counters,
/// from [`OffloadBackend::stats`](super::OffloadBackend::stats). Every
/// counter counts since the backend started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OffloadStats {
    /// Operations handed to the device (asynchronously or synchronously).
    pub submitted: u64,
    /// Operations the device completed, with a result or with the
    /// operation's own error ([`DeviceError::Rejected`](super::DeviceError::Rejected)).
    pub completed: u64,
    /// Operations the device failed ([`DeviceError::is_device_fault`](super::DeviceError::is_device_fault)).
    pub device_errors: u64,
    /// Device RSA results that failed the public-key check (a faulty
    /// device: such a result would reveal the key); each is also counted in
    /// `device_errors` and answered as [`OnDeviceError`](super::OnDeviceError)
    /// says, in software by default. Never passed to the caller.
    pub mismatches: u64,
    /// Operations that expired at the device (their deadline passed first).
    pub expired: u64,
    /// Device failures answered by performing the operation in software.
    pub fallbacks: u64,
    /// Device failures answered with an error
    /// ([`OnDeviceError::Fail`](super::OnDeviceError::Fail)).
    pub failed: u64,
    /// Operations routed to software (by the routing, because there is no
    /// device, because the device does not do them, or because the key is
    /// not in this process).
    pub software: u64,
    /// Operations that found no room at the device before their deadline.
    pub no_room: u64,
    /// Batches handed to the device.
    pub batches: u64,
    /// Operations in those batches.
    pub batched: u64,
    /// Operations outstanding at the device now.
    pub in_flight: u64,
    /// The most operations ever outstanding at the device at once.
    pub peak_in_flight: u64,
}

impl OffloadStats {
    /// Operations per batch on average; 0 before the first batch.
    pub fn mean_batch_size(&self) -> f64 {
        if self.batches == 0 {
            0.0
        } else {
            self.batched as f64 / self.batches as f64
        }
    }
}

/// The live counters behind [`OffloadStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) submitted: AtomicU64,
    pub(crate) completed: AtomicU64,
    pub(crate) device_errors: AtomicU64,
    pub(crate) mismatches: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) fallbacks: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) software: AtomicU64,
    pub(crate) no_room: AtomicU64,
    pub(crate) batches: AtomicU64,
    pub(crate) batched: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn snapshot(&self, in_flight: u64, peak_in_flight: u64) -> OffloadStats {
        OffloadStats {
            submitted: self.submitted.load(Relaxed),
            completed: self.completed.load(Relaxed),
            device_errors: self.device_errors.load(Relaxed),
            mismatches: self.mismatches.load(Relaxed),
            expired: self.expired.load(Relaxed),
            fallbacks: self.fallbacks.load(Relaxed),
            failed: self.failed.load(Relaxed),
            software: self.software.load(Relaxed),
            no_room: self.no_room.load(Relaxed),
            batches: self.batches.load(Relaxed),
            batched: self.batched.load(Relaxed),
            in_flight,
            peak_in_flight,
        }
    }
}
