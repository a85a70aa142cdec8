//! The key agent (`keyfence agent`): one process per machine or server,
//! run as its own user, that alone reads the machine key and the store,
//! opens envelopes and holds the keys, and signs for many clients on a
//! Unix socket. The key process's protocol on a Unix socket instead of a
//! socket pair: the same frames, the same signing threads, one more key
//! source ([`KeySource::AgentEnvelope`]) and nothing a client names on
//! the agent's disk.
//!
//! Servers whose workers are not root (nginx, Apache as `www-data`) then
//! hold only a socket: no machine key, no store, no private key. Who may
//! connect is decided twice: by the socket file's mode and group, and by
//! the peer's credentials (`SO_PEERCRED` and `SO_PEERGROUPS`) against an
//! allow-list of users and groups, as ssh-agent and h2o's neverbleed
//! daemon do. Each connection has its in-flight bound (its hello's, at
//! most [`AgentConfig::connection_in_flight`]) and each user one over all
//! its connections ([`AgentConfig::user_in_flight`]), so one client's
//! flood is refused while the others are served.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use zeroize::Zeroizing;

use super::protocol::{self as p, kind, ErrorCode};
use super::server::{serve_conn, EnvelopeOpener, Role, ServeOptions, Workers};
use super::sys;
use crate::sign::threads::Joined;
use crate::sign::types::{Resource, SignError};
use crate::sign::pkcs11::{self, Pkcs11Settings};
use crate::sign::PrivateKey;
use crate::wrap::{open_store, CacheConfig, Machine, MachineKey};

/// How an agent runs. [`AgentConfig::new`] fills in the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentConfig {
    /// The socket's path. Its folder must exist (systemd's
    /// `RuntimeDirectory`, `/run/keyfence`); a stale socket left by an
    /// agent that died is replaced, a live agent's never.
    pub socket: PathBuf,
    /// The store envelopes are opened against (a directory or
    /// `etcd://...`).
    pub store: String,
    /// The machine key file, read once at start.
    pub machine_key: PathBuf,
    /// The agent's own state folder (systemd's `StateDirectory`, owned by
    /// the agent's user): the newest lists it accepted are kept there
    /// (`machine.newest`, its lock mode 600), so that a store rolled back
    /// after a restart is refused. Default: none, and they are kept beside
    /// the machine key, which must then be in a folder the agent may
    /// write; an agent that cannot keep them refuses to start.
    pub state_dir: Option<PathBuf>,
    /// Users whose processes may connect, besides the agent's own user and
    /// root (who can read what the agent reads anyway).
    pub allow_users: Vec<u32>,
    /// Groups whose members may connect: the peer's primary group or any
    /// of its supplementary groups.
    pub allow_groups: Vec<u32>,
    /// The socket file's mode. Default 0o660: the agent's user and the
    /// socket's group.
    pub socket_mode: u32,
    /// The socket file's group (default: the agent's).
    pub socket_group: Option<u32>,
    /// RSA signing threads. Default: the core count.
    pub rsa_threads: usize,
    /// EC and Ed25519 signing threads. Default: the core count.
    pub ec_threads: usize,
    /// Connections at once at most; past it a client is refused at once
    /// with `busy`. Default 1024.
    pub max_connections: usize,
    /// Requests one connection may have in flight at most (its hello may
    /// ask fewer). Default 1024.
    pub connection_in_flight: u32,
    /// Requests one user may have in flight over all its connections.
    /// Default 4096.
    pub user_in_flight: usize,
    /// The PKCS#11 module and PIN the agent loads keys with, when its
    /// clients name token keys by URI ([`KeySource::Pkcs11`](super::KeySource::Pkcs11)).
    /// The agent loads this module and reads this PIN file only: a URI
    /// naming another module or PIN file is refused, so a client cannot
    /// make the agent load a library or read a file. Default: none, and
    /// token keys are refused.
    pub pkcs11: Option<Pkcs11Settings>,
}

impl AgentConfig {
    /// An agent on `socket` that opens envelopes with `machine_key`
    /// against `store`; only its own user and root may connect until users
    /// or groups are allowed.
    pub fn new(socket: impl Into<PathBuf>, store: impl Into<String>, machine_key: impl Into<PathBuf>) -> Self {
        let threads = ServeOptions::default();
        AgentConfig {
            socket: socket.into(),
            store: store.into(),
            machine_key: machine_key.into(),
            state_dir: None,
            allow_users: Vec::new(),
            allow_groups: Vec::new(),
            socket_mode: 0o660,
            socket_group: None,
            rsa_threads: threads.rsa_threads,
            ec_threads: threads.ec_threads,
            max_connections: 1024,
            connection_in_flight: 1024,
            user_in_flight: 4096,
            pkcs11: None,
        }
    }
}

