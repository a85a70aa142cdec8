//! The key process: private keys live in a separate process, and
//! this one keeps only opaque key ids.
//!
//! A memory-disclosure bug in an internet-facing server (Heartbleed is the
//! seed's example) can read any byte of that server's memory. Fastly's
//! answer, neverbleed, moves the keys into a second process that does
//! nothing but sign; keyfence does the same behind the engine's
//! [`Backend`](crate::sign::Backend) interface:
//!
//! - [`KeyProcess::start`] spawns the key process (`keyfence-key-process` found
//!   beside the library or executable, never on `PATH`, or the program
//!   the configuration names, such as `keyfence key-process`) with one end
//!   of a socket pair as its standard input. It makes itself non-dumpable (no core dumps, no same-user
//!   ptrace), checks that its peer is its parent as the same user, and can
//!   drop privileges on request ([`KeyProcess::drop_privileges`]).
//! - [`KeyProcess::load`] has the key process read a key file or open a
//!   keyfence envelope itself; the caller gets an `Arc<PrivateKey>` that is
//!   only a handle. The [`Engine`](crate::sign::Engine) sends every
//!   operation on such a key to its key process, and refuses a request
//!   that names another backend for it.
//! - Requests carry ids and replies come in any order (an RSA signature
//!   never holds up an ECDSA reply), each with its deadline; in-flight
//!   requests are bounded per connection. The protocol is in
//!   `docs/isolation.md` (and, with the `testing` feature, `protocol`).
//! - If the key process dies, every operation in flight fails at once with
//!   a [`SignError::Backend`] error saying so, a new key process starts,
//!   the keys are loaded again from their sources, and later operations
//!   succeed.
//! - A message too long for one frame never reaches the connection: it is
//!   hashed here and its digest signed (RSA, ECDSA), or refused at
//!   submission with [`SignError::InputTooLarge`] (Ed25519).
//!
//! ```no_run
//! use keyfence::sign::{Algorithm, Engine, EngineConfig};
//! use keyfence::sign::key_process::{KeyProcessConfig, KeyProcess, KeySource};
//!
//! let keys = KeyProcess::start(KeyProcessConfig::default())?;
//! let key = keys.load(KeySource::File("/etc/keys/server.pem".into()))?;
//! assert!(!key.is_local());
//! let engine = Engine::new(EngineConfig::default())?;
//! let signature = engine.sign(&key, Algorithm::EcdsaP256Sha256, b"hello")?.wait()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

//!
//! Inside, the client's side: `source` is what a caller names ([`KeySource`]),
//! `client` one connection (request ids, what waits for each reply, the
//! reader, what a source becomes on the wire), `supervisor` starts the
//! process and restarts it, `protocol` the messages. The servers' side:
//! `server/` is the connection engine the key process and the agent
//! (`sign::agent`) both run on, each a service with one table of what it
//! permits; `process/` is what runs in the key process, under its
//! sandbox: its main, its service and the sandbox itself.

mod client;
mod process;
#[cfg(feature = "testing")]
pub mod protocol;
#[cfg(not(feature = "testing"))]
pub(crate) mod protocol;
pub(crate) mod server;
mod source;
mod supervisor;

use std::ffi::OsString;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "testing")]
pub use process::{serve, ServeOptions};
pub use protocol::Status;
pub use source::{KeySource, MachineFiles};

use self::client::backend_error;
use self::protocol::{self as p, kind};
use self::supervisor::{Setup, Supervisor};
use crate::sign::held_key::{HeldKey, KeyHolder};
use crate::sign::types::{BackendFailure, SignError};
use crate::sign::PrivateKey;

