//! Signing: BoringSSL called directly (`raw`) against the same operation
//! through the engine, one at a time (`engine`: submission, executor
//! hand-off, completion) and in batches of 64 in flight (`engine_batch64`,
//! throughput with the executor's threads busy). The side-by-side
//! throughput with every core busy is `keyfence bench sign`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use boring::hash::MessageDigest;
use boring::pkey::{PKey, Private};
use boring::rsa::Padding;
use boring::sign::{RsaPssSaltlen, Signer};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyKind, PrivateKey, Request};

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
    use boring::ec::{EcGroup, EcKey};
    use boring::nid::Nid;
    match kind {
        KeyKind::Rsa { bits } => PKey::from_rsa(boring::rsa::Rsa::generate(bits).unwrap()).unwrap(),
        KeyKind::Ed25519 => PKey::generate(boring::pkey::Id::ED25519).unwrap(),
        KeyKind::EcP256 | KeyKind::EcP384 => {
            let nid = if kind == KeyKind::EcP256 { Nid::X9_62_PRIME256V1 } else { Nid::SECP384R1 };
            PKey::from_ec_key(EcKey::generate(&EcGroup::from_curve_name(nid).unwrap()).unwrap()).unwrap()
        }
    }
}

fn bench(c: &mut Criterion) {
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let cases = [
        ("rsa2048-pkcs1-sha256", Algorithm::RsaPkcs1Sha256, KeyKind::Rsa { bits: 2048 }),
        ("rsa2048-pss-sha256", Algorithm::RsaPssSha256, KeyKind::Rsa { bits: 2048 }),
        ("ecdsa-p256-sha256", Algorithm::EcdsaP256Sha256, KeyKind::EcP256),
        ("ecdsa-p384-sha384", Algorithm::EcdsaP384Sha384, KeyKind::EcP384),
        ("ed25519", Algorithm::Ed25519, KeyKind::Ed25519),
    ];
    let mut g = c.benchmark_group("sign");
    for (name, alg, kind) in cases {
        // One key for both paths: made by BoringSSL, imported into keyfence
        // (a keyfence key cannot be exported for the baseline).
        let pkey = generate(kind);
        let key = Arc::new(PrivateKey::from_der(&pkey.private_key_to_der_pkcs8().unwrap()).unwrap());
        if matches!(kind, KeyKind::Rsa { .. }) {
            g.sample_size(20);
        } else {
            g.sample_size(100);
        }
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new(name, "raw"), |b| b.iter(|| raw_sign(&pkey, alg)));
        g.bench_function(BenchmarkId::new(name, "engine"), |b| {
            b.iter(|| engine.sign(&key, alg, &MSG).unwrap().wait().unwrap())
        });
        g.throughput(Throughput::Elements(64));
        g.bench_function(BenchmarkId::new(name, "engine_batch64"), |b| {
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
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
