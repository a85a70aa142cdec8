//! Locates (building if needed) the CIRCL oracle in `vectors/circl-oracle`
//! for Rust tests. Included with `#[path]` by the tests that need it.
//!
//! `./x test` builds the oracle once and passes it in
//! `KEYFENCE_CIRCL_ORACLE`; a plain `cargo test` builds it here with `go`.
//! Go is part of the project's toolchain (see DESIGN.md): without it these
//! tests fail rather than pass vacuously.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors/circl-oracle")
}

/// Path of the oracle binary.
pub fn oracle() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(p) = std::env::var_os("KEYFENCE_CIRCL_ORACLE") {
            return PathBuf::from(p);
        }
        let out = std::env::temp_dir().join(format!("keyfence-circl-oracle-{}", std::process::id()));
        let status = Command::new("go")
            .args(["build", "-o"])
            .arg(&out)
            .arg(".")
            .current_dir(source_dir())
            .status()
            .expect("Go is required to build the CIRCL oracle (vectors/circl-oracle)");
        assert!(status.success(), "building the CIRCL oracle failed");
        out
    })
    .clone()
}

/// Runs the oracle with `args`, returning stdout; panics with its stderr
/// on failure.
pub fn run(args: &[&str], stdin: Option<&[u8]>) -> Result<Vec<u8>, String> {
    use std::io::Write;
    let mut child = Command::new(oracle())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the CIRCL oracle");
    let mut sin = child.stdin.take().expect("stdin");
    let input = stdin.map(|s| s.to_vec());
    let writer = std::thread::spawn(move || {
        if let Some(i) = input {
            let _ = sin.write_all(&i);
        }
    });
    let out = child.wait_with_output().expect("oracle output");
    writer.join().expect("writer");
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// CIRCL's published test data (`testdata/` of its tkn20 package) in the
/// Go module cache.
pub fn golden_dir() -> PathBuf {
    let out = Command::new("go")
        .args(["list", "-m", "-f", "{{.Dir}}", "github.com/cloudflare/circl"])
        .current_dir(source_dir())
        .output()
        .expect("go list");
    assert!(out.status.success(), "go list failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).expect("utf8").trim()).join("abe/cpabe/tkn20/testdata")
}
