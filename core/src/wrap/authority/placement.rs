//! `where`: which machines of the inventory satisfy a policy, by group
//! (a data center, a region), and the remote signing load the policy puts
//! on the groups that satisfy it. The keyless outage in the seeds is what
//! happens when nobody asks: an EU-only zone drew the world's handshakes
//! onto a handful of EU servers.
//!
//! A policy is evaluated on each machine's attributes with the policy
//! language's own semantics ([`CanonicalPolicy::eval`]: negation holds only
//! where the label is present with another value, repeated labels as
//! anywhere else), never by decrypting. A group that cannot open the key
//! sends its handshakes to the nearest group that can, by the key
//! server's own rule ([`nearest`]): smallest latency, ties to the group
//! whose value sorts first.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use super::inventory::InventoryMachine;
use super::json::{json_num, json_opt_str, json_str};
use super::Authority;
use crate::wrap::error::{Result, WrapError};
use crate::wrap::machine::nearest;
use crate::wrap::policy::CanonicalPolicy;

/// Handshakes per second by group: what `--traffic` reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Traffic {
    rps: BTreeMap<String, f64>,
}

/// Latencies between groups in milliseconds: what `--latency` reads. A
/// pair given one way is taken to hold both ways unless the other way is
/// given too.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Latencies {
    ms: HashMap<(String, String), f64>,
}

/// The fields of a CSV line, trimmed; `None` for a blank or `#` line.
fn fields(line: &str) -> Option<Vec<&str>> {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') {
        return None;
    }
    Some(t.split(',').map(str::trim).collect())
}

fn bad(file: &str, line: usize, field: &'static str, reason: impl Into<String>) -> WrapError {
    WrapError::InvalidLine { file: file.to_owned(), line, field, reason: reason.into() }
}

/// A finite number, not negative.
fn number(file: &str, line: usize, field: &'static str, text: &str) -> Result<f64> {
    match text.parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        Ok(_) => Err(bad(file, line, field, format!("{text:?} is not a finite number of at least 0"))),
        Err(_) => Err(bad(file, line, field, format!("{text:?} is not a number"))),
    }
}

impl Traffic {
    /// Reads `group,handshakes per second` lines (`file` names it in
    /// errors). Blank and `#` lines are skipped, and so is a first line
    /// `group,...` (a header).
    ///
    /// # Errors
    /// [`WrapError::InvalidLine`] naming the file, line and field: a line
    /// without two fields, an empty group, a rate that is not a finite
    /// number of at least 0, a group given twice.
    pub fn parse_csv(file: &str, text: &str) -> Result<Self> {
        let mut t = Traffic::default();
        let mut first = true;
        for (i, line) in text.lines().enumerate() {
            let Some(f) = fields(line) else { continue };
            let header = std::mem::replace(&mut first, false) && f.first() == Some(&"group");
            if header {
                continue;
            }
            let n = i + 1;
            if f.len() != 2 {
                return Err(bad(file, n, "line", format!("{} field(s); a line is `group,handshakes per second`", f.len())));
            }
            if f[0].is_empty() {
                return Err(bad(file, n, "group", "empty"));
            }
            let rps = number(file, n, "rps", f[1])?;
            if t.rps.insert(f[0].to_owned(), rps).is_some() {
                return Err(bad(file, n, "group", format!("{} is given twice", f[0])));
            }
        }
        Ok(t)
    }

    /// From `(group, handshakes per second)` pairs.
    ///
    /// # Errors
    /// [`WrapError::InvalidQuery`] for a rate that is not a finite number
    /// of at least 0, or a group given twice.
    pub fn from_pairs<G: Into<String>>(pairs: impl IntoIterator<Item = (G, f64)>) -> Result<Self> {
        let mut t = Traffic::default();
        for (g, rps) in pairs {
            let g = g.into();
            if !(rps.is_finite() && rps >= 0.0) {
                return Err(WrapError::InvalidQuery(format!("traffic of {g}: {rps} is not a finite number of at least 0")));
            }
            if t.rps.insert(g.clone(), rps).is_some() {
                return Err(WrapError::InvalidQuery(format!("traffic of {g} is given twice")));
            }
        }
        Ok(t)
    }

