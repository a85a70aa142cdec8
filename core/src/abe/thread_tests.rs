//! Threads change how fast, never what: keygen, encryption and decryption
//! on several threads give what one thread gives, on CIRCL's benchmark
//! shapes and on policies with repeated labels, errors included.

use blstrs::Gt;
use keyfence_policy::{Attributes, Policy};
use rand_core::OsRng;

use super::bk;
use super::blake2x::{Xof, XofReader};
use super::oracle::hash_value;
use super::policy::AbePolicy;
use super::tkn::{decapsulate, encapsulate, Decap, LazyHeader};
use super::{decrypt_with, decrypt_with_threads, encrypt_rng, keygen, keygen_rng, setup, DecryptOptions, MasterSecretKey, PublicKey};

/// CIRCL's benchmark shapes, and two with repeated labels, whose
/// ciphertexts carry several `c2` copies.
fn shapes() -> Vec<(&'static str, String, Attributes)> {
    let repeated = (0..12).map(|i| format!("(r: v{} or not s: x{i})", i % 3)).collect::<Vec<_>>().join(" and ");
    let mut shapes = super::circl_benchmark_shapes();
    shapes.extend([
        ("repeated", repeated, Attributes::from_pairs([("r", "v0"), ("s", "y")])),
        ("repeated_neg", "not a: x and not a: y and not a: z and b: w".into(), Attributes::from_pairs([("a", "q"), ("b", "w")])),
    ]);
    shapes
}

fn authority() -> &'static (PublicKey, MasterSecretKey) {
    static A: std::sync::OnceLock<(PublicKey, MasterSecretKey)> = std::sync::OnceLock::new();
    A.get_or_init(|| setup().unwrap())
}

fn seeded(seed: &str) -> XofReader {
    Xof::new(seed.as_bytes()).finish()
}

fn parsed(policy: &str) -> Policy {
    keyfence_policy::parse(policy).unwrap()
}

#[test]
fn threaded_keygen_and_encryption_make_the_same_bytes() {
    let (pk, msk) = authority();
    for (name, policy, attrs) in shapes() {
        let one = keygen_rng(&mut seeded(name), msk, &attrs, 1).unwrap();
        let ct_one = encrypt_rng(&mut seeded(name), pk, &parsed(&policy), b"same bytes", 1).unwrap();
        for threads in [2, 3, 8] {
            let many = keygen_rng(&mut seeded(name), msk, &attrs, threads).unwrap();
            assert_eq!(&many.to_bytes()[..], &one.to_bytes()[..], "{name}: key on {threads} threads");
            let ct = encrypt_rng(&mut seeded(name), pk, &parsed(&policy), b"same bytes", threads).unwrap();
            assert_eq!(ct, ct_one, "{name}: ciphertext on {threads} threads");
        }
        assert_eq!(&decrypt_with_threads(&one, &ct_one, 2).unwrap()[..], b"same bytes", "{name}");
    }
}

#[test]
fn threaded_decryption_recovers_the_same_element_for_every_shape() {
    let (pk, msk) = authority();
    for (name, policy, attrs) in shapes() {
        let p = AbePolicy::from_policy(&parsed(&policy)).unwrap();
        let bk = p.with_bk(hash_value("an id"));
        let (hdr, real) = encapsulate(&mut OsRng, pk, &bk, 2);
        let bytes = hdr.encode(&p).unwrap();
        let lazy = LazyHeader::parse(&bytes).unwrap();
        let key = keygen(msk, &attrs).unwrap();
        for strict in [false, true] {
            for threads in [1, 2, 3, 8] {
                let got: Gt = decapsulate(&lazy, &bk, &key, Decap { threads, strict }).unwrap().0;
                assert_eq!(got, real, "{name}, {threads} threads, strict {strict}");
            }
        }
    }
}

#[test]
fn threaded_decryption_gives_the_same_plaintext_before_and_after_the_key_tables() {
    let (pk, msk) = authority();
    for (name, policy, attrs) in shapes() {
        let ct = bk::encrypt(&mut OsRng, pk, &AbePolicy::from_policy(&parsed(&policy)).unwrap(), name.as_bytes(), 1).unwrap();
        let key = keygen(msk, &attrs).unwrap();
        // The key builds its Boneh-Katz tables at its 16th decryption:
        // both sides of it, on one and on two threads.
        for i in 0..(super::key_cache::TABLES_AT as usize + 2) {
            let threads = 1 + i % 2;
            let strict = i % 3 == 0;
            let opts = DecryptOptions::new().threads(threads).strict(strict);
            assert_eq!(&decrypt_with(&key, &ct, &opts).unwrap()[..], name.as_bytes(), "{name}, decryption {i}");
        }
    }
}

