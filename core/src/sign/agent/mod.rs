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
//! daemon do.
//!
//! Its clients are local users who do not trust each other, so no user
//! may take what the others need: connections, operations in flight,
//! key loads waiting and keys held are bounded per user as well as in
//! all ([`AgentConfig`]); a refusal is written and waited on by the
//! [`poller`], never on the accept thread; replies never block a signing
//! thread (a client that leaves them unread is cut off); a hello must
//! come whole in time. Token keys are granted per user or group
//! ([`grants`]).
//!
//! It follows its store ([`Machine::follow`]): a retired policy key is
//! seen within seconds, and an envelope a client holds from before a
//! re-wrap is opened from the store's copy ([`Machine::open_current`]).

mod grants;
mod hush;
mod poller;
mod service;
mod status;
mod watch;

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use zeroize::Zeroizing;

pub use self::grants::{Grantee, TokenGrant};
use self::hush::Hush;
use self::poller::{Poller, Refusal};
use self::service::AgentService;
pub use self::status::{status, AgentStatus};
use crate::sign::key_process::protocol as p;
use crate::sign::key_process::server::budget::{Account, Pool};
use crate::sign::key_process::server::writer::FrameWriter;
use crate::sign::key_process::server::{serve_conn, Client, ConnOptions, Limits, Room, Service, UserShare, Workers, MAX_QUEUED_LOADS};
use crate::sign::pkcs11::Pkcs11Settings;
use crate::sign::sys;
use crate::sign::threads::Joined;
use crate::sign::types::{Resource, SignError};
use crate::wrap::{open_store, CacheConfig, Follower, Machine, MachineKey};

/// How an agent runs. [`AgentConfig::new`] (envelopes) and
/// [`AgentConfig::tokens_only`] fill in the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentConfig {
    /// The socket's path. Its folder must exist (`/run/keyfence`, which the
    /// package's `tmpfiles.d` makes); a stale socket left by an
    /// agent that died is replaced, a live agent's never.
    pub socket: PathBuf,
    /// The store envelopes are opened against (a directory or
    /// `etcd://...`); `None` for an agent that serves token keys only.
    pub store: Option<String>,
    /// The machine key file, read once at start; `None` with `store`.
    pub machine_key: Option<PathBuf>,
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
    /// with `busy`. Default 4096.
    pub max_connections: usize,
    /// Connections one user may have open at once. Default 512: below
    /// `max_connections`, so that one user holding connections open leaves
    /// room for the others.
    pub user_connections: usize,
    /// Requests one connection may have in flight at most (its hello may
    /// ask fewer). Default 1024.
    pub connection_in_flight: u32,
    /// Requests one user may have in flight over all its connections.
    /// Default 4096.
    pub user_in_flight: usize,
    /// Key loads one user may have waiting (a load is a CP-ABE decryption,
    /// milliseconds; two loader threads serve all, taking the users in
    /// turn). Default 256; 4096 in all. A client told `busy` asks again
    /// until its start timeout.
    pub user_loads: usize,
    /// Keys one connection may hold. Default 1024.
    pub connection_keys: usize,
    /// Keys one user may hold over all its connections. Default 16384.
    pub user_keys: usize,
    /// Bytes of the agent's memory one user's connections may make it
    /// hold: frames begun and not yet whole, requests and key loads
    /// waiting, replies not yet read, keys loaded. Past it, the connection
    /// asking for more is refused (`busy`) or cut off. Default 64 MiB.
    pub user_memory: usize,
    /// Bytes all users together may make it hold, as
    /// [`AgentConfig::user_memory`] counts them. Default 256 MiB: four
    /// users at their bound leave room for a fifth. docs/deploy.md has the
    /// agent's worst case.
    pub max_memory: usize,
    /// How long a frame may take to arrive whole once its first byte has
    /// come; a client whose frame is still partial then is cut off (it is
    /// checked whenever its read waits, so between one and two of these
    /// after it began). Default 5 s.
    pub frame_timeout: Duration,
    /// How long a client has to send its whole hello. Default 5 s.
    pub hello_timeout: Duration,
    /// The PKCS#11 module and PIN the agent loads keys with, when its
    /// clients name token keys by URI ([`KeySource::Pkcs11`](super::KeySource::Pkcs11)).
    /// The agent loads this module and reads this PIN file only: a URI
    /// naming another module or PIN file is refused, so a client cannot
    /// make the agent load a library or read a file. Default: none, and
    /// token keys are refused.
    pub pkcs11: Option<Pkcs11Settings>,
    /// Which token keys each user or group may load (`--allow-token`):
    /// none but the agent's own user and root may load a token key no
    /// grant covers. Default: none.
    pub token_grants: Vec<TokenGrant>,
    /// Start even when the store lets the agent read the authority's state
    /// (its master secret keys): for trying keyfence on one machine only.
    /// Default false: such an agent refuses to start, since a server that
    /// can read them can open every envelope whatever its attributes
    /// (servers read a copy: `keyfence authority export`).
    pub unsafe_authority_store: bool,
    /// Whether the agent signs on crypto_mb's multi-buffer device (RSA,
    /// ECDSA P-256 and P-384, eight at a time with AVX-512 IFMA): the agent
    /// signs for every worker of every server on its machine, so its
    /// batches fill. `auto` (the default) where the library is found and
    /// runs on this CPU, `on` or the agent does not start, `off`.
    pub offload: crate::sign::offload::OffloadMode,
    /// crypto_mb's library (a path, or a name the library path finds);
    /// default `KEYFENCE_CRYPTO_MB`, else `libcrypto_mb.so.13`.
    pub crypto_mb: Option<String>,
}

