//! The authority's inventory and `where` (issue 61): `issue` records each
//! machine, `revoke` marks it, an import adds a fleet issued before, no
//! servers' copy holds it; `where` answers with the policy language's
//! semantics, checked here against a second evaluator written in this
//! file over random policies (negation over groups, repeated labels,
//! absent labels) and random fleets; the traffic projection against a
//! second projection over random latencies with ties; and a master
//! rotation that would strand machines is refused (issue 62). On the
//! memory store, a directory and a three-member etcd cluster.

mod common;
mod etcd_support;
mod every_store;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use every_store::{on_every_store, Stores};
use keyfence::policy::Attributes;
use keyfence::wrap::{
    export_for_servers, nearest_capable, parse_inventory, Authority, CanonicalPolicy, Latencies, MemoryStore, Peer, Store, Traffic,
    WhereQuery, WrapError, MACHINE_LABEL,
};
use keyfence::ErrorCode;

on_every_store!(
    issue_records_revoke_marks_and_no_copy_holds_it,
    import_adds_fleets_issued_before,
    a_rotation_that_strands_machines_is_refused,
    issues_at_once_lose_no_record,
    random_policies_agree_with_a_second_evaluator,
);

fn query(policy: &str) -> WhereQuery {
    WhereQuery::new(CanonicalPolicy::parse(policy).unwrap())
}

fn issue_records_revoke_marks_and_no_copy_holds_it(stores: &Stores) {
    let store = stores();
    let mut a = Authority::init(store.clone()).unwrap();
    assert!(a.inventory().unwrap().is_empty());
    let fra = a.issue(&"dc=fra1,region=EU".parse().unwrap()).unwrap();
    let lhr = a.issue(&"dc=lhr1,region=EU,country=GB".parse().unwrap()).unwrap();
    let inv = a.inventory().unwrap();
    assert_eq!(inv.len(), 2);
    let rec = inv.iter().find(|m| Some(m.id.as_str()) == fra.id()).unwrap();
    assert_eq!(&rec.attributes, fra.attributes(), "the attributes the key holds, machine id included");
    assert_eq!(rec.attributes.get(MACHINE_LABEL), fra.id());
    assert_eq!(rec.generations, fra.generations());
    assert!(!rec.imported && !rec.revoked && rec.issued > 1_600_000_000);
    // Re-issuing one id replaces its record, never adds one.
    let again: Attributes = format!("dc=fra2,region=EU,machine={}", fra.id().unwrap()).parse().unwrap();
    a.issue(&again).unwrap();
    let inv = a.inventory().unwrap();
    assert_eq!(inv.len(), 2);
    assert_eq!(inv.iter().find(|m| Some(m.id.as_str()) == fra.id()).unwrap().attributes.get("dc"), Some("fra2"));

    a.revoke(lhr.id().unwrap()).unwrap();
    let inv = a.inventory().unwrap();
    let rec = inv.iter().find(|m| Some(m.id.as_str()) == lhr.id()).unwrap();
    assert!(rec.revoked && rec.revoked_at.is_some(), "{rec:?}");
    // Revoked machines are in no count of `where`.
    let r = a.where_usable(&query("region: EU")).unwrap();
    assert_eq!((r.total, r.matching, r.revoked), (1, 1, 1));

    // The authority's part: in the store, never in a servers' copy.
    assert!(!store.list("authority/inventory/").unwrap().is_empty());
    let copy: Arc<dyn Store> = Arc::new(MemoryStore::default());
    export_for_servers(&*store, &*copy).unwrap();
    assert!(copy.list("authority/").unwrap().is_empty());
    assert!(copy.get("public/generations").unwrap().is_some());
}

