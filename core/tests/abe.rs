//! CP-ABE behaviour: correctness over negations and repeated labels, and
//! the CCA and input-validation properties (every modified ciphertext is an
//! error, never another plaintext).

use blstrs::{Fp, G1Affine};
use ff::Field;
use keyfence::abe::{self, AbeError, AttributeKey};
use keyfence::policy::{Attributes, ParseErrorKind};
use keyfence::ErrorCode;
use std::sync::OnceLock;

fn authority() -> &'static (abe::PublicKey, abe::MasterSecretKey) {
    static A: OnceLock<(abe::PublicKey, abe::MasterSecretKey)> = OnceLock::new();
    A.get_or_init(|| abe::setup().unwrap())
}

fn key(attrs: &str) -> AttributeKey {
    abe::keygen(&authority().1, &attrs.parse::<Attributes>().unwrap()).unwrap()
}

fn enc(policy: &str, msg: &[u8]) -> Vec<u8> {
    abe::encrypt(&authority().0, policy, msg).unwrap()
}

#[test]
fn decrypts_exactly_when_the_policy_holds() {
    let cases: &[(&str, &str, bool)] = &[
        ("country: US or region: EU", "country=FR,region=EU", true),
        ("country: US or region: EU", "country=FR,region=NA", false),
        ("not region: EU", "region=NA", true),
        ("not region: EU", "region=EU", false),
        ("not region: EU", "country=US", false),
        ("region: EU and not country: FR", "region=EU,country=DE", true),
        ("region: EU and not country: FR", "region=EU,country=FR", false),
        ("a: 1 or a: 2 or a: 3", "a=3", true),
        ("(a: 1 or b: 1) and (a: 2 or b: 2)", "a=1,b=2", true),
        ("(a: 1 or b: 1) and (a: 2 or b: 2)", "a=1,b=1", false),
        ("not a: 1 and not a: 2 and a: 3", "a=3", true),
        ("not a: 1 and not a: 2 and a: 3", "a=2", false),
        ("city: \"São Paulo\" and team: \"red-1\"", "city=São Paulo,team=red-1", true),
    ];
    for (i, (policy, attrs, ok)) in cases.iter().enumerate() {
        let msg = format!("secret {i}");
        let ct = enc(policy, msg.as_bytes());
        let k = key(attrs);
        let a: Attributes = attrs.parse().unwrap();
        assert_eq!(abe::could_decrypt(&a, &ct).unwrap(), *ok, "could_decrypt {policy} / {attrs}");
        match abe::decrypt(&k, &ct) {
            Ok(m) => assert!(*ok && m[..] == *msg.as_bytes(), "{policy} / {attrs}"),
            Err(AbeError::NotSatisfied) => assert!(!ok, "{policy} / {attrs} should decrypt"),
            Err(e) => panic!("{policy} / {attrs}: unexpected {e}"),
        }
    }
}

#[test]
fn not_satisfied_has_a_clear_message() {
    let e = abe::decrypt(&key("region=NA"), &enc("region: EU", b"x")).unwrap_err();
    assert_eq!(e.to_string(), "attributes do not satisfy the policy");
}

#[test]
fn every_modified_byte_is_rejected() {
    let ct = enc("region: EU or not country: FR", b"a short message");
    let k = key("region=EU,country=FR");
    assert_eq!(&abe::decrypt(&k, &ct).unwrap()[..], b"a short message");
    for i in 0..ct.len() {
        let mut bad = ct.clone();
        bad[i] ^= 0x01;
        let Err(e) = abe::decrypt(&k, &bad) else { panic!("flipping bit 0 of byte {i} was accepted") };
        // A flip in the policy's text may make a policy the key does not
        // satisfy: refused before the integrity check.
        assert!(matches!(e.code(), ErrorCode::InvalidCiphertext | ErrorCode::PolicyNotSatisfied), "byte {i}: {e}");
    }
}

#[test]
fn truncated_or_extended_ciphertexts_are_rejected() {
    let ct = enc("region: EU", b"message");
    let k = key("region=EU");
    for n in 0..ct.len() {
        let Err(e) = abe::decrypt(&k, &ct[..n]) else { panic!("truncated to {n} bytes was accepted") };
        assert_eq!(e.code(), ErrorCode::InvalidCiphertext, "truncated to {n} bytes: {e}");
    }
    let mut long = ct.clone();
    long.push(0);
    let e = abe::decrypt(&k, &long).unwrap_err();
    assert!(e.to_string().contains("trailing"), "{e}");
}

#[test]
fn errors_name_the_field() {
    let ct = enc("region: EU", b"message");
    let e = abe::decrypt(&key("region=EU"), &ct[..20]).unwrap_err();
    assert!(e.to_string().starts_with("malformed ciphertext: field id: truncated"), "{e}");
    let e = abe::PublicKey::from_bytes(&[1, 0, 0]).unwrap_err();
    assert!(e.to_string().starts_with("malformed public key: field b2"), "{e}");
    let e = AttributeKey::from_bytes(b"").unwrap_err();
    assert!(e.to_string().starts_with("malformed attribute key: field attributes"), "{e}");
}

