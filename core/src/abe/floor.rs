//! The lower bound of a decryption, measured: what no implementation on
//! blst can skip for a given key and ciphertext.

use std::time::{Duration, Instant};

use blstrs::G1Affine;
use group::prime::PrimeCurveAffine;

use super::bk;
use super::error::{AbeError, Result};
use super::keys::AttributeKey;
use super::matrix;

/// Times, on this machine and now, the primitives a decryption of
/// `ciphertext` with `key` cannot avoid: the G2 subgroup checks of the
/// ciphertext points it uses, one Miller loop over all its pairs sharing
/// its squarings (blst's `miller_loop_n`, no precomputation), and one
/// final exponentiation. Decryption also hashes, decodes and adds points;
/// the ratio of its time to this one says how close it is to the bound.
///
/// ```
/// # let (pk, msk) = keyfence::abe::setup()?;
/// # let key = keyfence::abe::keygen(&msk, &"region=EU".parse()?)?;
/// let ct = keyfence::abe::encrypt(&pk, "region: EU", b"x")?;
/// assert!(keyfence::abe::decrypt_floor(&key, &ct)? > std::time::Duration::ZERO);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`super::decrypt`] for a ciphertext that does not parse, whose
/// G2 points are invalid, or whose policy the key does not satisfy.
pub fn decrypt_floor(key: &AttributeKey, ciphertext: &[u8]) -> Result<Duration> {
    let p = bk::parse(ciphertext)?;
    let policy = bk::bk_policy(&p);
    let holds = |_: usize, w: &super::policy::Wire| match key.attrs.get(&w.label) {
        None => false,
        Some(a) => a.wild || ((a.value == w.value) == w.positive),
    };
    let used = policy.satisfying(holds).ok_or(AbeError::NotSatisfied)?;
    let (pi, d) = policy.occurrences();
    let mut copies = vec![false; d];
    for &i in &used {
        copies[pi[i]] = true;
    }
    let fields: Vec<&[u8]> =
        copies.iter().enumerate().filter(|(_, c)| **c).map(|(j, _)| p.header.c2[j]).chain([p.header.c1]).collect();

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
    Ok(checks + t.elapsed())
}
