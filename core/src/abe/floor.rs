//! The lower bound of a decryption, measured: what no implementation on
//! blst can skip for a given key and ciphertext.

use std::time::{Duration, Instant};

use blstrs::{G1Affine, G1Projective, Scalar};
use ff::Field;
use group::prime::PrimeCurveAffine;
use group::Group;

use super::bk;
use super::error::{AbeError, Result};
use super::keys::AttributeKey;
use super::matrix;

/// The lower bound of one decryption, measured by [`decrypt_floor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecryptFloor {
    /// The pairing side: the G2 subgroup checks of the ciphertext points
    /// the decryption uses, one Miller loop over all its pairs sharing its
    /// squarings (blst's `miller_loop_n`, no precomputation) and one final
    /// exponentiation.
    pub pairing: Duration,
    /// The multi-scalar multiplications negated attributes need (blst's
    /// `multi_exp` on as many points, with random scalars, as the
    /// decryption combines): zero for policies without negations.
    pub msm: Duration,
}

impl DecryptFloor {
    /// Both parts together.
    pub fn total(&self) -> Duration {
        self.pairing + self.msm
    }
}

/// Times, on this machine and now, the primitives a decryption of
/// `ciphertext` with `key` cannot avoid, run with blst's own functions on
/// the ciphertext's points. Decryption also hashes, decodes and adds
/// points; the ratio of its time to [`DecryptFloor::total`] says how close
/// it is to the bound.
///
/// ```
/// # let (pk, msk) = keyfence::abe::setup()?;
/// # let key = keyfence::abe::keygen(&msk, &"region=EU".parse()?)?;
/// let ct = keyfence::abe::encrypt(&pk, "region: EU", b"x")?;
/// let floor = keyfence::bench::decrypt_floor(&key, &ct)?;
/// assert!(floor.pairing > std::time::Duration::ZERO);
/// assert_eq!(floor.msm, std::time::Duration::ZERO);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`super::decrypt`] for a ciphertext that does not parse, whose
/// G2 points are invalid, or whose policy the key does not satisfy.
pub fn decrypt_floor(key: &AttributeKey, ciphertext: &[u8]) -> Result<DecryptFloor> {
    let p = bk::parse(ciphertext)?;
    let policy = bk::bk_policy(&p);
    let holds = |_: usize, w: &super::policy::Wire| match key.attrs.get(&w.label) {
        None => false,
        Some(a) => a.wild || ((a.value == w.value) == w.positive),
    };
    let used = policy.satisfying(holds).ok_or(AbeError::NotSatisfied)?;
    let (pi, d) = policy.occurrences();
    let mut copies = vec![false; d];
    // Scalar terms per copy: ciphertext side (3 rows), key side (4 rows).
    let mut terms = vec![(0usize, 0usize); d];
    for &i in &used {
        let j = pi[i];
        copies[j] = true;
        if !policy.wires[i].positive {
            let wild = key.attrs.get(&policy.wires[i].label).is_some_and(|a| a.wild);
            terms[j].0 += 2;
            terms[j].1 += if wild { 2 } else { 1 };
        }
    }
    let fields: Vec<&[u8]> = copies.iter().enumerate().filter(|(_, c)| **c).map(|(j, _)| p.header.c2[j]).chain([p.header.c1]).collect();

    let t = Instant::now();
    let mut qs = Vec::new();
    for f in &fields {
        qs.extend(matrix::decode_g2(f, (4, 1), "ciphertext", "c2")?.e.iter().map(|q| *q.as_ref()));
    }
    let checks = t.elapsed();
    // Every pair of the decryption equation: the ciphertext's G2 points
    // and the key's k1. The G1 side's values do not change the cost.
    qs.extend(key.k1.e.iter().map(|q| *q.0.as_ref()));
    let ps: Vec<blst::blst_p1_affine> = qs.iter().map(|_| *G1Affine::generator().as_ref()).collect();
    let t = Instant::now();
    let f = blst::blst_fp12::miller_loop_n(&qs, &ps);
    let f = std::hint::black_box(f).final_exp();
    std::hint::black_box(f);
    let pairing = checks + t.elapsed();

    // The MSMs, on distinct points and uniformly random scalars like the
    // real ones (structured scalars such as -k^2 have runs of zero digits
    // that Pippenger skips, which would flatter the bound).
    let most = terms.iter().map(|t| t.0.max(t.1)).max().unwrap_or(0);
    let pts: Vec<G1Projective> = (1..=most as u64).map(|k| G1Projective::generator() * Scalar::from(k)).collect();
    let sc: Vec<Scalar> = (0..most).map(|_| Scalar::random(&mut rand_core::OsRng)).collect();
    if most == 0 {
        return Ok(DecryptFloor { pairing, msm: Duration::ZERO });
    }
    let t = Instant::now();
    for &(n1, n2) in &terms {
        for (n, rows) in [(n1, 3), (n2, 4)] {
            for _ in 0..if n > 0 { rows } else { 0 } {
                std::hint::black_box(G1Projective::multi_exp(&pts[..n], &sc[..n]));
            }
        }
    }
    Ok(DecryptFloor { pairing, msm: t.elapsed() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// blst switches from Booth-windowed Straus to Pippenger at 32 points.
    /// Would padding a smaller sum with zero scalars to take Pippenger win?
    /// Prints both (run with --release --ignored). Measured with random
    /// scalars, best of 7 alternated runs: a loss below 20 points (8: 384
    /// vs 526 us), 3-6% at 25-31; not worth the code, so not used.
    #[test]
    #[ignore]
    fn msm_sizes() {
        let pts: Vec<G1Projective> = (1..=100u64).map(|k| G1Projective::generator() * Scalar::from(k)).collect();
        let sc: Vec<Scalar> = (0..100).map(|_| Scalar::random(&mut rand_core::OsRng)).collect();
        for n in [8usize, 12, 16, 20, 25, 31] {
            let time = |f: &dyn Fn() -> G1Projective| {
                let t = Instant::now();
                for _ in 0..10 {
                    std::hint::black_box(f());
                }
                t.elapsed().as_secs_f64() * 1e6 / 10.0
            };
            // Alternated, best of 7: the machine is shared.
            let (mut plain, mut padded) = (f64::MAX, f64::MAX);
            for _ in 0..7 {
                plain = plain.min(time(&|| G1Projective::multi_exp(&pts[..n], &sc[..n])));
                padded = padded.min(time(&|| {
                    let mut p = pts[..n].to_vec();
                    let mut s = sc[..n].to_vec();
                    p.resize(32, G1Projective::generator());
                    s.resize(32, Scalar::ZERO);
                    G1Projective::multi_exp(&p, &s)
                }));
            }
            eprintln!("n={n:3}: {plain:8.1} us blst as is, {padded:8.1} us padded to Pippenger");
        }
    }
}
