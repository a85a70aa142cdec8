//! The TKN20 scheme (Tomida, Kawahara, Nishimaki, PKC 2020, eprint
//! 2019/966) as CIRCL instantiates it: DLIN (k = 2) over BLS12-381, with
//! negated and repeated attributes.
//!
//! Shapes: `A` 3x2 (DLIN), `B` 4x2 (two columns of a random 4x4 `Bbar`),
//! `W` 3x4, `k` 4x1. Public key `[B]_2`, `[WB]_1`, `[B^T k]_T`; master
//! secret `A`, `W^T A`, `B*` and `B*_12` (column pairs of `Bbar^{-T}`),
//! `k`, and a PRF key. Every draw from the random source happens in CIRCL's
//! order, so the same random bytes give byte-identical keys and
//! ciphertexts (the known-answer tests rely on it).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use blstrs::{G1Affine, G1Projective, G2Affine, G2Projective, Gt, Scalar};
use ff::Field;
use group::prime::PrimeCurveAffine;
use group::{Curve, Group};
use rand_core::{CryptoRng, RngCore};

use super::error::{codec, malformed, too_large, AbeError, Result};
use super::fixed_base;
use super::group::{g1_subgroup_check, random_scalar, wipe, wipe_to, Wiped};
use super::keys::{AttributeKey, KeyAttr, MasterSecretKey, PublicKey};
use super::lines::{self, Lines};
use super::matrix::{self, Mat, SecretMat};
use super::oracle::{label_matrices, prf};
use super::parallel::{par_map, with_crew, Crew};
use super::policy::{AbePolicy, BK_LABEL};
use crate::codec::{Order, Reader, Writer};

fn random_mat<R: RngCore + CryptoRng + ?Sized>(rng: &mut R, rows: usize, cols: usize) -> Mat<Scalar> {
    let mut e = Vec::with_capacity(rows * cols);
    for _ in 0..rows * cols {
        e.push(random_scalar(rng));
    }
    Mat { rows, cols, e }
}

// The projective points are wiped: for key components they are secret.
fn g1_exp(m: &Mat<Scalar>) -> Mat<G1Affine> {
    let mut proj: Vec<G1Projective> = m.e.iter().map(|s| G1Projective::generator() * s).collect();
    let mut aff = vec![G1Affine::default(); proj.len()];
    G1Projective::batch_normalize(&proj, &mut aff);
    wipe_to(&mut proj, G1Projective::identity());
    Mat { rows: m.rows, cols: m.cols, e: aff }
}

fn g2_exp(m: &Mat<Scalar>) -> Mat<G2Affine> {
    let mut proj: Vec<G2Projective> = m.e.iter().map(|s| G2Projective::generator() * s).collect();
    let mut aff = vec![G2Affine::default(); proj.len()];
    G2Projective::batch_normalize(&proj, &mut aff);
    wipe_to(&mut proj, G2Projective::identity());
    Mat { rows: m.rows, cols: m.cols, e: aff }
}

/// Moves secret points into their long-term [`Wiped`] form and wipes the
/// temporary they came in.
fn keep<T: Copy + Default>(mut m: Mat<T>) -> Mat<Wiped<T>> {
    let kept = m.map(Wiped);
    m.wipe();
    kept
}

/// Generates a public key and master secret key.
pub(crate) fn setup<R: RngCore + CryptoRng + ?Sized>(rng: &mut R) -> Result<(PublicKey, MasterSecretKey)> {
    let a0 = random_scalar(rng);
    let a3 = random_scalar(rng);
    let mut a = Mat { rows: 3, cols: 2, e: vec![a0, Scalar::ZERO, Scalar::ZERO, a3, Scalar::ONE, Scalar::ONE] };
    wipe(&mut [a0, a3]);
    let mut bbar = random_mat(rng, 4, 4);
    let mut w = random_mat(rng, 3, 4);
    let mut k = random_mat(rng, 4, 1);
    let mut prf_key = vec![0u8; 16];
    rng.fill_bytes(&mut prf_key);

    // Every scalar here is secret, even those whose powers are public.
    let mut b = matrix::colsel(&bbar, &[0, 1]);
    let mut bt = matrix::transpose(&b);
    let mut wb = matrix::mul(&w, &b);
    let mut btk = matrix::mul(&bt, &k);
    let gt = Gt::generator();
    let pk = PublicKey::new(g2_exp(&b), g1_exp(&wb), btk.map(|s| gt * s));

    let mut wt = matrix::transpose(&w);
    let mut wta = matrix::mul(&wt, &a);
    let mut bbar_t = matrix::transpose(&bbar);
    let inv = matrix::inverse(&bbar_t);
    let msk = inv.map(|mut inv| {
        let (mut bstar, mut bstar12) = (matrix::colsel(&inv, &[0, 1]), matrix::colsel(&inv, &[2, 3]));
        let msk = MasterSecretKey {
            a: SecretMat::secret(&a),
            wta: SecretMat::secret(&wta),
            bstar: SecretMat::secret(&bstar),
            bstar12: SecretMat::secret(&bstar12),
            k: SecretMat::secret(&k),
            prf_key,
        };
        for m in [&mut inv, &mut bstar, &mut bstar12] {
            m.wipe();
        }
        msk
    });
    for m in [&mut a, &mut bbar, &mut w, &mut k, &mut b, &mut bt, &mut wb, &mut btk, &mut wt, &mut wta, &mut bbar_t] {
        m.wipe();
    }
    let msk = msk.ok_or_else(|| AbeError::Rng("sampled a singular matrix; the random source is broken".into()))?;
    Ok((pk, msk))
}

