//! Revoking a machine (issue 26): after `revoke`, the revoked machine,
//! keeping every policy key it cached, opens no envelope the store serves,
//! even lying about its id; every other machine opens everything, a
//! following machine learning the new key versions by itself; the id is
//! refused by `issue`; master rotations compact the negations. The tests
//! run on the memory store, a directory and a three-member etcd cluster.

mod common;
mod etcd_support;
mod every_store;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::eventually;
use every_store::{on_every_store, Stores};
use keyfence::wrap::{Authority, CacheConfig, Envelope, Machine, MachineKey, MemoryStore, Store, WrapError};
use keyfence::ErrorCode;

const POLICIES: [&str; 4] = ["region: EU", "region: EU or country: US", "country: DE and not tier: bronze", "tier: gold"];

fn long_cache() -> CacheConfig {
    CacheConfig { ttl: Duration::from_secs(3600), ..CacheConfig::default() }
}

fn machine(a: &Authority, store: &Arc<dyn Store>, attrs: &str) -> Machine {
    Machine::new(a.issue(&attrs.parse().unwrap()).unwrap(), store.clone(), long_cache())
}

/// Every envelope the store serves, with its name.
fn served(store: &Arc<dyn Store>) -> Vec<(String, Envelope)> {
    let names = store.list("envelopes/").unwrap();
    names.into_iter().map(|n| (n.clone(), Envelope::parse(&store.get(&n).unwrap().unwrap()).unwrap())).collect()
}

/// The secret an envelope was made for.
fn secret_of(secrets: &[([u8; 16], String)], env: &Envelope) -> String {
    secrets.iter().find(|(id, _)| *id == env.secret_id).unwrap().1.clone()
}

/// The same key with its `machine` attribute spelt `id` instead: the
/// attribute list is the key's description, the CP-ABE key inside still
/// holds the id it was issued for.
fn lying_about_its_id(key: &MachineKey, id: &str) -> MachineKey {
    let real = key.id().unwrap();
    assert_eq!(real.len(), id.len());
    let mut bytes = key.to_bytes().to_vec();
    let at = bytes.windows(real.len()).position(|w| w == real.as_bytes()).unwrap();
    bytes[at..at + id.len()].copy_from_slice(id.as_bytes());
    let liar = MachineKey::from_bytes(&bytes).unwrap();
    assert_eq!(liar.id(), Some(id));
    liar
}

