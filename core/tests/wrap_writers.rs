//! Writers at once on a store without a writer lock (issue 44.2), in one
//! process and deterministically: a store whose lock holds nothing, as
//! etcd's, and a hook that commits another writer's wrap just before each
//! of the operation's commits. A stream of wraps that add policy keys
//! must not starve a rotation or a revocation (they re-base on it); two
//! long operations at once both commit, one after the other (the fence);
//! a wrap that loses a race starts over. The same on a real etcd cluster
//! with its leader killed is in `store_etcd.rs`.

#[macro_use]
mod store_support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use keyfence::policy::Attributes;
use keyfence::wrap::{Authority, Batch, CacheConfig, Conflicts, Envelope, Machine, MemoryStore, Store, StoreError, StoreLock};

type Hook = Box<dyn FnMut(&Arc<dyn Store>) + Send>;

/// A memory store whose lock keeps no one out (as etcd's), with a hook
/// run before every commit the authority under test sends through it.
struct Lockless {
    inner: Arc<dyn Store>,
    hook: Mutex<Option<Hook>>,
    in_hook: AtomicBool,
    commits: AtomicUsize,
}

impl Lockless {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: Arc::new(MemoryStore::default()),
            hook: Mutex::new(None),
            in_hook: AtomicBool::new(false),
            commits: AtomicUsize::new(0),
        })
    }
    fn set_hook(&self, hook: Option<Hook>) {
        *self.hook.lock().unwrap() = hook;
    }
}

impl Store for Lockless {
    passes_reads_and_writes_to_inner!();
    fn lock(&self, _wait: Duration) -> Result<StoreLock, StoreError> {
        Ok(StoreLock::new(()))
    }
    fn lock_is_exclusive(&self) -> bool {
        false
    }
    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        if !self.in_hook.swap(true, Ordering::SeqCst) {
            if let Some(hook) = self.hook.lock().unwrap().as_mut() {
                hook(&self.inner);
            }
            self.in_hook.store(false, Ordering::SeqCst);
        }
        self.commits.fetch_add(1, Ordering::SeqCst);
        // The memory store's commit checks and writes under no lock of
        // its own: a mutex here makes it one transaction, as etcd's.
        static TXN: Mutex<()> = Mutex::new(());
        let _txn = TXN.lock().unwrap();
        self.inner.commit(batch)
    }
}

fn attrs(s: &str) -> Attributes {
    s.parse().unwrap()
}

/// A hook that wraps under a policy no one used before, on one commit in
/// `every`: what commits a new policy key to the state. While a long
/// operation's fence is exclusive it does not: that wrap would wait (in
/// another process; here it would wait for the very thread it runs on).
fn wrap_stream(every: usize, count: Arc<AtomicUsize>, handed: Arc<Mutex<Vec<(Envelope, String)>>>) -> Hook {
    let mut other: Option<Authority> = None;
    let mut calls = 0;
    Box::new(move |inner| {
        calls += 1;
        let fence = inner.get("authority/fence").unwrap().unwrap_or_default();
        if calls % every != 0 || String::from_utf8_lossy(&fence).contains("mode exclusive") {
            return;
        }
        let a = other.get_or_insert_with(|| Authority::open(inner.clone()).unwrap());
        let i = count.fetch_add(1, Ordering::SeqCst);
        let secret = format!("streamed {i}");
        let env = a.wrap(&format!("region: EU or stream: s{i}"), secret.as_bytes()).unwrap();
        handed.lock().unwrap().push((env, secret));
    })
}

/// Sealed copies in the store of generation `g`.
fn copies_of_generation(store: &dyn Store, g: u32) -> usize {
    store.list("sealed/").unwrap().iter().filter(|n| n.rsplit('/').next() == Some(&g.to_string())).count()
}