/// Issues a key for `attrs` (label -> hashed value), adding the
/// Boneh-Katz wildcard attribute, its per-attribute components on up to
/// `threads` threads.
pub(crate) fn keygen<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R, msk: &MasterSecretKey, attrs: &BTreeMap<String, Scalar>, threads: usize,
) -> Result<AttributeKey> {
    let mut all: BTreeMap<String, KeyAttr> = attrs.iter().map(|(l, v)| (l.clone(), KeyAttr { wild: false, value: *v })).collect();
    all.insert(BK_LABEL.into(), KeyAttr { wild: true, value: Scalar::ZERO });

    let mut s = [random_scalar(rng), random_scalar(rng)];
    let mut a_s: [Scalar; 3] = std::array::from_fn(|t| msk.a.get(t, 0) * s[0] + msk.a.get(t, 1) * s[1]);
    let mut a_s_mat = Mat { rows: 3, cols: 1, e: a_s.to_vec() };
    let k1 = keep(g2_exp(&a_s_mat));
    a_s_mat.wipe();
    let mut k2s = Mat::from_fn(4, 1, |m, _| msk.wta.get(m, 0) * s[0] + msk.wta.get(m, 1) * s[1] + msk.k.get(m, 0));
    let k2 = keep(g1_exp(&k2s));
    k2s.wipe();
    wipe(&mut s);

    // Each attribute's components depend on the master key, `As` and the
    // label alone (no draw from `rng`): computed on `threads` threads,
    // the key is the same bytes as on one.
    let entries: Vec<(&String, &KeyAttr)> = all.iter().collect();
    let comps = par_map(&entries, threads, |(label, attr)| {
        let u = label_matrices(label.as_bytes());
        // Derived from the master's PRF key: secret.
        let (mut v0, mut v1) = prf(&msk.prf_key, label.as_bytes());
        let comp = if attr.wild {
            (k3_component(msk, &a_s, &u.u0, None, &v0, None), Some(k3_component(msk, &a_s, &u.u1, None, &v1, None)))
        } else {
            (k3_component(msk, &a_s, &u.u0, Some(&u.u1), &v0, Some((&v1, attr.value))), None)
        };
        v0.wipe();
        v1.wipe();
        comp
    });
    wipe(&mut a_s);
    let mut k3 = BTreeMap::new();
    let mut k3wild = BTreeMap::new();
    for ((label, _), (c, wild)) in entries.into_iter().zip(comps) {
        k3.insert(label.clone(), c);
        if let Some(w) = wild {
            k3wild.insert(label.clone(), w);
        }
    }
    Ok(AttributeKey { attrs: all, k1, k2, k3, k3wild, cache: Default::default() })
}

/// `B* (y U0 + U1)^T As + [B*_12 (y V0 + V1)^T As]_1`, or without the
/// `U1`/`V1` terms for a wildcard component. Computed as
/// `Q_l = sum_t As_t (y U0 + U1)_{t,l}`, then `B* Q`: two 6-point and four
/// 3-point multi-scalar multiplications instead of 4x3x2 products.
fn k3_component(
    msk: &MasterSecretKey, a_s: &[Scalar; 3], u0: &Mat<G1Affine>, u1: Option<&Mat<G1Affine>>, v0: &Mat<Scalar>,
    v1y: Option<(&Mat<Scalar>, Scalar)>,
) -> Mat<Wiped<G1Affine>> {
    let y = v1y.map_or(Scalar::ONE, |(_, y)| y);
    let mut q: Vec<G1Projective> = (0..2)
        .map(|l| {
            let mut pts = Vec::with_capacity(6);
            let mut sc = Vec::with_capacity(6);
            for (t, &a) in a_s.iter().enumerate() {
                pts.push(G1Projective::from(u0.at(t, l)));
                sc.push(a * y);
                if let Some(u1) = u1 {
                    pts.push(G1Projective::from(u1.at(t, l)));
                    sc.push(a);
                }
            }
            let q = G1Projective::multi_exp(&pts, &sc);
            wipe(&mut sc);
            q
        })
        .collect();
    // (y V0 + V1)^T As, a 2-vector of scalars.
    let mut vs: [Scalar; 2] = std::array::from_fn(|l| {
        (0..3)
            .map(|t| {
                let v = v0.at(t, l) * y + v1y.map_or(Scalar::ZERO, |(v1, _)| v1.at(t, l));
                v * a_s[t]
            })
            .sum()
    });
    let mut rows: Vec<G1Projective> = (0..4)
        .map(|m| {
            let mut sc = [msk.bstar.get(m, 0), msk.bstar.get(m, 1), Scalar::ZERO];
            sc[2] = msk.bstar12.get(m, 0) * vs[0] + msk.bstar12.get(m, 1) * vs[1];
            let row = G1Projective::multi_exp(&[q[0], q[1], G1Projective::generator()], &sc);
            wipe(&mut sc);
            row
        })
        .collect();
    let mut aff = vec![G1Affine::default(); 4];
    G1Projective::batch_normalize(&rows, &mut aff);
    wipe_to(&mut q, G1Projective::identity());
    wipe(&mut vs);
    wipe_to(&mut rows, G1Projective::identity());
    keep(Mat { rows: 4, cols: 1, e: aff })
}

