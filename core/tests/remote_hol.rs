//! The Melbourne incident of the Geo Key Manager seed, reproduced through a
//! real key server: remote peers answer after 200 ms, the client's slow
//! class is saturated with operations on keys only they hold, and local
//! ECDSA P-256 signing on the same engine must stay within 1.2x of an idle
//! engine's p99 (plus a 50 µs floor for scheduler jitter on a shared
//! machine), both measured in the same run, alternately, so machine noise
//! hits both alike. The p99 is taken per round and the median round
//! compared, so one round hit by another process's burst (this machine's
//! two cores are shared) does not decide; head-of-line blocking would cost
//! 200 ms in every round, three orders of magnitude above the bound. A
//! series spoilt by a neighbour's burst anyway is measured again, up to
//! three times: blocking would fail them all.
#![cfg(feature = "sign")]

mod remote_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyfence::sign::{
    Algorithm, ClassConfig, Engine, EngineConfig, ErrorKind, KeyKind, LatencyBackend, OpClass, PrivateKey, Request,
    SignError,
};
use remote_support::*;

const SLOW_THREADS: usize = 8;
const SLOW_QUEUE: usize = 64;
const ROUNDS: usize = 11;
const SAMPLES_PER_ROUND: usize = 600;
const FLOOR: Duration = Duration::from_micros(50);

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99).div_ceil(100) - 1]
}

fn sign_once(engine: &Engine, key: &Arc<PrivateKey>, i: usize) -> Duration {
    let msg = (i as u64).to_le_bytes();
    let t = Instant::now();
    engine.sign(key, Algorithm::EcdsaP256Sha256, &msg).unwrap().wait().unwrap();
    t.elapsed()
}

fn saturated(engine: &Engine) -> bool {
    let slow = engine.metrics().class(OpClass::Slow).clone();
    slow.in_flight >= SLOW_THREADS && slow.queue_depth >= SLOW_QUEUE / 2
}

#[test]
fn remote_peers_answering_after_200ms_do_not_delay_local_ecdsa() {
    let world = World::new();
    let slow: Arc<dyn keyfence::sign::Backend> = Arc::new(LatencyBackend::new(Duration::from_millis(200)));
    let sfo = start_server(&world, "sfo1", ServerOptions { backend: Some(slow), slow_threads: Some(128), ..Default::default() });
    let remote = client(&[("sfo1", sfo.local_addr())]);
    let remote_key = remote.key(&world.us_key).unwrap();

    let mut config = EngineConfig::default();
    config.slow = ClassConfig { threads: SLOW_THREADS, queue_capacity: SLOW_QUEUE };
    config.default_timeout = Duration::from_secs(30);
    let idle = Engine::new(config.clone()).unwrap();
    let loaded = Engine::new(config).unwrap();
    let local = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());

    // A remote signature takes the server's 200 ms: the slow path is slow.
    let t = Instant::now();
    loaded.sign(&remote_key, Algorithm::EcdsaP256Sha256, b"remote").unwrap().wait().unwrap();
    let remote_latency = t.elapsed();
    assert!(remote_latency >= Duration::from_millis(200), "{remote_latency:?}");

    let stop = Arc::new(AtomicBool::new(false));
    let remote_ok = Arc::new(AtomicU64::new(0));
    let flood = {
        let (engine, key, stop, ok) = (loaded.clone(), remote_key.clone(), stop.clone(), remote_ok.clone());
        std::thread::spawn(move || {
            let mut overloaded = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let ok = ok.clone();
                let req = Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"remote".to_vec());
                match engine.submit_with_callback(req, move |r| {
                    if r.is_ok() {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                }) {
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
    while !saturated(&loaded) {
        assert!(ramp.elapsed() < Duration::from_secs(10), "the flood never saturated the slow class");
        std::thread::sleep(Duration::from_millis(1));
    }

    // A measurement series; up to three when a neighbour's burst spoils
    // one: head-of-line blocking would fail every series by 200 ms.
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let mut series = Vec::new();
    for _ in 0..3 {
        let (idle_p99s, loaded_p99s) = measure(&idle, &loaded, &local);
        let (idle_p99, loaded_p99) = (median(idle_p99s.clone()), median(loaded_p99s.clone()));
        eprintln!(
            "local ECDSA P-256, {} samples each in {ROUNDS} rounds: median round p99 idle {idle_p99:?}, with remote peers at \
             200 ms saturating the slow class {loaded_p99:?} ({:.2}x); rounds: idle {idle_p99s:?}, loaded {loaded_p99s:?}",
            ROUNDS * SAMPLES_PER_ROUND,
            loaded_p99.as_secs_f64() / idle_p99.as_secs_f64(),
        );
        let met = loaded_p99 <= idle_p99.mul_f64(1.2) + FLOOR;
        series.push((idle_p99, loaded_p99));
        if met {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let overloaded = flood.join().unwrap();

    eprintln!(
        "remote signatures completed meanwhile: {}; flood refused {overloaded} times",
        remote_ok.load(Ordering::Relaxed)
    );
    assert!(overloaded > 0, "the slow class never refused work: it was not saturated");
    assert!(loaded.metrics().class(OpClass::Slow).errors.get(ErrorKind::Overloaded) > 0);
    assert!(remote_ok.load(Ordering::Relaxed) > 0, "the remote path did work meanwhile");
    let (idle_p99, loaded_p99) = *series.last().unwrap();
    let bound = idle_p99.mul_f64(1.2) + FLOOR;
    assert!(
        loaded_p99 <= bound,
        "head-of-line blocking: local ECDSA p99 {loaded_p99:?} with remote peers saturating the slow class, idle {idle_p99:?} \
         (bound {bound:?}); every series: {series:?}"
    );
}

/// One series: a warm-up round, then ROUNDS rounds of ECDSA signatures on
/// the idle and the loaded engine alternately; each round's p99 for both.
fn measure(idle: &Engine, loaded: &Engine, local: &Arc<PrivateKey>) -> (Vec<Duration>, Vec<Duration>) {
    let (mut idle_p99s, mut loaded_p99s) = (Vec::new(), Vec::new());
    for round in 0..=ROUNDS {
        let (mut idle_lat, mut loaded_lat) = (Vec::new(), Vec::new());
        assert!(saturated(loaded), "the slow class drained: {:?}", loaded.metrics().class(OpClass::Slow));
        for i in 0..SAMPLES_PER_ROUND {
            let (a, b) = if i % 2 == 0 {
                let a = sign_once(idle, local, i);
                (a, sign_once(loaded, local, i))
            } else {
                let b = sign_once(loaded, local, i);
                (sign_once(idle, local, i), b)
            };
            idle_lat.push(a);
            loaded_lat.push(b);
        }
        // Round 0 warms both engines up.
        if round > 0 {
            idle_p99s.push(p99(idle_lat));
            loaded_p99s.push(p99(loaded_lat));
        }
    }
    (idle_p99s, loaded_p99s)
}
