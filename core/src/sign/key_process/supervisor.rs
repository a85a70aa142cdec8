//! The supervisor: finds the key-process program, starts the process,
//! exchanges hellos, and when the process dies starts a new one and
//! replays the setup (key loads, privilege drops) on it. It is also what
//! holds the keys on the engine's behalf ([`KeyHolder`]): operations go to
//! the live connection, waiting briefly for a restart in progress.

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::client::{backend_error, Conn, Pending, NAME};
use super::protocol::{self as p, kind};
use super::server::writer::FrameWriter;
use super::KeyProcessConfig;
use super::KeySource;
use crate::sign::held_key::{Answer, KeyHolder};
use crate::sign::sys;
use crate::sign::threads::{Joined, Origin};
use crate::sign::types::{BackendFailure, KeyKind, OpClass, Operation, Output, Resource, SignError};

/// The key-process program's file name, looked for beside the library and
/// the executable.
pub(super) const PROGRAM: &str = "keyfence-key-process";

/// One setup step, replayed in order on a new key process.
#[derive(Debug, Clone)]
pub(super) enum Setup {
    Load(u64, KeySource),
    DropPrivileges(u32, u32),
}

pub(super) struct State {
    pub(super) conn: Option<Arc<Conn>>,
    /// Every key load and privilege drop, in order. Keys loaded from bytes
    /// keep their bytes here (zeroized when the key is forgotten), so that
    /// a restart never loses them.
    pub(super) setup: Vec<Setup>,
    /// Keys a restart could not load again because their source went away
    /// (a file deleted, an envelope revoked), with the reason that load
    /// gave: what the operator has to fix.
    lost: HashMap<u64, String>,
    /// Why the last key process ended, for status and errors.
    pub(super) last_exit: Option<String>,
}

/// Starts and restarts the key process; holds keys for the engine.
pub(super) struct Supervisor {
    pub(super) config: KeyProcessConfig,
    /// The program and arguments, resolved once at start.
    command: Vec<std::ffi::OsString>,
    state: Mutex<State>,
    changed: Condvar,
    pub(super) next_key: AtomicU64,
    pub(super) restarts: AtomicU64,
    closed: AtomicBool,
    /// The readers of this supervisor's connections, one per key process
    /// started (those that ended are let go as new ones start); joined
    /// when it is dropped.
    readers: Mutex<Joined>,
    /// The process it was started in (see [`Origin`]).
    pub(super) origin: Origin,
}

/// The key-process program: the configured command if there is one (its
/// program must be a path, never a name looked up on `PATH`), else
/// `keyfence-key-process` beside the shared library or executable keyfence is
/// part of, else beside the running executable (or one directory up, for
/// test and bench binaries in `target/*/deps`). No environment variable
/// is consulted: a binding's host process should not be able to choose
/// which program holds its keys by inheriting one.
pub(super) fn resolve_command(config: &KeyProcessConfig) -> Result<Vec<std::ffi::OsString>, SignError> {
    if let Some(program) = config.command.first() {
        let path = Path::new(program);
        if path.components().count() < 2 && !path.is_absolute() {
            return Err(SignError::Config(format!(
                "the key process program must be a path, not `{}` (it is never looked up on PATH)",
                path.display()
            )));
        }
        if !path.is_file() {
            return Err(SignError::Config(format!("the key process program {} does not exist", path.display())));
        }
        return Ok(config.command.clone());
    }
    let mut looked = Vec::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(lib) = sys::library_path() {
        dirs.extend(lib.parent().map(Path::to_path_buf));
    }
    if let Ok(exe) = std::env::current_exe() {
        dirs.extend(exe.ancestors().skip(1).take(2).map(Path::to_path_buf));
    }
    for dir in dirs {
        let candidate = dir.join(PROGRAM);
        if candidate.is_file() {
            return Ok(vec![candidate.into_os_string()]);
        }
        if !looked.contains(&dir) {
            looked.push(dir);
        }
    }
    let looked: Vec<String> = looked.iter().map(|d| d.display().to_string()).collect();
    Err(SignError::Config(format!(
        "no {PROGRAM} beside the library or executable (looked in {}); install it there or name it in the key process configuration",
        looked.join(", ")
    )))
}