/// A ciphertext header: the policy and the group elements.
pub(crate) struct Header {
    pub(crate) c1: Mat<G2Affine>,
    pub(crate) c2: Vec<Mat<G2Affine>>,
    pub(crate) c3: Vec<Mat<G1Affine>>,
    pub(crate) c3neg: Vec<Option<Mat<G1Affine>>>,
}

/// Encrypts a fresh Gt element to `policy` (already augmented by the
/// Boneh-Katz transform), the wires' components on up to `threads`
/// threads. Returns the header and the element.
pub(crate) fn encapsulate<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R, pk: &PublicKey, policy: &AbePolicy, threads: usize,
) -> (Header, Gt) {
    let (pi, d) = policy.occurrences();
    let r = [random_scalar(rng), random_scalar(rng)];
    let ri: Vec<[Scalar; 2]> = (0..d).map(|_| [random_scalar(rng), random_scalar(rng)]).collect();

    // Secret shares of r over the formula, drawn in CIRCL's gate order.
    let n = policy.gates.len();
    let mut shares = vec![[Scalar::ZERO; 2]; 2 * n + 1];
    shares[2 * n] = r;
    for g in policy.circl_order().iter().rev() {
        let out = shares[g.out];
        match g.kind {
            keyfence_policy::GateKind::And => {
                let a = [random_scalar(rng), random_scalar(rng)];
                shares[g.in0] = a;
                shares[g.in1] = [out[0] - a[0], out[1] - a[1]];
            }
            keyfence_policy::GateKind::Or => {
                shares[g.in0] = out;
                shares[g.in1] = out;
            }
        }
    }

    let tables = pk.tables();
    let g2col = |v: &[Scalar; 2]| -> Mat<G2Affine> {
        let rows: Vec<G2Projective> =
            (0..4).map(|m| fixed_base::g2_mul(&tables.b2[m * 2], &v[0]) + fixed_base::g2_mul(&tables.b2[m * 2 + 1], &v[1])).collect();
        let mut aff = vec![G2Affine::default(); 4];
        G2Projective::batch_normalize(&rows, &mut aff);
        Mat { rows: 4, cols: 1, e: aff }
    };
    let c1 = g2col(&r);
    let c2: Vec<Mat<G2Affine>> = ri.iter().map(g2col).collect();
    let key = Gt::from(fixed_base::gt_pow(&tables.btk[0], &r[0]) * fixed_base::gt_pow(&tables.btk[1], &r[1]));

    let wb = |m: usize, l: usize| G1Projective::from(pk.wb1.at(m, l));
    // Every draw from `rng` is behind us: the wires' components depend on
    // the drawn values alone, so `threads` threads give the same bytes.
    let wires: Vec<(usize, &super::policy::Wire)> = policy.wires.iter().enumerate().collect();
    let comps = par_map(&wires, threads, |&(i, w)| {
        let u = label_matrices(w.label.as_bytes());
        let (u0, u1) = (|m, l| G1Projective::from(u.u0.at(m, l)), |m, l| G1Projective::from(u.u1.at(m, l)));
        let rj = ri[pi[i]];
        let rs = shares[i];
        let y = w.value;
        let row3 = |f: &dyn Fn(usize) -> G1Projective| -> Mat<G1Affine> {
            let rows: Vec<G1Projective> = (0..3).map(f).collect();
            let mut aff = vec![G1Affine::default(); 3];
            G1Projective::batch_normalize(&rows, &mut aff);
            Mat { rows: 3, cols: 1, e: aff }
        };
        if w.positive {
            let c3 = row3(&|m| {
                G1Projective::multi_exp(
                    &[u0(m, 0), u0(m, 1), u1(m, 0), u1(m, 1), wb(m, 0), wb(m, 1)],
                    &[y * rj[0], y * rj[1], rj[0], rj[1], rs[0], rs[1]],
                )
            });
            (c3, None)
        } else {
            let c3 = row3(&|m| G1Projective::multi_exp(&[u0(m, 0), u0(m, 1), wb(m, 0), wb(m, 1)], &[rj[0], rj[1], -rs[0], -rs[1]]));
            let c3neg =
                row3(&|m| G1Projective::multi_exp(&[u1(m, 0), u1(m, 1), wb(m, 0), wb(m, 1)], &[rj[0], rj[1], y * rs[0], y * rs[1]]));
            (c3, Some(c3neg))
        }
    });
    let (c3, c3neg): (Vec<_>, Vec<_>) = comps.into_iter().unzip();
    // The randomness and its shares would let anyone recompute `key`.
    let mut r = r;
    wipe(&mut r);
    let mut ri = ri;
    ri.iter_mut().for_each(|v| wipe(v));
    shares.iter_mut().for_each(|v| wipe(v));
    (Header { c1, c2, c3, c3neg }, key)
}