impl AgentConfig {
    /// An agent on `socket` that opens envelopes with `machine_key`
    /// against `store`; only its own user and root may connect until users
    /// or groups are allowed.
    pub fn new(socket: impl Into<PathBuf>, store: impl Into<String>, machine_key: impl Into<PathBuf>) -> Self {
        AgentConfig { store: Some(store.into()), machine_key: Some(machine_key.into()), ..Self::empty(socket.into()) }
    }

    /// An agent on `socket` that serves the keys of one PKCS#11 module's
    /// tokens only: no store, no machine key.
    pub fn tokens_only(socket: impl Into<PathBuf>, pkcs11: Pkcs11Settings) -> Self {
        AgentConfig { pkcs11: Some(pkcs11), ..Self::empty(socket.into()) }
    }

    fn empty(socket: PathBuf) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        AgentConfig {
            socket,
            store: None,
            machine_key: None,
            state_dir: None,
            allow_users: Vec::new(),
            allow_groups: Vec::new(),
            socket_mode: 0o660,
            socket_group: None,
            rsa_threads: cores,
            ec_threads: cores,
            max_connections: 4096,
            user_connections: 512,
            connection_in_flight: 1024,
            user_in_flight: 4096,
            user_loads: MAX_QUEUED_LOADS.0,
            connection_keys: 1024,
            user_keys: 16384,
            user_memory: 64 << 20,
            max_memory: 256 << 20,
            frame_timeout: Duration::from_secs(5),
            hello_timeout: Duration::from_secs(5),
            pkcs11: None,
            token_grants: Vec::new(),
            unsafe_authority_store: false,
            offload: crate::sign::offload::OffloadMode::Auto,
            crypto_mb: None,
        }
    }
}

/// What an agent has seen since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentStats {
    /// Clients admitted.
    pub accepted: u64,
    /// Clients refused: not allowed, or over a connection bound.
    pub refused: u64,
    /// Connections open now.
    pub open: usize,
    /// The descriptors it may open (its soft limit, raised at start to
    /// the hard one).
    pub descriptor_limit: u64,
    /// Bytes its clients make it hold now, as [`AgentConfig::max_memory`]
    /// counts them.
    pub memory: usize,
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
fn keep_floor(machine: Machine, config: &AgentConfig, machine_key: &Path) -> Result<Machine, SignError> {
    let (path, hint) = match &config.state_dir {
        Some(dir) => (dir.join("machine.newest"), "make the state folder the agent's own (systemd's StateDirectory=)"),
        None => match crate::wrap::newest_lists_beside(machine_key) {
            Some(path) => (path, "give the agent a state folder it owns: --state-dir (systemd's StateDirectory=)"),
            None => {
                return Err(SignError::Config(format!(
                    "the machine key {} is not a file: the agent keeps its newest lists beside it, or in --state-dir",
                    machine_key.display()
                )))
            }
        },
    };
    machine.keep_newest_in(&path).map_err(|e| SignError::Config(format!("{e}; {hint}")))
}