    /// The rate of `group` (0 for a group not given).
    pub fn get(&self, group: &str) -> f64 {
        self.rps.get(group).copied().unwrap_or(0.0)
    }
}

impl Latencies {
    /// Reads `from group,to group,milliseconds` lines (`file` names it in
    /// errors). Blank and `#` lines are skipped, and so is a first line
    /// `from,...` (a header).
    ///
    /// # Errors
    /// [`WrapError::InvalidLine`] naming the file, line and field.
    pub fn parse_csv(file: &str, text: &str) -> Result<Self> {
        let mut l = Latencies::default();
        let mut first = true;
        for (i, line) in text.lines().enumerate() {
            let Some(f) = fields(line) else { continue };
            let header = std::mem::replace(&mut first, false) && f.first() == Some(&"from");
            if header {
                continue;
            }
            let n = i + 1;
            if f.len() != 3 {
                return Err(bad(file, n, "line", format!("{} field(s); a line is `from group,to group,milliseconds`", f.len())));
            }
            for (k, name) in [(0, "from"), (1, "to")] {
                if f[k].is_empty() {
                    return Err(bad(file, n, name, "empty"));
                }
            }
            let ms = number(file, n, "milliseconds", f[2])?;
            if l.ms.insert((f[0].to_owned(), f[1].to_owned()), ms).is_some() {
                return Err(bad(file, n, "to", format!("{} to {} is given twice", f[0], f[1])));
            }
        }
        Ok(l)
    }

    /// From `(from, to, milliseconds)` triples.
    ///
    /// # Errors
    /// [`WrapError::InvalidQuery`] for a latency that is not a finite
    /// number of at least 0, or a pair given twice.
    pub fn from_triples<G: Into<String>>(triples: impl IntoIterator<Item = (G, G, f64)>) -> Result<Self> {
        let mut l = Latencies::default();
        for (a, b, ms) in triples {
            let (a, b) = (a.into(), b.into());
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(WrapError::InvalidQuery(format!("latency {a} to {b}: {ms} is not a finite number of at least 0")));
            }
            if l.ms.insert((a.clone(), b.clone()), ms).is_some() {
                return Err(WrapError::InvalidQuery(format!("latency {a} to {b} is given twice")));
            }
        }
        Ok(l)
    }

    /// The latency from `a` to `b`: as given, else as given from `b` to
    /// `a`, else `None` (unknown: the farthest, as an unmeasured peer is
    /// to the key server).
    pub fn between(&self, a: &str, b: &str) -> Option<Duration> {
        let key = |x: &str, y: &str| (x.to_owned(), y.to_owned());
        self.ms.get(&key(a, b)).or_else(|| self.ms.get(&key(b, a))).map(|ms| Duration::from_secs_f64(ms / 1000.0))
    }
}

/// What `where` is asked: the policy, and optionally how to group the
/// fleet and the traffic to project.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WhereQuery {
    /// The policy.
    pub policy: CanonicalPolicy,
    /// The label whose values are the groups (`dc`, `region`); `None`: no
    /// groups, totals only.
    pub by: Option<String>,
    /// Without latencies, the label that makes groups near each other:
    /// a group sends to a satisfying group with its value of it.
    pub near: Option<String>,
    /// Handshakes per second by group (needs `by`).
    pub traffic: Option<Traffic>,
    /// Latencies between groups (needs `by`).
    pub latency: Option<Latencies>,
    /// A satisfying group receiving more than this many times its own
    /// traffic is warned about (default 4).
    pub warn_ratio: f64,
    /// Whether the report lists the matching machines' ids.
    pub list_machines: bool,
}

impl WhereQuery {
    /// Totals only, for `policy`; set the fields for more.
    pub fn new(policy: CanonicalPolicy) -> Self {
        WhereQuery { policy, by: None, near: None, traffic: None, latency: None, warn_ratio: 4.0, list_machines: false }
    }
}