/// A master rotation of a store of 150 policies while wraps add new ones
/// before one commit in `every` of the rotation's; what it met.
fn rotation_under_a_stream(every: usize) -> Conflicts {
    let store = Lockless::new();
    let dynstore: Arc<dyn Store> = store.clone();
    let mut a = Authority::init(dynstore.clone()).unwrap();
    // Over a chunk's worth of keys: the rotation commits its copies in
    // several commits, and the stream gets in between.
    for i in 0..150 {
        a.wrap(&format!("region: EU and n: p{i}"), b"x").unwrap();
    }
    let (count, handed) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
    store.set_hook(Some(wrap_stream(every, count.clone(), handed.clone())));
    let r = a.rotate_master().unwrap();
    store.set_hook(None);
    let c = a.last_conflicts();
    assert_eq!(r.new_generation, 2);
    assert!(c.rebased >= 2 && count.load(Ordering::SeqCst) >= 2, "{c:?}, {} streamed", count.load(Ordering::SeqCst));
    // Every policy key, the streamed ones too, has its copy under the new
    // generation; after the next rotation retires generation 1, a machine
    // opens every streamed envelope.
    let status = a.status().unwrap();
    assert_eq!(copies_of_generation(&*dynstore, 2), status.policy_keys, "{status:?}");
    assert_eq!(status.policy_keys, 150 + count.load(Ordering::SeqCst));
    a.rotate_master().unwrap();
    let m = Machine::new(a.issue(&attrs("region=EU")).unwrap(), dynstore.clone(), CacheConfig::default());
    for (env, secret) in handed.lock().unwrap().iter() {
        assert_eq!(&m.open(env.to_bytes()).unwrap()[..], secret.as_bytes());
    }
    assert_eq!(dynstore.get("authority/fence").unwrap(), None, "the fence was let go");
    c
}

#[test]
fn a_rotation_re_bases_on_wraps_that_add_policies() {
    let c = rotation_under_a_stream(2);
    assert!(!c.held_wraps, "one wrap per commit is re-based on, never waited for: {c:?}");
}

#[test]
fn a_rotation_under_a_wrap_before_every_commit_makes_them_wait() {
    // Re-basing alone would never send a commit: a wrap gets in before
    // each. After a few, the fence turns exclusive and the wraps wait.
    let c = rotation_under_a_stream(1);
    assert!(c.held_wraps && c.rebased >= 4, "{c:?}");
}

#[test]
fn a_revocation_under_a_stream_of_new_policies_leaves_the_machine_nothing() {
    for every in [1, 2] {
        let store = Lockless::new();
        let dynstore: Arc<dyn Store> = store.clone();
        let mut a = Authority::init(dynstore.clone()).unwrap();
        for i in 0..40 {
            a.wrap(&format!("region: EU or n: p{}", i % 20), format!("before {i}").as_bytes()).unwrap();
        }
        let doomed = a.issue(&attrs("region=EU")).unwrap();
        let (count, handed) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
        store.set_hook(Some(wrap_stream(every, count.clone(), handed.clone())));
        let r = a.revoke(doomed.id().unwrap()).unwrap();
        store.set_hook(None);
        assert!(a.last_conflicts().rebased >= 1, "{:?}", a.last_conflicts());
        assert!(r.rewrapped >= 40, "{r:?}");
        // Nothing the store serves opens for the revoked machine, the
        // envelopes streamed in during the revocation included; a machine
        // issued now opens all of them.
        let revoked = Machine::new(doomed, dynstore.clone(), CacheConfig::default());
        let fresh = Machine::new(a.issue(&attrs("region=EU")).unwrap(), dynstore.clone(), CacheConfig::default());
        let names = dynstore.list("envelopes/").unwrap();
        assert_eq!(names.len(), 40 + count.load(Ordering::SeqCst));
        for name in names {
            let env = dynstore.get(&name).unwrap().unwrap();
            let Err(e) = revoked.open(&env) else { panic!("{name} opens for the revoked machine (a wrap every {every} commits)") };
            assert_eq!(e.code(), keyfence::ErrorCode::MachineRevoked, "{name}: {e}");
            if let Err(e) = fresh.open(&env) {
                panic!("{name} does not open for a machine issued now: {e} (a wrap every {every} commits)");
            }
        }
    }
}

