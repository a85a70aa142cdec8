//! `keyfence agent` as an operator runs it: started by hand or by systemd's
//! socket activation, signing for `keyfence sign --agent` and for the key
//! files `provider-key --agent` writes; and the systemd units it ships
//! with, checked by systemd's own verifier.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{is_root, ok, openssl, skip_unless, stderr, Dir, REQUIRE_ROOT};

/// A store, a machine key (country=US) and a P-256 key wrapped under
/// `country: US`, in `d`.
fn world(d: &Dir) {
    ok(&["authority", "init", "--store", &d.p("store")]);
    ok(&["authority", "issue", "--store", &d.p("store"), "--attrs", "country=US", "--out", &d.p("us.machine")]);
    openssl(d, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ec.pem"]);
    openssl(d, &["pkey", "-in", "ec.pem", "-pubout", "-out", "ec.pub"]);
    ok(&["authority", "wrap", "--store", &d.p("store"), "--policy", "country: US", "--in", &d.p("ec.pem"), "--out", &d.p("ec.env")]);
    // The agent reads a servers' copy, as deploy.md has it.
    ok(&["authority", "export", "--store", &d.p("store"), "--to", &d.p("served")]);
}

/// Kills the child when dropped, whatever happens to the test.
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (at most 20 s) for `child` to print a line starting `listening`.
fn wait_listening(child: &mut Child) {
    let out = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.starts_with("listening") {
                let _ = tx.send(());
            }
        }
    });
    assert!(rx.recv_timeout(Duration::from_secs(20)).is_ok(), "the agent did not start");
}

/// `keyfence sign --agent SOCKET` of `msg` with the envelope `ec.env`
/// (ECDSA P-256), the signature to `out`.
fn agent_sign(d: &Dir, socket: &Path, out: &str) -> std::process::Output {
    common::keyfence(&[
        "sign",
        "--agent",
        socket.to_str().unwrap(),
        "--envelope",
        &d.p("ec.env"),
        "--alg",
        "ecdsa-p256-sha256",
        "--in",
        &d.p("msg"),
        "--out",
        &d.p(out),
    ])
}

/// `keyfence sign --agent SOCKET` of `msg`, verified with `openssl`.
fn signs_through(d: &Dir, socket: &Path) {
    std::fs::write(d.0.join("msg"), b"signed by the agent").unwrap();
    let o = agent_sign(d, socket, "msg.sig");
    assert!(o.status.success(), "{}", stderr(&o));
    openssl(d, &["dgst", "-sha256", "-verify", "ec.pub", "-signature", "msg.sig", "msg"]);
}