impl Supervisor {
    /// Checks the configuration, starts the first key process.
    pub(super) fn start(config: KeyProcessConfig) -> Result<Arc<Self>, SignError> {
        if config.max_in_flight == 0 || config.rsa_threads == 0 || config.ec_threads == 0 {
            return Err(SignError::Config("key process sizes (max_in_flight, threads) must be at least 1".into()));
        }
        if config.max_in_flight > p::MAX_IN_FLIGHT || config.rsa_threads > 1024 || config.ec_threads > 1024 {
            return Err(SignError::Config(format!("key process sizes: max_in_flight at most {}, threads at most 1024", p::MAX_IN_FLIGHT)));
        }
        // An agent is reached by its socket: no program to find.
        let command = if config.agent.is_some() { Vec::new() } else { resolve_command(&config)? };
        let sup = Arc::new(Supervisor {
            config,
            command,
            state: Mutex::new(State { conn: None, setup: Vec::new(), lost: HashMap::new(), last_exit: None }),
            changed: Condvar::new(),
            next_key: AtomicU64::new(1),
            restarts: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            readers: Mutex::new(Joined::new()),
            origin: Origin::here(),
        });
        let conn = sup.spawn()?;
        sup.state().conn = Some(conn);
        Ok(sup)
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the keys are held by an agent this supervisor connects to,
    /// rather than a key process it starts.
    pub(super) fn is_agent(&self) -> bool {
        self.config.agent.is_some()
    }

    /// What holds the keys, for messages: "the key process" or "the agent".
    pub(super) fn holder(&self) -> &'static str {
        if self.is_agent() {
            "the agent"
        } else {
            "the key process"
        }
    }