#[test]
fn two_rotations_at_once_both_commit_one_after_the_other() {
    let store = Lockless::new();
    let dynstore: Arc<dyn Store> = store.clone();
    let mut a = Authority::init(dynstore.clone()).unwrap();
    for i in 0..100 {
        a.wrap(&format!("n: p{i}"), b"x").unwrap();
    }
    let mut b = Authority::open(dynstore.clone()).unwrap();
    let barrier = Barrier::new(2);
    let (ra, rb) = std::thread::scope(|t| {
        let ha = t.spawn(|| {
            barrier.wait();
            a.rotate_master().map(|r| r.new_generation)
        });
        let hb = t.spawn(|| {
            barrier.wait();
            b.rotate_master().map(|r| r.new_generation)
        });
        (ha.join().unwrap(), hb.join().unwrap())
    });
    let mut gens = vec![ra.unwrap(), rb.unwrap()];
    gens.sort();
    assert_eq!(gens, vec![2, 3]);
    let status = a.status().unwrap();
    // Generation 1 retired, 2 decrypt-only, 3 active: each with a copy of
    // every key, none of one rotation's copies overwritten by the other's.
    assert_eq!(copies_of_generation(&*dynstore, 2), 100);
    assert_eq!(copies_of_generation(&*dynstore, 3), 100);
    assert_eq!(copies_of_generation(&*dynstore, 1), 0, "{status:?}");
    let m = Machine::new(a.issue(&attrs("n=p7")).unwrap(), dynstore.clone(), CacheConfig::default());
    let env = a.wrap("n: p7", b"after").unwrap();
    assert_eq!(&m.open(env.to_bytes()).unwrap()[..], b"after");
}

#[test]
fn a_fence_left_by_a_dead_holder_or_garbage_holds_nothing() {
    let store = Lockless::new();
    let dynstore: Arc<dyn Store> = store.clone();
    let mut a = Authority::init(dynstore.clone()).unwrap();
    for planted in [
        "keyfence fence 1\nholder 00000000000000000000000000000000\noperation revoke\nuntil 1\nprocess 1@gone\n".as_bytes(),
        b"not a fence",
    ] {
        dynstore.put("authority/fence", planted).unwrap();
        let t = std::time::Instant::now();
        a.rotate_master().unwrap();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(dynstore.get("authority/fence").unwrap(), None);
    }
}

#[test]
fn a_wrap_that_loses_a_race_for_its_policy_starts_over_and_shares_the_key() {
    let store = Lockless::new();
    let dynstore: Arc<dyn Store> = store.clone();
    let mut a = Authority::init(dynstore.clone()).unwrap();
    let mut fired = false;
    let their = Arc::new(Mutex::new(None));
    let theirs = their.clone();
    store.set_hook(Some(Box::new(move |inner: &Arc<dyn Store>| {
        if !std::mem::replace(&mut fired, true) {
            let mut b = Authority::open(inner.clone()).unwrap();
            *theirs.lock().unwrap() = Some(b.wrap("region: EU", b"theirs").unwrap());
        }
    })));
    let ours = a.wrap("region: EU", b"ours").unwrap();
    store.set_hook(None);
    let their = their.lock().unwrap().take().unwrap();
    assert_eq!(a.last_conflicts().retried, 1, "{:?}", a.last_conflicts());
    assert_eq!(a.status().unwrap().policy_keys, 1, "one key for the policy, not two");
    assert_eq!((ours.key_version, ours.policy_id), (their.key_version, their.policy_id));
    let m = Machine::new(a.issue(&attrs("region=EU")).unwrap(), dynstore.clone(), CacheConfig::default());
    assert_eq!(&m.open(ours.to_bytes()).unwrap()[..], b"ours");
    assert_eq!(&m.open(their.to_bytes()).unwrap()[..], b"theirs");
}

#[test]
fn a_writer_that_keeps_losing_gives_up_with_a_conflict_after_its_retries() {
    let store = Lockless::new();
    let dynstore: Arc<dyn Store> = store.clone();
    let mut a = Authority::init(dynstore.clone()).unwrap();
    // Before every commit, another writer rotates the policy key of the
    // policy being wrapped: nothing a re-base can take in.
    a.wrap("region: EU", b"first").unwrap();
    store.set_hook(Some(Box::new(move |inner: &Arc<dyn Store>| {
        let mut b = Authority::open(inner.clone()).unwrap();
        b.rotate_policy_key("region: EU").unwrap();
    })));
    let t = std::time::Instant::now();
    let err = a.wrap("region: EU", b"x").unwrap_err();
    store.set_hook(None);
    assert_eq!(err.code(), keyfence::ErrorCode::StoreConflict, "{err}");
    assert_eq!(a.last_conflicts().retried, 8);
    // Paused between attempts: 20 ms doubling up to 1 s, jittered.
    assert!(t.elapsed() >= Duration::from_millis(1500), "{:?}", t.elapsed());
}
