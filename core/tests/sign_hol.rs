//! The head-of-line regression test (issue 6): the Geo Key Manager outage
//! of 2022, where local signatures waited behind 200 ms remote ones in one
//! serial queue, must not happen here.
//!
//! Two engines with the same configuration run side by side in this test.
//! The "loaded" one has its slow class saturated with 200 ms operations for
//! the whole test (every slow worker busy, the slow queue full, submissions
//! answered `Overloaded`); the "idle" one has nothing else to do. ECDSA
//! P-256 latency is sampled on both alternately, one signature each in
//! turn, so machine noise (this runs on a shared 2-core machine) hits both
//! alike.
//! The loaded p99 must stay within 1.5x of the idle p99, plus a small
//! absolute floor for scheduler jitter at the microsecond scale.
//!
//! A control shows the measurement would catch head-of-line blocking: one
//! ECDSA signature routed to the saturated slow executor waits behind the
//! 200 ms operations.
#![cfg(feature = "sign")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyfence::sign::{
    Algorithm, Backend, ClassConfig, Engine, EngineConfig, ErrorKind, KeyKind, LatencyBackend, OpClass, Operation,
    Output, PrivateKey, Request, SignError,
};

const SLOW_THREADS: usize = 8;
const SLOW_QUEUE: usize = 64;
const ROUNDS: usize = 8;
const SAMPLES_PER_ROUND: usize = 1000;
/// Scheduler jitter on a shared 2-core machine: differences below this are
/// not head-of-line blocking (which costs 200 ms, not microseconds).
const FLOOR: Duration = Duration::from_micros(250);

/// Software signing, but scheduled on the slow executor: what a single
/// shared queue would do to a local signature.
struct SharedQueueBackend;

impl Backend for SharedQueueBackend {
    fn name(&self) -> &str {
        "shared-queue"
    }
    fn class(&self, _key: &PrivateKey, _op: &Operation) -> OpClass {
        OpClass::Slow
    }
    fn perform(&self, key: &PrivateKey, op: &Operation, _deadline: Instant) -> Result<Output, SignError> {
        key.perform(op)
    }
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99).div_ceil(100) - 1]
}

fn sign_once(engine: &Engine, key: &Arc<PrivateKey>, i: usize) -> Duration {
    let msg = (i as u64).to_le_bytes();
    let t = Instant::now();
    let sig = engine.sign(key, Algorithm::EcdsaP256Sha256, &msg).unwrap().wait().unwrap();
    let took = t.elapsed();
    assert!(sig.len() >= 8);
    took
}

/// One idle and one loaded sample at a time, so that bursts of machine
/// noise (other processes on the shared cores) land on both alike.
fn sample(
    idle: &Engine,
    loaded: &Engine,
    key: &Arc<PrivateKey>,
    idle_lat: &mut Vec<Duration>,
    loaded_lat: &mut Vec<Duration>,
) {
    for i in 0..SAMPLES_PER_ROUND {
        if i % 2 == 0 {
            idle_lat.push(sign_once(idle, key, i));
            loaded_lat.push(sign_once(loaded, key, i));
        } else {
            loaded_lat.push(sign_once(loaded, key, i));
            idle_lat.push(sign_once(idle, key, i));
        }
    }
}

fn assert_saturated(engine: &Engine) {
    let slow = engine.metrics().class(OpClass::Slow).clone();
    assert_eq!(slow.in_flight, SLOW_THREADS, "slow class not saturated: {slow:?}");
    assert!(slow.queue_depth >= SLOW_QUEUE / 2, "slow queue not full: {slow:?}");
}

