//! Overload (issue 6): when callers submit far faster than the engine signs,
//! the answer is an immediate `Overloaded`, and memory stays bounded by the
//! queue capacity instead of growing with the backlog (the gokeyless queue
//! in the seeds blocked instead, and its callers timed out).
//!
//! Alone in its own test binary so that the resident-set measurement sees
//! only this test's allocations.
#![cfg(feature = "sign")]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyfence::sign::{Algorithm, ClassConfig, Engine, EngineConfig, ErrorKind, KeyKind, OpClass, PrivateKey, Request, SignError};

const QUEUE: usize = 256;
/// Each request carries this much input, so a backlog that grew with the
/// submissions would show in the resident set at once (300 000 refused
/// requests would be over 4 GiB).
const MSG: usize = 16 * 1024;
const WINDOW: Duration = Duration::from_secs(2);

/// Refusal latencies in 100 ns buckets up to 1 ms (a vector of millions of
/// samples would itself grow the resident set being measured).
struct Refusals {
    buckets: Vec<u64>,
    max: Duration,
}

impl Refusals {
    const BUCKET_NS: u128 = 100;
    const LEN: usize = 10_001;

    fn new() -> Self {
        Refusals { buckets: vec![0; Self::LEN], max: Duration::ZERO }
    }
    fn record(&mut self, d: Duration) {
        self.buckets[((d.as_nanos() / Self::BUCKET_NS) as usize).min(Self::LEN - 1)] += 1;
        self.max = self.max.max(d);
    }
    fn merge(&mut self, o: &Refusals) {
        self.buckets.iter_mut().zip(&o.buckets).for_each(|(a, b)| *a += b);
        self.max = self.max.max(o.max);
    }
    fn len(&self) -> usize {
        self.buckets.iter().sum::<u64>() as usize
    }
    /// The upper edge of the bucket holding quantile `q`.
    fn quantile(&self, q: f64) -> Duration {
        let rank = ((self.len() as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Duration::from_nanos(((i as u128 + 1) * Self::BUCKET_NS) as u64);
            }
        }
        self.max
    }
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn overload_is_answered_at_once_and_memory_stays_bounded() {
    let mut config = EngineConfig::default();
    config.rsa = ClassConfig { threads: 2, queue_capacity: QUEUE };
    let engine = Engine::new(config).unwrap();
    let key = Arc::new(PrivateKey::generate(KeyKind::Rsa { bits: 2048 }).unwrap());
    let done = Arc::new(AtomicU64::new(0));

    // Warm up allocator and threads, then take the baseline.
    for _ in 0..8 {
        engine.sign(&key, Algorithm::RsaPkcs1Sha256, &[0; MSG]).unwrap().wait().unwrap();
    }
    let rss_before = resident_bytes();

    let submitters: Vec<_> = (0..2)
        .map(|_| {
            let (engine, key, done) = (engine.clone(), key.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut accepted, mut refusals) = (0u64, Refusals::new());
                let mut max_depth = 0;
                let start = Instant::now();
                let mut i = 0u64;
                while start.elapsed() < WINDOW {
                    let done = done.clone();
                    let req = Request::sign(key.clone(), Algorithm::RsaPkcs1Sha256, vec![7; MSG]);
                    let t = Instant::now();
                    match engine.submit_with_callback(req, move |r| {
                        assert!(r.is_ok());
                        done.fetch_add(1, Ordering::Relaxed);
                    }) {
                        Ok(_) => accepted += 1,
                        Err(SignError::Overloaded { class: OpClass::Rsa, capacity: QUEUE }) => refusals.record(t.elapsed()),
                        Err(e) => panic!("unexpected {e}"),
                    }
                    i += 1;
                    if i.is_multiple_of(4096) {
                        max_depth = max_depth.max(engine.metrics().class(OpClass::Rsa).queue_depth);
                    }
                }
                (accepted, refusals, max_depth)
            })
        })
        .collect();
    let mut rss_peak = rss_before;
    while !submitters.iter().all(|s| s.is_finished()) {
        rss_peak = rss_peak.max(resident_bytes());
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut accepted, mut refusals, mut max_depth) = (0, Refusals::new(), 0);
    for s in submitters {
        let (a, r, d) = s.join().unwrap();
        accepted += a;
        refusals.merge(&r);
        max_depth = max_depth.max(d);
    }
    let signed_in_window = done.load(Ordering::Relaxed);

    // Everything accepted completes: the backlog is at most the queue.
    let give_up = Instant::now() + Duration::from_secs(30);
    while done.load(Ordering::Relaxed) < accepted && Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(10));
    }
    let p = |q: f64| refusals.quantile(q);
    let growth = rss_peak.saturating_sub(rss_before);
    eprintln!(
        "{} submissions in {WINDOW:?}: {accepted} accepted, {} refused (answer p50 {:?}, p99 {:?}, max {:?}); \
         {signed_in_window} signed meanwhile; max queue depth {max_depth}/{QUEUE}; resident set +{} KiB",
        accepted + refusals.len() as u64,
        refusals.len(),
        p(0.5),
        p(0.99),
        refusals.max,
        growth / 1024
    );

    assert_eq!(done.load(Ordering::Relaxed), accepted, "accepted operations did not all complete");
    // Callers submitted far faster than the engine signs.
    assert!(refusals.len() as u64 > 20 * accepted, "not overloaded enough to test anything");
    // Accepted work is bounded by queue + workers + what completed meanwhile.
    assert!(accepted <= QUEUE as u64 + 2 + signed_in_window + 2);
    assert!(max_depth <= QUEUE);
    // Promptly: the refusal is a failed non-blocking push, not a wait.
    assert!(p(0.5) < Duration::from_micros(50), "median refusal took {:?}", p(0.5));
    assert!(p(0.99) < Duration::from_millis(1), "p99 refusal took {:?}", p(0.99));
    // Bounded memory: a full queue of 16 KiB requests is 4 MiB; allow slack
    // for allocator caches, nowhere near the gigabytes of an unbounded
    // backlog.
    assert!(growth < 64 << 20, "resident set grew by {} MiB", growth >> 20);
    let m = engine.metrics();
    let rsa = m.class(OpClass::Rsa);
    assert_eq!(rsa.errors.get(ErrorKind::Overloaded), refusals.len() as u64);
    assert_eq!(rsa.completed, accepted + 8);
    assert_eq!(rsa.queue_depth, 0);
}
