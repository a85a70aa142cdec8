//! Crash safety by fault injection (issue 14): every write of `wrap`,
//! `rotate_master`, `rotate_policy_key` and `retire_policy_keys` fails in
//! turn (that write and every later one, as if the process died just
//! before it); then the store is reopened and checked: nothing committed
//! is lost, every envelope handed out before still opens, and the
//! operation, run again, succeeds. `issue` must not write at all.

use std::sync::Arc;

use keyfence::wrap::{Authority, CacheConfig, Envelope, FaultyStore, FileStore, Machine, MemoryStore, Store, WrapError};

/// An envelope handed out, its secret, and whether it is sealed to the
/// policy key version that `retire_policy_keys` legitimately ends (the
/// store's own copy is re-wrapped; a copy handed out before is not).
struct Handed {
    env: Vec<u8>,
    secret: Vec<u8>,
    outside_v1: bool,
}

/// A store with two live generations, three policies, a rotated policy
/// key whose old version is still decrypt-only, an envelope that only
/// exists outside the store, and a malformed object in `envelopes/`.
fn base() -> (MemoryStore, Vec<Handed>) {
    let store = Arc::new(MemoryStore::default());
    let mut a = Authority::init(store.clone()).unwrap();
    let mut handed = Vec::new();
    let give = |a: &mut Authority, handed: &mut Vec<Handed>, policy: &str, secret: &str| {
        let env = a.wrap(policy, secret.as_bytes()).unwrap();
        handed.push(Handed { env: env.to_bytes().to_vec(), secret: secret.into(), outside_v1: false });
        env
    };
    give(&mut a, &mut handed, "region: EU", "one");
    handed.last_mut().unwrap().outside_v1 = true;
    give(&mut a, &mut handed, "region: EU or tier: gold", "two");
    let outside = give(&mut a, &mut handed, "region: EU", "outside");
    store.delete(&format!("envelopes/{}", hex::encode(outside.secret_id))).unwrap();
    handed.last_mut().unwrap().outside_v1 = true;
    a.rotate_master().unwrap();
    a.rotate_policy_key("region: EU").unwrap();
    give(&mut a, &mut handed, "tier: gold", "three");
    give(&mut a, &mut handed, "region: EU", "four");
    store.put("envelopes/ffffffffffffffffffffffffffffffff", b"not an envelope").unwrap();
    (copy(&*store), handed)
}

fn copy(from: &dyn Store) -> MemoryStore {
    let to = MemoryStore::default();
    for k in from.list("").unwrap() {
        to.put(&k, &from.get(&k).unwrap().unwrap()).unwrap();
    }
    to
}

/// Reopens `store` and opens every envelope handed out (and every one in
/// the store), with a machine key issued now.
fn check(store: &Arc<dyn Store>, handed: &[Handed], retired_v1: bool, what: &str) {
    let a = Authority::open(store.clone()).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    let key = a.issue(&"region=EU,tier=gold,country=DE".parse().unwrap()).unwrap();
    let m = Machine::new(key, store.clone(), CacheConfig::default());
    for h in handed {
        if h.outside_v1 && retired_v1 {
            continue;
        }
        let env = Envelope::parse(&h.env).unwrap();
        m.can_open(&env).unwrap_or_else(|e| panic!("{what}: can_open {:?}: {e}", String::from_utf8_lossy(&h.secret)));
        let got = m.open(&h.env).unwrap_or_else(|e| panic!("{what}: open {:?}: {e}", String::from_utf8_lossy(&h.secret)));
        assert_eq!(&got[..], &h.secret[..], "{what}");
    }
    for name in store.list("envelopes/").unwrap() {
        let bytes = store.get(&name).unwrap().unwrap();
        if Envelope::parse(&bytes).is_ok() {
            m.open(&bytes).unwrap_or_else(|e| panic!("{what}: {name} in the store: {e}"));
        }
    }
}

type Op = fn(&mut Authority) -> keyfence::wrap::Result<Option<Envelope>>;

const OPS: [(&str, Op, bool); 5] = [
    ("wrap under an existing policy", |a| a.wrap("region: EU", b"new").map(Some), false),
    ("wrap under a new policy", |a| a.wrap("country: DE", b"new").map(Some), false),
    ("rotate_master", |a| a.rotate_master().map(|_| None), false),
    ("rotate_policy_key", |a| a.rotate_policy_key("region: EU").map(|_| None), false),
    ("retire_policy_keys", |a| a.retire_policy_keys("region: EU").map(|_| None), true),
];