/// One group of a [`WhereReport`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WhereGroup {
    /// Its value of the `by` label.
    pub value: String,
    /// Its live machines.
    pub total: usize,
    /// Those that satisfy the policy.
    pub matching: usize,
    /// Its value of the `near` label (the most common among its machines,
    /// ties to the one that sorts first).
    pub near: Option<String>,
    /// Its own handshakes per second (with traffic).
    pub own_rps: Option<f64>,
    /// Handshakes per second other groups send it (with traffic; 0 for a
    /// group that does not satisfy the policy).
    pub received_rps: Option<f64>,
    /// Where its handshakes go, for a group that does not satisfy it and
    /// has a satisfying group to send to (with traffic).
    pub sends_to: Option<String>,
    /// The groups that send it their handshakes (with traffic).
    pub senders: usize,
    /// Why it would be overloaded: it receives more than the warning
    /// ratio times its own traffic.
    pub warning: Option<String>,
}

impl WhereGroup {
    /// Whether a machine of it satisfies the policy.
    pub fn satisfies(&self) -> bool {
        self.matching > 0
    }

    /// Its own plus received load (with traffic).
    pub fn load_rps(&self) -> Option<f64> {
        Some(self.own_rps? + self.received_rps?)
    }
}

/// What `where` answers.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct WhereReport {
    /// The policy, canonical.
    pub policy: String,
    /// The label grouped by.
    pub by: Option<String>,
    /// Live machines in the inventory.
    pub total: usize,
    /// Those that satisfy the policy.
    pub matching: usize,
    /// Revoked machines, left out of every count.
    pub revoked: usize,
    /// Live machines without the `by` label (in the totals, in no group).
    pub ungrouped: usize,
    /// Those of them that satisfy the policy.
    pub ungrouped_matching: usize,
    /// The groups, sorted by value: every value of `by` among the live
    /// machines, and every group of the traffic.
    pub groups: Vec<WhereGroup>,
    /// All handshakes per second (with traffic).
    pub total_rps: Option<f64>,
    /// Those signed in another group than their own (with traffic).
    pub remote_rps: Option<f64>,
    /// Those with no satisfying group to go to (with traffic).
    pub unserved_rps: Option<f64>,
    /// `remote_rps / total_rps` (0 for no traffic; with traffic).
    pub remote_share: Option<f64>,
    /// The matching machines' ids, sorted (when asked for).
    pub matching_machines: Vec<String>,
}

impl WhereReport {
    /// The report as one JSON object: `{"total", "matching",
    /// "remote_share", "groups": [{"value", "total", "matching", ...}]}`
    /// as `keyfence authority where --json` prints it (the rate fields
    /// only with traffic), for scripts and the bindings alike.
    pub fn to_json(&self) -> String {
        let mut o = String::with_capacity(256 + 160 * self.groups.len());
        o.push_str("{\"policy\":");
        json_str(&mut o, &self.policy);
        o.push_str(",\"by\":");
        json_opt_str(&mut o, self.by.as_deref());
        let _ = write!(
            o,
            ",\"total\":{},\"matching\":{},\"revoked\":{},\"ungrouped\":{{\"total\":{},\"matching\":{}}}",
            self.total, self.matching, self.revoked, self.ungrouped, self.ungrouped_matching
        );
        o.push_str(",\"remote_share\":");
        match self.remote_share {
            Some(x) => json_num(&mut o, x),
            None => o.push_str("null"),
        }
        for (name, v) in [("total_rps", self.total_rps), ("remote_rps", self.remote_rps), ("unserved_rps", self.unserved_rps)] {
            if let Some(x) = v {
                let _ = write!(o, ",\"{name}\":");
                json_num(&mut o, x);
            }
        }
        o.push_str(",\"groups\":[");
        for (i, g) in self.groups.iter().enumerate() {
            if i > 0 {
                o.push(',');
            }
            o.push_str("{\"value\":");
            json_str(&mut o, &g.value);
            let _ = write!(o, ",\"total\":{},\"matching\":{},\"satisfies\":{}", g.total, g.matching, g.satisfies());
            o.push_str(",\"near\":");
            json_opt_str(&mut o, g.near.as_deref());
            if let (Some(own), Some(received)) = (g.own_rps, g.received_rps) {
                o.push_str(",\"own_rps\":");
                json_num(&mut o, own);
                o.push_str(",\"received_rps\":");
                json_num(&mut o, received);
                let _ = write!(o, ",\"senders\":{}", g.senders);
                o.push_str(",\"sends_to\":");
                json_opt_str(&mut o, g.sends_to.as_deref());
            }
            o.push_str(",\"warning\":");
            json_opt_str(&mut o, g.warning.as_deref());
            o.push('}');
        }
        o.push(']');
        if !self.matching_machines.is_empty() {
            o.push_str(",\"machines\":[");
            for (i, id) in self.matching_machines.iter().enumerate() {
                if i > 0 {
                    o.push(',');
                }
                json_str(&mut o, id);
            }
            o.push(']');
        }
        o.push('}');
        o
    }
}

