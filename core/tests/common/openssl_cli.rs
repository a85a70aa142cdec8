//! The `openssl` command line, which the tests use to make keys and
//! certificates and to check signatures with code other than keyfence's.
//! Shared by the core's tests and the command line's (included with
//! `#[path]`), and by the support modules.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// Runs `openssl ARGS` in `dir`, for a test that looks at a failure too.
pub fn openssl_output(dir: impl AsRef<Path>, args: &[&str]) -> Output {
    Command::new("openssl").args(args).current_dir(dir).output().expect("the openssl command line")
}

/// Runs `openssl ARGS` in `dir`; its failure fails the test. Its standard
/// output.
pub fn openssl(dir: impl AsRef<Path>, args: &[&str]) -> Vec<u8> {
    let out = openssl_output(dir, args);
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// Makes a self-signed P-256 CA, `NAME.key` and `NAME.pem`, with the
/// subject `subj` (`/CN=...`), valid two days: every test PKI starts here.
pub fn make_ca(dir: impl AsRef<Path>, name: &str, subj: &str) {
    let dir = dir.as_ref();
    let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
    openssl(dir, &["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", &key]);
    openssl(dir, &["req", "-x509", "-new", "-key", &key, "-subj", subj, "-days", "2", "-sha256", "-out", &pem]);
}

/// Makes `NAME.key` and `NAME.pem`, a P-256 key and a certificate for it
/// with the subject `subj`, signed by the CA `ca` (`CA.pem`, `CA.key` in
/// `dir`), with the X.509 extensions `ext` (an openssl extension file's
/// lines: `subjectAltName=DNS:a`, `extendedKeyUsage=clientAuth`).
pub fn issue_cert_ext(dir: impl AsRef<Path>, ca: &str, name: &str, subj: &str, ext: &str) {
    let dir = dir.as_ref();
    let (key, csr, ext_file, pem) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.ext"), format!("{name}.pem"));
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    openssl(dir, &["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", &key]);
    openssl(dir, &["req", "-new", "-key", &key, "-subj", subj, "-out", &csr]);
    std::fs::write(dir.join(&ext_file), format!("{ext}\n")).expect("write the extension file");
    let sign = ["x509", "-req", "-in", &csr, "-CA", &ca_pem, "-CAkey", &ca_key, "-CAcreateserial", "-days", "2", "-sha256"];
    openssl(dir, &[&sign[..], &["-extfile", &ext_file, "-out", &pem]].concat());
}