/// Offset of the first encoded c3 matrix's first point: a 3x1 G1 matrix
/// is `u16 292 | u16 3 | u16 1 | 3 points`.
fn first_c3_point(ct: &[u8]) -> usize {
    let pat = [0x24, 0x01, 3, 0, 1, 0];
    ct.windows(6).position(|w| w == pat).expect("a c3 entry") + 6
}

/// A point on the G1 curve outside the prime-order subgroup.
fn point_outside_subgroup() -> [u8; 96] {
    let mut x = Fp::ONE;
    loop {
        let rhs = x.square() * x + Fp::from(4u64);
        if let Some(y) = Option::<Fp>::from(rhs.sqrt()) {
            let mut b = [0u8; 96];
            b[..48].copy_from_slice(&x.to_bytes_be());
            b[48..].copy_from_slice(&y.to_bytes_be());
            let p = Option::<G1Affine>::from(G1Affine::from_uncompressed_unchecked(&b)).unwrap();
            assert!(bool::from(p.is_on_curve()));
            if !bool::from(p.is_torsion_free()) {
                return b;
            }
        }
        x += Fp::ONE;
    }
}

#[test]
fn points_off_the_curve_or_subgroup_are_rejected() {
    let ct = enc("region: EU", b"message");
    let k = key("region=EU");
    let at = first_c3_point(&ct);
    let mut bad = ct.clone();
    bad[at..at + 96].copy_from_slice(&point_outside_subgroup());
    let e = abe::decrypt(&k, &bad).unwrap_err();
    assert_eq!(e.to_string(), "malformed ciphertext: field c3[0][0,0]: point is not in the G1 subgroup");
    let mut bad = ct.clone();
    bad[at + 95] ^= 1;
    let e = abe::decrypt(&k, &bad).unwrap_err();
    assert_eq!(e.to_string(), "malformed ciphertext: field c3[0][0,0]: not a point on the G1 curve (or bad encoding flags)");
}

#[test]
fn oversized_policies_are_refused_at_encryption() {
    // CIRCL issue 695: this encodes past the 16-bit policy length.
    let policy = (0..400).map(|i| format!("a{i}: {}", "v".repeat(120))).collect::<Vec<_>>().join(" or ");
    match abe::encrypt(&authority().0, &policy, b"x") {
        Err(AbeError::Policy(e)) => assert!(matches!(e.kind(), ParseErrorKind::TooLarge { .. })),
        other => panic!("expected a too-large error, got {other:?}"),
    }
}

/// Encrypts under `policy`, which must encode to exactly the format's
/// largest policy field, checks that the field is that long and that a
/// key satisfying `attrs` decrypts it.
fn encrypts_at_the_edge(policy: &str, attrs: Attributes) {
    let p = keyfence::policy::parse(policy).unwrap();
    assert_eq!(keyfence::policy::limits::encoded_len(&p), keyfence::policy::MAX_ENCODED_POLICY);
    let ct = enc(policy, b"at the edge");
    // The policy field's u16 length, the formula's length and gate count.
    let gates = p.gates().len();
    let formula = 2 + 7 * gates;
    let field = [0xff, 0xff, formula as u8, (formula >> 8) as u8, gates as u8, (gates >> 8) as u8];
    assert!(ct.windows(6).any(|w| w == field), "the policy field is 65535 bytes");
    let k = abe::keygen(&authority().1, &attrs).unwrap();
    assert_eq!(&abe::decrypt(&k, &ct).unwrap()[..], b"at the edge");
    assert_eq!(abe::policy_of(&ct).unwrap(), p);
}

/// The policy `terms(len)` builds with the value length that makes it
/// encode to exactly the largest policy field (the size is linear in it).
fn value_len_at_the_edge(terms: impl Fn(usize) -> String) -> usize {
    let at_one = keyfence::policy::limits::encoded_len(&keyfence::policy::parse(&terms(1)).unwrap());
    1 + keyfence::policy::MAX_ENCODED_POLICY - at_one
}

#[test]
fn the_largest_policy_encrypts_and_one_byte_more_is_refused() {
    let one = |n: usize| format!("a: {}", "v".repeat(n));
    let many = |n: usize| {
        let mut t: Vec<String> = (0..200).map(|i| format!("l{}: x{i}", i % 7)).collect();
        t.push(format!("last: {}", "w".repeat(n)));
        t.join(" or ")
    };
    edge_and_one_past(&one, &|n| Attributes::from_pairs([("a", "v".repeat(n))]));
    edge_and_one_past(&many, &|_| Attributes::from_pairs([("l3", "x3")]));
}

