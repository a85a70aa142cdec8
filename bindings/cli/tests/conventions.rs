//! The conventions every command shares, as a newcomer meets them: exit
//! codes, `-` for standard input and output, a closed standard output,
//! stores created only by `authority init`, secrets never silently
//! replaced.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{keyfence, ok, stderr, stdout, Dir};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_keyfence"))
}

/// Runs `args` with a standard output whose reader is already gone, as
/// `keyfence ... | head -0` would leave it: every write fails with EPIPE,
/// with no race against the reader.
fn with_closed_stdout(args: &[&str]) -> std::process::Output {
    let (writer, reader) = std::os::unix::net::UnixStream::pair().unwrap();
    drop(reader);
    let writer = std::os::fd::OwnedFd::from(writer);
    bin().args(args).stdout(writer).stderr(Stdio::piped()).env("RUST_BACKTRACE", "1").output().unwrap()
}

/// Runs `args` with `input` on standard input.
fn with_stdin(args: &[&str], input: &[u8]) -> std::process::Output {
    let mut child = bin().args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// An authority and a ciphertext under a long policy.
fn abe_fixture(d: &Dir) -> String {
    ok(&["abe", "setup", "--out", &d.p("auth")]);
    std::fs::write(d.p("msg"), b"hello").unwrap();
    let policy: Vec<String> = (0..200).map(|i| format!("site: s{i}")).collect();
    ok(&["abe", "encrypt", "--pk", &d.p("auth/pk.bin"), "--policy", &policy.join(" or "), "--in", &d.p("msg"), "--out", &d.p("ct")]);
    d.p("ct")
}

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let d = Dir::new("epipe");
    let ct = abe_fixture(&d);
    ok(&["authority", "init", "--store", &d.p("store")]);
    for args in [
        vec!["abe", "inspect", ct.as_str()],
        vec!["authority", "status", "--store", &d.p("store")],
        vec!["policy", "check", "a: x", "--attrs", "a=x"],
        vec!["abe", "decrypt", "--key", &d.p("nokey"), "--in", &ct, "--out", "-"],
    ] {
        let o = with_closed_stdout(&args);
        let err = stderr(&o);
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
        if args[1] != "decrypt" {
            assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
            assert_eq!(err, "", "{args:?}");
        }
    }
}

