//! BLS12-381 elements in CIRCL's encodings, CIRCL-compatible sampling and
//! hashing, on top of `blstrs` (the `blst` assembly-optimised backend).
//!
//! * G1, G2: uncompressed ZCash encoding (96 and 192 bytes); decoding
//!   checks the point is on the curve and in the prime-order subgroup.
//! * Gt: the 12 base-field coefficients, 48 bytes big-endian each, highest
//!   first (`c1.c2.c1`, `c1.c2.c0`, ..., `c0.c0.c0`), 576 bytes.
//! * Scalars: 32 bytes big-endian, canonical (below the group order).

use blstrs::{Fp, Fp12, G1Affine, G1Projective, G2Affine, Gt, Scalar};
use ff::{Field, PrimeField};
use group::prime::PrimeCurveAffine;
#[cfg(test)]
use group::Group;

use rand_core::{CryptoRng, RngCore};
use zeroize::DefaultIsZeroes;

pub(crate) const G1_LEN: usize = 96;
pub(crate) const G2_LEN: usize = 192;
pub(crate) const GT_LEN: usize = 576;

/// A `Copy` value that is overwritten with its default when zeroized:
/// secret scalars and secret points are stored in this wrapper so that
/// `zeroize` can wipe them.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
#[repr(transparent)]
pub(crate) struct Wiped<T>(pub(crate) T);

impl<T: Copy + Default> DefaultIsZeroes for Wiped<T> {}

/// Overwrites secret temporaries of a `blstrs` type with its default (zero,
/// or the identity point). `blstrs` types do not implement `Zeroize`, and a
/// `Vec<Scalar>` cannot be viewed as `Vec<Wiped<Scalar>>` without `unsafe`,
/// so the writes are plain stores kept alive by `black_box` and a compiler
/// fence instead of `zeroize`'s volatile writes: best effort, as all
/// wiping in Rust is. Values stored for long (keys) use [`Wiped`].
pub(crate) fn wipe<T: Copy + Default>(values: &mut [T]) {
    wipe_to(values, T::default());
}

/// [`wipe`] with an explicit neutral value, for the projective point types
/// that have no `Default` (their identity).
pub(crate) fn wipe_to<T: Copy>(values: &mut [T], neutral: T) {
    for v in values.iter_mut() {
        *v = neutral;
    }
    std::hint::black_box(&mut *values);
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// The group order r, big-endian.
#[cfg(test)]
const ORDER_BE: [u8; 32] = [
    0x73, 0xed, 0xa7, 0x53, 0x29, 0x9d, 0x7d, 0x48, 0x33, 0x39, 0xd8, 0x08, 0x09, 0xa1, 0xd8, 0x05, 0x53, 0xbd, 0xa4, 0x02, 0xff, 0xfe,
    0x5b, 0xfe, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01,
];

/// `2^-256 mod r`.
fn montgomery_inverse() -> Scalar {
    static R_INV: std::sync::OnceLock<Scalar> = std::sync::OnceLock::new();
    *R_INV.get_or_init(|| {
        let r = Scalar::from(2u64).pow_vartime([256u64]);
        Option::from(r.invert()).expect("2^256 is invertible mod r")
    })
}

/// Samples a uniform scalar exactly as CIRCL's `Scalar.Random` does: Go's
/// `crypto/rand.Int(rng, r)` (read 32 bytes, keep the low 255 bits, retry
/// unless below r) stored directly as the Montgomery representation, so
/// the scalar is `x * 2^-256 mod r`. Still uniform; reproducing the quirk
/// makes the same random bytes give CIRCL and keyfence the same scalar,
/// which attribute hashing and the known-answer tests need.
pub(crate) fn random_scalar<R: RngCore + CryptoRng + ?Sized>(rng: &mut R) -> Scalar {
    let mut buf = [0u8; 32];
    loop {
        rng.fill_bytes(&mut buf);
        buf[0] &= 0x7f;
        let s = Option::<Scalar>::from(Scalar::from_bytes_be(&buf));
        if let Some(s) = s {
            zeroize::Zeroize::zeroize(&mut buf);
            return s * montgomery_inverse();
        }
    }
}

/// A canonical big-endian scalar, or `None`.
pub(crate) fn scalar_from_be(b: &[u8]) -> Option<Scalar> {
    let arr: [u8; 32] = b.try_into().ok()?;
    Option::from(Scalar::from_bytes_be(&arr))
}

/// Any 32 bytes, big-endian, reduced modulo r (Go's `Scalar.SetBytes`).
pub(crate) fn scalar_reduce_be(b: &[u8; 32]) -> Scalar {
    let hi = u128::from_be_bytes(std::array::from_fn(|i| b[i]));
    let lo = u128::from_be_bytes(std::array::from_fn(|i| b[16 + i]));
    let two64 = Scalar::from(u64::MAX) + Scalar::ONE;
    let two128 = two64 * two64;
    Scalar::from_u128(hi) * two128 + Scalar::from_u128(lo)
}

pub(crate) fn g1_to_bytes(p: &G1Affine) -> [u8; G1_LEN] {
    p.to_uncompressed()
}

pub(crate) fn g2_to_bytes(p: &G2Affine) -> [u8; G2_LEN] {
    p.to_uncompressed()
}

/// Decodes a G1 point, checking curve and subgroup membership.
pub(crate) fn g1_from_bytes(b: &[u8]) -> Result<G1Affine, &'static str> {
    let p = g1_on_curve_from_bytes(b)?;
    g1_subgroup_check(&p)?;
    Ok(p)
}

