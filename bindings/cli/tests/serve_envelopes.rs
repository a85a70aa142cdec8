//! `keyfence serve --envelopes`: a key server that would hold no key
//! refuses to start, and names the files it skipped.

mod common;

use common::{keyfence, ok, stderr, Dir};

/// A store, a machine key for region=EU, and `serve`'s arguments for
/// `envelopes` (the TLS files are never reached: the check comes first,
/// and `--seconds` bounds the run if it did not).
fn serve_args(d: &Dir, envelopes: &str) -> Vec<String> {
    [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--seconds",
        "5",
        "--cert",
        &d.p("none.pem"),
        "--key",
        &d.p("none.key"),
        "--ca",
        &d.p("none.ca"),
        "--store",
        &d.p("store"),
        "--machine-key",
        &d.p("m.machine"),
        "--envelopes",
        envelopes,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn setup(d: &Dir) {
    ok(&["authority", "init", "--store", &d.p("store")]);
    ok(&["authority", "issue", "--store", &d.p("store"), "--attrs", "region=EU", "--out", &d.p("m.machine")]);
    std::fs::create_dir_all(d.p("envs")).unwrap();
    std::fs::write(d.p("secret"), b"not a key, but the listing comes first").unwrap();
}

#[test]
fn a_directory_without_env_files_is_refused_naming_what_was_skipped() {
    let d = Dir::new("serve-noenv");
    setup(&d);
    ok(&[
        "authority",
        "wrap",
        "--store",
        &d.p("store"),
        "--policy",
        "region: EU",
        "--in",
        &d.p("secret"),
        "--out",
        &d.p("envs/key.envelope"),
    ]);
    let args = serve_args(&d, &d.p("envs"));
    let o = keyfence(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("key.envelope") && err.contains("not a *.env file"), "{err}");
    assert!(err.contains("no envelope to serve"), "{err}");
}

#[test]
fn envelopes_this_machine_cannot_open_leave_nothing_to_serve() {
    let d = Dir::new("serve-none-open");
    setup(&d);
    ok(&["authority", "wrap", "--store", &d.p("store"), "--policy", "region: NA", "--in", &d.p("secret"), "--out", &d.p("envs/na.env")]);
    let args = serve_args(&d, &d.p("envs"));
    let o = keyfence(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("skipping") && err.contains("na.env"), "{err}");
    assert!(err.contains("no envelope to serve"), "{err}");
}