impl Header {
    /// CIRCL's encoding, with `policy` (the policy as written, without the
    /// Boneh-Katz term) in the policy field.
    pub(crate) fn encode(&self, policy: &AbePolicy) -> Result<Vec<u8>> {
        // The parser's policy limits keep every count and field below its
        // u16 prefix; `finish` still refuses rather than truncate.
        let mut w = Writer::new(Order::Little);
        w.bytes16(&policy.encode()?);
        w.bytes16(&matrix::encode_g2(&self.c1));
        w.len16(self.c2.len());
        for c in &self.c2 {
            w.bytes16(&matrix::encode_g2(c));
        }
        w.len16(self.c3.len());
        for c in &self.c3 {
            w.bytes16(&matrix::encode_g1(c));
        }
        for c in &self.c3neg {
            match c {
                Some(c) => w.bytes16(&matrix::encode_g1(c)),
                None => w.u16(0),
            };
        }
        w.finish().map(|b| b.to_vec()).map_err(|e| too_large(CT, e))
    }
}

/// A header whose group elements are decoded only when decryption needs
/// them: a key that uses one branch of a 50-way `or` checks 2 of its 51
/// points, not all of them. The bytes left undecoded are still covered by
/// the ciphertext's MAC, so tampering with them is detected all the same.
pub(crate) struct LazyHeader<'a> {
    /// The policy as written (no Boneh-Katz term).
    pub(crate) policy: AbePolicy,
    pub(crate) c1: &'a [u8],
    pub(crate) c2: Vec<&'a [u8]>,
    pub(crate) c3: Vec<&'a [u8]>,
    c3neg: Vec<&'a [u8]>,
}

const CT: &str = "ciphertext";

impl<'a> LazyHeader<'a> {
    pub(crate) fn parse(bytes: &'a [u8]) -> Result<Self> {
        let e = codec(CT);
        let mut r = Reader::new(bytes, Order::Little);
        let policy = AbePolicy::decode(r.bytes16("policy").map_err(&e)?)?;
        let c1 = r.bytes16("c1").map_err(&e)?;
        let n2 = usize::from(r.u16("c2.count").map_err(&e)?);
        let mut c2 = Vec::with_capacity(n2);
        for i in 0..n2 {
            c2.push(r.bytes16(|| format!("c2[{i}]")).map_err(&e)?);
        }
        let n3 = usize::from(r.u16("c3.count").map_err(&e)?);
        let mut c3 = Vec::with_capacity(n3);
        for i in 0..n3 {
            c3.push(r.bytes16(|| format!("c3[{i}]")).map_err(&e)?);
        }
        let mut c3neg = Vec::with_capacity(n3);
        for i in 0..n3 {
            c3neg.push(r.bytes16(|| format!("c3neg[{i}]")).map_err(&e)?);
        }
        r.finish_as("header").map_err(&e)?;
        // Shapes that do not depend on the key are checked up front.
        let wires = policy.wires.len() + 1;
        if n3 != wires {
            return Err(malformed(CT, "c3.count", format!("{n3} entries for {wires} policy wires")));
        }
        let (_, d) = policy.occurrences();
        if n2 != d.max(1) {
            return Err(malformed(CT, "c2.count", format!("{n2} entries, the policy needs {}", d.max(1))));
        }
        for (i, w) in policy.wires.iter().enumerate() {
            if w.positive != c3neg[i].is_empty() {
                return Err(malformed(CT, format!("c3neg[{i}]"), "present for a positive wire or missing for a negated one"));
            }
        }
        if !c3neg[wires - 1].is_empty() {
            return Err(malformed(CT, format!("c3neg[{}]", wires - 1), "present for the positive Boneh-Katz wire"));
        }
        Ok(Self { policy, c1, c2, c3, c3neg })
    }
}

/// How a decryption validates the ciphertext and how many threads it uses.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Decap {
    pub(crate) threads: usize,
    /// Subgroup-check every point of the header before decrypting (CIRCL's
    /// rejection set) instead of deferring the G1 checks.
    pub(crate) strict: bool,
}