    /// Connects to the agent, exchanges hellos and starts the reader.
    fn connect(self: &Arc<Self>, socket: &Path) -> Result<Arc<Conn>, SignError> {
        let config = &self.config;
        let fail = |what: String| backend_error(BackendFailure::Unavailable, what);
        let ours = UnixStream::connect(socket).map_err(|e| fail(format!("cannot connect to the agent at {}: {e}", socket.display())))?;
        // Who listens: the agent, or the service manager that made the
        // socket and handed it over (systemd: root, PID 1), whose pid is not
        // the agent's. What a client trusts is its socket's path; the
        // listener must be root or the socket file's owner, so a socket
        // another user bound and left in a folder a client can reach is
        // not taken for the agent's.
        let (_, listener_uid, _) = sys::peer_credentials(&ours).map_err(|e| fail(format!("the agent's credentials: {e}")))?;
        let owner = std::fs::metadata(socket).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).ok();
        if listener_uid != 0 && owner != Some(listener_uid) {
            return Err(backend_error(
                BackendFailure::Refused,
                format!(
                    "{} is not the agent's: its listener runs as uid {listener_uid}, and the socket file is owned by {}",
                    socket.display(),
                    owner.map_or("nobody it could read".to_string(), |u| format!("uid {u}"))
                ),
            ));
        }
        let (flags, decoder, peer_pid) = handshake(&ours, None, config).map_err(|e| {
            if e.kind() == io::ErrorKind::PermissionDenied {
                backend_error(BackendFailure::Refused, format!("the agent at {} refused: {e}", socket.display()))
            } else {
                fail(format!("the agent at {} did not answer: {e}", socket.display()))
            }
        })?;
        if flags & p::flags::AGENT == 0 {
            return Err(fail(format!("{} is not a keyfence agent", socket.display())));
        }
        let reader = ours.try_clone().map_err(|e| SignError::io(Resource::Socket, format!("cannot clone the agent socket: {e}")))?;
        let writer = FrameWriter::client(ours);
        let conn = Arc::new(Conn::new(peer_pid, flags, None, writer, config.max_in_flight));
        self.start_reader(&conn, reader, decoder)?;
        Ok(conn)
    }

    /// Starts `conn`'s reader, which delivers replies and, when the
    /// connection ends, records why and starts another.
    fn start_reader(self: &Arc<Self>, conn: &Arc<Conn>, reader: UnixStream, decoder: p::Decoder) -> Result<(), SignError> {
        let (weak, c) = (Arc::downgrade(self), conn.clone());
        let started =
            self.readers.lock().unwrap_or_else(|e| e.into_inner()).spawn(format!("keyfence-key-process-{}", conn.pid), move || {
                // A forked child of this process does not keep the reader's
                // copy of the socket either; let go before it closes.
                let guard = sys::ForkGuard::new(&reader);
                let exit = c.read_replies(reader, decoder, guard);
                on_exit(weak, exit);
            });
        if let Err(e) = started {
            end(conn);
            return Err(SignError::io(Resource::Thread, format!("cannot start the reader of {}: {e}", self.holder())));
        }
        Ok(())
    }

    /// Starts a key process (or connects to the agent), exchanges hellos
    /// and starts its reader.
    fn spawn(self: &Arc<Self>) -> Result<Arc<Conn>, SignError> {
        let config = &self.config;
        if let Some(socket) = &config.agent {
            return self.connect(socket);
        }
        let process_error = |what: String| SignError::io(Resource::Process, what);
        let (ours, theirs) = UnixStream::pair().map_err(|e| SignError::io(Resource::Socket, format!("socketpair: {e}")))?;
        // The key process reads which process sent each request, from its
        // first byte on (it serves only this one, not a child of it).
        sys::pass_credentials(&theirs).map_err(|e| SignError::io(Resource::Socket, format!("SO_PASSCRED: {e}")))?;
        let mut cmd = Command::new(&self.command[0]);
        cmd.args(&self.command[1..])
            .arg("--rsa-threads")
            .arg(config.rsa_threads.to_string())
            .arg("--ec-threads")
            .arg(config.ec_threads.to_string())
            .arg("--offload")
            .arg(config.offload.name())
            .args(config.crypto_mb.iter().flat_map(|l| ["--crypto-mb", l.as_str()]))
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child =
            cmd.spawn().map_err(|e| process_error(format!("cannot start the key process {}: {e}", self.command[0].to_string_lossy())))?;
        // The command still holds the child's end of the pair; while it
        // does, a child that dies before its hello is not seen to.
        drop(cmd);
        let pid = child.id();
        let mut child = child;
        let kill = |child: &mut Child| {
            let _ = child.kill();
            let _ = child.wait();
        };

        let (flags, decoder, _) = match handshake(&ours, Some(pid), config) {
            Ok(v) => v,
            Err(e) => {
                kill(&mut child);
                return Err(process_error(format!("the key process did not start: {e}")));
            }
        };
        if let Some(missing) = unconfined(flags) {
            if !config.unsafe_partial_sandbox {
                kill(&mut child);
                return Err(SignError::Config(format!(
                    "the key process could not set up its whole sandbox: without {missing} it would hold the keys with less isolation than docs/security.md promises, so it was stopped. Fix the cause, or accept the weaker isolation explicitly: KeyProcessConfig::unsafe_partial_sandbox, KEYFENCE_UNSAFE_PARTIAL_SANDBOX=1 in the environment, or --unsafe-partial-sandbox"
                )));
            }
            warn_unconfined(&missing);
        }
        let reader = match ours.try_clone() {
            Ok(r) => r,
            Err(e) => {
                kill(&mut child);
                return Err(SignError::io(Resource::Socket, format!("cannot clone the key-process socket: {e}")));
            }
        };
        let writer = FrameWriter::client(ours);
        let conn = Arc::new(Conn::new(pid, flags, Some(child), writer, config.max_in_flight));
        self.start_reader(&conn, reader, decoder)?;
        Ok(conn)
    }

    /// The live connection, waiting for a restart in progress until
    /// `deadline`.
    pub(super) fn live_conn(&self, deadline: Instant) -> Result<Arc<Conn>, SignError> {
        let mut state = self.state();
        loop {
            if let Some(conn) = state.conn.as_ref().filter(|c| !c.is_dead()) {
                return Ok(conn.clone());
            }
            // Stopped by its owner (the engine was closed): the keys went
            // with it, on purpose.
            if self.closed.load(Ordering::Acquire) {
                return Err(SignError::ShutDown);
            }
            if !self.config.restart {
                let why = state.last_exit.clone().unwrap_or_else(|| "it is not running".into());
                return Err(backend_error(BackendFailure::Unavailable, format!("{} is gone ({why})", self.holder())));
            }
            let now = Instant::now();
            if now >= deadline {
                let why = state.last_exit.clone().unwrap_or_else(|| "starting".into());
                let doing = if self.is_agent() { "is being reconnected to" } else { "is restarting" };
                return Err(backend_error(BackendFailure::Unavailable, format!("{} {doing} (last exit: {why})", self.holder())));
            }
            state = self.changed.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Replays the setup script on a new connection.
    fn replay(&self, conn: &Conn, setup: &[Setup]) -> Result<Vec<(u64, String)>, SignError> {
        let mut lost = Vec::new();
        for step in setup {
            match step {
                Setup::Load(key_id, source) => {
                    // Envelopes with the store's objects of now.
                    let wire = match super::client::for_the_wire(source, self.is_agent()) {
                        Ok(w) => w,
                        Err(e) => {
                            lost.push((*key_id, e.to_string()));
                            continue;
                        }
                    };
                    let body = p::load_request(*key_id, &wire);
                    // A source that went away (file deleted, envelope
                    // revoked) loses that key; the others live on.
                    match conn.load(&body, self.config.start_timeout) {
                        // The same lists as at the first load, as a rule:
                        // keeping them again is for a store that moved on
                        // meanwhile, and a failure shows at the next load.
                        Ok(_) => {
                            let _ = super::client::keep_floor(&wire);
                        }
                        // The source's own refusal (a file gone, a policy the
                        // machine no longer satisfies) loses this key only.
                        Err(SignError::Backend { reason, .. }) => lost.push((*key_id, reason)),
                        Err(e @ SignError::Declined { .. }) => lost.push((*key_id, e.to_string())),
                        Err(e) => return Err(e),
                    }
                }
                Setup::DropPrivileges(uid, gid) => {
                    let body = p::drop_privileges_request(*uid, *gid);
                    conn.call(kind::DROP_PRIVILEGES, &body, self.config.start_timeout)?;
                }
            }
        }
        Ok(lost)
    }

    /// The connection for an operation on `key_id`, or why there is none.
    fn conn_for(&self, key_id: u64, deadline: Instant) -> Result<Arc<Conn>, SignError> {
        let wait_until = deadline.min(Instant::now() + self.config.restart_wait);
        let conn = self.live_conn(wait_until)?;
        if let Some(why) = self.state().lost.get(&key_id) {
            let when = if self.is_agent() { "the agent was connected to again" } else { "the key process restarted" };
            return Err(backend_error(
                BackendFailure::Refused,
                format!("the key could not be loaded again when {when}: {why}; load it again once that is fixed"),
            ));
        }
        Ok(conn)
    }
}

/// Which layers of its sandbox a key process runs without, by its hello's
/// flags, in words an operator can act on; `None` when it has them all.
fn unconfined(flags: u32) -> Option<String> {
    let mut missing = Vec::new();
    if flags & p::flags::SANDBOXED == 0 {
        missing.push("its system call filter (the kernel refused seccomp)".to_string());
    }
    if flags & p::flags::FILES_CONFINED == 0 {
        missing.push(if flags & p::flags::OTHER_THREAD != 0 {
            "Landlock: another thread was running in it when the sandbox was set up, and Landlock binds only the thread that sets it up (a library preloaded with LD_PRELOAD starts one)".to_string()
        } else {
            "Landlock (the kernel's file sandbox, Linux 5.13 or later with landlock in its lsm= list): other processes of its user, its parent's /proc/PID/mem, environ and descriptors among them, would be open to code running in it".to_string()
        });
    }
    if flags & p::flags::INHERITED_CLOSED == 0 {
        missing.push("closing the descriptors it inherited".to_string());
    }
    (!missing.is_empty()).then(|| missing.join("; "))
}

/// Says once per process, as a warning on standard error and in the log,
/// which layer of its sandbox a key process runs without, when its user
/// allowed that (the key process itself has no standard error to say it
/// on).
fn warn_unconfined(missing: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        eprintln!("keyfence: warning: the key process runs without part of its sandbox, as allowed (unsafe_partial_sandbox): {missing} (docs/security.md)");
        tracing::warn!(%missing, "the key process runs without part of its sandbox, as allowed (docs/security.md)");
    }
}

