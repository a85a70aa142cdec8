//! Security properties that need the scheme's internals: the CIRCL #610
//! AND-gate sharing bug and its Boneh-Katz wildcard attack, and collusion.

use blstrs::Gt;
use rand_core::OsRng;

use super::oracle::hash_value;
use super::policy::{AbePolicy, BK_LABEL};
use super::tkn::{decapsulate, decapsulate_with, encapsulate, Decap, LazyHeader};

const D: Decap = Decap { threads: 1, strict: false };
use super::{keygen, setup, AttributeKey, PublicKey};

fn encapsulated(pk: &PublicKey, policy: &str) -> (Vec<u8>, AbePolicy, Gt) {
    let p = AbePolicy::from_policy(&keyfence_policy::parse(policy).unwrap()).unwrap();
    let bk = p.with_bk(hash_value("some id"));
    let (hdr, key) = encapsulate(&mut OsRng, pk, &bk, 1);
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
        assert_eq!(decapsulate(&lazy, &bk, &key(&msk, attrs), D).unwrap().0, real, "{attrs}");
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
        let forged = decapsulate_with(&lazy, &bk, &k, &[bk_wire], D).unwrap().0;
        assert_ne!(forged, real, "{attrs}: the wildcard wire alone opened the ciphertext");
    }
    // One side of the user's AND plus the wildcard is not enough either.
    let k = key(&msk, "a=x");
    let forged = decapsulate_with(&lazy, &bk, &k, &[0, bk_wire], D).unwrap().0;
    assert_ne!(forged, real);
}

#[test]
fn two_keys_cannot_be_combined() {
    let (pk, msk) = setup().unwrap();
    let (hdr, bk, real) = encapsulated(&pk, "a: x and b: y");
    let lazy = LazyHeader::parse(&hdr).unwrap();
    let k1 = key(&msk, "a=x");
    let k2 = key(&msk, "b=y");
    assert!(decapsulate(&lazy, &bk, &k1, D).is_err());
    assert!(decapsulate(&lazy, &bk, &k2, D).is_err());
    // Splice k2's component for `b` into k1: the per-key randomness does
    // not match, so the result is garbage.
    let mut franken = k1.clone();
    franken.attrs.insert("b".into(), k2.attrs["b"]);
    franken.k3.insert("b".into(), k2.k3["b"].clone());
    let forged = decapsulate(&lazy, &bk, &franken, D).unwrap().0;
    assert_ne!(forged, real, "two keys were combined");
}

/// Labels whose attribute field (the Boneh-Katz attribute included) is
/// exactly `u16::MAX + extra` bytes long.
fn labels_filling_the_attribute_field(extra: usize) -> Vec<String> {
    let bk_entry = AttributeKey::attribute_block_len([BK_LABEL].into_iter()) - 2;
    let budget = usize::from(u16::MAX) - 2 - bk_entry + extra;
    // Five-character labels cost 40 bytes each; the last one takes the rest.
    let n = budget / 40;
    let mut labels: Vec<String> = (0..n - 1).map(|i| format!("{i:05}")).collect();
    labels.push("z".repeat(budget - (n - 1) * 40 - 35));
    assert_eq!(AttributeKey::attribute_block_len(labels.iter().map(String::as_str).chain([BK_LABEL])), budget + 2 + bk_entry);
    labels
}

#[test]
fn attribute_keys_at_the_format_limit_round_trip_and_one_byte_more_is_refused() {
    let (pk, msk) = setup().unwrap();
    let labels = labels_filling_the_attribute_field(0);
    let attrs = keyfence_policy::Attributes::from_pairs(labels.iter().map(|l| (l.as_str(), "v")));
    let key = keygen(&msk, &attrs).unwrap();
    let bytes = key.to_bytes();
    let back = AttributeKey::from_bytes(&bytes).unwrap();
    assert!(back == key, "the largest key reads back as itself");
    let last = labels.last().unwrap();
    let ct = super::encrypt(&pk, &format!("{last}: v and 00000: v"), b"at the edge").unwrap();
    assert_eq!(&super::decrypt(&back, &ct).unwrap()[..], b"at the edge");

    let over = labels_filling_the_attribute_field(1);
    let attrs = keyfence_policy::Attributes::from_pairs(over.iter().map(|l| (l.as_str(), "v")));
    let err = keygen(&msk, &attrs).unwrap_err();
    assert!(matches!(err, super::AbeError::TooLarge { object: "attribute key", .. }), "{err}");
    assert_eq!(err.code(), crate::ErrorCode::LimitExceeded);
    assert!(err.to_string().contains("65535"), "{err}");
}

