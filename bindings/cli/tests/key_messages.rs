//! Keys keyfence does not sign with are named, with the reason, instead of
//! "not a private key" (keys made by the `openssl` command line).

mod common;

use common::{keyfence, openssl, stderr, Dir};

#[test]
fn refused_keys_say_what_they_are_and_why() {
    let d = Dir::new("key-messages");
    let msg = d.p("msg");
    std::fs::write(&msg, b"m").unwrap();
    let k1 = d.p("k1.pem");
    openssl(&d, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:secp256k1", "-out", &k1]);
    let k1_sec1 = d.p("k1-sec1.der");
    openssl(&d, &["pkey", "-in", &k1, "-outform", "DER", "-traditional", "-out", &k1_sec1]);
    let ed448 = d.p("ed448.pem");
    openssl(&d, &["genpkey", "-algorithm", "ED448", "-out", &ed448]);
    let pss = d.p("pss.pem");
    openssl(&d, &["genpkey", "-algorithm", "RSA-PSS", "-pkeyopt", "rsa_keygen_bits:2048", "-out", &pss]);
    let enc = d.p("enc.pem");
    openssl(&d, &["genpkey", "-algorithm", "ED25519", "-aes-128-cbc", "-pass", "pass:secret", "-out", &enc]);
    let enc_der = d.p("enc.der");
    openssl(&d, &["pkcs8", "-topk8", "-in", &enc, "-passin", "pass:secret", "-passout", "pass:x", "-outform", "DER", "-out", &enc_der]);
    let enc_legacy = d.p("enc-legacy.pem");
    openssl(&d, &["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", &d.p("rsa.pem")]);
    openssl(&d, &["rsa", "-in", &d.p("rsa.pem"), "-traditional", "-aes128", "-passout", "pass:x", "-out", &enc_legacy]);

    for (key, alg, want) in [
        (&k1, "ecdsa-p256-sha256", "a secp256k1 EC key is not supported: no TLS signature scheme uses secp256k1"),
        (&k1_sec1, "ecdsa-p256-sha256", "a secp256k1 EC key is not supported"),
        (&ed448, "ed25519", "an Ed448 key is not supported: keyfence signs EdDSA with Ed25519, not Ed448"),
        (&pss, "rsa-pss-sha256", "an RSA-PSS-only key (id-RSASSA-PSS) is not supported"),
        (&enc, "ed25519", "the private key is password-protected"),
        (&enc_der, "ed25519", "the private key is password-protected"),
        (&enc_legacy, "rsa-pss-sha256", "the private key is password-protected"),
    ] {
        let o = keyfence(&["sign", "--key", key, "--alg", alg, "--in", &msg, "--out", &d.p("sig")]);
        assert_eq!(o.status.code(), Some(2), "{key}");
        let err = stderr(&o);
        assert!(err.contains(want), "{key}: {err}");
        assert!(!err.contains("not a private key"), "{key}: {err}");
    }
    // The advice for RSA-PSS keys works: their PKCS#1 form signs.
    let pss_traditional = d.p("pss-traditional.pem");
    openssl(&d, &["rsa", "-in", &pss, "-traditional", "-out", &pss_traditional]);
    let o = keyfence(&["sign", "--key", &pss_traditional, "--alg", "rsa-pss-sha256", "--in", &msg, "--out", &d.p("sig")]);
    assert!(stderr(&o).contains("an RSA-PSS-only key (id-RSASSA-PSS) is not supported"), "{}", stderr(&o));
    let pkcs1 = d.p("pss-pkcs1.der");
    openssl(&d, &["rsa", "-in", &pss, "-traditional", "-outform", "DER", "-out", &pkcs1]);
    let o = keyfence(&["sign", "--key", &pkcs1, "--alg", "rsa-pss-sha256", "--in", &msg, "--out", &d.p("sig")]);
    assert!(o.status.success(), "{}", stderr(&o));
}
