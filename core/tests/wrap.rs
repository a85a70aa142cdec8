//! Policy-key wrapping: sharing, errors, rotation, the cache, persistence.
//!
//! The tests of wrapping and rotation run as tests of their own on each
//! of the three stores (`on_memory::`, `on_files::`, `on_etcd::`: a
//! three-member cluster on loopback, `etcd_support`).

mod common;
mod etcd_support;
mod every_store;

use std::sync::Arc;
use std::time::Duration;

use common::eventually;
use every_store::{on_every_store, Stores};
use keyfence::policy::Attributes;
use keyfence::wrap::{
    nearest_capable, Authority, CacheConfig, Envelope, FileStore, GenerationState, Machine, MachineInfo, MachineKey, MemoryStore, Peer,
    PublicMachine, Store, WatchEvent, WrapError,
};

fn attrs(s: &str) -> Attributes {
    s.parse().unwrap()
}

/// A new store from `stores` and an authority made on it.
fn setup_on(stores: &Stores) -> (Arc<dyn Store>, Authority) {
    let store = stores();
    let a = Authority::init(store.clone()).unwrap();
    (store, a)
}

/// [`setup_on`] a memory store: for the tests of what does not depend on
/// the store.
fn setup() -> (Arc<dyn Store>, Authority) {
    setup_on(&*every_store::memory())
}

// The tests that depend on the store, each on every store.
on_every_store!(
    secrets_under_one_policy_share_its_key,
    each_failure_is_its_own_error,
    master_rotation_reseals_policy_keys_and_leaves_envelopes_alone,
    policy_key_rotation_rewraps_its_envelopes,
    the_cache_expires_evicts_and_coalesces,
    envelopes_at_the_policy_text_limit_read_back_and_one_past_is_refused,
    errors_carry_their_codes,
    policy_key_rotation_keeps_outside_envelopes_and_skips_bad_ones,
    machines_accept_only_what_their_authority_signed,
    the_public_view_decides_as_the_machine_does,
    many_policies_rotate_and_retire_in_chunked_commits,
    a_watch_sees_puts_and_deletes_on_every_store,
    a_following_machine_learns_of_rotations_and_retirements,
    a_replayed_generation_list_is_refused,
);

/// A policy-key rotation re-wraps its envelopes, and a master rotation
/// deletes a retired generation's copies, in commits of a bounded number
/// of writes (etcd refuses a transaction of more than 128).
fn many_policies_rotate_and_retire_in_chunked_commits(stores: &Stores) {
    let (store, mut a) = setup_on(stores);
    let envs: Vec<Envelope> = (0..150).map(|i| a.wrap("region: EU", format!("s{i}").as_bytes()).unwrap()).collect();
    // 201 policy keys: more sealed copies than one etcd transaction (128
    // operations) holds, for the master rotations below.
    for i in 0..200 {
        a.wrap(&format!("team: t{i}"), b"x").unwrap();
    }
    let r = a.rotate_policy_key("region: EU").unwrap();
    assert_eq!(r.rewrapped, 150);
    assert!(r.skipped.is_empty());
    let retired = a.retire_policy_keys("region: EU").unwrap();
    assert_eq!(retired.retired, vec![1]);
    // 201 new copies, then (generation 1 retired) 201 deletions.
    assert_eq!(a.rotate_master().unwrap().resealed, 201);
    assert_eq!(a.rotate_master().unwrap().retired, Some(1));
    assert_eq!(store.list("sealed/").unwrap().len(), 2 * 201);
    let m = machine(&a, &store, "region=EU");
    for (i, e) in envs.iter().enumerate() {
        let now = store.get(&format!("envelopes/{}", hex::encode(e.secret_id))).unwrap().unwrap();
        assert_eq!(&m.open(&now).unwrap()[..], format!("s{i}").as_bytes());
    }
}

fn machine(a: &Authority, store: &Arc<dyn Store>, at: &str) -> Machine {
    Machine::new(a.issue(&attrs(at)).unwrap(), store.clone(), CacheConfig::default())
}

fn secrets_under_one_policy_share_its_key(stores: &Stores) {
    let (store, mut a) = setup_on(stores);
    let e1 = a.wrap("region: EU", b"secret one").unwrap();
    let e2 = a.wrap("(region: EU)", b"secret two").unwrap();
    let e3 = a.wrap("region: EU or country: US", b"secret three").unwrap();
    assert_eq!(e1.policy_id, e2.policy_id, "same canonical policy, same policy key");
    assert_ne!(e1.policy_id, e3.policy_id);
    assert_ne!(e1.secret_id, e2.secret_id);
    let s = a.status().unwrap();
    assert_eq!((s.policies, s.policy_keys, s.envelopes), (2, 2, 3));
    let m = machine(&a, &store, "region=EU,country=DE");
    assert_eq!(&m.open(e1.to_bytes()).unwrap()[..], b"secret one");
    assert_eq!(&m.open(e2.to_bytes()).unwrap()[..], b"secret two");
    assert_eq!(&m.open(e3.to_bytes()).unwrap()[..], b"secret three");
    let st = m.cache_stats();
    assert_eq!((st.misses, st.hits, st.entries), (2, 1, 2), "one CP-ABE decryption per policy key");
}

fn each_failure_is_its_own_error(stores: &Stores) {
    let (store, mut a) = setup_on(stores);
    let env = a.wrap("region: EU and not country: FR", b"k").unwrap();

    // Wrong machine.
    let us = machine(&a, &store, "region=NA,country=US");
    assert!(!us.could_open(&env));
    assert!(matches!(us.open(env.to_bytes()), Err(WrapError::NotAuthorized { .. })));

    // Tampered envelope: every byte of the ciphertext part.
    let m = machine(&a, &store, "region=EU,country=DE");
    let bytes = env.to_bytes().to_vec();
    for i in [bytes.len() - 1, bytes.len() - 20, 10, 60] {
        let mut bad = bytes.clone();
        bad[i] ^= 1;
        let e = m.open(&bad).unwrap_err();
        assert!(matches!(e, WrapError::Tampered { .. } | WrapError::Malformed { .. } | WrapError::WrongAuthority { .. }), "byte {i}: {e}");
    }
    let mut bad = bytes.clone();
    bad[bytes.len() - 1] ^= 1;
    assert!(matches!(m.open(&bad), Err(WrapError::Tampered { object: "envelope" })));
    assert!(matches!(m.open(&bytes[..bytes.len() - 1]), Err(WrapError::Malformed { .. })));

    // Another authority's machine: the envelope's signature names ours.
    let (other_store, other) = setup_on(stores);
    let stranger = machine(&other, &other_store, "region=EU,country=DE");
    assert!(matches!(stranger.open(env.to_bytes()), Err(WrapError::WrongAuthority { object: "envelope", .. })));

    // Retired generation: a key from generation 1 after two rotations.
    let old = a.issue(&attrs("region=EU,country=DE")).unwrap();
    a.rotate_master().unwrap();
    a.rotate_master().unwrap();
    let old = Machine::new(old, store.clone(), CacheConfig::default());
    match old.open(env.to_bytes()) {
        Err(WrapError::RetiredGeneration { have, live }) => assert_eq!((have, live), (vec![1], vec![2, 3])),
        other => panic!("expected a retired-generation error, got {other:?}"),
    }
    // Messages are distinct and say what happened.
    let msgs: Vec<String> = [
        us.open(env.to_bytes()).unwrap_err(),
        m.open(&bad).unwrap_err(),
        stranger.open(env.to_bytes()).unwrap_err(),
        old.open(env.to_bytes()).unwrap_err(),
    ]
    .iter()
    .map(|e| e.to_string())
    .collect();
    assert!(msgs[0].contains("do not satisfy"), "{}", msgs[0]);
    assert!(msgs[1].contains("integrity"), "{}", msgs[1]);
    assert!(msgs[2].contains("another authority"), "{}", msgs[2]);
    assert!(msgs[3].contains("retired"), "{}", msgs[3]);
}

