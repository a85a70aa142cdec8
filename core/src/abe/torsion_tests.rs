//! The claim behind deferring G1 subgroup checks (docs/abe.md, "Subgroup
//! checks"), shown on ciphertexts a malicious encryptor could make: G1
//! points carrying components of order 3 and 11 (the cofactor part of
//! `E(Fp)`), with a valid MAC, decrypt exactly as the clean ones.

use blstrs::{Fp, G1Affine, G1Projective};
use ff::Field;
use group::{Curve, Group};
use rand_core::OsRng;

use super::bk::encrypt_header_with;
use super::matrix::Mat;
use super::oracle::hash_value;
use super::policy::AbePolicy;
use super::tkn::{decapsulate, encapsulate, Decap, Header, LazyHeader};
use super::{decrypt, decrypt_strict, keygen, setup};

/// The order r of G1, big-endian.
const R_BE: [u8; 32] = [
    0x73, 0xed, 0xa7, 0x53, 0x29, 0x9d, 0x7d, 0x48, 0x33, 0x39, 0xd8, 0x08, 0x09, 0xa1, 0xd8, 0x05, 0x53, 0xbd, 0xa4, 0x02, 0xff, 0xfe,
    0x5b, 0xfe, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x01,
];
/// G1's cofactor h1: `#E(Fp) = h1 r`, `h1 = 3 * 11^2 * 10177^2 * 859267^2 * 52437899^2`.
const H1: u128 = 0x396c_8c00_5555_e156_8c00_aaab_0000_aaab;

/// `[k] p` by double-and-add: plain group law, valid on all of `E(Fp)`
/// (blst's scalar multiplication may assume the point is in G1).
fn mul_be(p: &G1Projective, k: &[u8]) -> G1Projective {
    let mut acc = G1Projective::identity();
    for byte in k {
        for bit in (0..8).rev() {
            acc = acc.double();
            if (byte >> bit) & 1 == 1 {
                acc += p;
            }
        }
    }
    acc
}

/// A point of exact order `n` (a prime factor of h1) on the G1 curve.
fn torsion_point(n: u128) -> G1Projective {
    // h1 = n^k m with m prime to n: [r m] P lies in the n-power torsion.
    let mut m = H1;
    while m.is_multiple_of(n) {
        m /= n;
    }
    assert_ne!(m, H1);
    let mut x = Fp::ONE;
    loop {
        x += Fp::ONE;
        let Some(y) = Option::<Fp>::from((x.square() * x + Fp::from(4u64)).sqrt()) else { continue };
        let mut b = [0u8; 96];
        b[..48].copy_from_slice(&x.to_bytes_be());
        b[48..].copy_from_slice(&y.to_bytes_be());
        let p = G1Projective::from(Option::<G1Affine>::from(G1Affine::from_uncompressed_unchecked(&b)).unwrap());
        let mut t = mul_be(&mul_be(&p, &R_BE), &m.to_be_bytes());
        if bool::from(t.is_identity()) {
            continue;
        }
        // Multiply by n until the next multiple would vanish: order n.
        loop {
            let next = mul_be(&t, &n.to_be_bytes());
            if bool::from(next.is_identity()) {
                break;
            }
            t = next;
        }
        let a = t.to_affine();
        assert!(bool::from(a.is_on_curve()) && !bool::from(a.is_torsion_free()));
        return t;
    }
}

/// Adds order-3, order-11 and order-33 components to the three rows of
/// every G1 matrix of the header.
fn add_torsion(h: &mut Header) {
    let (t3, t11) = (torsion_point(3), torsion_point(11));
    let ts = [t3, t11, t3 + t11];
    let tweak = |m: &mut Mat<G1Affine>| {
        for (p, t) in m.e.iter_mut().zip(ts) {
            let q = (G1Projective::from(*p) + t).to_affine();
            assert!(!bool::from(q.is_torsion_free()));
            *p = q;
        }
    };
    h.c3.iter_mut().for_each(tweak);
    h.c3neg.iter_mut().flatten().for_each(tweak);
}

/// Adds order-3, order-11 and order-33 components to every G1 point of an
/// attribute key (`k2`, every `k3` and `k3wild`).
fn add_torsion_to_key(key: &mut super::AttributeKey) {
    let ts = [torsion_point(3), torsion_point(11)];
    let tweak = |m: &mut Mat<super::group::Wiped<G1Affine>>| {
        for (i, p) in m.e.iter_mut().enumerate() {
            let q = (G1Projective::from(p.0) + ts[i % 2] + if i % 3 == 0 { ts[1 - i % 2] } else { G1Projective::identity() }).to_affine();
            assert!(!bool::from(q.is_torsion_free()));
            p.0 = q;
        }
    };
    tweak(&mut key.k2);
    key.k3.values_mut().chain(key.k3wild.values_mut()).for_each(tweak);
}