#[test]
fn exit_codes_follow_one_convention() {
    let d = Dir::new("exit");
    let ct = abe_fixture(&d);
    let code = |args: &[&str]| keyfence(args).status.code();
    // 1: a "no" answer.
    assert_eq!(code(&["policy", "check", "a: x", "--attrs", "a=y"]), Some(1));
    assert_eq!(code(&["policy", "check", "a: x", "--attrs", "a=y", "--json"]), Some(1));
    assert_eq!(code(&["policy", "check", "a: x", "--attrs", "a=x"]), Some(0));
    ok(&["abe", "keygen", "--msk", &d.p("auth/msk.bin"), "--attrs", "site=elsewhere", "--out", &d.p("k")]);
    assert_eq!(code(&["abe", "decrypt", "--key", &d.p("k"), "--in", &ct, "--out", &d.p("pt")]), Some(1));
    // 2: usage or bad input, whichever command meets it.
    std::fs::write(d.p("junk"), b"v1.3.8 not really a ciphertext").unwrap();
    assert_eq!(code(&["abe", "decrypt", "--key", &d.p("k"), "--in", &d.p("junk"), "--out", &d.p("pt")]), Some(2));
    assert_eq!(code(&["abe", "inspect", &d.p("junk")]), Some(2));
    let mut truncated = std::fs::read(&ct).unwrap();
    truncated.truncate(truncated.len() / 2);
    std::fs::write(d.p("short"), truncated).unwrap();
    assert_eq!(code(&["abe", "decrypt", "--key", &d.p("k"), "--in", &d.p("short"), "--out", &d.p("pt")]), Some(2));
    assert_eq!(code(&["abe", "inspect", &d.p("short")]), Some(2));
    assert_eq!(code(&["abe", "decrypt", "--key", &d.p("junk"), "--in", &ct, "--out", &d.p("pt")]), Some(2));
    assert_eq!(code(&["policy", "check", "a: x)"]), Some(2));
    assert_eq!(code(&["policy", "check", "a: x", "--attrs", "a"]), Some(2));
    assert_eq!(code(&["abe", "inspect", &d.p("missing")]), Some(2));
    assert_eq!(code(&["abe", "frobnicate"]), Some(2));
    assert_eq!(code(&["sign", "--key", &d.p("junk"), "--alg", "ed25519", "--in", &d.p("msg"), "--out", &d.p("s")]), Some(2));
    assert_eq!(code(&["sign", "--key", &d.p("junk"), "--alg", "bogus", "--in", &d.p("msg"), "--out", &d.p("s")]), Some(2));
    // 3: the system refused (here: the output directory is missing).
    let o = keyfence(&[
        "abe",
        "encrypt",
        "--pk",
        &d.p("auth/pk.bin"),
        "--policy",
        "a: x",
        "--in",
        &d.p("msg"),
        "--out",
        &d.p("no/such/dir/ct"),
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    // The convention is in the help of every command.
    for args in [&["--help"][..], &["abe", "decrypt", "--help"], &["machine", "open", "--help"], &["policy", "check", "--help"]] {
        let help = stdout(&keyfence(args));
        assert!(help.contains("Exit status:\n  0  success\n  1  a \"no\" answer"), "{help}");
        assert!(help.contains("2  usage or bad input") && help.contains("3  any other failure"), "{help}");
        assert!(help.contains("mode 600") && help.contains("docs/"), "{help}");
    }
}

#[test]
fn a_dash_means_standard_input_and_output() {
    let d = Dir::new("dash");
    let ct = abe_fixture(&d);
    ok(&["abe", "keygen", "--msk", &d.p("auth/msk.bin"), "--attrs", "site=s7", "--out", &d.p("k")]);
    let ct_bytes = std::fs::read(&ct).unwrap();
    // inspect: positional, --in, and either from standard input.
    let want = ok(&["abe", "inspect", &ct]);
    assert_eq!(ok(&["abe", "inspect", "--in", &ct]), want);
    assert_eq!(stdout(&with_stdin(&["abe", "inspect", "--in", "-"], &ct_bytes)), want);
    assert_eq!(stdout(&with_stdin(&["abe", "inspect", "-"], &ct_bytes)), want);
    // decrypt from standard input to standard output.
    let o = with_stdin(&["abe", "decrypt", "--key", &d.p("k"), "--in", "-", "--out", "-"], &ct_bytes);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout, b"hello");
    // encrypt from standard input to standard output, then back.
    let o = with_stdin(&["abe", "encrypt", "--pk", &d.p("auth/pk.bin"), "--policy", "site: s7", "--in", "-", "--out", "-"], b"piped");
    assert!(o.status.success(), "{}", stderr(&o));
    let o = with_stdin(&["abe", "decrypt", "--key", &d.p("k"), "--in", "-", "--out", "-"], &o.stdout);
    assert_eq!(o.stdout, b"piped");
    // wrap and open through pipes.
    let s = d.p("store");
    ok(&["authority", "init", "--store", &s]);
    ok(&["authority", "issue", "--store", &s, "--attrs", "region=EU", "--out", &d.p("m.machine")]);
    let o = with_stdin(&["authority", "wrap", "--store", &s, "--policy", "region: EU", "--in", "-", "--out", "-"], b"secret");
    assert!(o.status.success(), "{}", stderr(&o));
    let env = o.stdout;
    // The envelope is on standard output alone: the report goes elsewhere.
    let o = with_stdin(&["machine", "open", "--store", &s, "--key", &d.p("m.machine"), "--in", "-", "--out", "-"], &env);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout, b"secret");
}

