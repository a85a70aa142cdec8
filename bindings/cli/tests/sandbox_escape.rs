//! Attacker code inside the key process gets nothing out (issue 55.1,
//! docs/security.md "The key process").
//!
//! `sandbox_probe.c`, built here once per attack, is loaded as a PKCS#11
//! module by `keyfence sign --key 'pkcs11:...' --isolated`: its constructor
//! runs inside the key process, after the sandbox is up, as a hostile
//! module's or an exploited parser's code would. Each attack aims at
//! something the test watches: a TCP listener (io_uring, a plain socket, a
//! connection inherited on descriptor 3), a local datagram socket, a file
//! that must not appear (a new file, a program run), and the parent's
//! `/proc/PID/mem`, whose opening the probe reports through the error code
//! its `C_Initialize` returns. The control loads the same probe in the
//! command's own process, where every attack gets out: so each is a real
//! attack, and the test can fail.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{is_root, skip_unless, stderr, Dir, REQUIRE_ROOT};

const LEAK: &[u8] = b"LEAKED-FROM-THE-PROBE";

/// Builds the probe for one attack (with `cc`, which every machine that
/// builds keyfence has: ring and AWS-LC need it).
fn probe(d: &Dir, attack: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sandbox_probe.c");
    let out = d.0.join(format!("probe-{attack}.so"));
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", &format!("-DATTACK_{}", attack.to_uppercase())])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status();
    let status = status.unwrap_or_else(|e| panic!("a C compiler (cc) builds the probe: {e}"));
    assert!(status.success(), "cc {}: {status}", src.display());
    out
}

/// What reached the watchers while one command ran.
struct Watch {
    tcp: TcpListener,
    unix: UnixDatagram,
    file: PathBuf,
    /// A file every user may read, which the probe locks.
    lock: PathBuf,
    received: Arc<Mutex<Vec<u8>>>,
    /// What `nobody` saw of the key process in /proc and in the locks.
    seen: Arc<Mutex<String>>,
}

/// Another user (`nobody`) watching for what the probe's covert
/// channels carry: thread names in /proc/PID/task/*/comm and locks on a
/// file it can read (flock, and fcntl's F_GETLK). Prints what it saw.
const OBSERVER: &str = r#"
import fcntl, glob, struct, sys, time
lock, until, seen = sys.argv[1], time.time() + float(sys.argv[2]), set()
while time.time() < until:
    for p in glob.glob('/proc/[0-9]*/task/*/comm'):
        try:
            if open(p).read().startswith('LEAKED-FROM-TH'):
                seen.add('name')
        except OSError:
            pass
    try:
        with open(lock) as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
            except OSError:
                seen.add('flock')
            got = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0))
            if struct.unpack('hhqqi', got)[0] != fcntl.F_UNLCK:
                seen.add('fcntl')
    except OSError:
        pass
    time.sleep(0.03)
print(' '.join(sorted(seen)) or 'nothing')
"#;

impl Watch {
    fn new(d: &Dir, name: &str) -> Watch {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        tcp.set_nonblocking(true).unwrap();
        let sock = d.0.join(format!("{name}.sock"));
        let _ = std::fs::remove_file(&sock);
        let unix = UnixDatagram::bind(&sock).unwrap();
        unix.set_nonblocking(true).unwrap();
        let lock = d.0.join(format!("{name}.lock"));
        std::fs::write(&lock, b"").unwrap();
        Watch { tcp, unix, file: d.0.join(format!("{name}.leaked")), lock, received: Arc::default(), seen: Arc::default() }
    }

    fn port(&self) -> u16 {
        self.tcp.local_addr().unwrap().port()
    }

    fn unix_path(&self) -> PathBuf {
        self.unix.local_addr().unwrap().as_pathname().unwrap().to_path_buf()
    }

