//! `keyfence authority` / `keyfence machine` end to end, and a crash test:
//! rotations killed at random moments lose nothing.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{keyfence as run, ok, Dir};
use keyfence::wrap::{Authority, CacheConfig, FileStore, GenerationState, Machine, Store};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_keyfence"))
}

#[test]
fn authority_and_machine_commands() {
    let d = Dir::new("cmds");
    let s = d.p("store");
    assert!(ok(&["authority", "init", "--store", &s]).contains("generation 1"));
    assert!(!run(&["authority", "init", "--store", &s]).status.success(), "init twice");
    std::fs::write(d.p("pem"), b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap();
    ok(&["authority", "issue", "--store", &s, "--attrs", "region=EU,country=DE", "--out", &d.p("fra.key")]);
    ok(&["authority", "issue", "--store", &s, "--attrs", "region=NA,country=US", "--out", &d.p("iad.key")]);
    ok(&["authority", "wrap", "--store", &s, "--policy", "region: EU", "--in", &d.p("pem"), "--out", &d.p("env")]);

    assert!(ok(&["machine", "could-open", "--store", &s, "--key", &d.p("fra.key"), "--in", &d.p("env")]).starts_with("yes"));
    let o = run(&["machine", "could-open", "--store", &s, "--key", &d.p("iad.key"), "--in", &d.p("env")]);
    assert_eq!(o.status.code(), Some(1));

    ok(&["machine", "open", "--store", &s, "--key", &d.p("fra.key"), "--in", &d.p("env"), "--out", &d.p("out")]);
    assert_eq!(std::fs::read(d.p("out")).unwrap(), std::fs::read(d.p("pem")).unwrap());
    let o = run(&["machine", "open", "--store", &s, "--key", &d.p("iad.key"), "--in", &d.p("env"), "--out", &d.p("out2")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("do not satisfy the policy `region: EU`"));

    let envelope_before = std::fs::read(d.p("env")).unwrap();
    assert!(ok(&["authority", "rotate", "--store", &s]).contains("re-sealed 1 policy key(s)"));
    assert_eq!(std::fs::read(d.p("env")).unwrap(), envelope_before);
    ok(&["machine", "open", "--store", &s, "--key", &d.p("fra.key"), "--in", &d.p("env"), "--out", &d.p("out3")]);
    let status = ok(&["authority", "status", "--store", &s]);
    assert!(status.contains("generation 1: decrypt-only") && status.contains("generation 2: active"), "{status}");
    assert!(status.contains("envelopes: 1"), "{status}");

    let o = run(&["authority", "wrap", "--store", &s, "--policy", "region: EU)", "--in", &d.p("pem"), "--out", &d.p("e2")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains('^'));
    let o = run(&["authority", "status", "--store", &d.p("nothing-here")]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no authority in this store"));
}

#[test]
fn rotations_killed_midway_lose_nothing() {
    let d = Dir::new("crash");
    let store: Arc<dyn Store> = Arc::new(FileStore::open(d.p("store")).unwrap());
    let mut a = Authority::init(store.clone()).unwrap();
    let secrets: Vec<(String, Vec<u8>)> = (0..40)
        .map(|i| {
            let policy = format!("region: r{} or tier: t{i}", i % 3);
            let env = a.wrap(&policy, format!("secret {i}").as_bytes()).unwrap();
            (format!("secret {i}"), env.to_bytes().to_vec())
        })
        .collect();
    drop(a);

    let mut killed = 0;
    for round in 0..5u64 {
        let started = Instant::now();
        let mut child = bin().args(["authority", "rotate", "--store", &d.p("store")]).spawn().unwrap();
        // Kill at a different moment each round, from almost at once to
        // well into the re-sealing.
        let nanos = u64::from(started.elapsed().subsec_nanos()) + round * 97;
        std::thread::sleep(Duration::from_millis(30 + nanos % 250 + round * 60));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            killed += 1;
        }
        let _ = child.wait();

        // Reopen: consistent state, and every secret still opens.
        let a = Authority::open(store.clone()).unwrap();
        let st = a.status().unwrap();
        assert_eq!(st.generations.iter().filter(|(_, s)| *s == GenerationState::Active).count(), 1);
        assert_eq!(st.envelopes, 40);
        // A sealed copy of every policy key for every live generation.
        // Opening only reads, so an interrupted rotation's extra copies
        // stay until the next rotation deletes them under the lock.
        let live = st.generations.iter().filter(|(_, s)| s.is_live()).count();
        assert!(store.list("sealed/").unwrap().len() >= 40 * live, "round {round}");
        let m = Machine::new(a.issue(&"region=r0,tier=t1".parse().unwrap()).unwrap(), store.clone(), CacheConfig::default());
        for (i, (want, env)) in secrets.iter().enumerate() {
            if i % 3 == 0 || i == 1 {
                assert_eq!(&m.open(env).unwrap()[..], want.as_bytes(), "round {round}, secret {i}");
            }
        }
    }
    assert!(killed >= 1, "no rotation was interrupted; the test proved nothing");
    let mut a = Authority::open(store.clone()).unwrap();
    assert_eq!(a.rotate_master().unwrap().resealed, 40);
    // The rotation cleaned up: exactly one copy per policy key per live
    // generation is left.
    let live = a.status().unwrap().generations.iter().filter(|(_, s)| s.is_live()).count();
    assert_eq!(store.list("sealed/").unwrap().len(), 40 * live);
}

/// Several processes write and read one store at once, hundreds of
/// operations in all: wraps (new and existing policies), issues, status
/// and master rotations. Before the writer lock, a `status` or a second
/// writer working from an older state deleted a new policy key's sealed
/// copies and wrote the stale state back, and envelopes just handed out
/// could never be opened. Every envelope any process was given must open.
#[test]
fn concurrent_processes_on_one_store_lose_no_key() {
    let d = Dir::new("concurrent");
    let s = d.p("store");
    ok(&["authority", "init", "--store", &s]);
    const POLICIES: [&str; 4] = ["a: x", "b: y", "a: x and b: y", "a: x or c: z"];
    const WORKERS: usize = 6;
    const ROUNDS: usize = 36;
    let handed_out: Vec<(String, Vec<u8>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (d, s) = (&d, &s);
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..ROUNDS {
                        match (w + i) % 6 {
                            0..=2 => {
                                let secret = format!("secret {w}-{i}").into_bytes();
                                let (input, env) = (d.p(&format!("in-{w}-{i}")), d.p(&format!("env-{w}-{i}")));
                                std::fs::write(&input, &secret).unwrap();
                                let policy = POLICIES[(w * 7 + i) % POLICIES.len()];
                                let o = run(&["authority", "wrap", "--store", s, "--policy", policy, "--in", &input, "--out", &env]);
                                assert!(o.status.success(), "wrap: {}", String::from_utf8_lossy(&o.stderr));
                                mine.push((env, secret));
                            }
                            3 => {
                                let o = run(&["authority", "status", "--store", s]);
                                assert!(o.status.success(), "status: {}", String::from_utf8_lossy(&o.stderr));
                            }
                            4 => {
                                let key = d.p(&format!("m-{w}-{i}"));
                                let o = run(&["authority", "issue", "--store", s, "--attrs", "a=x,b=y", "--out", &key]);
                                assert!(o.status.success(), "issue: {}", String::from_utf8_lossy(&o.stderr));
                            }
                            _ => {
                                // Forced: issues in between leave machines a
                                // second rotation strands, and this test is
                                // about writers at once, not about them.
                                let o = run(&["authority", "rotate", "--store", s, "--force"]);
                                assert!(o.status.success(), "rotate: {}", String::from_utf8_lossy(&o.stderr));
                            }
                        }
                    }
                    mine
                })
            })
            .collect();
        workers.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(handed_out.len() >= 100, "{} envelopes", handed_out.len());

    let key = d.p("final.machine");
    ok(&["authority", "issue", "--store", &s, "--attrs", "a=x,b=y,c=z", "--out", &key]);
    let store: Arc<dyn Store> = Arc::new(FileStore::open(&s).unwrap());
    let machine =
        Machine::new(keyfence::wrap::MachineKey::from_bytes(&std::fs::read(&key).unwrap()).unwrap(), store.clone(), CacheConfig::default());
    for (env, secret) in &handed_out {
        let opened = machine.open(&std::fs::read(env).unwrap()).unwrap_or_else(|e| panic!("{env}: {e}"));
        assert_eq!(&opened[..], &secret[..], "{env}");
    }
    // One policy key per policy, sealed exactly once per live generation.
    let a = Authority::open(store.clone()).unwrap();
    let status = a.status().unwrap();
    assert_eq!(status.policies, POLICIES.len());
    let live = status.generations.iter().filter(|(_, g)| *g != GenerationState::Retired).count();
    assert_eq!(store.list("sealed/").unwrap().len(), POLICIES.len() * live, "stray or missing sealed copies");
}