fn a_revoked_machine_opens_nothing_the_store_serves(stores: &Stores) {
    let store = stores();
    let mut a = Authority::init(store.clone()).unwrap();
    let mut secrets = Vec::new();
    for (i, p) in POLICIES.iter().enumerate() {
        for j in 0..3 {
            let s = format!("secret {i}.{j}");
            let env = a.wrap(p, s.as_bytes()).unwrap();
            secrets.push((env.secret_id, s));
        }
    }
    // Two live generations: the machines hold a key of each.
    a.rotate_master().unwrap();

    let victim_key = a.issue(&"region=EU,country=DE,tier=gold".parse().unwrap()).unwrap();
    let victim = Machine::new(victim_key.clone(), store.clone(), long_cache());
    let victim_id = victim.id().unwrap().to_owned();
    let peer = machine(&a, &store, "region=EU,country=DE,tier=gold");
    let us = machine(&a, &store, "region=NA,country=US,tier=silver");
    assert_ne!(victim.id(), peer.id(), "ids are unique");
    let edge = Arc::new(machine(&a, &store, "region=EU,country=DE,tier=gold"));
    let _following = edge.follow().unwrap();

    // The victim opens (and caches) every policy key it can.
    let mut cached = HashSet::new();
    for (_, env) in served(&store) {
        assert_eq!(&victim.open_envelope(&env).unwrap()[..], secret_of(&secrets, &env).as_bytes());
        assert_eq!(&edge.open_envelope(&env).unwrap()[..], secret_of(&secrets, &env).as_bytes());
        cached.insert((env.policy_id, env.key_version));
    }
    assert_eq!(victim.cache_stats().entries, POLICIES.len());
    let edge_misses = edge.cache_stats().misses;
    let fresh = POLICIES.len() as u64 + 1; // a new version of each, and the late policy

    let r = a.revoke(&victim_id).unwrap();
    assert_eq!((r.rekeyed, r.rewrapped, r.retired, r.resumed, r.already), (4, 12, 4, false, false), "{r:?}");
    // A new policy after the revocation is sealed without the victim too.
    let late = a.wrap("country: DE", b"late").unwrap();
    secrets.push((late.secret_id, "late".into()));

    // Its cache is kept, as an attacker would keep it, yet every envelope
    // the store serves is sealed to a version it never held...
    assert_eq!(victim.cache_stats().entries, POLICIES.len());
    let now = served(&store);
    assert_eq!(now.len(), 13);
    for (name, env) in &now {
        assert!(!cached.contains(&(env.policy_id, env.key_version)), "{name} still on a cached version");
        let e = victim.open_envelope(env).unwrap_err();
        assert_eq!(e.code(), ErrorCode::MachineRevoked, "{name}: {e}");
        assert!(matches!(victim.can_open(env), Err(WrapError::Revoked { .. })));
    }
    // ...and the sealed copies exclude it in CP-ABE itself: the same key
    // claiming another id gets past the check of the id, not the pairing.
    let other_id: String = victim_id.chars().rev().collect();
    let liar = Machine::new(lying_about_its_id(&victim_key, &other_id), store.clone(), long_cache());
    for (name, env) in &now {
        let e = liar.open_envelope(env).unwrap_err();
        assert_eq!(e.code(), ErrorCode::PolicyNotSatisfied, "{name}: {e}");
    }

    // Everyone else opens everything they could before.
    for (_, env) in &now {
        let want = secret_of(&secrets, env);
        assert_eq!(&peer.open_envelope(env).unwrap()[..], want.as_bytes());
        if us.could_open(env) {
            assert_eq!(&us.open_envelope(env).unwrap()[..], want.as_bytes());
        }
    }
    assert!(now.iter().filter(|(_, e)| us.could_open(e)).count() >= 3);
    // The following machine learnt the new versions by itself: the old
    // ones are forgotten, the new ones opened ahead, so every envelope
    // opens without a miss.
    eventually("the new versions reach the edge cache", || {
        edge.cache_stats().entries as u64 == fresh && edge.cache_stats().misses == edge_misses + fresh
    });
    for (_, env) in &now {
        assert_eq!(&edge.open_envelope(env).unwrap()[..], secret_of(&secrets, env).as_bytes());
    }
    assert_eq!(edge.cache_stats().misses, edge_misses + fresh, "no miss on the request path");

    // The id is refused by `issue`, recorded, signed for machines, and a
    // second revocation has nothing to do.
    let e = a.issue(&format!("region=EU,machine={victim_id}").parse().unwrap()).unwrap_err();
    assert_eq!(e.code(), ErrorCode::MachineRevoked, "{e}");
    assert!(peer.revocations().unwrap().contains(&victim_id));
    let s = a.status().unwrap();
    assert_eq!((s.revoked.clone(), s.pending_revocations.len()), (vec![victim_id.clone()], 0));
    assert!(a.revoke(&victim_id).unwrap().already);
    assert_eq!(a.revoke("not-an-id").unwrap_err().code(), ErrorCode::InvalidAttributes);
    // A machine keeps its id across a new key.
    let again = a.issue(&format!("region=EU,machine={}", peer.id().unwrap()).parse().unwrap()).unwrap();
    assert_eq!(again.id(), peer.id());
}