/// The subgroup half of [`g1_from_bytes`], for a point decoded by
/// [`g1_on_curve_from_bytes`].
pub(crate) fn g1_subgroup_check(p: &G1Affine) -> Result<(), &'static str> {
    if bool::from(p.is_torsion_free()) {
        Ok(())
    } else {
        Err("point is not in the G1 subgroup")
    }
}

/// Decodes a point of the G1 curve `E(Fp)` without the subgroup check
/// (about 30 us a point): for ciphertext points that only ever meet the
/// key's G2 points in a pairing, which sends any component outside the
/// prime-order subgroup to 1 (docs/abe.md, "Subgroup checks").
pub(crate) fn g1_on_curve_from_bytes(b: &[u8]) -> Result<G1Affine, &'static str> {
    let arr: &[u8; G1_LEN] = b.try_into().map_err(|_| "a G1 point is 96 bytes")?;
    // blst would read a set compression flag as a 48-byte compressed point
    // and ignore the rest: a second encoding of the same point.
    if arr[0] & 0x80 != 0 {
        return Err("compressed-point flag set in an uncompressed encoding");
    }
    let p = Option::<G1Affine>::from(G1Affine::from_uncompressed_unchecked(arr))
        .ok_or("not a point on the G1 curve (or bad encoding flags)")?;
    if !bool::from(p.is_on_curve()) {
        return Err("point is not on the G1 curve");
    }
    // Every point of a key or ciphertext is the generator raised to a
    // random exponent: the identity only ever comes from a forger, who
    // would make a ciphertext anyone can open (issue 14).
    if bool::from(p.is_identity()) {
        return Err("point at infinity, which the scheme never produces");
    }
    Ok(p)
}

/// Decodes a G2 point, checking curve and subgroup membership.
pub(crate) fn g2_from_bytes(b: &[u8]) -> Result<G2Affine, &'static str> {
    let arr: &[u8; G2_LEN] = b.try_into().map_err(|_| "a G2 point is 192 bytes")?;
    if arr[0] & 0x80 != 0 {
        return Err("compressed-point flag set in an uncompressed encoding");
    }
    let p = Option::<G2Affine>::from(G2Affine::from_uncompressed_unchecked(arr))
        .ok_or("not a point on the G2 curve (or bad encoding flags)")?;
    if !bool::from(p.is_on_curve()) {
        return Err("point is not on the G2 curve");
    }
    if !bool::from(p.is_torsion_free()) {
        return Err("point is not in the G2 subgroup");
    }
    if bool::from(p.is_identity()) {
        return Err("point at infinity, which the scheme never produces");
    }
    Ok(p)
}

/// blst's big-endian Fp12 encoding lists the coefficients as
/// `c0.c0.0, c0.c0.1, c1.c0.0, c1.c0.1, c0.c1.0, ...` (Fp2 index outer, Fp6
/// index inner); CIRCL lists them from `c1.c2.1` down to `c0.c0.0`. This
/// maps CIRCL's k-th 48-byte chunk to blst's chunk index.
const fn blst_chunk(k: usize) -> usize {
    // CIRCL chunk k holds coefficient 11 - k in the order
    // (fp6 j, fp2 i, fp e) -> 6j + 2i + e.
    let c = 11 - k;
    let (j, i, e) = (c / 6, (c % 6) / 2, c % 2);
    i * 4 + j * 2 + e
}

pub(crate) fn fp12_to_bytes(f: &blst::blst_fp12) -> [u8; GT_LEN] {
    let be = f.to_bendian();
    let mut out = [0u8; GT_LEN];
    for k in 0..12 {
        let b = blst_chunk(k);
        out[k * 48..(k + 1) * 48].copy_from_slice(&be[b * 48..(b + 1) * 48]);
    }
    out
}

pub(crate) fn gt_to_bytes(x: &Gt) -> [u8; GT_LEN] {
    let f: Fp12 = (*x).into();
    fp12_to_bytes(&f.into())
}

