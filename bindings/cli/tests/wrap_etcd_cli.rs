//! `keyfence authority` / `keyfence machine` with `--store etcd://...`:
//! the same commands on a three-member etcd cluster on loopback.

mod common;
#[path = "../../../core/tests/etcd_support/mod.rs"]
mod etcd_support;

use common::{keyfence as run, ok, skip_unless, stderr, Dir, REQUIRE_ETCD};

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

/// The commands of `docs/wrapping.md`'s "Running on etcd" block, with the
/// block's `$S` and endpoint replaced by this test's cluster.
fn documented_etcd_commands(store: &str, endpoint: &str) -> Vec<Vec<String>> {
    let doc = include_str!("../../../docs/wrapping.md");
    let block = doc.split("A three-member cluster on one machine, and the commands on it:").nth(1).expect("the etcd section");
    let block = block.split("```sh").nth(1).and_then(|b| b.split("```").next()).expect("its sh block");
    block
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("keyfence ") || l.starts_with("etcdctl "))
        .map(|l| {
            let l = l.replace("$S", store).replace("127.0.0.1:20379", endpoint);
            common::shell_words(&l)
        })
        .collect()
}

#[test]
fn the_documented_etcd_commands_work_as_listed() {
    let Some(cluster) = etcd_support::Cluster::start() else { return };
    let d = Dir::new("etcd-documented");
    std::fs::write(d.p("key.pem"), b"-----BEGIN PRIVATE KEY-----\nBBBB\n-----END PRIVATE KEY-----\n").unwrap();
    let store = cluster.name("keyfence/prod");
    let commands = documented_etcd_commands(&store, &cluster.endpoints()[0]);
    assert_eq!(commands.iter().filter(|c| c[0] == "keyfence").count(), 4, "{commands:?}");
    let mut etcdctl_listing = None;
    for c in &commands {
        let (prog, args) = c.split_first().unwrap();
        let prog = if prog == "keyfence" { env!("CARGO_BIN_EXE_keyfence").to_owned() } else { prog.clone() };
        let has = || std::process::Command::new("etcdctl").arg("version").output().is_ok();
        if prog == "etcdctl" && skip_unless(has(), "no etcdctl (etcd-client) on PATH: the listing was not checked", REQUIRE_ETCD) {
            continue;
        }
        let o = std::process::Command::new(&prog).args(args).current_dir(&d.0).output().unwrap();
        assert!(o.status.success(), "{c:?}: {}", String::from_utf8_lossy(&o.stderr));
        if prog == "etcdctl" {
            etcdctl_listing = Some(String::from_utf8_lossy(&o.stdout).into_owned());
        }
    }
    assert_eq!(std::fs::read(d.p("opened.pem")).unwrap(), std::fs::read(d.p("key.pem")).unwrap());
    eprintln!("etcdctl listed: {etcdctl_listing:?}");
    if let Some(listing) = etcdctl_listing {
        for key in ["keyfence/prod/authority/state", "keyfence/prod/public/generations"] {
            assert!(listing.lines().any(|l| l == key), "{key} not in {listing}");
        }
        assert!(listing.contains("keyfence/prod/envelopes/") && listing.contains("keyfence/prod/sealed/"), "{listing}");
    }
}

/// `keyfence bench store` measures the etcd store against the file store
/// in one run, and leaves nothing behind in etcd.
#[test]
fn bench_store_measures_etcd_against_files_and_cleans_up() {
    let Some(cluster) = etcd_support::Cluster::start() else { return };
    let out = ok(&["bench", "store", "--store", &cluster.name("benched"), "--json", "--ops", "20", "--watchers", "5"]);
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 8, "{out}");
    for store in ["file", "etcd"] {
        let l = lines.iter().find(|l| l["store"] == store && l["op"] == "watch_propagation").unwrap_or_else(|| panic!("{store}: {out}"));
        assert_eq!(l["watchers"], 5, "{l}");
        let (p50, p99, max) = (l["p50_ms"].as_f64().unwrap(), l["p99_ms"].as_f64().unwrap(), l["max_ms"].as_f64().unwrap());
        assert!(0.0 <= p50 && p50 <= p99 && p99 <= max && max < 120_000.0, "{l}");
    }
    for store in ["file", "etcd"] {
        for op in ["wrap", "fetch_open_cached"] {
            let l = lines.iter().find(|l| l["store"] == store && l["op"] == op).unwrap_or_else(|| panic!("{store} {op}: {out}"));
            assert!(l["per_s"].as_f64().unwrap() > 0.0, "{l}");
        }
        let size = lines.iter().find(|l| l["store"] == store && l["op"] == "bytes_per_envelope").unwrap();
        // A 1 KiB secret, its tag, the policy and the signature.
        let bytes = size["bytes"].as_u64().unwrap();
        assert!((1024 + 16..4096).contains(&bytes), "{size}");
    }
    // The bench's sub-store is `benched/bench-...`: count every key under
    // `benched/` (base64 of "benched/" and of its range end "benched0").
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(std::time::Duration::from_secs(5))).build().new_agent();
    let url = format!("http://{}/v3/kv/range", cluster.endpoints()[0]);
    let mut r = agent.post(url).send(r#"{"key":"YmVuY2hlZC8=","range_end":"YmVuY2hlZDA=","count_only":true}"#).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&r.body_mut().read_to_vec().unwrap()).unwrap();
    assert!(v.get("count").is_none() || v["count"] == "0", "left behind: {v}");
    assert!(
        v["header"]["revision"].as_str().unwrap().parse::<u64>().unwrap() > 20,
        "the bench committed its 20 wraps to this cluster: {v}"
    );
}

