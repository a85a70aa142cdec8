//! What an attribute key precomputes for decryption: the Miller-loop
//! lines of its `k1` points (see [`super::lines`]) and fixed-base tables
//! for the Boneh-Katz attribute's `k3` points, which every decryption
//! multiplies by the ciphertext's id (4 scalar multiplications become 4
//! times 64 additions). Built once per key,
//! when it is decoded or at its first decryption, and shared by its
//! clones; wiped when the last of them is dropped.

use blstrs::{G1Affine, G1Projective, G2Affine, Scalar};

use super::fixed_base::{g1_mul_public, g1_table, Table};
use super::lines::Lines;

/// An attribute key's precomputed values.
pub(crate) struct KeyCache {
    /// The lines of `k1`'s three points, in order.
    pub(crate) k1_lines: Vec<Lines>,
    /// Tables of `k3[BK_LABEL]`'s four points (none if the key lacks it:
    /// decryption then reports the missing component).
    bk: Vec<Table<G1Affine>>,
}

impl KeyCache {
    /// The cache of a key whose `k1` points are `k1` and whose Boneh-Katz
    /// attribute's `k3` points are `bk` (given as points, so that this
    /// module stays below the key type that holds its cache).
    pub(crate) fn new<'a>(k1: impl Iterator<Item = &'a G2Affine>, bk: Option<impl Iterator<Item = &'a G1Affine>>) -> Self {
        Self { k1_lines: k1.map(|q| Lines::new(q.as_ref())).collect(), bk: bk.map_or_else(Vec::new, |m| m.map(g1_table).collect()) }
    }

    /// `id` times each of `k3[BK_LABEL]`'s points, or `None` without
    /// tables.
    pub(crate) fn bk_times(&self, id: &Scalar) -> Option<Vec<G1Projective>> {
        (!self.bk.is_empty()).then(|| self.bk.iter().map(|t| g1_mul_public(t, id)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::AttributeKey;
    use super::super::policy::BK_LABEL;
    use super::*;
    use std::time::Instant;

    /// What loading a key costs with and without the cache (run with
    /// --release --ignored --nocapture).
    #[test]
    #[ignore]
    fn load_cost() {
        let (_, msk) = super::super::setup().unwrap();
        for n in [2usize, 50] {
            let attrs = keyfence_policy::Attributes::from_pairs((0..n).map(|i| (format!("a{i}"), "v")));
            let bytes = super::super::keygen(&msk, &attrs).unwrap().to_bytes();
            let best = |f: &dyn Fn()| {
                (0..10).map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed().as_secs_f64() * 1e3
                }).fold(f64::MAX, f64::min)
            };
            let load = best(&|| drop(AttributeKey::from_bytes(&bytes).unwrap()));
            let key = AttributeKey::from_bytes(&bytes).unwrap();
            let cache = best(&|| drop(KeyCache::new(key.k1.e.iter().map(|q| &q.0), key.k3.get(BK_LABEL).map(|m| m.e.iter().map(|p| &p.0)))));
            let lines = best(&|| drop(key.k1.e.iter().map(|q| Lines::new(q.0.as_ref())).collect::<Vec<_>>()));
            let table = best(&|| drop(g1_table(&key.k2.e[0].0)));
            eprintln!("{n} attributes: from_bytes {load:.2} ms, of which the cache {cache:.2} ms (lines {lines:.2} ms, one table {table:.2} ms)");
        }
    }
}