/// Decodes a Gt element, checking it is in the order-r subgroup.
pub(crate) fn gt_from_bytes(b: &[u8]) -> Result<Gt, &'static str> {
    if b.len() != GT_LEN {
        return Err("a Gt element is 576 bytes");
    }
    let mut f = blst::blst_fp12::default();
    for (k, chunk) in b.chunks_exact(48).enumerate() {
        let arr: [u8; 48] = std::array::from_fn(|i| chunk[i]);
        let c: Fp = Option::from(Fp::from_bytes_be(&arr)).ok_or("coefficient is not below the field modulus")?;
        let idx = 11 - k;
        let (j, i, e) = (idx / 6, (idx % 6) / 2, idx % 2);
        f.fp6[j].fp2[i].fp[e] = c.into();
    }
    if !f.in_group() || Fp12::from(f) == Fp12::ZERO {
        return Err("element is not in the order-r subgroup of Gt");
    }
    // Gt elements are pairings raised to random exponents (or masked by
    // one): the identity is as much a forger's mark as a G1 or G2 one.
    if Fp12::from(f) == Fp12::ONE {
        return Err("the identity of Gt, which the scheme never produces");
    }
    Ok(Gt::from(Fp12::from(f)))
}

/// Hash to G1 (RFC 9380 `BLS12381G1_XMD:SHA-256_SSWU_RO_` with the given
/// domain separation tag), as CIRCL's `G1.Hash`.
pub(crate) fn hash_to_g1(msg: &[u8], dst: &[u8]) -> G1Projective {
    G1Projective::hash_to_curve(msg, dst, &[])
}

/// `e(g1, g2)`, the base of Gt exponents.
#[cfg(test)]
fn gt_generator() -> Gt {
    Gt::generator()
}

/// Whether a 32-byte string is the canonical encoding of some scalar.
#[cfg(test)]
fn is_canonical_scalar(b: &[u8]) -> bool {
    b.len() == 32 && b < &ORDER_BE[..]
}

/// Wraps a final-exponentiated blst Fp12 value as a Gt element.
pub(crate) fn gt_from_fp12(f: &blst::blst_fp12) -> Gt {
    Gt::from(Fp12::from(*f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gt_round_trips_and_rejects_non_members() {
        let g = gt_generator() * Scalar::from(12345u64);
        let b = gt_to_bytes(&g);
        assert_eq!(gt_from_bytes(&b).unwrap(), g);
        let mut bad = b;
        bad[GT_LEN - 1] ^= 1;
        assert!(gt_from_bytes(&bad).is_err());
    }

    #[test]
    fn uncompressed_encodings_are_canonical() {
        use group::Curve;
        let p = (blstrs::G1Projective::generator() * Scalar::from(7u64)).to_affine();
        let mut b = g1_to_bytes(&p);
        assert_eq!(g1_from_bytes(&b).unwrap(), p);
        // The same point's compressed form, padded: must not decode.
        let c = p.to_compressed();
        b[..48].copy_from_slice(&c);
        assert!(g1_from_bytes(&b).is_err());
        let q = (blstrs::G2Projective::generator() * Scalar::from(7u64)).to_affine();
        let mut b = g2_to_bytes(&q);
        b[..96].copy_from_slice(&q.to_compressed());
        assert!(g2_from_bytes(&b).is_err());
    }

    #[test]
    fn the_identity_is_refused_in_every_group() {
        use group::Curve;
        let g1 = g1_to_bytes(&blstrs::G1Projective::identity().to_affine());
        assert_eq!(g1_from_bytes(&g1).unwrap_err(), "point at infinity, which the scheme never produces");
        let g2 = g2_to_bytes(&blstrs::G2Projective::identity().to_affine());
        assert_eq!(g2_from_bytes(&g2).unwrap_err(), "point at infinity, which the scheme never produces");
        let gt = gt_to_bytes(&Gt::identity());
        assert_eq!(gt_from_bytes(&gt).unwrap_err(), "the identity of Gt, which the scheme never produces");
        // Their neighbours, the generators, still decode.
        assert!(g1_from_bytes(&g1_to_bytes(&G1Affine::generator())).is_ok());
        assert!(g2_from_bytes(&g2_to_bytes(&G2Affine::generator())).is_ok());
        assert!(gt_from_bytes(&gt_to_bytes(&gt_generator())).is_ok());
    }

    #[test]
    fn reduction_matches_big_integer_arithmetic() {
        let max = [0xffu8; 32];
        // 2^256 - 1 mod r, computed independently: (2^256 - 1) - 2r... is
        // checked here through the identity x = hi*2^128 + lo.
        let s = scalar_reduce_be(&max);
        let minus_one = -Scalar::ONE;
        let mut r_be = ORDER_BE;
        // r - 1 reduces to itself.
        r_be[31] -= 1;
        assert_eq!(scalar_reduce_be(&r_be), minus_one);
        assert_ne!(s, Scalar::ZERO);
        assert!(is_canonical_scalar(&r_be));
        assert!(!is_canonical_scalar(&ORDER_BE));
    }
}
