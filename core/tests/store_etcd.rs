//! The etcd store against a real three-member cluster on loopback
//! (`etcd_support`): the `Store` contract, paging, the request limit, two
//! authorities racing, and a leader killed in the middle of wrapping.

mod etcd_support;
#[macro_use]
mod store_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use keyfence::policy::Attributes;
use keyfence::wrap::{Authority, Batch, CacheConfig, Machine, Op, Store, StoreError, WatchEvent, ETCD_MAX_REQUEST};
use keyfence::ErrorCode;

use etcd_support::Cluster;

#[test]
fn the_store_contract_holds_on_etcd_with_paged_listing_and_the_request_limit() {
    let Some(cluster) = Cluster::start() else { return };
    let s = cluster.store("contract");
    let other = cluster.store("contract-other");
    assert_eq!(s.get("public/x").unwrap(), None);
    s.put("public/x", b"1").unwrap();
    s.put("public/x", b"").unwrap();
    assert_eq!(s.get("public/x").unwrap().as_deref(), Some(&b""[..]), "an empty value is a value");
    assert_eq!(other.get("public/x").unwrap(), None, "prefixes do not see each other");
    s.delete("public/x").unwrap();
    s.delete("public/x").unwrap();
    assert_eq!(s.get("public/x").unwrap(), None);
    assert!(matches!(s.put("../x", b""), Err(StoreError::InvalidKey(_))));

    // More than two pages (1,000 keys each), written in commits of 100.
    let n = 2_345;
    for chunk in (0..n).collect::<Vec<_>>().chunks(100) {
        let mut b = Batch::default();
        for i in chunk {
            b.push(Op::Put(format!("envelopes/{i:05}"), vec![1]));
        }
        s.commit(&b).unwrap();
    }
    s.put("envelopesX", b"outside the prefix's folder").unwrap();
    let listed = s.list("envelopes/").unwrap();
    assert_eq!(listed, (0..n).map(|i| format!("envelopes/{i:05}")).collect::<Vec<_>>());
    assert!(other.list("envelopes/").unwrap().is_empty());

    // Just under the limit is written whole; over it is refused before
    // anything is sent, and nothing is there afterwards.
    let key = "sealed/big";
    let fits = vec![7u8; ETCD_MAX_REQUEST - "contract/".len() - key.len()];
    s.put(key, &fits).unwrap();
    assert_eq!(s.get(key).unwrap().unwrap(), fits);
    let err = s.put("sealed/bigger", &vec![7u8; 1536 * 1024]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::LimitExceeded, "{err}");
    assert_eq!(s.get("sealed/bigger").unwrap(), None);

    // A commit expecting a stale revision writes nothing.
    let (_, stamp) = s.get_stamped("sealed/big").unwrap().unwrap();
    s.put("sealed/big", b"changed").unwrap();
    let stale = Batch { expect: vec![("sealed/big".into(), Some(stamp))], ops: vec![Op::Put("public/y".into(), b"y".to_vec())] };
    let err = s.commit(&stale).unwrap_err();
    assert!(matches!(&err, StoreError::Conflict { key } if key == "sealed/big"), "{err}");
    assert_eq!(err.code(), ErrorCode::StoreConflict);
    assert_eq!(s.get("public/y").unwrap(), None);
}

#[test]
fn the_store_name_opens_an_etcd_store() {
    let Some(cluster) = Cluster::start() else { return };
    // Opening never makes a store: a prefix without one is refused, with
    // the code the bindings promise.
    let err = keyfence::wrap::open_store(&cluster.name("named/prefix")).err().unwrap();
    assert!(matches!(err, StoreError::NotAStore { .. }) && err.code() == ErrorCode::StoreIo, "{err}");
    let s = keyfence::wrap::create_store(&cluster.name("named/prefix")).unwrap();
    s.put("public/x", b"1").unwrap();
    assert_eq!(cluster.store("named/prefix").get("public/x").unwrap().as_deref(), Some(&b"1"[..]));
}

/// A store that holds the first two commits made through it until both
/// have arrived: two authorities on it have both read the state before
/// either commits, whatever the scheduling.
struct Gate {
    inner: Arc<dyn Store>,
    arrived: AtomicUsize,
    both: Barrier,
}

impl Store for Gate {
    passes_reads_and_writes_to_inner!();
    fn lock(&self, wait: Duration) -> Result<keyfence::wrap::StoreLock, StoreError> {
        self.inner.lock(wait)
    }
    fn lock_is_exclusive(&self) -> bool {
        self.inner.lock_is_exclusive()
    }
    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        if self.arrived.fetch_add(1, Ordering::SeqCst) < 2 {
            self.both.wait();
        }
        self.inner.commit(batch)
    }
}

