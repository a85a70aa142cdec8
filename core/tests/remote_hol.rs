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

mod common;
mod hol_support;
mod remote_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hol_support::Flood;
use keyfence::sign::{Algorithm, Engine, ErrorKind, KeyKind, LatencyBackend, OpClass, PrivateKey, Request};
use remote_support::*;

const ROUNDS: usize = 11;
const SAMPLES_PER_ROUND: usize = 600;
const FLOOR: Duration = Duration::from_micros(50);

#[test]
fn remote_peers_answering_after_200ms_do_not_delay_local_ecdsa() {
    let world = World::new();
    let slow: Arc<dyn keyfence::sign::Backend> = Arc::new(LatencyBackend::new(Duration::from_millis(200)));
    let sfo = start_server(&world, "sfo1", ServerOptions { backend: Some(slow), slow_threads: Some(128), ..Default::default() });
    let remote = client(&[("sfo1", sfo.local_addr())]);
    let remote_key = remote.key(&world.us_key).unwrap();

    let idle = Engine::new(hol_support::config()).unwrap();
    let loaded = Engine::new(hol_support::config()).unwrap();
    let local = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());

    // A remote signature takes the server's 200 ms: the slow path is slow.
    let t = Instant::now();
    loaded.sign(&remote_key, Algorithm::EcdsaP256Sha256, b"remote").unwrap().wait().unwrap();
    let remote_latency = t.elapsed();
    assert!(remote_latency >= Duration::from_millis(200), "{remote_latency:?}");

    let flood = {
        let key = remote_key.clone();
        Flood::start(&loaded, move || Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"remote".to_vec()))
    };

    let series = hol_support::series(&idle, &loaded, &local, (ROUNDS, SAMPLES_PER_ROUND), (1.2, FLOOR));
    let remote_ok = flood.succeeded();
    let overloaded = flood.stop();

    eprintln!("remote signatures completed meanwhile: {remote_ok}; flood refused {overloaded} times");
    assert!(overloaded > 0, "the slow class never refused work: it was not saturated");
    assert!(loaded.metrics().class(OpClass::Slow).errors.get(ErrorKind::Overloaded) > 0);
    assert!(remote_ok > 0, "the remote path did work meanwhile");
    let (idle_p99, loaded_p99) = *series.last().unwrap();
    let bound = idle_p99.mul_f64(1.2) + FLOOR;
    assert!(
        loaded_p99 <= bound,
        "head-of-line blocking: local ECDSA p99 {loaded_p99:?} with remote peers saturating the slow class, idle {idle_p99:?} \
         (bound {bound:?}); every series: {series:?}"
    );
}
