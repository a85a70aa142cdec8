//! The grammar, the numbering CIRCL relies on, the limits and the error
//! messages.

use keyfence_policy::{parse, parse_expr, Attributes, GateKind, ParseErrorKind, MAX_DEPTH, MAX_LEAVES};

fn attrs(s: &str) -> Attributes {
    s.parse().unwrap()
}

fn err(src: &str) -> (usize, String) {
    let e = parse(src).unwrap_err();
    (e.offset(), e.render(src))
}

#[test]
fn trailing_text_is_rejected_at_the_paren() {
    // CIRCL issue 697: CIRCL parses this as `country: US`.
    let (off, msg) = err("country: US) and region: EU");
    assert_eq!(off, 11);
    assert_eq!(
        msg,
        "invalid policy at byte 11: unexpected `)`: no `(` is open here (the policy already ended)\n  \
         country: US) and region: EU\n             ^"
    );
    let (off, msg) = err("(a: b)(c: d)");
    assert_eq!(off, 6);
    assert!(msg.contains("expected `and`, `or` or end of input"), "{msg}");
}

#[test]
fn messages_say_what_was_expected() {
    let cases: &[(&str, usize, &str)] = &[
        ("", 0, "unexpected end of input: expected `(`, `not` or a `label: value` term"),
        ("country US", 8, "unexpected \"US\": expected `:` after the label"),
        ("country:", 8, "unexpected end of input: expected a value after `:`"),
        ("country: and", 9, "unexpected `and`: expected a value after `:`"),
        ("(a: b", 5, "unexpected end of input: expected `and`, `or` or `)`"),
        ("a: b c: d", 5, "unexpected \"c\": expected `and`, `or` or end of input"),
        ("a: b and", 8, "expected `(`, `not` or a `label: value` term"),
        ("a: b & c: d", 5, "unexpected character '&'"),
        ("a: b AND c: d", 5, "unexpected \"AND\""),
        ("city: \"Paris", 6, "unterminated quoted string"),
        ("city: \"a\\nb\"", 8, "invalid escape `\\n`"),
        ("city: \"\"", 6, "empty label or value"),
        ("a: é", 3, "unexpected character 'é'"),
    ];
    for (src, off, want) in cases {
        let e = parse(src).unwrap_err();
        assert_eq!(e.offset(), *off, "offset for {src:?}: {e}");
        assert!(e.to_string().contains(want), "{src:?}: got {e}, want {want}");
    }
}

#[test]
fn caret_counts_characters_not_bytes() {
    let src = "city: \"São Paulo\" )";
    let e = parse(src).unwrap_err();
    assert_eq!(e.offset(), 19);
    let caret_line = e.render(src).lines().last().unwrap().to_owned();
    assert_eq!(caret_line.find('^').unwrap(), 2 + 18);
}

#[test]
fn precedence_and_associativity() {
    // not > and > or, left associative.
    let p = parse("a: x or b: y and not c: z").unwrap();
    assert_eq!(p.to_string(), "a: x or b: y and not c: z");
    assert_eq!(p.gates()[0].kind, GateKind::And);
    assert_eq!(p.gates()[1].kind, GateKind::Or);
    let p = parse("a: x or (b: y or c: z)").unwrap();
    assert_eq!(p.to_string(), "a: x or (b: y or c: z)");
    let p = parse("(a: x or b: y) or c: z").unwrap();
    assert_eq!(p.to_string(), "a: x or b: y or c: z");
}

