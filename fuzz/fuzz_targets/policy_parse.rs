//! Any text: parsing never panics, and an accepted policy's canonical form
//! parses back to the same circuit with the same verdicts.
#![no_main]

use keyfence_policy::{parse, parse_expr, Attributes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else { return };
    let Ok(p) = parse(src) else { return };
    let canonical = p.to_string();
    let again = parse(&canonical).expect("canonical form must parse");
    assert_eq!(again, p, "canonical form {canonical:?} changed the circuit");
    let expr = parse_expr(src).expect("parse accepted it");
    // Attribute sets drawn from the policy's own words, so verdicts vary.
    let pairs = p.attribute_pairs();
    for mask in 0u32..8 {
        let attrs: Attributes = pairs
            .iter()
            .enumerate()
            .filter(|(i, _)| mask >> (i % 3) & 1 == 1)
            .map(|(i, (l, v))| (l.to_string(), if i % 2 == 0 { v.to_string() } else { "other".into() }))
            .collect();
        assert_eq!(p.eval(&attrs), expr.eval(&attrs));
    }
});