#[test]
fn every_write_of_every_operation_can_fail_and_nothing_is_lost() {
    let (base, handed) = base();
    let keys_before = Authority::open(Arc::new(copy(&base))).unwrap().status().unwrap().policy_keys;
    for (name, op, retires) in OPS {
        let counting = Arc::new(FaultyStore::counting(Arc::new(copy(&base))));
        op(&mut Authority::open(counting.clone()).unwrap()).unwrap();
        let writes = counting.writes();
        assert!(writes >= 1, "{name}: {writes} writes");
        for k in 0..writes {
            let what = format!("{name}, write {k} of {writes} failed");
            let inner: Arc<dyn Store> = Arc::new(copy(&base));
            let faulty = Arc::new(FaultyStore::failing_from(inner.clone(), k));
            let mut a = Authority::open(faulty.clone()).unwrap();
            assert!(op(&mut a).is_err(), "{what}, yet it reported success");
            // A retirement that committed before the failure has ended
            // version 1, as it should; one that did not must have kept it.
            let keys = Authority::open(inner.clone()).unwrap().status().unwrap().policy_keys;
            check(&inner, &handed, retires && keys < keys_before, &what);
            // Run again: on the same handle every other time (it must not
            // build on what it failed to commit), else on a reopened one.
            faulty.heal();
            let mut again = if k % 2 == 0 { a } else { Authority::open(faulty.clone()).unwrap() };
            let made = op(&mut again).unwrap_or_else(|e| panic!("{what}: run again: {e}"));
            check(&inner, &handed, retires, &format!("{what}, then run again"));
            if let Some(env) = made {
                let key = again.issue(&"region=EU,country=DE".parse().unwrap()).unwrap();
                let m = Machine::new(key, inner.clone(), CacheConfig::default());
                assert_eq!(&m.open(env.to_bytes()).unwrap()[..], b"new", "{what}");
            }
        }
    }
}

/// `status` never writes; `issue` writes one object, its machine's
/// inventory record (issue 61), and when that write fails it hands out no
/// key: a machine the inventory does not know would be one `where` and
/// the rotation check cannot count.
#[test]
fn status_never_writes_and_issue_writes_its_inventory_record_only() {
    let (base, _) = base();
    let counting = Arc::new(FaultyStore::failing_from(Arc::new(base), 1));
    let a = Authority::open(counting.clone()).unwrap();
    a.status().unwrap();
    assert_eq!(counting.writes(), 0);
    let key = a.issue(&"region=EU".parse().unwrap()).unwrap();
    assert_eq!(counting.writes(), 1);
    assert!(a.inventory().unwrap().iter().any(|m| Some(m.id.as_str()) == key.id()));
    a.status().unwrap();
    assert_eq!(counting.writes(), 1);
    match a.issue(&"region=EU".parse().unwrap()) {
        Err(WrapError::Store(keyfence::wrap::StoreError::Io { key, .. })) => {
            assert!(key.starts_with("authority/inventory/"), "{key}")
        }
        other => panic!("expected the record's write to fail, got {other:?}"),
    }
}