/// Two authorities (two handles, as two processes would have) on one
/// cluster rotate from the same state, their first commits held until
/// both have sent one: both rotations commit, one after the other (the
/// second waits for the first's fence), and neither's sealed copies
/// overwrite the other's.
#[test]
fn two_authorities_racing_a_rotation_both_commit_in_turn() {
    let Some(cluster) = Cluster::start() else { return };
    let store = cluster.store("race");
    let mut a = Authority::init(store.clone()).unwrap();
    let env = a.wrap("region: EU", b"secret").unwrap();
    let gate: Arc<dyn Store> = Arc::new(Gate { inner: cluster.store("race"), arrived: AtomicUsize::new(0), both: Barrier::new(2) });
    let mut a = Authority::open(gate.clone()).unwrap();
    let mut b = Authority::open(gate).unwrap();
    let before = store.list("sealed/").unwrap();
    let barrier = Barrier::new(2);
    let (ra, rb) = std::thread::scope(|t| {
        let ha = t.spawn(|| {
            barrier.wait();
            a.rotate_master()
        });
        let hb = t.spawn(|| {
            barrier.wait();
            b.rotate_master()
        });
        (ha.join().unwrap(), hb.join().unwrap())
    });
    let mut gens = vec![ra.unwrap().new_generation, rb.unwrap().new_generation];
    gens.sort();
    assert_eq!(gens, vec![2, 3]);
    let waited = [a.last_conflicts(), b.last_conflicts()];
    assert!(waited.iter().any(|c| !c.waited.is_zero()), "one waited for the other's fence: {waited:?}");
    // Generation 1 retired: one copy each for generations 2 and 3.
    let sealed = store.list("sealed/").unwrap();
    assert_eq!(sealed.len(), before.len() * 2, "{sealed:?}");
    assert_eq!(store.get("authority/fence").unwrap(), None);

    let m = Machine::new(a.issue(&"region=EU".parse::<Attributes>().unwrap()).unwrap(), store.clone(), CacheConfig::default());
    assert_eq!(&m.open(env.to_bytes()).unwrap()[..], b"secret");
}

