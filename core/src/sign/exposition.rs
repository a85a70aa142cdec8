//! Prometheus text exposition, shared by the engine's metrics and the
//! remote path's: families with their `# HELP` and `# TYPE`, escaped
//! labels, the engine's per-class series.

use std::fmt::Write as _;

use super::metrics::{ClassMetrics, EngineMetrics};

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

    pub(crate) fn finish(self) -> String {
        self.out
    }
}
