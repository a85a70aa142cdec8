//! The per-label random oracle (two 3x2 matrices of G1 points hashed from
//! the label) and the authority's per-label PRF (two 3x2 scalar matrices).
//!
//! Hashing a label costs twelve hash-to-curve evaluations, the largest
//! single cost of encrypting or issuing a key, and labels repeat across
//! every ciphertext and key of a deployment; the matrices are therefore
//! cached process-wide (they are public, derived from the label alone).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use blstrs::{G1Affine, G1Projective, Scalar};
use group::Curve;

use super::blake2x::Xof;
use super::group::{hash_to_g1, random_scalar};
use super::matrix::Mat;

/// `U0`, `U1` for one label.
pub(crate) struct LabelMatrices {
    pub(crate) u0: Mat<G1Affine>,
    pub(crate) u1: Mat<G1Affine>,
}

const CACHE_LIMIT: usize = 4096;

fn cache() -> &'static Mutex<HashMap<Vec<u8>, Arc<LabelMatrices>>> {
    static CACHE: OnceLock<Mutex<HashMap<Vec<u8>, Arc<LabelMatrices>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The oracle matrices of `label`, from the cache when present.
pub(crate) fn label_matrices(label: &[u8]) -> Arc<LabelMatrices> {
    if let Some(m) = cache().lock().unwrap_or_else(|e| e.into_inner()).get(label) {
        return m.clone();
    }
    let m = Arc::new(compute(label));
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    if c.len() >= CACHE_LIMIT {
        // Labels are few in practice; a full cache means unusual input, and
        // starting over bounds memory without an LRU's bookkeeping.
        c.clear();
    }
    c.insert(label.to_vec(), m.clone());
    m
}

fn compute(label: &[u8]) -> LabelMatrices {
    let mut a = Vec::with_capacity(6);
    let mut b = Vec::with_capacity(6);
    for i in 0..3 {
        for j in 0..2 {
            a.push(hash_to_g1(label, format!("a matrix entry [{i}, {j}]").as_bytes()));
            b.push(hash_to_g1(label, format!("b matrix entry [{i}, {j}]").as_bytes()));
        }
    }
    let mut aff = vec![G1Affine::default(); 12];
    let all: Vec<G1Projective> = a.into_iter().chain(b).collect();
    G1Projective::batch_normalize(&all, &mut aff);
    LabelMatrices { u0: Mat { rows: 3, cols: 2, e: aff[..6].to_vec() }, u1: Mat { rows: 3, cols: 2, e: aff[6..].to_vec() } }
}

/// The authority's PRF: `V0`, `V1` for `label` under `key`. Each entry is
/// sampled from its own clone of a keyed BLAKE2Xb absorbing the label and
/// the entry's name.
pub(crate) fn prf(key: &[u8], label: &[u8]) -> (Mat<Scalar>, Mat<Scalar>) {
    let mut base = Xof::new(key);
    base.update(label);
    let entry = |name: String| {
        let mut x = base.clone();
        x.update(name.as_bytes());
        random_scalar(&mut x.finish())
    };
    let mut m1 = Vec::with_capacity(6);
    let mut m2 = Vec::with_capacity(6);
    for i in 0..3 {
        for j in 0..2 {
            m1.push(entry(format!("m1 matrix entry ({i}, {j})")));
            m2.push(entry(format!("m2 matrix entry ({i}, {j})")));
        }
    }
    (Mat { rows: 3, cols: 2, e: m1 }, Mat { rows: 3, cols: 2, e: m2 })
}

/// The key under which attribute values are hashed to scalars.
const ATTR_HASH_KEY: &[u8] = b"attribute value hashing";

/// An attribute value as a scalar (keyed BLAKE2Xb, then Go's rejection
/// sampler), as CIRCL's `HashStringToScalar`.
pub(crate) fn hash_value(value: &str) -> Scalar {
    let mut x = Xof::new(ATTR_HASH_KEY);
    x.update(value.as_bytes());
    random_scalar(&mut x.finish())
}