#[test]
fn threaded_decryption_fails_as_one_thread_does() {
    let (pk, msk) = authority();
    for (name, policy, attrs) in shapes().into_iter().filter(|s| ["small", "and50neg25", "repeated"].contains(&s.0)) {
        let ct = super::encrypt(pk, &policy, b"errors").unwrap();
        let key = keygen(msk, &attrs).unwrap();
        let outcome = |ct: &[u8], threads: usize, strict: bool| {
            decrypt_with(&key, ct, &DecryptOptions::new().threads(threads).strict(strict)).map(|p| p.to_vec()).map_err(|e| e.to_string())
        };
        // Single flips spread over the whole ciphertext (points of every
        // field, lengths, the envelope, the tag), and pairs of them, one
        // early and one late, so that the error named first is at stake.
        let positions: Vec<usize> = (0..ct.len()).step_by(ct.len() / 40 + 1).chain([ct.len() - 1]).collect();
        let mut cases: Vec<Vec<usize>> = positions.iter().map(|&p| vec![p]).collect();
        cases.extend((0..positions.len() / 2).map(|i| vec![positions[i], positions[positions.len() - 1 - i]]));
        for flips in cases {
            let mut bad = ct.clone();
            for &p in &flips {
                bad[p] ^= 0x20;
            }
            for strict in [false, true] {
                let one = outcome(&bad, 1, strict);
                assert_eq!(outcome(&bad, 2, strict), one, "{name}: bytes {flips:?} flipped, strict {strict}");
                assert_eq!(outcome(&bad, 3, strict), one, "{name}: bytes {flips:?} flipped, strict {strict}");
            }
        }
        let other = keygen(msk, &Attributes::from_pairs([("nobody", "x")])).unwrap();
        let e = decrypt_with_threads(&other, &ct, 2).unwrap_err();
        assert!(matches!(e, super::AbeError::NotSatisfied), "{name}: {e}");
    }
}

/// What each piece of a decryption costs on this machine, the estimates
/// `tkn::cost` deals work to threads by (run with --release --ignored
/// --nocapture, on an idle machine).
#[test]
#[ignore]
fn stage_costs() {
    use blstrs::{G1Affine, G1Projective, G2Affine, G2Projective, Scalar};
    use ff::Field;
    use group::{Curve, Group};
    use std::time::Instant;

    use super::lines::{miller_loop, miller_loop_share, Lines, LINES};

    let med = |f: &dyn Fn()| {
        let mut v: Vec<f64> = (0..51)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let ps: Vec<G1Affine> = (0..11).map(|_| G1Projective::random(&mut OsRng).to_affine()).collect();
    let qs: Vec<G2Affine> = (0..11).map(|_| (G2Projective::generator() * Scalar::random(&mut OsRng)).to_affine()).collect();
    let lines: Vec<Lines> = qs.iter().map(|q| Lines::new(q.as_ref())).collect();
    let (g1, g2) = (ps[0].to_uncompressed(), qs[0].to_uncompressed());
    eprintln!("scoped thread start and join: {:.1} us", med(&|| std::thread::scope(|s| drop(s.spawn(|| 1)))));
    eprintln!(
        "G1 point on the curve: {:.2} us",
        med(&|| {
            std::hint::black_box(super::group::g1_on_curve_from_bytes(&g1)).ok();
        })
    );
    eprintln!(
        "G1 point checked: {:.1} us",
        med(&|| {
            std::hint::black_box(super::group::g1_from_bytes(&g1)).ok();
        })
    );
    eprintln!(
        "G2 point checked: {:.1} us",
        med(&|| {
            std::hint::black_box(super::group::g2_from_bytes(&g2)).ok();
        })
    );
    eprintln!("G2 lines: {:.1} us", med(&|| drop(Lines::new(qs[0].as_ref()))));
    let pts: Vec<G1Projective> = ps.iter().cycle().take(50).map(G1Projective::from).collect();
    let sc: Vec<Scalar> = (0..50).map(|_| Scalar::random(&mut OsRng)).collect();
    for n in [1, 2, 4, 13, 25, 50] {
        eprintln!(
            "MSM of {n}: {:.1} us",
            med(&|| {
                std::hint::black_box(G1Projective::multi_exp(&pts[..n], &sc[..n]));
            })
        );
    }
    for n in [1, 3, 4, 6, 11] {
        let pairs: Vec<_> = lines.iter().zip(&ps).take(n).map(|(l, p)| (l, *p.as_ref())).collect();
        eprintln!(
            "Miller loop of {n}: {:.1} us",
            med(&|| {
                std::hint::black_box(miller_loop(&pairs));
            })
        );
    }
    let pairs: Vec<_> = lines.iter().zip(&ps).map(|(l, p)| (l, *p.as_ref())).collect();
    // Two lanes' shares of 11 pairs: whole pairs (6 and 5) or equal
    // shares of the lines (one pair split).
    let halves = super::lines::shares(11, 2);
    for (name, share) in [("6 whole pairs", 0..6 * LINES), ("5 whole pairs", 6 * LINES..11 * LINES), ("half the lines", halves[0].clone())]
    {
        eprintln!(
            "Miller share of 11, {name}: {:.1} us",
            med(&|| {
                std::hint::black_box(miller_loop_share(&pairs, share.clone()));
            })
        );
    }
    let f = miller_loop(&pairs);
    eprintln!(
        "final exponentiation: {:.1} us",
        med(&|| {
            std::hint::black_box(f.final_exp());
        })
    );
}
