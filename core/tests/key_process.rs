//! The key process: keys held elsewhere, replies out of order,
//! deadlines, bounded in-flight requests, malformed frames, hardening, and
//! death under load followed by a restart that reloads the keys.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyfence::sign::key_process::protocol::{self as p, flags, kind, ErrorCode};
use keyfence::sign::key_process::{serve, KeyProcess, KeyProcessConfig, KeySource, ServeOptions};
use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyKind, Request, SignError};
use openssl::pkey::PKey;
use zeroize::Zeroizing;

mod common;
mod key_process_support;
use key_process_support::{config, key_file, verifies, Dir, KEY_PROCESS};

#[test]
fn keys_stay_in_the_key_process_and_sign_through_the_engine() {
    let dir = Dir::new("basic");
    let keys = KeyProcess::start(config()).unwrap();
    let hardening = keys.hardening_flags().unwrap();
    // Every layer on this kernel (Landlock included: ./x test runs on
    // kernels that have it, and a missing layer must show, not pass).
    assert_eq!(
        hardening,
        flags::NOT_DUMPABLE | flags::NO_CORE | flags::PEER_CHECKED | flags::SANDBOXED | flags::FILES_CONFINED | flags::INHERITED_CLOSED
    );
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let mut held = Vec::new();
    for (name, kind, alg) in [
        ("rsa.pem", KeyKind::Rsa { bits: 2048 }, Algorithm::RsaPkcs1Sha256),
        ("p256.pem", KeyKind::EcP256, Algorithm::EcdsaP256Sha256),
        ("ed.pem", KeyKind::Ed25519, Algorithm::Ed25519),
    ] {
        let key = keys.load(KeySource::File(key_file(&dir.0, name, kind))).unwrap();
        assert!(!key.is_local());
        assert_eq!(key.kind(), kind);
        assert!(format!("{key:?}").contains("held_by: \"key-process\""), "{key:?}");
        let sig = engine.sign(&key, alg, b"isolated").unwrap().wait().unwrap();
        assert!(verifies(&key, alg, b"isolated", &sig), "{alg}");
        // The synchronous path reaches the key process too.
        let sig = key.sign(alg, b"sync").unwrap();
        assert!(verifies(&key, alg, b"sync", &sig), "{alg} sync");
        // Requests are checked here before they travel.
        assert!(matches!(engine.sign(&key, Algorithm::EcdsaP384Sha384, b"x"), Err(SignError::KeyMismatch { .. })));
        held.push(key);
    }
    let status = keys.status().unwrap();
    assert_eq!(status.keys, 3);
    assert_eq!(Some(status.pid), keys.pid());
    assert_ne!(status.pid, std::process::id());
    assert!(status.flags & flags::NOT_DUMPABLE != 0);
}