fn master_rotation_reseals_policy_keys_and_leaves_envelopes_alone(stores: &Stores) {
    let (store, mut a) = setup_on(stores);
    let envs: Vec<Envelope> = ["region: EU", "region: EU", "country: US or not region: EU", "tier: 1"]
        .iter()
        .enumerate()
        .map(|(i, p)| a.wrap(p, format!("secret {i}").as_bytes()).unwrap())
        .collect();
    let before: Vec<Vec<u8>> = store.list("envelopes/").unwrap().iter().map(|k| store.get(k).unwrap().unwrap()).collect();
    let gen1 = machine(&a, &store, "region=EU,country=DE,tier=1");

    let r = a.rotate_master().unwrap();
    assert_eq!((r.new_generation, r.resealed, r.retired), (2, 3, None), "three policies, three re-seals");
    let after: Vec<Vec<u8>> = store.list("envelopes/").unwrap().iter().map(|k| store.get(k).unwrap().unwrap()).collect();
    assert_eq!(before, after, "customer envelopes are untouched");
    let status = a.status().unwrap();
    assert_eq!(status.generations, vec![(1, GenerationState::DecryptOnly), (2, GenerationState::Active)]);

    let gen2 = machine(&a, &store, "region=EU,country=DE,tier=1");
    assert_eq!(gen2.attributes_generations(), vec![2, 1]);
    for (i, e) in envs.iter().enumerate() {
        let want = format!("secret {i}");
        if e.policy.contains("country: US") {
            continue;
        }
        assert_eq!(&gen1.open(e.to_bytes()).unwrap()[..], want.as_bytes(), "generation-1 key, decrypt-only");
        assert_eq!(&gen2.open(e.to_bytes()).unwrap()[..], want.as_bytes());
    }
    let r = a.rotate_master().unwrap();
    assert_eq!(r.retired, Some(1));
    assert!(store.list("sealed/").unwrap().iter().all(|k| !k.ends_with("/1")), "retired copies deleted");
}

trait Gens {
    fn attributes_generations(&self) -> Vec<u32>;
}
impl Gens for Machine {
    fn attributes_generations(&self) -> Vec<u32> {
        let dbg = format!("{self:?}");
        let start = dbg.find("generations: [").unwrap() + 14;
        dbg[start..].split(']').next().unwrap().split(", ").map(|g| g.parse().unwrap()).collect()
    }
}

fn policy_key_rotation_rewraps_its_envelopes(stores: &Stores) {
    let (store, mut a) = setup_on(stores);
    let e1 = a.wrap("region: EU", b"one").unwrap();
    let e2 = a.wrap("region: EU", b"two").unwrap();
    let other = a.wrap("region: NA", b"three").unwrap();
    let r = a.rotate_policy_key("region: EU").unwrap();
    assert_eq!((r.version, r.rewrapped, r.skipped.len(), r.decrypt_only.clone()), (2, 2, 0, vec![1]));
    let m = machine(&a, &store, "region=EU");
    for (e, want) in [(&e1, "one"), (&e2, "two")] {
        let now = store.get(&format!("envelopes/{}", hex::encode(e.secret_id))).unwrap().unwrap();
        let now = Envelope::parse(&now).unwrap();
        assert_eq!(now.key_version, 2);
        assert_eq!(&m.open(now.to_bytes()).unwrap()[..], want.as_bytes());
        // The copy handed out before still opens: version 1 is decrypt-only.
        assert_eq!(&m.open(e.to_bytes()).unwrap()[..], want.as_bytes());
    }
    assert_eq!(a.status().unwrap().policy_keys, 3);
    // Retiring drops version 1: copies sealed to it stop opening.
    let r = a.retire_policy_keys("region: EU").unwrap();
    assert_eq!((r.version, r.retired.clone(), r.rewrapped), (2, vec![1], 0));
    m.clear_cache();
    assert!(matches!(m.open(e1.to_bytes()), Err(WrapError::UnknownPolicyKey { version: 1, .. })));
    assert_eq!(a.status().unwrap().policy_keys, 2);
    let na = machine(&a, &store, "region=NA");
    assert_eq!(&na.open(other.to_bytes()).unwrap()[..], b"three");
}