fn edge_and_one_past(terms: &dyn Fn(usize) -> String, attrs: &dyn Fn(usize) -> Attributes) {
    let n = value_len_at_the_edge(terms);
    encrypts_at_the_edge(&terms(n), attrs(n));
    let over = keyfence::policy::parse(&terms(n + 1)).unwrap_err();
    assert_eq!(*over.kind(), ParseErrorKind::TooLarge { encoded: 65_536, limit: 65_535 }, "{over}");
}

#[test]
fn the_bk_label_is_reserved() {
    let policy = "\"internal-boneh-katz-transform-attribute\": x";
    assert!(matches!(abe::encrypt(&authority().0, policy, b"x"), Err(AbeError::ReservedLabel(_))));
    let attrs: Attributes = [("internal-boneh-katz-transform-attribute", "x")].into_iter().collect();
    assert!(matches!(abe::keygen(&authority().1, &attrs), Err(AbeError::ReservedLabel(_))));
}

#[test]
fn keys_round_trip_and_hide_their_material() {
    let (pk, msk) = authority();
    assert_eq!(abe::PublicKey::from_bytes(&pk.to_bytes()).unwrap(), *pk);
    assert_eq!(abe::MasterSecretKey::from_bytes(&msk.to_bytes()).unwrap(), *msk);
    let k = key("region=EU,country=DE");
    let again = AttributeKey::from_bytes(&k.to_bytes()).unwrap();
    assert_eq!(again, k);
    assert_ne!(key("region=EU,country=DE"), k, "fresh randomness per key");
    assert_eq!(k.labels().collect::<Vec<_>>(), vec!["country", "region"]);
    assert_eq!(format!("{msk:?}"), "MasterSecretKey { .. }");
    let dbg = format!("{k:?}");
    assert_eq!(dbg, "AttributeKey { labels: [\"country\", \"region\"], .. }");
}

#[test]
fn a_key_from_another_authority_fails_cleanly() {
    let (_, other_msk) = abe::setup().unwrap();
    let stranger = abe::keygen(&other_msk, &"region=EU".parse().unwrap()).unwrap();
    let e = abe::decrypt(&stranger, &enc("region: EU", b"x")).unwrap_err();
    assert!(matches!(e, AbeError::IntegrityCheckFailed), "{e}");
}

#[test]
fn policy_and_pairs_come_back_out() {
    let ct = enc("(region: EU or region: UK) and not country: FR", b"x");
    let p = abe::policy_of(&ct).unwrap();
    assert_eq!(p.to_string(), "(region: EU or region: UK) and not country: FR");
    assert_eq!(p.attribute_pairs(), vec![("region", "EU"), ("region", "UK"), ("country", "FR")]);
}

/// Issue 14: the decoders accepted the point at infinity, so a forged
/// object made of identities decoded (a ciphertext of them opens to a key
/// anyone can compute). Every point the scheme makes is a random power of
/// a generator; the identity is refused wherever a point is read.
#[test]
fn the_point_at_infinity_is_refused_in_keys() {
    let (pk, _) = keyfence::abe::setup().unwrap();
    let good = pk.to_bytes().to_vec();
    // u16 length of b2, u16 rows, u16 cols, then its first G2 point.
    let mut bad = good.clone();
    bad[6..6 + 192].fill(0);
    bad[6] = 0x40; // the uncompressed encoding's infinity flag
    let e = keyfence::abe::PublicKey::from_bytes(&bad).unwrap_err();
    assert!(e.to_string().contains("point at infinity"), "{e}");
    assert_eq!(e.code(), keyfence::ErrorCode::InvalidKey);
    assert!(keyfence::abe::PublicKey::from_bytes(&good).is_ok());
}

/// `ü` as one code point and as `u` + U+0308 look the same; keyfence
/// refuses the second wherever it enters instead of issuing a key that no
/// composed policy would match.
#[test]
fn text_not_in_nfc_is_refused_at_every_door() {
    let msk = &authority().1;
    let nfd = Attributes::from_pairs([("city", "Zu\u{308}rich")]);
    let e = abe::keygen(msk, &nfd).unwrap_err();
    assert_eq!(e.code(), keyfence::ErrorCode::InvalidAttributes);
    assert!(e.to_string().contains("not in Unicode NFC"), "{e}");
    let e = abe::keygen(msk, &Attributes::from_pairs([("city", "")])).unwrap_err();
    assert_eq!(e.code(), keyfence::ErrorCode::InvalidAttributes);

    let e = abe::encrypt(&authority().0, "city: \"Zu\u{308}rich\"", b"m").unwrap_err();
    assert_eq!(e.code(), keyfence::ErrorCode::PolicySyntax);
    assert!(matches!(e, AbeError::Policy(ref p) if matches!(p.kind(), ParseErrorKind::NotNfc { .. })), "{e}");
    assert_eq!(e.policy_position(), Some(6));

    // The composed form works end to end.
    let ct = enc("city: \"Z\u{fc}rich\"", b"m");
    assert_eq!(abe::decrypt(&key("city=Z\u{fc}rich"), &ct).unwrap().as_slice(), b"m");
}