/// The same over the file store, for the operation with the most writes.
#[test]
fn the_file_store_loses_nothing_either() {
    let dir = std::env::temp_dir().join(format!("keyfence-faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (base, handed) = base();
    let seed = |k: usize| {
        let root = dir.join(format!("s{k}"));
        let s = FileStore::open(&root).unwrap();
        for name in base.list("").unwrap() {
            s.put(&name, &base.get(&name).unwrap().unwrap()).unwrap();
        }
        Arc::new(s) as Arc<dyn Store>
    };
    let counting = Arc::new(FaultyStore::counting(seed(usize::MAX)));
    Authority::open(counting.clone()).unwrap().rotate_policy_key("region: EU").unwrap();
    for k in 0..counting.writes() {
        let inner = seed(k);
        let faulty = Arc::new(FaultyStore::failing_from(inner.clone(), k));
        assert!(Authority::open(faulty.clone()).unwrap().rotate_policy_key("region: EU").is_err());
        check(&inner, &handed, false, &format!("file store, write {k}"));
        faulty.heal();
        Authority::open(faulty).unwrap().rotate_policy_key("region: EU").unwrap();
        check(&inner, &handed, false, &format!("file store, write {k}, then run again"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `init` failed at any write leaves either no authority (and `init`
/// runs again) or a complete one; never an authority without the
/// generation list that marks a directory as a store.
#[test]
fn init_failing_at_any_write_can_be_run_again() {
    let counting = Arc::new(FaultyStore::counting(Arc::new(MemoryStore::default())));
    Authority::init(counting.clone()).unwrap();
    for k in 0..counting.writes() {
        let inner: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let faulty = Arc::new(FaultyStore::failing_from(inner.clone(), k));
        assert!(Authority::init(faulty.clone()).is_err(), "write {k}");
        if inner.get("authority/state").unwrap().is_some() {
            assert!(inner.get("public/generations").unwrap().is_some(), "write {k}: state without the list");
            Authority::open(inner.clone()).unwrap();
            continue;
        }
        faulty.heal();
        Authority::init(faulty).unwrap_or_else(|e| panic!("write {k}: init again: {e}"));
        Authority::open(inner).unwrap();
    }
}

/// A master rotation that fails at its commit has made a new generation in
/// memory only. Before the handle forgot it, `issue` on that handle gave
/// machines a key for that phantom generation; the next rotation, from a
/// reopened store, made a different generation of the same number, and
/// those machines tried its sealed copies with the wrong key and failed.
#[test]
fn a_handle_whose_rotation_failed_issues_keys_for_committed_generations_only() {
    let (base, handed) = base();
    let inner: Arc<dyn Store> = Arc::new(copy(&base));
    let before = Authority::open(inner.clone()).unwrap().status().unwrap();
    // A master rotation writes one sealed copy per policy key, then the
    // state: fail at the state.
    let faulty = Arc::new(FaultyStore::failing_from(inner.clone(), before.policy_keys));
    let mut a = Authority::open(faulty.clone()).unwrap();
    assert!(a.rotate_master().is_err());
    assert_eq!(Authority::open(inner.clone()).unwrap().status().unwrap().generations, before.generations, "not committed");
    // The store works again (issue writes the machine's inventory record).
    faulty.heal();
    let key = a.issue(&"region=EU,tier=gold".parse().unwrap()).unwrap();
    let committed: Vec<u32> = before.generations.iter().filter(|(_, s)| s.is_live()).map(|(g, _)| *g).rev().collect();
    assert_eq!(key.generations(), committed, "keys for the committed generations only");
    drop(a);
    Authority::open(inner.clone()).unwrap().rotate_master().unwrap();
    let m = Machine::new(key, inner.clone(), CacheConfig::default());
    for h in &handed {
        assert_eq!(&m.open(&h.env).unwrap()[..], &h.secret[..]);
    }
}

/// Every envelope in `store` opens, with a machine key issued now, and the
/// handed-out secrets that live in the store are still there (a
/// revocation re-wraps them; the copies handed out before may be retired).
fn check_store(store: &Arc<dyn Store>, handed: &[Handed], what: &str) {
    let a = Authority::open(store.clone()).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    let key = a.issue(&"region=EU,tier=gold,country=DE".parse().unwrap()).unwrap();
    let m = Machine::new(key, store.clone(), CacheConfig::default());
    for h in handed.iter().filter(|h| h.secret != b"outside") {
        let env = Envelope::parse(&h.env).unwrap();
        let now = store.get(&format!("envelopes/{}", hex::encode(env.secret_id))).unwrap().unwrap_or_else(|| panic!("{what}: lost"));
        assert_eq!(&m.open(&now).unwrap_or_else(|e| panic!("{what}: {e}"))[..], &h.secret[..], "{what}");
    }
    for name in store.list("envelopes/").unwrap() {
        let bytes = store.get(&name).unwrap().unwrap();
        if Envelope::parse(&bytes).is_ok() {
            m.open(&bytes).unwrap_or_else(|e| panic!("{what}: {name} in the store: {e}"));
        }
    }
}

/// A revocation whose every write fails in turn leaves a store whose
/// envelopes all open, and running it again (same handle or reopened)
/// finishes it: nothing pending, and the revoked machine opens nothing
/// the store serves.
#[test]
fn a_revocation_failing_at_any_write_is_finished_by_running_it_again() {
    let (base, handed) = base();
    let victim = Authority::open(Arc::new(copy(&base))).unwrap().issue(&"region=EU,tier=gold,country=DE".parse().unwrap()).unwrap();
    let id = victim.id().unwrap().to_owned();
    let counting = Arc::new(FaultyStore::counting(Arc::new(copy(&base))));
    Authority::open(counting.clone()).unwrap().revoke(&id).unwrap();
    let writes = counting.writes();
    assert!(writes >= 10, "{writes} writes");
    for k in 0..writes {
        let what = format!("revoke, write {k} of {writes} failed");
        let inner: Arc<dyn Store> = Arc::new(copy(&base));
        let faulty = Arc::new(FaultyStore::failing_from(inner.clone(), k));
        let mut a = Authority::open(faulty.clone()).unwrap();
        assert!(a.revoke(&id).is_err(), "{what}, yet it reported success");
        check_store(&inner, &handed, &what);
        faulty.heal();
        let mut again = if k % 2 == 0 { a } else { Authority::open(faulty.clone()).unwrap() };
        again.revoke(&id).unwrap_or_else(|e| panic!("{what}: run again: {e}"));
        let what = format!("{what}, then run again");
        check_store(&inner, &handed, &what);
        let status = again.status().unwrap();
        // Only the current version of each policy is left, sealed under
        // the two live generations: no retired version's copy lingers.
        assert_eq!((status.policy_keys, inner.list("sealed/").unwrap().len()), (3, 6), "{what}");
        assert_eq!((status.revoked, status.pending_revocations), (vec![id.clone()], vec![]), "{what}");
        let m = Machine::new(victim.clone(), inner.clone(), CacheConfig::default());
        for name in inner.list("envelopes/").unwrap() {
            let bytes = inner.get(&name).unwrap().unwrap();
            if Envelope::parse(&bytes).is_ok() {
                assert_eq!(m.open(&bytes).unwrap_err().code(), keyfence::ErrorCode::MachineRevoked, "{what}: {name}");
            }
        }
        assert_eq!(
            again.issue(&format!("region=EU,machine={id}").parse().unwrap()).unwrap_err().code(),
            keyfence::ErrorCode::MachineRevoked
        );
    }
}
