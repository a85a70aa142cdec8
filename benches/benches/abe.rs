//! CP-ABE: setup, and keygen / encrypt / decrypt across attribute counts
//! (1 to 100 clauses joined by `and`) and on CIRCL's benchmark shapes,
//! where strict decryption (every point subgroup-checked) is measured too.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use keyfence::abe;
use keyfence::policy::{parse, Attributes};

const MSG: &[u8] = b"a 23-byte test message!";

fn bench(c: &mut Criterion) {
    let (pk, msk) = abe::setup().unwrap();
    let mut g = c.benchmark_group("abe");
    g.sample_size(10);
    g.bench_function("setup", |b| b.iter(abe::setup));
    for n in [1usize, 10, 50, 100] {
        let attrs: Attributes = (0..n).map(|i| (format!("a{i}"), format!("v{i}"))).collect();
        let policy = parse(&(0..n).map(|i| format!("a{i}: v{i}")).collect::<Vec<_>>().join(" and ")).unwrap();
        g.bench_with_input(BenchmarkId::new("keygen", n), &attrs, |b, a| b.iter(|| abe::keygen(&msk, a).unwrap()));
        g.bench_with_input(BenchmarkId::new("encrypt", n), &policy, |b, p| b.iter(|| abe::encrypt_policy(&pk, p, MSG).unwrap()));
        let key = abe::keygen(&msk, &attrs).unwrap();
        let ct = abe::encrypt_policy(&pk, &policy, MSG).unwrap();
        g.bench_with_input(BenchmarkId::new("decrypt_2_threads", n), &ct, |b, ct| {
            b.iter(|| abe::decrypt_with_threads(&key, ct, 2).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("decrypt", n), &ct, |b, ct| b.iter(|| abe::decrypt(&key, ct).unwrap()));
    }
    for (name, policy, attrs) in keyfence::bench::abe_cases() {
        let policy = parse(&policy).unwrap();
        let key = abe::keygen(&msk, &attrs).unwrap();
        let ct = abe::encrypt_policy(&pk, &policy, MSG).unwrap();
        g.bench_function(BenchmarkId::new("keygen", name), |b| b.iter(|| abe::keygen(&msk, &attrs).unwrap()));
        g.bench_function(BenchmarkId::new("encrypt", name), |b| b.iter(|| abe::encrypt_policy(&pk, &policy, MSG).unwrap()));
        g.bench_function(BenchmarkId::new("decrypt", name), |b| b.iter(|| abe::decrypt(&key, &ct).unwrap()));
        g.bench_function(BenchmarkId::new("decrypt_strict", name), |b| b.iter(|| abe::decrypt_strict(&key, &ct).unwrap()));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