#[test]
fn numbering_matches_circl() {
    // Leaves in order of appearance (0..=n), gates innermost first, gate k
    // driving wire n+1+k, output 2n.
    let p = parse("(a: x and b: y) or (c: z and not d: w)").unwrap();
    let wires: Vec<(GateKind, usize, usize, usize)> = p.gates().iter().map(|g| (g.kind, g.in0, g.in1, g.out)).collect();
    assert_eq!(wires, vec![(GateKind::And, 0, 1, 4), (GateKind::And, 2, 3, 5), (GateKind::Or, 4, 5, 6)]);
    assert!(!p.leaves()[3].positive);
    // De Morgan flips the gate and the leaf signs under `not`.
    let p = parse("not (a: x and not b: y)").unwrap();
    assert_eq!(p.gates()[0].kind, GateKind::Or);
    assert!(!p.leaves()[0].positive);
    assert!(p.leaves()[1].positive);
    assert_eq!(p.to_string(), "not a: x or b: y");
}

#[test]
fn repeated_labels_are_numbered() {
    let p = parse("region: EU or region: UK or country: FR or region: NA").unwrap();
    let occ: Vec<usize> = p.leaves().iter().map(|l| l.occurrence).collect();
    assert_eq!(occ, vec![0, 1, 0, 2]);
    assert_eq!(p.max_repeats(), 3);
}

#[test]
fn negation_semantics_are_circls() {
    let p = parse("not region: EU").unwrap();
    assert!(p.eval(&attrs("region=US")));
    assert!(!p.eval(&attrs("region=EU")));
    assert!(!p.eval(&attrs("country=US")), "a missing label satisfies no leaf");
    let p = parse("not not region: EU").unwrap();
    assert!(p.eval(&attrs("region=EU")));
    let p = parse("country: US or (not region: EU)").unwrap();
    assert!(p.eval(&attrs("country=US")));
    assert!(p.eval(&attrs("country=FR,region=APAC")));
    assert!(!p.eval(&attrs("country=FR,region=EU")));
    assert!(!p.eval(&attrs("country=FR")));
}

#[test]
fn satisfying_leaves_are_minimal_and_circls_choice() {
    let p = parse("(a: x and b: y) or c: z").unwrap();
    let all = attrs("a=x,b=y,c=z");
    assert_eq!(p.satisfying_leaves(&all), Some(vec![2]), "the shorter side of an or");
    let p = parse("a: x or c: z").unwrap();
    assert_eq!(p.satisfying_leaves(&attrs("a=x,c=z")), Some(vec![0]), "ties go to the first input");
    assert_eq!(p.satisfying_leaves(&attrs("a=q")), None);
}

