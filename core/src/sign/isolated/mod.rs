//! The isolated key process: private keys live in a separate process, and
//! this one keeps only opaque key ids.
//!
//! A memory-disclosure bug in an internet-facing server (Heartbleed is the
//! seed's example) can read any byte of that server's memory. Fastly's
//! answer, neverbleed, moves the keys into a second process that does
//! nothing but sign; keyfence does the same behind the engine's
//! [`Backend`] interface:
//!
//! - [`KeyProcess::start`] spawns the key process (`keyfence-keyd`, or
//!   `keyfence key-process`) with one end of a socket pair as its standard
//!   input. It makes itself non-dumpable (no core dumps, no same-user
//!   ptrace), checks that its peer is its parent as the same user, and can
//!   drop privileges on request ([`KeyProcess::drop_privileges`]).
//! - [`KeyProcess::load`] has the key process read a key file or open a
//!   keyfence envelope itself; the caller gets an `Arc<PrivateKey>` that is
//!   only a handle. The [`Engine`](crate::sign::Engine) sends every
//!   operation on such a key to its key process.
//! - Requests carry ids and replies come in any order (an RSA signature
//!   never holds up an ECDSA reply), each with its deadline; in-flight
//!   requests are bounded per connection. The protocol is in
//!   [`protocol`] and `docs/isolation.md`.
//! - If the key process dies, every operation in flight fails at once with
//!   a [`SignError::Backend`] error saying so, a new key process starts,
//!   the keys are loaded again from their sources, and later operations
//!   succeed.
//!
//! ```no_run
//! use keyfence::sign::{Algorithm, Engine, EngineConfig};
//! use keyfence::sign::isolated::{IsolatedConfig, KeyProcess, KeySource};
//!
//! let keys = KeyProcess::start(IsolatedConfig::default())?;
//! let key = keys.load(KeySource::File("/etc/keys/server.pem".into()))?;
//! assert!(!key.is_local());
//! let engine = Engine::new(EngineConfig::default())?;
//! let signature = engine.sign(&key, Algorithm::EcdsaP256Sha256, b"hello")?.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod protocol;
mod server;
mod sys;
mod writer;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use zeroize::Zeroizing;

pub use protocol::{KeySource, Status};
pub use server::{serve, ServeOptions};

use self::protocol::{self as p, kind, ErrorCode, Frame};
use self::writer::FrameWriter;
use super::backend::{Backend, Reply, SoftwareBackend};
use super::error::SignError;
use super::executor::OpClass;
use super::key::{PrivateKey, RemoteKey};
use super::op::{Operation, Output};

/// The backend name in errors and metrics.
const NAME: &str = "isolated";

/// How the key process is started and supervised.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IsolatedConfig {
    /// The key process's program and arguments; it must serve the protocol
    /// on its standard input ([`key_process_main`]). Default: the
    /// `KEYFENCE_KEYD` environment variable, else `keyfence-keyd` next to
    /// the running program (or one directory up, for test binaries), else
    /// `keyfence-keyd` on `PATH`.
    pub command: Vec<OsString>,
    /// Requests in flight on the connection at most; further operations
    /// wait for room on their executor thread (so the executor queue fills
    /// and callers are told `overloaded`). Default 1024.
    pub max_in_flight: u32,
    /// RSA signing threads in the key process. Default: the core count.
    pub rsa_threads: usize,
    /// EC and Ed25519 signing threads in the key process. Default: the
    /// core count.
    pub ec_threads: usize,
    /// Start a new key process when one dies. Default true.
    pub restart: bool,
    /// How long to wait for a new key process's hello, and for each key
    /// load. Default 10 s.
    pub start_timeout: Duration,
    /// How long an operation submitted while the key process restarts
    /// waits for it (never past its own deadline). Default 500 ms.
    pub restart_wait: Duration,
}

impl Default for IsolatedConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        IsolatedConfig {
            command: vec![default_program().into_os_string()],
            max_in_flight: 1024,
            rsa_threads: cores,
            ec_threads: cores,
            restart: true,
            start_timeout: Duration::from_secs(10),
            restart_wait: Duration::from_millis(500),
        }
    }
}

