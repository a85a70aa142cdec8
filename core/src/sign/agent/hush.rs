//! Log lines an attacker can cause, said at most once per [`EVERY`]: 300
//! refused connections were 300 warnings, which buried the one that
//! mattered and cost the agent time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one line per kind this often.
pub(crate) const EVERY: Duration = Duration::from_secs(10);

/// One kind of line.
pub(crate) struct Hush {
    last: Mutex<Option<Instant>>,
    quiet: AtomicU64,
}

impl Hush {
    pub(crate) fn new() -> Self {
        Hush { last: Mutex::new(None), quiet: AtomicU64::new(0) }
    }

    /// Whether to say the line now: `Some(n)`, with `n` the lines of this
    /// kind left unsaid since the last one, or `None` (counted).
    pub(crate) fn say(&self) -> Option<u64> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if last.is_some_and(|l| now.duration_since(l) < EVERY) {
            self.quiet.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.quiet.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_line_then_a_count() {
        let h = super::Hush::new();
        assert_eq!(h.say(), Some(0));
        for _ in 0..5 {
            assert_eq!(h.say(), None);
        }
        *h.last.lock().unwrap() = Some(std::time::Instant::now() - super::EVERY);
        assert_eq!(h.say(), Some(5));
    }
}
