//! Small matrices over Zp, G1, G2 and Gt in CIRCL's encoding: u16 rows, u16
//! columns, then the entries row by row.

use blstrs::{G1Affine, G2Affine, Gt, Scalar};
use ff::Field;
use zeroize::Zeroize;

use super::error::{codec, malformed, Result};
use super::group::{self, Wiped};
use crate::codec::{Order, Reader};

/// A row-major matrix.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Mat<T> {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) e: Vec<T>,
}

impl<T: Copy> Mat<T> {
    pub(crate) fn from_fn(rows: usize, cols: usize, mut f: impl FnMut(usize, usize) -> T) -> Self {
        let mut e = Vec::with_capacity(rows * cols);
        for i in 0..rows {
            for j in 0..cols {
                e.push(f(i, j));
            }
        }
        Self { rows, cols, e }
    }

    pub(crate) fn at(&self, i: usize, j: usize) -> T {
        self.e[i * self.cols + j]
    }

    pub(crate) fn map<U: Copy>(&self, mut f: impl FnMut(T) -> U) -> Mat<U> {
        Mat { rows: self.rows, cols: self.cols, e: self.e.iter().map(|&x| f(x)).collect() }
    }
}

impl<T: Copy + Default> Mat<T> {
    /// Overwrites the entries of a secret temporary ([`group::wipe`]).
    pub(crate) fn wipe(&mut self) {
        group::wipe(&mut self.e);
    }
}

impl<T: Zeroize> Zeroize for Mat<T> {
    fn zeroize(&mut self) {
        self.e.zeroize();
    }
}

/// Secret scalar matrices are stored wiped-on-drop.
pub(crate) type SecretMat = Mat<Wiped<Scalar>>;

impl SecretMat {
    pub(crate) fn secret(m: &Mat<Scalar>) -> Self {
        m.map(Wiped)
    }
    pub(crate) fn get(&self, i: usize, j: usize) -> Scalar {
        self.at(i, j).0
    }
}

pub(crate) fn mul(a: &Mat<Scalar>, b: &Mat<Scalar>) -> Mat<Scalar> {
    debug_assert_eq!(a.cols, b.rows);
    Mat::from_fn(a.rows, b.cols, |i, j| (0..a.cols).map(|k| a.at(i, k) * b.at(k, j)).sum())
}

pub(crate) fn transpose<T: Copy>(a: &Mat<T>) -> Mat<T> {
    Mat::from_fn(a.cols, a.rows, |i, j| a.at(j, i))
}

pub(crate) fn colsel<T: Copy>(a: &Mat<T>, cols: &[usize]) -> Mat<T> {
    Mat::from_fn(a.rows, cols.len(), |i, j| a.at(i, cols[j]))
}

/// Gauss-Jordan inverse of a square matrix, `None` if singular.
pub(crate) fn inverse(a: &Mat<Scalar>) -> Option<Mat<Scalar>> {
    let n = a.rows;
    let mut m = a.clone();
    let mut inv = Mat::from_fn(n, n, |i, j| if i == j { Scalar::ONE } else { Scalar::ZERO });
    for col in 0..n {
        let pivot = (col..n).find(|&r| !bool::from(m.at(r, col).is_zero()))?;
        for k in 0..n {
            m.e.swap(col * n + k, pivot * n + k);
            inv.e.swap(col * n + k, pivot * n + k);
        }
        let p = Option::<Scalar>::from(m.at(col, col).invert())?;
        for k in 0..n {
            m.e[col * n + k] *= p;
            inv.e[col * n + k] *= p;
        }
        for r in 0..n {
            if r != col {
                let f = m.at(r, col);
                for k in 0..n {
                    let (mv, iv) = (m.at(col, k), inv.at(col, k));
                    m.e[r * n + k] -= f * mv;
                    inv.e[r * n + k] -= f * iv;
                }
            }
        }
    }
    Some(inv)
}

fn header(rows: usize, cols: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&(rows as u16).to_le_bytes());
    out.extend_from_slice(&(cols as u16).to_le_bytes());
}

