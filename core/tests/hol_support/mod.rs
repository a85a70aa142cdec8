//! What the two head-of-line tests share (`sign_hol.rs`: the slow class
//! full of 200 ms operations in process; `remote_hol.rs`: full of
//! operations a key server answers after 200 ms): an engine configuration,
//! a flood that keeps the slow class saturated, and ECDSA P-256 latency
//! sampled on an idle and a loaded engine alternately, one signature each
//! in turn, so machine noise (two shared cores) hits both alike.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use keyfence::sign::{Algorithm, ClassConfig, Engine, EngineConfig, OpClass, PrivateKey, Request, SignError};

pub const SLOW_THREADS: usize = 8;
pub const SLOW_QUEUE: usize = 64;

/// The configuration both engines of a test share: a small slow class,
/// so a flood fills it, and a deadline the 200 ms operations never reach.
pub fn config() -> EngineConfig {
    let mut config = EngineConfig::default();
    config.slow = ClassConfig { threads: SLOW_THREADS, queue_capacity: SLOW_QUEUE };
    config.default_timeout = Duration::from_secs(30);
    config
}

/// The slow class holding at least its workers' worth of operations and
/// half a queue more: queued behind busy workers (a backend that waits),
/// or in flight without a worker (the remote client sends without waiting
/// and counts against the same size).
pub fn saturated(engine: &Engine) -> bool {
    let slow = engine.metrics().class(OpClass::Slow).clone();
    slow.in_flight + slow.queue_depth >= SLOW_THREADS + SLOW_QUEUE / 2
}

/// A thread that keeps an engine's slow class full.
pub struct Flood {
    stop: Arc<AtomicBool>,
    succeeded: Arc<AtomicU64>,
    thread: JoinHandle<u64>,
}

impl Flood {
    /// Submits `make()` to `engine` until stopped, 2 ms apart after each
    /// `Overloaded`, and returns once the slow class is saturated (failing
    /// the test if it is not within 10 s).
    pub fn start(engine: &Engine, make: impl Fn() -> Request + Send + 'static) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let succeeded = Arc::new(AtomicU64::new(0));
        let thread = {
            let (engine, stop, succeeded) = (engine.clone(), stop.clone(), succeeded.clone());
            std::thread::spawn(move || {
                let mut overloaded = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let ok = succeeded.clone();
                    match engine.submit_with_callback(make(), move |r| {
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
        while !saturated(engine) {
            assert!(ramp.elapsed() < Duration::from_secs(10), "the flood never saturated the slow class");
            std::thread::sleep(Duration::from_millis(1));
        }
        Flood { stop, succeeded, thread }
    }

    /// How many flooding operations have completed successfully so far.
    pub fn succeeded(&self) -> u64 {
        self.succeeded.load(Ordering::Relaxed)
    }

    /// Stops flooding; how many submissions were refused `Overloaded`.
    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

pub fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99).div_ceil(100) - 1]
}

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn sign_once(engine: &Engine, key: &Arc<PrivateKey>, i: usize) -> Duration {
    let msg = (i as u64).to_le_bytes();
    let t = Instant::now();
    let sig = engine.sign(key, Algorithm::EcdsaP256Sha256, &msg).unwrap().wait().unwrap();
    let took = t.elapsed();
    assert!(sig.len() >= 8);
    took
}

/// A warm-up round, then `rounds` rounds of `samples` ECDSA signatures on
/// the idle and the loaded engine alternately (which goes first alternates
/// too); each round's latencies, idle then loaded. The loaded engine must
/// stay saturated throughout.
pub fn rounds(idle: &Engine, loaded: &Engine, key: &Arc<PrivateKey>, rounds: usize, samples: usize) -> Vec<(Vec<Duration>, Vec<Duration>)> {
    let mut out = Vec::new();
    for round in 0..=rounds {
        // Operations started together end together (a 200 ms wave), and the
        // flood refills 2 ms after each refusal: between the two the class
        // can look empty for an instant. Drained means not full again
        // within a second.
        let since = Instant::now();
        while !saturated(loaded) && since.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(saturated(loaded), "the slow class drained: {:?}", loaded.metrics().class(OpClass::Slow));
        let (mut idle_lat, mut loaded_lat) = (Vec::new(), Vec::new());
        for i in 0..samples {
            if i % 2 == 0 {
                idle_lat.push(sign_once(idle, key, i));
                loaded_lat.push(sign_once(loaded, key, i));
            } else {
                loaded_lat.push(sign_once(loaded, key, i));
                idle_lat.push(sign_once(idle, key, i));
            }
        }
        if round > 0 {
            out.push((idle_lat, loaded_lat));
        }
    }
    assert!(saturated(loaded), "the slow class drained: {:?}", loaded.metrics().class(OpClass::Slow));
    out
}

/// Compares local ECDSA latency on the idle and the loaded engine: the
/// median over `rounds` rounds of each round's p99, so one round hit by
/// another process's burst does not decide. A series that misses
/// `loaded <= idle * ratio + floor` is measured again, up to three times
/// in all, since head-of-line blocking (200 ms per operation) would fail
/// every one. Returns every series' (idle, loaded) medians; the last one
/// decides.
pub fn series(
    idle: &Engine, loaded: &Engine, key: &Arc<PrivateKey>, (rounds_n, samples): (usize, usize), (ratio, floor): (f64, Duration),
) -> Vec<(Duration, Duration)> {
    let mut all = Vec::new();
    for _ in 0..3 {
        let (idle_p99s, loaded_p99s): (Vec<_>, Vec<_>) =
            rounds(idle, loaded, key, rounds_n, samples).into_iter().map(|(i, l)| (p99(i), p99(l))).unzip();
        let (idle_p99, loaded_p99) = (median(idle_p99s.clone()), median(loaded_p99s.clone()));
        eprintln!(
            "local ECDSA P-256, {} samples each in {rounds_n} rounds: median round p99 idle {idle_p99:?}, slow class \
             saturated {loaded_p99:?} ({:.2}x); rounds: idle {idle_p99s:?}, loaded {loaded_p99s:?}",
            rounds_n * samples,
            loaded_p99.as_secs_f64() / idle_p99.as_secs_f64(),
        );
        all.push((idle_p99, loaded_p99));
        if loaded_p99 <= idle_p99.mul_f64(ratio) + floor {
            break;
        }
    }
    all
}
