//! `include/keyfence.h` is generated from this crate by cbindgen and checked
//! in, so C users read it without running Rust tools. This test regenerates
//! it and fails when the checked-in copy differs; run it with
//! `KEYFENCE_UPDATE_HEADER=1` to rewrite the file.
//!
//! The header's `keyfence_result` enum comes from the core's table of error
//! codes (`keyfence::ErrorCode`, core/src/error.rs), not from this crate,
//! which has no list of codes: the test writes it as Rust source for
//! cbindgen to read with the crate, so it comes out as cbindgen writes any
//! enum.

use std::fmt::Write;
use std::path::Path;

use keyfence_core::ErrorCode;

/// What the header says of `keyfence_result` itself.
const RESULT_DOC: &str = "The result of every keyfence function: `KEYFENCE_OK` or the error's
stable code (`docs/errors.md`). Numbers never change meaning.";

/// `keyfence_result` as Rust source: `KEYFENCE_OK`, then every core code
/// with its number and the summary (first paragraph) of its documentation.
fn result_enum() -> String {
    let doc = |text: &str| text.lines().map(|l| format!("    /// {l}\n")).collect::<String>();
    let mut out = String::new();
    for line in RESULT_DOC.lines() {
        writeln!(out, "/// {line}").unwrap();
    }
    out.push_str("#[repr(u32)]\npub enum keyfence_result {\n");
    out.push_str(&doc("Success."));
    out.push_str("    KEYFENCE_OK = 0,\n");
    for &code in ErrorCode::ALL {
        let summary = code.doc().split("\n\n").next().unwrap_or_default();
        out.push_str(&doc(summary));
        writeln!(out, "    KEYFENCE_{} = {},", code.name(), code as u32).unwrap();
    }
    out.push_str("}\n");
    out
}

#[test]
fn the_checked_in_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let result = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keyfence_result.rs");
    std::fs::write(&result, result_enum()).expect("write the keyfence_result source");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_src(&result)
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let path = dir.join("include/keyfence.h");
    if std::env::var_os("KEYFENCE_UPDATE_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write keyfence.h");
        return;
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "bindings/c/include/keyfence.h is stale: run `KEYFENCE_UPDATE_HEADER=1 cargo test -p keyfence-c --test header` and commit it"
    );
}

#[test]
fn every_exported_function_is_documented_in_the_header() {
    let header = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/keyfence.h")).unwrap();
    let lines: Vec<&str> = header.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if let Some(pos) = line.find("keyfence_") {
            let is_decl = line.contains('(') && !line.trim_start().starts_with('*') && !line.trim_start().starts_with("/*");
            if is_decl && i > 0 && !line.starts_with(' ') {
                let before = lines[..i].iter().rev().find(|l| !l.trim().is_empty()).copied().unwrap_or("");
                assert!(before.trim_end().ends_with("*/"), "no doc comment before `{}`", &line[pos..]);
            }
        }
    }
}