#[test]
fn only_authority_init_creates_a_store() {
    let d = Dir::new("nostore");
    let nope = d.p("NOPE");
    std::fs::write(d.p("machine.key"), b"not a key").unwrap();
    std::fs::write(d.p("env"), b"not an envelope").unwrap();
    for args in [
        vec!["machine", "open", "--store", &nope, "--key", &d.p("machine.key"), "--in", &d.p("env"), "--out", &d.p("o")],
        vec!["machine", "could-open", "--store", &nope, "--key", &d.p("machine.key"), "--in", &d.p("env")],
        vec!["authority", "status", "--store", &nope],
        vec!["authority", "issue", "--store", &nope, "--attrs", "a=b", "--out", &d.p("k")],
        vec!["authority", "wrap", "--store", &nope, "--policy", "a: b", "--in", &d.p("env"), "--out", &d.p("e")],
        vec!["authority", "rotate", "--store", &nope],
        vec!["authority", "rotate-policy", "--store", &nope, "--policy", "a: b"],
        vec!["authority", "revoke", "--store", &nope, "--machine", "m1"],
    ] {
        let o = keyfence(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(&format!("{nope} is not a keyfence store")), "{args:?}: {}", stderr(&o));
        assert!(!std::path::Path::new(&nope).exists(), "{args:?} created the store directory");
    }
    // init on a file: one clear sentence, not the OS error twice.
    let o = keyfence(&["authority", "init", "--store", &d.p("env")]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("exists and is not a directory"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("File exists"), "{err}");
    ok(&["authority", "init", "--store", &nope]);
    ok(&["authority", "status", "--store", &nope]);
}

#[test]
fn abe_setup_refuses_to_replace_a_master_secret_key() {
    let d = Dir::new("setup-twice");
    ok(&["abe", "setup", "--out", &d.p("auth")]);
    let msk = std::fs::read(d.p("auth/msk.bin")).unwrap();
    let pk = std::fs::read(d.p("auth/pk.bin")).unwrap();
    let o = keyfence(&["abe", "setup", "--out", &d.p("auth")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("already exists") && stderr(&o).contains("--force"), "{}", stderr(&o));
    assert_eq!(std::fs::read(d.p("auth/msk.bin")).unwrap(), msk);
    assert_eq!(std::fs::read(d.p("auth/pk.bin")).unwrap(), pk);
    ok(&["abe", "setup", "--out", &d.p("auth"), "--force"]);
    assert_ne!(std::fs::read(d.p("auth/msk.bin")).unwrap(), msk);
}

#[test]
fn a_bad_policy_is_reported_once() {
    let d = Dir::new("policy-once");
    let s = d.p("store");
    ok(&["authority", "init", "--store", &s]);
    let o = keyfence(&["authority", "rotate-policy", "--store", &s, "--policy", "bad)"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert_eq!(err.matches("invalid policy").count(), 1, "{err}");
    assert_eq!(err.matches('^').count(), 1, "{err}");
}

#[test]
fn a_policy_over_the_size_limit_shows_a_window_not_the_whole_text() {
    let policy: Vec<String> = (0..3000).map(|i| format!("label{i}: value{i}")).collect();
    let policy = policy.join(" or ");
    assert!(policy.len() > 39_000);
    let o = keyfence(&["policy", "check", &policy]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.len() < 500, "{} bytes of message", err.len());
    assert!(err.contains("policy too large") || err.contains("too large"), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    assert!(lines[1].contains("..."), "{err}");
    // The caret still points into the window.
    let caret = lines[2].find('^').unwrap();
    assert!(caret < lines[1].len(), "{err}");
}

#[test]
fn attrs_take_quoted_values_like_policies() {
    let o = keyfence(&["policy", "check", r#"city: "Paris, 2e" and team: red"#, "--attrs", r#"city="Paris, 2e",team=red"#]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains(r#"satisfied by {city="Paris, 2e",team=red}"#), "{}", stdout(&o));
    let o = keyfence(&["policy", "check", r#"city: "Paris, 2e""#, "--attrs", r#"city="Paris"#]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unterminated quoted string"), "{}", stderr(&o));
}

/// `ü` composed (NFC) and decomposed (NFD) look alike and are different
/// bytes: the decomposed form is refused, in a policy and in `--attrs`,
/// with the form to write instead; no key is issued for it.
#[test]
fn text_not_in_nfc_is_refused_with_the_composed_form() {
    let (nfc, nfd) = ("Z\u{fc}rich", "Zu\u{308}rich");
    let o = keyfence(&["policy", "check", &format!("city: \"{nfc}\""), "--attrs", &format!("city={nfc}")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = keyfence(&["policy", "check", &format!("city: \"{nfd}\""), "--attrs", &format!("city={nfc}")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains(&format!("not in Unicode NFC (composed) form: write \"{nfc}\"")), "{}", stderr(&o));
    let o = keyfence(&["policy", "check", &format!("city: \"{nfc}\""), "--attrs", &format!("city={nfd}")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("value not in Unicode NFC"), "{}", stderr(&o));

    let d = Dir::new("nfc");
    ok(&["abe", "setup", "--out", &d.p("auth")]);
    let o = keyfence(&["abe", "keygen", "--msk", &d.p("auth/msk.bin"), "--attrs", &format!("city={nfd}"), "--out", &d.p("k")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!std::path::Path::new(&d.p("k")).exists());
}

/// Secret outputs: an existing world-readable file ends up mode 600, also
/// when it is reached through the user's own link (the file is replaced
/// whole by a new one of mode 600; the link stays). Links planted by
/// others in shared folders are refused: outputs.rs.
#[cfg(unix)]
#[test]
fn secret_outputs_are_mode_600_also_through_a_link() {
    use std::os::unix::fs::PermissionsExt;
    let d = Dir::new("private-out");
    let auth = d.p("auth");
    ok(&["abe", "setup", "--out", &auth]);

    let loose = d.p("loose.abekey");
    std::fs::write(&loose, b"old").unwrap();
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    ok(&["abe", "keygen", "--msk", &format!("{auth}/msk.bin"), "--attrs", "a=b", "--out", &loose]);
    assert_eq!(std::fs::metadata(&loose).unwrap().permissions().mode() & 0o777, 0o600);

    let named = d.p("named");
    std::fs::write(&named, b"old").unwrap();
    std::fs::set_permissions(&named, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = d.p("link.abekey");
    std::os::unix::fs::symlink(&named, &link).unwrap();
    ok(&["abe", "keygen", "--msk", &format!("{auth}/msk.bin"), "--attrs", "a=b", "--out", &link]);
    assert_ne!(std::fs::read(&named).unwrap(), b"old", "the key did not reach the file the link names");
    assert_eq!(std::fs::metadata(&named).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert!(std::fs::read_dir(&d.0).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains(".tmp-")));
}