pub(crate) fn encode_zp(m: &Mat<Scalar>) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 32 * m.e.len());
    header(m.rows, m.cols, &mut out);
    for s in &m.e {
        out.extend_from_slice(&s.to_bytes_be());
    }
    out
}

pub(crate) fn encode_g1(m: &Mat<G1Affine>) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + group::G1_LEN * m.e.len());
    header(m.rows, m.cols, &mut out);
    for p in &m.e {
        out.extend_from_slice(&group::g1_to_bytes(p));
    }
    out
}

pub(crate) fn encode_g2(m: &Mat<G2Affine>) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + group::G2_LEN * m.e.len());
    header(m.rows, m.cols, &mut out);
    for p in &m.e {
        out.extend_from_slice(&group::g2_to_bytes(p));
    }
    out
}

pub(crate) fn encode_gt(m: &Mat<Gt>) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + group::GT_LEN * m.e.len());
    header(m.rows, m.cols, &mut out);
    for p in &m.e {
        out.extend_from_slice(&group::gt_to_bytes(p));
    }
    out
}

/// Decodes a matrix of the expected shape whose entries are `width` bytes.
fn decode<T>(
    bytes: &[u8], shape: (usize, usize), width: usize, object: &'static str, field: &str, entry: impl Fn(&[u8]) -> Result<T, &'static str>,
) -> Result<Mat<T>> {
    let err = codec(object);
    let mut r = Reader::new(bytes, Order::Little);
    let rows = usize::from(r.u16(|| format!("{field}.rows")).map_err(&err)?);
    let cols = usize::from(r.u16(|| format!("{field}.cols")).map_err(&err)?);
    if (rows, cols) != shape {
        return Err(malformed(object, field, format!("expected a {}x{} matrix, found {rows}x{cols}", shape.0, shape.1)));
    }
    let mut e = Vec::with_capacity(rows * cols);
    for k in 0..rows * cols {
        let b = r.take(width, || format!("{field}[{},{}]", k / cols, k % cols)).map_err(&err)?;
        e.push(entry(b).map_err(|why| malformed(object, format!("{field}[{},{}]", k / cols, k % cols), why))?);
    }
    r.finish_as(|| field.to_string()).map_err(&err)?;
    Ok(Mat { rows, cols, e })
}

pub(crate) fn decode_zp(b: &[u8], shape: (usize, usize), object: &'static str, field: &str) -> Result<Mat<Scalar>> {
    decode(b, shape, 32, object, field, |x| group::scalar_from_be(x).ok_or("scalar is not below the group order"))
}

pub(crate) fn decode_g1(b: &[u8], shape: (usize, usize), object: &'static str, field: &str) -> Result<Mat<G1Affine>> {
    decode(b, shape, group::G1_LEN, object, field, group::g1_from_bytes)
}

/// [`decode_g1`] without the subgroup checks ([`group::g1_on_curve_from_bytes`]).
pub(crate) fn decode_g1_on_curve(b: &[u8], shape: (usize, usize), object: &'static str, field: &str) -> Result<Mat<G1Affine>> {
    decode(b, shape, group::G1_LEN, object, field, group::g1_on_curve_from_bytes)
}

pub(crate) fn decode_g2(b: &[u8], shape: (usize, usize), object: &'static str, field: &str) -> Result<Mat<G2Affine>> {
    decode(b, shape, group::G2_LEN, object, field, group::g2_from_bytes)
}

pub(crate) fn decode_gt(b: &[u8], shape: (usize, usize), object: &'static str, field: &str) -> Result<Mat<Gt>> {
    decode(b, shape, group::GT_LEN, object, field, group::gt_from_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_inverts() {
        let a = Mat::from_fn(4, 4, |_, _| Scalar::random(&mut rand_core::OsRng));
        let inv = inverse(&a).unwrap();
        let id = mul(&a, &inv);
        for i in 0..4 {
            for j in 0..4 {
                assert_eq!(id.at(i, j), if i == j { Scalar::ONE } else { Scalar::ZERO });
            }
        }
        let singular = Mat::from_fn(2, 2, |_, _| Scalar::ONE);
        assert!(inverse(&singular).is_none());
    }
}
