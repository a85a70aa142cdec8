//! A multi-pairing Miller loop over precomputed line functions.
//!
//! A Miller loop for a pair `(P, Q)` walks the bits of BLS12-381's `x`,
//! doubling (and, at set bits, adding) a G2 point built from `Q` and
//! multiplying the accumulator by the line through it, evaluated at `P`.
//! The G2 half of that work depends on `Q` alone: blst can record the 68
//! lines once (`blst_precompute_lines`), leaving per pair only the
//! evaluation at `P` and a sparse Fp12 multiplication. An attribute key
//! records the lines of its `k1` points when it is loaded; the
//! ciphertext's G2 points are recorded per decryption (the same cost as
//! in the loop). One loop then serves every pair, so the Fp12 squarings
//! are shared as in blst's `miller_loop_n`; blstrs' `multi_miller_loop`
//! would run one loop, and its squarings, per pair.

// blst's line API has no safe wrapper: two FFI calls, each with its
// SAFETY argument.
#![allow(unsafe_code)]

use blst::{blst_fp12, blst_fp6, blst_p1_affine, blst_p2_affine};
use blstrs::{Fp, Fp12};
use ff::Field;

/// Lines in a Miller loop of BLS12-381 (blst's `Qlines[68]`).
pub(crate) const LINES: usize = 68;

/// The loop's schedule for `|x| = 0xd201000000010000`: each group starts
/// with an addition line, followed by that many doubling lines (each after
/// a squaring). Line 0 is the first doubling. Mirrors blst's
/// `precompute_lines`.
const GROUPS: [(usize, usize); 5] = [(1, 2), (4, 3), (8, 9), (18, 32), (51, 16)];

/// The 68 lines of one G2 point. Lines of a secret point (a key's `k1`)
/// are as secret as the point: they are wiped on drop.
pub(crate) struct Lines(Box<[blst_fp6; LINES]>);

impl Lines {
    /// Records the lines of `q`, a finite point of G2.
    pub(crate) fn new(q: &blst_p2_affine) -> Self {
        let mut lines = Box::new([blst_fp6::default(); LINES]);
        // SAFETY: `blst_precompute_lines` writes exactly 68 `blst_fp6`
        // values (its C signature is `vec384fp6 Qlines[68]`) through the
        // pointer, which points at a live, exclusively borrowed array of
        // 68; it reads `q`, a valid reference, and keeps neither pointer.
        unsafe { blst::blst_precompute_lines(lines.as_mut_ptr(), q) };
        Lines(lines)
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        super::group::wipe(&mut self.0[..]);
    }
}

/// `(-2 P.x, 2 P.y)`: blst's lines are scaled to be evaluated at these.
fn px2(p: &blst_p1_affine) -> (Fp, Fp) {
    let (x, y) = (Fp::from(p.x), Fp::from(p.y));
    (-x.double(), y.double())
}

/// The product of the Miller loops of `pairs` (lines of `Q`, affine `P`),
/// not yet final-exponentiated: the input of `final_exp`. Every `P` must
/// be finite (a pair with the identity contributes 1 and is left out by
/// the caller).
#[cfg(test)]
pub(crate) fn miller_loop(pairs: &[(&Lines, blst_p1_affine)]) -> blst_fp12 {
    miller_loop_share(pairs, 0..pairs.len() * LINES)
}

/// One lane's share of the Miller loop of `pairs`: every squaring, but
/// only the lines numbered in `share`, where pair `i`'s line `k` is number
/// `i * LINES + k`.
///
/// A line multiplied in at step `k` is raised by the squarings after `k`,
/// which every share runs alike, so the product of shares that partition
/// `0..pairs.len() * LINES` is [`miller_loop`]'s output, whichever lane
/// took which line. Lanes can thus split one pair's lines between them
/// and do equal work: with whole pairs, 11 pairs on two lanes were 6 and
/// 5, and the lane with 6 set the step's time.
pub(crate) fn miller_loop_share(pairs: &[(&Lines, blst_p1_affine)], share: std::ops::Range<usize>) -> blst_fp12 {
    // Only the pairs the share touches.
    let first = share.start / LINES;
    let pairs = &pairs[first.min(pairs.len())..share.end.div_ceil(LINES).min(pairs.len())];
    let at: Vec<(Fp, Fp)> = pairs.iter().map(|(_, p)| px2(p)).collect();
    let mut f = blst_fp12::from(Fp12::ONE);
    let mul_lines = |f: &mut blst_fp12, k: usize| {
        for (i, ((lines, _), (x, y))) in pairs.iter().zip(&at).enumerate() {
            if !share.contains(&((first + i) * LINES + k)) {
                continue;
            }
            let mut l = lines.0[k];
            for e in 0..2 {
                l.fp2[1].fp[e] = (Fp::from(l.fp2[1].fp[e]) * x).into();
                l.fp2[2].fp[e] = (Fp::from(l.fp2[2].fp[e]) * y).into();
            }
            let acc = *f;
            // SAFETY: the three pointers come from live references (the
            // output aliases nothing: `acc` is a copy); blst reads an Fp12
            // and a sparse line packed as an Fp6 and writes one Fp12.
            unsafe { blst::blst_fp12_mul_by_xy00z0(f, &acc, &l) };
        }
    };
    mul_lines(&mut f, 0);
    for (start, doublings) in GROUPS {
        mul_lines(&mut f, start);
        for k in start + 1..=start + doublings {
            f = blst_fp12::from(Fp12::from(f).square());
            mul_lines(&mut f, k);
        }
    }
    // x is negative (conjugation is multiplicative, so the shares may
    // each conjugate).
    let mut f = Fp12::from(f);
    f.conjugate();
    f.into()
}