#[test]
fn load_failures_name_the_source_not_the_secret() {
    let dir = Dir::new("loadfail");
    let keys = KeyProcess::start(config()).unwrap();
    let missing = dir.0.join("missing.pem");
    let err = keys.load(KeySource::File(missing.clone())).unwrap_err().to_string();
    assert!(err.contains("missing.pem"), "{err}");
    let garbage = dir.0.join("garbage.pem");
    std::fs::write(&garbage, b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n").unwrap();
    let err = keys.load(KeySource::File(garbage)).unwrap_err().to_string();
    assert!(err.contains("not a private key"), "{err}");
    assert!(!err.contains("c2VjcmV0"), "{err}");
    assert_eq!(keys.status().unwrap().keys, 0);
}

#[test]
fn a_slow_rsa_queue_does_not_delay_ecdsa_replies() {
    let dir = Dir::new("order");
    let keys = KeyProcess::start(config()).unwrap();
    let rsa = keys.load(KeySource::File(key_file(&dir.0, "rsa.pem", KeyKind::Rsa { bits: 4096 }))).unwrap();
    let ec = keys.load(KeySource::File(key_file(&dir.0, "ec.pem", KeyKind::EcP256))).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    // Decided on order, not on times: a loaded machine stretches both,
    // but only a queue that serves the ECDSA request after the RSA batch
    // makes it wait for (nearly) all of them.
    const BATCH: usize = 24;
    let rsa_done = Arc::new(AtomicU64::new(0));
    let rsa_futs: Vec<_> = (0..BATCH)
        .map(|_| {
            let done = rsa_done.clone();
            engine
                .submit_with_callback(Request::sign(rsa.clone(), Algorithm::RsaPkcs1Sha256, b"m".to_vec()), move |r| {
                    r.unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(2));
    engine.sign(&ec, Algorithm::EcdsaP256Sha256, b"m").unwrap().wait().unwrap();
    let before_ec = rsa_done.load(Ordering::SeqCst) as usize;
    // The operation is done before its callback has run: wait for the
    // callbacks themselves (their count), not for the handles.
    let until = std::time::Instant::now() + Duration::from_secs(120);
    while (rsa_done.load(Ordering::SeqCst) as usize) < BATCH && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(rsa_futs.iter().all(|f| f.is_done()));
    assert_eq!(rsa_done.load(Ordering::SeqCst) as usize, BATCH);
    assert!(before_ec * 4 < BATCH * 3, "the ECDSA reply waited for {before_ec} of {BATCH} RSA-4096 signatures");
}

/// The CPU time (user and system, in clock ticks) the process `pid` has
/// used, all its threads together: `utime` and `stime` of `/proc/PID/stat`,
/// counted after the command name, which may hold spaces.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // Fields 14 and 15 of proc(5); the state (field 3) is the first here.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn deadlines_reach_the_key_process() {
    let dir = Dir::new("deadline");
    let keys = KeyProcess::start(config()).unwrap();
    let pid = keys.pid().expect("a running key process");
    let rsa = keys.load(KeySource::File(key_file(&dir.0, "rsa.pem", KeyKind::Rsa { bits: 4096 }))).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    // What one signature costs the key process, in its own CPU time (which
    // other tests running beside this one cannot inflate, as they would a
    // wall-clock time): 20 in a row.
    const SAMPLE: u64 = 20;
    let before = cpu_ticks(pid);
    for _ in 0..SAMPLE {
        engine.sign(&rsa, Algorithm::RsaPkcs1Sha256, b"m").unwrap().wait().unwrap();
    }
    let sample_ticks = cpu_ticks(pid) - before;
    // 100 RSA-4096 signatures queue behind one key-process thread; the
    // later ones cannot start within 20 ms and must time out, not sign.
    const QUEUED: u64 = 100;
    let before = cpu_ticks(pid);
    let futs: Vec<_> = (0..QUEUED)
        .map(|_| {
            engine
                .submit(Request::sign(rsa.clone(), Algorithm::RsaPkcs1Sha256, b"m".to_vec()).with_timeout(Duration::from_millis(20)))
                .unwrap()
        })
        .collect();
    let results: Vec<_> = futs.into_iter().map(|f| f.wait()).collect();
    let timed_out = results.iter().filter(|r| matches!(r, Err(SignError::TimedOut { .. }))).count() as u64;
    assert!(timed_out >= QUEUED * 3 / 4, "{timed_out} of {QUEUED} timed out");
    let since = std::time::Instant::now();
    while keys.status().unwrap().in_flight != 0 {
        assert!(since.elapsed() < Duration::from_secs(30), "the key process never went idle");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The key process dropped the expired requests rather than signing
    // them: it spent on all 100 less than half of what signing them would
    // cost (signed, they would cost 5 times the 20-signature sample; the
    // few that started in time cost well under 1 time). Clock ticks are
    // coarse (10 ms; one RSA-4096 signature is a few ms), which these
    // margins absorb.
    let spent = cpu_ticks(pid) - before;
    assert!(
        spent * SAMPLE * 2 < sample_ticks * QUEUED,
        "the key process spent {spent} ticks on {QUEUED} requests of which {timed_out} expired, \
         and {sample_ticks} ticks on {SAMPLE} signatures: the expired requests were signed"
    );
}

#[test]
fn killing_the_key_process_under_load_fails_in_flight_work_then_restarts_with_the_keys() {
    let dir = Dir::new("kill");
    let keys = KeyProcess::start(config()).unwrap();
    let rsa = keys.load(KeySource::File(key_file(&dir.0, "rsa.pem", KeyKind::Rsa { bits: 2048 }))).unwrap();
    let ec = keys.load(KeySource::File(key_file(&dir.0, "ec.pem", KeyKind::EcP256))).unwrap();
    let from_bytes = {
        let pem = Zeroizing::new(std::fs::read(key_file(&dir.0, "b.pem", KeyKind::EcP256)).unwrap());
        keys.load(KeySource::Bytes(pem)).unwrap()
    };
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let first_pid = keys.pid().unwrap();

    // Load from two threads, each keeping up to 64 operations in flight.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let died_messages = Arc::new(std::sync::Mutex::new(Vec::new()));
    let workers: Vec<_> = [rsa.clone(), ec.clone()]
        .into_iter()
        .map(|key| {
            let (engine, stop, ok, failed, msgs) = (engine.clone(), stop.clone(), ok.clone(), failed.clone(), died_messages.clone());
            std::thread::spawn(move || {
                let alg = if key.kind().is_rsa() { Algorithm::RsaPkcs1Sha256 } else { Algorithm::EcdsaP256Sha256 };
                while !stop.load(Ordering::Relaxed) {
                    let futs: Vec<_> = (0..64).filter_map(|_| engine.sign(&key, alg, b"load").ok()).collect();
                    for f in futs {
                        let t = Instant::now();
                        match f.wait() {
                            Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                            Err(e) => {
                                // Failures are prompt, never a hang to the
                                // 2 s deadline.
                                assert!(t.elapsed() < Duration::from_secs(1), "{e} after {:?}", t.elapsed());
                                msgs.lock().unwrap().push(e.to_string());
                                failed.fetch_add(1, Ordering::Relaxed)
                            }
                        };
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let before = ok.load(Ordering::Relaxed);
    assert!(before > 0);
    let killed = Command::new("kill").args(["-9", &first_pid.to_string()]).status().unwrap();
    assert!(killed.success());
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }

    assert!(failed.load(Ordering::Relaxed) > 0, "in-flight operations must fail when the process dies");
    let msgs = died_messages.lock().unwrap();
    assert!(msgs.iter().any(|m| m.contains(&format!("key process (pid {first_pid}) died"))), "a clear error: {:?}", msgs.first());
    assert!(keys.wait_running(Duration::from_secs(5)));
    assert_eq!(keys.restarts(), 1);
    assert_ne!(keys.pid(), Some(first_pid));
    assert!(keys.last_exit().unwrap().contains("signal: 9"), "{:?}", keys.last_exit());
    // Later operations succeed with the reloaded keys...
    for (key, alg) in [(&rsa, Algorithm::RsaPkcs1Sha256), (&ec, Algorithm::EcdsaP256Sha256)] {
        let sig = engine.sign(key, alg, b"after").unwrap().wait().unwrap();
        assert!(verifies(key, alg, b"after", &sig), "the same key, reloaded");
    }
    // ...and so does the key handed over as bytes: a restart loses no key.
    let sig = engine.sign(&from_bytes, Algorithm::EcdsaP256Sha256, b"x").unwrap().wait().unwrap();
    assert!(verifies(&from_bytes, Algorithm::EcdsaP256Sha256, b"x", &sig), "the key from bytes, reloaded");
    assert_eq!(keys.status().unwrap().keys, 3);
}

#[test]
fn messages_over_the_frame_limit_are_hashed_here_or_refused_and_never_end_the_connection() {
    let dir = Dir::new("big");
    let keys = KeyProcess::start(config()).unwrap();
    let rsa = keys.load(KeySource::File(key_file(&dir.0, "rsa.pem", KeyKind::Rsa { bits: 2048 }))).unwrap();
    let ec = keys.load(KeySource::File(key_file(&dir.0, "ec.pem", KeyKind::EcP256))).unwrap();
    let ed = keys.load(KeySource::File(key_file(&dir.0, "ed.pem", KeyKind::Ed25519))).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let pid = keys.pid().unwrap();
    let big = vec![0x5a; p::MAX_FRAME + 1000];
    let at_limit = vec![0x5b; p::MAX_OP_DATA];

    // An operation in flight on the same connection while the big ones go.
    let slow = engine.sign(&rsa, Algorithm::RsaPssSha256, b"alongside").unwrap();
    for (key, alg) in [(&rsa, Algorithm::RsaPkcs1Sha256), (&rsa, Algorithm::RsaPssSha256), (&ec, Algorithm::EcdsaP256Sha256)] {
        for msg in [&big, &at_limit] {
            let sig = engine.sign(key, alg, msg).unwrap().wait().unwrap();
            assert!(verifies(key, alg, msg, &sig), "{alg}, {} bytes", msg.len());
            let sig = key.sign(alg, msg).unwrap();
            assert!(verifies(key, alg, msg, &sig), "{alg} synchronously, {} bytes", msg.len());
        }
    }
    // PKCS#1 v1.5 is deterministic: hashing here changes nothing.
    assert_eq!(
        engine.sign(&rsa, Algorithm::RsaPkcs1Sha256, &big).unwrap().wait().unwrap(),
        rsa.sign_digest(Algorithm::RsaPkcs1Sha256, &Algorithm::RsaPkcs1Sha256.hash().unwrap().digest(&big).unwrap()).unwrap()
    );
    // Ed25519 signs the whole message: refused at submission, typed.
    let err = engine.sign(&ed, Algorithm::Ed25519, &big).unwrap_err();
    assert!(matches!(err, SignError::InputTooLarge { len, max, .. } if len == big.len() && max == p::MAX_OP_DATA), "{err:?}");
    assert_eq!(err.code(), keyfence::ErrorCode::InvalidRequest);
    assert!(err.to_string().contains("Ed25519 signs whole messages"), "{err}");
    assert!(matches!(ed.sign(Algorithm::Ed25519, &big), Err(SignError::InputTooLarge { .. })));
    let sig = engine.sign(&ed, Algorithm::Ed25519, &at_limit).unwrap().wait().unwrap();
    assert!(verifies(&ed, Algorithm::Ed25519, &at_limit, &sig));
    // Key bytes no key file is that long: refused before they are sent.
    let err = keys.load(KeySource::Bytes(Zeroizing::new(vec![b'-'; p::MAX_FRAME]))).unwrap_err();
    assert!(matches!(err, SignError::InputTooLarge { .. }), "{err:?}");

    slow.wait().unwrap();
    assert_eq!((keys.pid(), keys.restarts()), (Some(pid), 0), "the connection never ended");
    assert_eq!(keys.status().unwrap().keys, 3);
}

#[test]
fn envelopes_are_opened_inside_the_key_process() {
    use keyfence::wrap::{Authority, FileStore, Store};
    let dir = Dir::new("envelope");
    let store_dir = dir.0.join("store");
    let store: Arc<dyn Store> = Arc::new(FileStore::open(&store_dir).unwrap());
    let mut authority = Authority::init(store).unwrap();
    let pem = std::fs::read(key_file(&dir.0, "customer.pem", KeyKind::EcP256)).unwrap();
    let env = authority.wrap("region: EU", &pem).unwrap();
    std::fs::write(dir.0.join("customer.kfe"), env.to_bytes()).unwrap();
    for (name, attrs) in [("eu.key", "region=EU"), ("us.key", "region=US")] {
        let mk = authority.issue(&attrs.parse().unwrap()).unwrap();
        std::fs::write(dir.0.join(name), &mk.to_bytes()[..]).unwrap();
    }
    std::fs::remove_file(dir.0.join("customer.pem")).unwrap();

    let keys = KeyProcess::start(config()).unwrap();
    let source = |mk: &str| KeySource::envelope(std::fs::read(dir.0.join("customer.kfe")).unwrap(), store_dir.clone(), dir.0.join(mk));
    let key = keys.load(source("eu.key")).unwrap();
    let sig = key.sign(Algorithm::EcdsaP256Sha256, b"edge").unwrap();
    assert!(verifies(&key, Algorithm::EcdsaP256Sha256, b"edge", &sig));
    // The key process's refusal keeps the code the load has in process.
    let err = keys.load(source("us.key")).unwrap_err();
    assert_eq!(err.code(), keyfence::ErrorCode::PolicyNotSatisfied, "{err}");
    assert!(err.to_string().contains("opening the envelope"), "{err}");

    // Issue 44.6: whoever writes the store puts back the generation list
    // from before a rotation (generation 1 active again). The client reads
    // it and sends it; the key process starts each load from the lists
    // kept beside the machine key and refuses it. A copy of the key with
    // no floor beside it takes the old list: the attack is real.
    let store: Arc<dyn Store> = Arc::new(FileStore::open(&store_dir).unwrap());
    let old = store.get("public/generations").unwrap().unwrap();
    authority.rotate_master().unwrap();
    let mk = authority.issue(&"region=EU".parse().unwrap()).unwrap();
    std::fs::write(dir.0.join("eu2.key"), &mk.to_bytes()[..]).unwrap();
    std::fs::write(dir.0.join("copy.key"), &mk.to_bytes()[..]).unwrap();
    keys.load(source("eu2.key")).unwrap();
    assert!(dir.0.join("eu2.key.newest").is_file());
    store.put("public/generations", &old).unwrap();
    let err = keys.load(source("eu2.key")).unwrap_err();
    assert_eq!(err.code(), keyfence::ErrorCode::ReplayedObject, "{err}");
    assert!(err.to_string().contains("rolled back or replayed"), "{err}");
    keys.load(source("copy.key")).unwrap();
}

#[test]
fn dropping_the_last_handle_unloads_the_key() {
    let dir = Dir::new("unload");
    let keys = KeyProcess::start(config()).unwrap();
    let key = keys.load(KeySource::File(key_file(&dir.0, "k.pem", KeyKind::Ed25519))).unwrap();
    assert_eq!(keys.status().unwrap().keys, 1);
    drop(key);
    // The unload travels before the status request on the same stream.
    assert_eq!(keys.status().unwrap().keys, 0);
}

#[test]
fn a_key_lost_in_a_restart_is_refused_with_the_reason_its_load_gave() {
    // The operator reads why the key is gone (its file was deleted), not
    // only that it is: the reason the restart's load gave stays with it.
    let dir = Dir::new("lostkey");
    let keys = KeyProcess::start(config()).unwrap();
    let path = key_file(&dir.0, "gone.pem", KeyKind::EcP256);
    let kept = keys.load(KeySource::File(key_file(&dir.0, "kept.pem", KeyKind::Ed25519))).unwrap();
    let key = keys.load(KeySource::File(path.clone())).unwrap();
    key.sign(Algorithm::EcdsaP256Sha256, b"m").unwrap();
    std::fs::remove_file(&path).unwrap();
    let pid = keys.pid().unwrap();
    assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    let t = Instant::now();
    while keys.restarts() == 0 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(keys.restarts(), 1, "the key process did not come back");
    let err = key.sign(Algorithm::EcdsaP256Sha256, b"m").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("loaded again when the key process restarted") && text.contains("gone.pem"), "{text}");
    assert!(matches!(err, SignError::Backend { .. }), "{err:?}");
    // The other key came back.
    kept.sign(Algorithm::Ed25519, b"m").unwrap();
}

#[test]
fn the_key_process_exits_when_its_owner_goes() {
    let keys = KeyProcess::start(config()).unwrap();
    let pid = keys.pid().unwrap();
    drop(keys);
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let t = Instant::now();
    while proc_dir.exists() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!proc_dir.exists(), "key process {pid} still running");
}

#[test]
fn privileges_drop_and_the_drop_survives_a_restart() {
    if common::skip_unless(common::is_root(), "dropping privileges needs root", common::REQUIRE_ROOT) {
        return;
    }
    let dir = Dir::new("privs");
    let path = key_file(&dir.0, "k.pem", KeyKind::EcP256);
    let keys = KeyProcess::start(config()).unwrap();
    let key = keys.load(KeySource::File(path)).unwrap();
    keys.drop_privileges(65534, 65534).unwrap();
    let s = keys.status().unwrap();
    assert_eq!((s.uid, s.gid), (65534, 65534));
    assert!(s.flags & flags::NOT_DUMPABLE != 0, "still not dumpable after the drop");
    assert!(key.sign(Algorithm::EcdsaP256Sha256, b"m").is_ok());
    // A dropped process cannot take root back: a second drop to 0 fails,
    // refused by the kernel (EPERM), not by a bad request.
    let err = keys.drop_privileges(0, 0).unwrap_err();
    assert!(err.to_string().contains("not permitted") || err.to_string().contains("EPERM"), "{err}");

    let pid = keys.pid().unwrap();
    Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    let t = Instant::now();
    while keys.restarts() == 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(keys.wait_running(Duration::from_secs(5)));
    let s = keys.status().unwrap();
    assert_eq!((s.uid, s.gid, s.keys), (65534, 65534, 1), "the key reloaded as root, then the drop replayed");
    assert!(key.sign(Algorithm::EcdsaP256Sha256, b"m").is_ok());
}

/// A raw connection to a fresh `keyfence-key-process`, for protocol abuse.
struct Raw {
    stream: UnixStream,
    child: std::process::Child,
    decoder: p::Decoder,
}

impl Raw {
    fn start() -> Self {
        let (ours, theirs) = key_process_support::key_process_pair();
        let child = Command::new(KEY_PROCESS)
            .args(["--rsa-threads", "1", "--ec-threads", "1"])
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .spawn()
            .unwrap();
        ours.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw { stream: ours, child, decoder: p::Decoder::new() }
    }

    fn hello(&mut self, max: u32) {
        let mut f = Vec::new();
        p::encode(&mut f, kind::HELLO, 0, &[&p::hello_request(max)]);
        self.stream.write_all(&f).unwrap();
        let reply = self.read().unwrap();
        assert_eq!(reply.kind, kind::HELLO);
        assert_eq!(p::parse_hello_reply(&reply.body).unwrap().0, self.child.id());
    }

    fn send(&mut self, kind: u8, id: u64, body: &[u8]) {
        let mut f = Vec::new();
        p::encode(&mut f, kind, id, &[body]);
        self.stream.write_all(&f).unwrap();
    }

    /// The next frame, or `None` at end of stream.
    fn read(&mut self) -> Option<p::Frame> {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(f) = self.decoder.next_frame().unwrap() {
                return Some(f);
            }
            match self.stream.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.decoder.push(&buf[..n]),
            }
        }
    }

    fn status_ok(&mut self) -> bool {
        self.send(kind::STATUS, 999, &[]);
        matches!(self.read(), Some(f) if f.kind == kind::OK && f.id == 999)
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn malformed_requests_get_error_replies_and_the_process_lives_on() {
    let mut raw = Raw::start();
    raw.hello(8);
    let cases: Vec<(u8, Vec<u8>)> = vec![
        (0x42, vec![]),                                                           // unknown kind
        (kind::OP, vec![1, 2, 3]),                                                // short op
        (kind::OP, [vec![0; 8], vec![0, 0, 0, 9], vec![1, 0x12, 0x34]].concat()), // unknown algorithm
        (kind::LOAD, vec![0, 0, 0, 0, 0, 0, 0, 1, 7]),                            // unknown source
        (kind::LOAD, [vec![0; 8], vec![1, 0xff, 0xff, 0xff, 0xff]].concat()),     // path longer than the frame
        (kind::UNLOAD, vec![1]),                                                  // short id
        (kind::HELLO, p::hello_request(8)),                                       // a second hello
    ];
    for (i, (k, body)) in cases.iter().enumerate() {
        raw.send(*k, i as u64 + 1, body);
        let reply = raw.read().expect("an error reply, not a closed connection");
        assert_eq!((reply.kind, reply.id), (kind::ERR, i as u64 + 1), "case {i}");
        assert_eq!(p::parse_error(&reply.body).0, ErrorCode::Malformed, "case {i}");
    }
    // The agent's own request, which the key process's table leaves out:
    // not allowed, saying what it takes (not "malformed": it is a request
    // the protocol defines).
    raw.send(kind::AGENT_STATUS, 40, &[]);
    let reply = raw.read().expect("an error reply, not a closed connection");
    let (code, msg) = p::parse_error(&reply.body);
    assert_eq!((reply.kind, reply.id, code), (kind::ERR, 40, ErrorCode::NotAllowed), "{msg}");
    // An operation on a key that does not exist.
    let mut op = Vec::new();
    p::encode_op(&mut op, 50, 77, Duration::from_secs(1), &keyfence::sign::Operation::DecryptRaw { ciphertext: vec![0; 256] });
    raw.stream.write_all(&op).unwrap();
    let reply = raw.read().unwrap();
    assert_eq!(p::parse_error(&reply.body).0, ErrorCode::UnknownKey);
    assert!(raw.status_ok(), "still serving");
    assert!(raw.child.try_wait().unwrap().is_none());
}

#[test]
fn an_impossible_frame_length_closes_the_connection() {
    for len in [0u32, 3, (p::MAX_FRAME as u32) + 1, u32::MAX] {
        let mut raw = Raw::start();
        raw.hello(8);
        raw.stream.write_all(&len.to_be_bytes()).unwrap();
        raw.stream.write_all(&[0; 16]).unwrap();
        // A last ERR if it reaches us before the close (see the hello
        // test), then the end of the stream and a failure exit, never a
        // crash.
        if let Some(reply) = raw.read() {
            assert_eq!(p::parse_error(&reply.body).0, ErrorCode::Malformed);
            assert!(raw.read().is_none(), "then the connection closes");
        }
        let status = raw.child.wait().unwrap();
        assert_eq!(status.code(), Some(1), "exited by itself, not by a signal: {status}");
    }
}

#[test]
fn a_peer_without_a_hello_or_with_another_version_is_refused() {
    // Either way the key process refuses: an ERR saying why (when the reply
    // reaches us before the close; under heavy load the close can win and
    // the read sees only the end), then the connection closes and the
    // process exits by itself with a failure status.
    let refused = |raw: &mut Raw, why: &str| {
        if let Some(reply) = raw.read() {
            assert_eq!(reply.kind, kind::ERR);
            let (code, msg) = p::parse_error(&reply.body);
            assert_eq!(code, ErrorCode::Malformed);
            assert!(msg.contains(why), "{msg}");
            assert!(raw.read().is_none(), "then the connection closes");
        }
        let status = raw.child.wait().unwrap();
        assert_eq!(status.code(), Some(1), "{status}");
    };
    let mut raw = Raw::start();
    raw.send(kind::STATUS, 1, &[]);
    refused(&mut raw, "hello first");

    let mut raw = Raw::start();
    let mut body = p::hello_request(8);
    body[5] = 2; // version 2
    raw.send(kind::HELLO, 0, &body);
    refused(&mut raw, "version");
}

#[test]
fn more_requests_than_agreed_are_refused_as_busy() {
    let dir = Dir::new("busy");
    let path = key_file(&dir.0, "rsa.pem", KeyKind::Rsa { bits: 4096 });
    let mut raw = Raw::start();
    raw.hello(2);
    raw.send(kind::LOAD, 1, &p::load_request(5, &p::LoadBody::File(path)));
    assert_eq!(raw.read().unwrap().kind, kind::OK);
    let mut burst = Vec::new();
    for id in 10..20 {
        let op = keyfence::sign::Operation::Sign { alg: Algorithm::RsaPkcs1Sha256, input: keyfence::sign::Input::Message(b"m".to_vec()) };
        p::encode_op(&mut burst, id, 5, Duration::from_secs(5), &op);
    }
    raw.stream.write_all(&burst).unwrap();
    let replies: Vec<_> = (0..10).map(|_| raw.read().unwrap()).collect();
    let busy = replies.iter().filter(|f| f.kind == kind::ERR && p::parse_error(&f.body).0 == ErrorCode::Busy).count();
    let ok = replies.iter().filter(|f| f.kind == kind::OK).count();
    assert!(busy >= 7 && ok >= 2 && busy + ok == 10, "busy {busy}, ok {ok}");
}

/// Threads of a process, from /proc.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

fn busy_count(replies: &[p::Frame]) -> usize {
    replies.iter().filter(|f| f.kind == kind::ERR && p::parse_error(&f.body).0 == ErrorCode::Busy).count()
}

#[test]
fn a_peer_cannot_ask_for_an_unbounded_number_of_requests_in_flight() {
    for max in [u32::MAX, p::MAX_IN_FLIGHT + 1] {
        let mut raw = Raw::start();
        raw.send(kind::HELLO, 0, &p::hello_request(max));
        if let Some(reply) = raw.read() {
            assert_eq!(reply.kind, kind::ERR);
            assert!(p::parse_error(&reply.body).1.contains("max_in_flight"));
        }
        assert_eq!(raw.child.wait().unwrap().code(), Some(1), "refused, max_in_flight {max}");
    }
    let mut c = config();
    c.max_in_flight = p::MAX_IN_FLIGHT + 1;
    assert!(matches!(KeyProcess::start(c), Err(SignError::Config(_))));
}

#[test]
fn a_flood_of_loads_is_refused_as_busy_on_a_fixed_pool_of_threads() {
    let dir = Dir::new("load-flood");
    let path = key_file(&dir.0, "rsa.pem", KeyKind::Rsa { bits: 4096 });
    let mut raw = Raw::start();
    raw.hello(8);
    // Its pools start after the hello; a status reply means they have.
    assert!(raw.status_ok());
    let before = threads(raw.child.id());
    let mut burst = Vec::new();
    const LOADS: u64 = 500;
    for id in 1..=LOADS {
        p::encode(&mut burst, kind::LOAD, id, &[&p::load_request(id, &p::LoadBody::File(path.clone()))]);
    }
    raw.stream.write_all(&burst).unwrap();
    let mut replies = Vec::new();
    let mut most = before;
    for _ in 0..LOADS {
        replies.push(raw.read().unwrap());
        most = most.max(threads(raw.child.id()));
    }
    let busy = busy_count(&replies);
    let ok = replies.iter().filter(|f| f.kind == kind::OK).count();
    assert!(busy > 0 && ok > 0 && busy + ok == LOADS as usize, "busy {busy}, ok {ok}");
    assert!(most <= before, "a thread per load: {before} threads before, {most} during the flood");
    assert!(raw.status_ok(), "still serving");
}

#[test]
fn request_bytes_held_by_the_key_process_are_bounded() {
    let dir = Dir::new("bytes-flood");
    let path = key_file(&dir.0, "rsa.pem", KeyKind::Rsa { bits: 4096 });
    let mut raw = Raw::start();
    raw.hello(p::MAX_IN_FLIGHT);
    raw.send(kind::LOAD, 1, &p::load_request(5, &p::LoadBody::File(path)));
    assert_eq!(raw.read().unwrap().kind, kind::OK);
    // Small RSA-4096 signatures first, so that the one worker is busy
    // while 100 MiB of messages arrive behind them: the key process must
    // refuse some rather than hold them all. How long the worker stays
    // busy depends on the CPU (AVX-512 IFMA signs RSA-4096 twice as fast)
    // and on what else runs: a flood the worker kept up with proves
    // nothing either way, so it is sent again, up to three times; a key
    // process without the bound holds every one of them each time.
    const SMALL: u64 = 2_000;
    const OPS: u64 = SMALL + 100;
    let mut busy = Vec::new();
    for attempt in 0..3u64 {
        let base = 100 + attempt * 10_000;
        let mut small = Vec::new();
        for id in 0..SMALL {
            let op =
                keyfence::sign::Operation::Sign { alg: Algorithm::RsaPkcs1Sha256, input: keyfence::sign::Input::Message(b"m".to_vec()) };
            p::encode_op(&mut small, base + id, 5, Duration::from_secs(60), &op);
        }
        raw.stream.write_all(&small).unwrap();
        let mut writer = raw.stream.try_clone().unwrap();
        let op = keyfence::sign::Operation::Sign {
            alg: Algorithm::RsaPkcs1Sha256,
            input: keyfence::sign::Input::Message(vec![1; p::MAX_OP_DATA]),
        };
        let mut frame = Vec::new();
        p::encode_op(&mut frame, 0, 5, Duration::from_secs(60), &op);
        let sender = std::thread::spawn(move || {
            for id in SMALL..OPS {
                // The request id sits after the length and the kind.
                frame[5..13].copy_from_slice(&(base + id).to_be_bytes());
                writer.write_all(&frame).unwrap();
            }
        });
        raw.stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let replies: Vec<_> = (0..OPS).map(|_| raw.read().unwrap()).collect();
        sender.join().unwrap();
        busy = replies.iter().filter(|f| f.kind == kind::ERR).map(|f| p::parse_error(&f.body)).collect();
        if !busy.is_empty() {
            break;
        }
        eprintln!("attempt {attempt}: the worker kept up with the flood; sending it again");
    }
    assert!(!busy.is_empty(), "100 MiB held at once, three times");
    assert!(busy.iter().all(|(code, msg)| *code == ErrorCode::Busy && msg.contains("64 MiB")), "{busy:?}");
    assert!(raw.status_ok(), "still serving");
}

#[test]
fn serve_refuses_a_peer_that_is_not_its_parent() {
    // Both ends belong to this process, whose parent is not this process.
    let (a, _b) = UnixStream::pair().unwrap();
    let err = serve(a, &ServeOptions::default()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
}

#[test]
fn a_missing_key_process_program_is_a_clear_start_error() {
    let err = KeyProcess::start(KeyProcessConfig::with_command(["/nonexistent/keyfence-key-process"])).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/keyfence-key-process"), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert!(matches!(err, SignError::Config(_)), "{err:?}");
    // A program that is not a key process: exits without a hello.
    let err = KeyProcess::start(KeyProcessConfig::with_command(["/bin/true"])).unwrap_err();
    assert!(err.to_string().contains("did not start"), "{err}");
    // A bare name would be looked up on PATH, which a host process controls.
    let err = KeyProcess::start(KeyProcessConfig::with_command(["keyfence-key-process"])).unwrap_err();
    assert!(err.to_string().contains("never looked up on PATH"), "{err}");
}

#[test]
fn the_default_finds_the_key_process_beside_the_executable() {
    // This test runs from target/*/deps; keyfence-key-process is one directory up.
    let mut c = KeyProcessConfig::default();
    assert!(c.command.is_empty());
    c.rsa_threads = 1;
    c.ec_threads = 1;
    let keys = KeyProcess::start(c).unwrap();
    assert!(keys.pid().is_some());
}

#[test]
fn a_held_key_runs_only_on_its_holder() {
    let keys = KeyProcess::start(config()).unwrap();
    let key = keys.load(KeySource::Bytes(Zeroizing::new(PKey::generate_ed25519().unwrap().private_key_to_pem_pkcs8().unwrap()))).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    // Naming another backend for it is refused at once, not silently
    // overridden.
    let req = Request::sign(key.clone(), Algorithm::Ed25519, b"x".to_vec()).with_backend(Arc::new(keyfence::sign::SoftwareBackend));
    let err = engine.submit(req).unwrap_err();
    assert!(
        matches!(&err, SignError::HeldElsewhere { holder, requested } if holder == "key-process" && requested == "software"),
        "{err:?}"
    );
    assert_eq!(err.code(), keyfence::ErrorCode::InvalidRequest);
    // Without one, it goes to its holder whatever the engine's default.
    let sig = engine.submit(Request::sign(key.clone(), Algorithm::Ed25519, b"x".to_vec())).unwrap().wait().unwrap();
    assert!(verifies(&key, Algorithm::Ed25519, b"x", &sig));
}

/// An owner that exits without dropping its engine (a C program returning
/// from `main`) closes the socket with replies unread, which the key
/// process reads as a reset. It must end quietly: a message on the
/// terminal after its owner has exited looked like a fault ("Connection
/// reset by peer", issue 34).
#[test]
fn an_owner_gone_with_replies_unread_ends_the_key_process_quietly() {
    let (mut ours, theirs) = key_process_support::key_process_pair();
    let child = Command::new(KEY_PROCESS)
        .args(["--rsa-threads", "1", "--ec-threads", "1"])
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut f = Vec::new();
    p::encode(&mut f, kind::HELLO, 0, &[&p::hello_request(8)]);
    p::encode(&mut f, kind::STATUS, 1, &[]);
    ours.write_all(&f).unwrap();
    // Wait until both replies sit unread in our receive queue, then close.
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: a valid socket and a buffer of the length given; MSG_PEEK
        // leaves the bytes queued, which is the point.
        let n = unsafe {
            libc::recv(std::os::fd::AsRawFd::as_raw_fd(&ours), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT)
        };
        let n = usize::try_from(n).unwrap_or(0);
        let mut decoder = p::Decoder::new();
        decoder.push(&buf[..n]);
        let mut frames = 0;
        while decoder.next_frame().unwrap().is_some() {
            frames += 1;
        }
        if frames == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "no replies");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(ours);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.is_empty(), "the key process printed after its owner left: {stderr}");
}

/// A batch holds its requests until it ends, then they all complete: none
/// can be answered while the batch is open, since none has been written.
#[test]
fn a_batch_writes_its_requests_when_it_ends() {
    let dir = Dir::new("batch");
    let keys = KeyProcess::start(config()).unwrap();
    let key = keys.load(KeySource::File(key_file(&dir.0, "ec.pem", KeyKind::EcP256))).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let alg = Algorithm::EcdsaP256Sha256;
    let pending = engine.batch(|| {
        let pending: Vec<_> = (0..32u8).map(|i| engine.sign(&key, alg, &[i]).unwrap()).collect();
        // Unbatched, one ECDSA signature in the key process takes well
        // under a millisecond; held, none can come back however long this is.
        std::thread::sleep(Duration::from_millis(100));
        assert!(pending.iter().all(|f| !f.handle().is_done()), "a reply came back before the batch was written");
        pending
    });
    for (i, f) in pending.into_iter().enumerate() {
        let sig = f.wait().unwrap();
        assert!(verifies(&key, alg, &[i as u8], &sig));
    }
}

/// Waiting inside a batch sends the batch first (it would otherwise wait
/// for its own unsent request), and a batch that unwinds still sends
/// what it holds.
#[test]
fn waiting_in_a_batch_or_leaving_it_by_a_panic_loses_nothing() {
    let dir = Dir::new("batch-wait");
    let keys = KeyProcess::start(config()).unwrap();
    let key = keys.load(KeySource::File(key_file(&dir.0, "ed.pem", KeyKind::Ed25519))).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let alg = Algorithm::Ed25519;
    let t = Instant::now();
    let sig = engine.batch(|| engine.sign(&key, alg, b"inside").unwrap().wait().unwrap());
    assert!(verifies(&key, alg, b"inside", &sig));
    // The default timeout is 2 s: a wait stuck on its own batch would end there.
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());

    let (done, saw) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (d, s) = (done.clone(), saw.clone());
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        engine.batch(|| {
            engine
                .submit_with_callback(Request::sign(key.clone(), alg, b"unwound".to_vec()), move |r| {
                    s.store(r.is_ok(), Ordering::Release);
                    d.store(true, Ordering::Release);
                })
                .unwrap();
            panic!("the caller fails mid-batch");
        })
    }));
    assert!(caught.is_err());
    let until = Instant::now() + Duration::from_secs(5);
    while !done.load(Ordering::Acquire) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(saw.load(Ordering::Acquire), "the request submitted before the panic was not answered");
}

/// Issue 55.1: the key process creates files only in a token module's
/// folder (`KEYFENCE_PKCS11_TOKEN_DIRS`, SoftHSM2's `tokendir`): Landlock
/// refuses the rest. On a kernel without Landlock (played by a test
/// switch) the key process is refused, saying why and how to accept it
/// (issue 59.4); accepted, the system call filter refuses every opening
/// for writing, the token folder's too, and keys still load and sign. A
/// server in this process, unsandboxed, creates the file: the control.
#[test]
fn the_key_process_creates_files_only_in_a_token_folder_with_or_without_landlock() {
    let dir = Dir::new("files");
    let tokens = dir.0.join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    let start = |vars: &[String], partial: bool| {
        let mut c = config();
        c.command =
            ["/usr/bin/env".to_string()].into_iter().chain(vars.iter().cloned()).chain([KEY_PROCESS.to_string()]).map(Into::into).collect();
        c.unsafe_partial_sandbox = partial;
        KeyProcess::start(c)
    };
    let with_env = |vars: &[String]| start(vars, false).unwrap();
    let token_dirs = format!("KEYFENCE_PKCS11_TOKEN_DIRS={}", tokens.display());
    let ec = key_file(&dir.0, "ec.pem", KeyKind::EcP256);

    let keys = with_env(std::slice::from_ref(&token_dirs));
    let status = keys.status().unwrap();
    assert!(status.flags & flags::FILES_CONFINED != 0 && status.flags & flags::SANDBOXED != 0, "flags {:#x}", status.flags);
    assert!(!keys.test_create_file(&dir.0.join("outside")).unwrap());
    assert!(!dir.0.join("outside").exists());
    assert!(!keys.test_create_file(Path::new("/tmp/keyfence-sandbox-probe-never")).unwrap());
    assert!(keys.test_create_file(&tokens.join("object")).unwrap(), "a token module's folder is writable");
    assert!(tokens.join("object").exists());
    let key = keys.load(KeySource::File(ec.clone())).unwrap();
    assert!(key.sign(Algorithm::EcdsaP256Sha256, b"m").is_ok());
    drop((key, keys));

    let without = [token_dirs, "KEYFENCE_TEST_SANDBOX_WITHOUT_LANDLOCK=1".to_string()];
    let err = start(&without, false).unwrap_err();
    assert_eq!(err.code(), keyfence::ErrorCode::InvalidConfig, "{err}");
    let err = err.to_string();
    assert!(err.contains("Landlock") && err.contains("/proc/PID/mem") && err.contains("unsafe_partial_sandbox"), "{err}");
    let keys = start(&without, true).unwrap();
    let status = keys.status().unwrap();
    assert!(status.flags & flags::FILES_CONFINED == 0 && status.flags & flags::SANDBOXED != 0, "flags {:#x}", status.flags);
    assert!(!keys.test_create_file(&dir.0.join("outside")).unwrap());
    assert!(!keys.test_create_file(&tokens.join("object2")).unwrap(), "without Landlock nothing is opened for writing");
    assert!(!dir.0.join("outside").exists() && !tokens.join("object2").exists());
    let key = keys.load(KeySource::File(ec)).unwrap();
    assert!(key.sign(Algorithm::EcdsaP256Sha256, b"m").is_ok(), "reading still works");
    assert_eq!(keys.restarts(), 0, "a refused opening is an error, not a kill");
    drop((key, keys));

    // The control: the same request to a server without the sandbox.
    let target = dir.0.join("created-by-the-control");
    let reply = unsandboxed_request(kind::TEST_CREATE_FILE, target.as_os_str().as_encoded_bytes());
    assert_eq!((reply.kind, &reply.body[..]), (kind::OK, &[1u8][..]));
    assert!(target.exists());
}

/// The control of a sandbox test: `request` (with `body`) to the key
/// process's server run in this test's process, where no sandbox is, and
/// its answer.
fn unsandboxed_request(request: u8, body: &[u8]) -> p::Frame {
    let (mut raw, b) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || serve(b, &ServeOptions { check_peer: false, ..ServeOptions::default() }));
    let mut frame = Vec::new();
    p::encode(&mut frame, kind::HELLO, 0, &[&p::hello_request(8)]);
    p::encode(&mut frame, request, 1, &[body]);
    raw.write_all(&frame).unwrap();
    let mut decoder = p::Decoder::new();
    let mut buf = [0u8; 256];
    let reply = loop {
        if let Some(f) = decoder.next_frame().unwrap() {
            if f.id == 1 {
                break f;
            }
            continue;
        }
        let n = raw.read(&mut buf).unwrap();
        assert!(n > 0);
        decoder.push(&buf[..n]);
    };
    drop(raw);
    let _ = server.join();
    reply
}

/// Issue 44.4: the key process runs under a seccomp sandbox from before
/// its first request. A call it forbids (here `socket`, through a request
/// only test builds answer) kills it; the engine starts it again with its
/// keys, as after any crash.
#[test]
fn the_sandbox_kills_a_forbidden_call_and_the_key_process_comes_back() {
    let dir = Dir::new("sandbox");
    let keys = KeyProcess::start(config()).unwrap();
    let ec = keys.load(KeySource::File(key_file(&dir.0, "ec.pem", KeyKind::EcP256))).unwrap();
    let status = keys.status().unwrap();
    assert!(status.flags & flags::SANDBOXED != 0, "flags {:#x}", status.flags);
    let pid = keys.pid().unwrap();
    let err = keys.test_forbidden_call().expect_err("the forbidden call returned");
    assert!(err.to_string().contains("died") || err.to_string().contains("restarting"), "{err}");
    let t = Instant::now();
    while keys.restarts() == 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(keys.wait_running(Duration::from_secs(5)));
    assert_ne!(keys.pid(), Some(pid), "a new key process");
    assert_eq!(keys.restarts(), 1);
    assert!(ec.sign(Algorithm::EcdsaP256Sha256, b"m").is_ok(), "the key was loaded again");
    assert!(keys.status().unwrap().flags & flags::SANDBOXED != 0);
    // In a process without the sandbox (a test serving in its own
    // process), the same call returns.
    let reply = unsandboxed_request(kind::TEST_FORBIDDEN_CALL, &[]);
    assert_eq!((reply.kind, &reply.body[..]), (kind::OK, &[1u8][..]));
}

/// Issue 59.4: a library preloaded into the key process that starts a
/// thread before the sandbox is set up (Landlock binds only the thread
/// that sets it up) makes the key process refused, saying so, not
/// quietly weaker.
#[test]
fn a_key_process_with_another_thread_at_its_sandbox_is_refused() {
    let dir = Dir::new("preload-thread");
    let src = dir.0.join("thread.c");
    std::fs::write(
        &src,
        "#include <pthread.h>\n#include <unistd.h>\nstatic void *idle(void *a) { (void)a; for (;;) pause(); return 0; }\n__attribute__((constructor)) static void start(void) { pthread_t t; pthread_create(&t, 0, idle, 0); }\n",
    )
    .unwrap();
    let lib = dir.0.join("thread.so");
    let built = Command::new("cc").args(["-shared", "-fPIC", "-pthread", "-o"]).arg(&lib).arg(&src).status().expect("cc");
    assert!(built.success());
    let mut c = config();
    c.command = ["/usr/bin/env".to_string(), format!("LD_PRELOAD={}", lib.display()), KEY_PROCESS.to_string()]
        .into_iter()
        .map(Into::into)
        .collect();
    let err = KeyProcess::start(c.clone()).unwrap_err().to_string();
    assert!(err.contains("another thread was running"), "{err}");
    // Accepted explicitly, it runs, and says which layer it lacks.
    c.unsafe_partial_sandbox = true;
    let keys = KeyProcess::start(c).unwrap();
    let flags_now = keys.status().unwrap().flags;
    assert!(flags_now & flags::OTHER_THREAD != 0 && flags_now & flags::FILES_CONFINED == 0, "{flags_now:#x}");
}