const POLICY: &str = "a: x and not b: y and (c: z or d: w)";
const ATTRS: &str = "a=x,b=q,c=z";

#[test]
fn small_order_components_do_not_change_the_decrypted_element() {
    let (pk, msk) = setup().unwrap();
    let key = keygen(&msk, &ATTRS.parse().unwrap()).unwrap();
    let p = AbePolicy::from_policy(&keyfence_policy::parse(POLICY).unwrap()).unwrap();
    let bk = p.with_bk(hash_value("some id"));
    let (mut hdr, real) = encapsulate(&mut OsRng, &pk, &bk, 1);
    let clean = hdr.encode(&p).unwrap();
    add_torsion(&mut hdr);
    let dirty = hdr.encode(&p).unwrap();
    assert_ne!(clean, dirty);
    let lax = Decap { threads: 1, strict: false };
    let strict = Decap { threads: 1, strict: true };
    for b in [&clean, &dirty] {
        let lazy = LazyHeader::parse(b).unwrap();
        assert_eq!(decapsulate(&lazy, &bk, &key, lax).unwrap().0, real);
    }
    let lazy = LazyHeader::parse(&dirty).unwrap();
    let e = decapsulate(&lazy, &bk, &key, strict).err().expect("strict mode refuses the point");
    assert!(e.to_string().ends_with("point is not in the G1 subgroup"), "{e}");
}

#[test]
fn a_ciphertext_with_small_order_components_and_a_valid_mac_decrypts() {
    let (pk, msk) = setup().unwrap();
    let key = keygen(&msk, &ATTRS.parse().unwrap()).unwrap();
    let p = AbePolicy::from_policy(&keyfence_policy::parse(POLICY).unwrap()).unwrap();
    let msg = b"the same plaintext";
    let ct = encrypt_header_with(&mut OsRng, &pk, &p, msg, 1, add_torsion).unwrap();
    assert_eq!(&decrypt(&key, &ct).unwrap()[..], msg);
    // CIRCL's rejection set, on request. Strict mode checks the points
    // the key does not use first: the field named is `d: w`'s.
    let e = decrypt_strict(&key, &ct).unwrap_err();
    assert_eq!(e.to_string(), "malformed ciphertext: field c3[3][0,0]: point is not in the G1 subgroup");
    // Every flipped bit is still refused, the G1 coordinates included.
    for i in 0..ct.len() {
        let mut bad = ct.clone();
        bad[i] ^= 0x01;
        assert!(decrypt(&key, &bad).is_err(), "flipping bit 0 of byte {i} was accepted");
    }
}

/// The same claim for keys, which `AttributeKey::from_bytes` checks on the
/// curve only: a key whose every G1 point carries a small-order component
/// loads, and decrypts every ciphertext (a negation and the Boneh-Katz
/// attribute's tables included) exactly as the clean key does.
#[test]
fn a_key_with_small_order_components_decrypts_as_its_projection() {
    let (pk, msk) = setup().unwrap();
    let clean = keygen(&msk, &ATTRS.parse().unwrap()).unwrap();
    let mut dirty = super::AttributeKey::from_bytes(&clean.to_bytes()).unwrap();
    add_torsion_to_key(&mut dirty);
    let dirty = super::AttributeKey::from_bytes(&dirty.to_bytes()).expect("a key is checked on the curve only");
    assert_ne!(clean.to_bytes(), dirty.to_bytes());
    let p = AbePolicy::from_policy(&keyfence_policy::parse(POLICY).unwrap()).unwrap();
    let bk = p.with_bk(hash_value("some id"));
    let (hdr, real) = encapsulate(&mut OsRng, &pk, &bk, 1);
    let encoded = hdr.encode(&p).unwrap();
    let lazy = LazyHeader::parse(&encoded).unwrap();
    for strict in [false, true] {
        let opts = Decap { threads: 1, strict };
        assert_eq!(decapsulate(&lazy, &bk, &dirty, opts).unwrap().0, real, "strict {strict}");
    }
    // Past the decryption that builds the Boneh-Katz tables too.
    for i in 0..super::key_cache::TABLES_AT + 1 {
        let msg = format!("message {i}");
        let ct = super::encrypt(&pk, POLICY, msg.as_bytes()).unwrap();
        assert_eq!(&*decrypt(&dirty, &ct).unwrap(), msg.as_bytes(), "decryption {i}");
    }
}
