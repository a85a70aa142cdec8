//! `keyfence authority` / `keyfence machine` end to end, and a crash test:
//! rotations killed at random moments lose nothing.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{keyfence as run, ok, Dir};
use keyfence::wrap::{Authority, CacheConfig, FileStore, GenerationState, Machine, Store};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_keyfence"))
}

#[test]
fn authority_and_machine_commands() {
    let d = Dir::new("cmds");
    let s = d.p("store");
    assert!(ok(&["authority", "init", "--store", &s]).contains("generation 1"));
    assert!(!run(&["authority", "init", "--store", &s]).status.success(), "init twice");
    std::fs::write(d.p("pem"), b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap();
    ok(&["authority", "issue", "--store", &s, "--attrs", "region=EU,country=DE", "--out", &d.p("fra.key")]);
    ok(&["authority", "issue", "--store", &s, "--attrs", "region=NA,country=US", "--out", &d.p("iad.key")]);
    ok(&["authority", "wrap", "--store", &s, "--policy", "region: EU", "--in", &d.p("pem"), "--out", &d.p("env")]);

    assert!(ok(&["machine", "could-open", "--store", &s, "--key", &d.p("fra.key"), "--in", &d.p("env")]).starts_with("yes"));
    let o = run(&["machine", "could-open", "--store", &s, "--key", &d.p("iad.key"), "--in", &d.p("env")]);
    assert_eq!(o.status.code(), Some(1));

    ok(&["machine", "open", "--store", &s, "--key", &d.p("fra.key"), "--in", &d.p("env"), "--out", &d.p("out")]);
    assert_eq!(std::fs::read(d.p("out")).unwrap(), std::fs::read(d.p("pem")).unwrap());
    let o = run(&["machine", "open", "--store", &s, "--key", &d.p("iad.key"), "--in", &d.p("env"), "--out", &d.p("out2")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("do not satisfy the policy `region: EU`"));

    let envelope_before = std::fs::read(d.p("env")).unwrap();
    assert!(ok(&["authority", "rotate", "--store", &s]).contains("re-sealed 1 policy key(s)"));
    assert_eq!(std::fs::read(d.p("env")).unwrap(), envelope_before);
    ok(&["machine", "open", "--store", &s, "--key", &d.p("fra.key"), "--in", &d.p("env"), "--out", &d.p("out3")]);
    let status = ok(&["authority", "status", "--store", &s]);
    assert!(status.contains("generation 1: decrypt-only") && status.contains("generation 2: active"), "{status}");
    assert!(status.contains("envelopes: 1"), "{status}");

    let o = run(&["authority", "wrap", "--store", &s, "--policy", "region: EU)", "--in", &d.p("pem"), "--out", &d.p("e2")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains('^'));
    let o = run(&["authority", "status", "--store", &d.p("nothing-here")]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no authority in this store"));
}

#[test]
fn rotations_killed_midway_lose_nothing() {
    let d = Dir::new("crash");
    let store: Arc<dyn Store> = Arc::new(FileStore::open(d.p("store")).unwrap());
    let mut a = Authority::init(store.clone()).unwrap();
    let secrets: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| {
            let policy = format!("region: r{} or tier: t{i}", i % 3);
            let env = a.wrap(&policy, format!("secret {i}").as_bytes()).unwrap();
            (format!("secret {i}"), env.to_bytes().to_vec())
        })
        .collect();
    drop(a);

    let mut killed = 0;
    for round in 0..5u64 {
        let started = Instant::now();
        let mut child = bin().args(["authority", "rotate", "--store", &d.p("store")]).spawn().unwrap();
        // Kill at a different moment each round, from almost at once to
        // well into the re-sealing.
        let nanos = u64::from(started.elapsed().subsec_nanos()) + round * 97;
        std::thread::sleep(Duration::from_millis(30 + nanos % 250 + round * 60));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            killed += 1;
        }
        let _ = child.wait();

        // Reopen: consistent state, and every secret still opens.
        let a = Authority::open(store.clone()).unwrap();
        let st = a.status().unwrap();
        assert_eq!(st.generations.iter().filter(|(_, s)| *s == GenerationState::Active).count(), 1);
        assert_eq!(st.envelopes, 40);
        // Exactly one sealed copy per policy key per live generation: the
        // copies of an interrupted rotation were cleaned up on open.
        let live = st.generations.iter().filter(|(_, s)| s.is_live()).count();
        assert_eq!(store.list("sealed/").unwrap().len(), 40 * live, "round {round}");
        let m = Machine::new(a.issue(&"region=r0,tier=t1".parse().unwrap()).unwrap(), store.clone(), CacheConfig::default());
        for (i, (want, env)) in secrets.iter().enumerate() {
            if i % 3 == 0 || i == 1 {
                assert_eq!(&m.open(env).unwrap()[..], want.as_bytes(), "round {round}, secret {i}");
            }
        }
    }
    assert!(killed >= 1, "no rotation was interrupted; the test proved nothing");
    let mut a = Authority::open(store.clone()).unwrap();
    assert_eq!(a.rotate_master().unwrap().resealed, 40);
}