/// The lines of `pairs` pairs dealt to `lanes` lanes in equal contiguous
/// shares (see [`miller_loop_share`]), none empty.
pub(crate) fn shares(pairs: usize, lanes: usize) -> Vec<std::ops::Range<usize>> {
    let total = pairs * LINES;
    let lanes = lanes.clamp(1, total.max(1));
    (0..lanes).map(|j| total * j / lanes..total * (j + 1) / lanes).filter(|r| !r.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use blstrs::{G1Affine, G1Projective, G2Affine, G2Projective, Scalar};
    use group::{Curve, Group};

    /// `n` random pairs: the G1 points, the G2 points and their lines.
    fn random_pairs(n: usize) -> (Vec<G1Affine>, Vec<G2Affine>, Vec<Lines>) {
        let mut rng = rand_core::OsRng;
        let ps: Vec<G1Affine> = (0..n).map(|_| G1Projective::random(&mut rng).to_affine()).collect();
        let qs: Vec<G2Affine> = (0..n).map(|_| (G2Projective::generator() * Scalar::random(&mut rng)).to_affine()).collect();
        let lines = qs.iter().map(|q| Lines::new(q.as_ref())).collect();
        (ps, qs, lines)
    }

    #[test]
    fn agrees_with_blsts_own_multi_miller_loop() {
        let (ps, qs, lines) = random_pairs(5);
        for n in [1, 2, 5] {
            let pairs: Vec<(&Lines, blst_p1_affine)> = lines.iter().zip(&ps).take(n).map(|(l, p)| (l, *p.as_ref())).collect();
            let ours = miller_loop(&pairs).final_exp();
            let q: Vec<blst_p2_affine> = qs[..n].iter().map(|q| *q.as_ref()).collect();
            let p: Vec<blst_p1_affine> = ps[..n].iter().map(|p| *p.as_ref()).collect();
            let theirs = blst_fp12::miller_loop_n(&q, &p).final_exp();
            assert_eq!(ours, theirs, "{n} pairs");
        }
    }

    /// Shares that split pairs anywhere multiply to the whole loop's
    /// output, exactly (before the final exponentiation).
    #[test]
    fn shares_of_the_lines_multiply_to_the_whole_loop() {
        let (ps, _, lines) = random_pairs(3);
        let pairs: Vec<(&Lines, blst_p1_affine)> = lines.iter().zip(&ps).map(|(l, p)| (l, *p.as_ref())).collect();
        let whole = Fp12::from(miller_loop(&pairs));
        for lanes in [1, 2, 3, 4, 5, 7] {
            let split = shares(pairs.len(), lanes);
            assert_eq!(split.len(), lanes);
            assert_eq!(split.first().map(|r| r.start), Some(0));
            assert_eq!(split.last().map(|r| r.end), Some(3 * LINES));
            assert!(split.windows(2).all(|w| w[0].end == w[1].start), "{split:?}");
            let sizes: Vec<usize> = split.iter().map(|r| r.len()).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{sizes:?}");
            let product = split.iter().map(|r| Fp12::from(miller_loop_share(&pairs, r.clone()))).fold(Fp12::ONE, |a, b| a * b);
            assert_eq!(product, whole, "{lanes} lanes");
        }
        // A share of part of one pair, and one that leaves a line out, are
        // not the whole.
        let part = Fp12::from(miller_loop_share(&pairs, 0..3 * LINES - 1));
        assert_ne!(part, whole);
        assert_eq!(shares(1, 200).len(), LINES);
    }
}