impl IsolatedConfig {
    /// The default configuration with another key-process command, for
    /// example `[current_exe, "key-process"]`.
    pub fn with_command<I, S>(command: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        IsolatedConfig { command: command.into_iter().map(Into::into).collect(), ..Self::default() }
    }
}

fn default_program() -> PathBuf {
    if let Some(p) = std::env::var_os("KEYFENCE_KEYD") {
        return p.into();
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            let candidate = dir.join("keyfence-keyd");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    PathBuf::from("keyfence-keyd")
}

/// One setup step, replayed in order on a new key process.
#[derive(Debug, Clone)]
enum Setup {
    Load(u64, KeySource),
    DropPrivileges(u32, u32),
}

/// What waits for a reply.
enum Pending {
    /// An engine operation.
    Op(Reply),
    /// A synchronous operation ([`Backend::perform`]); holds a slot.
    OpCall(Sender<Result<Frame, SignError>>),
    /// A synchronous request other than an operation (load, status).
    Call(Sender<Result<Frame, SignError>>),
}

impl Pending {
    /// Answers with an error.
    fn fail(self, e: SignError) {
        match self {
            Pending::Op(reply) => reply.send(Err(e)),
            Pending::OpCall(tx) | Pending::Call(tx) => {
                let _ = tx.send(Err(e));
            }
        }
    }
}

/// One running key process and the connection to it.
struct Conn {
    pid: u32,
    flags: u32,
    child: Mutex<Child>,
    writer: FrameWriter,
    pending: Mutex<HashMap<u64, Pending>>,
    dead: AtomicBool,
    free_slots: Mutex<u32>,
    slot_freed: Condvar,
}

impl Conn {
    fn pending(&self) -> MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `pending` under `id` unless the connection is dead.
    fn register(&self, id: u64, pending: Pending) -> Result<(), Pending> {
        let mut map = self.pending();
        if self.dead.load(Ordering::Acquire) {
            return Err(pending);
        }
        map.insert(id, pending);
        Ok(())
    }

    fn acquire_slot(&self, deadline: Instant) -> bool {
        let mut free = self.free_slots.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.dead.load(Ordering::Acquire) {
                return false;
            }
            if *free > 0 {
                *free -= 1;
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            free = self.slot_freed.wait_timeout(free, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn release_slot(&self) {
        *self.free_slots.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.slot_freed.notify_one();
    }
}

struct State {
    conn: Option<Arc<Conn>>,
    setup: Vec<Setup>,
    /// Keys loaded from bytes: a restart loses them.
    from_bytes: HashSet<u64>,
    /// Keys a restart lost.
    lost: HashSet<u64>,
    /// Why the last key process ended, for status and errors.
    last_exit: Option<String>,
}

struct Inner {
    config: IsolatedConfig,
    state: Mutex<State>,
    changed: Condvar,
    next_request: AtomicU64,
    next_key: AtomicU64,
    restarts: AtomicU64,
    closed: AtomicBool,
}

/// A running isolated key process, restarted when it dies. Cheap to
/// clone; the process is told to exit when the last clone and the last key
/// handle from it are gone.
#[derive(Clone)]
pub struct KeyProcess {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KeyProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyProcess").field("pid", &self.pid()).field("restarts", &self.restarts()).finish()
    }
}

fn backend_error(reason: impl Into<String>) -> SignError {
    SignError::Backend { backend: NAME.into(), reason: reason.into() }
}

impl KeyProcess {
    /// Starts the key process and waits for its hello.
    ///
    /// # Errors
    /// [`SignError::Config`] for an empty command or zero sizes;
    /// [`SignError::Io`] when the process cannot be started, does not
    /// answer in [`IsolatedConfig::start_timeout`], or speaks another
    /// protocol version.
    pub fn start(config: IsolatedConfig) -> Result<Self, SignError> {
        if config.command.is_empty() {
            return Err(SignError::Config("isolated.command is empty".into()));
        }
        if config.max_in_flight == 0 || config.rsa_threads == 0 || config.ec_threads == 0 {
            return Err(SignError::Config("isolated sizes (max_in_flight, threads) must be at least 1".into()));
        }
        let inner = Arc::new(Inner {
            config,
            state: Mutex::new(State {
                conn: None,
                setup: Vec::new(),
                from_bytes: HashSet::new(),
                lost: HashSet::new(),
                last_exit: None,
            }),
            changed: Condvar::new(),
            next_request: AtomicU64::new(1),
            next_key: AtomicU64::new(1),
            restarts: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        let conn = Inner::spawn(&inner)?;
        inner.state().conn = Some(conn);
        Ok(KeyProcess { inner })
    }

    /// Has the key process load a key and returns a handle on it. Keys
    /// from a file or an envelope are loaded again after a restart; keys
    /// from bytes are not (this process does not keep them), and
    /// operations on them fail after a restart until they are loaded
    /// again.
    ///
    /// # Errors
    /// [`SignError::Backend`] with the key process's reason (file not
    /// found, not a key, envelope not openable by this machine key) or
    /// because the key process is not running.
    pub fn load(&self, source: KeySource) -> Result<Arc<PrivateKey>, SignError> {
        let key_id = self.inner.next_key.fetch_add(1, Ordering::Relaxed);
        let conn = self.inner.live_conn(Instant::now() + self.inner.config.start_timeout)?;
        let body = p::load_request(key_id, &source);
        let frame = self.inner.call(&conn, kind::LOAD, &body, self.inner.config.start_timeout)?;
        let (kind, public_der) =
            p::parse_loaded_reply(&frame.body).map_err(|e| backend_error(format!("bad load reply: {e}")))?;
        if source.reloadable() {
            self.inner.state().setup.push(Setup::Load(key_id, source));
        } else {
            self.inner.state().from_bytes.insert(key_id);
        }
        let weak = Arc::downgrade(&self.inner);
        let remote = RemoteKey {
            backend: self.inner.clone(),
            id: key_id,
            public_der,
            on_drop: Some(Box::new(move |id| {
                if let Some(inner) = weak.upgrade() {
                    inner.forget(id);
                }
            })),
        };
        Ok(Arc::new(PrivateKey::remote(kind, remote)))
    }

    /// Has the key process drop to `uid` and `gid` (it must be running as
    /// root to do so). Keys loaded before stay loaded; later loads read
    /// their sources as that user. Replayed in order after a restart.
    ///
    /// # Errors
    /// [`SignError::Backend`] if the key process refuses.
    pub fn drop_privileges(&self, uid: u32, gid: u32) -> Result<(), SignError> {
        let conn = self.inner.live_conn(Instant::now() + self.inner.config.start_timeout)?;
        let body = [uid.to_be_bytes(), gid.to_be_bytes()].concat();
        self.inner.call(&conn, kind::DROP_PRIVILEGES, &body, self.inner.config.start_timeout)?;
        self.inner.state().setup.push(Setup::DropPrivileges(uid, gid));
        Ok(())
    }

    /// The key process's own account of itself: pid, ids, hardening
    /// flags, keys, requests in flight.
    ///
    /// # Errors
    /// [`SignError::Backend`] if it is not running or does not answer.
    pub fn status(&self) -> Result<Status, SignError> {
        let conn = self.inner.live_conn(Instant::now() + self.inner.config.start_timeout)?;
        let frame = self.inner.call(&conn, kind::STATUS, &[], self.inner.config.start_timeout)?;
        Status::parse(&frame.body).map_err(|e| backend_error(format!("bad status reply: {e}")))
    }

    /// The running key process's pid, if one is running.
    pub fn pid(&self) -> Option<u32> {
        self.inner.state().conn.as_ref().filter(|c| !c.dead.load(Ordering::Acquire)).map(|c| c.pid)
    }

    /// The hardening the running key process confirmed in its hello
    /// ([`protocol::flags`]).
    pub fn hardening_flags(&self) -> Option<u32> {
        self.inner.state().conn.as_ref().map(|c| c.flags)
    }

    /// How many times the key process has been started again.
    pub fn restarts(&self) -> u64 {
        self.inner.restarts.load(Ordering::Relaxed)
    }

    /// How the last key process ended, if one has.
    pub fn last_exit(&self) -> Option<String> {
        self.inner.state().last_exit.clone()
    }

    /// The key process as an engine backend, for
    /// [`Engine::with_backend`](crate::sign::Engine::with_backend). Keys
    /// from [`KeyProcess::load`] go to it in any case.
    pub fn backend(&self) -> Arc<dyn Backend> {
        self.inner.clone()
    }

    /// Waits until a key process is running (after a restart), up to
    /// `timeout`; true if one is.
    pub fn wait_running(&self, timeout: Duration) -> bool {
        self.inner.live_conn(Instant::now() + timeout).is_ok()
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a key process, exchanges hellos and starts its reader.
    fn spawn(self: &Arc<Self>) -> Result<Arc<Conn>, SignError> {
        let config = &self.config;
        let (ours, theirs) = UnixStream::pair().map_err(|e| SignError::Io(format!("socketpair: {e}")))?;
        let mut cmd = Command::new(&config.command[0]);
        cmd.args(&config.command[1..])
            .arg("--rsa-threads")
            .arg(config.rsa_threads.to_string())
            .arg("--ec-threads")
            .arg(config.ec_threads.to_string())
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = cmd.spawn().map_err(|e| {
            SignError::Io(format!("cannot start the key process {}: {e}", config.command[0].to_string_lossy()))
        })?;
        // The command still holds the child's end of the pair; while it
        // does, a child that dies before its hello is not seen to.
        drop(cmd);
        let pid = child.id();
        let mut child = child;
        let kill = |child: &mut Child| {
            let _ = child.kill();
            let _ = child.wait();
        };

        let mut hello = Vec::new();
        p::encode(&mut hello, kind::HELLO, 0, &[&p::hello_request(config.max_in_flight)]);
        let handshake = (|| -> io::Result<(u32, u32, p::Decoder)> {
            use std::io::Write;
            (&ours).write_all(&hello)?;
            ours.set_read_timeout(Some(config.start_timeout))?;
            let mut decoder = p::Decoder::new();
            let mut buf = [0u8; 256];
            let frame = loop {
                if let Some(f) = decoder.next_frame().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))? {
                    break f;
                }
                let n = (&ours).read(&mut buf)?;
                if n == 0 {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "it exited before its hello"));
                }
                decoder.push(&buf[..n]);
            };
            ours.set_read_timeout(None)?;
            if frame.kind == kind::ERR {
                let (_, msg) = p::parse_error(&frame.body);
                return Err(io::Error::new(io::ErrorKind::InvalidData, format!("it refused the hello: {msg}")));
            }
            let (their_pid, flags) = p::parse_hello_reply(&frame.body)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if frame.kind != kind::HELLO || their_pid != pid {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("the hello came from pid {their_pid}, not the process started ({pid})"),
                ));
            }
            Ok((their_pid, flags, decoder))
        })();
        let (pid, flags, decoder) = match handshake {
            Ok(v) => v,
            Err(e) => {
                kill(&mut child);
                return Err(SignError::Io(format!("the key process did not start: {e}")));
            }
        };
        let reader = match ours.try_clone() {
            Ok(r) => r,
            Err(e) => {
                kill(&mut child);
                return Err(SignError::Io(format!("cannot clone the key-process socket: {e}")));
            }
        };
        let writer = match FrameWriter::new(ours) {
            Ok(w) => w,
            Err(e) => {
                kill(&mut child);
                return Err(SignError::Io(format!("cannot start the key-process writer: {e}")));
            }
        };
        let conn = Arc::new(Conn {
            pid,
            flags,
            child: Mutex::new(child),
            writer,
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            free_slots: Mutex::new(config.max_in_flight),
            slot_freed: Condvar::new(),
        });
        let (weak, c) = (Arc::downgrade(self), conn.clone());
        let started = std::thread::Builder::new()
            .name(format!("keyfence-keyd-{pid}"))
            .spawn(move || read_replies(weak, c, reader, decoder));
        if let Err(e) = started {
            conn.writer.shutdown();
            let mut child = conn.child.lock().unwrap_or_else(|e| e.into_inner());
            let _ = child.kill();
            let _ = child.wait();
            return Err(SignError::Io(format!("cannot start the key-process reader: {e}")));
        }
        Ok(conn)
    }

    /// The live connection, waiting for a restart in progress until
    /// `deadline`.
    fn live_conn(&self, deadline: Instant) -> Result<Arc<Conn>, SignError> {
        let mut state = self.state();
        loop {
            if let Some(conn) = state.conn.as_ref().filter(|c| !c.dead.load(Ordering::Acquire)) {
                return Ok(conn.clone());
            }
            if self.closed.load(Ordering::Acquire) || !self.config.restart {
                let why = state.last_exit.clone().unwrap_or_else(|| "it is not running".into());
                return Err(backend_error(format!("the key process is gone ({why})")));
            }
            let now = Instant::now();
            if now >= deadline {
                let why = state.last_exit.clone().unwrap_or_else(|| "starting".into());
                return Err(backend_error(format!("the key process is restarting (last exit: {why})")));
            }
            state = self.changed.wait_timeout(state, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Sends a request and waits for its reply frame.
    fn call(&self, conn: &Conn, kind: u8, body: &[u8], timeout: Duration) -> Result<Frame, SignError> {
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = crossbeam_channel::bounded(1);
        if conn.register(id, Pending::Call(tx)).is_err() {
            return Err(backend_error("the key process died"));
        }
        let mut frame = Zeroizing::new(Vec::with_capacity(p::HEADER + 4 + body.len()));
        p::encode(&mut frame, kind, id, &[body]);
        if !conn.writer.send(&frame) {
            conn.pending().remove(&id);
            return Err(backend_error("cannot write to the key process"));
        }
        let reply = match rx.recv_timeout(timeout) {
            Ok(r) => r?,
            Err(_) => {
                conn.pending().remove(&id);
                return Err(SignError::TimedOut { timeout });
            }
        };
        if reply.kind == kind::ERR {
            let (code, msg) = p::parse_error(&reply.body);
            return Err(reply_error(code, msg, timeout));
        }
        Ok(reply)
    }

    /// Tells the key process to forget a key whose last handle is gone.
    fn forget(&self, key_id: u64) {
        let conn = {
            let mut state = self.state();
            state.setup.retain(|s| !matches!(s, Setup::Load(id, _) if *id == key_id));
            state.lost.remove(&key_id);
            state.from_bytes.remove(&key_id);
            state.conn.clone()
        };
        if let Some(conn) = conn {
            // Nobody waits for the answer; the reader drops it.
            let id = self.next_request.fetch_add(1, Ordering::Relaxed);
            let mut frame = Vec::new();
            p::encode(&mut frame, kind::UNLOAD, id, &[&key_id.to_be_bytes()]);
            conn.writer.send(&frame);
        }
    }

    /// Replays the setup script on a new connection.
    fn replay(&self, conn: &Conn, setup: &[Setup]) -> Result<Vec<u64>, SignError> {
        let mut lost = Vec::new();
        for step in setup {
            match step {
                Setup::Load(key_id, source) => {
                    let body = p::load_request(*key_id, source);
                    // A source that went away (file deleted, envelope
                    // revoked) loses that key; the others live on.
                    match self.call(conn, kind::LOAD, &body, self.config.start_timeout) {
                        Ok(_) => {}
                        Err(SignError::Backend { .. }) => lost.push(*key_id),
                        Err(e) => return Err(e),
                    }
                }
                Setup::DropPrivileges(uid, gid) => {
                    let body = [uid.to_be_bytes(), gid.to_be_bytes()].concat();
                    self.call(conn, kind::DROP_PRIVILEGES, &body, self.config.start_timeout)?;
                }
            }
        }
        Ok(lost)
    }

    fn send_op(&self, key: &PrivateKey, op: &Operation, deadline: Instant, pending: Pending) {
        let fail = |pending: Pending, e: SignError| pending.fail(e);
        let Some(key_id) = key.remote_id() else {
            return fail(pending, backend_error("the key is not held by a key process"));
        };
        let wait_until = deadline.min(Instant::now() + self.config.restart_wait);
        let conn = match self.live_conn(wait_until) {
            Ok(c) => c,
            Err(e) => return fail(pending, e),
        };
        if self.state().lost.contains(&key_id) {
            return fail(
                pending,
                backend_error(
                    "the key was loaded from bytes and was lost when the key process restarted; load it again",
                ),
            );
        }
        if !conn.acquire_slot(deadline) {
            let e = if conn.dead.load(Ordering::Acquire) {
                backend_error("the key process died")
            } else {
                backend_error("no room: the key process has max_in_flight requests outstanding")
            };
            return fail(pending, e);
        }
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        if let Err(pending) = conn.register(id, pending) {
            conn.release_slot();
            return fail(pending, backend_error("the key process died"));
        }
        let mut frame = Zeroizing::new(Vec::with_capacity(p::HEADER + 15 + op.input_len()));
        p::encode_op(&mut frame, id, key_id, deadline.saturating_duration_since(Instant::now()), op);
        // If the write fails, the reader fails whatever is registered when
        // it sees the connection end.
        conn.writer.send(&frame);
    }
}

/// Maps an ERR reply to the engine's errors.
fn reply_error(code: ErrorCode, msg: String, timeout: Duration) -> SignError {
    match code {
        ErrorCode::Crypto => SignError::Crypto(msg),
        ErrorCode::TimedOut => SignError::TimedOut { timeout },
        _ => backend_error(msg),
    }
}

impl Backend for Inner {
    fn name(&self) -> &str {
        NAME
    }

    /// RSA keys on the RSA executor, the others on the EC executor: the
    /// executor threads only write the request, so they stay free, and the
    /// classes stay apart as they are in the key process.
    fn class(&self, key: &PrivateKey, op: &Operation) -> OpClass {
        SoftwareBackend.class(key, op)
    }

    /// Started on the submitting thread when a key process is running and
    /// has room: `start` then only writes the request. Refused at once
    /// with `overloaded` when `max_in_flight` requests are outstanding;
    /// queued on the executor (to wait for the restart) when the key
    /// process is down.
    fn admit(&self, key: &PrivateKey, op: &Operation) -> Result<bool, SignError> {
        let state = self.state();
        let Some(conn) = state.conn.as_ref().filter(|c| !c.dead.load(Ordering::Acquire)) else {
            return Ok(false);
        };
        if *conn.free_slots.lock().unwrap_or_else(|e| e.into_inner()) == 0 {
            return Err(SignError::Overloaded {
                class: self.class(key, op),
                capacity: self.config.max_in_flight as usize,
            });
        }
        Ok(true)
    }

    fn perform(&self, key: &PrivateKey, op: &Operation, deadline: Instant) -> Result<Output, SignError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send_op(key, op, deadline, Pending::OpCall(tx));
        let timeout = deadline.saturating_duration_since(Instant::now());
        let frame = rx.recv_timeout(timeout).map_err(|_| SignError::TimedOut { timeout })??;
        if frame.kind == kind::ERR {
            let (code, msg) = p::parse_error(&frame.body);
            return Err(reply_error(code, msg, timeout));
        }
        Ok(Zeroizing::new(frame.body))
    }

    fn start(&self, key: Arc<PrivateKey>, op: Operation, reply: Reply) {
        let deadline = reply.deadline();
        self.send_op(&key, &op, deadline, Pending::Op(reply));
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Release);
        if let Some(conn) = self.state().conn.take() {
            // The key process reads end-of-file and exits; the reader
            // thread reaps it.
            conn.writer.shutdown();
        }
    }
}

/// The reader thread of one connection: delivers replies; when the
/// connection ends, fails what is in flight and starts a new key process.
fn read_replies(inner: Weak<Inner>, conn: Arc<Conn>, mut stream: UnixStream, mut decoder: p::Decoder) {
    let mut buf = vec![0u8; 64 * 1024];
    let end: String = 'read: loop {
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => deliver(&conn, frame),
                Ok(None) => break,
                Err(e) => break 'read format!("it sent a bad frame ({e})"),
            }
        }
        match stream.read(&mut buf) {
            Ok(0) => break "it closed the connection".to_string(),
            Ok(n) => decoder.push(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break format!("reading from it failed: {e}"),
        }
    };
    buf.iter_mut().for_each(|b| *b = 0);

    // Fail everything in flight at once: nothing waits for a dead process.
    let drained: Vec<Pending> = {
        let mut map = conn.pending();
        conn.dead.store(true, Ordering::Release);
        map.drain().map(|(_, p)| p).collect()
    };
    conn.slot_freed.notify_all();
    conn.writer.shutdown();
    let message = format!("the key process (pid {}) died: {end}", conn.pid);
    for pending in drained {
        pending.fail(backend_error(message.clone()));
    }
    // Reap it, and say how it ended.
    let status = {
        let mut child = conn.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        child.wait().map(|s| s.to_string()).unwrap_or_else(|e| format!("unknown ({e})"))
    };
    let Some(inner) = inner.upgrade() else { return };
    let exit = format!("pid {} {end}; {status}", conn.pid);
    inner.state().last_exit = Some(exit);
    inner.changed.notify_all();
    if inner.closed.load(Ordering::Acquire) || !inner.config.restart {
        return;
    }
    restart(&inner);
}