/// What an agent has seen since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentStats {
    /// Clients admitted.
    pub accepted: u64,
    /// Clients refused: not allowed, or over the connection bound.
    pub refused: u64,
    /// Connections open now.
    pub open: usize,
}

/// The id of the user `name` (a name, or a number), for
/// [`AgentConfig::allow_users`].
///
/// # Errors
/// No such user.
pub fn user_id(name: &str) -> io::Result<u32> {
    sys::lookup_id(name, false)
}

/// The id of the group `name` (a name, or a number), for
/// [`AgentConfig::allow_groups`] and [`AgentConfig::socket_group`].
///
/// # Errors
/// No such group.
pub fn group_id(name: &str) -> io::Result<u32> {
    sys::lookup_id(name, true)
}

/// Where the agent keeps its machine's newest lists: its state folder, or
/// beside the machine key. Either must take the floor's lock file now: an
/// agent that could not keep the floor would accept, after its next
/// restart, a store rolled back to lists from before a retirement.
fn keep_floor(machine: Machine, config: &AgentConfig) -> Result<Machine, SignError> {
    let (path, hint) = match &config.state_dir {
        Some(dir) => (dir.join("machine.newest"), "make the state folder the agent's own (systemd's StateDirectory=)"),
        None => match crate::wrap::newest_lists_beside(&config.machine_key) {
            Some(path) => (path, "give the agent a state folder it owns: --state-dir (systemd's StateDirectory=)"),
            None => {
                return Err(SignError::Config(format!(
                    "the machine key {} is not a file: the agent keeps its newest lists beside it, or in --state-dir",
                    config.machine_key.display()
                )))
            }
        },
    };
    machine.keep_newest_in(&path).map_err(|e| SignError::Config(format!("{e}; {hint}")))
}

/// Opens envelopes with the agent's machine, and token keys with its
/// PKCS#11 settings.
struct MachineOpener(Machine, Option<Pkcs11Settings>);

impl EnvelopeOpener for MachineOpener {
    fn open(&self, envelope: &[u8]) -> Result<PrivateKey, String> {
        let secret = self.0.open(envelope).map_err(|e| {
            // The floor could not be kept (its folder or lock): the
            // operator's to fix, so it is said here too, not only to the
            // client.
            if e.code() == crate::ErrorCode::StoreIo {
                tracing::warn!(error = %e, "an envelope was not opened: the store or the newest lists' file failed");
            }
            format!("{}: {e}", e.code().name())
        })?;
        PrivateKey::from_bytes(&secret).map_err(|e| format!("the key in the envelope: {e}"))
    }

    fn load_pkcs11(&self, uri: &str) -> Result<PrivateKey, SignError> {
        match &self.1 {
            Some(settings) => pkcs11::load(uri, settings),
            None => Err(SignError::InvalidArgument(
                "this agent was started without a PKCS#11 module (`keyfence agent --pkcs11-module`): it loads no token keys".into(),
            )),
        }
    }
}

struct Inner {
    config: AgentConfig,
    uid: u32,
    stop: AtomicBool,
    workers: Arc<Workers>,
    role: Role,
    /// A clone of each open connection's socket, to end it on stop.
    conns: Mutex<HashMap<u64, UnixStream>>,
    next_conn: AtomicU64,
    conn_threads: Mutex<Joined>,
    users: Mutex<HashMap<u32, Arc<AtomicUsize>>>,
    accepted: AtomicU64,
    refused: AtomicU64,
    /// The socket file's device and inode, so that stopping removes this
    /// agent's socket and never one a later agent made; `None` for a
    /// socket systemd made, which is its to remove.
    socket_id: Option<(u64, u64)>,
}

impl Inner {
    fn conns(&self) -> MutexGuard<'_, HashMap<u64, UnixStream>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running agent; dropping it (or [`Agent::stop`]) ends every
/// connection, joins every thread and removes the socket.
pub struct Agent {
    inner: Arc<Inner>,
    accept: Joined,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("socket", &self.inner.config.socket).field("stats", &self.stats()).finish()
    }
}

impl Agent {
    /// Reads the machine key, opens the store, makes the process
    /// non-dumpable, binds the socket (mode and group as configured) and
    /// starts serving.
    ///
    /// # Errors
    /// [`SignError::Config`] for a machine key or store that cannot be
    /// opened, zero sizes, or a socket path held by a live agent or by a
    /// file that is not a socket; [`SignError::Io`] when the socket cannot
    /// be bound or threads cannot start.
    pub fn start(config: AgentConfig) -> Result<Agent, SignError> {
        Self::start_on(config, None)
    }