    /// Collects what arrives on every connection and datagram until
    /// `done` is set, then a little longer for late bytes.
    fn collect(&self, done: &std::sync::atomic::AtomicBool) {
        let mut conns = Vec::new();
        let mut buf = [0u8; 4096];
        let mut last = None::<Instant>;
        loop {
            if done.load(std::sync::atomic::Ordering::Acquire) {
                let since = *last.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(300) {
                    break;
                }
            }
            if let Ok((c, _)) = self.tcp.accept() {
                c.set_nonblocking(true).unwrap();
                conns.push(c);
            }
            for c in &mut conns {
                if let Ok(n) = c.read(&mut buf) {
                    self.received.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            }
            if let Ok(n) = self.unix.recv(&mut buf) {
                self.received.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Runs the observer as `nobody` for `seconds`, keeping what it saw.
    fn observe(&self, seconds: f64) {
        use std::os::unix::process::CommandExt;
        let out = Command::new("python3")
            .args(["-c", OBSERVER])
            .arg(&self.lock)
            .arg(seconds.to_string())
            .uid(65534)
            .gid(65534)
            .output()
            .expect("python3 for the observer");
        *self.seen.lock().unwrap() = String::from_utf8_lossy(&out.stdout).trim().to_string();
    }

    fn leaked(&self) -> bool {
        let got = self.received.lock().unwrap();
        let seen = self.seen.lock().unwrap();
        got.windows(LEAK.len()).any(|w| w == LEAK) || self.file.exists() || !(seen.is_empty() || *seen == "nothing")
    }
}

/// `keyfence sign` with the probe as the key's module, in process or
/// isolated, started by bash with descriptor 3 connected to the watcher
/// (a connection a server would hold when it starts its key process).
fn sign_with_probe(d: &Dir, module: &Path, watch: &Watch, isolated: bool) -> Output {
    std::fs::write(d.0.join("msg"), b"m").unwrap();
    let uri = format!("pkcs11:token=probe;object=k;type=private?module-path={}", module.display());
    let mut cmd = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port}; exec \"$KF\" sign --key \"$URI\" --alg ecdsa-p256-sha256 --in msg --out msg.sig",
        port = watch.port()
    );
    if isolated {
        cmd.push_str(" --isolated");
    }
    // Bounded by `timeout`: a probe that hangs the command fails the test,
    // it does not hold the run.
    let child = Command::new("timeout")
        .args(["-s", "KILL", "60", "bash", "-c", &cmd])
        .env("KF", env!("CARGO_BIN_EXE_keyfence"))
        .env("URI", uri)
        .env("KEYFENCE_PKCS11_PIN", "0000")
        .env("KF_PROBE_PORT", watch.port().to_string())
        .env("KF_PROBE_FILE", &watch.file)
        .env("KF_PROBE_UNIX", watch.unix_path())
        .env("KF_PROBE_LOCK", &watch.lock)
        .current_dir(&d.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Runs `attack` isolated and in process; asserts nothing got out of the
/// key process and that the same code got out of the command itself.
fn attack(name: &str, refused_not_killed: bool) {
    let d = Dir::new(&format!("sandbox-{name}"));
    // The covert channels' receiver is another user, who watches while the
    // probe holds what it set (1.5 s).
    let observed = matches!(name, "name" | "lock");
    if observed && skip_unless(is_root(), "the observer runs as nobody, which needs root", REQUIRE_ROOT) {
        return;
    }
    let module = probe(&d, name);
    for isolated in [true, false] {
        let watch = Watch::new(&d, &format!("{name}-{isolated}"));
        let done = std::sync::atomic::AtomicBool::new(false);
        let out = std::thread::scope(|s| {
            s.spawn(|| watch.collect(&done));
            if observed {
                s.spawn(|| watch.observe(6.0));
                // The observer is up before the probe sets anything.
                std::thread::sleep(Duration::from_millis(300));
            }
            let out = sign_with_probe(&d, &module, &watch, isolated);
            done.store(true, std::sync::atomic::Ordering::Release);
            out
        });
        let err = stderr(&out);
        assert!(!out.status.success(), "{name} isolated={isolated}: a probe is no token, the command must fail: {err}");
        if isolated {
            assert!(!watch.leaked(), "{name}: the probe got out of the key process (nobody saw: {}) ({err})", watch.seen.lock().unwrap());
            assert!(!err.contains("GeneralError"), "{name}: the probe reports it got out of the key process: {err}");
            if refused_not_killed {
                assert!(err.contains("FunctionFailed"), "{name}: the attempt should be refused and reported: {err}");
            }
        } else {
            // The control: a program run in the background may write its
            // file a moment after the command ends.
            let t = Instant::now();
            while !watch.leaked() && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(err.contains("GeneralError"), "{name}: in process the probe should get out, and say so: {err}");
            assert!(
                watch.leaked() || matches!(name, "procmem" | "dump"),
                "{name}: in process the attack should reach its target (the control): {err}"
            );
        }
    }
}

#[test]
fn io_uring_cannot_connect_out_of_the_key_process() {
    attack("uring", false);
}

#[test]
fn the_parents_memory_does_not_open_from_the_key_process() {
    attack("procmem", true);
}

#[test]
fn a_connection_the_parent_held_is_not_inherited() {
    // Descriptor 3 in the key process is its own socket pair by the time
    // the module loads (the lowest free number once the inherited ones are
    // closed): the write reaches its parent, never the listener.
    attack("inherited", false);
}

#[test]
fn no_file_is_created_from_the_key_process() {
    attack("creat", true);
}

#[test]
fn no_socket_connects_out_of_the_key_process() {
    attack("socket", false);
}

#[test]
fn no_datagram_reaches_a_local_socket() {
    attack("unix", true);
}

#[test]
fn no_program_runs_from_the_key_process() {
    attack("exec", false);
}

/// Issue 59.3: a thread name, which every user reads in /proc, carries
/// nothing out: the key process may not set one once its sandbox is up.
#[test]
fn a_thread_name_carries_nothing_out_of_the_key_process() {
    attack("name", true);
}

/// Issue 59.3: nor a lock on a file other users can read (flock, or
/// fcntl's record locks), which they see, and which would make another
/// program wait (the store's lock).
#[test]
fn a_lock_carries_nothing_out_of_the_key_process() {
    attack("lock", true);
}

/// Issue 59.4: the key process cannot make itself dumpable again nor
/// raise its core-dump limit: no core file holds its keys.
#[test]
fn the_key_process_cannot_make_a_core_dump_possible() {
    attack("dump", true);
}
