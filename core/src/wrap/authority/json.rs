//! The authority's reports as JSON, one object each, for
//! `keyfence authority ... --json` and the bindings (the C ABI hands the
//! text over; Python and Node read it): written here once, so that every
//! language names a field alike. Written by hand: the core has no JSON
//! library in its default build, and these are flat records.

use std::fmt::Write as _;

use super::{Revocation, SkipReason};

/// A JSON string.
pub(super) fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON string, or `null`.
pub(super) fn json_opt_str(out: &mut String, s: Option<&str>) {
    match s {
        Some(s) => json_str(out, s),
        None => out.push_str("null"),
    }
}

/// A JSON number (every number here is finite).
pub(super) fn json_num(out: &mut String, x: f64) {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        let _ = write!(out, "{}", x as i64);
    } else {
        let _ = write!(out, "{x}");
    }
}

impl SkipReason {
    /// The reason's stable name in a report: `malformed`, `not_signed`,
    /// `retired_version`, `does_not_open`, `misnamed`.
    pub fn kind(&self) -> &'static str {
        match self {
            SkipReason::Malformed(_) => "malformed",
            SkipReason::NotSigned(_) => "not_signed",
            SkipReason::RetiredVersion(_) => "retired_version",
            SkipReason::DoesNotOpen(_) => "does_not_open",
            SkipReason::Misnamed(_) => "misnamed",
        }
    }
}

impl Revocation {
    /// The report as one JSON object: `{"id", "already", "resumed",
    /// "rekeyed", "rewrapped", "retired", "compacted", "rekeyed_after_ms",
    /// "skipped": [{"name", "reason", "message"}]}`, as
    /// `keyfence authority revoke --json` prints it. `skipped` lists the
    /// store's envelopes that open nowhere now (`reason` is
    /// [`SkipReason::kind`], `message` says it in words).
    pub fn to_json(&self) -> String {
        let mut o = String::with_capacity(192 + 96 * self.skipped.len());
        o.push_str("{\"id\":");
        json_str(&mut o, &self.id);
        let _ = write!(
            o,
            ",\"already\":{},\"resumed\":{},\"rekeyed\":{},\"rewrapped\":{},\"retired\":{},\"compacted\":{},\"rekeyed_after_ms\":",
            self.already, self.resumed, self.rekeyed, self.rewrapped, self.retired, self.compacted
        );
        json_num(&mut o, self.rekeyed_after.as_secs_f64() * 1000.0);
        o.push_str(",\"skipped\":[");
        for (i, s) in self.skipped.iter().enumerate() {
            o.push_str(if i == 0 { "{\"name\":" } else { ",{\"name\":" });
            json_str(&mut o, &s.name);
            o.push_str(",\"reason\":");
            json_str(&mut o, s.reason.kind());
            o.push_str(",\"message\":");
            json_str(&mut o, &s.reason.to_string());
            o.push('}');
        }
        o.push_str("]}");
        o
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Skipped;
    use super::*;

    #[test]
    fn a_revocation_reads_back_as_json_with_its_skipped_envelopes() {
        let r = Revocation {
            id: "m1".into(),
            resumed: true,
            already: false,
            rekeyed: 2,
            rewrapped: 5,
            skipped: vec![
                Skipped { name: "envelopes/ab".into(), reason: SkipReason::RetiredVersion(3) },
                Skipped { name: "envelopes/\"q\"".into(), reason: SkipReason::Malformed("bad\nmagic".into()) },
            ],
            retired: 1,
            compacted: true,
            rekeyed_after: Duration::from_micros(12_500),
        };
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["id"], "m1");
        assert_eq!((v["already"].as_bool(), v["resumed"].as_bool(), v["compacted"].as_bool()), (Some(false), Some(true), Some(true)));
        assert_eq!((v["rekeyed"].as_u64(), v["rewrapped"].as_u64(), v["retired"].as_u64()), (Some(2), Some(5), Some(1)));
        assert_eq!(v["rekeyed_after_ms"].as_f64(), Some(12.5));
        assert_eq!(v["skipped"][0]["reason"], "retired_version");
        assert_eq!(v["skipped"][0]["message"], "sealed to policy key version 3, which was retired");
        assert_eq!(v["skipped"][1]["name"], "envelopes/\"q\"");
        assert_eq!(v["skipped"][1]["message"], "not an envelope: bad\nmagic");
        let none = Revocation { skipped: Vec::new(), ..r };
        let v: serde_json::Value = serde_json::from_str(&none.to_json()).unwrap();
        assert_eq!(v["skipped"].as_array().map(Vec::len), Some(0));
    }
}