    /// As [`Agent::start`], serving `listener` (a socket systemd made and
    /// passed, with its own mode and group: socket activation) instead of
    /// binding [`AgentConfig::socket`], which then only names it in
    /// messages; stopping leaves the socket to its maker.
    ///
    /// # Errors
    /// As [`Agent::start`].
    pub fn with_listener(config: AgentConfig, listener: UnixListener) -> Result<Agent, SignError> {
        Self::start_on(config, Some(listener))
    }

    fn start_on(config: AgentConfig, given: Option<UnixListener>) -> Result<Agent, SignError> {
        if config.max_connections == 0 || config.connection_in_flight == 0 || config.user_in_flight == 0 {
            return Err(SignError::Config("agent sizes (connections, in flight) must be at least 1".into()));
        }
        let mk = Zeroizing::new(std::fs::read(&config.machine_key).map_err(|e| {
            SignError::Config(format!("cannot read the machine key {}: {e}", config.machine_key.display()))
        })?);
        let mk = MachineKey::from_bytes(&mk)
            .map_err(|e| SignError::Config(format!("{}: {e}", config.machine_key.display())))?;
        let store =
            open_store(&config.store).map_err(|e| SignError::Config(format!("cannot open the store {}: {e}", config.store)))?;
        let machine = keep_floor(Machine::new(mk, store, CacheConfig::default()), &config)?;
        // The agent's module and PIN file are the only ones a client's URI
        // may name.
        let pkcs11 = config.pkcs11.clone().map(|mut s| {
            s.fixed = true;
            s
        });
        let opener: Arc<dyn EnvelopeOpener> = Arc::new(MachineOpener(machine, pkcs11));
        // Neither a core dump nor a debugger of the same user reads the keys.
        let _ = sys::set_not_dumpable();
        let _ = sys::disable_core_dumps();
        let (listener, socket_id) = match given {
            Some(l) => (l, None),
            None => {
                let l = bind(&config)?;
                let meta = std::fs::metadata(&config.socket)
                    .map_err(|e| SignError::io(Resource::Socket, format!("{}: {e}", config.socket.display())))?;
                (l, Some((meta.dev(), meta.ino())))
            }
        };
        let options = ServeOptions { rsa_threads: config.rsa_threads, ec_threads: config.ec_threads, check_peer: false, sandbox: false, inherited_closed: false };
        let capacity = (config.connection_in_flight as usize).max(config.user_in_flight);
        let workers = Workers::start(&options, capacity)
            .map_err(|e| SignError::io(Resource::Thread, format!("cannot start the agent's threads: {e}")))?;
        let inner = Arc::new(Inner {
            uid: sys::ids().0,
            config,
            stop: AtomicBool::new(false),
            workers,
            role: Role::Agent(opener),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            conn_threads: Mutex::new(Joined::new()),
            users: Mutex::new(HashMap::new()),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            socket_id,
        });
        let mut accept = Joined::new();
        let i = inner.clone();
        accept
            .spawn("keyfence-agent-accept".into(), move || accept_loop(&i, &listener))
            .map_err(|e| SignError::io(Resource::Thread, format!("cannot start the agent: {e}")))?;
        Ok(Agent { inner, accept })
    }

    /// The socket clients connect to.
    pub fn socket(&self) -> &Path {
        &self.inner.config.socket
    }

    /// Clients admitted and refused, connections open.
    pub fn stats(&self) -> AgentStats {
        AgentStats {
            accepted: self.inner.accepted.load(Ordering::Relaxed),
            refused: self.inner.refused.load(Ordering::Relaxed),
            open: self.inner.conns().len(),
        }
    }