fn the_cache_expires_evicts_and_coalesces(stores: &Stores) {
    let (store, mut a) = setup_on(stores);
    let envs: Vec<Envelope> = (0..3).map(|i| a.wrap(&format!("region: EU and tier: t{i}"), b"s").unwrap()).collect();
    let key = a.issue(&attrs("region=EU,tier=t0")).unwrap();
    let keys: Vec<MachineKey> = (0..3).map(|i| a.issue(&attrs(&format!("region=EU,tier=t{i}"))).unwrap()).collect();

    let short = Machine::new(key, store.clone(), CacheConfig { capacity: 8, ttl: Duration::from_millis(50) });
    short.open(envs[0].to_bytes()).unwrap();
    short.open(envs[0].to_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(80));
    short.open(envs[0].to_bytes()).unwrap();
    let s = short.cache_stats();
    assert_eq!((s.hits, s.misses), (1, 2), "expired after its time to live");

    // Capacity 1: alternating policy keys evict each other, on every
    // machine: each opens its own tier's envelope (a miss, then a hit),
    // then the region-wide one (a miss that evicts), then its own again (a
    // miss that evicts).
    let env_any = a.wrap("region: EU", b"x").unwrap();
    for (i, k) in keys.iter().enumerate() {
        let m = Machine::new(k.clone(), store.clone(), CacheConfig { capacity: 1, ttl: Duration::from_secs(60) });
        assert_eq!(&m.open(envs[i].to_bytes()).unwrap()[..], b"s");
        assert_eq!(&m.open(envs[i].to_bytes()).unwrap()[..], b"s");
        assert_eq!(&m.open(env_any.to_bytes()).unwrap()[..], b"x");
        assert_eq!(&m.open(envs[i].to_bytes()).unwrap()[..], b"s");
        let s = m.cache_stats();
        assert_eq!((s.hits, s.misses, s.evictions, s.entries), (1, 3, 2, 1), "machine of tier t{i}");
    }

    // Eight threads missing on the same policy key do the CP-ABE work once.
    let m = Arc::new(Machine::new(a.issue(&attrs("region=EU,tier=t1")).unwrap(), store.clone(), CacheConfig::default()));
    let env = envs[1].to_bytes().to_vec();
    let barrier = Arc::new(std::sync::Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (m, env, b) = (m.clone(), env.clone(), barrier.clone());
            std::thread::spawn(move || {
                b.wait();
                m.open(&env).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = m.cache_stats();
    assert_eq!((s.misses, s.hits), (1, 7));
}

#[test]
fn forwarding_picks_the_nearest_capable_peer() {
    let (_, mut a) = setup();
    let env = a.wrap("region: EU and not country: FR", b"k").unwrap();
    let peers = vec![
        Peer { name: "cdg1".into(), attributes: attrs("region=EU,country=FR"), latency: Duration::from_millis(2) },
        Peer { name: "ams1".into(), attributes: attrs("region=EU,country=NL"), latency: Duration::from_millis(9) },
        Peer { name: "fra1".into(), attributes: attrs("region=EU,country=DE"), latency: Duration::from_millis(5) },
        Peer { name: "iad1".into(), attributes: attrs("region=NA,country=US"), latency: Duration::from_millis(1) },
    ];
    assert_eq!(nearest_capable(&env, &peers).map(|p| p.name.as_str()), Some("fra1"));
    assert!(nearest_capable(&env, &peers[..1]).is_none());
}

#[test]
fn the_file_store_persists_everything() {
    let dir = std::env::temp_dir().join(format!("keyfence-wrap-{}", std::process::id()));
    let store: Arc<dyn Store> = Arc::new(FileStore::open(&dir).unwrap());
    let mut a = Authority::init(store.clone()).unwrap();
    assert!(matches!(Authority::init(store.clone()), Err(WrapError::State(_))));
    let env = a.wrap("region: EU", b"persisted").unwrap();
    let key = a.issue(&attrs("region=EU")).unwrap();
    drop(a);
    let mut a = Authority::open(store.clone()).unwrap();
    assert_eq!(a.status().unwrap().envelopes, 1);
    a.rotate_master().unwrap();
    let key = MachineKey::from_bytes(&key.to_bytes()).unwrap();
    let m = Machine::new(key, store.clone(), CacheConfig::default());
    assert_eq!(&m.open(env.to_bytes()).unwrap()[..], b"persisted");
    assert!(format!("{:?}", m).contains("region=EU"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `a: "<m quotes><j x's>"`: its canonical text is 5 + 2m + j bytes.
fn long_policy(m: usize, j: usize) -> (String, String) {
    let value = format!("{}{}", "\"".repeat(m), "x".repeat(j));
    let text = format!("a: \"{}{}\"", "\\\"".repeat(m), "x".repeat(j));
    (text, value)
}

fn envelopes_at_the_policy_text_limit_read_back_and_one_past_is_refused(stores: &Stores) {
    use proptest::test_runner::{Config, TestRunner};
    use std::sync::Mutex;
    let (store, a) = setup_on(stores);
    let a = Mutex::new(a);
    let max = u16::MAX as usize;
    let check = |(m, j): (usize, usize)| {
        let (text, value) = long_policy(m, j);
        let len = 5 + 2 * m + j;
        let result = a.lock().unwrap().wrap(&text, b"long policy");
        if len <= max {
            let env = result.unwrap();
            assert_eq!(env.policy.len(), len);
            let parsed = Envelope::parse(env.to_bytes()).unwrap();
            assert_eq!(parsed.policy, env.policy);
            let key = a.lock().unwrap().issue(&Attributes::from_pairs([("a", value)])).unwrap();
            let m = Machine::new(key, store.clone(), CacheConfig::default());
            assert!(m.could_open(&parsed));
            assert_eq!(&m.open(env.to_bytes()).unwrap()[..], b"long policy");
        } else {
            match result {
                Err(WrapError::LimitExceeded { what: "policy text length", len: l, max: 65_535 }) => assert_eq!(l, len),
                other => panic!("expected the policy text to be refused, got {other:?}"),
            }
        }
        Ok::<(), proptest::test_runner::TestCaseError>(())
    };
    // Exactly at the limit and one byte past it, then around it.
    check(((max - 5) / 2, 0)).unwrap();
    check(((max - 5) / 2, 1)).unwrap();
    let mut runner = TestRunner::new(Config { cases: 6, ..Config::default() });
    runner.run(&((max - 5) / 2 - 1..=(max - 5) / 2 + 1, 0usize..3), check).unwrap();
}

#[test]
fn issue_refuses_what_a_machine_key_cannot_hold() {
    let (_, a) = setup();
    let many: Attributes = (0..=u16::MAX as usize).map(|i| (format!("l{i}"), "v")).collect();
    let e = a.issue(&many).unwrap_err();
    assert!(matches!(e, WrapError::LimitExceeded { what: "attribute count", len: 65_536, .. }), "{e}");
    assert_eq!(e.code(), keyfence::ErrorCode::LimitExceeded);
    let long = Attributes::from_pairs([("region", "E".repeat(65_536))]);
    assert!(matches!(a.issue(&long), Err(WrapError::LimitExceeded { what: "attribute value length", .. })));
}

fn errors_carry_their_codes(stores: &Stores) {
    use keyfence::ErrorCode;
    let store = stores();
    assert_eq!(Authority::open(store.clone()).unwrap_err().code(), ErrorCode::NoAuthority);
    let mut a = Authority::init(store.clone()).unwrap();
    assert_eq!(Authority::init(store.clone()).unwrap_err().code(), ErrorCode::AuthorityExists);
    assert_eq!(a.rotate_policy_key("region: EU").unwrap_err().code(), ErrorCode::UnknownPolicyKey);
    assert_eq!(a.wrap("region: EU or", b"x").unwrap_err().code(), ErrorCode::PolicySyntax);
    let env = a.wrap("region: EU", b"x").unwrap();
    let us = machine(&a, &store, "region=NA");
    assert_eq!(us.open(env.to_bytes()).unwrap_err().code(), ErrorCode::PolicyNotSatisfied);
    assert_eq!(Envelope::parse(&env.to_bytes()[1..]).unwrap_err().code(), ErrorCode::InvalidEnvelope);
    assert_eq!(MachineKey::from_bytes(b"KFM1").unwrap_err().code(), ErrorCode::InvalidKey);
}

/// Issue 14 / 19: an envelope handed out with `authority wrap --out` (never
/// in the store's `envelopes/`) still opens after its policy key is
/// rotated, and `can_open` agrees with `open`; one malformed or foreign
/// envelope in the store is reported and skipped, never aborting the
/// rotation; retiring re-wraps the store's stragglers first.
fn policy_key_rotation_keeps_outside_envelopes_and_skips_bad_ones(stores: &Stores) {
    let (store, mut a) = setup_on(stores);
    let inside = a.wrap("region: EU", b"inside").unwrap();
    let outside = a.wrap("region: EU", b"outside").unwrap();
    store.delete(&format!("envelopes/{}", hex::encode(outside.secret_id))).unwrap();
    // A malformed object, and another authority's envelope, in the store.
    store.put("envelopes/00000000000000000000000000000000", b"KFE2 garbage").unwrap();
    let (_, mut stranger) = setup_on(stores);
    let foreign = stranger.wrap("region: EU", b"foreign").unwrap();
    store.put(&format!("envelopes/{}", hex::encode(foreign.secret_id)), foreign.to_bytes()).unwrap();

    let r = a.rotate_policy_key("region: EU").unwrap();
    assert_eq!((r.version, r.rewrapped, r.decrypt_only.clone()), (2, 1, vec![1]));
    let mut reasons: Vec<String> = r.skipped.iter().map(|s| format!("{}: {}", s.name, s.reason)).collect();
    reasons.sort();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons[0].starts_with("envelopes/0000") && reasons[0].contains("not an envelope"), "{reasons:?}");
    assert!(reasons[1].contains("not signed by this authority"), "{reasons:?}");

    let m = machine(&a, &store, "region=EU");
    m.can_open(&outside).unwrap();
    assert_eq!(&m.open(outside.to_bytes()).unwrap()[..], b"outside");
    assert_eq!(&m.open(inside.to_bytes()).unwrap()[..], b"inside");

    // A store envelope put back on version 1 (a stale replica) is re-wrapped
    // before version 1 is retired; the outside copy then stops opening,
    // and `can_open` says so without decrypting.
    store.put(&format!("envelopes/{}", hex::encode(inside.secret_id)), inside.to_bytes()).unwrap();
    let r = a.retire_policy_keys("region: EU").unwrap();
    assert_eq!((r.version, r.retired.clone(), r.rewrapped, r.skipped.len()), (2, vec![1], 1, 2));
    let m = machine(&a, &store, "region=EU");
    assert!(matches!(m.can_open(&outside), Err(WrapError::UnknownPolicyKey { version: 1, .. })));
    assert!(matches!(m.open(outside.to_bytes()), Err(WrapError::UnknownPolicyKey { version: 1, .. })));
    let now = Envelope::parse(&store.get(&format!("envelopes/{}", hex::encode(inside.secret_id))).unwrap().unwrap()).unwrap();
    assert_eq!(now.key_version, 2);
    assert_eq!(&m.open(now.to_bytes()).unwrap()[..], b"inside");
    // Nothing left to retire is not an error.
    assert!(a.retire_policy_keys("region: EU").unwrap().retired.is_empty());
}

/// Issue 14, "authenticated distribution": whoever can write the
/// replicated store cannot make a machine accept a policy key or an
/// envelope its authority did not make.
fn machines_accept_only_what_their_authority_signed(stores: &Stores) {
    use keyfence::ErrorCode;
    let (store, mut a) = setup_on(stores);
    let env = a.wrap("region: EU", b"real").unwrap();
    let m = machine(&a, &store, "region=EU");
    assert_eq!(m.can_open(&env).map_err(|e| e.to_string()), Ok(()));
    assert_eq!(a.issue(&attrs("region=EU")).unwrap().authority(), &a.public_key());

    // Another authority's envelope under the same policy: refused with its
    // own code, before any decryption.
    let (other_store, mut other) = setup_on(stores);
    let forged = other.wrap("region: EU", b"planted").unwrap();
    let e = m.open(forged.to_bytes()).unwrap_err();
    assert!(matches!(e, WrapError::WrongAuthority { object: "envelope", .. }), "{e}");
    assert_eq!(e.code(), ErrorCode::WrongAuthority);
    assert!(matches!(m.can_open(&forged), Err(WrapError::WrongAuthority { .. })));

    // The same envelope with our authority's key written in: its signature fails.
    let mut renamed = forged.to_bytes().to_vec();
    renamed[6..38].copy_from_slice(&a.public_key());
    let e = m.open(&renamed).unwrap_err();
    assert!(matches!(e, WrapError::Tampered { object: "envelope" }), "{e}");

    // A sealed policy key planted at our policy key's name: the other
    // authority's copy for the same policy id, version and generation.
    let pid = hex::encode(env.policy_id);
    let ours = store.get(&format!("sealed/{pid}/1/1")).unwrap().unwrap();
    let theirs = other_store.get(&format!("sealed/{pid}/1/1")).unwrap().unwrap();
    store.put(&format!("sealed/{pid}/1/1"), &theirs).unwrap();
    let fresh = machine(&a, &store, "region=EU");
    let e = fresh.open(env.to_bytes()).unwrap_err();
    assert!(matches!(e, WrapError::WrongAuthority { object: "sealed policy key", .. }), "{e}");
    assert!(matches!(fresh.can_open(&env), Err(WrapError::WrongAuthority { .. })));
    // ... and one with a byte of its CP-ABE ciphertext changed.
    let mut bent = ours.clone();
    let at = bent.len() - 100;
    bent[at] ^= 1;
    store.put(&format!("sealed/{pid}/1/1"), &bent).unwrap();
    assert!(matches!(fresh.open(env.to_bytes()), Err(WrapError::Tampered { object: "sealed policy key" })));
    store.put(&format!("sealed/{pid}/1/1"), &ours).unwrap();
    assert_eq!(&fresh.open(env.to_bytes()).unwrap()[..], b"real");

    // Version 1 objects (unsigned) are refused, saying why.
    let mut v1 = env.to_bytes().to_vec();
    v1[3] = b'1';
    let e = Envelope::parse(&v1).unwrap_err();
    assert!(e.to_string().contains("format version 1"), "{e}");
    let mut key = a.issue(&attrs("region=EU")).unwrap().to_bytes().to_vec();
    key[3] = b'1';
    let e = MachineKey::from_bytes(&key).unwrap_err();
    assert!(e.to_string().contains("format version 1"), "{e}");
    assert_eq!(e.code(), ErrorCode::InvalidKey);
    // A machine key whose authority key is the identity (small order,
    // which would accept forged signatures) is refused.
    let mut weak = a.issue(&attrs("region=EU")).unwrap().to_bytes().to_vec();
    weak[4..36].copy_from_slice(&[1; 1].iter().chain([0u8; 31].iter()).copied().collect::<Vec<_>>());
    let e = MachineKey::from_bytes(&weak).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidKey);
    assert!(e.to_string().contains("authority key"), "{e}");
}

#[test]
fn machine_keys_are_not_issued_for_text_not_in_nfc() {
    let (_, a) = setup();
    let e = a.issue(&Attributes::from_pairs([("city", "Zu\u{308}rich")])).unwrap_err();
    assert_eq!(e.code(), keyfence::ErrorCode::InvalidAttributes, "{e}");
}

/// Issue 33: a key server that keeps its keys in the key process decides
/// with the public view of its machine key; it must decide as the machine
/// would, for every reason the machine has.
fn the_public_view_decides_as_the_machine_does(stores: &Stores) {
    let (store, mut a) = setup_on(stores);
    let eu = a.issue(&attrs("region=EU")).unwrap();
    let us = a.issue(&attrs("region=US")).unwrap();
    let env = a.wrap("region: EU", b"secret").unwrap();
    let foreign = setup_on(stores).1.wrap("region: EU", b"x").unwrap();
    let info = MachineInfo::from_key_bytes(&eu.to_bytes()).unwrap();
    assert_eq!(info, eu.info());
    assert_eq!((info.attributes(), info.generations(), info.authority()), (eu.attributes(), &eu.generations()[..], eu.authority()));
    assert!(!format!("{info:?}").contains("keys"), "{info:?}");

    let decide = |mk: &MachineKey, env: &Envelope| {
        let machine = Machine::new(mk.clone(), store.clone(), CacheConfig::default());
        let public = PublicMachine::new(MachineInfo::from_key_bytes(&mk.to_bytes()).unwrap(), store.clone());
        assert_eq!(public.could_open(env), machine.could_open(env));
        let (m, p) = (machine.can_open(env), public.can_open(env));
        assert_eq!(format!("{m:?}"), format!("{p:?}"));
        assert_eq!(format!("{:?}", machine.public().can_open(env)), format!("{p:?}"));
        p.map_err(|e| e.code())
    };
    assert_eq!(decide(&eu, &env), Ok(()));
    assert_eq!(decide(&us, &env), Err(keyfence::ErrorCode::PolicyNotSatisfied));
    assert_eq!(decide(&eu, &foreign), Err(keyfence::ErrorCode::WrongAuthority));
    let old = eu.generations()[0];
    let mut rotations = 0;
    while a.rotate_master().unwrap().retired != Some(old) {
        rotations += 1;
        assert!(rotations < 8, "the first generation never retired");
    }
    assert_eq!(decide(&eu, &env), Err(keyfence::ErrorCode::RetiredGeneration));
    let fresh = a.issue(&attrs("region=EU")).unwrap();
    assert_eq!(decide(&fresh, &env), Ok(()));
    // A policy key with no sealed copy (removed from the store).
    let other = a.wrap("region: EU or region: US", b"y").unwrap();
    let sealed: Vec<String> = store.list("sealed/").unwrap().into_iter().filter(|n| !n.contains(&hex::encode(env.policy_id))).collect();
    assert!(!sealed.is_empty());
    for name in sealed {
        store.delete(&name).unwrap();
    }
    assert_eq!(decide(&fresh, &other), Err(keyfence::ErrorCode::UnknownPolicyKey));
}

#[test]
fn a_public_view_of_bad_bytes_is_an_error() {
    let (_, a) = setup();
    let bytes = a.issue(&attrs("region=EU")).unwrap().to_bytes();
    for cut in [0, 3, 4, 36, bytes.len() - 1] {
        assert!(matches!(MachineInfo::from_key_bytes(&bytes[..cut]), Err(WrapError::Malformed { .. })), "cut at {cut}");
    }
    let mut extra = bytes.to_vec();
    extra.push(0);
    assert!(matches!(MachineInfo::from_key_bytes(&extra), Err(WrapError::Malformed { .. })));
    assert_eq!(MachineInfo::from_key_bytes(&bytes).unwrap().generations().len(), 1);
}

/// `Machine::forget` drops the policy key opened from a sealed copy the
/// store no longer holds; names of other objects change nothing.
#[test]
fn a_machine_forgets_a_policy_key_whose_sealed_copy_is_gone() {
    let (store, mut a) = setup();
    let old = a.wrap("region: EU", b"v1").unwrap();
    let m = machine(&a, &store, "region=EU");
    m.open(old.to_bytes()).unwrap();
    let copies = store.list("sealed/").unwrap();
    a.rotate_policy_key("region: EU").unwrap();
    a.retire_policy_keys("region: EU").unwrap();
    assert!(store.get(&copies[0]).unwrap().is_none());
    // The cache still holds version 1...
    assert_eq!(&m.open(old.to_bytes()).unwrap()[..], b"v1");
    assert!(!m.forget("envelopes/00"));
    assert!(!m.forget("public/generations"));
    // ...until told its sealed copy is gone.
    assert!(m.forget(&copies[0]));
    assert!(!m.forget(&copies[0]), "forgotten once");
    assert_eq!(m.open(old.to_bytes()).unwrap_err().code(), keyfence::ErrorCode::UnknownPolicyKey);
}

/// Waits (up to 30 s) for an event of `w` that `want` accepts, returning
/// the events seen before it too.
fn wait_for(w: &keyfence::wrap::Watch, want: impl Fn(&WatchEvent) -> bool) -> Vec<WatchEvent> {
    let start = std::time::Instant::now();
    let mut seen = Vec::new();
    while start.elapsed() < Duration::from_secs(30) {
        if let Some(e) = w.next_timeout(Duration::from_millis(50)) {
            let done = want(&e);
            seen.push(e);
            if done {
                return seen;
            }
        }
    }
    panic!("no awaited event in 30 s; saw {seen:?}");
}

/// The same watch API on every store: a new object, a replaced one and a
/// deletion under the prefix arrive, in revision order; nothing outside
/// the prefix does.
fn a_watch_sees_puts_and_deletes_on_every_store(stores: &Stores) {
    let store = stores();
    store.put("public/before", b"0").unwrap();
    let w = store.clone().watch("public/", 0).unwrap();
    let mut revisions = Vec::new();
    let put = |key: &'static str| move |e: &WatchEvent| matches!(e, WatchEvent::Put { key: k, .. } if k == key);
    store.put("public/a", b"1").unwrap();
    revisions.extend(wait_for(&w, put("public/a")).iter().map(WatchEvent::revision));
    store.put("sealed/elsewhere", b"x").unwrap();
    store.put("public/a", b"2").unwrap();
    let seen = wait_for(&w, put("public/a"));
    assert!(seen.iter().all(|e| e.key() == Some("public/a")), "only the prefix: {seen:?}");
    revisions.extend(seen.iter().map(WatchEvent::revision));
    store.delete("public/a").unwrap();
    let seen = wait_for(&w, |e| matches!(e, WatchEvent::Delete { key, .. } if key == "public/a"));
    revisions.extend(seen.iter().map(WatchEvent::revision));
    assert!(revisions.windows(2).all(|p| p[0] < p[1]), "{revisions:?}");
    assert!(w.next_timeout(Duration::from_millis(300)).is_none(), "nothing more");
    assert_eq!(store.clone().watch("../x/", 0).unwrap_err().code(), keyfence::ErrorCode::InvalidStoreKey);
}

/// A machine that follows its store, on every store: a policy-key
/// rotation's new key is in its cache before any envelope needs it, the
/// retirement of the old one reaches the cache at once (a time to live
/// of an hour notwithstanding), and each new generation list is counted
/// with its propagation delay.
fn a_following_machine_learns_of_rotations_and_retirements(stores: &Stores) {
    let (store, mut a) = setup_on(stores);
    let old = a.wrap("region: EU", b"v1").unwrap();
    let long = CacheConfig { ttl: Duration::from_secs(3600), ..CacheConfig::default() };
    let m = Arc::new(Machine::new(a.issue(&attrs("region=EU")).unwrap(), store.clone(), long));
    let _follower = m.follow().unwrap();
    assert_eq!(&m.open(old.to_bytes()).unwrap()[..], b"v1");
    assert_eq!(m.cache_stats().misses, 1);

    a.rotate_policy_key("region: EU").unwrap();
    // Version 2 is opened ahead: the cache holds both versions, and the
    // re-wrapped envelope opens from it without a miss.
    eventually("the rotated key reaches the cache", || m.cache_stats().entries == 2);
    let rewrapped = store.list("envelopes/").unwrap();
    let env = Envelope::parse(&store.get(&rewrapped[0]).unwrap().unwrap()).unwrap();
    assert_eq!(env.key_version, 2);
    assert_eq!(&m.open_envelope(&env).unwrap()[..], b"v1");
    assert_eq!(m.cache_stats().misses, 2, "one more miss: the opening ahead, not the envelope");

    a.retire_policy_keys("region: EU").unwrap();
    eventually("the retirement reaches the cache", || m.cache_stats().entries == 1);
    assert_eq!(m.open(old.to_bytes()).unwrap_err().code(), keyfence::ErrorCode::UnknownPolicyKey);

    let before = m.cache_stats().propagations;
    a.rotate_master().unwrap();
    eventually("the new generation list is seen", || m.cache_stats().propagations > before);
    let s = m.cache_stats();
    assert!(s.watch_events >= 4 && s.resyncs == 0, "{s:?}");
    assert!(s.propagation_last <= s.propagation_max && s.propagation_max < Duration::from_secs(30), "{s:?}");
    assert_eq!(&m.open_envelope(&env).unwrap()[..], b"v1");
}

/// A generation list the authority signed is put back after a newer one:
/// a machine that saw the newer one refuses it (REPLAYED_OBJECT); an
/// unsigned or modified list is refused by every machine.
fn a_replayed_generation_list_is_refused(stores: &Stores) {
    let (store, mut a) = setup_on(stores);
    let env = a.wrap("region: EU", b"s").unwrap();
    let first = store.get("public/generations").unwrap().unwrap();
    a.rotate_master().unwrap();
    a.rotate_master().unwrap();
    let m = machine(&a, &store, "region=EU");
    let newer = m.public();
    m.open(env.to_bytes()).unwrap();
    newer.can_open(&env).unwrap();
    // Generation 1, retired by now, is live again in the old list.
    store.put("public/generations", &first).unwrap();
    m.clear_cache();
    let err = m.open(env.to_bytes()).unwrap_err();
    assert!(matches!(err, WrapError::Replayed { .. }), "{err}");
    assert_eq!(err.code(), keyfence::ErrorCode::ReplayedObject);
    assert!(err.to_string().contains("generation 1"), "{err}");
    assert_eq!(newer.can_open(&env).unwrap_err().code(), keyfence::ErrorCode::ReplayedObject);
    // Withheld (deleted) is refused the same way.
    store.delete("public/generations").unwrap();
    assert_eq!(m.open(env.to_bytes()).unwrap_err().code(), keyfence::ErrorCode::ReplayedObject);
    // Forged: the text list of old, or the signed one with a byte changed.
    for forged in [b"1 0\n2 0\n3 0\n".to_vec(), {
        let mut f = first.clone();
        f[50] ^= 1;
        f
    }] {
        store.put("public/generations", &forged).unwrap();
        let fresh = machine(&a, &store, "region=EU");
        let err = fresh.open(env.to_bytes()).unwrap_err();
        assert!(matches!(err, WrapError::Malformed { .. } | WrapError::Tampered { .. }), "{err}");
    }
}

/// Issue 44.6: a store writer puts back the lists from before two
/// rotations and a revocation. A fresh process without a floor accepts
/// them (what the issue found); one that keeps the newest lists beside its
/// key, or that is required to start from a handed-over floor, refuses
/// them, and a floor from the file never lowers.
#[test]
fn a_fresh_process_starts_from_the_newest_lists_kept_beside_its_key() {
    use keyfence::wrap::{newest_lists_beside, NewestLists};
    use keyfence::ErrorCode;
    let (store, mut a) = setup();
    a.wrap("region: EU", b"s").unwrap();
    let old_generations = store.get("public/generations").unwrap().unwrap();
    a.rotate_master().unwrap();
    a.rotate_master().unwrap();
    let victim = a.issue(&attrs("region=US")).unwrap();
    a.revoke(victim.id().unwrap()).unwrap();
    let env = a.wrap("region: EU", b"s").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("machine.key");
    let key = a.issue(&attrs("region=EU")).unwrap();
    std::fs::write(&key_path, key.to_bytes()).unwrap();
    let kept = newest_lists_beside(&key_path).unwrap();
    assert_eq!(kept, dir.path().join("machine.key.newest"));
    assert!(newest_lists_beside(std::path::Path::new("/dev/stdin")).is_none());

    let first = Machine::new(key.clone(), store.clone(), CacheConfig::default()).keep_newest_in(&kept).unwrap();
    first.open(env.to_bytes()).unwrap();
    assert_eq!(first.revocations().unwrap().ids.len(), 1);
    let floor = NewestLists::from_bytes(&std::fs::read(&kept).unwrap()).unwrap();
    assert_eq!(floor, first.newest_lists());
    assert!(floor.generations().is_some() && floor.revoked().is_some());

    // The rollback.
    store.put("public/generations", &old_generations).unwrap();
    store.delete("public/revoked").unwrap();
    let forgetful = Machine::new(key.clone(), store.clone(), CacheConfig::default());
    assert!(forgetful.revocations().unwrap().ids.is_empty(), "without a floor the old list is taken");
    assert_ne!(forgetful.open(env.to_bytes()).unwrap_err().code(), ErrorCode::ReplayedObject);

    let next = Machine::new(key.clone(), store.clone(), CacheConfig::default()).keep_newest_in(&kept).unwrap();
    let e = next.open(env.to_bytes()).unwrap_err();
    assert_eq!(e.code(), ErrorCode::ReplayedObject, "{e}");
    assert!(e.to_string().contains("generation 1"), "{e}");
    assert_eq!(next.revocations().unwrap_err().code(), ErrorCode::ReplayedObject);
    // The file still holds the newer lists: a refused list is never kept.
    assert_eq!(NewestLists::from_bytes(&std::fs::read(&kept).unwrap()).unwrap(), floor);

    // A floor handed over rather than kept.
    let handed = Machine::new(key.clone(), store.clone(), CacheConfig::default());
    handed.require(&floor).unwrap();
    assert_eq!(handed.open(env.to_bytes()).unwrap_err().code(), ErrorCode::ReplayedObject);
    // Requiring an older floor after a newer one changes nothing.
    let older = NewestLists::from_bytes(&{
        let mut b = b"KFN2".to_vec();
        b.extend_from_slice(&(old_generations.len() as u32).to_le_bytes());
        b.extend_from_slice(&old_generations);
        b.extend_from_slice(&0u32.to_le_bytes());
        b
    })
    .unwrap();
    handed.require(&older).unwrap();
    assert_eq!(handed.newest_lists(), floor);
    // A floor handed over to a machine that keeps a file is written to it:
    // the next process starts there too.
    let fresh_dir = tempfile::tempdir().unwrap();
    let fresh_file = fresh_dir.path().join("handed.newest");
    let keeper = Machine::new(key.clone(), store.clone(), CacheConfig::default()).keep_newest_in(&fresh_file).unwrap();
    keeper.require(&floor).unwrap();
    assert_eq!(NewestLists::from_bytes(&std::fs::read(&fresh_file).unwrap()).unwrap(), floor);
    // Another authority's lists are no floor for this machine.
    let (other_store, other) = setup();
    let stranger = Machine::new(other.issue(&attrs("region=EU")).unwrap(), other_store.clone(), CacheConfig::default());
    assert_eq!(stranger.require(&floor).unwrap_err().code(), ErrorCode::WrongAuthority);
    // A file that holds this authority's generation list beside another
    // authority's revocation list (the key issued again by a new one)
    // still raises the generation floor.
    let other_revoked = {
        let mut o = other;
        let victim = o.issue(&attrs("region=US")).unwrap();
        o.revoke(victim.id().unwrap()).unwrap();
        other_store.get("public/revoked").unwrap().unwrap()
    };
    let mixed_file = fresh_dir.path().join("mixed.newest");
    let mut mixed = b"KFN2".to_vec();
    for list in [floor.generations().unwrap(), &other_revoked[..]] {
        mixed.extend_from_slice(&(list.len() as u32).to_le_bytes());
        mixed.extend_from_slice(list);
    }
    std::fs::write(&mixed_file, &mixed).unwrap();
    let m = Machine::new(key.clone(), store.clone(), CacheConfig::default()).keep_newest_in(&mixed_file).unwrap();
    assert_eq!(m.open(env.to_bytes()).unwrap_err().code(), ErrorCode::ReplayedObject);
    // A file that does not decode is an error that names it.
    std::fs::write(&kept, b"KFN2\x01").unwrap();
    let e = Machine::new(key, store, CacheConfig::default()).keep_newest_in(&kept).unwrap_err();
    assert!(e.to_string().contains("machine.key.newest"), "{e}");
}

#[test]
fn an_unsigned_generation_list_is_signed_when_the_authority_opens_the_store() {
    let (store, mut a) = setup();
    let env = a.wrap("region: EU", b"s").unwrap();
    a.rotate_master().unwrap();
    // The list as keyfence wrote it before signing it: generation 1
    // decrypt-only, 2 active.
    let text = b"1 1\n2 0\n".to_vec();
    store.put("public/generations", &text).unwrap();
    let m = machine(&a, &store, "region=EU");
    let err = m.open(env.to_bytes()).unwrap_err();
    assert!(matches!(err, WrapError::Malformed { .. }), "{err}");
    assert!(err.to_string().contains("unsigned text list"), "{err}");
    drop(a);
    let a = Authority::open(store.clone()).unwrap();
    let signed = store.get("public/generations").unwrap().unwrap();
    assert!(signed.starts_with(b"KFG2"), "{signed:?}");
    assert_eq!(&*m.open(env.to_bytes()).unwrap(), b"s");
    // Opening a store whose list is signed writes nothing.
    drop(a);
    Authority::open(store.clone()).unwrap();
    assert_eq!(store.get("public/generations").unwrap().unwrap(), signed);
}

/// A polled store keeps no history: a watch resumed from an earlier
/// revision begins with `Compacted`, then goes on with the changes; a
/// machine applying `Compacted` clears its cache and counts a resync.
#[test]
fn a_resumed_poll_and_a_compaction_make_a_full_resync() {
    let dir = tempfile::tempdir().unwrap();
    for store in [Arc::new(MemoryStore::default()) as Arc<dyn Store>, Arc::new(FileStore::open(dir.path()).unwrap())] {
        let w = store.clone().watch("public/", 7).unwrap();
        assert_eq!(w.next_timeout(Duration::from_secs(5)), Some(WatchEvent::Compacted { revision: 0 }));
        store.put("public/x", b"1").unwrap();
        let seen = wait_for(&w, |e| e.key() == Some("public/x"));
        assert_eq!(seen.len(), 1, "{seen:?}");
    }
    let (store, mut a) = setup();
    let env = a.wrap("region: EU", b"s").unwrap();
    let m = machine(&a, &store, "region=EU");
    m.open(env.to_bytes()).unwrap();
    assert_eq!(m.cache_stats().entries, 1);
    m.apply(&WatchEvent::Compacted { revision: 3 });
    let s = m.cache_stats();
    assert_eq!((s.entries, s.resyncs, s.watch_events), (0, 1, 1), "{s:?}");
    m.open(env.to_bytes()).unwrap();
    assert_eq!(m.cache_stats().misses, 2, "opened again after the resync");
}

/// Issue 44: a store inside another's prefix was wiped by the outer one's
/// clean-up, master keys included. Both nestings are refused (before any
/// directory is made), and clean-up deletes only names that are sealed
/// copies, never one it cannot account for.
#[test]
fn nested_directory_stores_are_refused_and_clean_up_keeps_what_it_did_not_write() {
    use keyfence::wrap::{create_store, open_store, StoreError};
    let dir = tempfile::tempdir().unwrap();
    let d = |p: &str| dir.path().join(p).to_str().unwrap().to_string();
    // The outer store first: an init inside it is refused, nothing made.
    let mut outer = Authority::init(create_store(&d("acme")).unwrap()).unwrap();
    outer.wrap("region: EU", b"outer").unwrap();
    let err = create_store(&d("acme/sealed/prod")).err().unwrap();
    assert!(matches!(&err, StoreError::Nested { inside: true, .. }) && err.to_string().contains("lies inside"), "{err}");
    assert!(!dir.path().join("acme/sealed/prod").exists(), "the refused init made its directory");
    // The inner store first: an init around it is refused, and so is
    // opening an authority over one found there later.
    let mut inner = Authority::init(create_store(&d("other/sealed/prod")).unwrap()).unwrap();
    inner.wrap("region: EU", b"inner").unwrap();
    let err = Authority::init(create_store(&d("other")).unwrap()).err().unwrap();
    assert!(err.to_string().contains("holds the keyfence store at"), "{err}");
    let state = dir.path().join("other/sealed/prod/authority/state");
    assert!(state.is_file(), "the inner store lost its master keys");
    // An outer store whose sealed folder came to hold a store (copied in
    // by hand): its authority does not open, so never cleans up there.
    std::fs::create_dir_all(dir.path().join("acme/sealed/prod")).unwrap();
    let copied = FileStore::open(dir.path().join("acme/sealed/prod")).unwrap();
    copied.put("public/generations", b"x").unwrap();
    copied.put("authority/state", b"master keys").unwrap();
    let err = Authority::open(open_store(&d("acme")).unwrap()).err().unwrap();
    assert!(err.to_string().contains("holds the keyfence store at"), "{err}");
    assert_eq!(std::fs::read(dir.path().join("acme/sealed/prod/authority/state")).unwrap(), b"master keys");

    // Clean-up itself, on a store with no nesting check: a rotation
    // deletes retired sealed copies but no name that is not one.
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let mut a = Authority::init(store.clone()).unwrap();
    a.wrap("region: EU", b"s").unwrap();
    for foreign in ["sealed/prod/authority/state", "sealed/prod/public/generations", "sealed/notes.txt"] {
        store.put(foreign, b"not the authority's").unwrap();
    }
    let before: Vec<String> = store.list("sealed/").unwrap();
    a.rotate_master().unwrap();
    a.rotate_master().unwrap();
    let after = store.list("sealed/").unwrap();
    for foreign in ["sealed/prod/authority/state", "sealed/prod/public/generations", "sealed/notes.txt"] {
        assert_eq!(store.get(foreign).unwrap().as_deref(), Some(&b"not the authority's"[..]), "{foreign} was deleted");
    }
    // ...while the sealed copies of retired generations did go.
    assert!(before.iter().any(|n| n.ends_with("/1") && !after.contains(n)), "{before:?} -> {after:?}");
}

/// Issue 47: opening a store never makes one (a mistyped path was created,
/// then reported as a key problem); only an authority's init does.
#[test]
fn opening_a_store_never_creates_it() {
    use keyfence::wrap::{open_store, StoreError};
    let dir = tempfile::tempdir().unwrap();
    let typo = dir.path().join("typo/deep");
    let err = open_store(typo.to_str().unwrap()).err().unwrap();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
    assert_eq!(err.code(), keyfence::ErrorCode::StoreIo);
    assert!(err.to_string().contains("authority init"), "{err}");
    assert!(!dir.path().join("typo").exists(), "opening made a directory");
}

/// Issue 46.3's fuzzing found an attribute key with its labels out of
/// order, which parsed and then encoded differently (two encodings of one
/// key): a machine key holding one is refused, naming the field. The seed
/// is the fuzzer's own (`fuzz/seeds/wrap_parse`); the in-order key beside
/// it still parses and encodes to its own bytes.
#[test]
fn a_key_whose_labels_are_out_of_order_is_refused() {
    let good = include_bytes!("../../fuzz/seeds/wrap_parse/machine_key");
    let bad = include_bytes!("../../fuzz/seeds/wrap_parse/machine_key_labels_out_of_order");
    assert_eq!(&MachineKey::from_bytes(good).unwrap().to_bytes()[..], &good[..]);
    let err = MachineKey::from_bytes(bad).unwrap_err().to_string();
    assert!(err.contains("label out of order or repeated"), "{err}");
}

/// Issue 52.4: an envelope held from before its policy key was rotated
/// (what a key file embeds) opens after the old version is retired, from
/// the store's copy of the same secret (`Machine::open_current`); opened
/// as it is, it is refused (the control: that was the servers' failure).
#[test]
fn an_envelope_from_before_a_retirement_opens_from_the_stores_copy() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let mut a = Authority::init(store.clone()).unwrap();
    let held = a.wrap("region: EU", b"the secret").unwrap().to_bytes().to_vec();
    let other = a.wrap("region: EU", b"another secret").unwrap().to_bytes().to_vec();
    let key = a.issue(&"region=EU".parse().unwrap()).unwrap();
    a.rotate_policy_key("region: EU").unwrap();
    let retired = a.retire_policy_keys("region: EU").unwrap();
    assert!(!retired.retired.is_empty(), "{retired:?}");
    let m = Machine::new(key, store.clone(), CacheConfig::default());
    let err = m.open(&held).unwrap_err();
    assert_eq!(err.code().name(), "UNKNOWN_POLICY_KEY", "{err}");
    assert_eq!(&m.open_current(&held).unwrap()[..], b"the secret");
    assert_eq!(&m.open_current(&other).unwrap()[..], b"another secret", "each secret from its own copy");
    // An envelope the store holds as it is: opened as it is.
    let current = store.get(&format!("envelopes/{}", hex::encode(Envelope::parse(&held).unwrap().secret_id))).unwrap().unwrap();
    assert_eq!(&m.open_current(&current).unwrap()[..], b"the secret");
}

/// A machine that follows its store opens ahead only what an open would:
/// a sealed copy put back for a generation the newest list retired is not
/// opened into the cache, where a later open would take it without
/// reading the list again (the rollback floor passed by). The control: a
/// live generation's copy is opened ahead.
#[test]
fn a_copy_put_back_for_a_retired_generation_is_not_opened_ahead() {
    use keyfence::ErrorCode;
    let (store, mut a) = setup();
    let env = a.wrap("region: EU", b"s").unwrap();
    let long = CacheConfig { ttl: Duration::from_secs(3600), ..CacheConfig::default() };
    let m = Machine::new(a.issue(&attrs("region=EU")).unwrap(), store.clone(), long);
    let first: Vec<(String, Vec<u8>)> = store
        .list("sealed/")
        .unwrap()
        .into_iter()
        .map(|n| {
            let v = store.get(&n).unwrap().unwrap();
            (n, v)
        })
        .collect();
    assert!(!first.is_empty());
    a.rotate_master().unwrap();
    a.rotate_master().unwrap();
    // The machine reads the list that retired generation 1.
    assert_eq!(m.open(env.to_bytes()).unwrap_err().code(), ErrorCode::RetiredGeneration);
    for (name, blob) in &first {
        assert!(store.get(name).unwrap().is_none(), "retiring deletes {name}");
        store.put(name, blob).unwrap();
        m.apply(&WatchEvent::Put { key: name.clone(), revision: 1, value: Some(blob.clone()) });
    }
    assert_eq!(m.cache_stats().entries, 0, "a copy of a retired generation was opened ahead");
    assert_eq!(m.open(env.to_bytes()).unwrap_err().code(), ErrorCode::RetiredGeneration);

    // The control: a machine of the live generation opens its copy ahead.
    let live = Machine::new(a.issue(&attrs("region=EU")).unwrap(), store.clone(), long);
    let copies: Vec<String> = store.list("sealed/").unwrap();
    for name in &copies {
        live.apply(&WatchEvent::Put { key: name.clone(), revision: 2, value: None });
    }
    assert_eq!(live.cache_stats().entries, 1, "{copies:?}");
    assert_eq!(&live.open(env.to_bytes()).unwrap()[..], b"s");
}