/// Closes the connection, then kills and reaps its key process (an
/// agent's connection is only closed).
fn end(conn: &Conn) {
    conn.writer.shutdown();
    if let Some(child) = conn.child.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Sends `Hello` and reads the key process's or agent's: its hardening
/// flags and its pid, which must be `pid` when that is given (a key
/// process this client started; an agent's listener may be another
/// process, so its pid is taken as the agent says).
fn handshake(ours: &UnixStream, pid: Option<u32>, config: &KeyProcessConfig) -> io::Result<(u32, p::Decoder, u32)> {
    let mut hello = Vec::new();
    p::encode(&mut hello, kind::HELLO, 0, &[&p::hello_request(config.max_in_flight)]);
    let mut ours = ours;
    // MSG_NOSIGNAL: a peer already gone is an error, not a SIGPIPE in the
    // host program. A peer that refuses this process (an agent's
    // allow-list) may answer and close before the hello arrives: the write
    // then fails, and the refusal is in the socket to read. It is the
    // better message.
    let wrote = sys::send_all(ours, &hello);
    ours.set_read_timeout(Some(config.start_timeout))?;
    let mut decoder = p::Decoder::new();
    let mut buf = [0u8; 256];
    let frame = loop {
        if let Some(f) = decoder.next_frame().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))? {
            break f;
        }
        let n = match ours.read(&mut buf) {
            Ok(n) => n,
            Err(e) => return Err(wrote.err().unwrap_or(e)),
        };
        if n == 0 {
            return Err(wrote.err().unwrap_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "it exited before its hello")));
        }
        decoder.push(&buf[..n]);
    };
    ours.set_read_timeout(None)?;
    if frame.kind == kind::ERR {
        let (code, msg) = p::parse_error(&frame.body);
        let kind = if code == p::ErrorCode::NotAllowed { io::ErrorKind::PermissionDenied } else { io::ErrorKind::InvalidData };
        return Err(io::Error::new(kind, format!("it refused the hello: {msg}")));
    }
    let (their_pid, flags) = p::parse_hello_reply(&frame.body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    if frame.kind != kind::HELLO {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("expected a hello, got frame kind {:#04x}", frame.kind)));
    }
    if let Some(pid) = pid.filter(|p| *p != their_pid) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the hello came from pid {their_pid}, not the process started ({pid})"),
        ));
    }
    Ok((flags, decoder, their_pid))
}