fn agent_args<'a>(d: &'a Dir, socket: &'a str) -> Vec<String> {
    ["agent", "--socket", socket, "--store", &d.p("served"), "--machine-key", &d.p("us.machine")].iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_agent_signs_for_sign_and_for_the_key_files_it_backs() {
    let d = Dir::new("agent-cli");
    world(&d);
    let socket = d.0.join("agent.sock");
    let mut agent = Killed(
        Command::new(env!("CARGO_BIN_EXE_keyfence")).args(agent_args(&d, socket.to_str().unwrap())).stdout(Stdio::piped()).spawn().unwrap(),
    );
    wait_listening(&mut agent.0);
    signs_through(&d, &socket);
    // The key file names the socket and nothing that opens keys.
    ok(&["provider-key", "--agent", socket.to_str().unwrap(), "--envelope", &d.p("ec.env"), "--out", &d.p("ec.kfk")]);
    let text = std::fs::read_to_string(d.0.join("ec.kfk")).unwrap();
    assert!(text.starts_with("-----BEGIN KEYFENCE KEY-----"), "{text}");
    // An envelope the agent's machine may not open: its reason.
    ok(&["authority", "wrap", "--store", &d.p("store"), "--policy", "country: FR", "--in", &d.p("ec.pem"), "--out", &d.p("fr.env")]);
    ok(&["authority", "export", "--store", &d.p("store"), "--to", &d.p("served")]);
    let o = common::keyfence(&["provider-key", "--agent", socket.to_str().unwrap(), "--envelope", &d.p("fr.env"), "--out", &d.p("fr.kfk")]);
    // A "no" (exit 1), as `machine open` says it, and in the agent's words.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("do not satisfy") && !stderr(&o).contains("key process"), "{}", stderr(&o));
    assert!(!d.0.join("fr.kfk").exists());
    // No agent there: a clear error, at once.
    let start = Instant::now();
    let o = agent_sign(&d, &d.0.join("nobody.sock"), "x.sig");
    assert!(!o.status.success() && stderr(&o).contains("cannot connect to the agent"), "{}", stderr(&o));
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn systemd_socket_activation_hands_the_agent_its_socket() {
    // systemd's own tool, which ./x installs (Debian's systemd).
    assert!(Command::new("systemd-socket-activate").arg("--help").output().is_ok(), "no systemd-socket-activate (apt-get install systemd)");
    let d = Dir::new("agent-activation");
    world(&d);
    let socket = d.0.join("activated.sock");
    // systemd-socket-activate listens, then starts the agent with the
    // socket at descriptor 3 (LISTEN_FDS) when the first client comes.
    let mut args = vec!["-l".to_string(), socket.to_str().unwrap().to_string(), env!("CARGO_BIN_EXE_keyfence").to_string()];
    args.extend(agent_args(&d, socket.to_str().unwrap()));
    let _activator = Killed(Command::new("systemd-socket-activate").args(&args).stdout(Stdio::null()).spawn().unwrap());
    let until = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(Instant::now() < until, "systemd-socket-activate made no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    signs_through(&d, &socket);
    signs_through(&d, &socket);
}

/// The shipped units, as systemd reads them: `systemd-analyze verify`
/// passes (with `/usr/bin/keyfence` pointed at this build), and fails on a
/// unit spoiled on purpose, so the check can fail.
#[test]
fn the_systemd_units_verify() {
    assert!(Command::new("systemd-analyze").arg("--version").output().is_ok(), "no systemd-analyze (apt-get install systemd)");
    let d = Dir::new("agent-units");
    let units = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("systemd");
    let names = ["keyfence-agent.socket", "keyfence-agent.service", "keyfence-serve.service"];
    for name in names {
        let text = std::fs::read_to_string(units.join(name)).unwrap();
        std::fs::write(d.0.join(name), text.replace("/usr/bin/keyfence", env!("CARGO_BIN_EXE_keyfence"))).unwrap();
    }
    let verify = |files: &[&str]| Command::new("systemd-analyze").arg("verify").args(files.iter().map(|n| d.0.join(n))).output().unwrap();
    let o = verify(&names);
    assert!(o.status.success() && o.stderr.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
    let spoiled = std::fs::read_to_string(d.0.join(names[1])).unwrap().replace("ProtectSystem=strict", "ProtectSystem=sometimes");
    std::fs::write(d.0.join("spoiled.service"), spoiled).unwrap();
    let o = verify(&["spoiled.service"]);
    assert!(!o.stderr.is_empty(), "systemd-analyze verify did not see a spoiled unit");
    // The system user the units name.
    let users = std::fs::read_to_string(units.join("sysusers.d/keyfence.conf")).unwrap();
    assert!(users.lines().any(|l| l.starts_with("u keyfence ")), "{users}");
}

/// `chown -R USER PATH`.
fn chown(path: &Path, user: &str) {
    let o = Command::new("chown").args(["-R", user]).arg(path).output().unwrap();
    assert!(o.status.success(), "chown {}: {}", path.display(), String::from_utf8_lossy(&o.stderr));
}

/// Issue 55.2: the agent keeps its machine's floor in its own state
/// folder, and says so when it cannot. As deploy.md lays a server out: the
/// machine key in a root-owned folder of mode 755 (the agent may read the
/// key, not write beside it), the agent running as its own user (here
/// `nobody`). Without a state folder it refuses to start; with one it
/// keeps the lists there (lock 600), and a restarted agent refuses the
/// store rolled back; a state folder that becomes unwritable fails the
/// next update loudly instead of skipping it.
#[test]
fn the_agent_keeps_its_floor_in_its_state_folder_and_says_when_it_cannot() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    if skip_unless(is_root(), "running the agent as nobody needs root", REQUIRE_ROOT) {
        return;
    }
    assert!(Command::new("id").arg("nobody").output().is_ok_and(|o| o.status.success()), "no user nobody");
    let d = Dir::new("agent-state");
    let s = d.p("store");
    ok(&["authority", "init", "--store", &s]);
    let old = std::fs::read(d.p("store/public/generations")).unwrap();
    ok(&["authority", "rotate", "--store", &s]);
    ok(&["authority", "issue", "--store", &s, "--attrs", "country=US", "--out", &d.p("us.machine")]);
    openssl(&d, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ec.pem"]);
    openssl(&d, &["pkey", "-in", "ec.pem", "-pubout", "-out", "ec.pub"]);
    ok(&["authority", "wrap", "--store", &s, "--policy", "country: US", "--in", &d.p("ec.pem"), "--out", &d.p("ec.env")]);
    // The agent reads the servers' copy; the authority's store stays root's.
    let served = d.p("served");
    ok(&["authority", "export", "--store", &s, "--to", &served]);
    std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let etc = d.0.join("etc");
    std::fs::create_dir(&etc).unwrap();
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy(d.p("us.machine"), etc.join("machine.key")).unwrap();
    chown(&etc.join("machine.key"), "nobody");
    chown(&d.0.join("served"), "nobody");
    for dir in ["run", "state"] {
        std::fs::create_dir(d.0.join(dir)).unwrap();
        chown(&d.0.join(dir), "nobody");
    }
    std::fs::set_permissions(d.0.join("state"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = d.0.join("run/agent.sock");
    let agent = |state: bool| {
        let mut args = vec![
            "agent".to_string(),
            "--socket".into(),
            socket.to_str().unwrap().into(),
            "--store".into(),
            served.clone(),
            "--machine-key".into(),
            etc.join("machine.key").to_str().unwrap().into(),
        ];
        if state {
            args.extend(["--state-dir".to_string(), d.p("state")]);
        }
        let mut c = Command::new(env!("CARGO_BIN_EXE_keyfence"));
        c.args(args).uid(65534).gid(65534).env_remove("STATE_DIRECTORY").stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };

    // No state folder, and none beside the key it may write: no start.
    let o = agent(false).output().unwrap();
    assert!(!o.status.success(), "the agent started without a place for its floor");
    let err = stderr(&o);
    assert!(err.contains("--state-dir") && err.contains("machine.key.newest"), "{err}");

    // With one: it keeps the lists there, the lock its own and 600.
    let mut running = Killed(agent(true).spawn().unwrap());
    wait_listening(&mut running.0);
    signs_through(&d, &socket);
    let floor = d.0.join("state/machine.newest");
    assert!(floor.is_file(), "the floor is in the state folder");
    let lock = std::fs::metadata(d.0.join("state/machine.newest.lock")).unwrap();
    assert_eq!((lock.mode() & 0o777, lock.uid()), (0o600, 65534));
    drop(running);

    // The store rolled back: a restarted agent refuses it.
    let newest = std::fs::read(d.p("served/public/generations")).unwrap();
    std::fs::write(d.p("served/public/generations"), &old).unwrap();
    let mut running = Killed(agent(true).spawn().unwrap());
    wait_listening(&mut running.0);
    std::fs::write(d.0.join("msg"), b"m").unwrap();
    let o = agent_sign(&d, &socket, "msg.sig");
    assert!(!o.status.success() && stderr(&o).contains("rolled back or replayed"), "{}", stderr(&o));
    drop(running);

    // A newer list the agent cannot write down: the load fails, saying so.
    // (The agent's watch reads the store's lists too, and raises its
    // floor as a load does: the newer list comes only once the floor
    // cannot be written, so that neither can have recorded it.)
    std::fs::write(d.p("served/public/generations"), &newest).unwrap();
    let mut running = Killed(agent(true).spawn().unwrap());
    wait_listening(&mut running.0);
    std::fs::set_permissions(d.0.join("state"), std::fs::Permissions::from_mode(0o500)).unwrap();
    std::fs::remove_file(d.0.join("state/machine.newest.lock")).unwrap();
    ok(&["authority", "rotate", "--store", &s]);
    ok(&["authority", "export", "--store", &s, "--to", &served]);
    chown(&d.0.join("served"), "nobody");
    let o = agent_sign(&d, &socket, "msg.sig");
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("the newest lists cannot be kept there") && err.contains("machine.newest"), "{err}");
}

/// Issue 52.1: under systemd the listener is PID 1, not the agent, and
/// every client was refused (`the hello came from pid 1776, not the
/// process started`). Here a Python process plays PID 1's part: it makes
/// and listens on the socket, and starts the agent with it at descriptor
/// 3 (`LISTEN_PID` naming the agent, `LISTEN_FDS=1`) while it keeps its
/// own copy, as systemd does; `systemd-socket-activate` (above) execs the
/// agent in the listening process and so never showed the fault.
#[test]
fn an_agent_whose_socket_another_process_listens_on_serves_its_clients() {
    let d = Dir::new("agent-pid1");
    world(&d);
    let socket = d.0.join("pid1.sock");
    let script = r#"
import os, socket, subprocess, sys, time
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
os.chmod(path, 0o660)
s.listen(64)
os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
agent = subprocess.Popen(
    ["sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"', "sh"] + sys.argv[2:],
    pass_fds=[3], stdout=sys.stdout)
print("agent", agent.pid, flush=True)
agent.wait()
"#;
    let mut args =
        vec!["-c".to_string(), script.to_string(), socket.to_str().unwrap().to_string(), env!("CARGO_BIN_EXE_keyfence").to_string()];
    args.extend(agent_args(&d, socket.to_str().unwrap()));
    args.extend(["--seconds".to_string(), "60".to_string()]);
    let mut pid1 = Killed(Command::new("python3").args(&args).stdout(Stdio::piped()).spawn().unwrap());
    // The agent is killed by its own pid, whatever happens (killing its
    // parent would leave it running).
    let mut lines = BufReader::new(pid1.0.stdout.take().unwrap()).lines().map_while(Result::ok);
    let agent_pid: u32 = lines.next().and_then(|l| l.strip_prefix("agent ")?.parse().ok()).expect("the agent's pid");
    struct KillPid(u32);
    impl Drop for KillPid {
        fn drop(&mut self) {
            let _ = Command::new("kill").args(["-9", &self.0.to_string()]).status();
        }
    }
    let _agent = KillPid(agent_pid);
    assert!(lines.next().is_some_and(|l| l.starts_with("listening")), "the agent did not start");
    // What it signs with, where the journal keeps it whatever the log level.
    let signing = lines.next().unwrap_or_default();
    assert!(signing.starts_with("signing in software: ") || signing.starts_with("signing RSA and ECDSA on crypto_mb"), "{signing}");
    std::thread::spawn(move || lines.for_each(drop));
    signs_through(&d, &socket);
    signs_through(&d, &socket);
    // And the units' way: the key file the provider reads names the socket.
    ok(&["provider-key", "--agent", socket.to_str().unwrap(), "--envelope", &d.p("ec.env"), "--out", &d.p("ec.kfk")]);
}

/// Issue 52.3: descriptors. Started with a soft limit of 64 (a unit
/// without `LimitNOFILE=` gives 1,024) and a hard one of 4096, the agent
/// raises its soft limit and serves 200 connections at once; held to 64
/// by its hard limit too, it says at warning level that it cannot accept,
/// once rather than per connection, and serves again when descriptors
/// free up (before, a connection was dropped in silence).
#[test]
fn the_agent_raises_its_descriptor_limit_and_says_when_it_runs_out() {
    // util-linux's, on every Debian system.
    assert!(Command::new("prlimit").arg("--version").output().is_ok(), "no prlimit (apt-get install util-linux)");
    let d = Dir::new("agent-fds");
    world(&d);
    let socket = d.0.join("fds.sock");
    let hold = |n: usize| {
        let script = "import socket, sys, time\nheld = []\nfor _ in range(int(sys.argv[2])):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect(sys.argv[1])\n    held.append(s)\nprint('held', len(held), flush=True)\ntime.sleep(60)\n";
        let mut c =
            Command::new("python3").args(["-c", script, socket.to_str().unwrap(), &n.to_string()]).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("held"), "{line}");
        Killed(c)
    };
    let agent = |limit: &str| {
        let mut args = vec!["--nofile=".to_string() + limit, env!("CARGO_BIN_EXE_keyfence").to_string()];
        args.extend(agent_args(&d, socket.to_str().unwrap()));
        args.extend(["--log".to_string(), "info".to_string()]);
        let err = std::fs::File::create(d.0.join(format!("agent-{limit}.err"))).unwrap();
        let mut a = Killed(Command::new("prlimit").args(&args).stdout(Stdio::piped()).stderr(err).spawn().unwrap());
        wait_listening(&mut a.0);
        a
    };

    let running = agent("64:4096");
    let log = std::fs::read_to_string(d.0.join("agent-64:4096.err")).unwrap();
    assert!(log.contains("descriptor_limit=4096"), "{log}");
    let holder = hold(200);
    signs_through(&d, &socket);
    drop((holder, running));

    let running = agent("64:64");
    let holder = hold(100);
    std::thread::sleep(Duration::from_millis(300));
    drop(holder);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        std::fs::write(d.0.join("msg"), b"m").unwrap();
        let o = agent_sign(&d, &socket, "msg.sig");
        if o.status.success() {
            break;
        }
        assert!(Instant::now() < until, "the agent did not serve again once descriptors freed: {}", stderr(&o));
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(running);
    let log = std::fs::read_to_string(d.0.join("agent-64:64.err")).unwrap();
    let said = log.matches("cannot accept a connection").count();
    assert_eq!(said, 1, "said once, not per connection: {log}");
}

/// Waits (at most 20 s) for `file` to hold a line that `pred` accepts;
/// the file's text.
fn wait_for_line(file: &Path, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if text.lines().any(&pred) {
            return text;
        }
        assert!(Instant::now() < until, "no line {what} in the agent's log:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Under systemd (standard error is the journal's stream, JOURNAL_STREAM
/// names it) every line has its priority: a refused envelope is a
/// warning, a revoked machine an error, a fatal start error `<3>`.
/// `agent status` answers and exits 1 once the machine is revoked; the
/// revoked agent drops its keys and opens nothing; SIGHUP does not end
/// it; SIGTERM ends it, exit 0.
#[test]
fn under_the_journal_the_agent_logs_priorities_answers_status_and_stops_on_sigterm() {
    use std::os::unix::fs::MetadataExt;
    let d = Dir::new("agent-journal");
    world(&d);
    let socket = d.0.join("agent.sock");
    let sock = socket.to_str().unwrap();
    let log = d.0.join("journal.log");
    let file = std::fs::File::create(&log).unwrap();
    let meta = file.metadata().unwrap();
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    let mut args = agent_args(&d, sock);
    args.extend(["--log".into(), "info".into()]);
    let mut agent = Killed(
        Command::new(env!("CARGO_BIN_EXE_keyfence"))
            .args(&args)
            .env("JOURNAL_STREAM", &stream)
            .stdout(Stdio::piped())
            .stderr(file)
            .spawn()
            .unwrap(),
    );
    wait_listening(&mut agent.0);
    signs_through(&d, &socket);

    // Healthy: exit 0, the machine's id and generations.
    let id = ok(&["machine", "info", "--key", &d.p("us.machine")]).lines().next().unwrap().trim_start_matches("id: ").to_string();
    let out = ok(&["agent", "status", "--socket", sock]);
    assert!(out.contains(&format!("machine: {id}")) && out.contains("generations live: 1") && out.contains("revoked: no"), "{out}");
    let json: serde_json::Value = serde_json::from_str(&ok(&["agent", "status", "--socket", sock, "--json"])).unwrap();
    assert_eq!(json["machine"]["revoked"], false, "{json}");
    assert!(json["keys_loaded"].as_u64().is_some() && json["pid"].as_u64().is_some(), "{json}");

    // A refused envelope: a warning in the agent's log, with its code and
    // the client's user and pid; the client says "no" (exit 1).
    ok(&["authority", "wrap", "--store", &d.p("store"), "--policy", "country: FR", "--in", &d.p("ec.pem"), "--out", &d.p("fr.env")]);
    ok(&["authority", "export", "--store", &d.p("store"), "--to", &d.p("served")]);
    let o = common::keyfence(&["provider-key", "--agent", sock, "--envelope", &d.p("fr.env"), "--out", &d.p("fr.kfk")]);
    assert!(!o.status.success(), "{}", stderr(&o));
    wait_for_line(&log, "<4> ... POLICY_NOT_SATISFIED", |l| {
        l.starts_with("<4>") && l.contains("POLICY_NOT_SATISFIED") && l.contains("pid=")
    });

    // SIGHUP is a reload, said; the agent goes on.
    let pid = agent.0.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    wait_for_line(&log, "<6> ... SIGHUP", |l| l.starts_with("<6>") && l.contains("SIGHUP"));
    signs_through(&d, &socket);

    // Another machine revoked: a store update, said at its priority; this
    // agent goes on signing.
    ok(&["authority", "issue", "--store", &d.p("store"), "--attrs", "country=DE", "--out", &d.p("de.machine")]);
    let other = ok(&["machine", "info", "--key", &d.p("de.machine")]).lines().next().unwrap().trim_start_matches("id: ").to_string();
    ok(&["authority", "revoke", "--store", &d.p("store"), "--machine", &other]);
    ok(&["authority", "export", "--store", &d.p("store"), "--to", &d.p("served")]);
    wait_for_line(&log, "<6> ... revocation list changed", |l| l.starts_with("<6>") && l.contains("revocation list changed"));
    let out = ok(&["agent", "status", "--socket", sock]);
    assert!(out.contains("machines on the revocation list: 1") && out.contains("revoked: no"), "{out}");
    signs_through(&d, &socket);

    // Revoked: the agent says so as an error within its watch's period,
    // ends its connections, opens nothing; status exits 1.
    ok(&["authority", "revoke", "--store", &d.p("store"), "--machine", &id]);
    ok(&["authority", "export", "--store", &d.p("store"), "--to", &d.p("served")]);
    wait_for_line(&log, "<3> ... revoked", |l| l.starts_with("<3>") && l.contains("revoked") && l.contains(&id));
    let o = common::keyfence(&["agent", "status", "--socket", sock]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("revoked"), "{}", stderr(&o));
    std::fs::write(d.0.join("msg"), b"after the revocation").unwrap();
    let o = agent_sign(&d, &socket, "x.sig");
    assert_eq!(o.status.code(), Some(1), "a revoked machine's \"no\": {}", stderr(&o));
    assert!(stderr(&o).contains("is revoked: the agent opens no envelope"), "{}", stderr(&o));

    // SIGTERM: a clean stop.
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let until = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = agent.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "the agent did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    wait_for_line(&log, "<6> ... stopped", |l| l.starts_with("<6>") && l.contains("stopped"));
    // No agent: status exits 3.
    assert_eq!(common::keyfence(&["agent", "status", "--socket", sock]).status.code(), Some(3));

    // A start that fails is an error under the journal too.
    let log2 = d.0.join("journal2.log");
    let file = std::fs::File::create(&log2).unwrap();
    let meta = file.metadata().unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_keyfence"))
        .args(["agent", "--socket", sock, "--store", &d.p("served"), "--machine-key", &d.p("missing.machine")])
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stderr(file)
        .status()
        .unwrap();
    assert!(!o.success());
    let text = std::fs::read_to_string(&log2).unwrap();
    assert!(text.lines().any(|l| l.starts_with("<3>keyfence: ")), "{text}");
}
