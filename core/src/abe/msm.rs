//! Multi-scalar multiplication in G1 for the sizes decryption meets.
//!
//! blst picks Booth-windowed Straus below 32 points and Pippenger from 32
//! on, but Pippenger is already faster from about 8 points. Padding an
//! 8-31 point sum to 32 points with zero scalars makes blst take
//! Pippenger, where a zero digit costs nothing. Measured on one core
//! (`floor::tests::msm_sizes`, release, idle machine): 8 points 392 ->
//! 353 us, 16: 714 -> 487, 25: 996 -> 645 (the key side of
//! `and50neg25`), 31: 1203 -> 764; from 32 on nothing changes.

use blstrs::{G1Projective, Scalar};
use ff::Field;
use group::Group;

/// From this many points on, padding to [`PIPPENGER_FROM`] wins.
const PAD_FROM: usize = 8;
/// blst's switch to Pippenger.
const PIPPENGER_FROM: usize = 32;

/// `sum s_i P_i`.
pub(crate) fn msm(points: &[G1Projective], scalars: &[Scalar]) -> G1Projective {
    let n = points.len().min(scalars.len());
    if !(PAD_FROM..PIPPENGER_FROM).contains(&n) {
        return G1Projective::multi_exp(&points[..n], &scalars[..n]);
    }
    let mut p = points[..n].to_vec();
    let mut s = scalars[..n].to_vec();
    p.resize(PIPPENGER_FROM, G1Projective::generator());
    s.resize(PIPPENGER_FROM, Scalar::ZERO);
    G1Projective::multi_exp(&p, &s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_does_not_change_the_sum() {
        let mut rng = rand_core::OsRng;
        for n in [1, 2, 19, 20, 25, 31, 32, 40] {
            let p: Vec<G1Projective> = (0..n).map(|_| G1Projective::random(&mut rng)).collect();
            let s: Vec<Scalar> = (0..n).map(|_| Scalar::random(&mut rng)).collect();
            let naive = p.iter().zip(&s).fold(G1Projective::identity(), |acc, (p, s)| acc + p * s);
            assert_eq!(msm(&p, &s), naive, "{n} points");
        }
    }
}
