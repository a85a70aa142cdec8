//! Helpers shared by the command-line tests.

#![allow(dead_code)]

// The core's tests skip and run openssl the same way, from the same files.
#[path = "../../../../core/tests/common/openssl_cli.rs"]
mod openssl_cli;
#[path = "../../../../core/tests/common/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

// Not every test file skips or runs openssl.
#[allow(unused_imports)]
pub use openssl_cli::*;
#[allow(unused_imports)]
pub use skip::*;

/// Runs the `keyfence` binary built for these tests.
pub fn keyfence(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keyfence")).args(args).output().expect("run keyfence")
}

/// Runs it and asserts success; returns stdout.
pub fn ok(args: &[&str]) -> String {
    let o = keyfence(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    stdout(&o)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A CA (`ca.pem`, `ca.key`) and, for each of `names`, `NAME.key` and
/// `NAME.pem` whose CN and DNS name are NAME, made with the `openssl`
/// command line (as docs/remote.md makes a mesh's certificates).
pub fn pki(d: &Dir, names: &[&str]) {
    make_ca(&d.0, "ca", "/CN=keyfence test CA");
    for name in names {
        issue_cert_ext(&d.0, "ca", name, &format!("/CN={name}"), &format!("subjectAltName=DNS:{name}"));
    }
}

/// A scratch directory removed when dropped.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("keyfence-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch directory");
        Dir(d)
    }

    /// A path inside the directory, as a string for command lines.
    pub fn p(&self, f: &str) -> String {
        self.0.join(f).to_str().expect("UTF-8 path").to_owned()
    }
}

/// So that [`openssl`] runs in it.
impl AsRef<Path> for Dir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A command line from a docs block, split into words as a shell would
/// split it: on spaces, with single quotes around a word that holds them
/// (the only quoting the docs' keyfence commands use).
pub fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut rest = line;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let (word, after) = match rest.strip_prefix('\'') {
            Some(q) => q.split_once('\'').expect("closing quote"),
            None => rest.split_once(' ').unwrap_or((rest, "")),
        };
        words.push(word.to_owned());
        rest = after;
    }
    words
}