fn import_adds_fleets_issued_before(stores: &Stores) {
    let a = Authority::init(stores()).unwrap();
    let issued = a.issue(&"dc=ams1,region=EU".parse().unwrap()).unwrap();
    let id = |i: usize| format!("{:032x}", 0xabc0_0000_u64 + i as u64);
    let mut text = String::from("# the fleet issued before the inventory\n");
    for i in 0..300 {
        text.push_str(&format!("{}\tdc=dc{},region={}\n", id(i), i % 7, if i % 3 == 0 { "EU" } else { "NA" }));
    }
    // The machine issued already: its attributes are taken, its record kept.
    text.push_str(&format!("{}\tdc=ams1,region=EU,tier=gold\n", issued.id().unwrap()));
    let machines = parse_inventory("fleet.tsv", &text).unwrap();
    let done = a.import_inventory(&machines).unwrap();
    assert_eq!((done.added, done.updated, done.unchanged), (300, 1, 0));
    let again = a.import_inventory(&machines).unwrap();
    assert_eq!((again.added, again.updated, again.unchanged), (0, 0, 301));
    let inv = a.inventory().unwrap();
    assert_eq!(inv.len(), 301);
    let one = inv.iter().find(|m| m.id == id(5)).unwrap();
    assert!(one.imported && one.generations == vec![1]);
    assert_eq!(one.attributes.get(MACHINE_LABEL), Some(id(5).as_str()));
    let kept = inv.iter().find(|m| Some(m.id.as_str()) == issued.id()).unwrap();
    assert!(!kept.imported && kept.attributes.get("tier") == Some("gold"));

    let mut q = query("region: EU");
    q.by = Some("dc".into());
    let r = a.where_usable(&q).unwrap();
    assert_eq!((r.total, r.matching), (301, 101));
    let g0 = r.groups.iter().find(|g| g.value == "dc0").unwrap();
    // dc0 is i = 0, 7, 14, ...: EU when i is a multiple of 21 too.
    assert_eq!((g0.total, g0.matching), ((0..300).filter(|i| i % 7 == 0).count(), (0..300).filter(|i| i % 21 == 0).count()));
    assert_eq!(r.groups.iter().map(|g| g.total).sum::<usize>(), 301);
}

