//! Random policies: the expression, its circuit and the circuit's canonical
//! re-parse agree on every attribute set.

use keyfence_policy::{is_nfc, must_escape, parse, parse_expr, Attributes, Expr, Gate, GateKind, Leaf, ParseErrorKind, Policy};
use proptest::prelude::*;

const LABELS: &[&str] = &["a", "b", "c", "region", "São", "and"];
const VALUES: &[&str] = &["x", "y", "z", "EU", "red-1", "not", "q \"r\""];

fn word(w: &str) -> String {
    if w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') && !matches!(w, "and" | "or" | "not") {
        w.to_owned()
    } else {
        format!("\"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

fn expr() -> impl Strategy<Value = Expr> {
    let leaf = (0..LABELS.len(), 0..VALUES.len()).prop_map(|(l, v)| Expr::Term { label: LABELS[l].into(), value: VALUES[v].into() });
    leaf.prop_recursive(6, 40, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|e| Expr::Not(Box::new(e))),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| Expr::And(Box::new(a), Box::new(b))),
            (inner.clone(), inner).prop_map(|(a, b)| Expr::Or(Box::new(a), Box::new(b))),
        ]
    })
}

/// Prints an expression with full parentheses, so its parse is itself.
fn text(e: &Expr) -> String {
    match e {
        Expr::Term { label, value } => format!("{}: {}", word(label), word(value)),
        Expr::Not(i) => format!("not ({})", text(i)),
        Expr::And(a, b) => format!("({}) and ({})", text(a), text(b)),
        Expr::Or(a, b) => format!("({}) or ({})", text(a), text(b)),
    }
}

fn attributes() -> impl Strategy<Value = Attributes> {
    proptest::collection::vec(proptest::option::of(0..VALUES.len()), LABELS.len())
        .prop_map(|vals| LABELS.iter().zip(vals).filter_map(|(l, v)| v.map(|v| (*l, VALUES[v]))).collect())
}

/// Any text, heavy in what a hostile ciphertext would carry: terminal
/// escapes, quotes, backslashes, bidi overrides, line separators.
fn hostile_word() -> impl Strategy<Value = String> {
    let c = prop_oneof![
        any::<char>(),
        Just('\u{1b}'),
        Just('\u{7}'),
        Just('\n'),
        Just('\u{9b}'),
        Just('"'),
        Just('\\'),
        Just('\u{202e}'),
        Just('\u{2028}'),
        Just('\u{200b}'),
        Just('{'),
        Just('u'),
        Just('a'),
    ];
    proptest::collection::vec(c, 1..10).prop_map(String::from_iter)
}

/// A policy as a ciphertext could carry it: leaves with any text, chained
/// by random gates.
fn hostile_policy() -> impl Strategy<Value = Policy> {
    proptest::collection::vec((hostile_word(), hostile_word(), any::<bool>(), any::<bool>()), 1..6).prop_map(|leaves| {
        let n = leaves.len();
        let gates = (1..n)
            .map(|i| Gate {
                kind: if leaves[i].3 { GateKind::And } else { GateKind::Or },
                in0: if i == 1 { 0 } else { n + i - 2 },
                in1: i,
                out: n + i - 1,
            })
            .collect();
        let leaves = leaves.into_iter().map(|(label, value, positive, _)| Leaf { label, value, positive, occurrence: 0 }).collect();
        Policy::from_parts(leaves, gates).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever text a decoded policy holds, its canonical text shows no
    /// control or invisible formatting character raw, and parses back to
    /// the same policy; text that is not in NFC (which only a ciphertext
    /// made elsewhere can carry) is refused as such, never read as
    /// something else.
    #[test]
    fn canonical_text_of_any_policy_is_inert_and_reparses(p in hostile_policy()) {
        let text = p.to_string();
        prop_assert!(!text.chars().any(must_escape), "{:?}", text);
        let all_nfc = p.leaves().iter().all(|l| is_nfc(&l.label) && is_nfc(&l.value));
        match parse(&text) {
            Ok(again) => prop_assert_eq!(again, p),
            Err(e) => prop_assert!(!all_nfc && matches!(e.kind(), ParseErrorKind::NotNfc { .. }), "{}", e),
        }
    }

    #[test]
    fn expr_circuit_and_reparse_agree(e in expr(), sets in proptest::collection::vec(attributes(), 8)) {
        let src = text(&e);
        prop_assert_eq!(&parse_expr(&src).unwrap(), &e);
        let p = parse(&src).unwrap();
        let canonical = p.to_string();
        let again: Policy = canonical.parse().unwrap();
        prop_assert_eq!(&again, &p, "canonical {} does not re-parse to the same circuit", canonical);
        prop_assert_eq!(again.to_string(), canonical.clone());
        for a in &sets {
            let want = e.eval(a);
            prop_assert_eq!(p.eval(a), want);
            prop_assert_eq!(again.eval(a), want);
            match p.satisfying_leaves(a) {
                None => prop_assert!(!want),
                Some(leaves) => {
                    // Those leaves alone must satisfy the policy: keep only
                    // the attributes their labels name, and it still holds.
                    prop_assert!(want);
                    for &i in &leaves {
                        prop_assert!(p.leaves()[i].holds(a));
                    }
                    let only: Attributes = leaves
                        .iter()
                        .filter_map(|&i| {
                            let label = p.leaves()[i].label.as_str();
                            a.get(label).map(|v| (label, v))
                        })
                        .collect();
                    prop_assert!(p.eval(&only), "the satisfying leaves {:?} of {} do not satisfy it alone", leaves, canonical);
                }
            }
        }
    }

    #[test]
    fn from_parts_accepts_what_parse_builds(e in expr()) {
        let p = parse(&text(&e)).unwrap();
        let rebuilt = Policy::from_parts(p.leaves().to_vec(), p.gates().to_vec()).unwrap();
        prop_assert_eq!(rebuilt, p);
    }

    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,80}") {
        if let Ok(p) = parse(&s) {
            prop_assert_eq!(parse(&p.to_string()).unwrap(), p);
        }
    }
}
