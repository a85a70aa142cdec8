//! The remote path's counters and latency histograms: per peer on the
//! client, per tenant on the server, updated with relaxed atomics on the
//! request path and read as snapshots; and their Prometheus text
//! exposition, so the queues and the hop that took Melbourne down are
//! visible before they fail.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::sign::metrics::Histogram;
use crate::sign::{EngineMetrics, LatencySummary};

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

/// Prometheus text exposition, built family by family.
pub(crate) struct Exposition {
    out: String,
}

/// Escapes a label value (backslash, quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Exposition {
    pub(crate) fn new() -> Self {
        Exposition { out: String::new() }
    }

    /// A `# HELP`/`# TYPE` header.
    pub(crate) fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample; `labels` as (name, value) pairs.
    pub(crate) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// The request counters and latency summary of each labelled series,
    /// under `prefix` (`keyfence_remote_server_tenant`, ...).
    pub(crate) fn request_stats(&mut self, prefix: &str, label: &str, series: &[(String, &RequestStats)]) {
        let total = format!("{prefix}_requests_total");
        self.family(&total, "counter", "Requests, by how they ended.");
        for (value, s) in series {
            let c = &s.counts;
            for (outcome, n) in [
                ("ok", c.ok),
                ("overloaded", c.overloaded),
                ("timed_out", c.timed_out),
                ("failed", c.failed),
            ] {
                self.sample(&total, &[(label, value), ("outcome", outcome)], n as f64);
            }
        }
        let seconds = format!("{prefix}_latency_seconds");
        self.family(&seconds, "summary", "Latency of successful requests.");
        for (value, s) in series {
            let l = &s.latency;
            for (q, d) in [("0.5", l.p50), ("0.9", l.p90), ("0.99", l.p99), ("0.999", l.p999)] {
                self.sample(&seconds, &[(label, value), ("quantile", q)], d.as_secs_f64());
            }
            self.sample(&format!("{seconds}_sum"), &[(label, value)], s.latency_sum.as_secs_f64());
            self.sample(&format!("{seconds}_count"), &[(label, value)], s.counts.ok as f64);
        }
    }

    /// The engine's per-class counters, queue depths and latency.
    pub(crate) fn engine(&mut self, prefix: &str, m: &EngineMetrics) {
        let gauges: [(&str, &str, fn(&crate::sign::ClassMetrics) -> f64); 4] = [
            ("queue_depth", "Operations waiting in the class's queue.", |c| c.queue_depth as f64),
            ("queue_capacity", "The class's queue capacity.", |c| c.queue_capacity as f64),
            ("in_flight", "Operations running in the class.", |c| c.in_flight as f64),
            ("workers", "The class's worker threads.", |c| c.workers as f64),
        ];
        for (name, help, get) in gauges {
            let n = format!("{prefix}_{name}");
            self.family(&n, "gauge", help);
            for c in &m.classes {
                self.sample(&n, &[("class", c.class.name())], get(c));
            }
        }
        let n = format!("{prefix}_completed_total");
        self.family(&n, "counter", "Operations completed, by class.");
        for c in &m.classes {
            self.sample(&n, &[("class", c.class.name())], c.completed as f64);
        }
        let n = format!("{prefix}_errors_total");
        self.family(&n, "counter", "Operations that failed, by class and kind.");
        for c in &m.classes {
            for (kind, count) in c.errors.iter() {
                self.sample(&n, &[("class", c.class.name()), ("kind", kind.name())], count as f64);
            }
        }
        let n = format!("{prefix}_latency_seconds");
        self.family(&n, "summary", "Service latency, by class.");
        for c in &m.classes {
            for (q, d) in [("0.5", c.latency.p50), ("0.99", c.latency.p99)] {
                self.sample(&n, &[("class", c.class.name()), ("quantile", q)], d.as_secs_f64());
            }
        }
    }

    pub(crate) fn finish(self) -> String {
        self.out
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
        e.request_stats("kf", "peer", &[("a\"b".into(), &s)]);
        let text = e.finish();
        assert!(text.contains("kf_requests_total{peer=\"a\\\"b\",outcome=\"ok\"} 1\n"), "{text}");
        assert!(text.contains("kf_requests_total{peer=\"a\\\"b\",outcome=\"overloaded\"} 1\n"));
        assert!(text.contains("# TYPE kf_latency_seconds summary\n"));
        assert!(text.contains("kf_latency_seconds_count{peer=\"a\\\"b\"} 1\n"));
    }
}
