//! `keyfence authority` / `keyfence machine` with `--store etcd://...`:
//! the same commands on a three-member etcd cluster on loopback.

mod common;
#[path = "../../../core/tests/etcd_support/mod.rs"]
mod etcd_support;

use common::{keyfence as run, ok, stderr, Dir};

#[test]
fn the_commands_work_on_an_etcd_store() {
    let Some(cluster) = etcd_support::Cluster::start() else { return };
    let d = Dir::new("etcd-cmds");
    let s = cluster.name("cli/one");
    let o = run(&["authority", "status", "--store", &s]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no authority in this store"), "{}", stderr(&o));

    assert!(ok(&["authority", "init", "--store", &s]).contains("generation 1"));
    let o = run(&["authority", "init", "--store", &s]);
    assert!(!o.status.success() && stderr(&o).contains("already holds an authority"), "{}", stderr(&o));
    std::fs::write(d.p("pem"), b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap();
    ok(&["authority", "issue", "--store", &s, "--attrs", "region=EU", "--out", &d.p("fra.key")]);
    ok(&["authority", "wrap", "--store", &s, "--policy", "region: EU", "--in", &d.p("pem"), "--out", &d.p("env")]);
    assert!(ok(&["authority", "rotate", "--store", &s]).contains("re-sealed 1 policy key(s)"));
    ok(&["machine", "open", "--store", &s, "--key", &d.p("fra.key"), "--in", &d.p("env"), "--out", &d.p("out")]);
    assert_eq!(std::fs::read(d.p("out")).unwrap(), std::fs::read(d.p("pem")).unwrap());
    let status = ok(&["authority", "status", "--store", &s]);
    assert!(status.contains("generation 2: active") && status.contains("envelopes: 1"), "{status}");
    // The objects are in etcd under the prefix, not in a directory.
    assert!(!std::path::Path::new(&s).exists());
    let listed = cluster.store("cli/one").list("envelopes/").unwrap();
    assert_eq!(listed.len(), 1);

    // A malformed name is an input error naming what is wrong.
    let o = run(&["authority", "status", "--store", "etcd://127.0.0.1/cli"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("HOST:PORT"), "{}", stderr(&o));
}