fn a_master_rotation_compacts_the_negations(stores: &Stores) {
    let store = stores();
    let mut a = Authority::init(store.clone()).unwrap();
    let env = a.wrap("region: EU", b"s").unwrap();
    let victim = machine(&a, &store, "region=EU");
    let id = victim.id().unwrap().to_owned();
    a.revoke(&id).unwrap();
    let magics = |store: &Arc<dyn Store>| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = store
            .list("sealed/")
            .unwrap()
            .into_iter()
            .map(|n| {
                let b = store.get(&n).unwrap().unwrap();
                let gen = n.rsplit('/').next().unwrap().to_owned();
                (gen, String::from_utf8_lossy(&b[..4]).into_owned())
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(magics(&store), vec![("1".into(), "KFP3".into())]);
    a.rotate_master().unwrap();
    assert_eq!(magics(&store), vec![("1".into(), "KFP3".into()), ("2".into(), "KFP2".into())]);
    a.rotate_master().unwrap();
    // Generation 1, the last the victim held a key of, is retired: no copy
    // carries a negation any more, and the victim holds nothing live.
    assert_eq!(magics(&store), vec![("2".into(), "KFP2".into()), ("3".into(), "KFP2".into())]);
    let current = Envelope::parse(&store.get(&format!("envelopes/{}", hex::encode(env.secret_id))).unwrap().unwrap()).unwrap();
    assert_eq!(victim.open_envelope(&current).unwrap_err().code(), ErrorCode::RetiredGeneration);
    assert_eq!(&machine(&a, &store, "region=EU").open_envelope(&current).unwrap()[..], b"s");
    // The id stays refused after the negation is gone.
    assert_eq!(a.issue(&format!("region=EU,machine={id}").parse().unwrap()).unwrap_err().code(), ErrorCode::MachineRevoked);
    assert_eq!(a.status().unwrap().revoked, vec![id]);
}

on_every_store!(
    a_revoked_machine_opens_nothing_the_store_serves,
    a_master_rotation_compacts_the_negations,
    wrapping_many_at_once_stores_each,
);

/// A bulk wrap stores every envelope (in commits of at most 64 writes,
/// which etcd's transaction limit needs) and each opens; a new policy's
/// key is made once.
fn wrapping_many_at_once_stores_each(stores: &Stores) {
    let store = stores();
    let mut a = Authority::init(store.clone()).unwrap();
    let secrets: Vec<Vec<u8>> = (0..150).map(|i| format!("s{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = secrets.iter().map(|s| &s[..]).collect();
    let envs = a.wrap_many("region: EU", &refs).unwrap();
    assert_eq!(envs.len(), 150);
    assert_eq!(store.list("envelopes/").unwrap().len(), 150);
    assert_eq!(a.status().unwrap().policy_keys, 1);
    let m = machine(&a, &store, "region=EU");
    for (e, s) in envs.iter().zip(&secrets) {
        let stored = store.get(&format!("envelopes/{}", hex::encode(e.secret_id))).unwrap().unwrap();
        assert_eq!(&m.open(&stored).unwrap()[..], &s[..]);
    }
}

/// Issue 44.6: `issue` refuses an id that is a keyword of the policy
/// language, and revoking one (an earlier keyfence issued it) works and
/// leaves the store wrapping: before, `revoke --machine not` failed to
/// parse its own negation, or on a store with no policy committed and
/// made every later wrap fail.
#[test]
fn keyword_machine_ids_are_never_issued_and_revoking_one_keeps_the_store_wrapping() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let mut a = Authority::init(store.clone()).unwrap();
    for keyword in ["not", "and", "or"] {
        let err = a.issue(&format!("region=EU,machine={keyword}").parse().unwrap()).unwrap_err();
        assert!(matches!(err, WrapError::InvalidMachineId { .. }) && err.to_string().contains("keyword"), "{err}");
    }
    // On a store with no policy yet, then with one.
    a.revoke("not").unwrap();
    let env = a.wrap("region: EU", b"after").unwrap();
    a.revoke("or").unwrap();
    // The store's copy, re-wrapped by the second revocation.
    let m = machine(&a, &store, "region=EU");
    let (_, now) = served(&store).into_iter().find(|(_, e)| e.secret_id == env.secret_id).unwrap();
    assert_eq!(now.key_version, 2);
    assert_eq!(&m.open(now.to_bytes()).unwrap()[..], b"after");
    assert_eq!(a.status().unwrap().revoked, vec!["not".to_string(), "or".to_string()]);
}