/// Issue 44.2's scenario, five times: three loops wrap, each under a
/// policy no one used before (each commits a policy key to the state),
/// while two `rotate` run and the leader is SIGKILLed. Every run, a
/// rotation commits and the other commits too or ends with a clear
/// conflict; every envelope a loop was handed opens with a key issued
/// afterwards.
#[test]
fn rotations_under_wraps_of_new_policies_and_a_leader_kill_commit() {
    let Some(mut cluster) = Cluster::start() else { return };
    for run in 0..5 {
        let prefix = format!("starve{run}");
        let store = cluster.store(&prefix);
        let mut a = Authority::init(store.clone()).unwrap();
        // Over a chunk's worth of policies: a rotation commits in several.
        let first: Vec<_> = (0..66).map(|i| (a.wrap(&format!("region: EU or n: p{i}"), b"first").unwrap(), b"first".to_vec())).collect();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let handed = std::sync::Mutex::new(first);
        let failed_wraps = AtomicUsize::new(0);
        let (rotations, killed) = std::thread::scope(|t| {
            for l in 0..3 {
                let (store, stop, handed, failed_wraps) = (store.clone(), &stop, &handed, &failed_wraps);
                t.spawn(move || {
                    let mut a = Authority::open(store).unwrap();
                    let mut i = 0;
                    while !stop.load(Ordering::SeqCst) {
                        i += 1;
                        let secret = format!("loop {l} wrap {i}").into_bytes();
                        match a.wrap(&format!("region: EU or loop: l{l}w{i}"), &secret) {
                            Ok(env) => handed.lock().unwrap().push((env, secret)),
                            // A leader kill fails some: they printed nothing.
                            Err(_) => {
                                failed_wraps.fetch_add(1, Ordering::SeqCst);
                                std::thread::sleep(Duration::from_millis(50));
                            }
                        }
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(300));
            let rotators: Vec<_> = (0..2)
                .map(|_| {
                    let store = store.clone();
                    t.spawn(move || {
                        let mut a = Authority::open(store).unwrap();
                        let r = a.rotate_master();
                        (r, a.last_conflicts())
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(150));
            let leader = cluster.leader();
            cluster.kill(leader);
            let rotations: Vec<_> = rotators.into_iter().map(|h| h.join().unwrap()).collect();
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::SeqCst);
            (rotations, leader)
        });
        let committed = rotations.iter().filter(|(r, _)| r.is_ok()).count();
        eprintln!(
            "run {run}: {committed} of 2 rotations committed ({:?}); {} envelopes handed out, {} wraps failed",
            rotations.iter().map(|(r, c)| (r.as_ref().map(|r| r.new_generation).map_err(|e| e.to_string()), *c)).collect::<Vec<_>>(),
            handed.lock().unwrap().len(),
            failed_wraps.load(Ordering::SeqCst)
        );
        assert!(committed >= 1, "run {run}: no rotation committed: {rotations:?}");
        for (r, _) in &rotations {
            if let Err(e) = r {
                assert_eq!(e.code(), ErrorCode::StoreConflict, "run {run}: {e}");
            }
        }
        cluster.restart(killed);
        cluster.wait_ready(Duration::from_secs(60));
        let a = Authority::open(store.clone()).unwrap();
        let m = Machine::new(a.issue(&"region=EU".parse::<Attributes>().unwrap()).unwrap(), store.clone(), CacheConfig::default());
        for (env, secret) in handed.lock().unwrap().iter() {
            assert_eq!(&m.open(env.to_bytes()).unwrap_or_else(|e| panic!("run {run}: {e}"))[..], &secret[..]);
        }
    }
}

/// The leader is SIGKILLed in the middle of a loop of wraps and rotations:
/// every call either returns an envelope or fails, every envelope handed
/// out opens afterwards (also after the member is back), and the calls
/// that failed succeed when run again.
#[test]
fn killing_the_leader_during_wraps_loses_no_envelope_handed_out() {
    let Some(mut cluster) = Cluster::start() else { return };
    let store = cluster.store("kill");
    let mut a = Authority::init(store.clone()).unwrap();
    let mut handed = Vec::new();
    let mut failed = 0;
    let (ops, kill_at) = (60, 20);
    let mut killed = None;
    for i in 0..ops {
        if i == kill_at {
            let l = cluster.leader();
            cluster.kill(l);
            killed = Some(l);
        }
        let secret = format!("secret {i}").into_bytes();
        let policy = if i % 2 == 0 { "region: EU" } else { "region: NA" };
        let r = if i % 15 == 7 { a.rotate_master().map(|_| None) } else { a.wrap(policy, &secret).map(Some) };
        match r {
            Ok(Some(env)) => handed.push((env, secret, i % 2 == 0)),
            Ok(None) => {}
            Err(e) => {
                failed += 1;
                // Run again: it succeeds once a new leader is elected.
                let again = if i % 15 == 7 { a.rotate_master().map(|_| None) } else { a.wrap(policy, &secret).map(Some) };
                if let Some(env) = again.unwrap_or_else(|e2| panic!("op {i} failed ({e}) and again ({e2})\n{}", cluster.logs())) {
                    handed.push((env, secret, i % 2 == 0))
                }
            }
        }
    }
    let killed = killed.unwrap();
    eprintln!("{ops} operations, 1 leader kill, {failed} failed and re-ran, {} envelopes handed out", handed.len());
    let check = |what: &str| {
        let a = Authority::open(store.clone()).unwrap();
        let key = a.issue(&"region=EU,country=DE".parse::<Attributes>().unwrap()).unwrap();
        let eu = Machine::new(key, store.clone(), CacheConfig::default());
        let na = Machine::new(a.issue(&"region=NA".parse::<Attributes>().unwrap()).unwrap(), store.clone(), CacheConfig::default());
        for (env, secret, in_eu) in &handed {
            let m = if *in_eu { &eu } else { &na };
            assert_eq!(&m.open(env.to_bytes()).unwrap_or_else(|e| panic!("{what}: {e}"))[..], &secret[..], "{what}");
        }
    };
    check("with a member down");
    cluster.restart(killed);
    cluster.wait_ready(Duration::from_secs(60));
    check("after the member is back");
}

/// A cluster that requires TLS and client certificates: the store name's
/// `cacert`, `cert` and `key` options reach it; without the client
/// certificate, or without TLS, nothing is read or written.
#[test]
fn tls_with_a_client_certificate_is_spoken_and_required() {
    let Some(cluster) = Cluster::start_tls() else { return };
    let name = cluster.name("tls");
    let s = keyfence::wrap::create_store(&name).unwrap();
    let mut a = Authority::init(s.clone()).unwrap();
    let env = a.wrap("region: EU", b"over TLS").unwrap();
    let m = Machine::new(a.issue(&"region=EU".parse::<Attributes>().unwrap()).unwrap(), s.clone(), CacheConfig::default());
    assert_eq!(&m.open(env.to_bytes()).unwrap()[..], b"over TLS");

    let pki = cluster.pki().unwrap();
    let quick = |mut c: keyfence::wrap::EtcdConfig| {
        c.retry_for = Duration::ZERO;
        keyfence::wrap::EtcdStore::open(c).unwrap()
    };
    let no_client_cert = keyfence::wrap::EtcdConfig { client_pem: None, ..cluster.config("tls") };
    let plain = keyfence::wrap::EtcdConfig { ca_pem: None, client_pem: None, ..cluster.config("tls") };
    // Another CA: the members' certificate is not trusted.
    let mut other_ca = cluster.config("tls");
    other_ca.ca_pem = Some(std::fs::read(pki.join("client.pem")).unwrap());
    for (what, c) in [("no client certificate", no_client_cert), ("plain HTTP", plain), ("another CA", other_ca)] {
        let err = quick(c).get("public/generations").unwrap_err();
        assert_eq!(err.code(), ErrorCode::StoreIo, "{what}: {err}");
    }
}

/// A member stopped (SIGSTOP) for a while, then the whole cluster killed
/// and restarted: wraps and rotations go on through the stop, and every
/// envelope handed out opens after the restart.
#[test]
fn a_stopped_member_and_a_whole_cluster_restart_lose_nothing() {
    let Some(mut cluster) = Cluster::start() else { return };
    let store = cluster.store("restart");
    let mut a = Authority::init(store.clone()).unwrap();
    let mut handed = Vec::new();
    let stopped = cluster.leader();
    cluster.signal(stopped, "STOP");
    for i in 0..20 {
        if i == 10 {
            a.rotate_master().unwrap();
        }
        let secret = format!("secret {i}").into_bytes();
        handed.push((a.wrap("region: EU", &secret).unwrap(), secret));
    }
    cluster.signal(stopped, "CONT");
    for i in 0..3 {
        cluster.kill(i);
    }
    for i in 0..3 {
        cluster.restart(i);
    }
    cluster.wait_ready(Duration::from_secs(60));
    let a = Authority::open(store.clone()).unwrap();
    let m = Machine::new(a.issue(&"region=EU".parse::<Attributes>().unwrap()).unwrap(), store.clone(), CacheConfig::default());
    for (env, secret) in &handed {
        assert_eq!(&m.open(env.to_bytes()).unwrap()[..], &secret[..]);
    }
    assert_eq!(store.list("envelopes/").unwrap().len(), 20);
}

/// Every event of the watched prefix, until `n` puts have been seen (or
/// 60 s have passed).
fn collect(w: &keyfence::wrap::Watch, n: usize) -> Vec<WatchEvent> {
    let start = std::time::Instant::now();
    let mut seen = Vec::new();
    while seen.iter().filter(|e| matches!(e, WatchEvent::Put { .. })).count() < n && start.elapsed() < Duration::from_secs(60) {
        if let Some(e) = w.next_timeout(Duration::from_millis(200)) {
            seen.push(e);
        }
    }
    seen
}

/// A watch from a revision sees every change after it, once and in order:
/// the objects of one transaction, deletions, and, across the SIGKILL of
/// the member it is connected to, the changes made while it reconnects.
/// After a compaction it says so, and goes on.
#[test]
fn a_watcher_misses_no_event_across_a_member_kill() {
    let Some(mut cluster) = Cluster::start() else { return };
    let mut config = cluster.config("watched");
    config.watch_idle = Duration::from_secs(2);
    let s = keyfence::wrap::EtcdStore::open(config).unwrap();
    s.put("public/before", b"not seen").unwrap();
    let from = s.revision().unwrap();
    // The watch connects to the first endpoint, member 0.
    let w = s.watch("public/", from).unwrap();
    let mut b = Batch::default();
    b.push(Op::Put("public/t1".into(), b"1".to_vec()));
    b.push(Op::Put("public/t2".into(), b"2".to_vec()));
    s.commit(&b).unwrap();
    s.delete("public/t1").unwrap();
    s.put("sealed/elsewhere", b"outside the prefix").unwrap();
    for i in 0..20 {
        if i == 10 {
            cluster.kill(0);
        }
        s.put(&format!("public/k{i:02}"), b"x").unwrap();
    }
    let seen = collect(&w, 22);
    let keys: Vec<String> = seen
        .iter()
        .map(|e| match e {
            WatchEvent::Put { key, .. } => format!("put {key}"),
            WatchEvent::Delete { key, .. } => format!("delete {key}"),
            WatchEvent::Compacted { revision } => format!("compacted {revision}"),
        })
        .collect();
    let mut want = vec!["put public/t1".to_owned(), "put public/t2".into(), "delete public/t1".into()];
    want.extend((0..20).map(|i| format!("put public/k{i:02}")));
    assert_eq!(keys, want);
    let revs: Vec<i64> = seen.iter().map(WatchEvent::revision).collect();
    assert!(revs.windows(2).all(|p| p[0] <= p[1]) && revs[0] > from, "{revs:?}");
    assert!(w.next_timeout(Duration::from_millis(300)).is_none(), "nothing more");

    // A watch from a compacted revision is told so, then sees what follows.
    let now = s.revision().unwrap();
    compact(&cluster, now);
    let w = s.watch("public/", from).unwrap();
    match w.next_timeout(Duration::from_secs(30)) {
        Some(WatchEvent::Compacted { revision }) => assert_eq!(revision, now),
        other => panic!("expected the compaction, got {other:?}"),
    }
    s.put("public/after", b"y").unwrap();
    let rest = collect(&w, 1);
    assert!(
        matches!(&rest[..], [WatchEvent::Put { key, revision, value }] if key == "public/after" && *revision > now && value.as_deref() == Some(&b"y"[..])),
        "{rest:?}"
    );
}

/// A watch told of a compaction reads the cluster's revision to go on
/// from; when that read fails, it reads again (with a pause that grows)
/// and still tells the watcher, who then resyncs and sees what follows.
/// Before, a failed read dropped the compaction: the watcher was never
/// told, and missed what came before it.
#[test]
fn a_compaction_reaches_the_watcher_when_reading_the_revision_fails() {
    let Some(cluster) = Cluster::start() else { return };
    let mut config = cluster.config("compacted");
    config.watch_idle = Duration::from_secs(1);
    let s = keyfence::wrap::EtcdStore::open(config).unwrap();
    s.put("public/a", b"1").unwrap();
    let from = s.revision().unwrap();
    s.put("public/b", b"2").unwrap();
    s.put("public/c", b"3").unwrap();
    let now = s.revision().unwrap();
    compact(&cluster, now);
    // From a compacted revision (given, so `watch` reads none itself): the
    // stream's first message is the compaction, and the thread's read of
    // the revision after it fails.
    s.fail_revision_reads(1);
    let w = s.watch("public/", from).unwrap();
    match w.next_timeout(Duration::from_secs(10)) {
        Some(WatchEvent::Compacted { revision }) => assert_eq!(revision, now),
        other => panic!("expected the compaction, got {other:?}"),
    }
    s.put("public/after", b"y").unwrap();
    let rest = collect(&w, 1);
    assert!(matches!(&rest[..], [WatchEvent::Put { key, revision, .. }] if key == "public/after" && *revision > now), "{rest:?}");
}

/// Compacts the cluster's history up to `revision` (through a live member).
fn compact(cluster: &Cluster, revision: i64) {
    for e in cluster.endpoints() {
        let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(5))).build().new_agent();
        let body = format!("{{\"revision\":\"{revision}\",\"physical\":true}}");
        if agent.post(format!("http://{e}/v3/kv/compaction")).send(body.as_str()).is_ok() {
            return;
        }
    }
    panic!("no member compacted");
}

/// A machine following the store forgets a retired policy-key version as
/// soon as its sealed copies are deleted, while one that does not follow
/// keeps opening from its cache until the time to live ends.
#[test]
fn a_following_machine_learns_of_a_retirement_without_waiting_for_its_cache() {
    let Some(cluster) = Cluster::start() else { return };
    let etcd = keyfence::wrap::EtcdStore::open(cluster.config("follow")).unwrap();
    let store: Arc<dyn Store> = Arc::new(etcd.clone());
    let mut a = Authority::init(store.clone()).unwrap();
    let old = a.wrap("region: EU", b"v1").unwrap();
    let key = a.issue(&"region=EU".parse::<Attributes>().unwrap()).unwrap();
    let long = CacheConfig { ttl: Duration::from_secs(3600), ..CacheConfig::default() };
    let following = Arc::new(Machine::new(key.clone(), store.clone(), long));
    let stale = Machine::new(key, store.clone(), long);
    let _follower = following.follow().unwrap();
    for m in [&*following, &stale] {
        assert_eq!(&m.open(old.to_bytes()).unwrap()[..], b"v1");
    }
    a.rotate_policy_key("region: EU").unwrap();
    a.retire_policy_keys("region: EU").unwrap();
    let start = std::time::Instant::now();
    let err = loop {
        match following.open(old.to_bytes()) {
            Err(e) => break e,
            Ok(_) => assert!(start.elapsed() < Duration::from_secs(30), "the retirement never reached the cache"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(err.code(), ErrorCode::UnknownPolicyKey, "{err}");
    eprintln!("retirement reached the following cache in {:?}", start.elapsed());
    assert_eq!(&stale.open(old.to_bytes()).unwrap()[..], b"v1", "the cache alone keeps a retired key");
}

/// `get_many` reads many objects in few requests (one transaction per
/// 128 on etcd), in order, absent ones as `None`, the same on every store.
#[test]
fn get_many_reads_in_order_across_transactions() {
    let Some(cluster) = Cluster::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let stores: [Arc<dyn Store>; 3] = [
        cluster.store("many"),
        Arc::new(keyfence::wrap::FileStore::open(dir.path()).unwrap()),
        Arc::new(keyfence::wrap::MemoryStore::default()),
    ];
    for store in stores {
        let mut names = Vec::new();
        for chunk in 0..3 {
            let mut b = Batch::default();
            for i in 0..100 {
                let n = format!("envelopes/{:04}", chunk * 100 + i);
                b.push(Op::Put(n.clone(), n.as_bytes().to_vec()));
                names.push(n);
            }
            store.commit(&b).unwrap();
        }
        names.insert(150, "envelopes/absent".into());
        let got = store.get_many(&names).unwrap();
        assert_eq!(got.len(), 301);
        for (n, v) in names.iter().zip(&got) {
            let want = (n != "envelopes/absent").then(|| n.as_bytes().to_vec());
            assert_eq!(v, &want, "{n}");
        }
        assert_eq!(store.get_many(&["../bad".to_string()]).unwrap_err().code(), ErrorCode::InvalidStoreKey);
    }
}

/// The test cluster's ports are drawn free, but another program may take
/// one before etcd binds it: the member exits, and the cluster is started
/// again on other ports (here member 0's port is held on the first try).
#[test]
fn a_cluster_whose_port_is_taken_starts_again_on_other_ports() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let Some(cluster) = Cluster::start_on_taken_port(port) else { return };
    assert!(!cluster.endpoints().contains(&format!("127.0.0.1:{port}")), "{:?}", cluster.endpoints());
    cluster.store("taken").put("public/k", b"v").unwrap();
    drop(held);
}

/// 100,000 envelopes in one etcd store (ignored: minutes; run with
/// `cargo test -p keyfence --features etcd,testing --test store_etcd --
/// --ignored --nocapture`, figures in docs/benchmarks.md). The envelopes
/// are made by the authority on a memory store and copied to etcd in
/// commits of 100 (writing them one wrap at a time would take minutes);
/// then on etcd: the paged listing finds them all, `status` counts them,
/// a wrap, an open of any of them and a rotation reaching a following
/// machine work as on an empty store (no hot path reads the prefix), a
/// policy-key rotation re-wraps the 50,000 envelopes of its policy, and
/// the timings are printed.
#[test]
#[ignore]
fn a_hundred_thousand_envelopes_in_one_store() {
    use std::time::Instant;
    const N: usize = 100_000;
    let Some(cluster) = Cluster::start() else { return };
    let memory: Arc<dyn Store> = Arc::new(keyfence::wrap::MemoryStore::default());
    let mut a = Authority::init(memory.clone()).unwrap();
    let t = Instant::now();
    let envs: Vec<keyfence::wrap::Envelope> =
        (0..N).map(|i| a.wrap(if i % 2 == 0 { "region: EU" } else { "team: ops" }, format!("secret {i}").as_bytes()).unwrap()).collect();
    eprintln!("{N} wraps on the memory store: {:?}", t.elapsed());
    let etcd = keyfence::wrap::EtcdStore::open(cluster.config("scale")).unwrap();
    let store: Arc<dyn Store> = Arc::new(etcd.clone());
    let t = Instant::now();
    for prefix in ["authority/", "public/", "sealed/", "envelopes/"] {
        for names in memory.list(prefix).unwrap().chunks(100) {
            let mut b = Batch::default();
            for n in names {
                b.push(Op::Put(n.clone(), memory.get(n).unwrap().unwrap()));
            }
            store.commit(&b).unwrap();
        }
    }
    eprintln!("copied to etcd in commits of 100: {:?}", t.elapsed());

    let t = Instant::now();
    let listed = store.list("envelopes/").unwrap();
    eprintln!("paged listing of {} names: {:?}", listed.len(), t.elapsed());
    assert_eq!(listed.len(), N);
    let mut a = Authority::open(store.clone()).unwrap();
    let t = Instant::now();
    assert_eq!(a.status().unwrap().envelopes, N);
    eprintln!("status: {:?}", t.elapsed());

    let t = Instant::now();
    let new = a.wrap("region: EU", b"one more").unwrap();
    eprintln!("a wrap into the full store: {:?}", t.elapsed());
    let key = a.issue(&"region=EU,team=ops".parse::<Attributes>().unwrap()).unwrap();
    let m = Arc::new(Machine::new(key, store.clone(), CacheConfig::default()));
    assert_eq!(&m.open(new.to_bytes()).unwrap()[..], b"one more");
    let t = Instant::now();
    for i in (0..N).step_by(N / 100) {
        let name = &listed[i];
        let env = store.get(name).unwrap().unwrap();
        let secret = m.open(&env).unwrap();
        assert!(envs.iter().any(|e| e.to_bytes() == &env[..]) && secret.starts_with(b"secret "), "{name}");
    }
    eprintln!("100 fetches and cached opens spread over the store: {:?}", t.elapsed());

    let _follower = m.follow().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    a.rotate_master().unwrap();
    let t = Instant::now();
    while m.cache_stats().propagations == 0 {
        assert!(t.elapsed() < Duration::from_secs(60), "the rotation never reached the machine");
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("a rotation reached a following machine in {:?}", m.cache_stats().propagation_last);

    // The one operation that reads every envelope: a policy-key rotation
    // re-wraps the 50,000 under its policy, reading in batches of 128.
    let t = Instant::now();
    let r = a.rotate_policy_key("team: ops").unwrap();
    assert_eq!((r.rewrapped, r.skipped.len()), (N / 2, 0));
    eprintln!("a policy-key rotation re-wrapping {} of the {N} envelopes: {:?}", r.rewrapped, t.elapsed());
    let name = format!("envelopes/{}", envs[1].secret_id.iter().map(|b| format!("{b:02x}")).collect::<String>());
    assert_eq!(keyfence::wrap::Envelope::parse(&store.get(&name).unwrap().unwrap()).unwrap().key_version, 2);
}

/// Issue 44.1 on etcd: a store under another's prefix, in either order, is
/// refused at `init` with nothing written, and an authority whose sealed
/// copies came to hold a store does not open (so never cleans up there).
/// Before, the outer authority's rotation deleted every key of the inner
/// store, its master keys included.
#[test]
fn nested_etcd_stores_are_refused_and_nothing_is_deleted() {
    use keyfence::wrap::{create_store, open_store};
    let Some(cluster) = Cluster::start() else { return };
    // The inner store first, with an envelope; then an init around it.
    let mut inner = Authority::init(create_store(&cluster.name("acme/sealed/prod")).unwrap()).unwrap();
    let env = inner.wrap("region: EU", b"inner").unwrap();
    let every_key = |s: &Arc<dyn Store>| -> Vec<String> {
        ["authority/", "public/", "sealed/", "envelopes/"].iter().flat_map(|p| s.list(p).unwrap()).collect()
    };
    let inner_keys = every_key(&cluster.store("acme/sealed/prod"));
    assert!(inner_keys.len() >= 4 && inner_keys.contains(&"authority/state".to_string()), "{inner_keys:?}");
    let err = Authority::init(create_store(&cluster.name("acme")).unwrap()).expect_err("init around a store");
    assert!(err.to_string().contains("holds the keyfence store at acme/sealed/prod"), "{err}");
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let none = open_store(&cluster.name("acme")).err().expect("no store was made at acme");
    assert!(none.code() == ErrorCode::StoreIo && none.to_string().contains("is not a keyfence store"), "{none}");
    let inner_store = cluster.store("acme/sealed/prod");
    assert_eq!(every_key(&inner_store), inner_keys);
    let m = Machine::new(inner.issue(&"region=EU".parse::<Attributes>().unwrap()).unwrap(), inner_store.clone(), CacheConfig::default());
    assert_eq!(&m.open(env.to_bytes()).unwrap()[..], b"inner");

    // The outer store first; then an init inside it.
    let mut outer = Authority::init(create_store(&cluster.name("beta")).unwrap()).unwrap();
    outer.wrap("region: EU", b"outer").unwrap();
    let err = Authority::init(create_store(&cluster.name("beta/sealed/prod")).unwrap()).expect_err("init inside a store");
    assert!(err.to_string().contains("lies inside the keyfence store at beta"), "{err}");
    assert_eq!(cluster.store("beta/sealed/prod").list("public/").unwrap(), Vec::<String>::new(), "the refused init wrote");

    // A store planted inside the outer one's sealed copies by hand (an
    // older keyfence did not refuse it): the outer authority does not
    // open, and its keys stay.
    let planted = cluster.store("beta/sealed/prod");
    planted.put("public/generations", b"x").unwrap();
    planted.put("authority/state", b"master keys").unwrap();
    let err = Authority::open(open_store(&cluster.name("beta")).unwrap()).expect_err("open over a nested store");
    assert!(err.to_string().contains("holds the keyfence store at beta/sealed/prod"), "{err}");
    assert_eq!(planted.get("authority/state").unwrap().as_deref(), Some(&b"master keys"[..]));
}

/// `key` (the whole etcd key) as it was at `revision`, through a live
/// member: `Err` with etcd's message when that revision is compacted.
fn read_at(cluster: &Cluster, key: &str, revision: i64) -> Result<Option<Vec<u8>>, String> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = serde_json::json!({ "key": b64.encode(key), "revision": revision.to_string() }).to_string();
    for e in cluster.endpoints() {
        let agent: ureq::Agent =
            ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(5))).http_status_as_error(false).build().new_agent();
        let Ok(mut reply) = agent.post(format!("http://{e}/v3/kv/range")).send(body.as_str()) else { continue };
        let v: serde_json::Value = serde_json::from_str(&reply.body_mut().read_to_string().unwrap()).unwrap();
        if let Some(err) = v.get("error").or_else(|| v.get("message")) {
            return Err(err.to_string());
        }
        let value = v["kvs"].get(0).and_then(|kv| kv["value"].as_str()).map(|s| b64.decode(s).unwrap());
        return Ok(value);
    }
    panic!("no member answered");
}

/// Issue 44.3: after a revocation re-wraps the store, the cluster's old
/// revisions no longer hold the envelopes as they were (which the revoked
/// machine's key opens): `revoke` compacts, unless told to keep the
/// history of a cluster shared with others.
#[test]
fn a_revocation_compacts_the_history_that_still_held_the_old_envelopes() {
    let Some(cluster) = Cluster::start() else { return };
    for keep_history in [false, true] {
        let prefix = format!("compact{}", u8::from(keep_history));
        let etcd = keyfence::wrap::EtcdStore::open(cluster.config(&prefix)).unwrap();
        let store: Arc<dyn Store> = Arc::new(etcd.clone());
        let mut a = Authority::init(store.clone()).unwrap();
        let env = a.wrap("region: EU", b"before").unwrap();
        let doomed = a.issue(&"region=EU".parse::<Attributes>().unwrap()).unwrap();
        let name = format!("{prefix}/envelopes/{}", env.secret_id.iter().map(|b| format!("{b:02x}")).collect::<String>());
        let old = etcd.revision().unwrap();
        assert_eq!(read_at(&cluster, &name, old).unwrap().as_deref(), Some(env.to_bytes()));
        a.set_compact_after_revoke(!keep_history);
        let r = a.revoke(doomed.id().unwrap()).unwrap();
        assert_eq!((r.rewrapped, r.compacted), (1, !keep_history));
        match read_at(&cluster, &name, old) {
            Err(e) => assert!(!keep_history && e.contains("compacted"), "{e}"),
            Ok(v) => assert!(keep_history && v.as_deref() == Some(env.to_bytes()), "the old revision still holds the old envelope"),
        }
        // Whatever the history, the store serves only what the machine
        // cannot open.
        let m = Machine::new(doomed.clone(), store.clone(), CacheConfig::default());
        let now = store.get(&name[prefix.len() + 1..]).unwrap().unwrap();
        let refused = m.open(&now).unwrap_err();
        assert_eq!(refused.code(), ErrorCode::MachineRevoked, "{refused}");
    }
}

/// Issue 44.4: an envelope in an etcd store loads into a key process. Its
/// client reads the store and sends the objects opening reads; the key
/// process, under a sandbox that kills it at its first `socket`, opens
/// the envelope from them. Before, the store's name went to the key
/// process through `std::path::absolute` (`./etcd:/127.0.0.1:P/kp`, a
/// directory the key process opened as its store) or the key process
/// connected to etcd itself.
#[test]
fn an_envelope_on_etcd_loads_into_a_sandboxed_key_process() {
    use keyfence::sign::key_process::{protocol::flags, KeyProcess, KeyProcessConfig, KeySource};
    use keyfence::sign::Algorithm;
    let Some(cluster) = Cluster::start() else { return };
    let name = cluster.name("kp");
    let mut a = Authority::init(keyfence::wrap::create_store(&name).unwrap()).unwrap();
    let ec = openssl::ec::EcKey::generate(&openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap()).unwrap();
    let pem = openssl::pkey::PKey::from_ec_key(ec).unwrap().private_key_to_pem_pkcs8().unwrap();
    let env = a.wrap("region: EU", &pem).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mk = dir.path().join("machine.key");
    std::fs::write(&mk, a.issue(&"region=EU".parse::<Attributes>().unwrap()).unwrap().to_bytes()).unwrap();
    let kp = KeyProcess::start(KeyProcessConfig::with_command([env!("CARGO_BIN_EXE_keyfence-key-process")])).unwrap();
    let key = kp.load(KeySource::envelope(env.to_bytes().to_vec(), &name, &mk)).unwrap();
    assert!(key.sign(Algorithm::EcdsaP256Sha256, b"m").is_ok());
    let status = kp.status().unwrap();
    assert!(status.flags & flags::SANDBOXED != 0 && status.keys == 1, "{status:?}");
    assert_eq!(kp.restarts(), 0, "the key process died (a forbidden call?)");
    assert!(!std::path::Path::new("etcd:").exists(), "a directory named after the store was made");
    // A restart loads it again, from the store's objects of then.
    let pid = kp.pid().unwrap();
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    let t = std::time::Instant::now();
    while kp.restarts() == 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(kp.wait_running(Duration::from_secs(5)));
    assert!(key.sign(Algorithm::EcdsaP256Sha256, b"m").is_ok());
}
