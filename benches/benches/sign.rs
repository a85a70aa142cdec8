//! Signing: BoringSSL called directly (`raw`) against the same operation
//! through the engine, one at a time (`engine`: submission, executor
//! hand-off, completion) and in batches of 64 in flight (`engine_batch64`,
//! throughput with the executor's threads busy); the same two through the
//! key process (`isolated`, `isolated_batch64`) and through the
//! offload backend on a zero-latency simulated device (`offload-sim`,
//! `offload-sim_batch64`). The side-by-side throughput with every core busy
//! is `keyfence bench sign`.
//!
//! The key process is `keyfence-key-process`, found the engine's way (beside the
//! bench binary or one directory up; never on `PATH`):
//! `./x bench` builds it first; without it the isolated paths are skipped
//! with a note.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use keyfence::sign::key_process::{KeyProcess, KeyProcessConfig, KeySource};
use keyfence::sign::offload::{OffloadBackend, OffloadConfig, Route, Routing, SimConfig, SimDevice};
use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyKind, PrivateKey, Request};
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::rsa::Padding;
use openssl::sign::{RsaPssSaltlen, Signer};

const MSG: [u8; 130] = [0x20; 130];

fn raw_sign(pkey: &PKey<Private>, alg: Algorithm) -> Vec<u8> {
    let mut signer = match alg {
        Algorithm::Ed25519 => Signer::new_without_digest(pkey).unwrap(),
        Algorithm::EcdsaP384Sha384 => Signer::new(MessageDigest::sha384(), pkey).unwrap(),
        _ => Signer::new(MessageDigest::sha256(), pkey).unwrap(),
    };
    if alg == Algorithm::RsaPssSha256 {
        signer.set_rsa_padding(Padding::PKCS1_PSS).unwrap();
        signer.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).unwrap();
    }
    signer.sign_oneshot_to_vec(&MSG).unwrap()
}

fn generate(kind: KeyKind) -> PKey<Private> {
    use openssl::ec::{EcGroup, EcKey};
    use openssl::nid::Nid;
    match kind {
        KeyKind::Rsa { bits } => PKey::from_rsa(openssl::rsa::Rsa::generate(bits).unwrap()).unwrap(),
        KeyKind::Ed25519 => PKey::generate_ed25519().unwrap(),
        KeyKind::EcP256 | KeyKind::EcP384 => {
            let nid = if kind == KeyKind::EcP256 { Nid::X9_62_PRIME256V1 } else { Nid::SECP384R1 };
            PKey::from_ec_key(EcKey::generate(&EcGroup::from_curve_name(nid).unwrap()).unwrap()).unwrap()
        }
    }
}

/// One operation at a time, then 64 in flight, through `engine`.
fn bench_path(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, name: &str, path: &str, engine: &Engine,
    key: &Arc<PrivateKey>, alg: Algorithm,
) {
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new(name, path), |b| b.iter(|| engine.sign(key, alg, &MSG).unwrap().wait().unwrap()));
    g.throughput(Throughput::Elements(64));
    g.bench_function(BenchmarkId::new(name, format!("{path}_batch64")), |b| {
        b.iter(|| {
            let remaining = Arc::new(AtomicUsize::new(64));
            let me = std::thread::current();
            for _ in 0..64 {
                let (remaining, me) = (remaining.clone(), me.clone());
                engine
                    .submit_with_callback(Request::sign(key.clone(), alg, MSG.to_vec()), move |r| {
                        assert!(r.is_ok());
                        if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                            me.unpark();
                        }
                    })
                    .unwrap();
            }
            while remaining.load(Ordering::Acquire) > 0 {
                std::thread::park();
            }
        })
    });
}

/// The engine on the offload backend with a simulated device that adds no
/// latency: every operation it can do goes to it.
fn offload_sim_engine() -> Engine {
    let mut sim = SimConfig::default();
    sim.latency = std::time::Duration::ZERO;
    let mut offload = OffloadConfig::default();
    offload.routing = Routing::all(Route::Device);
    let backend = OffloadBackend::with_device(Arc::new(SimDevice::new(sim).unwrap()), offload).unwrap();
    Engine::with_backend(EngineConfig::default(), Arc::new(backend)).unwrap()
}

fn bench(c: &mut Criterion) {
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let offload = offload_sim_engine();
    let keys = match KeyProcess::start(KeyProcessConfig::default()) {
        Ok(k) => Some(k),
        Err(e) => {
            eprintln!(
                "skipping the isolated paths: {e} (build keyfence-key-process first: cargo build -p keyfence --bin keyfence-key-process)"
            );
            None
        }
    };
    let scratch = std::env::temp_dir().join(format!("keyfence-bench-sign-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let cases = [
        ("rsa2048-pkcs1-sha256", Algorithm::RsaPkcs1Sha256, KeyKind::Rsa { bits: 2048 }),
        ("rsa2048-pss-sha256", Algorithm::RsaPssSha256, KeyKind::Rsa { bits: 2048 }),
        ("ecdsa-p256-sha256", Algorithm::EcdsaP256Sha256, KeyKind::EcP256),
        ("ecdsa-p384-sha384", Algorithm::EcdsaP384Sha384, KeyKind::EcP384),
        ("ed25519", Algorithm::Ed25519, KeyKind::Ed25519),
    ];
    let mut g = c.benchmark_group("sign");
    for (name, alg, kind) in cases {
        // One key for every path: made by BoringSSL, imported into keyfence
        // (a keyfence key cannot be exported for the baseline) and loaded
        // into the key process from a file.
        let pkey = generate(kind);
        let der = pkey.private_key_to_pkcs8().unwrap();
        let key = Arc::new(PrivateKey::from_der(&der).unwrap());
        if matches!(kind, KeyKind::Rsa { .. }) {
            g.sample_size(20);
        } else {
            g.sample_size(100);
        }
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new(name, "raw"), |b| b.iter(|| raw_sign(&pkey, alg)));
        bench_path(&mut g, name, "engine", &engine, &key, alg);
        if let Some(keys) = &keys {
            let file = scratch.join(format!("{name}.der"));
            std::fs::write(&file, &der).unwrap();
            let remote = keys.load(KeySource::File(file.clone())).unwrap();
            std::fs::remove_file(&file).unwrap();
            bench_path(&mut g, name, "isolated", &engine, &remote, alg);
        }
        // The simulated device, like QAT, does not do Ed25519.
        if kind != KeyKind::Ed25519 {
            bench_path(&mut g, name, "offload-sim", &offload, &key, alg);
        }
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&scratch);
}

criterion_group!(benches, bench);
criterion_main!(benches);