fn a_rotation_that_strands_machines_is_refused(stores: &Stores) {
    let mut a = Authority::init(stores()).unwrap();
    let m1 = a.issue(&"dc=fra1".parse().unwrap()).unwrap();
    let m2 = a.issue(&"dc=fra2".parse().unwrap()).unwrap();
    let gone = a.issue(&"dc=fra3".parse().unwrap()).unwrap();
    a.revoke(gone.id().unwrap()).unwrap();
    // 1 -> decrypt-only: nothing retired, nobody stranded.
    assert_eq!(a.stranding().unwrap().generation, None);
    a.rotate_master_unless_stranding().unwrap();
    let s = a.stranding().unwrap();
    assert_eq!(s.generation, Some(1));
    let mut want = vec![m1.id().unwrap().to_owned(), m2.id().unwrap().to_owned()];
    want.sort();
    assert_eq!(s.machines, want, "the revoked machine is not counted");
    match a.rotate_master_unless_stranding() {
        Err(e @ WrapError::WouldStrand { generation: 1, count: 2, .. }) => {
            assert_eq!(e.code(), ErrorCode::InvalidArgument);
            assert!(e.to_string().contains("--force"), "{e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(a.status().unwrap().generations.len(), 2, "nothing rotated");
    // One machine issued again holds generation 2: one left to strand.
    a.issue(&format!("dc=fra1,machine={}", m1.id().unwrap()).parse().unwrap()).unwrap();
    assert_eq!(a.stranding().unwrap().machines, vec![m2.id().unwrap().to_owned()]);
    assert!(matches!(a.rotate_master_unless_stranding(), Err(WrapError::WouldStrand { count: 1, .. })));
    // Forced, it rotates (the command line names the machines first).
    let r = a.rotate_master().unwrap();
    assert_eq!(r.retired, Some(1));
}

fn issues_at_once_lose_no_record(stores: &Stores) {
    let store = stores();
    let a = Authority::init(store.clone()).unwrap();
    let ids: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let store = store.clone();
                s.spawn(move || {
                    // A handle of its own, as another process would have.
                    let a = Authority::open(store).unwrap();
                    (0..6)
                        .map(|i| a.issue(&format!("dc=d{t},n=n{i}").parse().unwrap()).unwrap().id().unwrap().to_owned())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let held: BTreeSet<String> = a.inventory().unwrap().into_iter().map(|m| m.id).collect();
    assert_eq!(held, ids.into_iter().collect::<BTreeSet<_>>());
}

// ---- A second evaluator, and random policies and fleets for it. ----

/// A policy as this test builds it: its own tree, its own text.
#[derive(Debug, Clone)]
enum P {
    Leaf(&'static str, String),
    Not(Box<P>),
    And(Box<P>, Box<P>),
    Or(Box<P>, Box<P>),
}

/// The language's semantics as docs/policy-language.md states them,
/// written again: `not` is pushed to the leaves (De Morgan), and a
/// negated leaf `not L: v` holds only when the attributes have `L` with
/// another value.
fn holds(p: &P, attrs: &BTreeMap<&str, String>, negated: bool) -> bool {
    match p {
        P::Leaf(l, v) => match attrs.get(l) {
            None => false,
            Some(have) => (have == v) != negated,
        },
        P::Not(x) => holds(x, attrs, !negated),
        P::And(a, b) if !negated => holds(a, attrs, false) && holds(b, attrs, false),
        P::And(a, b) => holds(a, attrs, true) || holds(b, attrs, true),
        P::Or(a, b) if !negated => holds(a, attrs, false) || holds(b, attrs, false),
        P::Or(a, b) => holds(a, attrs, true) && holds(b, attrs, true),
    }
}

/// Plain Boolean logic (`not` as complement): not the language's. Used
/// only to show that the random cases reach where the two part.
fn boolean(p: &P, attrs: &BTreeMap<&str, String>) -> bool {
    match p {
        P::Leaf(l, v) => attrs.get(l) == Some(v),
        P::Not(x) => !boolean(x, attrs),
        P::And(a, b) => boolean(a, attrs) && boolean(b, attrs),
        P::Or(a, b) => boolean(a, attrs) || boolean(b, attrs),
    }
}

fn text(p: &P) -> String {
    match p {
        P::Leaf(l, v) => format!("{l}: {v}"),
        P::Not(x) => format!("not ({})", text(x)),
        P::And(a, b) => format!("({}) and ({})", text(a), text(b)),
        P::Or(a, b) => format!("({}) or ({})", text(a), text(b)),
    }
}

/// xorshift64*: a fixed sequence per seed, so a failure is repeatable.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

const LABELS: [(&str, &[&str]); 4] = [
    ("region", &["EU", "NA", "APAC"]),
    ("country", &["DE", "GB", "US", "JP", "FR"]),
    ("tier", &["gold", "silver"]),
    ("dc", &["d0", "d1", "d2", "d3", "d4", "d5"]),
];

fn random_policy(rng: &mut Rng, depth: usize, ids: &[String]) -> P {
    if depth == 0 || rng.below(3) == 0 {
        // Now and then a machine by id, as revocation's negations name them.
        if !ids.is_empty() && rng.below(12) == 0 {
            return P::Leaf(MACHINE_LABEL, ids[rng.below(ids.len())].clone());
        }
        let (l, vs) = LABELS[rng.below(LABELS.len())];
        return P::Leaf(l, vs[rng.below(vs.len())].to_owned());
    }
    match rng.below(5) {
        0 => P::Not(Box::new(random_policy(rng, depth - 1, ids))),
        1 | 2 => P::And(Box::new(random_policy(rng, depth - 1, ids)), Box::new(random_policy(rng, depth - 1, ids))),
        _ => P::Or(Box::new(random_policy(rng, depth - 1, ids)), Box::new(random_policy(rng, depth - 1, ids))),
    }
}

/// A fleet of `n` machines, each label present or not at random (so that
/// negations meet absent labels), `dc` absent from a few (ungrouped).
fn random_fleet(rng: &mut Rng, n: usize, seed: u64) -> Vec<(String, BTreeMap<&'static str, String>)> {
    (0..n)
        .map(|i| {
            let mut attrs = BTreeMap::new();
            for (l, vs) in LABELS {
                if rng.below(5) != 0 {
                    attrs.insert(l, vs[rng.below(vs.len())].to_owned());
                }
            }
            let id = format!("{seed:016x}{i:016x}");
            attrs.insert(MACHINE_LABEL, id.clone());
            (id, attrs)
        })
        .collect()
}

fn random_policies_agree_with_a_second_evaluator(stores: &Stores) {
    let store = stores();
    let a = Authority::init(store.clone()).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let fleet = random_fleet(&mut rng, 400, 1);
    let file: String = fleet
        .iter()
        .map(|(id, attrs)| {
            let list: Vec<String> = attrs.iter().filter(|(l, _)| **l != MACHINE_LABEL).map(|(l, v)| format!("{l}={v}")).collect();
            format!("{id}\t{}\n", list.join(","))
        })
        .collect();
    // A machine with no attribute but its id is a line with nothing after the tab:
    // not something `issue --attrs` takes, so it is left out.
    let file: String = file.lines().filter(|l| !l.ends_with('\t')).map(|l| format!("{l}\n")).collect();
    let fleet: Vec<_> = fleet.into_iter().filter(|(_, attrs)| attrs.len() > 1).collect();
    a.import_inventory(&parse_inventory("fleet.tsv", &file).unwrap()).unwrap();
    let ids: Vec<String> = fleet.iter().map(|(id, _)| id.clone()).collect();
    let (mut parted, mut some, mut none) = (0, 0, 0);
    for round in 0..300 {
        let p = random_policy(&mut rng, 1 + round % 5, &ids);
        let src = text(&p);
        let mut q = WhereQuery::new(CanonicalPolicy::parse(&src).unwrap_or_else(|e| panic!("{src}: {e}")));
        q.by = Some("dc".into());
        q.list_machines = true;
        let r = a.where_usable(&q).unwrap();
        let want: BTreeSet<&str> = fleet.iter().filter(|(_, attrs)| holds(&p, attrs, false)).map(|(id, _)| id.as_str()).collect();
        let got: BTreeSet<&str> = r.matching_machines.iter().map(String::as_str).collect();
        assert_eq!(got, want, "round {round}: `{src}` (canonical `{}`)", r.policy);
        assert_eq!(r.matching, want.len());
        for g in &r.groups {
            let in_group = fleet.iter().filter(|(_, attrs)| attrs.get("dc") == Some(&g.value));
            let (total, matching) = in_group.fold((0, 0), |(t, m), (_, attrs)| (t + 1, m + usize::from(holds(&p, attrs, false))));
            assert_eq!((g.total, g.matching), (total, matching), "round {round}: `{src}`, group {}", g.value);
        }
        let ungrouped = fleet.iter().filter(|(_, attrs)| !attrs.contains_key("dc")).count();
        assert_eq!(r.ungrouped, ungrouped);
        parted += usize::from(fleet.iter().any(|(_, attrs)| boolean(&p, attrs) != holds(&p, attrs, false)));
        some += usize::from(r.matching > 0 && r.matching < fleet.len());
        none += usize::from(r.matching == 0);
    }
    // The cases are not all trivial: many policies match part of the
    // fleet, some none, and many reach a machine where the language's
    // negation is not Boolean complement (an absent label).
    assert!(parted > 50 && some > 100 && none > 5, "parted {parted}, some {some}, none {none}");
}

// ---- The projection, against a second one. ----

/// Where each group's handshakes go, computed again: a group with a
/// matching machine keeps its own; another sends to the satisfying group
/// with the smallest latency (unknown: farthest), ties to the value that
/// sorts first.
fn project_again(
    groups: &BTreeMap<String, bool>, traffic: &BTreeMap<String, f64>, lat: &BTreeMap<(String, String), f64>,
) -> (BTreeMap<String, f64>, BTreeMap<String, Option<String>>) {
    let mut received: BTreeMap<String, f64> = groups.keys().map(|g| (g.clone(), 0.0)).collect();
    let mut dest = BTreeMap::new();
    for (g, sat) in groups {
        if *sat {
            continue;
        }
        let mut best: Option<(f64, &String)> = None;
        for (s, _) in groups.iter().filter(|(_, ok)| **ok) {
            let l = lat.get(&(g.clone(), s.clone())).or_else(|| lat.get(&(s.clone(), g.clone()))).copied().unwrap_or(f64::INFINITY);
            // Strictly smaller only: the first in sorted order wins a tie.
            if best.is_none_or(|(b, _)| l < b) {
                best = Some((l, s));
            }
        }
        if let Some((_, s)) = best {
            *received.get_mut(s).unwrap() += traffic.get(g).copied().unwrap_or(0.0);
        }
        dest.insert(g.clone(), best.map(|(_, s)| s.clone()));
    }
    (received, dest)
}

#[test]
fn random_projections_agree_with_a_second_projection() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let a = Authority::init(store).unwrap();
    let mut rng = Rng(42);
    let n_groups = 30;
    let mut lines = String::new();
    let mut region_of = BTreeMap::new();
    for g in 0..n_groups {
        let region = ["EU", "NA", "APAC"][rng.below(3)];
        region_of.insert(format!("g{g:02}"), region);
        for m in 0..3 {
            lines.push_str(&format!("{:016x}{:016x}\tdc=g{g:02},region={region},tier={}\n", g, m, ["gold", "silver"][rng.below(2)]));
        }
    }
    a.import_inventory(&parse_inventory("f", &lines).unwrap()).unwrap();
    for round in 0..60 {
        let policy =
            ["region: EU", "tier: gold and region: NA", "not region: APAC", "region: EU and tier: gold", "region: MARS"][round % 5];
        // Latencies in few distinct values, so that ties are common; some pairs missing.
        let mut lat = BTreeMap::new();
        let mut csv = String::from("from,to,ms\n");
        for i in 0..n_groups {
            for j in 0..n_groups {
                if i != j && rng.below(4) != 0 {
                    let ms = (1 + rng.below(6)) as f64 * 10.0;
                    let (x, y) = (format!("g{i:02}"), format!("g{j:02}"));
                    csv.push_str(&format!("{x},{y},{ms}\n"));
                    lat.insert((x, y), ms);
                }
            }
        }
        let mut traffic = BTreeMap::new();
        let mut tcsv = String::new();
        for g in 0..n_groups + 2 {
            // Two groups with traffic and no machines: they cannot open anything.
            let rps = rng.below(1000) as f64;
            traffic.insert(format!("g{g:02}"), rps);
            tcsv.push_str(&format!("g{g:02},{rps}\n"));
        }
        let mut q = query(policy);
        q.by = Some("dc".into());
        q.traffic = Some(Traffic::parse_csv("t.csv", &tcsv).unwrap());
        q.latency = Some(Latencies::parse_csv("l.csv", &csv).unwrap());
        let r = a.where_usable(&q).unwrap();
        let groups: BTreeMap<String, bool> = r.groups.iter().map(|g| (g.value.clone(), g.matching > 0)).collect();
        assert_eq!(groups.len(), n_groups + 2);
        let (received, dest) = project_again(&groups, &traffic, &lat);
        let (mut total, mut remote) = (0.0, 0.0);
        for g in &r.groups {
            assert_eq!(g.received_rps, Some(received[&g.value]), "round {round} `{policy}` group {}", g.value);
            assert_eq!(g.own_rps, Some(traffic[&g.value]));
            if !g.satisfies() {
                assert_eq!(g.sends_to, dest[&g.value], "round {round} `{policy}` group {}", g.value);
            }
            let warn = received[&g.value] > 4.0 * traffic[&g.value];
            assert_eq!(g.warning.is_some(), warn, "round {round} group {}: {:?}", g.value, g.warning);
            total += traffic[&g.value];
            if !g.satisfies() && dest[&g.value].is_some() {
                remote += traffic[&g.value];
            }
        }
        assert_eq!(r.total_rps, Some(total));
        assert!((r.remote_share.unwrap() - remote / total).abs() < 1e-12);
        if policy == "region: MARS" {
            assert_eq!((r.matching, r.remote_share, r.unserved_rps), (0, Some(0.0), Some(total)));
        }
    }
    // Without latencies: the same `near` value, else the first that sorts.
    let mut q = query("region: EU and tier: gold");
    q.by = Some("dc".into());
    q.near = Some("region".into());
    q.traffic = Some(Traffic::from_pairs((0..n_groups).map(|g| (format!("g{g:02}"), 10.0))).unwrap());
    let r = a.where_usable(&q).unwrap();
    let sat: Vec<&str> = r.groups.iter().filter(|g| g.satisfies()).map(|g| g.value.as_str()).collect();
    assert!(!sat.is_empty());
    for g in r.groups.iter().filter(|g| !g.satisfies()) {
        let same = sat.iter().find(|s| region_of[**s] == region_of[&g.value]);
        assert_eq!(g.sends_to.as_deref(), Some(*same.unwrap_or(&sat[0])), "group {} in {}", g.value, region_of[&g.value]);
    }
}

/// The projection sends a group's handshakes where the key server's
/// forwarding sends a request from it: one rule (`wrap::nearest`), met
/// here through both doors, ties included.
#[test]
fn the_projection_and_the_key_servers_forwarding_agree() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let mut a = Authority::init(store).unwrap();
    let env = a.wrap("region: EU", b"k").unwrap();
    let mut rng = Rng(7);
    for round in 0..50 {
        let n = 2 + rng.below(8);
        let peers: Vec<Peer> = (0..n)
            .map(|i| Peer {
                name: format!("p{i}"),
                attributes: format!("region={}", ["EU", "NA"][rng.below(2)]).parse().unwrap(),
                latency: Duration::from_millis(1 + rng.below(3) as u64),
            })
            .collect();
        let mut lines = format!("{:032x}\tdc=here,region=NA\n", 0);
        let mut lat = Vec::new();
        for (i, p) in peers.iter().enumerate() {
            lines.push_str(&format!("{:032x}\tdc={},region={}\n", i + 1, p.name, p.attributes.get("region").unwrap()));
            lat.push(("here".to_owned(), p.name.clone(), p.latency.as_secs_f64() * 1000.0));
        }
        let fleet_store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let f = Authority::init(fleet_store).unwrap();
        f.import_inventory(&parse_inventory("f", &lines).unwrap()).unwrap();
        let mut q = query("region: EU");
        q.by = Some("dc".into());
        q.traffic = Some(Traffic::from_pairs([("here", 1.0)]).unwrap());
        q.latency = Some(Latencies::from_triples(lat).unwrap());
        let r = f.where_usable(&q).unwrap();
        let here = r.groups.iter().find(|g| g.value == "here").unwrap();
        // Peers named in sorted order (p0 < p1 < ... below 10) are in
        // configuration order for the key server too.
        assert_eq!(here.sends_to.as_deref(), nearest_capable(&env, &peers).map(|p| p.name.as_str()), "round {round}: {peers:?}");
    }
}

#[test]
fn bad_input_is_a_typed_error_naming_where() {
    let a = Authority::init(Arc::new(MemoryStore::default())).unwrap();
    match parse_inventory("fleet.tsv", "0123456789abcdef0123456789abcdef\tdc=fra1\nzz-top\tdc=x\n") {
        Err(e @ WrapError::InvalidLine { line: 2, field: "id", .. }) => {
            assert_eq!(e.code(), ErrorCode::InvalidArgument);
            assert!(e.to_string().starts_with("fleet.tsv, line 2, field id: "), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let mut q = query("region: EU");
    q.traffic = Some(Traffic::default());
    assert!(matches!(a.where_usable(&q), Err(WrapError::InvalidQuery(_))), "traffic without groups");
    let mut q = query("region: EU");
    q.warn_ratio = f64::NAN;
    assert!(matches!(a.where_usable(&q), Err(WrapError::InvalidQuery(_))));
    assert!(Traffic::from_pairs([("a", -1.0)]).is_err());
    assert!(Latencies::from_triples([("a", "b", f64::INFINITY)]).is_err());
    // A shard that does not decode is named, not a panic.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let b = Authority::init(store.clone()).unwrap();
    store.put("authority/inventory/00", b"KFI1\x05").unwrap();
    match b.where_usable(&query("a: b")) {
        Err(e @ WrapError::Malformed { object: "inventory", .. }) => assert_eq!(e.code(), ErrorCode::InconsistentState),
        other => panic!("{other:?}"),
    }
}
