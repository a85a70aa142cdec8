//! Exponential backoff between attempts: the one doubling pause every retry
//! loop of the crate waits with (the authority starting a change over or
//! waiting for a fence, the etcd store's calls and watch, the remote
//! signer's retries). Each caller keeps its own bounds; what they share is
//! how a pause grows and how it is drawn.

use std::time::Duration;

use rand_core::{OsRng, RngCore};

/// How a pause is drawn below its ceiling.
// Each variant's user may be compiled out (`etcd`, `sign`): not dead code.
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Jitter {
    /// The ceiling itself: one client retrying a cluster, where waiting in
    /// step with others is no concern.
    None,
    /// Uniformly between half the ceiling and all of it (in microseconds):
    /// writers that collided once do not collide again in step, and none
    /// retries at once.
    UpperHalf,
    /// Uniformly between zero and the ceiling (in nanoseconds), so clients
    /// that failed together do not retry together.
    Full,
}

impl Jitter {
    /// A pause below `ceiling` drawn with `random`.
    fn draw(self, ceiling: Duration, random: u64) -> Duration {
        match self {
            Jitter::None => ceiling,
            Jitter::UpperHalf => {
                let half = ceiling.as_micros() as u64 / 2;
                Duration::from_micros(half + random % (half + 1))
            }
            Jitter::Full => {
                let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
                if nanos == 0 {
                    return Duration::ZERO;
                }
                Duration::from_nanos(random % (nanos + 1))
            }
        }
    }
}

/// The ceiling of the pause before retry `retry` (0 for the first):
/// `first` doubled `retry` times, at most `cap`.
fn ceiling(retry: u32, first: Duration, cap: Duration) -> Duration {
    first.saturating_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX)).min(cap)
}

/// The pauses of one retry loop: the first is `first`, each after doubles
/// it up to `cap`, each drawn as its [`Jitter`] says.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    first: Duration,
    cap: Duration,
    jitter: Jitter,
    /// Pauses taken since the start (or the last [`Backoff::reset`]).
    retry: u32,
}

impl Backoff {
    /// Pauses from `first`, doubling up to `cap`, drawn as `jitter` says.
    pub(crate) const fn new(first: Duration, cap: Duration, jitter: Jitter) -> Self {
        Backoff { first, cap, jitter, retry: 0 }
    }

    /// The pause to wait before the next attempt; the one after is twice
    /// as long (up to the cap).
    pub(crate) fn pause(&mut self) -> Duration {
        // No jitter, no draw: a retry loop need not read the OS's random
        // source for nothing.
        let random = if self.jitter == Jitter::None { 0 } else { OsRng.next_u64() };
        let pause = self.jitter.draw(ceiling(self.retry, self.first, self.cap), random);
        self.retry = self.retry.saturating_add(1);
        pause
    }

    /// Back to the first pause: what failed works again.
    // Its only user is the etcd store's watch.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) fn reset(&mut self) {
        self.retry = 0;
    }
}

/// Exponential backoff with full jitter, for a caller that counts its own
/// retries: a uniformly random wait between zero and
/// `min(cap, base * 2^retry)`, so clients that failed together do not
/// retry together.
#[cfg_attr(not(feature = "sign"), allow(dead_code))]
pub(crate) fn backoff(retry: u32, base: Duration, cap: Duration, random: u64) -> Duration {
    Jitter::Full.draw(ceiling(retry, base, cap), random)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded_and_jittered() {
        let base = Duration::from_millis(10);
        let cap = Duration::from_millis(100);
        assert_eq!(backoff(0, base, cap, u64::MAX), Duration::from_nanos(u64::MAX % 10_000_001));
        for retry in 0..40 {
            for r in [0, 1, 12345, u64::MAX] {
                assert!(backoff(retry, base, cap, r) <= cap);
            }
        }
        assert_eq!(backoff(3, base, cap, 0), Duration::ZERO);
        let seen: std::collections::HashSet<_> = (0..100u64).map(|r| backoff(2, base, cap, r * 7919)).collect();
        assert!(seen.len() > 50, "full jitter spreads the waits");
    }

    #[test]
    fn without_jitter_pauses_double_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(20), Duration::from_millis(500), Jitter::None);
        let ms: Vec<u128> = (0..8).map(|_| b.pause().as_millis()).collect();
        assert_eq!(ms, [20, 40, 80, 160, 320, 500, 500, 500]);
        for _ in 0..100 {
            assert_eq!(b.pause(), Duration::from_millis(500), "no overflow however many retries");
        }
        b.reset();
        assert_eq!(b.pause(), Duration::from_millis(20));
    }

    #[test]
    fn upper_half_jitter_stays_between_half_the_ceiling_and_all_of_it() {
        let (first, cap) = (Duration::from_millis(20), Duration::from_secs(1));
        for retry in 0..12 {
            let top = ceiling(retry, first, cap);
            assert_eq!(top, (first * 2u32.pow(retry.min(10))).min(cap));
            for r in [0, 1, 7919, u64::MAX] {
                let p = Jitter::UpperHalf.draw(top, r);
                assert!(p >= top / 2 && p <= top, "{p:?} of {top:?}");
            }
        }
        assert_eq!(Jitter::UpperHalf.draw(Duration::from_millis(20), 0), Duration::from_millis(10));
        let mut b = Backoff::new(first, cap, Jitter::UpperHalf);
        let pauses: Vec<Duration> = (0..10).map(|_| b.pause()).collect();
        assert!(pauses.iter().all(|p| *p <= cap) && pauses[9] >= cap / 2, "{pauses:?}");
    }
}