#[test]
fn saturated_slow_class_does_not_delay_ecdsa() {
    let mut config = EngineConfig::default();
    config.slow = ClassConfig { threads: SLOW_THREADS, queue_capacity: SLOW_QUEUE };
    config.default_timeout = Duration::from_secs(30);
    let idle = Engine::new(config.clone()).unwrap();
    let loaded = Engine::new(config).unwrap();
    let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());

    // The flood: keep the slow class full of 200 ms operations.
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let (engine, key, stop) = (loaded.clone(), key.clone(), stop.clone());
        std::thread::spawn(move || {
            let slow: Arc<dyn Backend> = Arc::new(LatencyBackend::new(Duration::from_millis(200)));
            let mut overloaded = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let req = Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"remote".to_vec())
                    .with_backend(slow.clone());
                match engine.submit_with_callback(req, |_| {}) {
                    Ok(_) => {}
                    Err(SignError::Overloaded { .. }) => {
                        overloaded += 1;
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => panic!("flood: {e}"),
                }
            }
            overloaded
        })
    };
    let ramp = Instant::now();
    while engine_not_saturated(&loaded) {
        assert!(ramp.elapsed() < Duration::from_secs(10), "the flood never saturated the slow class");
        std::thread::sleep(Duration::from_millis(1));
    }

    let (mut idle_lat, mut loaded_lat) = (Vec::new(), Vec::new());
    // Warm both engines' threads and caches before measuring.
    sample(&idle, &loaded, &key, &mut Vec::new(), &mut Vec::new());
    for _ in 0..ROUNDS {
        assert_saturated(&loaded);
        sample(&idle, &loaded, &key, &mut idle_lat, &mut loaded_lat);
    }
    assert_saturated(&loaded);

    // Control: the same signature on the saturated slow executor waits
    // behind the 200 ms operations, so a shared queue would fail the bound.
    let queued_behind = retry_until_accepted(&loaded, &key);
    let t = Instant::now();
    queued_behind.wait().unwrap();
    let shared_queue_latency = t.elapsed();

    stop.store(true, Ordering::Relaxed);
    let overloaded = flood.join().unwrap();

    let (idle_p99, loaded_p99) = (p99(idle_lat.clone()), p99(loaded_lat.clone()));
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    eprintln!(
        "ECDSA P-256 over {} samples each: idle p50 {:?} p99 {:?}; slow class saturated: p50 {:?} p99 {:?} ({:.2}x); \
         via the saturated slow queue: {:?}; flood refused {} times",
        idle_lat.len(),
        median(idle_lat.clone()),
        idle_p99,
        median(loaded_lat.clone()),
        loaded_p99,
        loaded_p99.as_secs_f64() / idle_p99.as_secs_f64(),
        shared_queue_latency,
        overloaded
    );
    assert!(overloaded > 0, "the slow class never refused work: it was not saturated");
    assert!(loaded.metrics().class(OpClass::Slow).errors.get(ErrorKind::Overloaded) > 0);
    assert!(
        shared_queue_latency > Duration::from_millis(100),
        "control: a signature queued behind 200 ms operations took only {shared_queue_latency:?}"
    );
    let bound = idle_p99.mul_f64(1.5) + FLOOR;
    assert!(
        loaded_p99 <= bound,
        "head-of-line blocking: ECDSA p99 {loaded_p99:?} with the slow class saturated, idle p99 {idle_p99:?} (bound {bound:?})"
    );
}

fn engine_not_saturated(engine: &Engine) -> bool {
    let slow = engine.metrics().class(OpClass::Slow).clone();
    slow.in_flight < SLOW_THREADS || slow.queue_depth < SLOW_QUEUE / 2
}

/// Submits one signature to the slow executor, waiting for the flood to
/// leave a queue slot.
fn retry_until_accepted(engine: &Engine, key: &Arc<PrivateKey>) -> keyfence::sign::SignFuture {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let req = Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"x".to_vec())
            .with_backend(Arc::new(SharedQueueBackend));
        match engine.submit(req) {
            Ok(f) => return f,
            Err(SignError::Overloaded { .. }) if Instant::now() < give_up => {
                std::thread::sleep(Duration::from_micros(100))
            }
            Err(e) => panic!("control submission: {e}"),
        }
    }
}
