//! The retry budget: retries (and failovers) may add at most a fraction of
//! the requests of the last few seconds, plus a small floor per second, so
//! when a region is sick the retries stop instead of multiplying the load
//! (the Keygen seed's clients retried in lockstep and kept it down).
//! Counts are kept per second in a ring with running totals, so a check is
//! constant work under one short lock.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How many retries the budget allows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryBudgetConfig {
    /// Retries allowed per request in the window. Default 0.2.
    pub ratio: f64,
    /// Retries allowed per second whatever the traffic, so that a quiet
    /// client can still fail over. Default 10.
    pub min_per_second: u32,
    /// The window the ratio applies to, in whole seconds (1 to 60).
    /// Default 10 s.
    pub window: Duration,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        RetryBudgetConfig { ratio: 0.2, min_per_second: 10, window: Duration::from_secs(10) }
    }
}

#[derive(Clone, Copy, Default)]
struct Second {
    requests: u64,
    retries: u64,
}

struct Ring {
    seconds: Vec<Second>,
    /// The second (since `origin`) the current slot belongs to.
    last: u64,
    requests: u64,
    retries: u64,
}

pub(crate) struct RetryBudget {
    config: RetryBudgetConfig,
    origin: Instant,
    ring: Mutex<Ring>,
}

impl RetryBudget {
    pub(crate) fn new(config: RetryBudgetConfig) -> Self {
        let n = config.window.as_secs().clamp(1, 60) as usize;
        RetryBudget {
            config,
            origin: Instant::now(),
            ring: Mutex::new(Ring { seconds: vec![Second::default(); n], last: 0, requests: 0, retries: 0 }),
        }
    }

    /// The ring and the current second's slot, after clearing the slots
    /// of every second that has passed since the last call (whose counts
    /// leave the running totals): at most one pass over the ring per call,
    /// and none while the second is unchanged.
    fn current(&self, now: Instant) -> (MutexGuard<'_, Ring>, usize) {
        let sec = now.saturating_duration_since(self.origin).as_secs();
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let n = ring.seconds.len() as u64;
        if sec > ring.last {
            let from = ring.last.saturating_add(1).max(sec.saturating_sub(n - 1));
            for s in from..=sec {
                let i = (s % n) as usize;
                let old = ring.seconds[i];
                ring.requests -= old.requests;
                ring.retries -= old.retries;
                ring.seconds[i] = Second::default();
            }
            ring.last = sec;
        }
        (ring, (sec % n) as usize)
    }

    /// Counts a request (not a retry).
    pub(crate) fn request(&self, now: Instant) {
        let (mut ring, i) = self.current(now);
        ring.seconds[i].requests += 1;
        ring.requests += 1;
    }

    /// Takes one retry from the budget, or says there is none left.
    pub(crate) fn try_retry(&self, now: Instant) -> bool {
        let (mut ring, i) = self.current(now);
        let window = ring.seconds.len() as f64;
        let allowed = self.config.ratio * ring.requests as f64 + f64::from(self.config.min_per_second) * window;
        if (ring.retries as f64) < allowed {
            ring.seconds[i].retries += 1;
            ring.retries += 1;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_a_fraction_of_requests_plus_a_floor() {
        let b = RetryBudget::new(RetryBudgetConfig { ratio: 0.1, min_per_second: 0, window: Duration::from_secs(2) });
        let t = Instant::now();
        assert!(!b.try_retry(t), "no requests, no floor: no retries");
        for _ in 0..100 {
            b.request(t);
        }
        let granted = (0..50).filter(|_| b.try_retry(t)).count();
        assert_eq!(granted, 10);
        // Two seconds later the window has moved past those requests.
        let later = t + Duration::from_secs(3);
        assert!(!b.try_retry(later));
        let b = RetryBudget::new(RetryBudgetConfig { ratio: 0.0, min_per_second: 3, window: Duration::from_secs(1) });
        assert_eq!((0..10).filter(|_| b.try_retry(t)).count(), 3);
    }
}
