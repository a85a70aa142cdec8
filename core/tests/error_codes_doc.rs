//! docs/errors.md lists every error code the library can return, with the
//! number and name the bindings use. An integration test rather than a unit
//! test: the published crate does not carry docs/, and cargo leaves tests
//! outside `include` out of the package.

use keyfence::ErrorCode;

#[test]
fn the_documented_table_lists_every_code() {
    let doc = include_str!("../../docs/errors.md");
    for &c in ErrorCode::ALL {
        let row = format!("| {} | `{}` |", c as u32, c.name());
        assert!(doc.contains(&row), "docs/errors.md lacks the row starting {row}");
    }
}
