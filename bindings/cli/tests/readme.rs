//! The README states facts the build also states; they must agree.

use std::path::Path;

/// The workspace's `rust-version` is the one source of truth for the
/// minimum Rust; the README's prerequisites must name the same release.
#[test]
fn readme_names_the_workspace_rust_version() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let declared = cargo
        .lines()
        .find_map(|l| l.trim().strip_prefix("rust-version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("the workspace declares rust-version");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let want = format!("Rust {declared} or newer");
    assert!(readme.contains(&want), "README.md must say \"{want}\" (Cargo.toml's rust-version)");
    for (i, line) in readme.lines().enumerate() {
        if let Some(at) = line.find("Rust 1.") {
            assert!(line[at..].starts_with(&want), "README.md:{}: names another Rust version than {declared}", i + 1);
        }
    }
}
