//! Per-class counters and latency histograms, updated lock-free on the hot
//! path and read as snapshots through [`Engine::metrics`](super::Engine::metrics).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use super::exposition::Exposition;
use super::types::{ErrorKind, OpClass};

/// Sub-buckets per power of two: values are kept to within 1/32 (about 3%).
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Enough buckets for any `u64` nanosecond count.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// A log-linear histogram of nanosecond latencies with atomic buckets (the
/// HdrHistogram layout at 5 significant bits): recording is one relaxed
/// atomic add, so workers never contend on a lock to publish latency.
pub(crate) struct Histogram {
    buckets: Box<[AtomicU64]>,
    max: AtomicU64,
}

impl Histogram {
    pub(crate) fn new() -> Self {
        Histogram { buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(), max: AtomicU64::new(0) }
    }

    fn index(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let msb = 63 - v.leading_zeros();
        let shift = msb - SUB_BITS;
        (((shift + 1) as u64 * SUB) + ((v >> shift) & (SUB - 1))) as usize
    }

    /// The middle of bucket `i`, the value reported for it.
    fn value(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB {
            return i;
        }
        let shift = i / SUB - 1;
        let low = (SUB + i % SUB) << shift;
        low + ((1u64 << shift) >> 1)
    }

    pub(crate) fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[Self::index(ns)].fetch_add(1, Relaxed);
        self.max.fetch_max(ns, Relaxed);
    }

    pub(crate) fn summary(&self) -> LatencySummary {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        let max = self.max.load(Relaxed);
        let q = |p: f64| -> Duration {
            if total == 0 {
                return Duration::ZERO;
            }
            let rank = ((p * total as f64).ceil() as u64).clamp(1, total);
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    // A bucket's midpoint can exceed the largest value seen.
                    return Duration::from_nanos(Self::value(i).min(max));
                }
            }
            Duration::from_nanos(max)
        };
        LatencySummary { count: total, p50: q(0.50), p90: q(0.90), p99: q(0.99), p999: q(0.999), max: Duration::from_nanos(max) }
    }
}

/// Latency percentiles of successfully completed operations, from
/// submission to completion (queueing included), to within about 3%.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencySummary {
    /// Operations recorded.
    pub count: u64,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// 99.9th percentile.
    pub p999: Duration,
    /// Largest.
    pub max: Duration,
}

/// The live counters of one executor class.
pub(crate) struct ClassStats {
    pub(crate) class: OpClass,
    pub(crate) workers: usize,
    pub(crate) submitted: AtomicU64,
    /// Operations pushed and not yet taken by a worker.
    pub(crate) queued: AtomicUsize,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) completed: AtomicU64,
    pub(crate) errors: [AtomicU64; ErrorKind::ALL.len()],
    pub(crate) latency: Histogram,
    /// Moving average of how long the backend takes (nanoseconds), for
    /// [`SignFuture::wait`](super::SignFuture::wait)'s wake-up timing.
    service_ns: AtomicU64,
}

