//! `--alg`: one list, from the library, in the help, in the "unknown
//! algorithm" message and in docs/signing.md; every algorithm on it signs.

mod common;

use common::{keyfence, ok, openssl, stderr, stdout, Dir};
use keyfence::sign::Algorithm;

fn names() -> Vec<&'static str> {
    Algorithm::ALL.iter().map(|a| a.name()).collect()
}

/// The first column of the `--alg` table in docs/signing.md.
fn documented() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/signing.md")).unwrap();
    let mut rows = doc.lines().skip_while(|l| !l.starts_with("| `--alg`")).skip(2);
    let mut out = Vec::new();
    while let Some(l) = rows.next().filter(|l| l.starts_with('|')) {
        let cell = l.split('|').nth(1).unwrap().trim();
        out.push(cell.trim_matches('`').to_string());
    }
    out
}

#[test]
fn the_docs_help_and_message_list_the_librarys_algorithms() {
    assert_eq!(documented(), names());
    let list = names().join(", ");
    let help = stdout(&keyfence(&["sign", "--help"])).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains(&list), "{help}");
    let o = keyfence(&["sign", "--key", "k", "--alg", "bogus", "--in", "m", "--out", "s"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains(&format!("unknown signature algorithm `bogus`; known: {list}")), "{}", stderr(&o));
}

#[test]
fn every_listed_rsa_algorithm_is_offered_and_verifies() {
    let d = Dir::new("alg-list");
    let (key, public, msg) = (d.p("rsa.pem"), d.p("rsa.pub"), d.p("msg"));
    openssl(&d, &["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", &key]);
    openssl(&d, &["pkey", "-in", &key, "-pubout", "-out", &public]);
    std::fs::write(&msg, b"every algorithm on the list").unwrap();
    for (alg, hash, pss) in
        [("rsa-pkcs1-sha512", "-sha512", None), ("rsa-pss-sha384", "-sha384", Some("48")), ("rsa-pss-sha512", "-sha512", Some("64"))]
    {
        let sig = d.p(alg);
        ok(&["sign", "--key", &key, "--alg", alg, "--in", &msg, "--out", &sig]);
        let saltlen = pss.map(|s| format!("rsa_pss_saltlen:{s}"));
        let mut args = vec!["dgst", hash];
        if let Some(s) = &saltlen {
            args.extend(["-sigopt", "rsa_padding_mode:pss", "-sigopt", s]);
        }
        args.extend(["-verify", &public, "-signature", &sig, &msg]);
        openssl(&d, &args);
    }
    // MD5+SHA-1 (TLS 1.0/1.1): PKCS#1 type 1 over the 36-byte
    // concatenation, no DigestInfo; the raw RSA operation recovers it.
    let sig = d.p("md5sha1");
    ok(&["sign", "--key", &key, "--alg", "rsa-pkcs1-md5-sha1", "--in", &msg, "--out", &sig]);
    let recovered = openssl(&d, &["pkeyutl", "-verifyrecover", "-pubin", "-inkey", &public, "-in", &sig]);
    let md5 = openssl(&d, &["dgst", "-md5", "-binary", &msg]);
    let sha1 = openssl(&d, &["dgst", "-sha1", "-binary", &msg]);
    assert_eq!(recovered, [md5, sha1].concat());
}
