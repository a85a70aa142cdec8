//! Prometheus text exposition, shared by the engine's metrics and the
//! remote path's: families with their `# HELP` and `# TYPE`, and escaped
//! labels. It knows no metric; each module that has some writes its own
//! (the engine's per-class series are in `metrics`).

use std::fmt::Write as _;

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

    pub(crate) fn finish(self) -> String {
        self.out
    }
}
