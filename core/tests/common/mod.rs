//! What the core's test files share, written once: the one way a test
//! skips ([`skip_unless`]), the programs a test runs as another user,
//! waiting for a condition, the `openssl` command line ([`openssl`]), and
//! checking a signature with OpenSSL.
#![allow(dead_code)]

mod openssl_cli;
mod skip;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

// Not every test file skips or runs openssl.
#[allow(unused_imports)]
pub use openssl_cli::*;
#[allow(unused_imports)]
pub use skip::*;

/// The program `name` of tests/programs (an `[[example]]` of the core's
/// Cargo.toml): not a test, something a test runs, as another user for
/// one. A whole `cargo test -p keyfence` builds it; `--test NAME` alone
/// does not.
pub fn program(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().and_then(Path::parent).unwrap().join("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built: `cargo build -p keyfence --example {name}` (a whole `cargo test -p keyfence` builds it)",
        path.display()
    );
    path
}

/// Runs the program `name` ([`program`]) as `nobody` (uid and gid 65534,
/// which needs root) with `env`, and returns what follows `PROBE: ` on the
/// line of its output that has it: what a probe of another user saw.
pub fn probe_as_nobody(name: &str, env: &[(&str, &std::ffi::OsStr)]) -> String {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(program(name));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.uid(65534).gid(65534).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    out.lines()
        .find_map(|l| l.strip_prefix("PROBE: ").map(str::to_string))
        .unwrap_or_else(|| panic!("no probe line from {name}: {out}{}", String::from_utf8_lossy(&o.stderr)))
}

/// A scratch directory, removed when dropped.
pub struct Dir(pub PathBuf);

impl Dir {
    /// `keyfence-NAME-PID` in the system's temporary directory, empty
    /// (what a run that was killed left there is removed).
    pub fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("keyfence-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    /// The path of `f` in it, as a string for command lines.
    pub fn path(&self, f: &str) -> String {
        self.0.join(f).to_str().unwrap().to_owned()
    }

    /// The contents of `f` in it.
    pub fn read(&self, f: &str) -> Vec<u8> {
        std::fs::read(self.0.join(f)).unwrap()
    }

    /// Writes `f` in it.
    pub fn write(&self, f: &str, b: &[u8]) {
        std::fs::write(self.0.join(f), b).unwrap()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits (up to 30 s) until `cond` holds.
pub fn eventually(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(30), "{what}: not after 30 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether OpenSSL finds `sig` a signature of `msg` with `alg` under the
/// public key `public_der` (SubjectPublicKeyInfo): the check of every
/// signature the tests make, by code other than the signer's.
#[cfg(feature = "sign")]
pub fn verify(public_der: &[u8], alg: keyfence::sign::Algorithm, msg: &[u8], sig: &[u8]) -> bool {
    use keyfence::sign::Hash;
    use openssl::hash::MessageDigest;
    use openssl::sign::{RsaPssSaltlen, Verifier};
    let public = openssl::pkey::PKey::public_key_from_der(public_der).unwrap();
    let md = alg.hash().map(|h| match h {
        Hash::Sha256 => MessageDigest::sha256(),
        Hash::Sha384 => MessageDigest::sha384(),
        Hash::Sha512 => MessageDigest::sha512(),
        Hash::Md5Sha1 => panic!("the tests do not verify {alg}"),
    });
    let mut v = match md {
        Some(md) => Verifier::new(md, &public).unwrap(),
        None => Verifier::new_without_digest(&public).unwrap(),
    };
    if alg.name().starts_with("rsa-pss") {
        v.set_rsa_padding(openssl::rsa::Padding::PKCS1_PSS).unwrap();
        v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).unwrap();
        v.set_rsa_mgf1_md(md.unwrap()).unwrap();
    }
    v.verify_oneshot(sig, msg).unwrap_or(false)
}

/// [`verify`] with `key`'s public half.
#[cfg(feature = "sign")]
pub fn verify_key(key: &keyfence::sign::PrivateKey, alg: keyfence::sign::Algorithm, msg: &[u8], sig: &[u8]) -> bool {
    verify(&key.public_key_der().unwrap(), alg, msg, sig)
}

/// A key process (the one this package builds) of one thread per class.
#[cfg(feature = "sign")]
pub fn key_process_config() -> keyfence::sign::key_process::KeyProcessConfig {
    let mut c = keyfence::sign::key_process::KeyProcessConfig::with_command([env!("CARGO_BIN_EXE_keyfence-key-process")]);
    c.rsa_threads = 1;
    c.ec_threads = 1;
    c
}

/// An engine whose keys are in a [`key_process_config`] key process.
#[cfg(feature = "sign")]
pub fn key_process_engine() -> keyfence::sign::managed::ManagedEngine {
    use keyfence::sign::managed::{Isolation, ManagedConfig, ManagedEngine};
    let mut config = ManagedConfig::default();
    config.isolation = Isolation::KeyProcess(key_process_config());
    ManagedEngine::start(config).unwrap()
}
