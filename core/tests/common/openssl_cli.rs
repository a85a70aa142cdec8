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