/// How the key process is started and supervised.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyProcessConfig {
    /// The key process's program and arguments; it must serve the protocol
    /// on its standard input ([`key_process_main`]). The program must be a
    /// path (it is never looked up on `PATH`). Default: empty, meaning
    /// `keyfence-key-process` beside the shared library or executable keyfence is
    /// linked into, else beside the running executable or one directory up
    /// (test and bench binaries); no environment variable is consulted.
    /// `docs/isolation.md` has the lookup order.
    pub command: Vec<OsString>,
    /// Requests in flight on the connection at most; further operations
    /// wait for room on their executor thread (so the executor queue fills
    /// and callers are told `overloaded`). Default 1024, at most 4096
    /// (the key process refuses more).
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
    /// A key agent's socket (`keyfence agent`): the keys are held by the
    /// agent listening there instead of a key process started here, and
    /// only envelopes can be loaded ([`KeySource::AgentEnvelope`]), which
    /// the agent opens with its own machine key. When the agent goes away
    /// the connection is made again (backing off up to 1 s) and the keys
    /// loaded again; `command`, `rsa_threads` and `ec_threads` are the
    /// agent's own business then. Default: none.
    pub agent: Option<std::path::PathBuf>,
    /// Start the key process even when it could not set up its whole
    /// sandbox (a kernel without Landlock or seccomp, a thread that a
    /// preloaded library started before the sandbox): it then runs with
    /// less isolation than `docs/security.md` promises (without Landlock,
    /// code in it can read other processes of its user), and a warning
    /// says which layer is missing. Default false, or true where the
    /// environment sets `KEYFENCE_UNSAFE_PARTIAL_SANDBOX=1` (for servers
    /// that load keyfence through the OpenSSL provider or a binding):
    /// such a key process is refused, with the reason.
    pub unsafe_partial_sandbox: bool,
    /// Whether the key process signs on crypto_mb's multi-buffer device
    /// (RSA, ECDSA P-256 and P-384, eight at a time with AVX-512 IFMA):
    /// `auto` (the default) where the library is found (`KEYFENCE_CRYPTO_MB`,
    /// else the library path) and runs on this CPU, `on` or the key process
    /// does not start, `off`. `docs/offload.md`. An agent's own
    /// configuration decides for its keys.
    pub offload: crate::sign::offload::OffloadMode,
    /// crypto_mb's library (a path, or a name the library path finds);
    /// `None`: `KEYFENCE_CRYPTO_MB`, else `libcrypto_mb.so.13`. The key
    /// process opens it before its sandbox, so that the sandbox never lets
    /// it open a library.
    pub crypto_mb: Option<String>,
}

impl Default for KeyProcessConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        KeyProcessConfig {
            command: Vec::new(),
            max_in_flight: 1024,
            rsa_threads: cores,
            ec_threads: cores,
            restart: true,
            start_timeout: Duration::from_secs(10),
            restart_wait: Duration::from_millis(500),
            agent: None,
            unsafe_partial_sandbox: std::env::var_os("KEYFENCE_UNSAFE_PARTIAL_SANDBOX").is_some_and(|v| v == "1"),
            offload: crate::sign::offload::OffloadMode::Auto,
            crypto_mb: None,
        }
    }
}

impl KeyProcessConfig {
    /// The default configuration with another key-process command, for
    /// example `[current_exe, "key-process"]`.
    pub fn with_command<I, S>(command: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        KeyProcessConfig { command: command.into_iter().map(Into::into).collect(), ..Self::default() }
    }

    /// The default configuration for keys held by the agent listening on
    /// `socket` ([`KeyProcessConfig::agent`]).
    pub fn with_agent(socket: impl Into<std::path::PathBuf>) -> Self {
        KeyProcessConfig { agent: Some(socket.into()), ..Self::default() }
    }
}

/// A running key process, restarted when it dies. Cheap to
/// clone; the process is told to exit when the last clone and the last key
/// handle from it are gone.
#[derive(Clone)]
pub struct KeyProcess {
    sup: Arc<Supervisor>,
}

impl Drop for KeyProcess {
    /// In a forked child, the parent's key process (or agent connection)
    /// is left alone: ending it here would kill the parent's key process
    /// and shut down the socket both processes share.
    fn drop(&mut self) {
        if self.sup.origin.forked() {
            std::mem::forget(self.sup.clone());
        }
    }
}

impl std::fmt::Debug for KeyProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyProcess").field("pid", &self.pid()).field("restarts", &self.restarts()).finish()
    }
}

