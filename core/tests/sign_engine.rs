//! The engine's contract: the three completion paths, deadlines,
//! cancellation, overload, shutdown, metrics, and inputs released when an
//! operation ends.
#![cfg(feature = "sign")]

mod common;

use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::verify_key;
use keyfence::sign::{
    Algorithm, ClassConfig, CompletionQueue, Engine, EngineConfig, ErrorKind, KeyKind, LatencyBackend, OpClass, PrivateKey, Request,
    SignError,
};
use openssl::rsa::Padding;

fn small_config() -> EngineConfig {
    let mut c = EngineConfig::default();
    c.rsa = ClassConfig { threads: 1, queue_capacity: 16 };
    c.ec = ClassConfig { threads: 1, queue_capacity: 64 };
    c.slow = ClassConfig { threads: 1, queue_capacity: 4 };
    c
}

/// Polls `fd` for readability for up to `ms` milliseconds.
fn readable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: `p` is one valid pollfd on the stack and nfds is 1.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

#[test]
fn future_callback_and_queue_deliver_verifiable_signatures() {
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let rsa = Arc::new(PrivateKey::generate(KeyKind::Rsa { bits: 2048 }).unwrap());
    let p256 = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
    let p384 = Arc::new(PrivateKey::generate(KeyKind::EcP384).unwrap());
    let ed = Arc::new(PrivateKey::generate(KeyKind::Ed25519).unwrap());
    let keys = [&rsa, &p256, &p384, &ed];
    let msg = b"through the engine".to_vec();
    let cq = CompletionQueue::new().unwrap();
    let (tx, rx) = mpsc::channel();
    let mut futures = Vec::new();
    let mut expected = 0;
    for (i, alg) in Algorithm::ALL.into_iter().enumerate() {
        if alg == Algorithm::RsaPkcs1Md5Sha1 {
            continue; // no verifier for it; covered in the unit tests
        }
        let key = keys.iter().find(|k| k.kind().supports(alg)).unwrap();
        let req = Request::sign((*key).clone(), alg, msg.clone());
        futures.push((alg, key, engine.submit(req.clone()).unwrap()));
        let tx = tx.clone();
        engine.submit_with_callback(req.clone(), move |r| tx.send((alg, r)).unwrap()).unwrap();
        engine.submit_to_queue(req, &cq, i as u64).unwrap();
        expected += 1;
    }
    for (alg, key, fut) in futures {
        let sig = futures::executor::block_on(fut).unwrap();
        assert!(verify_key(key, alg, &msg, &sig), "future {alg}");
    }
    for _ in 0..expected {
        let (alg, r) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let key = keys.iter().find(|k| k.kind().supports(alg)).unwrap();
        assert!(verify_key(key, alg, &msg, &r.unwrap()), "callback {alg}");
    }
    let mut done = Vec::new();
    while done.len() < expected {
        assert!(readable(cq.as_raw_fd(), 10_000), "completion queue fd never became readable");
        cq.drain_into(&mut done);
    }
    for c in done {
        let alg = Algorithm::ALL[c.user_data as usize];
        let key = keys.iter().find(|k| k.kind().supports(alg)).unwrap();
        assert!(verify_key(key, alg, &msg, &c.result.unwrap()), "queue {alg}");
    }
    // Drained: the descriptor is quiet until the next completion.
    assert!(!readable(cq.as_raw_fd(), 0));
    assert!(cq.is_empty());

    let m = engine.metrics();
    assert_eq!(m.class(OpClass::Rsa).completed, 3 * 6);
    assert_eq!(m.class(OpClass::Ec).completed, 3 * 3);
    assert_eq!(m.class(OpClass::Slow).submitted, 0);
    let ec = m.class(OpClass::Ec);
    assert_eq!(ec.latency.count, 9);
    assert!(ec.latency.p50 > Duration::ZERO && ec.latency.p50 <= ec.latency.p99 && ec.latency.p99 <= ec.latency.max);
    assert_eq!(ec.errors.total(), 0);
}