/// Runs `keyfence args` until it succeeds, re-running it after each
/// STORE_CONFLICT (another authority committed first: nothing of this run
/// was written); returns its stdout and how many conflicts it met.
fn until_committed(args: &[&str]) -> (String, usize) {
    for conflicts in 0..50 {
        let o = run(args);
        if o.status.success() {
            return (common::stdout(&o), conflicts);
        }
        let err = stderr(&o);
        assert!(err.contains("changed since it was read"), "{args:?} failed otherwise than by a conflict: {err}");
    }
    panic!("{args:?}: 50 conflicts in a row");
}

/// Two authorities, two processes at a time (the command line), wrap and
/// rotate concurrently on one cluster: a rotation that loses a race is
/// told STORE_CONFLICT and re-runs; afterwards the generations are
/// 1..=N with one active and one per committed rotation (no split
/// generation), the store holds exactly the envelopes handed out (none
/// lost, none extra), and a machine key issued at the end opens each.
#[test]
fn two_authority_processes_wrapping_and_rotating_lose_nothing() {
    let Some(cluster) = etcd_support::Cluster::start() else { return };
    let d = Dir::new("etcd-two-authorities");
    let s = cluster.name("cli/two");
    ok(&["authority", "init", "--store", &s]);
    const ROUNDS: usize = 12;
    // Per process: the (envelope, secret) pairs it handed out, its
    // rotations and its conflicts.
    type Outcome = (Vec<(String, Vec<u8>)>, usize, usize);
    let results: Vec<Outcome> = std::thread::scope(|t| {
        let workers: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|who| {
                let (d, s) = (&d, &s);
                t.spawn(move || {
                    let (mut handed, mut rotations, mut conflicts) = (Vec::new(), 0, 0);
                    for i in 0..ROUNDS {
                        if i % 4 == 3 {
                            conflicts += until_committed(&["authority", "rotate", "--store", s]).1;
                            rotations += 1;
                        } else {
                            let secret = format!("-----BEGIN PRIVATE KEY-----\n{who}{i}\n-----END PRIVATE KEY-----\n");
                            let (inp, out) = (d.p(&format!("{who}{i}.pem")), d.p(&format!("{who}{i}.env")));
                            std::fs::write(&inp, &secret).unwrap();
                            let policy = if i % 2 == 0 { "region: EU" } else { "team: ops" };
                            conflicts +=
                                until_committed(&["authority", "wrap", "--store", s, "--policy", policy, "--in", &inp, "--out", &out]).1;
                            handed.push((out, secret.into_bytes()));
                        }
                    }
                    (handed, rotations, conflicts)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let rotations: usize = results.iter().map(|r| r.1).sum();
    let conflicts: usize = results.iter().map(|r| r.2).sum();
    let handed: Vec<&(String, Vec<u8>)> = results.iter().flat_map(|r| &r.0).collect();

    let status = ok(&["authority", "status", "--store", &s]);
    let active = 1 + rotations;
    assert!(status.contains(&format!("generation {active}: active")), "{status}");
    assert_eq!(status.matches(": active").count(), 1, "{status}");
    assert!(!status.contains(&format!("generation {}:", active + 1)), "{status}");
    for g in 1..=active {
        assert!(status.contains(&format!("generation {g}: ")), "generation {g} missing: {status}");
    }
    assert!(status.contains(&format!("envelopes: {}", handed.len())), "{status}");
    let store = cluster.store("cli/two");
    assert_eq!(store.list("envelopes/").unwrap().len(), handed.len());

    ok(&["authority", "issue", "--store", &s, "--attrs", "region=EU,team=ops", "--out", &d.p("m.key")]);
    for (env, secret) in &handed {
        let out = format!("{env}.out");
        ok(&["machine", "open", "--store", &s, "--key", &d.p("m.key"), "--in", env, "--out", &out]);
        assert_eq!(&std::fs::read(&out).unwrap(), secret, "{env}");
    }
    eprintln!("two authorities: {} wraps, {rotations} rotations, {conflicts} conflicts re-run, lost 0", handed.len());
}

/// `serve --isolated --store etcd://...`: the key process is handed the
/// store name as given (a directory would be made absolute), opens the
/// envelope from etcd, and the server holds the key.
#[test]
fn an_isolated_server_opens_its_key_from_an_etcd_store() {
    use std::io::BufRead;
    let Some(cluster) = etcd_support::Cluster::start() else { return };
    let d = Dir::new("etcd-isolated");
    common::pki(&d, &["sfo1"]);
    let s = cluster.name("cli/isolated");
    ok(&["authority", "init", "--store", &s]);
    ok(&["authority", "issue", "--store", &s, "--attrs", "country=US", "--out", &d.p("sfo1.machine")]);
    common::openssl(&d, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "key.pem"]);
    ok(&["authority", "wrap", "--store", &s, "--policy", "country: US", "--in", &d.p("key.pem"), "--out", &d.p("key.env")]);
    let log = std::fs::File::create(d.0.join("serve.log")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_keyfence"))
        .args(["serve", "--isolated", "--listen", "127.0.0.1:0", "--name", "sfo1", "--seconds", "60", "--threads", "1"])
        .args(["--cert", &d.p("sfo1.pem"), "--key", &d.p("sfo1.key"), "--ca", &d.p("ca.pem")])
        .args(["--store", &s, "--machine-key", &d.p("sfo1.machine"), "--envelopes", &d.p("key.env")])
        .current_dir(&d.0)
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(d.0.join("serve.log")).unwrap();
    assert!(line.starts_with("listening "), "the server said {line:?}; log: {log}");
    assert!(log.contains("holding"), "the server does not hold the key: {log}");
}
