//! keyfence against CIRCL tkn20 v1.6.5 (driven through the Go oracle in
//! `vectors/circl-oracle`): identical bytes from identical randomness,
//! decryption both ways, and CIRCL's published golden files.

mod common;
#[path = "../../vectors/oracle.rs"]
mod oracle;

use common::Dir;
use keyfence::abe::{self, AttributeKey, MasterSecretKey, PublicKey};
use keyfence::policy::{parse, Attributes};
use rand_core::{CryptoRng, RngCore};
use sha3::digest::{ExtendableOutput, Update, XofReader};

/// SHAKE256(seed) as a random source, as the oracle's `--seed`.
struct Shake(sha3::Shake256Reader);

impl Shake {
    fn new(seed_hex: &str) -> Self {
        let mut h = sha3::Shake256::default();
        h.update(&hex::decode(seed_hex).unwrap());
        Shake(h.finalize_xof())
    }
}

impl RngCore for Shake {
    fn next_u32(&mut self) -> u32 {
        rand_core::impls::next_u32_via_fill(self)
    }
    fn next_u64(&mut self) -> u64 {
        rand_core::impls::next_u64_via_fill(self)
    }
    fn fill_bytes(&mut self, d: &mut [u8]) {
        self.0.read(d)
    }
    fn try_fill_bytes(&mut self, d: &mut [u8]) -> Result<(), rand_core::Error> {
        self.0.read(d);
        Ok(())
    }
}
impl CryptoRng for Shake {}

fn go(args: &[&str]) {
    oracle::run(args, None).unwrap_or_else(|e| panic!("oracle {args:?}: {e}"));
}

const POLICIES: &[&str] = &[
    "region: EU",
    "country: US or (not region: EU)",
    "(region: EU or region: UK) and not country: FR and tier: 1 or region: NA and region: US",
    "not (a: x and not b: y) or (c: z and c: w and not c: q)",
];

#[test]
fn same_randomness_same_bytes() {
    let d = Dir::new("kat");
    go(&["setup", "--pk", &d.path("pk"), "--msk", &d.path("msk"), "--seed", "01"]);
    let (pk, msk) = abe::setup_with_rng(&mut Shake::new("01")).unwrap();
    assert_eq!(pk.to_bytes(), d.read("pk"), "public key");
    assert_eq!(&msk.to_bytes()[..], &d.read("msk")[..], "master secret key");

    let attrs = "region=EU,country=DE,tier=1,c=z";
    go(&["keygen", "--msk", &d.path("msk"), "--attrs", attrs, "--out", &d.path("key"), "--seed", "02"]);
    let key = abe::keygen_with_rng(&mut Shake::new("02"), &msk, &attrs.parse().unwrap()).unwrap();
    assert_eq!(&key.to_bytes()[..], &d.read("key")[..], "attribute key");

    d.write("msg", b"identical bytes, twice");
    for (i, policy) in POLICIES.iter().enumerate() {
        let seed = format!("1{i}");
        go(&["encrypt", "--pk", &d.path("pk"), "--policy", policy, "--in", &d.path("msg"), "--out", &d.path("ct"), "--seed", &seed]);
        let ct = abe::encrypt_policy_with_rng(&mut Shake::new(&seed), &pk, &parse(policy).unwrap(), b"identical bytes, twice").unwrap();
        assert_eq!(ct, d.read("ct"), "ciphertext for {policy:?}");
    }
}

#[test]
fn circl_ciphertexts_decrypt_here_and_ours_there() {
    let d = Dir::new("interop");
    go(&["setup", "--pk", &d.path("pk"), "--msk", &d.path("msk")]);
    let pk = PublicKey::from_bytes(&d.read("pk")).unwrap();
    let msk = MasterSecretKey::from_bytes(&d.read("msk")).unwrap();
    let cases: &[(&str, &str, bool)] = &[
        ("region: EU", "region=EU,country=DE", true),
        ("country: US or (not region: EU)", "country=FR,region=APAC", true),
        ("country: US or (not region: EU)", "country=FR,region=EU", false),
        ("country: US or (not region: EU)", "country=FR", false),
        ("(a: x or a: y or a: z) and not b: q and (b: w or a: v)", "a=y,b=w", true),
        ("a: x and b: y", "a=x", false),
    ];
    for (n, (policy, attrs, ok)) in cases.iter().enumerate() {
        let msg = format!("message {n}");
        d.write("msg", msg.as_bytes());
        // CIRCL key, keyfence key from CIRCL's master key.
        go(&["keygen", "--msk", &d.path("msk"), "--attrs", attrs, "--out", &d.path("circl.key")]);
        let circl_key = AttributeKey::from_bytes(&d.read("circl.key")).unwrap();
        let our_key = abe::keygen(&msk, &attrs.parse::<Attributes>().unwrap()).unwrap();
        d.write("our.key", &our_key.to_bytes());

        // CIRCL encrypts, keyfence decrypts with both keys.
        go(&["encrypt", "--pk", &d.path("pk"), "--policy", policy, "--in", &d.path("msg"), "--out", &d.path("circl.ct")]);
        let circl_ct = d.read("circl.ct");
        for k in [&circl_key, &our_key] {
            match abe::decrypt(k, &circl_ct) {
                Ok(m) => assert!(*ok && m[..] == *msg.as_bytes(), "{policy} / {attrs}"),
                Err(e) => assert!(!ok && matches!(e, abe::AbeError::NotSatisfied), "{policy} / {attrs}: {e}"),
            }
        }
        // keyfence encrypts, CIRCL decrypts with both keys.
        let ours = abe::encrypt(&pk, policy, msg.as_bytes()).unwrap();
        d.write("our.ct", &ours);
        for k in ["circl.key", "our.key"] {
            let r = oracle::run(&["decrypt", "--key", &d.path(k), "--in", &d.path("our.ct"), "--out", &d.path("pt")], None);
            assert_eq!(r.is_ok(), *ok, "CIRCL decrypting ours, {policy} / {attrs} with {k}: {r:?}");
            if *ok {
                assert_eq!(d.read("pt"), msg.as_bytes());
            }
        }
        // Both agree on the policy.
        let shown = String::from_utf8(oracle::run(&["inspect", "--in", &d.path("our.ct")], None).unwrap()).unwrap();
        assert_eq!(abe::policy_of(&circl_ct).unwrap(), abe::policy_of(&ours).unwrap());
        assert!(!shown.trim().is_empty());
    }
}

