//! Policy-key wrapping: wrap, open with the policy key cached (hit) and
//! not (miss), a bare HPKE open of the same secret for comparison, and
//! master rotation with 10, 100 and 1000 policy keys.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use hpke::aead::ChaCha20Poly1305;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Kem, OpModeR, OpModeS};
use keyfence::wrap::{Authority, CacheConfig, Machine, MemoryStore, Store};
use rand_core::OsRng;

/// A 2048-bit RSA private key's PEM is about 1.7 KB.
const SECRET: [u8; 1700] = [0x42; 1700];

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("wrap");
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let mut a = Authority::init(store.clone()).unwrap();
    let env = a.wrap("region: EU and not country: FR", &SECRET).unwrap();
    let key = a.issue(&"region=EU,country=DE".parse().unwrap()).unwrap();
    let m = Machine::new(key, store.clone(), CacheConfig::default());

    g.bench_function("wrap", |b| b.iter(|| a.wrap("region: EU and not country: FR", &SECRET).unwrap()));
    m.open(env.to_bytes()).unwrap();
    g.bench_function("open_hit", |b| b.iter(|| m.open(env.to_bytes()).unwrap()));
    g.bench_function("open_miss", |b| {
        b.iter(|| {
            m.clear_cache();
            m.open(env.to_bytes()).unwrap()
        })
    });
    // The floor: HPKE alone, same suite, same secret size, no envelope.
    let (sk, pk) = X25519HkdfSha256::gen_keypair(&mut OsRng);
    let (enc, ct) = hpke::single_shot_seal::<ChaCha20Poly1305, HkdfSha256, X25519HkdfSha256, _>(
        &OpModeS::Base,
        &pk,
        b"info",
        &SECRET,
        b"aad",
        &mut OsRng,
    )
    .unwrap();
    g.bench_function("bare_hpke_open", |b| {
        b.iter(|| {
            hpke::single_shot_open::<ChaCha20Poly1305, HkdfSha256, X25519HkdfSha256>(&OpModeR::Base, &sk, &enc, b"info", &ct, b"aad")
                .unwrap()
        })
    });
    g.sample_size(10);
    for n in [10usize, 100, 1000] {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut a = Authority::init(store).unwrap();
        for i in 0..n {
            a.wrap(&format!("region: EU and tier: t{i}"), b"x").unwrap();
        }
        g.bench_with_input(BenchmarkId::new("rotate_master", n), &n, |b, _| b.iter(|| a.rotate_master().unwrap()));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