/// Starts a new key process and reloads the keys, backing off from 10 ms
/// to 1 s between failed attempts, until it works or the owner is gone.
fn restart(inner: &Arc<Inner>) {
    let mut backoff = Duration::from_millis(10);
    loop {
        if inner.closed.load(Ordering::Acquire) || Arc::strong_count(inner) == 1 {
            return;
        }
        if let Ok(conn) = Inner::spawn(inner) {
            let setup = inner.state().setup.clone();
            match inner.replay(&conn, &setup) {
                Ok(lost) => {
                    let mut state = inner.state();
                    let from_bytes = std::mem::take(&mut state.from_bytes);
                    state.lost.extend(from_bytes);
                    state.lost.extend(lost);
                    state.conn = Some(conn);
                    drop(state);
                    inner.restarts.fetch_add(1, Ordering::Relaxed);
                    inner.changed.notify_all();
                    return;
                }
                Err(_) => conn.writer.shutdown(),
            }
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

/// Delivers one reply frame to whoever waits for it.
fn deliver(conn: &Conn, frame: Frame) {
    let Some(pending) = conn.pending().remove(&frame.id) else {
        // A reply nobody waits for (an unload, or a call that gave up).
        return;
    };
    if matches!(pending, Pending::Op(_) | Pending::OpCall(_)) {
        conn.release_slot();
    }
    match pending {
        Pending::Op(reply) => {
            if frame.kind == kind::OK {
                reply.send(Ok(Zeroizing::new(frame.body)));
            } else {
                let (code, msg) = p::parse_error(&frame.body);
                reply.send(Err(reply_error(code, msg, Duration::ZERO)));
            }
        }
        Pending::OpCall(tx) | Pending::Call(tx) => {
            if matches!(frame.kind, kind::OK | kind::ERR) {
                let _ = tx.send(Ok(frame));
            } else {
                let _ = tx.send(Err(backend_error(format!("unexpected reply kind {:#04x}", frame.kind))));
            }
        }
    }
}

/// The key process's `main`: serves the protocol on standard input (the
/// socket the engine passed) until the engine closes it. `keyfence-keyd`
/// and `keyfence key-process` are this function. Arguments:
/// `--rsa-threads N`, `--ec-threads N`.
pub fn key_process_main<I: IntoIterator<Item = OsString>>(args: I) -> ExitCode {
    let mut options = ServeOptions::default();
    let mut args = args.into_iter().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().and_then(|v| v.into_string().ok()).and_then(|v| v.parse::<usize>().ok());
        match (arg.to_str(), value) {
            (Some("--rsa-threads"), Some(n)) if (1..=1024).contains(&n) => options.rsa_threads = n,
            (Some("--ec-threads"), Some(n)) if (1..=1024).contains(&n) => options.ec_threads = n,
            _ => {
                eprintln!("keyfence key process: usage: --rsa-threads N --ec-threads N (1 to 1024), socket on stdin");
                return ExitCode::from(2);
            }
        }
    }
    let stdin = match io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("keyfence key process: standard input: {e}");
            return ExitCode::from(2);
        }
    };
    match serve(UnixStream::from(stdin), &options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keyfence key process: {e}");
            ExitCode::FAILURE
        }
    }
}