/// A group while it is counted.
#[derive(Default)]
struct Count {
    total: usize,
    matching: usize,
    near: BTreeMap<String, usize>,
}

/// Answers `q` over `machines` (the inventory, revoked ones marked).
///
/// # Errors
/// [`WrapError::InvalidQuery`] for traffic or latencies without `by`, or
/// a warning ratio that is not a positive finite number.
pub(super) fn evaluate(machines: &[InventoryMachine], q: &WhereQuery) -> Result<WhereReport> {
    if (q.traffic.is_some() || q.latency.is_some() || q.near.is_some()) && q.by.is_none() {
        return Err(WrapError::InvalidQuery(
            "traffic, latencies and `near` are by group: say which label groups the fleet (`by`, e.g. dc)".into(),
        ));
    }
    if !(q.warn_ratio.is_finite() && q.warn_ratio > 0.0) {
        return Err(WrapError::InvalidQuery(format!("the warning ratio {} is not a positive number", q.warn_ratio)));
    }
    let mut r = WhereReport {
        policy: q.policy.to_string(),
        by: q.by.clone(),
        total: 0,
        matching: 0,
        revoked: 0,
        ungrouped: 0,
        ungrouped_matching: 0,
        groups: Vec::new(),
        total_rps: None,
        remote_rps: None,
        unserved_rps: None,
        remote_share: None,
        matching_machines: Vec::new(),
    };
    let mut counts: BTreeMap<&str, Count> = BTreeMap::new();
    for m in machines {
        if m.revoked {
            r.revoked += 1;
            continue;
        }
        let ok = q.policy.eval(&m.attributes);
        r.total += 1;
        if ok {
            r.matching += 1;
            if q.list_machines {
                r.matching_machines.push(m.id.clone());
            }
        }
        let Some(by) = q.by.as_deref() else { continue };
        match m.attributes.get(by) {
            Some(value) => {
                let c = counts.entry(value).or_default();
                c.total += 1;
                c.matching += usize::from(ok);
                if let Some(n) = q.near.as_deref().and_then(|l| m.attributes.get(l)) {
                    *c.near.entry(n.to_owned()).or_default() += 1;
                }
            }
            None => {
                r.ungrouped += 1;
                r.ungrouped_matching += usize::from(ok);
            }
        }
    }
    r.matching_machines.sort();
    if let Some(t) = &q.traffic {
        for g in t.rps.keys() {
            counts.entry(g.as_str()).or_default();
        }
    }
    r.groups = counts
        .into_iter()
        .map(|(value, c)| WhereGroup {
            value: value.to_owned(),
            total: c.total,
            matching: c.matching,
            // Most machines first, then the value that sorts first.
            near: c.near.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(v, _)| v.clone()),
            own_rps: None,
            received_rps: None,
            sends_to: None,
            senders: 0,
            warning: None,
        })
        .collect();
    if let Some(traffic) = &q.traffic {
        project(&mut r, traffic, q);
    }
    Ok(r)
}