#[test]
fn quoted_words() {
    let p = parse(r#"city: "São Paulo" and team: "red-1" and "odd \"label\"": "a\\b" and w: "and""#).unwrap();
    assert_eq!(p.leaves()[0].value, "São Paulo");
    assert_eq!(p.leaves()[2].label, "odd \"label\"");
    assert_eq!(p.leaves()[2].value, "a\\b");
    assert_eq!(p.leaves()[3].value, "and");
    let canonical = p.to_string();
    assert_eq!(canonical, r#"city: "São Paulo" and team: "red-1" and "odd \"label\"": "a\\b" and w: "and""#);
    assert_eq!(parse(&canonical).unwrap(), p);
    // A quoted identifier is the same word as the bare one.
    assert_eq!(parse(r#""country": "US""#).unwrap(), parse("country: US").unwrap());
}

#[test]
fn whitespace_and_case() {
    let p = parse("\tcountry:US\r\n or\nregion :  EU ").unwrap();
    assert_eq!(p.to_string(), "country: US or region: EU");
    // Keywords are lowercase only; uppercase words are identifiers.
    let p = parse("NOT: AND").unwrap();
    assert_eq!(p.leaves()[0].label, "NOT");
}

fn nested(depth: usize) -> String {
    // The policy itself is level 1; each group adds one.
    format!("{}a: b{}", "(".repeat(depth - 1), ")".repeat(depth - 1))
}

#[test]
fn depth_limit_is_circls() {
    assert!(parse(&nested(MAX_DEPTH)).is_ok());
    let e = parse(&nested(MAX_DEPTH + 1)).unwrap_err();
    assert_eq!(*e.kind(), ParseErrorKind::TooDeep { limit: MAX_DEPTH });
    assert_eq!(e.offset(), MAX_DEPTH - 1);
    let nots = format!("{}a: b", "not ".repeat(MAX_DEPTH - 1));
    assert!(parse(&nots).is_ok());
    let nots = format!("{}a: b", "not ".repeat(MAX_DEPTH));
    assert!(matches!(parse(&nots).unwrap_err().kind(), ParseErrorKind::TooDeep { .. }));
    // Deep input must not exhaust the stack, however long it is.
    let deep = "(".repeat(1_000_000);
    assert!(parse(&deep).is_err());
}

#[test]
fn encoding_overflow_is_refused() {
    // CIRCL issue 695: this policy's encoding overflows the 16-bit length
    // of the ciphertext's policy field; CIRCL encrypts to it anyway.
    let fits = (0..MAX_LEAVES).map(|i| format!("{}: v", i % 10)).collect::<Vec<_>>().join(" or ");
    assert!(parse(&fits).is_ok(), "{MAX_LEAVES} one-byte terms fit");
    let long_values = (0..400).map(|i| format!("a{i}: {}", "v".repeat(120))).collect::<Vec<_>>().join(" and ");
    let e = parse(&long_values).unwrap_err();
    match e.kind() {
        ParseErrorKind::TooLarge { encoded, limit } => {
            assert!(encoded > limit);
            assert_eq!(*limit, 65535);
        }
        k => panic!("wrong error {k:?}"),
    }
    assert!(e.offset() > 0 && e.offset() < long_values.len());
    let too_many = (0..MAX_LEAVES + 1).map(|_| "a: b").collect::<Vec<_>>().join(" or ");
    assert!(matches!(parse(&too_many).unwrap_err().kind(), ParseErrorKind::TooManyLeaves { .. }));
}

#[test]
fn expr_and_circuit_agree_on_examples() {
    let src = "not (a: x or (b: y and not c: z))";
    let e = parse_expr(src).unwrap();
    let p = parse(src).unwrap();
    for a in ["a=x", "a=q,b=y,c=q", "a=q,b=y,c=z", "a=q,b=q", "b=y,c=q", ""] {
        let a = attrs(a);
        assert_eq!(e.eval(&a), p.eval(&a), "{a}");
    }
}

#[test]
fn attribute_lists() {
    assert_eq!(attrs("a=1, b = 2 ").get("b"), Some("2"));
    assert!("a=1,a=2".parse::<Attributes>().is_err());
    assert!("a".parse::<Attributes>().is_err());
    assert!("a=".parse::<Attributes>().is_err());
    assert!("".parse::<Attributes>().unwrap().is_empty());
}

#[test]
fn decomposed_text_is_refused_at_its_quote() {
    // `ü` as `u` + U+0308, raw and through an escape: both refused at the
    // opening quote, with the composed form to write instead.
    for src in ["a: x and city: \"Zu\u{308}rich\"", r#"a: x and city: "Zu\u{308}rich""#] {
        let e = parse(src).unwrap_err();
        assert_eq!(e.offset(), 15, "{src}");
        assert!(matches!(e.kind(), ParseErrorKind::NotNfc { composed } if composed == "\"Z\u{fc}rich\""), "{src}");
        assert_eq!(e.code(), "POLICY_SYNTAX");
        assert!(e.render(src).contains("not in Unicode NFC (composed) form: write \"Z\u{fc}rich\""), "{}", e.render(src));
    }
    let e = parse("\"Gru\u{308}n\": x").unwrap_err();
    assert_eq!(e.offset(), 0);
    // The composed form is accepted and matches composed attributes only.
    let p = parse("city: \"Z\u{fc}rich\"").unwrap();
    assert!(p.eval(&attrs("city=Z\u{fc}rich")));
    assert!("city=Zu\u{308}rich".parse::<Attributes>().is_err());
}