#[test]
fn every_abe_error_has_its_code() {
    use crate::ErrorCode as C;
    let (pk, msk) = setup().unwrap();
    let ct = super::encrypt(&pk, "a: x", b"m").unwrap();
    let cases: Vec<(super::AbeError, C)> = vec![
        (super::decrypt(&key(&msk, "a=y"), &ct).unwrap_err(), C::PolicyNotSatisfied),
        (super::decrypt(&key(&msk, "a=x"), &ct[..ct.len() - 1]).unwrap_err(), C::InvalidCiphertext),
        (AttributeKey::from_bytes(&[1]).unwrap_err(), C::InvalidKey),
        (PublicKey::from_bytes(&[]).unwrap_err(), C::InvalidKey),
        (super::encrypt(&pk, "a: x)", b"m").unwrap_err(), C::PolicySyntax),
        (super::encrypt(&pk, &format!("\"{BK_LABEL}\": x"), b"m").unwrap_err(), C::ReservedLabel),
        (super::AbeError::IntegrityCheckFailed, C::InvalidCiphertext),
        (super::AbeError::AttributeTooLong("l".into()), C::LimitExceeded),
        (super::AbeError::Rng("broken".into()), C::Rng),
        (super::AbeError::Internal("invariant"), C::Internal),
    ];
    for (err, code) in cases {
        assert_eq!(err.code(), code, "{err}");
    }
}

#[test]
fn an_attribute_key_wipes_all_its_key_material_k1_included() {
    use super::group::Wiped;
    use blstrs::{G1Affine, G2Affine};
    let (_, msk) = setup().unwrap();
    let mut k = key(&msk, "a=x,b=y");
    assert!(k.k1.e.iter().all(|p| *p != Wiped(G2Affine::default())), "a fresh key has non-identity k1");
    k.wipe();
    assert!(k.k1.e.iter().all(|p| *p == Wiped(G2Affine::default())), "k1 is wiped");
    assert!(k.k2.e.iter().all(|p| *p == Wiped(G1Affine::default())), "k2 is wiped");
    for m in k.k3.values().chain(k.k3wild.values()) {
        assert!(m.e.iter().all(|p| *p == Wiped(G1Affine::default())), "k3 is wiped");
    }
}

#[test]
fn wiping_temporaries_leaves_neutral_values() {
    use blstrs::{G1Projective, Scalar};
    use group::Group;
    let mut s = [Scalar::from(7u64), Scalar::from(9u64)];
    super::group::wipe(&mut s);
    assert_eq!(s, [Scalar::from(0u64); 2]);
    let mut p = vec![G1Projective::generator(); 3];
    super::group::wipe_to(&mut p, G1Projective::identity());
    assert!(p.iter().all(|q| bool::from(q.is_identity())));
}

#[test]
fn keys_still_round_trip_and_decrypt_after_the_wiping_changes() {
    // setup, keygen, encapsulate and to_bytes wipe their temporaries; the
    // scheme must still work and encodings must still round-trip.
    let (pk, msk) = setup().unwrap();
    let k = key(&msk, "a=x,b=y");
    let again = AttributeKey::from_bytes(&k.to_bytes()).unwrap();
    assert!(again == k);
    assert!(super::MasterSecretKey::from_bytes(&msk.to_bytes()).unwrap() == msk);
    let (hdr, bk, real) = encapsulated(&pk, "a: x and b: y");
    let lazy = LazyHeader::parse(&hdr).unwrap();
    assert_eq!(decapsulate(&lazy, &bk, &again, D).unwrap().0, real);
}

#[test]
fn the_boneh_katz_tables_wait_for_their_decryption_and_agree_with_plain_multiplication() {
    use super::key_cache::TABLES_AT;
    let (pk, msk) = setup().unwrap();
    let loaded = AttributeKey::from_bytes(&key(&msk, "a=x").to_bytes()).unwrap();
    assert!(!loaded.cache().has_bk_tables(), "a loaded key has no tables before it decrypts");
    for round in 1..=TABLES_AT + 2 {
        let msg = format!("message {round}");
        let ct = super::encrypt(&pk, "a: x", msg.as_bytes()).unwrap();
        assert_eq!(&*super::decrypt(&loaded, &ct).unwrap(), msg.as_bytes(), "decryption {round}");
        // Plain multiplications until the TABLES_AT-th decryption, which
        // builds the tables; every one recovers the message.
        assert_eq!(loaded.cache().has_bk_tables(), round >= TABLES_AT, "decryption {round}");
    }
}