#[test]
fn digest_requests_and_raw_decrypt_through_the_engine() {
    let engine = Engine::new(small_config()).unwrap();
    let rsa = Arc::new(PrivateKey::generate(KeyKind::Rsa { bits: 2048 }).unwrap());
    let digest = keyfence::sign::Hash::Sha256.digest(b"m").unwrap();
    let by_digest = engine.submit(Request::sign_digest(rsa.clone(), Algorithm::RsaPkcs1Sha256, digest)).unwrap();
    assert_eq!(by_digest.wait().unwrap(), rsa.sign(Algorithm::RsaPkcs1Sha256, b"m").unwrap());

    // Encrypt with the public key (PKCS#1 v1.5), decrypt raw through the
    // engine, and find the message after the 00 02 ... 00 padding.
    let public = openssl::rsa::Rsa::public_key_from_der(&rsa.public_key_der().unwrap()).unwrap();
    let mut ct = vec![0; 256];
    public.public_encrypt(b"premaster", &mut ct, Padding::PKCS1).unwrap();
    let raw = engine.submit(Request::decrypt_raw(rsa.clone(), ct)).unwrap().wait().unwrap();
    assert_eq!(raw.len(), 256);
    assert_eq!(&raw[..2], &[0, 2]);
    assert_eq!(&raw[raw.len() - 9..], b"premaster");
    assert_eq!(raw[raw.len() - 10], 0);
}

#[test]
fn bad_requests_fail_at_submission_and_are_counted() {
    let engine = Engine::new(small_config()).unwrap();
    let p256 = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
    let err = engine.submit(Request::sign(p256.clone(), Algorithm::RsaPssSha256, vec![1])).unwrap_err();
    assert!(matches!(err, SignError::KeyMismatch { .. }), "{err}");
    let err = engine.submit(Request::sign_digest(p256.clone(), Algorithm::EcdsaP256Sha256, vec![0; 20])).unwrap_err();
    assert_eq!(err.to_string(), "ecdsa-p256-sha256 expects a 32-byte digest, got 20 bytes");
    let err = engine.submit(Request::decrypt_raw(p256, vec![0; 256])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert_eq!(engine.metrics().class(OpClass::Ec).errors.get(ErrorKind::Invalid), 3);
}

#[test]
fn deadline_expires_queued_and_running_operations_and_releases_inputs() {
    let engine = Engine::new(small_config()).unwrap();
    let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
    let slow = Arc::new(LatencyBackend::new(Duration::from_millis(400)));
    let req = |t| Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, vec![0; 1 << 20]).with_backend(slow.clone()).with_timeout(t);
    // One slow worker: the first runs, the second waits in the queue.
    let t0 = Instant::now();
    let running = engine.submit(req(Duration::from_millis(100))).unwrap();
    let queued = engine.submit(req(Duration::from_millis(50))).unwrap();
    assert_eq!(Arc::strong_count(&key), 3);
    let (qh, rh) = (queued.handle(), running.handle());
    assert_eq!(queued.wait().unwrap_err(), SignError::TimedOut { timeout: Duration::from_millis(50) });
    let queued_at = t0.elapsed();
    assert!(qh.is_done());
    assert_eq!(running.wait().unwrap_err(), SignError::TimedOut { timeout: Duration::from_millis(100) });
    let running_at = t0.elapsed();
    // Answered at the deadline, not when the 400 ms backend would finish.
    assert!(queued_at >= Duration::from_millis(50) && queued_at < Duration::from_millis(350), "{queued_at:?}");
    assert!(running_at >= Duration::from_millis(100) && running_at < Duration::from_millis(390), "{running_at:?}");
    assert!(rh.is_done());
    // The queued one's input (1 MiB and the key reference) went at its
    // deadline; the running one's once its backend gave up at the deadline.
    let give_up = Instant::now() + Duration::from_secs(5);
    while Arc::strong_count(&key) > 1 && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(Arc::strong_count(&key), 1);
    let m = engine.metrics();
    assert_eq!(m.class(OpClass::Slow).errors.get(ErrorKind::TimedOut), 2);
    assert_eq!(m.class(OpClass::Slow).completed, 0);
}

#[test]
fn cancellation_by_handle_and_by_dropping_the_future() {
    let engine = Engine::new(small_config()).unwrap();
    let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
    let slow = Arc::new(LatencyBackend::new(Duration::from_millis(300)));
    let req = || Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"x".to_vec()).with_backend(slow.clone());
    let blocker = engine.submit(req()).unwrap(); // occupies the one slow worker
    let (tx, rx) = mpsc::channel();
    let handle = engine.submit_with_callback(req(), move |r| tx.send(r).unwrap()).unwrap();
    let dropped = engine.submit(req()).unwrap();
    let dropped_handle = dropped.handle();
    drop(dropped);
    assert!(dropped_handle.is_done());
    assert!(handle.cancel());
    assert!(!handle.cancel(), "a second cancel finds it ended");
    assert_eq!(rx.recv_timeout(Duration::from_secs(1)).unwrap().unwrap_err(), SignError::Cancelled);
    assert!(blocker.wait().is_ok());
    // Give the worker time to skip the cancelled entries; none ran.
    std::thread::sleep(Duration::from_millis(50));
    let m = engine.metrics();
    let slow_m = m.class(OpClass::Slow);
    assert_eq!(slow_m.completed, 1);
    assert_eq!(slow_m.errors.get(ErrorKind::Cancelled), 2);
    assert_eq!(slow_m.queue_depth, 0);
    assert_eq!(Arc::strong_count(&key), 1);
}