struct Inner {
    config: AgentConfig,
    uid: u32,
    /// Why the agent signs in software; `None` on crypto_mb's device.
    software_reason: Option<String>,
    stop: AtomicBool,
    /// Set by [`Agent::drain`]: no connection is accepted any more.
    draining: AtomicBool,
    workers: Arc<Workers>,
    service: Arc<dyn Service>,
    /// The same service, for its machine and its revocation flag.
    agent_service: Arc<AgentService>,
    poller: Arc<Poller>,
    limits: Limits,
    /// Each open connection's socket, to end it on stop.
    conns: Mutex<HashMap<u64, Arc<UnixStream>>>,
    next_conn: AtomicU64,
    conn_threads: Mutex<Joined>,
    users: Mutex<HashMap<u32, Arc<UserShare>>>,
    /// The memory all clients together make the agent hold.
    memory: Arc<Pool>,
    accepted: AtomicU64,
    refused: AtomicU64,
    descriptor_limit: u64,
    /// Descriptors ran out (`accept` failed): said at most every 10 s.
    out_of_fds: Hush,
    /// A connection's thread could not start.
    no_thread: Hush,
    /// The socket file's device and inode, so that stopping removes this
    /// agent's socket and never one a later agent made; `None` for a
    /// socket systemd made, which is its to remove.
    socket_id: Option<(u64, u64)>,
}

impl Inner {
    fn conns(&self) -> MutexGuard<'_, HashMap<u64, Arc<UnixStream>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What `keyfence agent status` prints ([`status`]).
    fn status_json(&self) -> serde_json::Value {
        let users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        let sum = |f: fn(&UserShare) -> usize| users.values().map(|u| f(u)).sum::<usize>();
        let machine = self.agent_service.machine.as_ref().map(|(m, _)| match m.health() {
            Ok(h) => serde_json::json!({
                "id": h.id,
                "generations_held": h.held,
                "generations_live": h.live,
                "revoked": h.revoked,
                "machines_revoked": h.revoked_machines,
                "problem": h.problem(),
            }),
            Err(e) => serde_json::json!({ "id": m.id(), "problem": format!("the store's lists cannot be read: {e}") }),
        });
        serde_json::json!({
            "pid": std::process::id(),
            "socket": self.config.socket,
            "store": self.config.store,
            "machine": machine,
            "keys_loaded": sum(|u| u.keys.load(Ordering::Relaxed)),
            "in_flight": sum(|u| u.in_flight.load(Ordering::Relaxed)),
            "connections": self.conns().len(),
            "users_connected": users.values().filter(|u| u.connections.load(Ordering::Relaxed) > 0).count(),
            "accepted": self.accepted.load(Ordering::Relaxed),
            "refused": self.refused.load(Ordering::Relaxed),
            "memory_bytes": self.memory.used(),
            "token_keys": self.agent_service.pkcs11.is_some(),
            "signing": self.software_reason.as_deref().map_or("crypto_mb's multi-buffer device".to_string(), |why| format!("software: {why}")),
        })
    }

    fn share(&self, uid: u32) -> Arc<UserShare> {
        let memory = self.config.user_memory;
        self.users.lock().unwrap_or_else(|e| e.into_inner()).entry(uid).or_insert_with(|| Arc::new(UserShare::new(memory))).clone()
    }
}

/// A running agent; dropping it (or [`Agent::stop`]) ends every
/// connection, joins every thread and removes the socket.
pub struct Agent {
    inner: Arc<Inner>,
    threads: Joined,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("socket", &self.inner.config.socket).field("stats", &self.stats()).finish()
    }
}

/// Each connection's thread: its reader, and the EC signatures made in
/// place on it (AWS-LC's stack stays well under this).
const CONNECTION_STACK: usize = 256 * 1024;
/// The most bytes of replies a client may leave unread before it is cut
/// off (1,024 RSA-4096 signatures in flight are 0.5 MiB).
const MAX_UNREAD: usize = 2 << 20;
/// Bytes read from a client at a time: a read buffer per connection
/// (thousands of connections, most idle), grown for a frame that is
/// longer and shrunk after it.
const READ_CHUNK: usize = 4 * 1024;