/// The `keyfence` commands of the `sh` block of `docs/wrapping.md` after
/// "From the command line:", as argument lists with the exit status each
/// expects (`# exit N`, else 0): other comments dropped, `'...'` quoting
/// honoured, the other programs of the block (`openssl`, `cmp`) left to
/// the docs runner (`docs/run_blocks.py`), which runs the block whole.
fn documented_commands() -> Vec<(Vec<String>, i32)> {
    let doc = include_str!("../../../docs/wrapping.md");
    let block = doc.split("From the command line:").nth(1).expect("the command-line section");
    let block = block.split("```sh").nth(1).and_then(|b| b.split("```").next()).expect("its sh block");
    block
        .lines()
        .skip(1)
        .map(|l| {
            let (cmd, comment) = l.split_once(" #").unwrap_or((l, ""));
            let exit = comment.trim().strip_prefix("exit ").and_then(|c| c.parse().ok()).unwrap_or(0);
            (cmd.trim(), exit)
        })
        .filter(|(l, _)| l.starts_with("keyfence "))
        .map(|(l, exit)| {
            let mut args = common::shell_words(l);
            args.remove(0);
            (args, exit)
        })
        .collect()
}

/// Issue 19: `docs/wrapping.md`'s command sequence failed as listed: after
/// `rotate-policy`, the envelope written by `wrap --out` no longer opened
/// although `could-open` said yes. Runs the block as written (DIR and the
/// file names in a scratch directory), then checks that after
/// `retire-policy-key` could-open and open agree on "no".
#[test]
fn the_documented_sequence_works_as_listed() {
    let d = Dir::new("documented");
    let pem = b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n";
    std::fs::write(d.p("key.pem"), pem).unwrap();
    let commands = documented_commands();
    let names: Vec<String> = commands.iter().map(|(c, _)| c[..2].join(" ")).collect();
    assert!(names.contains(&"authority rotate-policy".to_string()) && names.contains(&"machine could-open".to_string()), "{names:?}");
    let mut said_yes = false;
    for (args, exit) in &commands {
        let args: Vec<String> = args
            .iter()
            .map(|a| match a.as_str() {
                "store" => d.p("store"),
                f if f.contains('.') && !f.contains(' ') && !f.contains('=') => d.p(f),
                _ => a.clone(),
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = run(&args);
        assert_eq!(o.status.code(), Some(*exit), "{args:?}: {}{}", common::stdout(&o), common::stderr(&o));
        let out = common::stdout(&o);
        if args[..2] == ["machine", "could-open"] && *exit == 0 {
            assert!(out.starts_with("yes"), "{out}");
            said_yes = true;
        }
        if args[..2] == ["machine", "open"] {
            let out = args.iter().position(|a| *a == "--out").map(|i| args[i + 1]).expect("open --out");
            assert_eq!(std::fs::read(out).unwrap(), pem, "opened after the policy-key rotation");
        }
    }
    assert!(said_yes);
    let (s, key, env) = (d.p("store"), d.p("fra1.machine"), d.p("key.env"));
    if names.last().map(String::as_str) == Some("authority retire-policy-key") {
        let o = run(&["machine", "could-open", "--store", &s, "--key", &key, "--in", &env]);
        assert_eq!(o.status.code(), Some(1), "{}", common::stdout(&o));
        assert!(common::stdout(&o).contains("unknown policy key"), "{}", common::stdout(&o));
        let o = run(&["machine", "open", "--store", &s, "--key", &key, "--in", &env, "--out", &d.p("again.pem")]);
        assert_eq!(o.status.code(), Some(1), "{}", common::stderr(&o));
    }
}

/// `rotate-policy` reports a malformed envelope in the store and carries on.
#[test]
fn policy_rotation_reports_and_skips_a_bad_envelope() {
    let d = Dir::new("rotate-skip");
    let s = d.p("store");
    ok(&["authority", "init", "--store", &s]);
    std::fs::write(d.p("in"), b"secret").unwrap();
    ok(&["authority", "wrap", "--store", &s, "--policy", "a: b", "--in", &d.p("in"), "--out", &d.p("env")]);
    std::fs::write(d.0.join("store/envelopes/0123456789abcdef0123456789abcdef"), b"junk").unwrap();
    let o = run(&["authority", "rotate-policy", "--store", &s, "--policy", "a: b"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(common::stdout(&o).contains("re-wrapped 1 envelope(s); skipped 1"), "{}", common::stdout(&o));
    assert!(common::stderr(&o).contains("skipped envelopes/0123456789abcdef0123456789abcdef: not an envelope"), "{}", common::stderr(&o));
    let r = ok(&["authority", "retire-policy-key", "--store", &s, "--policy", "a: b"]);
    assert!(r.contains("retired version(s) [1]"), "{r}");
}

/// `machine info --json` names the id the authority gave; `authority
/// revoke --machine ID` leaves that machine unable to open the store's
/// envelopes (exit 1, MACHINE_REVOKED) while another machine with the
/// same attributes opens them; the id cannot be issued again.
#[test]
fn a_revoked_machine_is_refused_from_the_command_line() {
    let d = Dir::new("revoke");
    let s = d.p("store");
    ok(&["authority", "init", "--store", &s]);
    std::fs::write(d.p("pem"), b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap();
    let issued = ok(&["authority", "issue", "--store", &s, "--attrs", "region=EU,country=DE", "--out", &d.p("fra1.key")]);
    ok(&["authority", "issue", "--store", &s, "--attrs", "region=EU,country=DE", "--out", &d.p("fra2.key")]);
    ok(&["authority", "wrap", "--store", &s, "--policy", "region: EU", "--in", &d.p("pem"), "--out", &d.p("env")]);

    let info: serde_json::Value = serde_json::from_str(&ok(&["machine", "info", "--key", &d.p("fra1.key"), "--json"])).unwrap();
    let id = info["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 32, "{info}");
    assert!(issued.contains(&id), "{issued}");
    assert_eq!(info["attributes"]["region"], "EU");
    assert_eq!(info["attributes"]["machine"], id.as_str());
    assert_eq!(info["generations"], serde_json::json!([1]));
    let other: serde_json::Value = serde_json::from_str(&ok(&["machine", "info", "--key", &d.p("fra2.key"), "--json"])).unwrap();
    assert_ne!(other["id"], info["id"]);

    let out = ok(&["authority", "revoke", "--store", &s, "--machine", &id]);
    assert!(out.contains("1 policy key(s) replaced; re-wrapped 1 envelope(s); retired 1"), "{out}");
    // The store's copy was re-wrapped; the one handed out with --out is
    // sealed to the retired version.
    let served = std::fs::read_dir(d.p("store/envelopes")).unwrap().next().unwrap().unwrap().path();
    let served = served.to_str().unwrap();
    let o = run(&["machine", "open", "--store", &s, "--key", &d.p("fra1.key"), "--in", served, "--out", &d.p("x")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("machine {id} is revoked")), "{o:?}");
    ok(&["machine", "open", "--store", &s, "--key", &d.p("fra2.key"), "--in", served, "--out", &d.p("y")]);
    assert_eq!(std::fs::read(d.p("y")).unwrap(), std::fs::read(d.p("pem")).unwrap());
    let o = run(&["machine", "could-open", "--store", &s, "--key", &d.p("fra2.key"), "--in", &d.p("env")]);
    assert_eq!(o.status.code(), Some(1), "the copy handed out before is on a retired version");

    let o = run(&["authority", "issue", "--store", &s, "--attrs", &format!("region=EU,machine={id}"), "--out", &d.p("again.key")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is revoked"), "{o:?}");
    assert!(ok(&["authority", "revoke", "--store", &s, "--machine", &id]).contains("already revoked"));
    assert!(ok(&["authority", "status", "--store", &s]).contains("revoked machines: 1"));
    let o = run(&["authority", "revoke", "--store", &s, "--machine", "no-such id"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}

/// Issue 44.6: each `machine open` is a fresh process, and a store writer
/// puts back the generation list from before two rotations. The key's
/// `.newest` file, written by the run before, makes the next run refuse
/// it; a copy of the key elsewhere, with no floor, takes the old list.
#[test]
fn a_rolled_back_generation_list_is_refused_by_the_next_run() {
    let d = Dir::new("newest");
    let s = d.p("store");
    ok(&["authority", "init", "--store", &s]);
    std::fs::write(d.p("pem"), b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap();
    let old = std::fs::read(d.p("store/public/generations")).unwrap();
    ok(&["authority", "rotate", "--store", &s]);
    ok(&["authority", "rotate", "--store", &s]);
    ok(&["authority", "issue", "--store", &s, "--attrs", "region=EU", "--out", &d.p("fra.key")]);
    std::fs::copy(d.p("fra.key"), d.p("copy.key")).unwrap();
    ok(&["authority", "wrap", "--store", &s, "--policy", "region: EU", "--in", &d.p("pem"), "--out", &d.p("env")]);
    ok(&["machine", "open", "--store", &s, "--key", &d.p("fra.key"), "--in", &d.p("env"), "--out", &d.p("out")]);
    assert!(std::path::Path::new(&d.p("fra.key.newest")).is_file(), "the run keeps the lists it accepted");

    std::fs::write(d.p("store/public/generations"), &old).unwrap();
    let o = run(&["machine", "open", "--store", &s, "--key", &d.p("fra.key"), "--in", &d.p("env"), "--out", &d.p("out2")]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("rolled back or replayed"), "{o:?}");
    let o = run(&["machine", "open", "--store", &s, "--key", &d.p("copy.key"), "--in", &d.p("env"), "--out", &d.p("out3")]);
    assert!(!String::from_utf8_lossy(&o.stderr).contains("replayed"), "without a floor the old list is taken: {o:?}");
}

/// `bench fleet` at a tiny size: every phase reports what it measured,
/// the revocation re-keyed every policy and re-wrapped every envelope,
/// and the propagation to each data center's cache was measured.
#[test]
fn the_fleet_benchmark_runs_every_phase() {
    let out = ok(&["bench", "fleet", "--json", "--dcs", "3", "--machines", "2", "--envelopes", "40"]);
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let phases: Vec<&str> = lines.iter().map(|l| l["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["issue", "wrap", "storage", "dc_share", "rotate_master", "rotate_policy_key", "revoke", "revoke_alone"], "{out}");
    let get = |phase: &str, key: &str| lines.iter().find(|l| l["phase"] == phase).unwrap()[key].clone();
    assert_eq!(get("issue", "keys"), 6);
    assert_eq!((get("revoke", "rekeyed"), get("revoke", "rewrapped")), (20.into(), 40.into()), "{out}");
    assert_eq!(get("rotate_policy_key", "rewrapped"), 2);
    assert_eq!(get("revoke_alone", "rewrapped"), 40, "{out}");
    assert!(get("storage", "storage_bytes").as_u64().unwrap() > 40 * 300, "{out}");
    assert!(get("storage", "per_dc_wrapping_bytes").as_u64().unwrap() > 0, "{out}");
    for phase in ["rotate_master", "rotate_policy_key", "revoke"] {
        let (p50, p99) = (get(phase, "propagation_p50_ms").as_f64().unwrap(), get(phase, "propagation_p99_ms").as_f64().unwrap());
        assert!(0.0 <= p50 && p50 <= p99 && p99 < 300_000.0, "{phase}: {out}");
    }
    assert!(get("dc_share", "dc_cache_entries").as_u64().unwrap() >= 1, "{out}");
}