#[test]
fn full_queue_answers_overloaded_at_once() {
    let engine = Engine::new(small_config()).unwrap();
    let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
    let slow = Arc::new(LatencyBackend::new(Duration::from_millis(200)));
    let req = || Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"x".to_vec()).with_backend(slow.clone());
    let mut accepted = Vec::new();
    let mut overloaded = 0;
    for _ in 0..20 {
        let t = Instant::now();
        match engine.submit(req()) {
            Ok(f) => accepted.push(f),
            Err(SignError::Overloaded { class: OpClass::Slow, capacity: 4 }) => {
                overloaded += 1;
                assert!(t.elapsed() < Duration::from_millis(50), "overload answer took {:?}", t.elapsed());
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    // One worker and four queue slots: five accepted, or four if the worker
    // had not yet taken the first off the queue; the rest refused.
    assert!((4..=5).contains(&accepted.len()), "{}", accepted.len());
    assert_eq!(overloaded, 20 - accepted.len());
    let m = engine.metrics();
    assert_eq!(m.class(OpClass::Slow).errors.get(ErrorKind::Overloaded), overloaded as u64);
    assert!(m.class(OpClass::Slow).queue_depth <= 4);
    // The EC class is unaffected.
    assert!(engine.sign(&key, Algorithm::EcdsaP256Sha256, b"y").unwrap().wait().is_ok());
    drop(accepted);
}

#[test]
fn dropping_the_engine_answers_queued_operations_shut_down() {
    let engine = Engine::new(small_config()).unwrap();
    let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
    let slow = Arc::new(LatencyBackend::new(Duration::from_millis(100)));
    let req = || Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"x".to_vec()).with_backend(slow.clone());
    let running = engine.submit(req()).unwrap();
    std::thread::sleep(Duration::from_millis(20)); // let the worker take it
    let queued = engine.submit(req()).unwrap();
    drop(engine);
    assert!(running.wait().is_ok(), "a running operation finishes");
    assert_eq!(queued.wait().unwrap_err(), SignError::ShutDown);
}

#[test]
fn a_panicking_callback_does_not_kill_the_worker() {
    let engine = Engine::new(small_config()).unwrap();
    let key = Arc::new(PrivateKey::generate(KeyKind::Ed25519).unwrap());
    engine.submit_with_callback(Request::sign(key.clone(), Algorithm::Ed25519, b"a".to_vec()), |_| panic!("callback bug")).unwrap();
    for _ in 0..3 {
        assert!(engine.sign(&key, Algorithm::Ed25519, b"b").unwrap().wait().is_ok());
    }
}

#[test]
fn bad_configuration_is_refused() {
    let mut c = EngineConfig::default();
    c.ec.threads = 0;
    assert_eq!(Engine::new(c).unwrap_err(), SignError::Config("ec.threads must be 1 to 4096, not 0".into()));
    let mut c = EngineConfig::default();
    c.default_timeout = Duration::ZERO;
    assert!(matches!(Engine::new(c), Err(SignError::Config(_))));
}

/// An EC worker with more operations waiting runs them as one batch: what
/// their completions hold back (here a probe; in production a key
/// server's replies or a completion queue's wake-up) is flushed once, when
/// the worker runs out of work. A lone operation runs outside any batch,
/// so nothing of it waits. Deterministic: the first operation holds the
/// only worker until the other three are queued.
#[test]
fn an_ec_worker_batches_the_completions_of_queued_work_and_holds_a_lone_one_back_not_at_all() {
    use keyfence::sign::{flush_later, Backend, Flush, Operation, Output};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    struct Probe(AtomicUsize);
    impl Flush for Probe {
        fn flush(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    struct Gated {
        gate: Mutex<mpsc::Receiver<()>>,
        probe: Arc<dyn Flush>,
        batched: Mutex<Vec<bool>>,
    }
    impl Backend for Gated {
        fn name(&self) -> &str {
            "gated"
        }
        fn class(&self, _: &PrivateKey, _: &Operation) -> OpClass {
            OpClass::Ec
        }
        fn perform(&self, key: &PrivateKey, op: &Operation, _: Instant) -> Result<Output, SignError> {
            let first = self.batched.lock().unwrap().is_empty();
            if first {
                self.gate.lock().unwrap().recv().unwrap();
            }
            self.batched.lock().unwrap().push(flush_later(&self.probe));
            key.perform(op)
        }
    }

    let (open, gate) = mpsc::channel();
    let probe = Arc::new(Probe(AtomicUsize::new(0)));
    let backend = Arc::new(Gated { gate: Mutex::new(gate), probe: probe.clone(), batched: Mutex::new(Vec::new()) });
    let mut config = small_config();
    config.ec = ClassConfig { threads: 1, queue_capacity: 16 };
    let engine = Engine::with_backend(config, backend.clone()).unwrap();
    let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
    let cq = CompletionQueue::new().unwrap();
    let sign = |i: u8| engine.submit_to_queue(Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, vec![i]), &cq, u64::from(i));
    let first = sign(0).unwrap();
    // The worker has taken the first operation and waits at the gate.
    while engine.metrics().class(OpClass::Ec).in_flight == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let rest: Vec<_> = (1..4).map(|i| sign(i).unwrap()).collect();
    open.send(()).unwrap();
    let mut done = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    while done.len() < 4 && Instant::now() < until {
        if readable(cq.as_raw_fd(), 100) {
            cq.drain_into(&mut done);
        }
    }
    assert_eq!(done.len(), 4, "every completion arrives, its wake-up included");
    assert!(done.iter().all(|c| c.result.is_ok()));
    // The first ran alone (the queue was empty when it was taken); the
    // second was taken with two more waiting, so it ran in a batch. The
    // rest share it unless it reached its time bound (400 µs) first, which
    // a busy machine can make it do: then a new batch opens, each flushed
    // once.
    let batched = backend.batched.lock().unwrap().clone();
    assert_eq!(&batched[..2], &[false, true], "{batched:?}");
    let flushes = probe.0.load(Ordering::SeqCst);
    assert!(flushes >= 1 && flushes <= batched.iter().filter(|b| **b).count(), "{flushes} flushes, {batched:?}");
    drop((first, rest));
}

/// A caller that waits anyway (`Engine::perform`: the OpenSSL provider,
/// `keyfence_engine_sign`) has a backend that computes in place run on its
/// own thread, counted in the class's metrics, while `submit` still hands
/// the same work to an executor thread; a backend that does not say it
/// computes in place is always submitted.
#[test]
fn perform_runs_in_place_work_on_the_callers_thread_and_counts_it() {
    use keyfence::sign::{Backend, Operation, Output};
    use std::sync::Mutex;
    use std::thread::ThreadId;
    struct Where {
        threads: Mutex<Vec<ThreadId>>,
        in_place: bool,
    }
    impl Backend for Where {
        fn name(&self) -> &str {
            "where"
        }
        fn class(&self, _: &PrivateKey, _: &Operation) -> OpClass {
            OpClass::Ec
        }
        fn perform(&self, key: &PrivateKey, op: &Operation, _: Instant) -> Result<Output, SignError> {
            self.threads.lock().unwrap().push(std::thread::current().id());
            key.perform(op)
        }
        fn performs_in_place(&self) -> bool {
            self.in_place
        }
    }
    let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
    let me = std::thread::current().id();
    for in_place in [true, false] {
        let backend = Arc::new(Where { threads: Mutex::new(Vec::new()), in_place });
        let engine = Engine::with_backend(small_config(), backend.clone()).unwrap();
        let sig = engine.perform(Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"here".to_vec())).unwrap();
        assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, b"here", &sig));
        engine.submit(Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"there".to_vec())).unwrap().wait().unwrap();
        let threads = backend.threads.lock().unwrap().clone();
        assert_eq!(threads.len(), 2);
        assert_eq!(threads[0] == me, in_place, "perform on the caller's thread only in place");
        assert_ne!(threads[1], me, "submit always hands over");
        let m = engine.metrics();
        assert_eq!((m.class(OpClass::Ec).submitted, m.class(OpClass::Ec).completed), (2, 2));
        // A request the key cannot do is refused at once, and counted.
        let err = engine.perform(Request::sign(key.clone(), Algorithm::Ed25519, b"x".to_vec())).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
    }
    // The software backend computes in place.
    let engine = Engine::new(small_config()).unwrap();
    let sig = engine.perform(Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"soft".to_vec())).unwrap();
    assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, b"soft", &sig));
}