impl Agent {
    /// Raises its descriptor limit, reads the machine key, opens and
    /// follows the store, makes the process non-dumpable, binds the socket
    /// (mode and group as configured) and starts serving. It warns of an
    /// allowed user or group that cannot reach the socket.
    ///
    /// # Errors
    /// [`SignError::Config`] for a machine key or store that cannot be
    /// opened, a floor that cannot be kept, zero sizes, nothing to serve,
    /// or a socket path held by a live agent or by a file that is not a
    /// socket; [`SignError::Io`] when the socket cannot be bound or
    /// threads cannot start.
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
        let sizes = [
            config.max_connections,
            config.user_connections,
            config.connection_in_flight as usize,
            config.user_in_flight,
            config.user_loads,
            config.connection_keys,
            config.user_keys,
            config.user_memory,
            config.max_memory,
        ];
        if sizes.contains(&0) || config.hello_timeout.is_zero() || config.frame_timeout.is_zero() {
            return Err(SignError::Config(
                "agent sizes (connections, in flight, loads, keys, memory, hello and frame timeouts) must be at least 1".into(),
            ));
        }
        if config.user_memory > config.max_memory {
            return Err(SignError::Config("one user's memory bound cannot be more than the agent's in all".into()));
        }
        let max_memory = config.max_memory;
        // Memory a client's connection held goes back to the system when it
        // closes (and after a large frame), not into allocator heaps that
        // only grow.
        sys::return_freed_memory();
        // Before anything is opened: a daemon of many clients must not stop
        // at the soft 1,024 a shell or a unit without LimitNOFILE= gives.
        let descriptor_limit = sys::raise_descriptor_limit().unwrap_or(0);
        tracing::info!(descriptor_limit, "descriptors the agent may open");
        let uid = sys::ids().0;
        let machine = match (&config.store, &config.machine_key) {
            (Some(store), Some(machine_key)) => Some(open_machine(&config, store, machine_key)?),
            (None, None) if config.pkcs11.is_some() => None,
            (None, None) => {
                return Err(SignError::Config(
                    "the agent has nothing to serve: give it a store and a machine key, or a PKCS#11 module".into(),
                ))
            }
            _ => return Err(SignError::Config("the agent needs both a store and a machine key, or neither".into())),
        };
        // The agent's module and PIN file are the only ones a client's URI
        // may name.
        let pkcs11 = config.pkcs11.clone().map(|mut s| {
            s.fixed = true;
            s
        });
        let agent_service = Arc::new(AgentService {
            machine,
            pkcs11,
            grants: config.token_grants.clone(),
            uid,
            revoked: Arc::new(AtomicBool::new(false)),
            refusals: Mutex::new(HashMap::new()),
            agent: std::sync::OnceLock::new(),
        });
        let service: Arc<dyn Service> = agent_service.clone();
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
        // Connections accepted from it carry each sender's credentials
        // with its bytes, from the first: only the process that connected
        // may use a connection (server.rs, `FromOwner`).
        sys::pass_credentials_on(&listener)
            .map_err(|e| SignError::io(Resource::Socket, format!("cannot set SO_PASSCRED on the agent's socket: {e}")))?;
        warn_unreachable(&config);
        // Each signing queue takes a user's whole in-flight bound, and four
        // users' in all: a fifth user still gets in, taking room from the
        // one with the most waiting (fair_queue.rs).
        let per_user = (config.connection_in_flight as usize).max(config.user_in_flight);
        let ops = Room { per_user, total: per_user.saturating_mul(4) };
        let loads = Room { per_user: config.user_loads, total: MAX_QUEUED_LOADS.1 };
        let offload = crate::sign::offload::ServerOffload::prepare(config.offload, config.crypto_mb.as_deref())?;
        let software_reason = offload.software_reason().map(str::to_string);
        let offload = offload.start()?;
        let workers = Workers::start((config.rsa_threads, config.ec_threads), ops, loads, offload)
            .map_err(|e| SignError::io(Resource::Thread, format!("cannot start the agent's threads: {e}")))?;
        let (poller, hears) =
            Poller::new().map_err(|e| SignError::io(Resource::Socket, format!("cannot start the agent's poller: {e}")))?;
        let limits = Limits { user_in_flight: config.user_in_flight, connection_keys: config.connection_keys, user_keys: config.user_keys };
        let inner = Arc::new(Inner {
            uid,
            software_reason,
            config,
            stop: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            workers,
            service,
            agent_service,
            poller: poller.clone(),
            limits,
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            conn_threads: Mutex::new(Joined::new()),
            users: Mutex::new(HashMap::new()),
            memory: Pool::new(max_memory),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            descriptor_limit,
            out_of_fds: Hush::new(),
            no_thread: Hush::new(),
            socket_id,
        });
        let _ = inner.agent_service.agent.set(Arc::downgrade(&inner));
        let mut threads = Joined::new();
        let start_err = |e: io::Error| SignError::io(Resource::Thread, format!("cannot start the agent: {e}"));
        threads.spawn("keyfence-agent-poller".into(), move || poller.run(&hears)).map_err(start_err)?;
        if inner.agent_service.machine.is_some() {
            // Its first look is made here, so a stranded or revoked machine
            // is said at start, before any client asks.
            let mut last = watch::look(&inner, None);
            let i = inner.clone();
            if let Err(e) = threads.spawn("keyfence-agent-watch".into(), move || watch::run(&i, &mut last)) {
                inner.poller.stop();
                return Err(start_err(e));
            }
        }
        let i = inner.clone();
        if let Err(e) = threads.spawn("keyfence-agent-accept".into(), move || accept_loop(&i, &listener)) {
            inner.poller.stop();
            return Err(start_err(e));
        }
        Ok(Agent { inner, threads })
    }

    /// The socket clients connect to.
    pub fn socket(&self) -> &Path {
        &self.inner.config.socket
    }

    /// Why the agent signs RSA and ECDSA in software (`offload mode is
    /// off`, or why `auto` found no device: no library, a CPU without
    /// AVX-512 IFMA); `None` when they go to crypto_mb's multi-buffer
    /// device.
    pub fn software_reason(&self) -> Option<&str> {
        self.inner.software_reason.as_deref()
    }

    /// Clients admitted and refused, connections open, descriptor limit.
    pub fn stats(&self) -> AgentStats {
        AgentStats {
            accepted: self.inner.accepted.load(Ordering::Relaxed),
            refused: self.inner.refused.load(Ordering::Relaxed),
            open: self.inner.conns().len(),
            descriptor_limit: self.inner.descriptor_limit,
            memory: self.inner.memory.used(),
        }
    }

    /// Stops taking connections (under systemd, new ones wait in the
    /// socket's backlog for the next agent), stops reading requests, and
    /// waits at most `within` for the answers to every request already
    /// read; then [`Agent::stop`]. What a restart (SIGTERM) does, so that
    /// it loses no signature a client had asked for. Returns whether every
    /// answer was given in time.
    pub fn drain(&mut self, within: Duration) -> bool {
        let inner = &self.inner;
        if !inner.draining.swap(true, Ordering::AcqRel) {
            // Wakes the accept loop, which sees the flag and returns.
            let _ = UnixStream::connect(&inner.config.socket);
        }
        for s in inner.conns().values() {
            let _ = s.shutdown(std::net::Shutdown::Read);
        }
        let since = std::time::Instant::now();
        let drained = loop {
            if self.in_flight() == 0 {
                break true;
            }
            if since.elapsed() >= within {
                break false;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        self.stop();
        drained
    }

    /// Requests in flight over every connection.
    pub fn in_flight(&self) -> usize {
        self.inner.users.lock().unwrap_or_else(|e| e.into_inner()).values().map(|u| u.in_flight.load(Ordering::Acquire)).sum()
    }

    /// The agent's machine key's standing by its store (`None` for an
    /// agent of token keys only, or when the store cannot be read: the
    /// log says why).
    pub fn machine_health(&self) -> Option<crate::wrap::MachineHealth> {
        let (machine, _) = self.inner.agent_service.machine.as_ref()?;
        machine.health().ok()
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
        inner.poller.stop();
        self.threads.join();
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

/// Reads the machine key, opens the store, keeps the floor and follows
/// the store's changes.
fn open_machine(config: &AgentConfig, store: &str, machine_key: &Path) -> Result<(Arc<Machine>, Follower), SignError> {
    let mk = Zeroizing::new(
        std::fs::read(machine_key).map_err(|e| SignError::Config(format!("cannot read the machine key {}: {e}", machine_key.display())))?,
    );
    let mk = MachineKey::from_bytes(&mk).map_err(|e| SignError::Config(format!("{}: {e}", machine_key.display())))?;
    let opened = open_store(store).map_err(|e| SignError::Config(format!("cannot open the store {store}: {e}")))?;
    match crate::wrap::holds_readable_authority(&*opened) {
        Ok(false) => {}
        Ok(true) if config.unsafe_authority_store => tracing::warn!(
            %store,
            "this agent can read the authority's secrets in its store: it can open every envelope, whatever its attributes (--unsafe-authority-store)"
        ),
        Ok(true) => {
            return Err(SignError::Config(format!(
                "the store {store} holds the authority's secrets (authority/state) and this agent can read them: a server that can is its own authority. Serve from a servers' copy (keyfence authority export --store {store} --to COPY), or, to try keyfence on one machine, pass --unsafe-authority-store"
            )))
        }
        Err(e) => return Err(SignError::Config(format!("cannot read the store {store}: {e}"))),
    }
    let machine = Arc::new(keep_floor(Machine::new(mk, opened, CacheConfig::default()), config, machine_key)?);
    // A retirement reaches the cache within the watch's delay, not at the
    // cache entry's time to live.
    let follower = machine.follow().map_err(|e| SignError::Config(format!("cannot follow the store {store}: {e}")))?;
    Ok((machine, follower))
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
            std::os::unix::fs::chown(&tmp, None, Some(gid)).map_err(|e| {
                if e.kind() == io::ErrorKind::PermissionDenied {
                    let group = sys::group_name(gid);
                    io::Error::new(
                        e.kind(),
                        format!(
                            "giving it to group {group}: {e}: the agent's user must be in that group (usermod -aG {group} USER), or let systemd make the socket (keyfence-agent.socket's SocketGroup=)"
                        ),
                    )
                } else {
                    e
                }
            })?;
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

/// Warns, at start, of each allowed user (and group) the socket's file
/// mode keeps out: the agent would admit it, but it cannot connect (a
/// socket in a folder it cannot enter, or whose mode and group leave it
/// out). Root is never kept out, so it is not checked.
fn warn_unreachable(config: &AgentConfig) {
    let Ok(meta) = std::fs::metadata(&config.socket) else { return };
    let who = config
        .allow_users
        .iter()
        .filter(|u| **u != 0)
        .map(|u| (format!("user {}", sys::user_name(*u)), *u, sys::user_groups(*u)))
        .chain(config.allow_groups.iter().map(|g| (format!("group {}", sys::group_name(*g)), u32::MAX - 1, vec![*g])));
    for (name, uid, gids) in who {
        let blocked = config.socket.ancestors().skip(1).filter(|d| !d.as_os_str().is_empty()).find_map(|d| {
            let m = std::fs::metadata(d).ok()?;
            (!permits(&m, uid, &gids, 0o1)).then(|| format!("cannot enter {}", d.display()))
        });
        let why = blocked.or_else(|| {
            (!permits(&meta, uid, &gids, 0o2)).then(|| {
                format!(
                    "the socket is mode {:o}, owner {}, group {}",
                    meta.mode() & 0o777,
                    sys::user_name(meta.uid()),
                    sys::group_name(meta.gid())
                )
            })
        });
        if let Some(why) = why {
            tracing::warn!(
                socket = %config.socket.display(),
                "{name} is allowed but cannot reach the agent's socket: {why} (give the socket its group: --socket-group, or systemd's SocketGroup=)"
            );
        }
    }
}

/// Whether the file `m` grants `bit` (1 search/execute, 2 write) to a
/// process of `uid` in groups `gids`, by its mode.
fn permits(m: &std::fs::Metadata, uid: u32, gids: &[u32], bit: u32) -> bool {
    let mode = m.mode();
    let shift = if m.uid() == uid {
        6
    } else if gids.contains(&m.gid()) {
        3
    } else {
        0
    };
    (mode >> shift) & bit != 0
}

fn accept_loop(inner: &Arc<Inner>, listener: &UnixListener) {
    loop {
        let accepted = listener.accept();
        if inner.stop.load(Ordering::Acquire) || inner.draining.load(Ordering::Acquire) {
            return;
        }
        match accepted {
            Ok((stream, _)) => admit(inner, stream),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)) => {
                // The connection waits in the backlog; say why, seldom, and
                // let descriptors free up rather than spin.
                if let Some(quiet) = inner.out_of_fds.say() {
                    tracing::warn!(
                        error = %e,
                        open = inner.conns().len(),
                        limit = inner.descriptor_limit,
                        more = quiet,
                        "the agent cannot accept a connection: raise its descriptor limit (LimitNOFILE=)"
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => {}
        }
    }
}

/// Decides on one client and, if admitted, serves it on a thread of its
/// own. Fast: the kernel's credentials and a few counters; refusals are
/// written and waited on by the poller.
fn admit(inner: &Arc<Inner>, stream: UnixStream) {
    let Ok((pid, uid, gid)) = sys::peer_credentials(&stream) else { return };
    let mut gids = sys::peer_groups(&stream).unwrap_or_default();
    gids.push(gid);
    let c = &inner.config;
    let allowed = uid == inner.uid || uid == 0 || c.allow_users.contains(&uid) || gids.iter().any(|g| c.allow_groups.contains(g));
    if !allowed {
        inner.refused.fetch_add(1, Ordering::Relaxed);
        return inner.poller.refuse(stream, Refusal::NotAllowed { uid, pid });
    }
    let share = inner.share(uid);
    let mine = share.connections.fetch_add(1, Ordering::AcqRel);
    let open = inner.conns().len();
    let over = if mine >= c.user_connections {
        Some(format!("this user has {mine} connections to the agent open, the most one user may"))
    } else if open >= c.max_connections {
        Some(format!("the agent has its maximum of {} connections open", c.max_connections))
    } else {
        None
    };
    if let Some(why) = over {
        share.connections.fetch_sub(1, Ordering::AcqRel);
        inner.refused.fetch_add(1, Ordering::Relaxed);
        return inner.poller.refuse(stream, Refusal::Busy(why));
    }
    // Inherited from the listener where the kernel copies it; set here
    // for a listener made without it (systemd's, before the agent set it).
    if let Err(e) = sys::pass_credentials(&stream) {
        tracing::debug!(%pid, error = %e, "SO_PASSCRED on a client's connection");
        return;
    }
    let stream = Arc::new(stream);
    let id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
    inner.conns().insert(id, stream.clone());
    inner.accepted.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(%pid, %uid, "client admitted");
    let client = Arc::new(Client { pid, uid, gids, share: share.clone(), limits: inner.limits });
    let flags = p::flags::AGENT | p::flags::PEER_CHECKED | hardening();
    let i = inner.clone();
    let spawned = inner.conn_threads.lock().unwrap_or_else(|e| e.into_inner()).spawn_sized(
        format!("keyfence-agent-{id}"),
        CONNECTION_STACK,
        move || {
            let workers = i.workers.clone();
            let stalls: Arc<dyn crate::sign::key_process::server::writer::Stalls> = i.poller.clone();
            let account = Account::new(share.memory.clone(), i.memory.clone());
            let result = match account.charge(0) {
                Ok(charge) => {
                    let writer = FrameWriter::bounded(stream.clone(), stalls, MAX_UNREAD, charge);
                    let opts = ConnOptions {
                        flags,
                        service: i.service.clone(),
                        client: Some(client),
                        cap: i.config.connection_in_flight,
                        hello_timeout: i.config.hello_timeout,
                        frame_timeout: Some(i.config.frame_timeout),
                        account,
                        read_chunk: READ_CHUNK,
                        owner: Some((pid, uid)),
                    };
                    serve_conn(&stream, writer, opts, |_| Ok(workers))
                }
                Err(_) => Ok(()),
            };
            if let Err(e) = result {
                tracing::debug!(%pid, error = %e, "client connection ended");
            }
            i.conns().remove(&id);
            share.connections.fetch_sub(1, Ordering::AcqRel);
            // What the connection held goes back to the system (seldom:
            // the poller trims at most once a second).
            i.poller.closed();
        },
    );
    if let Err(e) = spawned {
        // The closure, with the stream, is dropped: the client sees the
        // connection close. Said, seldom.
        if let Some(quiet) = inner.no_thread.say() {
            tracing::warn!(error = %e, more = quiet, "the agent could not start a connection's thread");
        }
        inner.conns().remove(&id);
        inner.share(uid).connections.fetch_sub(1, Ordering::AcqRel);
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