/// The G1 fields a decryption decoded without their subgroup checks:
/// checked only if the MAC fails, to name a field that is to blame.
pub(crate) struct Deferred<'a>(Vec<(&'a [u8], String)>);

impl Deferred<'_> {
    /// The first deferred field that is not in the G1 subgroup, as the
    /// error a strict decoding would have returned.
    pub(crate) fn first_error(&self) -> Option<AbeError> {
        self.0.iter().find_map(|(b, f)| {
            let m = matrix::decode_g1_on_curve(b, (3, 1), CT, f).ok()?;
            let k = m.e.iter().position(|p| g1_subgroup_check(p).is_err())?;
            Some(malformed(CT, format!("{f}[{k},0]"), "point is not in the G1 subgroup"))
        })
    }
}

/// Recovers the encapsulated Gt element with `key`. `policy` is the
/// header's policy augmented with the Boneh-Katz term.
pub(crate) fn decapsulate<'a>(hdr: &LazyHeader<'a>, policy: &AbePolicy, key: &AttributeKey, opts: Decap) -> Result<(Gt, Deferred<'a>)> {
    let holds = |_: usize, w: &super::policy::Wire| match key.attrs.get(&w.label) {
        None => false,
        Some(a) => a.wild || ((a.value == w.value) == w.positive),
    };
    let used = policy.satisfying(holds).ok_or(AbeError::NotSatisfied)?;
    decapsulate_with(hdr, policy, key, &used, opts)
}

/// Strict mode's extra work: every point of the header the key does not
/// use, fully checked (the used ones are checked as they are decoded).
fn check_unused<'a: 'env, 'env>(
    hdr: &LazyHeader<'a>, policy: &AbePolicy, used: &[usize], copies: &[bool], crew: &Crew<'env>,
) -> Result<()> {
    enum Job<'b> {
        G1(&'b [u8], String),
        G2(&'b [u8], String),
    }
    let mut jobs = Vec::new();
    for (i, w) in policy.wires.iter().enumerate() {
        if !used.contains(&i) {
            jobs.push(Job::G1(hdr.c3[i], format!("c3[{i}]")));
            if !w.positive {
                jobs.push(Job::G1(hdr.c3neg[i], format!("c3neg[{i}]")));
            }
        }
    }
    for (j, b) in hdr.c2.iter().enumerate() {
        if !copies.get(j).copied().unwrap_or(false) {
            jobs.push(Job::G2(b, format!("c2[{j}]")));
        }
    }
    let job_cost = |job: &Job<'_>| match job {
        Job::G1(..) => 3 * cost::G1_CHECKED,
        Job::G2(..) => 4 * cost::G2_CHECKED,
    };
    crew.map(jobs, job_cost, |job| match job {
        Job::G1(b, f) => matrix::decode_g1(b, (3, 1), CT, f).map(drop),
        Job::G2(b, f) => matrix::decode_g2(b, (4, 1), CT, f).map(drop),
    })
    .into_iter()
    .collect()
}

/// Estimated costs in microseconds of one core (release build, the
/// benchmark machine; `thread_tests::stage_costs` measures them), by which
/// a decryption deals its work to threads and decides whether a split is
/// worth a thread's start. Only the balance depends on them, never a
/// result.
mod cost {
    /// A G1 point decoded and checked to be on the curve.
    pub(super) const G1_ON_CURVE: u32 = 1;
    /// A G1 point decoded with its subgroup check (strict mode).
    pub(super) const G1_CHECKED: u32 = 55;
    /// A G2 point decoded with its subgroup check.
    pub(super) const G2_CHECKED: u32 = 65;
    /// A G2 point's Miller-loop lines recorded.
    pub(super) const LINES: u32 = 100;
    /// A wire's share of the sums, besides decoding: a few additions.
    pub(super) const WIRE: u32 = 6;
    /// The Boneh-Katz wire's four products from the key's tables.
    pub(super) const BK_PRODUCTS: u32 = 240;
    /// A multi-scalar multiplication: fixed part, and per term.
    pub(super) const MSM_BASE: u32 = 100;
    pub(super) const MSM_TERM: u32 = 90;
    /// A Miller loop's Fp12 squarings (every lane pays them), and each
    /// pair's line evaluations.
    pub(super) const SQUARINGS: u32 = 120;
    pub(super) const PAIR: u32 = 130;
    /// Handing a share to a crew's helper, already running, and taking
    /// its result back (`parallel::Crew`).
    pub(super) const HANDOFF: u32 = 15;
}

/// How many lanes a Miller loop over `pairs` pairs is best split into,
/// with up to `threads`: each lane repeats the squarings and costs a
/// handoff, so a short loop stays whole.
fn miller_lanes(pairs: usize, threads: usize) -> usize {
    let t = |k: usize| {
        let k32 = u32::try_from(k).unwrap_or(u32::MAX);
        // The lines split evenly (see `lines::shares`).
        let per = u32::try_from(pairs).unwrap_or(u32::MAX).saturating_mul(cost::PAIR).div_ceil(k32);
        cost::SQUARINGS.saturating_add(per).saturating_add((k32 - 1).saturating_mul(cost::HANDOFF))
    };
    (1..=threads.clamp(1, pairs.max(1))).min_by_key(|&k| (t(k), k)).unwrap_or(1)
}

