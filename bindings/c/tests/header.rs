//! `include/keyfence.h` is generated from this crate by cbindgen and checked
//! in, so C users read it without running Rust tools. This test regenerates
//! it and fails when the checked-in copy differs; run it with
//! `KEYFENCE_UPDATE_HEADER=1` to rewrite the file.

use std::path::Path;

#[test]
fn the_checked_in_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
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
