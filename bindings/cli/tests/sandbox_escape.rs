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

use common::{stderr, Dir};

const LEAK: &[u8] = b"LEAKED-FROM-THE-PROBE";

/// Builds the probe for one attack; `None` (a skip, said loudly) without a
/// C compiler.
fn probe(d: &Dir, attack: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sandbox_probe.c");
    let out = d.0.join(format!("probe-{attack}.so"));
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", &format!("-DATTACK_{}", attack.to_uppercase())])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .status();
    match status {
        Ok(s) if s.success() => Some(out),
        Ok(s) => panic!("cc {}: {s}", src.display()),
        Err(e) => {
            eprintln!("*** SKIPPED: no C compiler ({e}) ***");
            None
        }
    }
}

/// What reached the watchers while one command ran.
struct Watch {
    tcp: TcpListener,
    unix: UnixDatagram,
    file: PathBuf,
    received: Arc<Mutex<Vec<u8>>>,
}

impl Watch {
    fn new(d: &Dir, name: &str) -> Watch {
        let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
        tcp.set_nonblocking(true).unwrap();
        let sock = d.0.join(format!("{name}.sock"));
        let _ = std::fs::remove_file(&sock);
        let unix = UnixDatagram::bind(&sock).unwrap();
        unix.set_nonblocking(true).unwrap();
        Watch { tcp, unix, file: d.0.join(format!("{name}.leaked")), received: Arc::default() }
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

    fn leaked(&self) -> bool {
        let got = self.received.lock().unwrap();
        got.windows(LEAK.len()).any(|w| w == LEAK) || self.file.exists()
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
    let Some(module) = probe(&d, name) else { return };
    for isolated in [true, false] {
        let watch = Watch::new(&d, &format!("{name}-{isolated}"));
        let done = std::sync::atomic::AtomicBool::new(false);
        let out = std::thread::scope(|s| {
            s.spawn(|| watch.collect(&done));
            let out = sign_with_probe(&d, &module, &watch, isolated);
            done.store(true, std::sync::atomic::Ordering::Release);
            out
        });
        let err = stderr(&out);
        assert!(!out.status.success(), "{name} isolated={isolated}: a probe is no token, the command must fail: {err}");
        if isolated {
            assert!(!watch.leaked(), "{name}: the probe got out of the key process ({err})");
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
                watch.leaked() || name == "procmem",
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
