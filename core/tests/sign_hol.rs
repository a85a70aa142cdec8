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

mod hol_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hol_support::Flood;
use keyfence::sign::{
    Algorithm, Backend, Engine, ErrorKind, KeyKind, LatencyBackend, OpClass, Operation, Output, PrivateKey, Request, SignError,
};

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

#[test]
fn saturated_slow_class_does_not_delay_ecdsa() {
    let idle = Engine::new(hol_support::config()).unwrap();
    let loaded = Engine::new(hol_support::config()).unwrap();
    let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());

    // The flood: keep the slow class full of 200 ms operations.
    let flood = {
        let (key, slow) = (key.clone(), Arc::new(LatencyBackend::new(Duration::from_millis(200))) as Arc<dyn Backend>);
        Flood::start(&loaded, move || Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"remote".to_vec()).with_backend(slow.clone()))
    };
    let series = hol_support::series(&idle, &loaded, &key, (ROUNDS, SAMPLES_PER_ROUND), (1.5, FLOOR));

    // Control: the same signature on the saturated slow executor waits
    // behind the 200 ms operations, so a shared queue would fail the bound.
    let queued_behind = retry_until_accepted(&loaded, &key);
    let t = Instant::now();
    queued_behind.wait().unwrap();
    let shared_queue_latency = t.elapsed();

    let overloaded = flood.stop();

    eprintln!("via the saturated slow queue: {shared_queue_latency:?}; flood refused {overloaded} times");
    assert!(overloaded > 0, "the slow class never refused work: it was not saturated");
    assert!(loaded.metrics().class(OpClass::Slow).errors.get(ErrorKind::Overloaded) > 0);
    assert!(
        shared_queue_latency > Duration::from_millis(100),
        "control: a signature queued behind 200 ms operations took only {shared_queue_latency:?}"
    );
    let (idle_p99, loaded_p99) = *series.last().unwrap();
    let bound = idle_p99.mul_f64(1.5) + FLOOR;
    assert!(
        loaded_p99 <= bound,
        "head-of-line blocking: ECDSA p99 {loaded_p99:?} with the slow class saturated, idle p99 {idle_p99:?} \
         (bound {bound:?}); every series: {series:?}"
    );
}

/// Submits one signature to the slow executor, waiting for the flood to
/// leave a queue slot.
fn retry_until_accepted(engine: &Engine, key: &Arc<PrivateKey>) -> keyfence::sign::SignFuture {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let req = Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"x".to_vec()).with_backend(Arc::new(SharedQueueBackend));
        match engine.submit(req) {
            Ok(f) => return f,
            Err(SignError::Overloaded { .. }) if Instant::now() < give_up => std::thread::sleep(Duration::from_micros(100)),
            Err(e) => panic!("control submission: {e}"),
        }
    }
}