impl KeyProcess {
    /// Starts the key process and waits for its hello.
    ///
    /// # Errors
    /// [`SignError::Config`] for zero sizes, a configured program that is
    /// not a path or does not exist, or no `keyfence-key-process` where it is
    /// looked for; [`SignError::Io`] when the process cannot be started,
    /// does not answer in [`KeyProcessConfig::start_timeout`], or speaks
    /// another protocol version.
    pub fn start(config: KeyProcessConfig) -> Result<Self, SignError> {
        Ok(KeyProcess { sup: Supervisor::start(config)? })
    }

    /// Has the key process load a key and returns a handle on it. Every
    /// key is loaded again after a restart: from its file or envelope, or
    /// from the bytes given, which this process keeps for that (in a
    /// zeroizing buffer, wiped when the last handle is dropped). Give a
    /// file or an envelope for keys that must never be in this process's
    /// memory.
    ///
    /// # Errors
    /// [`SignError::Backend`] with the key process's reason (file not
    /// found, not a key, envelope not openable by this machine key) or
    /// because the key process is not running;
    /// [`SignError::InputTooLarge`] for key bytes or paths longer than one
    /// request can carry; [`SignError::ShutDown`] once stopped
    /// ([`KeyProcess::stop`]).
    pub fn load(&self, source: KeySource) -> Result<Arc<PrivateKey>, SignError> {
        let sup = &self.sup;
        if let KeySource::Pkcs11(uri) = &source {
            crate::sign::pkcs11::precheck(uri, !self.is_agent())?;
        }
        let key_id = sup.next_key.fetch_add(1, Ordering::Relaxed);
        let wire = client::for_the_wire(&source, self.is_agent())?;
        let conn = sup.live_conn(Instant::now() + sup.config.start_timeout)?;
        let body = p::load_request(key_id, &wire);
        let frame = conn.load(&body, sup.config.start_timeout).map_err(|e| match (e, &source) {
            // A token key the key process or agent could not load, and
            // whose failure came without a detail the client rebuilds (a
            // token's failures and refused arguments come with theirs): no
            // such token or key, as in process.
            (SignError::Backend { failure: BackendFailure::Refused, reason, .. }, KeySource::Pkcs11(_)) => {
                SignError::Token { token: "pkcs11".into(), failure: crate::sign::types::TokenFailure::NotFound, reason }
            }
            (e, _) => e,
        })?;
        let (kind, public_der) =
            p::parse_loaded_reply(&frame.body).map_err(|e| backend_error(BackendFailure::Protocol, format!("bad load reply: {e}")))?;
        // The lists the key process opened with become this machine's
        // floor; a floor that cannot be kept fails the load (the key
        // process forgets the key with the id when the handle is never made).
        if let Err(e) = client::keep_floor(&wire) {
            conn.unload(key_id);
            return Err(e);
        }
        drop(wire);
        sup.state().setup.push(Setup::Load(key_id, source));
        let holder: Arc<dyn KeyHolder> = sup.clone();
        Ok(Arc::new(PrivateKey::held(HeldKey::new(holder, key_id, kind, public_der))))
    }

    /// Has the key process drop to `uid` and `gid` (it must be running as
    /// root to do so). Keys loaded before stay loaded; later loads read
    /// their sources as that user. Replayed in order after a restart.
    ///
    /// # Errors
    /// [`SignError::Backend`] if the key process refuses.
    pub fn drop_privileges(&self, uid: u32, gid: u32) -> Result<(), SignError> {
        let sup = &self.sup;
        let conn = sup.live_conn(Instant::now() + sup.config.start_timeout)?;
        conn.call(kind::DROP_PRIVILEGES, &p::drop_privileges_request(uid, gid), sup.config.start_timeout)?;
        sup.state().setup.push(Setup::DropPrivileges(uid, gid));
        Ok(())
    }