#[test]
fn circl_golden_files() {
    let dir = oracle::golden_dir();
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let pk = PublicKey::from_bytes(&read("publicKey")).unwrap();
    assert_eq!(pk.to_bytes(), read("publicKey"));
    let msk = MasterSecretKey::from_bytes(&read("secretKey")).unwrap();
    assert_eq!(&msk.to_bytes()[..], &read("secretKey")[..]);
    let key = AttributeKey::from_bytes(&read("attributeKey")).unwrap();
    assert_eq!(&key.to_bytes()[..], &read("attributeKey")[..]);
    let attrs: Attributes = "country=NL,EU=true".parse().unwrap();
    for ct in ["ciphertext", "ciphertext_v137"] {
        let c = read(ct);
        assert_eq!(abe::policy_of(&c).unwrap().to_string(), "EU: true", "{ct}");
        assert!(abe::could_decrypt(&attrs, &c).unwrap());
        assert_eq!(&abe::decrypt(&key, &c).unwrap()[..], b"Be sure to drink your ovaltine!", "{ct}");
    }
}

/// Keys and ciphertexts made on several threads are CIRCL's format all the
/// same: CIRCL decrypts ours with its key and with ours, and our threaded
/// key decrypts CIRCL's ciphertexts, on one thread and on two.
#[test]
fn threaded_keygen_and_encryption_interoperate_with_circl() {
    let d = Dir::new("interop-threads");
    go(&["setup", "--pk", &d.path("pk"), "--msk", &d.path("msk")]);
    let pk = PublicKey::from_bytes(&d.read("pk")).unwrap();
    let msk = MasterSecretKey::from_bytes(&d.read("msk")).unwrap();
    let attrs = "a=y,b=w,c=z,region=EU,tier=1";
    let policy = "(a: x or a: y or a: z) and not b: q and (b: w or a: v) and region: EU and not tier: 2 and c: z";
    go(&["keygen", "--msk", &d.path("msk"), "--attrs", attrs, "--out", &d.path("circl.key")]);
    let our_key = abe::keygen_with_threads(&msk, &attrs.parse::<Attributes>().unwrap(), 2).unwrap();
    d.write("our.key", &our_key.to_bytes());
    let msg = b"made on two threads";
    d.write("msg", msg);

    let ours = abe::encrypt_policy_with_threads(&pk, &parse(policy).unwrap(), msg, 2).unwrap();
    d.write("our.ct", &ours);
    for k in ["circl.key", "our.key"] {
        oracle::run(&["decrypt", "--key", &d.path(k), "--in", &d.path("our.ct"), "--out", &d.path("pt")], None)
            .unwrap_or_else(|e| panic!("CIRCL decrypting a threaded ciphertext with {k}: {e}"));
        assert_eq!(d.read("pt"), msg);
    }
    go(&["encrypt", "--pk", &d.path("pk"), "--policy", policy, "--in", &d.path("msg"), "--out", &d.path("circl.ct")]);
    let circl_ct = d.read("circl.ct");
    for threads in [1, 2] {
        assert_eq!(&abe::decrypt_with_threads(&our_key, &circl_ct, threads).unwrap()[..], msg, "{threads} threads");
    }
    // A threaded key from a set the policy refuses is refused there too.
    let refused = abe::keygen_with_threads(&msk, &"a=y,b=q,c=z,region=EU".parse::<Attributes>().unwrap(), 2).unwrap();
    assert!(matches!(abe::decrypt_with_threads(&refused, &circl_ct, 2), Err(abe::AbeError::NotSatisfied)));
}