/// The decryption equation over the given set of wires. Only
/// [`decapsulate`] calls it with a satisfying set; tests call it with
/// others to show that no other set recovers the key.
///
/// On more than one thread it runs in three parallel steps on one crew
/// (`parallel::Crew`: helper threads started once and kept awake between
/// the steps), each thread taking items heaviest first by estimated cost
/// ([`cost`]), the calling thread among them: decoding (the G2 points'
/// subgroup checks and lines are the bulk), the negations' multi-scalar
/// multiplications, and the Miller loop split into lanes whose products
/// meet before the one final exponentiation, which the calling thread
/// runs alone once the helpers have left. The results, errors included,
/// are those of one thread: every step returns its items in order.
pub(crate) fn decapsulate_with<'a>(
    hdr: &LazyHeader<'a>, policy: &AbePolicy, key: &AttributeKey, used: &[usize], opts: Decap,
) -> Result<(Gt, Deferred<'a>)> {
    let (pi, d) = policy.occurrences();

    // The wires' share: decode each used wire's G1 points (subgroup-
    // checked only in strict mode, otherwise after a MAC failure, see
    // `Deferred`) and add them, and the key's points for the wire, into
    // per-copy sums. p1[j] (3 rows, ciphertext side) and p2[j] (4 rows,
    // key side) are sums of plain points plus, for terms that carry a
    // scalar (negations, wildcards), one multi-scalar multiplication per
    // row, done later. A run of wires stops at its first error, the one
    // a single pass over all the wires would meet first.
    let k3 = |label: &str, wild: bool| -> Result<Vec<G1Affine>> {
        let map = if wild { &key.k3wild } else { &key.k3 };
        map.get(label)
            .map(|m| m.e.iter().map(|w| w.0).collect())
            .ok_or_else(|| malformed("attribute key", format!("k3[{label:?}]"), "missing key material for an attribute"))
    };
    let decode_g1 = |i: usize, neg: bool| -> Result<Vec<G1Affine>> {
        let (b, f) = if neg { (hdr.c3neg[i], format!("c3neg[{i}]")) } else { (hdr.c3[i], format!("c3[{i}]")) };
        let m = if opts.strict { matrix::decode_g1(b, (3, 1), CT, &f) } else { matrix::decode_g1_on_curve(b, (3, 1), CT, &f) };
        m.map(|m| m.e)
    };
    let sums = |run: &[usize]| -> Result<Sums> {
        let mut p1: Vec<Option<Acc>> = (0..d).map(|_| None).collect();
        let mut p2: Vec<Option<Acc>> = (0..d).map(|_| None).collect();
        for &i in run {
            let w = &policy.wires[i];
            let j = pi[i];
            let attr = *key.attrs.get(&w.label).ok_or(AbeError::NotSatisfied)?;
            let c3 = decode_g1(i, false)?;
            let a1 = p1[j].get_or_insert_with(|| Acc::new(3));
            let a2 = p2[j].get_or_insert_with(|| Acc::new(4));
            if w.positive {
                a1.add(&c3, None);
                if attr.wild {
                    // The Boneh-Katz wire: its scalar, the id, is public
                    // and its points get tables in the key's cache.
                    match (w.label == BK_LABEL).then(|| key.bk_times(&w.value)).flatten() {
                        Some(col) => a2.add_products(&col),
                        None => a2.add(&k3(&w.label, false)?, Some(w.value)),
                    }
                    a2.add(&k3(&w.label, true)?, None);
                } else {
                    a2.add(&k3(&w.label, false)?, None);
                }
            } else {
                let c3neg = decode_g1(i, true)?;
                let y = if attr.wild { w.value + Scalar::ONE } else { attr.value };
                let diff = Option::<Scalar>::from((w.value - y).invert())
                    .ok_or_else(|| malformed(CT, format!("policy.wires[{i}]"), "negated value equals the key's"))?;
                a1.add(&c3, Some(diff * y));
                a1.add(&c3neg, Some(diff));
                if attr.wild {
                    a2.add(&k3(&w.label, false)?, Some(diff * y));
                    a2.add(&k3(&w.label, true)?, Some(diff));
                } else {
                    a2.add(&k3(&w.label, false)?, Some(diff));
                }
            }
        }
        Ok(Sums { p1, p2 })
    };

    // The work of this step: runs of wires (on one thread, a single run:
    // nothing to merge), then the ciphertext's G2 points, whose subgroup
    // checks (they meet the key's secret G1 points) and lines (the work a
    // Miller loop does for them anyway) are most of it.
    enum Job<'b> {
        Wires(&'b [usize], u32),
        G2(&'b [u8], String),
    }
    enum Out {
        Sums(Sums),
        G2(Vec<G2Affine>, Vec<Lines>),
    }
    let mut copies = vec![false; d];
    for &i in used {
        copies[pi[i]] = true;
    }
    let deferred = if opts.strict {
        Deferred(Vec::new())
    } else {
        let neg = |i: usize| (!policy.wires[i].positive).then(|| (hdr.c3neg[i], format!("c3neg[{i}]")));
        Deferred(used.iter().flat_map(|&i| std::iter::once((hdr.c3[i], format!("c3[{i}]"))).chain(neg(i))).collect())
    };
    let g1_cost = if opts.strict { cost::G1_CHECKED } else { cost::G1_ON_CURVE };
    let wire_cost = |i: usize| {
        let w = &policy.wires[i];
        let points = if w.positive { 3 } else { 6 };
        let bk = if w.label == BK_LABEL { cost::BK_PRODUCTS } else { 0 };
        points * g1_cost + cost::WIRE + bk
    };
    let job_cost = |job: &Job<'_>| match job {
        Job::Wires(_, c) => *c,
        Job::G2(..) => 4 * (cost::G2_CHECKED + cost::LINES),
    };
    let decode = |job: &Job<'_>| match job {
        Job::Wires(run, _) => sums(run).map(Out::Sums),
        Job::G2(b, f) => matrix::decode_g2(b, (4, 1), CT, f).map(|m| {
            let lines = m.e.iter().map(|q| Lines::new(q.as_ref())).collect();
            Out::G2(m.e, lines)
        }),
    };
    // What later steps' shares read from earlier steps' results: set
    // between the steps, declared here to outlive the crew.
    let decoded: OnceLock<(Vec<Vec<Lines>>, Vec<Lines>)> = OnceLock::new();
    let rows: OnceLock<Vec<Acc>> = OnceLock::new();
    let points: OnceLock<Vec<G1Affine>> = OnceLock::new();
    let pairs_at: OnceLock<Vec<(&Lines, blst::blst_p1_affine)>> = OnceLock::new();

    // One crew for every step: its helpers start once and stay awake
    // between the steps.
    let r = with_crew(opts.threads, |crew| -> Result<Gt> {
        if opts.strict {
            check_unused(hdr, policy, used, &copies, &crew)?;
        }
        // Runs small enough to even out the threads around the G2 jobs.
        let threads = crew.threads();
        let per_run = if threads <= 1 { used.len().max(1) } else { used.len().div_ceil(4 * threads).max(1) };
        let mut jobs: Vec<Job<'_>> = used.chunks(per_run).map(|run| Job::Wires(run, run.iter().map(|&i| wire_cost(i)).sum())).collect();
        for (j, &c) in copies.iter().enumerate() {
            if c {
                jobs.push(Job::G2(hdr.c2[j], format!("c2[{j}]")));
            }
        }
        jobs.push(Job::G2(hdr.c1, "c1".into()));
        let done = crew.map(jobs, job_cost, decode);
        let mut p1: Vec<Option<Acc>> = (0..d).map(|_| None).collect();
        let mut p2: Vec<Option<Acc>> = (0..d).map(|_| None).collect();
        let (mut g2_points, mut g2_lines) = (Vec::new(), Vec::new());
        for r in done {
            match r? {
                Out::Sums(s) => {
                    Acc::merge_into(&mut p1, s.p1);
                    Acc::merge_into(&mut p2, s.p2);
                }
                Out::G2(p, l) => {
                    g2_points.push(p);
                    g2_lines.push(l);
                }
            }
        }
        let c1 = g2_points.pop().ok_or(AbeError::Internal("c1 missing from the decoded points"))?;
        let c1_lines = g2_lines.pop().ok_or(AbeError::Internal("c1 missing from the decoded points"))?;
        let (g2_lines, c1_lines) = decoded.get_or_init(|| (g2_lines, c1_lines));

        // Totals of every row, the multi-scalar multiplications dealt by
        // their size (a row of plain sums is already done and costs nothing).
        let n1: usize = p1.iter().flatten().count();
        let accs = rows.get_or_init(|| p1.into_iter().chain(p2).flatten().collect());
        let cells: Vec<(usize, usize)> = accs.iter().enumerate().flat_map(|(a, acc)| (0..acc.plain.len()).map(move |m| (a, m))).collect();
        let totals = crew.map(cells, |&(a, m)| accs[a].cost(m), |&(a, m)| accs[a].row(m));
        let mut totals = totals.into_iter();
        let mut ptot = [G1Projective::identity(); 3];
        for _ in 0..n1 {
            for t in ptot.iter_mut() {
                *t += totals.next().ok_or(AbeError::Internal("a row total is missing"))?;
            }
        }
        let mut g1s: Vec<G1Projective> = totals.collect();
        let n_c2 = g1s.len();
        g1s.extend(ptot.iter().map(|p| -p));
        g1s.extend(key.k2.e.iter().map(|w| G1Projective::from(w.0)));
        let mut g1a = vec![G1Affine::default(); g1s.len()];
        G1Projective::batch_normalize(&g1s, &mut g1a);
        let g1a = points.get_or_init(|| g1a);

        // The ciphertext's lines were recorded as its points were decoded;
        // k1's come from the key.
        let k1_lines = &key.cache().k1_lines;
        let c2_lines: Vec<&Lines> = g2_lines.iter().flatten().collect();
        if c2_lines.len() != n_c2 {
            return Err(AbeError::Internal("pairing inputs do not line up"));
        }
        let lines: Vec<&Lines> = c2_lines.into_iter().chain(k1_lines).chain(c1_lines).collect();
        let identity = |p: &G1Affine| bool::from(p.is_identity());
        let ct_g2 = g2_points.iter().flatten().chain(&c1);
        if lines.len() != g1a.len() || ct_g2.chain(key.k1.e.iter().map(|w| &w.0)).any(|q| bool::from(q.is_identity())) {
            return Err(AbeError::Internal("pairing inputs do not line up"));
        }
        // A pair with the identity contributes 1 to the product; the loop
        // wants finite points, so such pairs are left out.
        let pairs =
            pairs_at.get_or_init(|| lines.into_iter().zip(g1a).filter(|(_, p)| !identity(p)).map(|(l, p)| (l, *p.as_ref())).collect());
        if pairs.is_empty() {
            return Ok(Gt::identity());
        }
        // One Miller loop per lane, each over an equal share of the pairs'
        // lines (a pair may be split between two lanes), all squarings in
        // each.
        let split = lines::shares(pairs.len(), miller_lanes(pairs.len(), threads));
        let lane_cost = |share: &std::ops::Range<usize>| {
            let work = u32::try_from(share.len()).unwrap_or(u32::MAX).saturating_mul(cost::PAIR);
            cost::SQUARINGS.saturating_add(work / u32::try_from(lines::LINES).unwrap_or(1))
        };
        let loops = crew.map(split, lane_cost, |share| lines::miller_loop_share(pairs, share.clone()));
        let mut f = loops.first().copied().ok_or(AbeError::Internal("no Miller loop ran"))?;
        for l in loops.iter().skip(1) {
            f *= *l;
        }
        // The final exponentiation does not split: the helpers may go.
        drop(crew);
        Ok(super::group::gt_from_fp12(&f.final_exp()))
    })?;
    Ok((r, deferred))
}