    /// Has the key process make a call its sandbox forbids (test builds
    /// only): with the sandbox it dies and is started again, as after any
    /// crash; without it, this returns `Ok(true)`.
    ///
    /// # Errors
    /// [`SignError::Backend`] (`Died`) when the sandbox killed it.
    #[cfg(feature = "testing")]
    pub fn test_forbidden_call(&self) -> Result<bool, SignError> {
        let conn = self.sup.live_conn(Instant::now() + self.sup.config.start_timeout)?;
        let frame = conn.call(kind::TEST_FORBIDDEN_CALL, &[], self.sup.config.start_timeout)?;
        Ok(frame.body.first() == Some(&1))
    }

    /// Has the key process try to create the file `path` (test builds
    /// only): `Ok(true)` if it did, which its sandbox allows only in a
    /// token module's folder.
    ///
    /// # Errors
    /// [`SignError::Backend`] if it is not running or does not answer.
    #[cfg(feature = "testing")]
    pub fn test_create_file(&self, path: &std::path::Path) -> Result<bool, SignError> {
        use std::os::unix::ffi::OsStrExt;
        let conn = self.sup.live_conn(Instant::now() + self.sup.config.start_timeout)?;
        let frame = conn.call(kind::TEST_CREATE_FILE, path.as_os_str().as_bytes(), self.sup.config.start_timeout)?;
        Ok(frame.body.first() == Some(&1))
    }

    /// The key process's own account of itself: pid, ids, hardening
    /// flags, keys, requests in flight.
    ///
    /// # Errors
    /// [`SignError::Backend`] if it is not running or does not answer;
    /// [`SignError::ShutDown`] once stopped ([`KeyProcess::stop`]).
    pub fn status(&self) -> Result<Status, SignError> {
        let conn = self.sup.live_conn(Instant::now() + self.sup.config.start_timeout)?;
        let frame = conn.call(kind::STATUS, &[], self.sup.config.start_timeout)?;
        Status::parse(&frame.body).map_err(|e| backend_error(BackendFailure::Protocol, format!("bad status reply: {e}")))
    }

    /// Whether the keys are held by a key agent this connects to
    /// ([`KeyProcessConfig::agent`]) rather than a key process of its own.
    pub fn is_agent(&self) -> bool {
        self.sup.is_agent()
    }

    /// The running key process's pid, if one is running.
    pub fn pid(&self) -> Option<u32> {
        self.sup.state().conn.as_ref().filter(|c| !c.is_dead()).map(|c| c.pid)
    }

    /// Whether the running key process signs on crypto_mb's multi-buffer
    /// device (its hello's `MULTIBUFFER` flag); never for an agent, whose
    /// own configuration decides.
    pub fn multibuffer(&self) -> bool {
        !self.is_agent() && self.hardening_flags().is_some_and(|f| f & p::flags::MULTIBUFFER != 0)
    }

    /// The hardening the running key process confirmed in its hello
    /// (`NOT_DUMPABLE`, `NO_CORE`, `PEER_CHECKED` in `docs/isolation.md`).
    pub fn hardening_flags(&self) -> Option<u32> {
        self.sup.state().conn.as_ref().map(|c| c.flags)
    }

    /// How many times the key process has been started again.
    pub fn restarts(&self) -> u64 {
        self.sup.restarts.load(Ordering::Relaxed)
    }

    /// How the last key process ended, if one has.
    pub fn last_exit(&self) -> Option<String> {
        self.sup.state().last_exit.clone()
    }

    /// Ends the key process now, even while key handles from it are still
    /// alive (they fail from then on, on any engine, with
    /// [`SignError::ShutDown`], as do the operations in flight and later
    /// calls on this `KeyProcess`), and starts no other. What an owner
    /// calls when it closes; dropping the last clone and the last key does
    /// the same. Idempotent.
    pub fn stop(&self) {
        self.sup.stop();
    }

    /// Waits until a key process is running (after a restart), up to
    /// `timeout`; true if one is.
    pub fn wait_running(&self, timeout: Duration) -> bool {
        self.sup.live_conn(Instant::now() + timeout).is_ok()
    }
}

pub use process::key_process_main;
