//! The remote path's counters and latency histograms: per peer on the
//! client, per tenant on the server, updated with relaxed atomics on the
//! request path and read as snapshots; and their Prometheus text
//! exposition, so the queues and the hop that took Melbourne down are
//! visible before they fail.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::sign::exposition::Exposition;
use crate::sign::metrics::Histogram;
use crate::sign::LatencySummary;

/// How requests ended, counted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestCounts {
    /// Requests seen.
    pub requests: u64,
    /// Answered with a result.
    pub ok: u64,
    /// Refused because a queue or limit was full (`overloaded`, a tenant
    /// limit, a connection's in-flight bound).
    pub overloaded: u64,
    /// Ended by their deadline.
    pub timed_out: u64,
    /// Failed otherwise (a key not held, a refused operation, a broken
    /// connection).
    pub failed: u64,
}

/// Counters and latency of one peer or tenant.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestStats {
    /// How requests ended.
    pub counts: RequestCounts,
    /// Latency of successful requests.
    pub latency: LatencySummary,
    /// The sum of those latencies (for a Prometheus summary's `_sum`).
    pub latency_sum: Duration,
}

/// The live counters behind [`RequestStats`].
pub(crate) struct StatsCell {
    requests: AtomicU64,
    ok: AtomicU64,
    overloaded: AtomicU64,
    timed_out: AtomicU64,
    failed: AtomicU64,
    latency: Histogram,
    sum_ns: AtomicU64,
}

/// How one request ended, for [`StatsCell::end`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    Overloaded,
    TimedOut,
    Failed,
}

impl StatsCell {
    pub(crate) fn new() -> Self {
        StatsCell {
            requests: AtomicU64::new(0),
            ok: AtomicU64::new(0),
            overloaded: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            latency: Histogram::new(),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn begin(&self) {
        self.requests.fetch_add(1, Relaxed);
    }

    pub(crate) fn end(&self, outcome: Outcome, took: Duration) {
        match outcome {
            Outcome::Ok => {
                self.ok.fetch_add(1, Relaxed);
                self.latency.record(took);
                self.sum_ns.fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Relaxed);
            }
            Outcome::Overloaded => {
                self.overloaded.fetch_add(1, Relaxed);
            }
            Outcome::TimedOut => {
                self.timed_out.fetch_add(1, Relaxed);
            }
            Outcome::Failed => {
                self.failed.fetch_add(1, Relaxed);
            }
        }
    }

    pub(crate) fn snapshot(&self) -> RequestStats {
        RequestStats {
            counts: RequestCounts {
                requests: self.requests.load(Relaxed),
                ok: self.ok.load(Relaxed),
                overloaded: self.overloaded.load(Relaxed),
                timed_out: self.timed_out.load(Relaxed),
                failed: self.failed.load(Relaxed),
            },
            latency: self.latency.summary(),
            latency_sum: Duration::from_nanos(self.sum_ns.load(Relaxed)),
        }
    }
}

/// The request counters and latency summary of each labelled series,
/// under `prefix` (`keyfence_remote_server_tenant`, ...).
pub(crate) fn request_stats(e: &mut Exposition, prefix: &str, label: &str, series: &[(String, &RequestStats)]) {
    let total = format!("{prefix}_requests_total");
    e.family(&total, "counter", "Requests, by how they ended.");
    for (value, s) in series {
        let c = &s.counts;
        for (outcome, n) in [("ok", c.ok), ("overloaded", c.overloaded), ("timed_out", c.timed_out), ("failed", c.failed)] {
            e.sample(&total, &[(label, value), ("outcome", outcome)], n as f64);
        }
    }
    let seconds = format!("{prefix}_latency_seconds");
    e.family(&seconds, "summary", "Latency of successful requests.");
    for (value, s) in series {
        let l = &s.latency;
        for (q, d) in [("0.5", l.p50), ("0.9", l.p90), ("0.99", l.p99), ("0.999", l.p999)] {
            e.sample(&seconds, &[(label, value), ("quantile", q)], d.as_secs_f64());
        }
        e.sample(&format!("{seconds}_sum"), &[(label, value)], s.latency_sum.as_secs_f64());
        e.sample(&format!("{seconds}_count"), &[(label, value)], s.counts.ok as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_series_are_complete() {
        let cell = StatsCell::new();
        cell.begin();
        cell.end(Outcome::Ok, Duration::from_millis(3));
        cell.begin();
        cell.end(Outcome::Overloaded, Duration::ZERO);
        let s = cell.snapshot();
        assert_eq!((s.counts.requests, s.counts.ok, s.counts.overloaded), (2, 1, 1));
        let mut e = Exposition::new();
        request_stats(&mut e, "kf", "peer", &[("a\"b".into(), &s)]);
        let text = e.finish();
        assert!(text.contains("kf_requests_total{peer=\"a\\\"b\",outcome=\"ok\"} 1\n"), "{text}");
        assert!(text.contains("kf_requests_total{peer=\"a\\\"b\",outcome=\"overloaded\"} 1\n"));
        assert!(text.contains("# TYPE kf_latency_seconds summary\n"));
        assert!(text.contains("kf_latency_seconds_count{peer=\"a\\\"b\"} 1\n"));
    }
}
