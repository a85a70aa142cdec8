//! Fixed-base exponentiation tables for the public key's bases.
//!
//! Every encryption multiplies the same public points (`[B]_2`) and
//! raises the same Gt elements (`[B^T k]_T`) by fresh secret scalars.
//! A table of `k * 16^i * base` for every 4-bit window `i` turns a
//! 255-doubling scalar multiplication into 64 additions. Lookups scan the
//! whole 16-entry row with constant-time selection, because the scalars
//! are the encryptor's secret randomness.

use blstrs::{Fp, Fp12, G1Affine, G1Projective, G2Affine, G2Projective, Gt, Scalar};
use ff::Field;
use group::prime::PrimeCurveAffine;
use group::{Curve, Group};
use subtle::{ConditionallySelectable, ConstantTimeEq};

const WINDOWS: usize = 64;

fn nibble(bytes: &[u8; 32], i: usize) -> u8 {
    (bytes[i / 2] >> (4 * (i % 2))) & 0x0f
}

/// A table for one base point of a curve group.
pub(crate) struct Table<A: Copy + Default> {
    rows: Vec<[A; 16]>,
}

/// A table of a secret point (an attribute key's Boneh-Katz points) is as
/// secret as the point: wiped when dropped.
impl<A: Copy + Default> Drop for Table<A> {
    fn drop(&mut self) {
        super::group::wipe(self.rows.as_flattened_mut());
    }
}

/// The rows of a table: `k * 16^i * base` for `k` in 0..16, projective.
fn table_points<P: Group + Copy>(base: P) -> Vec<P> {
    let mut proj = vec![P::identity(); WINDOWS * 16];
    let mut w = base;
    for row in proj.chunks_mut(16) {
        for k in 1..16 {
            row[k] = row[k - 1] + w;
        }
        w = row[15] + w;
    }
    proj
}

pub(crate) fn g2_table(base: &G2Affine) -> Table<G2Affine> {
    let proj = table_points(G2Projective::from(base));
    let mut aff = vec![G2Affine::default(); WINDOWS * 16];
    G2Projective::batch_normalize(&proj, &mut aff);
    Table { rows: aff.chunks(16).map(|c| std::array::from_fn(|k| c[k])).collect() }
}

/// A G1 table (built when an attribute key is loaded), normalized with
/// one batched inversion by blst's `blst_p1s_to_affine` (through the
/// `blst` crate's safe `p1_affines`): the `group` crate's default
/// `batch_normalize`, which blstrs keeps, inverts every point, and took
/// 3.4 ms per table instead of a fraction of one.
pub(crate) fn g1_table(base: &G1Affine) -> Table<G1Affine> {
    let mut proj = table_points(G1Projective::from(base));
    // The identities (k = 0) stay out of blst's batch.
    let mut finite: Vec<blst::blst_p1> = proj.chunks(16).flat_map(|row| row[1..].iter().map(|p| *p.as_ref())).collect();
    let aff = blst::p1_affines::from(&finite);
    // The temporaries hold multiples of a secret point. (blst's
    // `p1_affines` offers no way to overwrite its own buffer.)
    super::group::wipe_to(&mut proj, G1Projective::identity());
    super::group::wipe(&mut finite);
    let rows = aff
        .as_slice()
        .chunks(15)
        .map(|c| {
            std::array::from_fn(|k| match k {
                0 => G1Affine::identity(),
                _ => G1Affine::from_raw_unchecked(Fp::from(c[k - 1].x), Fp::from(c[k - 1].y), false),
            })
        })
        .collect();
    Table { rows }
}

macro_rules! curve_mul {
    ($proj:ty, $aff:ty, $mul:ident) => {
        // G1's constant-time multiplication is only tested: keys use
        // `g1_mul_public` for their public scalar.
        #[cfg_attr(not(test), allow(dead_code))]
        pub(crate) fn $mul(t: &Table<$aff>, s: &Scalar) -> $proj {
            let bytes = s.to_bytes_le();
            let mut acc = <$proj>::identity();
            for (i, row) in t.rows.iter().enumerate() {
                let n = nibble(&bytes, i);
                let mut pick = row[0];
                for (k, e) in row.iter().enumerate().skip(1) {
                    pick.conditional_assign(e, (k as u8).ct_eq(&n));
                }
                acc += &pick;
            }
            acc
        }
    };
}

curve_mul!(G1Projective, G1Affine, g1_mul);

/// [`g1_mul`] for a public scalar (the Boneh-Katz id a ciphertext
/// carries): a direct lookup per window instead of a scan.
pub(crate) fn g1_mul_public(t: &Table<G1Affine>, s: &Scalar) -> G1Projective {
    let bytes = s.to_bytes_le();
    let mut acc = G1Projective::identity();
    for (i, row) in t.rows.iter().enumerate() {
        let n = nibble(&bytes, i);
        if n != 0 {
            acc += &row[usize::from(n)];
        }
    }
    acc
}
curve_mul!(G2Projective, G2Affine, g2_mul);

/// A table for one Gt element (stored as Fp12; Gt's group law is Fp12
/// multiplication).
pub(crate) struct GtTable {
    rows: Vec<[Fp12; 16]>,
}

pub(crate) fn gt_table(base: &Gt) -> GtTable {
    let mut rows = Vec::with_capacity(WINDOWS);
    let mut w: Fp12 = (*base).into();
    for _ in 0..WINDOWS {
        let mut row = [Fp12::ONE; 16];
        for k in 1..16 {
            row[k] = row[k - 1] * w;
        }
        w = row[15] * w;
        rows.push(row);
    }
    GtTable { rows }
}

pub(crate) fn gt_pow(t: &GtTable, s: &Scalar) -> Fp12 {
    let bytes = s.to_bytes_le();
    let mut acc = Fp12::ONE;
    for (i, row) in t.rows.iter().enumerate() {
        let n = nibble(&bytes, i);
        let mut pick = row[0];
        for (k, e) in row.iter().enumerate().skip(1) {
            pick.conditional_assign(e, (k as u8).ct_eq(&n));
        }
        acc *= pick;
    }
    acc
}

/// The tables of a public key, built on its first use for encryption.
pub(crate) struct PublicTables {
    pub(crate) b2: Vec<Table<G2Affine>>,
    pub(crate) btk: Vec<GtTable>,
}

impl PublicTables {
    /// Tables of a public key's `b2` and `btk` points (given as points, so
    /// that this module stays below the key types that hold its tables).
    pub(crate) fn new(b2: &[G2Affine], btk: &[Gt]) -> Self {
        Self { b2: b2.iter().map(g2_table).collect(), btk: btk.iter().map(gt_table).collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_agree_with_plain_multiplication() {
        let mut rng = rand_core::OsRng;
        let p = (G1Projective::generator() * Scalar::random(&mut rng)).to_affine();
        let q = (G2Projective::generator() * Scalar::random(&mut rng)).to_affine();
        let g = Gt::generator() * Scalar::random(&mut rng);
        let (tp, tq, tg) = (g1_table(&p), g2_table(&q), gt_table(&g));
        for s in [Scalar::ZERO, Scalar::ONE, -Scalar::ONE, Scalar::random(&mut rng)] {
            assert_eq!(g1_mul(&tp, &s), p * s);
            assert_eq!(g1_mul_public(&tp, &s), p * s);
            assert_eq!(g2_mul(&tq, &s), q * s);
            assert_eq!(Gt::from(gt_pow(&tg, &s)), g * s);
        }
    }
}
