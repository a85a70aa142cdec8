//! The `keyfence` command line, run as a user would.

mod common;

use common::{keyfence, stderr, stdout, Dir};

#[test]
fn policy_check_prints_the_canonical_form_and_verdict() {
    let o = keyfence(&["policy", "check", "country: US or (not region: EU)", "--attrs", "country=FR,region=APAC"]);
    assert!(o.status.success());
    assert_eq!(stdout(&o), "country: US or not region: EU\nsatisfied by {country=FR,region=APAC} (using not region: EU)\n");
    let o = keyfence(&["policy", "check", "not (a: x or b: y)", "--attrs", "a=x", "--json"]);
    assert_eq!(stdout(&o).trim(), r#"{"canonical":"not a: x and not b: y","satisfied":false}"#);
    let o = keyfence(&["policy", "check", "a: x", "--json"]);
    assert_eq!(stdout(&o).trim(), r#"{"canonical":"a: x","satisfied":null}"#);
}

#[test]
fn a_malformed_policy_fails_with_a_caret() {
    // Exit 2: bad input (1 is the "not satisfied" answer).
    let o = keyfence(&["policy", "check", "country: US) and region: EU"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "invalid policy at byte 11: unexpected `)`: no `(` is open here (the policy already ended)\n  \
         country: US) and region: EU\n             ^\n"
    );
    let o = keyfence(&["policy", "check", "a: x", "--attrs", "a"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("invalid --attrs"), "{}", stderr(&o));
}

#[test]
fn abe_round_trip_through_files() {
    let d = Dir::new("abe");
    assert!(keyfence(&["abe", "setup", "--out", &d.p("auth")]).status.success());
    let ok = |args: &[&str]| {
        common::ok(args);
    };
    std::fs::write(d.p("msg"), b"the message").unwrap();
    ok(&["abe", "keygen", "--msk", &d.p("auth/msk.bin"), "--attrs", "region=EU,country=DE", "--out", &d.p("eu.key")]);
    ok(&["abe", "keygen", "--msk", &d.p("auth/msk.bin"), "--attrs", "region=NA", "--out", &d.p("na.key")]);
    ok(&[
        "abe",
        "encrypt",
        "--pk",
        &d.p("auth/pk.bin"),
        "--policy",
        "region: EU and not country: FR",
        "--in",
        &d.p("msg"),
        "--out",
        &d.p("ct"),
    ]);
    ok(&["abe", "decrypt", "--key", &d.p("eu.key"), "--in", &d.p("ct"), "--out", &d.p("pt")]);
    assert_eq!(std::fs::read(d.p("pt")).unwrap(), b"the message");
    let o = keyfence(&["abe", "inspect", &d.p("ct")]);
    assert_eq!(stdout(&o), "region: EU and not country: FR\n");

    let o = keyfence(&["abe", "decrypt", "--key", &d.p("na.key"), "--in", &d.p("ct"), "--out", &d.p("pt2")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("attributes do not satisfy the policy"), "{}", stderr(&o));
    assert!(!std::path::Path::new(&d.p("pt2")).exists());

    let o =
        keyfence(&["abe", "encrypt", "--pk", &d.p("auth/pk.bin"), "--policy", "region: EU)", "--in", &d.p("msg"), "--out", &d.p("ct2")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains('^'));

    let o = keyfence(&["abe", "decrypt", "--key", &d.p("msg"), "--in", &d.p("ct"), "--out", &d.p("pt3")]);
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("attribute key"), "{}", stderr(&o));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(d.p("auth/msk.bin")).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the master secret key is readable by others");
    }
}

#[test]
fn keygen_refuses_a_key_too_large_for_its_format_instead_of_writing_it() {
    // 2,000 attributes with short labels need about 72 KB in the key's
    // 16-bit attribute field: once written truncated, now refused.
    let d = Dir::new("abe-limit");
    common::ok(&["abe", "setup", "--out", &d.p("auth")]);
    let attrs: Vec<String> = (0..2000).map(|i| format!("{}{i}=x", (b'a' + (i % 26) as u8) as char)).collect();
    let o = keyfence(&["abe", "keygen", "--msk", &d.p("auth/msk.bin"), "--attrs", &attrs.join(","), "--out", &d.p("big.key")]);
    assert_ne!(o.status.code(), Some(0));
    let err = stderr(&o);
    assert!(err.contains("attribute key too large") && err.contains("65535"), "{err}");
    assert!(!std::path::Path::new(&d.p("big.key")).exists(), "no key file is left behind");
}

#[test]
fn bench_abe_prints_one_json_object_per_case() {
    let o = keyfence(&["bench", "abe", "--json", "--iters", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let cases: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<&str> = cases.iter().map(|c| c["case"].as_str().unwrap()).collect();
    assert_eq!(names, ["small", "and50", "or50", "and50neg25"]);
    for c in &cases {
        let two = ["keygen_ms_2threads", "encrypt_ms_2threads", "decrypt_ms_2threads"];
        for k in ["keygen_ms", "encrypt_ms", "decrypt_ms", "decrypt_cold_ms"].into_iter().chain(two) {
            assert!(c[k].as_f64().unwrap() > 0.0, "{c}");
        }
        assert!(c["ct_overhead"].as_u64().unwrap() > 2000);
    }
}

/// Issue 14: a ciphertext's policy is whatever its maker wrote; `abe
/// inspect` must not hand terminal escapes (a title change, a bell, text
/// reordered by a bidi override) to the reader's terminal, and what it
/// prints must parse back to the same policy.
#[test]
fn abe_inspect_never_prints_terminal_escapes() {
    let d = Dir::new("abe-escapes");
    common::ok(&["abe", "setup", "--out", &d.p("auth")]);
    std::fs::write(d.p("msg"), b"m").unwrap();
    let policy = r#"a: "\u{1b}]0;pwned\u{7}" and b: "\u{202e}gnp.exe" or c: "\u{9b}31m""#;
    common::ok(&["abe", "encrypt", "--pk", &d.p("auth/pk.bin"), "--policy", policy, "--in", &d.p("msg"), "--out", &d.p("ct")]);
    let o = keyfence(&["abe", "inspect", &d.p("ct")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let shown = stdout(&o);
    assert!(!shown.chars().any(|c| c.is_control() && c != '\n' || c == '\u{202e}'), "{shown:?}");
    assert_eq!(shown, format!("{policy}\n"));
    // The printed text is the same policy again.
    let o = keyfence(&["policy", "check", shown.trim_end()]);
    assert_eq!(stdout(&o), shown);
}
