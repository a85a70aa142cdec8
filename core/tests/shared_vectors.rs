//! The vector file every language runs (`vectors/shared.kfv`, format in
//! `vectors/README.md`): this test runs each vector through the Rust core,
//! and regenerates the file with CIRCL (the Go oracle) to prove its keys
//! and ciphertexts are CIRCL's bytes. `KEYFENCE_UPDATE_VECTORS=1` rewrites
//! the file instead of comparing.

mod common;
#[path = "../../vectors/oracle.rs"]
mod oracle;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::Dir;
use keyfence::abe::{self, AttributeKey, MasterSecretKey, PublicKey};
use keyfence::policy::{self, Attributes};
use keyfence::ErrorCode;

fn vector_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors/shared.kfv")
}

/// One vector: its fields in file order (a field may repeat).
struct Vector(Vec<(String, String)>);

impl Vector {
    fn get(&self, field: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == field).map(|(_, v)| v.as_str())
    }
    fn field(&self, field: &str) -> &str {
        self.get(field).unwrap_or_else(|| panic!("vector {:?} lacks {field}", self.get("name")))
    }
    fn hex(&self, field: &str) -> Vec<u8> {
        hex::decode(self.field(field)).unwrap_or_else(|e| panic!("{field}: {e}"))
    }
    /// The `attribute` lines, checked as every binding checks attributes
    /// it is given.
    fn attributes(&self) -> Result<Attributes, ErrorCode> {
        Attributes::try_from_pairs(self.0.iter().filter(|(k, _)| k == "attribute").map(|(_, v)| {
            let (l, v) = v.split_once('=').expect("attribute is label=value");
            (l.to_owned(), v.to_owned())
        }))
        .map_err(|e| ErrorCode::from(&e))
    }
}

fn parse(text: &str) -> Vec<Vector> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for line in text.lines().chain(std::iter::once("")) {
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            if !cur.is_empty() {
                out.push(Vector(std::mem::take(&mut cur)));
            }
            continue;
        }
        let (k, v) = line.split_once(": ").unwrap_or_else(|| panic!("not `field: value`: {line:?}"));
        cur.push((k.to_owned(), v.to_owned()));
    }
    out
}

/// What a call gave, in the file's terms: `ok`/`true`/`false` or
/// `error NAME`.
fn outcome<T>(r: Result<T, ErrorCode>, ok: impl FnOnce(T) -> String) -> String {
    match r {
        Ok(v) => ok(v),
        Err(c) => format!("error {}", c.name()),
    }
}

fn check(v: &Vector) {
    let name = v.field("name");
    let expect = v.field("expect");
    match v.field("kind") {
        "policy-check" => {
            let parsed = policy::parse(v.field("policy"));
            if let (Err(e), Some(pos)) = (&parsed, v.get("position")) {
                assert_eq!(e.offset().to_string(), pos, "{name}: position");
            }
            let r = parsed.map_err(|e| ErrorCode::from(&e)).and_then(|p| Ok(p.eval(&v.attributes()?)));
            let got = outcome(r, |b| b.to_string());
            assert_eq!(got, expect, "{name}");
        }
        "policy-canonical" => {
            let p = policy::parse(v.field("policy")).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(p.to_string(), v.field("canonical"), "{name}");
            assert_eq!(expect, "ok", "{name}");
        }
        "abe-key" => {
            let b = v.hex("bytes");
            let r = match v.field("object") {
                "public-key" => PublicKey::from_bytes(&b).map(drop),
                "master-key" => MasterSecretKey::from_bytes(&b).map(drop),
                "attribute-key" => AttributeKey::from_bytes(&b).map(drop),
                o => panic!("{name}: unknown object {o}"),
            };
            assert_eq!(outcome(r.map_err(|e| e.code()), |_| "ok".into()), expect, "{name}");
        }
        "abe-decrypt" => {
            PublicKey::from_bytes(&v.hex("public_key")).unwrap_or_else(|e| panic!("{name}: {e}"));
            let key = AttributeKey::from_bytes(&v.hex("attribute_key")).unwrap_or_else(|e| panic!("{name}: {e}"));
            let ct = v.hex("ciphertext");
            let r = abe::decrypt(&key, &ct);
            match (&r, expect) {
                (Ok(pt), "ok") => assert_eq!(hex::encode(&pt[..]), v.field("plaintext"), "{name}"),
                _ => assert_eq!(outcome(r.map_err(|e| e.code()), |_| "ok".into()), expect, "{name}"),
            }
            if let Some(p) = v.get("policy_of") {
                assert_eq!(abe::policy_of(&ct).unwrap().to_string(), p, "{name}");
            }
            if let Some(c) = v.get("could_decrypt") {
                assert_eq!(abe::could_decrypt(&v.attributes().unwrap(), &ct).unwrap().to_string(), c, "{name}");
            }
        }
        k => panic!("{name}: unknown kind {k}"),
    }
}

