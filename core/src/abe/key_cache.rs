//! What an attribute key precomputes for decryption: the Miller-loop
//! lines of its `k1` points (see [`super::lines`]), built when the key is
//! decoded, and fixed-base tables for the Boneh-Katz attribute's `k3`
//! points, which every decryption multiplies by the ciphertext's id (4
//! scalar multiplications become 4 times 64 additions), built at the
//! key's [`TABLES_AT`]th decryption. Shared by the key's clones; wiped
//! when the last of them is dropped.
//!
//! The tables wait because they cost what they save over about 20
//! decryptions (`load_cost` below, release build: a table 2.0 ms, a
//! multiplication 0.13 ms without it and 0.045 ms with it, four of each
//! per decryption). A key loaded to decrypt a few times (the command line,
//! a short-lived worker, a machine opening its policy keys at boot) would
//! pay for them and never earn it back. Building them once the plain
//! multiplications have cost about as much as the tables (the ski-rental
//! rule) keeps any key within twice the best choice made in hindsight,
//! and a key that decrypts on and on at the same speed as before.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use blstrs::{G1Affine, G1Projective, G2Affine, Scalar};

/// The decryption at which a key builds its Boneh-Katz tables.
pub(crate) const TABLES_AT: u32 = 16;

use super::fixed_base::{g1_mul_public, g1_table, Table};
use super::lines::Lines;

/// An attribute key's precomputed values.
pub(crate) struct KeyCache {
    /// The lines of `k1`'s three points, in order.
    pub(crate) k1_lines: Vec<Lines>,
    /// Tables of `k3[BK_LABEL]`'s four points, from the second decryption
    /// on (empty if the key lacks them: decryption then reports the
    /// missing component).
    bk: OnceLock<Vec<Table<G1Affine>>>,
    /// How many decryptions have asked for the tables.
    bk_uses: AtomicU32,
}

impl KeyCache {
    /// The cache of a key whose `k1` points are `k1` (given as points, so
    /// that this module stays below the key type that holds its cache).
    pub(crate) fn new<'a>(k1: impl Iterator<Item = &'a G2Affine>) -> Self {
        Self { k1_lines: k1.map(|q| Lines::new(q.as_ref())).collect(), bk: OnceLock::new(), bk_uses: AtomicU32::new(0) }
    }

    /// `id` times each of the Boneh-Katz attribute's points `bk`, from
    /// tables built at the [`TABLES_AT`]th call; `None` before (the caller
    /// multiplies without tables) or if the key lacks the points.
    pub(crate) fn bk_times<'a>(&self, bk: impl FnOnce() -> Option<Vec<&'a G1Affine>>, id: &Scalar) -> Option<Vec<G1Projective>> {
        if self.bk.get().is_none() && self.bk_uses.fetch_add(1, Ordering::Relaxed) + 1 < TABLES_AT {
            return None;
        }
        let tables = self.bk.get_or_init(|| bk().map_or_else(Vec::new, |points| points.into_iter().map(g1_table).collect()));
        (!tables.is_empty()).then(|| tables.iter().map(|t| g1_mul_public(t, id)).collect())
    }

    /// Whether the Boneh-Katz tables are built (for tests).
    #[cfg(test)]
    pub(crate) fn has_bk_tables(&self) -> bool {
        self.bk.get().is_some()
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
                (0..10)
                    .map(|_| {
                        let t = Instant::now();
                        f();
                        t.elapsed().as_secs_f64() * 1e3
                    })
                    .fold(f64::MAX, f64::min)
            };
            let load = best(&|| drop(AttributeKey::from_bytes(&bytes).unwrap()));
            let key = AttributeKey::from_bytes(&bytes).unwrap();
            let cache = best(&|| drop(KeyCache::new(key.k1.e.iter().map(|q| &q.0))));
            let table = best(&|| drop(g1_table(&key.k2.e[0].0)));
            let point = key.k3[BK_LABEL].e[0].0;
            let id = super::super::oracle::hash_value("an id");
            let mul = best(&|| {
                std::hint::black_box(G1Projective::from(point) * id);
            });
            let t = g1_table(&point);
            let table_mul = best(&|| {
                std::hint::black_box(g1_mul_public(&t, &id));
            });
            eprintln!(
                "{n} attributes: from_bytes {load:.2} ms, of which the lines {cache:.2} ms; one table {table:.2} ms, \
                 a multiplication {mul:.3} ms without it, {table_mul:.3} ms with it"
            );
        }
    }
}