/// Sends each group's handshakes where the key server would, and says
/// what every satisfying group receives.
fn project(r: &mut WhereReport, traffic: &Traffic, q: &WhereQuery) {
    let satisfying: Vec<usize> = (0..r.groups.len()).filter(|&i| r.groups[i].satisfies()).collect();
    let latency = |from: usize, to: usize| -> Duration {
        let (a, b) = (&r.groups[from], &r.groups[to]);
        match (&q.latency, q.near.as_ref()) {
            (Some(l), _) => l.between(&a.value, &b.value).unwrap_or(Duration::MAX),
            (None, Some(_)) if a.near.is_some() && a.near == b.near => Duration::ZERO,
            _ => Duration::MAX,
        }
    };
    let mut received = vec![0.0; r.groups.len()];
    let mut senders = vec![0usize; r.groups.len()];
    let mut sends_to = vec![None; r.groups.len()];
    let (mut total, mut remote, mut unserved) = (0.0, 0.0, 0.0);
    for (i, group) in r.groups.iter().enumerate() {
        let own = traffic.get(&group.value);
        total += own;
        if group.satisfies() {
            continue;
        }
        // `satisfying` is in sorted order: a tie goes to the value that
        // sorts first, as the key server's goes to the peer listed first.
        match nearest(satisfying.iter().map(|&s| (s, latency(i, s)))) {
            Some(s) => {
                received[s] += own;
                senders[s] += usize::from(own > 0.0);
                sends_to[i] = Some(s);
                remote += own;
            }
            None => unserved += own,
        }
    }
    let names: Vec<String> = r.groups.iter().map(|g| g.value.clone()).collect();
    for (i, g) in r.groups.iter_mut().enumerate() {
        let own = traffic.get(&g.value);
        g.own_rps = Some(own);
        g.received_rps = Some(received[i]);
        g.senders = senders[i];
        g.sends_to = sends_to[i].map(|s| names[s].clone());
        if received[i] > q.warn_ratio * own {
            g.warning = Some(if own == 0.0 {
                format!("receives {} handshakes/s from {} group(s) and has no traffic of its own", fmt_rps(received[i]), senders[i])
            } else {
                format!(
                    "receives {} handshakes/s from {} group(s): {:.1} times its own {}, over the warning ratio {}",
                    fmt_rps(received[i]),
                    senders[i],
                    received[i] / own,
                    fmt_rps(own),
                    q.warn_ratio
                )
            });
        }
    }
    r.total_rps = Some(total);
    r.remote_rps = Some(remote);
    r.unserved_rps = Some(unserved);
    r.remote_share = Some(if total > 0.0 { remote / total } else { 0.0 });
}

/// A rate for people: whole numbers without decimals.
pub(crate) fn fmt_rps(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

impl Authority {
    /// Where a key wrapped under `q.policy` can be used: the live machines
    /// of the inventory that satisfy it, by group, with the remote load
    /// its traffic would put on the satisfying groups
    /// ([`WhereQuery`]). Reads only; evaluates attributes, never decrypts.
    ///
    /// # Errors
    /// As [`Authority::inventory`]; [`WrapError::InvalidQuery`].
    pub fn where_usable(&self, q: &WhereQuery) -> Result<WhereReport> {
        evaluate(&self.inventory()?, q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_errors_name_file_line_and_field() {
        for (text, line, field) in [
            ("group,rps\nfra1,10\nams1", 3, "line"),
            ("fra1,ten", 1, "rps"),
            ("fra1,-1", 1, "rps"),
            ("fra1,1\nfra1,2", 2, "group"),
            (",5", 1, "group"),
        ] {
            match Traffic::parse_csv("t.csv", text) {
                Err(WrapError::InvalidLine { file, line: l, field: f, .. }) => {
                    assert_eq!((file.as_str(), l, f), ("t.csv", line, field), "{text}")
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        for (text, line, field) in
            [("from,to,ms\na,b,1\na,b,2", 3, "to"), ("a,b", 1, "line"), ("a,b,NaN", 1, "milliseconds"), (",b,1", 1, "from")]
        {
            match Latencies::parse_csv("l.csv", text) {
                Err(WrapError::InvalidLine { file, line: l, field: f, .. }) => {
                    assert_eq!((file.as_str(), l, f), ("l.csv", line, field), "{text}")
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let l = Latencies::parse_csv("l", "# ms\na,b,2.5\n").unwrap();
        assert_eq!(l.between("b", "a"), Some(Duration::from_micros(2500)));
        assert_eq!(l.between("a", "c"), None);
    }
}