/// A connection ended: record how, and start a new key process unless
/// the owner is gone or restarts are off.
fn on_exit(sup: Weak<Supervisor>, exit: String) {
    let Some(sup) = sup.upgrade() else { return };
    sup.state().last_exit = Some(exit);
    sup.changed.notify_all();
    if sup.closed.load(Ordering::Acquire) || !sup.config.restart {
        return;
    }
    restart(&sup);
}

/// Starts a new key process and reloads the keys, backing off from 10 ms
/// to 1 s between failed attempts, until it works or the owner is gone.
fn restart(sup: &Arc<Supervisor>) {
    let mut backoff = Duration::from_millis(10);
    loop {
        if sup.closed.load(Ordering::Acquire) || Arc::strong_count(sup) == 1 {
            return;
        }
        let spawned = sup.spawn();
        if let Err(e) = &spawned {
            // Why operations fail meanwhile ("cannot connect to the agent
            // ...: connection refused"), without the error's own prefix,
            // which theirs repeats.
            let why = match e {
                SignError::Backend { reason, .. } => reason.clone(),
                e => e.to_string(),
            };
            sup.state().last_exit = Some(why);
        }
        if let Ok(conn) = spawned {
            let setup = sup.state().setup.clone();
            match sup.replay(&conn, &setup) {
                Ok(lost) => {
                    let mut state = sup.state();
                    if sup.closed.load(Ordering::Acquire) {
                        // Stopped while this one started: it must not
                        // outlive the stop.
                        drop(state);
                        conn.close_by_owner();
                        end(&conn);
                        return;
                    }
                    state.lost.extend(lost);
                    state.conn = Some(conn);
                    drop(state);
                    sup.restarts.fetch_add(1, Ordering::Relaxed);
                    sup.changed.notify_all();
                    return;
                }
                Err(_) => conn.writer.shutdown(),
            }
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

impl KeyHolder for Supervisor {
    fn name(&self) -> &str {
        NAME
    }

    /// RSA keys on the RSA executor, the others on the EC executor: the
    /// executor threads only write the request, so they stay free, and the
    /// classes stay apart as they are in the key process.
    fn class(&self, kind: KeyKind) -> OpClass {
        if kind.is_rsa() {
            OpClass::Rsa
        } else {
            OpClass::Ec
        }
    }

    /// Started on the submitting thread when a key process is running and
    /// has room: `start` then only writes the request. Refused at once
    /// with `overloaded` when `max_in_flight` requests are outstanding;
    /// queued on the executor (to wait for the restart) when the key
    /// process is down.
    fn admit(&self, _id: u64, class: OpClass) -> Result<bool, SignError> {
        let state = self.state();
        let Some(conn) = state.conn.as_ref().filter(|c| !c.is_dead()) else {
            return Ok(false);
        };
        if !conn.has_room() {
            return Err(SignError::Overloaded { class, capacity: self.config.max_in_flight as usize });
        }
        Ok(true)
    }

    fn max_input(&self) -> usize {
        p::MAX_OP_DATA
    }

    fn perform(&self, id: u64, op: &Operation, deadline: Instant) -> Result<Output, SignError> {
        self.conn_for(id, deadline)?.perform(id, op, deadline)
    }

    fn start(&self, id: u64, op: Operation, deadline: Instant, answer: Answer) {
        match self.conn_for(id, deadline) {
            Ok(conn) => conn.send_op(id, &op, deadline, Pending::Op(answer)),
            Err(e) => answer.send(Err(e)),
        }
    }

    /// Tells the key process to forget a key whose last handle is gone.
    fn forget(&self, key_id: u64) {
        let conn = {
            let mut state = self.state();
            state.setup.retain(|s| !matches!(s, Setup::Load(id, _) if *id == key_id));
            state.lost.remove(&key_id);
            state.conn.clone()
        };
        if let Some(conn) = conn {
            conn.unload(key_id);
        }
    }
}

impl Supervisor {
    /// Ends the key process for good: no restart follows, and operations
    /// on its keys, those in flight included, fail with
    /// [`SignError::ShutDown`]. Idempotent.
    pub(super) fn stop(&self) {
        self.closed.store(true, Ordering::Release);
        let conn = self.state().conn.take();
        if let Some(conn) = conn {
            // Before the connection ends, so that its reader fails what
            // is in flight as shut down, not as a crash.
            conn.close_by_owner();
            // The key process would read end-of-file and exit by itself,
            // but perhaps after this process has gone, and then anything
            // it prints lands on a terminal whose command has finished.
            // It holds nothing that outlives it: end it and reap it now.
            end(&conn);
        }
        // Whoever waits for a restart learns now that none is coming.
        self.changed.notify_all();
    }
}

impl Drop for Supervisor {
    /// Ends the key process, then joins its reader, which sees the socket
    /// close (and, the supervisor being gone, starts no other).
    fn drop(&mut self) {
        self.stop();
        self.readers.get_mut().unwrap_or_else(|e| e.into_inner()).join();
    }
}
