//! Exponential backoff with full jitter between attempts.

use std::time::Duration;

/// Exponential backoff with full jitter: a uniformly random wait between
/// zero and `min(cap, base * 2^retry)`, so clients that failed together do
/// not retry together.
pub(crate) fn backoff(retry: u32, base: Duration, cap: Duration, random: u64) -> Duration {
    let ceiling = base.saturating_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX)).min(cap);
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(random % (nanos + 1))
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
}