/// A run of wires' per-copy sums (see [`decapsulate_with`]).
struct Sums {
    p1: Vec<Option<Acc>>,
    p2: Vec<Option<Acc>>,
}

/// A column of G1 sums: plain points added as they come, scalar terms
/// gathered for one multi-scalar multiplication per row.
struct Acc {
    plain: Vec<G1Projective>,
    pts: Vec<Vec<G1Projective>>,
    sc: Vec<Vec<Scalar>>,
}

impl Acc {
    fn new(rows: usize) -> Self {
        Acc { plain: vec![G1Projective::identity(); rows], pts: vec![Vec::new(); rows], sc: vec![Vec::new(); rows] }
    }

    fn add(&mut self, col: &[G1Affine], s: Option<Scalar>) {
        for (m, p) in col.iter().enumerate() {
            match s {
                None => self.plain[m] += p,
                Some(s) => {
                    self.pts[m].push(G1Projective::from(p));
                    self.sc[m].push(s);
                }
            }
        }
    }

    /// Adds the per-copy sums of another run of wires to `into`.
    fn merge_into(into: &mut [Option<Acc>], from: Vec<Option<Acc>>) {
        for (slot, acc) in into.iter_mut().zip(from) {
            let Some(acc) = acc else { continue };
            match slot {
                None => *slot = Some(acc),
                Some(s) => {
                    for (m, (plain, (pts, sc))) in acc.plain.iter().zip(acc.pts.into_iter().zip(acc.sc)).enumerate() {
                        s.plain[m] += plain;
                        s.pts[m].extend(pts);
                        s.sc[m].extend(sc);
                    }
                }
            }
        }
    }

    /// Adds precomputed products to the plain sums.
    fn add_products(&mut self, col: &[G1Projective]) {
        for (sum, p) in self.plain.iter_mut().zip(col) {
            *sum += p;
        }
    }

    /// The estimated cost of [`Acc::row`] (see [`cost`]).
    fn cost(&self, m: usize) -> u32 {
        match u32::try_from(self.pts[m].len()).unwrap_or(u32::MAX) {
            0 => 0,
            n => cost::MSM_BASE.saturating_add(n.saturating_mul(cost::MSM_TERM)),
        }
    }

    fn row(&self, m: usize) -> G1Projective {
        match self.pts[m].len() {
            0 => self.plain[m],
            1 => self.plain[m] + self.pts[m][0] * self.sc[m][0],
            _ => self.plain[m] + G1Projective::multi_exp(&self.pts[m], &self.sc[m]),
        }
    }
}
