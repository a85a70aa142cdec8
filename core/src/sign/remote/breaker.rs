//! A per-peer circuit breaker: after `failures` consecutive failures
//! (connect failures, lost connections, attempts that timed out) the peer
//! is skipped for `open_for`; then one probe request is let through, and
//! its result closes the breaker or opens it again. Retrying a dead host
//! on every request is how a sick region gets hammered. `overloaded`
//! replies do not count: the peer is alive and protecting itself.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// When a breaker opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the breaker. Default 5.
    pub failures: u32,
    /// How long an open breaker skips the peer before a probe. Default 1 s.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig { failures: 5, open_for: Duration::from_secs(1) }
    }
}

/// A breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests go to the peer.
    Closed,
    /// The peer is skipped.
    Open,
    /// One probe is in flight or may be sent.
    HalfOpen,
}

impl BreakerState {
    /// `closed`, `open` or `half_open`.
    pub fn name(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

#[derive(Default)]
struct State {
    consecutive: u32,
    open_until: Option<Instant>,
    probing: bool,
    opens: u64,
}

pub(crate) struct Breaker {
    config: BreakerConfig,
    state: Mutex<State>,
}

/// Permission to send one request; say how it went with
/// [`Breaker::success`] or [`Breaker::failure`], or drop it (neutral).
pub(crate) struct Permit {
    probe: bool,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Breaker { config, state: Mutex::new(State::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a request may go to the peer now.
    pub(crate) fn allow(&self, now: Instant) -> Option<Permit> {
        let mut s = self.lock();
        match s.open_until {
            None => Some(Permit { probe: false }),
            Some(until) if now < until => None,
            Some(_) if s.probing => None,
            Some(_) => {
                s.probing = true;
                Some(Permit { probe: true })
            }
        }
    }

    pub(crate) fn success(&self, permit: Permit) {
        let mut s = self.lock();
        s.consecutive = 0;
        if permit.probe || s.open_until.is_some() {
            s.open_until = None;
            s.probing = false;
        }
    }

    pub(crate) fn failure(&self, permit: Permit, now: Instant) {
        let mut s = self.lock();
        if permit.probe {
            s.probing = false;
            s.open_until = Some(now + self.config.open_for);
            s.opens += 1;
            return;
        }
        s.consecutive += 1;
        if s.open_until.is_none() && s.consecutive >= self.config.failures {
            s.open_until = Some(now + self.config.open_for);
            s.opens += 1;
        }
    }

    /// A permit whose request ended neither way (overloaded, not held):
    /// a probe's slot is given back.
    pub(crate) fn neutral(&self, permit: Permit) {
        if permit.probe {
            self.lock().probing = false;
        }
    }

    pub(crate) fn state(&self, now: Instant) -> BreakerState {
        let s = self.lock();
        match s.open_until {
            None => BreakerState::Closed,
            Some(until) if now < until && !s.probing => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        }
    }

    /// How many times it has opened.
    pub(crate) fn opens(&self) -> u64 {
        self.lock().opens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_then_probes_once() {
        let b = Breaker::new(BreakerConfig { failures: 3, open_for: Duration::from_millis(50) });
        let t0 = Instant::now();
        for _ in 0..2 {
            let p = b.allow(t0).unwrap();
            b.failure(p, t0);
        }
        let p = b.allow(t0).unwrap();
        b.success(p);
        for _ in 0..3 {
            let p = b.allow(t0).unwrap();
            b.failure(p, t0);
        }
        assert_eq!(b.state(t0), BreakerState::Open);
        assert!(b.allow(t0 + Duration::from_millis(10)).is_none());
        let later = t0 + Duration::from_millis(60);
        let probe = b.allow(later).expect("one probe after open_for");
        assert!(b.allow(later).is_none(), "only one probe at a time");
        b.failure(probe, later);
        assert_eq!(b.state(later), BreakerState::Open);
        assert_eq!(b.opens(), 2);
        let much_later = later + Duration::from_millis(60);
        let probe = b.allow(much_later).unwrap();
        b.success(probe);
        assert_eq!(b.state(much_later), BreakerState::Closed);
        assert!(b.allow(much_later).is_some());
    }

    #[test]
    fn a_neutral_probe_gives_its_slot_back() {
        let b = Breaker::new(BreakerConfig { failures: 1, open_for: Duration::ZERO });
        let t = Instant::now();
        let p = b.allow(t).unwrap();
        b.failure(p, t);
        let probe = b.allow(t).unwrap();
        b.neutral(probe);
        assert!(b.allow(t).is_some());
    }
}