impl ClassStats {
    pub(crate) fn new(class: OpClass, workers: usize) -> Self {
        ClassStats {
            class,
            workers,
            submitted: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            completed: AtomicU64::new(0),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
            latency: Histogram::new(),
            service_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn error(&self, kind: ErrorKind) {
        self.errors[kind.index()].fetch_add(1, Relaxed);
    }

    /// Folds one service time into the moving average (weight 1/8). Racing
    /// updates may lose a sample, which an estimate can afford.
    pub(crate) fn record_service(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let old = self.service_ns.load(Relaxed);
        let new = if old == 0 { ns } else { old - old / 8 + ns / 8 };
        self.service_ns.store(new, Relaxed);
    }

    /// The typical service time, if any operation has completed.
    pub(crate) fn service_estimate(&self) -> Option<Duration> {
        match self.service_ns.load(Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// Whether the executor has spare workers: at most half of them busy or
    /// about to be, counting the caller's own operation (queued or running).
    pub(crate) fn mostly_idle(&self) -> bool {
        self.queued.load(Relaxed) + self.in_flight.load(Relaxed) <= (self.workers / 2).max(1)
    }
}

/// Errors counted by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ErrorCounts {
    counts: [u64; ErrorKind::ALL.len()],
}

impl ErrorCounts {
    /// The count for `kind`.
    pub fn get(&self, kind: ErrorKind) -> u64 {
        self.counts[kind.index()]
    }

    /// All errors.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// `(kind, count)` pairs in [`ErrorKind::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (ErrorKind, u64)> + '_ {
        ErrorKind::ALL.into_iter().map(|k| (k, self.get(k)))
    }
}

/// A snapshot of one executor class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassMetrics {
    /// The class.
    pub class: OpClass,
    /// Worker threads.
    pub workers: usize,
    /// Queue capacity (beyond it, submissions are answered `Overloaded`).
    pub queue_capacity: usize,
    /// Operations waiting in the queue now (including ones that timed out or
    /// were cancelled there and are not yet skipped by a worker).
    pub queue_depth: usize,
    /// Operations being performed now.
    pub in_flight: usize,
    /// Operations accepted since the engine started.
    pub submitted: u64,
    /// Operations completed successfully.
    pub completed: u64,
    /// Operations that ended in an error, by kind (`overloaded` counts
    /// rejected submissions).
    pub errors: ErrorCounts,
    /// Latency of successful operations.
    pub latency: LatencySummary,
}

impl ClassMetrics {
    pub(crate) fn snapshot(stats: &ClassStats, workers: usize, queue_capacity: usize, queue_depth: usize) -> Self {
        ClassMetrics {
            class: stats.class,
            workers,
            queue_capacity,
            queue_depth,
            in_flight: stats.in_flight.load(Relaxed),
            submitted: stats.submitted.load(Relaxed),
            completed: stats.completed.load(Relaxed),
            errors: ErrorCounts { counts: std::array::from_fn(|i| stats.errors[i].load(Relaxed)) },
            latency: stats.latency.summary(),
        }
    }
}

/// Figures from outside the engine's executors that are reported with its
/// metrics: a remote backend's per-peer counters, say. Attach one with
/// [`Engine::attach_metrics`](super::Engine::attach_metrics).
pub trait MetricsSource: Send + Sync + 'static {
    /// A short name (`remote`).
    fn name(&self) -> String;
    /// The source's figures now, in Prometheus text exposition format.
    fn prometheus(&self) -> String;
}

/// One attached source's figures, as of the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceMetrics {
    /// The source's name.
    pub name: String,
    /// Its figures in Prometheus text exposition format.
    pub prometheus: String,
}

/// A snapshot of every class of an engine, and of the sources attached to
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineMetrics {
    /// One entry per class, in [`OpClass::ALL`] order.
    pub classes: Vec<ClassMetrics>,
    /// The attached sources' figures (a remote backend's per-peer
    /// counters and latency), in the order they were attached.
    pub sources: Vec<SourceMetrics>,
}

impl EngineMetrics {
    /// The snapshot of `class`.
    pub fn class(&self, class: OpClass) -> &ClassMetrics {
        &self.classes[class.index()]
    }

    /// Everything in Prometheus text exposition format: the classes'
    /// queue depths, counters and latency (`keyfence_engine_*`), then each
    /// attached source's figures.
    pub fn prometheus(&self) -> String {
        let mut e = Exposition::new();
        e.engine("keyfence_engine", self);
        let mut out = e.finish();
        for s in &self.sources {
            out.push_str(&s.prometheus);
        }
        out
    }
}

impl Exposition {
    /// The engine's per-class counters, queue depths and latency.
    pub(crate) fn engine(&mut self, prefix: &str, m: &EngineMetrics) {
        type Gauge = (&'static str, &'static str, fn(&ClassMetrics) -> f64);
        let gauges: [Gauge; 4] = [
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_values_are_within_three_percent() {
        for v in [0u64, 1, 31, 32, 33, 63, 64, 65, 1000, 12_345, 999_999, 1 << 40, u64::MAX / 3] {
            let back = Histogram::value(Histogram::index(v));
            let err = (back as f64 - v as f64).abs() / (v.max(1) as f64);
            assert!(err <= 1.0 / 32.0, "{v} -> {back}");
        }
        assert!(Histogram::index(u64::MAX) < BUCKETS);
    }

    #[test]
    fn percentiles_of_a_known_distribution() {
        let h = Histogram::new();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let s = h.summary();
        assert_eq!(s.count, 1000);
        let near = |d: Duration, us: f64| ((d.as_secs_f64() * 1e6) - us).abs() <= us * 0.035;
        assert!(near(s.p50, 500.0), "{:?}", s.p50);
        assert!(near(s.p90, 900.0), "{:?}", s.p90);
        assert!(near(s.p99, 990.0), "{:?}", s.p99);
        assert!(near(s.p999, 999.0), "{:?}", s.p999);
        assert_eq!(s.max, Duration::from_micros(1000));
        assert_eq!(Histogram::new().summary(), LatencySummary::default());
    }
}