    /// Ends every connection (their requests in flight fail on the
    /// client's side, which reconnects when an agent listens again), joins
    /// every thread and removes the socket. Idempotent.
    pub fn stop(&mut self) {
        let inner = &self.inner;
        if inner.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wakes the accept loop, which sees the flag. (A socket systemd
        // passed may live at another path: its accept thread is let go at
        // the join's bound; the process is ending then anyway.)
        let _ = UnixStream::connect(&inner.config.socket);
        self.accept.join();
        for s in inner.conns().values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        inner.conn_threads.lock().unwrap_or_else(|e| e.into_inner()).join();
        if let Ok(meta) = std::fs::symlink_metadata(&inner.config.socket) {
            if Some((meta.dev(), meta.ino())) == inner.socket_id {
                let _ = std::fs::remove_file(&inner.config.socket);
            }
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds the socket: a stale one (nobody listening) is replaced; a live
/// agent's, or anything that is not a socket, is an error. The mode and
/// group are set before anyone can connect: the socket is bound under a
/// private temporary name in the same folder and renamed into place.
fn bind(config: &AgentConfig) -> Result<UnixListener, SignError> {
    let path = &config.socket;
    let io_err = |what: String| SignError::io(Resource::Socket, what);
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(SignError::Config(format!("{} exists and is not a socket", path.display())));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(SignError::Config(format!("an agent already listens on {}", path.display())));
        }
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(|e| io_err(format!("cannot bind {}: {e}", tmp.display())))?;
    let placed = (|| -> io::Result<()> {
        if let Some(gid) = config.socket_group {
            std::os::unix::fs::chown(&tmp, None, Some(gid))?;
        }
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(config.socket_mode))?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(format!("cannot place the socket at {}: {e}", path.display())));
    }
    Ok(listener)
}

fn accept_loop(inner: &Arc<Inner>, listener: &UnixListener) {
    for stream in listener.incoming() {
        if inner.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = stream else { continue };
        admit(inner, stream);
    }
}

/// Decides on one client and, if admitted, serves it on a thread of its
/// own.
fn admit(inner: &Arc<Inner>, stream: UnixStream) {
    let (pid, uid, gid) = match sys::peer_credentials(&stream) {
        Ok(c) => c,
        Err(_) => return,
    };
    let groups = sys::peer_groups(&stream).unwrap_or_default();
    let c = &inner.config;
    let allowed = uid == inner.uid
        || uid == 0
        || c.allow_users.contains(&uid)
        || c.allow_groups.contains(&gid)
        || groups.iter().any(|g| c.allow_groups.contains(g));
    if !allowed {
        inner.refused.fetch_add(1, Ordering::Relaxed);
        let user = sys::user_name(uid);
        tracing::warn!(%pid, %uid, %user, "refused a client that is not allowed");
        return refuse(
            stream,
            ErrorCode::NotAllowed,
            &format!(
                "user {user} (uid {uid}) is not allowed to use this agent: allow it with --allow-user {user}, or one of its groups with --allow-group"
            ),
        );
    }
    let open = inner.conns().len();
    if open >= c.max_connections {
        inner.refused.fetch_add(1, Ordering::Relaxed);
        return refuse(stream, ErrorCode::Busy, &format!("the agent has its maximum of {} connections open", c.max_connections));
    }
    let Ok(clone) = stream.try_clone() else { return };
    let id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
    inner.conns().insert(id, clone);
    inner.accepted.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(%pid, %uid, "client admitted");
    let user = inner.users.lock().unwrap_or_else(|e| e.into_inner()).entry(uid).or_default().clone();
    let flags = p::flags::AGENT | p::flags::PEER_CHECKED | hardening();
    let i = inner.clone();
    let spawned = inner.conn_threads.lock().unwrap_or_else(|e| e.into_inner()).spawn(format!("keyfence-agent-{id}"), move || {
        let workers = i.workers.clone();
        let result = serve_conn(stream, flags, i.role.clone(), Some((user, i.config.user_in_flight)), i.config.connection_in_flight, |_| {
            Ok(workers)
        });
        if let Err(e) = result {
            tracing::debug!(%pid, error = %e, "client connection ended");
        }
        i.conns().remove(&id);
    });
    if spawned.is_err() {
        inner.conns().remove(&id);
    }
}

/// The hardening flags this process can confirm now.
fn hardening() -> u32 {
    let mut flags = p::flags::NO_CORE;
    if !sys::is_dumpable() {
        flags |= p::flags::NOT_DUMPABLE;
    }
    flags
}

/// Tells a client why it is not served, in place of the hello it waits
/// for, and closes the connection.
fn refuse(stream: UnixStream, code: ErrorCode, why: &str) {
    let mut frame = Vec::new();
    p::encode(&mut frame, kind::ERR, 0, &[&p::error_body(code, why)]);
    let _ = stream.set_write_timeout(Some(std::time::Duration::from_secs(1)));
    let _ = super::sys::send_all(&stream, &frame);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    // Read what the client sent (its hello) until it closes, briefly:
    // closing with its bytes unread would reset the connection, and the
    // client could see the reset before the reason. Briefly, because this
    // is the accept thread: a client that never closes holds it 50 ms.
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_millis(50)));
    let mut sink = [0u8; 512];
    let mut reader = &stream;
    while matches!(std::io::Read::read(&mut reader, &mut sink), Ok(n) if n > 0) {}
}
