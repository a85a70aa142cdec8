//! The copies of the error-code table outside Rust are generated from
//! `keyfence::ErrorCode` (core/src/error.rs) and checked in: the table of
//! docs/errors.md (between its markers) and Python's
//! `keyfence/_codes.py`. These tests regenerate them and fail when a
//! checked-in copy differs; `KEYFENCE_UPDATE_CODES=1` rewrites them. (The C
//! header's enum is bindings/c/tests/header.rs's.)
//!
//! Integration tests rather than unit tests: the published crate does not
//! carry docs/ or the bindings, and cargo leaves tests outside `include`
//! out of the package.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use keyfence::ErrorCode;

const BEGIN: &str = "<!-- The table is generated from core/src/error.rs by core/tests/error_codes_generated.rs \
                     (KEYFENCE_UPDATE_CODES=1 rewrites it); the Python column is kept by hand, checked by \
                     bindings/python/tests/test_errors.py. -->\n";
const END: &str = "<!-- End of the generated table. -->\n";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// Compares `generated` with the checked-in `path`, or rewrites it under
/// `KEYFENCE_UPDATE_CODES`.
fn check(path: &str, generated: &str) {
    let file = repo(path);
    if std::env::var_os("KEYFENCE_UPDATE_CODES").is_some() {
        std::fs::write(&file, generated).unwrap_or_else(|e| panic!("write {path}: {e}"));
        return;
    }
    let checked_in = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        checked_in == generated,
        "{path} is stale: run `KEYFENCE_UPDATE_CODES=1 cargo test -p keyfence --test error_codes_generated` and commit it"
    );
}

/// The code's documentation on one line, for a table cell.
fn one_line(code: ErrorCode) -> String {
    let text = code.doc().split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(!text.contains('|'), "{code:?}: a `|` would end the table cell");
    text
}

/// docs/errors.md with its table written from the core's: number, name and
/// documentation of each code, and the Python class the page already gives
/// it (`KeyfenceError`, the class of a code Python does not know, for a new
/// one).
fn errors_md(page: &str) -> String {
    let (before, rest) = page.split_once(BEGIN).expect("docs/errors.md has the table's opening marker");
    let (table, after) = rest.split_once(END).expect("docs/errors.md has the table's closing marker");
    let python: HashMap<&str, &str> = table
        .lines()
        .filter_map(|row| {
            let number = row.strip_prefix("| ")?.split(' ').next()?;
            Some((number, row.strip_suffix(" |")?.rsplit(" | ").next()?))
        })
        .collect();
    let mut out = format!("{before}{BEGIN}| number | name | meaning | Python class |\n| --- | --- | --- | --- |\n");
    for &code in ErrorCode::ALL {
        let number = (code as u32).to_string();
        let class = python.get(number.as_str()).copied().unwrap_or("`KeyfenceError`");
        writeln!(out, "| {number} | `{}` | {} | {class} |", code.name(), one_line(code)).unwrap();
    }
    out + END + after
}

/// bindings/python/src/keyfence/_codes.py: the name of each code, by number.
fn codes_py() -> String {
    let mut out = String::from(
        r#""""The error codes, by number: generated from the Rust core's table
(``core/src/error.rs``) by ``core/tests/error_codes_generated.rs``; do not
edit (``KEYFENCE_UPDATE_CODES=1`` rewrites it). The exception class of each
code is chosen in :mod:`keyfence.exceptions`."""

from __future__ import annotations

from typing import Dict

#: The stable name of each error code, by number.
NAMES: Dict[int, str] = {
"#,
    );
    for &code in ErrorCode::ALL {
        writeln!(out, "    {}: \"{}\",", code as u32, code.name()).unwrap();
    }
    out + "}\n"
}

#[test]
fn the_table_in_docs_errors_md_is_current() {
    let page = std::fs::read_to_string(repo("docs/errors.md")).expect("docs/errors.md");
    check("docs/errors.md", &errors_md(&page));
}

#[test]
fn the_python_table_of_codes_is_current() {
    check("bindings/python/src/keyfence/_codes.py", &codes_py());
}

#[test]
fn a_new_code_gets_a_row_and_the_python_base_class() {
    let page = format!("intro\n{BEGIN}| 1 | `INVALID_ARGUMENT` | old | `InvalidArgument` (also `ValueError`) |\n{END}outro\n");
    let out = errors_md(&page);
    assert!(out.starts_with(&format!("intro\n{BEGIN}| number |")) && out.ends_with(&format!("{END}outro\n")), "{out}");
    assert!(out.contains(&format!(
        "| 1 | `INVALID_ARGUMENT` | {} | `InvalidArgument` (also `ValueError`) |\n",
        one_line(ErrorCode::InvalidArgument)
    )));
    assert!(out.contains("| 2 | `INTERNAL` | An invariant of keyfence's own code did not hold: a bug, never the input's fault. Please report it. | `KeyfenceError` |\n"));
}