#[test]
fn every_vector_holds() {
    let text = std::fs::read_to_string(vector_file()).expect("vectors/shared.kfv");
    let vectors = parse(&text);
    assert!(vectors.len() >= 20, "only {} vectors", vectors.len());
    let mut names = BTreeSet::new();
    let mut kinds = BTreeSet::new();
    for v in &vectors {
        assert!(names.insert(v.field("name").to_owned()), "duplicate name {}", v.field("name"));
        kinds.insert(v.field("kind").to_owned());
        check(v);
    }
    assert_eq!(kinds.len(), 4, "every kind is exercised: {kinds:?}");
}

// ---------------------------------------------------------------------
// Generation: the file is what this function writes, with CIRCL's bytes.

fn go(args: &[&str]) {
    oracle::run(args, None).unwrap_or_else(|e| panic!("oracle {args:?}: {e}"));
}

/// A policy check: the vector's name, the policy, the attributes, the
/// answer, and the error's position where the policy does not parse.
type PolicyCheck = (&'static str, &'static str, &'static [&'static str], &'static str, Option<usize>);

const POLICY_CHECKS: &[PolicyCheck] = &[
    ("policy-check-single", "region: EU", &["region=EU"], "true", None),
    ("policy-check-single-other", "region: EU", &["region=US"], "false", None),
    ("policy-check-missing-label", "region: EU", &["country=FR"], "false", None),
    ("policy-check-negation", "region: EU and not country: DE", &["region=EU", "country=FR"], "true", None),
    ("policy-check-negation-fails", "region: EU and not country: DE", &["region=EU", "country=DE"], "false", None),
    ("policy-check-negation-needs-label", "not country: DE", &[], "false", None),
    ("policy-check-or-nested", "country: US or (not region: EU)", &["region=APAC"], "true", None),
    ("policy-check-precedence", "a: 1 or b: 2 and c: 3", &["a=1"], "true", None),
    ("policy-check-precedence-and", "a: 1 or b: 2 and c: 3", &["b=2"], "false", None),
    ("policy-check-quoted", "team: \"key ops\"", &["team=key ops"], "true", None),
    ("policy-check-repeated", "(a: x and b: y) or (a: x and not b: y)", &["a=x", "b=z"], "true", None),
    ("policy-check-syntax-dangling-or", "a: b or", &[], "error POLICY_SYNTAX", Some(7)),
    ("policy-check-syntax-unbalanced", "(a: b", &[], "error POLICY_SYNTAX", Some(5)),
    ("policy-check-syntax-missing-colon", "region EU", &[], "error POLICY_SYNTAX", Some(7)),
    ("policy-check-syntax-empty", "", &[], "error POLICY_SYNTAX", Some(0)),
    // Unicode: labels and values compare bytes, so text not in NFC is
    // refused in policies (raw or escaped) and in attributes alike.
    ("policy-check-nfc", "city: \"Z\u{fc}rich\"", &["city=Z\u{fc}rich"], "true", None),
    ("policy-check-nfd-policy", "city: \"Zu\u{308}rich\"", &["city=Z\u{fc}rich"], "error POLICY_SYNTAX", Some(6)),
    ("policy-check-nfd-escape", r#"city: "Zu\u{308}rich""#, &["city=Z\u{fc}rich"], "error POLICY_SYNTAX", Some(6)),
    ("policy-check-nfd-attribute", "city: \"Z\u{fc}rich\"", &["city=Zu\u{308}rich"], "error INVALID_ATTRIBUTES", None),
];

const CANONICAL: &[(&str, &str)] = &[
    ("policy-canonical-spacing", "region:EU   and   not country :DE"),
    ("policy-canonical-parens", "((a: 1) or (b: 2 and (c: 3)))"),
    ("policy-canonical-quotes", "team: \"key ops\" or name: \"a\\\"b\""),
];

/// The CP-ABE vectors: (name, key, policy, message, what to do to the
/// ciphertext).
const ABE: &[(&str, &str, &str, &str, Tamper)] = &[
    ("abe-decrypt-ok", "fr", "region: EU and not country: DE", "a secret for France", Tamper::None),
    ("abe-decrypt-negation-refuses", "de", "region: EU and not country: DE", "not for Germany", Tamper::None),
    ("abe-decrypt-or", "de", "country: US or (not region: APAC)", "either branch", Tamper::None),
    ("abe-decrypt-repeated", "fr", "(region: EU and country: FR) or (region: EU and not country: FR)", "repeated", Tamper::None),
    ("abe-decrypt-empty-message", "fr", "region: EU", "", Tamper::None),
    ("abe-decrypt-last-byte-flipped", "fr", "region: EU", "tampered tail", Tamper::FlipLast),
    ("abe-decrypt-middle-byte-flipped", "fr", "region: EU", "tampered middle", Tamper::FlipMiddle),
    ("abe-decrypt-truncated", "fr", "region: EU", "cut short", Tamper::Truncate),
    ("abe-decrypt-empty-ciphertext", "fr", "region: EU", "", Tamper::Empty),
];

#[derive(Clone, Copy)]
enum Tamper {
    None,
    FlipLast,
    FlipMiddle,
    Truncate,
    Empty,
}

const KEYS: &[(&str, &str)] = &[("fr", "region=EU,country=FR"), ("de", "region=EU,country=DE")];

fn generate() -> String {
    let mut out = String::from(
        "# keyfence shared test vectors, format 1: see vectors/README.md.\n\
         # Generated by core/tests/shared_vectors.rs; CP-ABE bytes made by CIRCL tkn20 from fixed seeds.\n",
    );
    let mut push = |fields: Vec<(&str, String)>| {
        out.push('\n');
        for (k, v) in fields {
            out.push_str(&format!("{k}: {v}\n"));
        }
    };
    for (name, pol, attrs, expect, pos) in POLICY_CHECKS {
        let mut f = vec![("name", name.to_string()), ("kind", "policy-check".into()), ("policy", pol.to_string())];
        f.extend(attrs.iter().map(|a| ("attribute", a.to_string())));
        f.push(("expect", expect.to_string()));
        if let Some(p) = pos {
            f.push(("position", p.to_string()));
        }
        push(f);
    }
    for (name, pol) in CANONICAL {
        let canonical = policy::parse(pol).unwrap().to_string();
        push(vec![
            ("name", name.to_string()),
            ("kind", "policy-canonical".into()),
            ("policy", pol.to_string()),
            ("canonical", canonical),
            ("expect", "ok".into()),
        ]);
    }

    let d = Dir::new("vectors");
    go(&["setup", "--pk", &d.path("pk"), "--msk", &d.path("msk"), "--seed", "6b66010001"]);
    let pk = hex::encode(d.read("pk"));
    for (i, (k, attrs)) in KEYS.iter().enumerate() {
        let seed = format!("6b6602{i:02x}");
        go(&["keygen", "--msk", &d.path("msk"), "--attrs", attrs, "--out", &d.path(k), "--seed", &seed]);
    }
    for (i, (name, key, pol, msg, tamper)) in ABE.iter().enumerate() {
        std::fs::write(d.path("msg"), msg).unwrap();
        let seed = format!("6b6603{i:02x}");
        go(&["encrypt", "--pk", &d.path("pk"), "--policy", pol, "--in", &d.path("msg"), "--out", &d.path("ct"), "--seed", &seed]);
        let mut ct = d.read("ct");
        let header_intact = match tamper {
            Tamper::None => true,
            Tamper::FlipLast => {
                *ct.last_mut().unwrap() ^= 1;
                true
            }
            Tamper::FlipMiddle => {
                let n = ct.len() / 2;
                ct[n] ^= 0x40;
                false
            }
            Tamper::Truncate => {
                ct.truncate(ct.len() / 2);
                false
            }
            Tamper::Empty => {
                ct.clear();
                false
            }
        };
        // What CIRCL says decides `expect`: the oracle's own decryption.
        std::fs::write(d.path("ct"), &ct).unwrap();
        let circl = oracle::run(&["decrypt", "--key", &d.path(key), "--in", &d.path("ct"), "--out", &d.path("pt")], None);
        let attrs = KEYS.iter().find(|(k, _)| k == key).unwrap().1;
        let mut f = vec![
            ("name", name.to_string()),
            ("kind", "abe-decrypt".into()),
            ("public_key", pk.clone()),
            ("attribute_key", hex::encode(d.read(key))),
        ];
        f.extend(attrs.split(',').map(|a| ("attribute", a.to_string())));
        f.push(("ciphertext", hex::encode(&ct)));
        let satisfied = policy::parse(pol).unwrap().eval(&attrs.parse().unwrap());
        match circl {
            Ok(_) => {
                f.push(("expect", "ok".into()));
                f.push(("plaintext", hex::encode(d.read("pt"))));
            }
            Err(_) if !satisfied => f.push(("expect", "error POLICY_NOT_SATISFIED".into())),
            Err(_) => f.push(("expect", "error INVALID_CIPHERTEXT".into())),
        }
        if header_intact {
            f.push(("policy_of", policy::parse(pol).unwrap().to_string()));
            f.push(("could_decrypt", satisfied.to_string()));
        }
        push(f);
    }
    let msk = d.read("msk");
    let key = d.read("fr");
    let keys: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        ("abe-key-public", "public-key", d.read("pk"), "ok"),
        ("abe-key-master", "master-key", msk.clone(), "ok"),
        ("abe-key-attribute", "attribute-key", key.clone(), "ok"),
        ("abe-key-public-truncated", "public-key", d.read("pk")[..40].to_vec(), "error INVALID_KEY"),
        ("abe-key-master-empty", "master-key", Vec::new(), "error INVALID_KEY"),
        ("abe-key-attribute-truncated", "attribute-key", key[..key.len() - 1].to_vec(), "error INVALID_KEY"),
        ("abe-key-attribute-as-public", "public-key", key.clone(), "error INVALID_KEY"),
    ];
    for (name, object, bytes, expect) in keys {
        push(vec![
            ("name", name.to_string()),
            ("kind", "abe-key".into()),
            ("object", object.to_string()),
            ("bytes", hex::encode(bytes)),
            ("expect", expect.to_string()),
        ]);
    }
    out
}

/// The checked-in file is exactly what CIRCL makes today from the seeds.
#[test]
fn file_is_circl_output() {
    let fresh = generate();
    let path = vector_file();
    if std::env::var_os("KEYFENCE_UPDATE_VECTORS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let old = std::fs::read_to_string(&path).expect("vectors/shared.kfv; generate it with KEYFENCE_UPDATE_VECTORS=1");
    assert!(
        old == fresh,
        "vectors/shared.kfv differs from what CIRCL and this test generate; rerun with KEYFENCE_UPDATE_VECTORS=1 and review the diff"
    );
}
