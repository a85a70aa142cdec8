//! Security properties that need the scheme's internals: the CIRCL #610
//! AND-gate sharing bug and its Boneh-Katz wildcard attack, and collusion.

use blstrs::Gt;
use rand_core::OsRng;

use super::oracle::hash_value;
use super::policy::{AbePolicy, BK_LABEL};
use super::tkn::{decapsulate, decapsulate_with, encapsulate, LazyHeader};
use super::{keygen, setup, AttributeKey, PublicKey};

fn encapsulated(pk: &PublicKey, policy: &str) -> (Vec<u8>, AbePolicy, Gt) {
    let p = AbePolicy::from_policy(&keyfence_policy::parse(policy).unwrap()).unwrap();
    let bk = p.with_bk(hash_value("some id"));
    let (hdr, key) = encapsulate(&mut OsRng, pk, &bk);
    (hdr.encode(&p).unwrap(), bk, key)
}

fn key(msk: &super::MasterSecretKey, attrs: &str) -> AttributeKey {
    keygen(msk, &attrs.parse().unwrap()).unwrap()
}

#[test]
fn satisfying_keys_recover_the_element() {
    let (pk, msk) = setup().unwrap();
    let (hdr, bk, real) = encapsulated(&pk, "a: x and (b: y or not c: z)");
    let lazy = LazyHeader::parse(&hdr).unwrap();
    for attrs in ["a=x,b=y", "a=x,c=q", "a=x,b=y,c=q"] {
        assert_eq!(decapsulate(&lazy, &bk, &key(&msk, attrs), 1).unwrap(), real, "{attrs}");
    }
}

#[test]
fn the_bk_wire_alone_does_not_recover_the_element() {
    // CIRCL #610: an AND gate gave one input the whole secret, and the
    // Boneh-Katz wire is an AND input every key satisfies (it holds the
    // attribute as a wildcard), so any key could decrypt anything.
    let (pk, msk) = setup().unwrap();
    let (hdr, bk, real) = encapsulated(&pk, "a: x and b: y");
    let lazy = LazyHeader::parse(&hdr).unwrap();
    let bk_wire = bk.wires.iter().position(|w| w.label == BK_LABEL).unwrap();
    for attrs in ["c=q", "a=x"] {
        let k = key(&msk, attrs);
        let forged = decapsulate_with(&lazy, &bk, &k, &[bk_wire], 1).unwrap();
        assert_ne!(forged, real, "{attrs}: the wildcard wire alone opened the ciphertext");
    }
    // One side of the user's AND plus the wildcard is not enough either.
    let k = key(&msk, "a=x");
    let forged = decapsulate_with(&lazy, &bk, &k, &[0, bk_wire], 1).unwrap();
    assert_ne!(forged, real);
}

#[test]
fn two_keys_cannot_be_combined() {
    let (pk, msk) = setup().unwrap();
    let (hdr, bk, real) = encapsulated(&pk, "a: x and b: y");
    let lazy = LazyHeader::parse(&hdr).unwrap();
    let k1 = key(&msk, "a=x");
    let k2 = key(&msk, "b=y");
    assert!(decapsulate(&lazy, &bk, &k1, 1).is_err());
    assert!(decapsulate(&lazy, &bk, &k2, 1).is_err());
    // Splice k2's component for `b` into k1: the per-key randomness does
    // not match, so the result is garbage.
    let mut franken = k1.clone();
    franken.attrs.insert("b".into(), k2.attrs["b"]);
    franken.k3.insert("b".into(), k2.k3["b"].clone());
    let forged = decapsulate(&lazy, &bk, &franken, 1).unwrap();
    assert_ne!(forged, real, "two keys were combined");
}
