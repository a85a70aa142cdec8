//! Parsing and evaluating policies of growing size.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use keyfence::policy::{parse, Attributes};

fn clauses(n: usize, op: &str) -> String {
    (0..n).map(|i| format!("a{i}: v{i}")).collect::<Vec<_>>().join(op)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("policy");
    for n in [1usize, 10, 50, 100] {
        let src = clauses(n, " and ");
        g.bench_with_input(BenchmarkId::new("parse_and", n), &src, |b, s| b.iter(|| parse(black_box(s)).unwrap()));
        let p = parse(&src).unwrap();
        let attrs: Attributes = (0..n).map(|i| (format!("a{i}"), format!("v{i}"))).collect();
        g.bench_with_input(BenchmarkId::new("eval_and", n), &p, |b, p| b.iter(|| p.eval(black_box(&attrs))));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
