//! An engine that owns where its keys live: [`ManagedEngine`].
//!
//! An [`Engine`] runs operations; a [`KeyProcess`] or a [`RemoteSigner`]
//! holds keys. A program that wants both has to start them together, keep
//! them alive together, refuse work once it has closed them, and stop the
//! key process when it is done. That is the same behaviour for every
//! caller (the C and Node bindings, the OpenSSL provider), so it is here,
//! once: a [`ManagedConfig`] names the engine's sizes and its
//! [`Isolation`], and [`ManagedEngine::start`] starts what it names.
//!
//! ```no_run
//! use keyfence::sign::key_process::{KeyProcessConfig, KeySource};
//! use keyfence::sign::managed::{Isolation, ManagedConfig, ManagedEngine};
//! use keyfence::sign::Algorithm;
//!
//! let mut config = ManagedConfig::default();
//! config.isolation = Isolation::KeyProcess(KeyProcessConfig::default());
//! let engine = ManagedEngine::start(config)?;
//! let key = engine.load(KeySource::File("/etc/keys/server.pem".into()))?;
//! let req = ManagedEngine::request(key, "ecdsa-p256-sha256", b"hello".to_vec(), None)?;
//! let signature = engine.submit(req)?.wait()?;
//! engine.close(); // the key process is gone now, keys or no keys
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, TryLockError};
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use super::completion_queue::CompletionQueue;
use super::engine::{Engine, EngineConfig};
use super::key_process::{KeyProcess, KeyProcessConfig, KeySource, MachineFiles};
use super::metrics::{EngineMetrics, MetricsSource};
use super::offload::{OffloadMode, ServerOffload};
use super::op_record::{OpHandle, SignFuture};
use super::private_key::PrivateKey;
use super::remote::{KeyRingError, RemoteConfig, RemoteSigner};
use super::request::Request;
use super::threads::Origin;
use super::types::{Algorithm, KeyError, Output, SignError};
use crate::wrap::Envelope;

/// Where the keys an engine loads are held.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum Isolation {
    /// In this process's memory.
    #[default]
    InProcess,
    /// In a key process the engine starts, restarts when it dies, and
    /// stops when it closes: a memory disclosure in this process cannot
    /// reach the keys (`docs/isolation.md`).
    KeyProcess(KeyProcessConfig),
    /// On remote key servers (`keyfence serve`) the engine reaches through
    /// a [`RemoteSigner`] it starts: only envelopes can be loaded, and the
    /// secret never comes here (`docs/remote.md`).
    Remote(RemoteConfig),
    /// In the key agent listening on this socket (`keyfence agent`,
    /// `docs/deploy.md`): only envelopes can be loaded, which the agent
    /// opens with its own machine key and store; this process holds
    /// neither, nor any private key. The engine connects again when the
    /// agent restarts.
    Agent(std::path::PathBuf),
}

/// A [`ManagedEngine`]'s settings: the engine's sizes and deadline, and
/// where its keys live.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ManagedConfig {
    /// The executors and the default deadline.
    pub engine: EngineConfig,
    /// Where keys loaded through the engine are held.
    pub isolation: Isolation,
    /// Whether keys held in this process, or in its key process, sign on
    /// crypto_mb's multi-buffer device (`docs/offload.md`): `None` leaves
    /// each its default (in this process software, in the key process
    /// `auto`); `Some(mode)` sets both. An agent or key servers decide for
    /// the keys they hold, so an engine of theirs refuses a mode.
    pub offload: Option<OffloadMode>,
    /// crypto_mb's library (a path, or a name the library path finds),
    /// with `offload` only; `None`: `KEYFENCE_CRYPTO_MB`, else
    /// `libcrypto_mb.so.13`.
    pub crypto_mb: Option<String>,
}

/// Why [`ManagedEngine::load`] gave no key. Messages name the source,
/// never the secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The bytes or the file are not a private key keyfence signs with.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The key process or the peers refused the key, the source does not
    /// suit the engine's isolation, or the engine is closed.
    #[error("{0}")]
    Refused(#[from] SignError),
    /// The envelope cannot be opened, or holds no usable key.
    #[error(transparent)]
    Envelope(#[from] KeyRingError),
    /// A key or envelope file cannot be read (the message names it).
    #[error("{0}")]
    Io(String),
}

impl LoadError {
    /// The stable code bindings map this error to (`docs/errors.md`).
    pub fn code(&self) -> crate::ErrorCode {
        match self {
            LoadError::Key(e) => e.code(),
            LoadError::Envelope(e) => e.code(),
            LoadError::Refused(e) => e.code(),
            LoadError::Io(_) => crate::ErrorCode::Io,
        }
    }
}

/// What a running [`ManagedEngine`] owns.
struct Parts {
    engine: Engine,
    key_process: Option<KeyProcess>,
    remote: Option<RemoteSigner>,
}

impl Parts {
    /// Starts the engine's threads, then what `config`'s isolation names.
    fn start(config: &ManagedConfig) -> Result<Parts, SignError> {
        if config.crypto_mb.is_some() && config.offload.is_none() {
            return Err(SignError::Config("crypto_mb names the library the offload mode signs with: set the offload mode too".into()));
        }
        let engine = match (&config.isolation, config.offload) {
            (Isolation::InProcess, Some(mode)) => {
                let offload = ServerOffload::prepare(mode, config.crypto_mb.as_deref())?;
                match offload.software_reason() {
                    Some(why) => tracing::info!("the engine signs in software: {why}"),
                    None => tracing::info!("the engine signs RSA and ECDSA on crypto_mb's multi-buffer device"),
                }
                match offload.start()? {
                    Some(backend) => Engine::with_backend(config.engine.clone(), Arc::new(backend))?,
                    None => Engine::new(config.engine.clone())?,
                }
            }
            (Isolation::Agent(_) | Isolation::Remote(_), Some(mode)) => {
                return Err(SignError::Config(format!(
                    "offload `{mode}`: the agent or the key servers holding this engine's keys choose their own (keyfence agent --offload)"
                )))
            }
            _ => Engine::new(config.engine.clone())?,
        };
        let (key_process, remote) = match &config.isolation {
            Isolation::InProcess => (None, None),
            Isolation::KeyProcess(c) => {
                let mut c = c.clone();
                if let Some(mode) = config.offload {
                    c.offload = mode;
                }
                if config.crypto_mb.is_some() {
                    c.crypto_mb.clone_from(&config.crypto_mb);
                }
                (Some(KeyProcess::start(c)?), None)
            }
            Isolation::Agent(socket) => (Some(KeyProcess::start(KeyProcessConfig::with_agent(socket))?), None),
            Isolation::Remote(c) => {
                let signer = RemoteSigner::start(c.clone())?;
                engine.attach_metrics(Arc::new(signer.clone()));
                (None, Some(signer))
            }
        };
        Ok(Parts { engine, key_process, remote })
    }

    /// Ends the key process and the remote signer's connections now.
    fn stop(&self) {
        if let Some(kp) = &self.key_process {
            kp.stop();
        }
        if let Some(remote) = &self.remote {
            remote.disconnect();
        }
    }

    /// Loads `source` where these parts hold keys.
    fn load(&self, source: KeySource) -> Result<Arc<PrivateKey>, LoadError> {
        Holders { key_process: self.key_process.as_ref(), remote: self.remote.as_ref() }.load(source)
    }
}

/// What holds an engine's keys, if anything but this process does.
#[derive(Clone, Copy)]
struct Holders<'a> {
    key_process: Option<&'a KeyProcess>,
    remote: Option<&'a RemoteSigner>,
}

impl Holders<'_> {
    /// Loads `source` where keys are held: the one set of rules every
    /// binding's loads follow ([`ManagedEngine::load`]).
    fn load(self, source: KeySource) -> Result<Arc<PrivateKey>, LoadError> {
        let read = |path: &Path| {
            std::fs::read(path).map(Zeroizing::new).map_err(|e| LoadError::Io(format!("cannot read {}: {e}", path.display())))
        };
        let agent = self.key_process.is_some_and(KeyProcess::is_agent);
        match (source, self.key_process, self.remote) {
            (KeySource::Envelope { envelope, machine }, ..) => self.open_envelope(machine.as_ref(), &envelope),
            (_, _, Some(_)) => {
                Err(SignError::InvalidArgument("an engine whose keys are on remote key servers loads envelopes only".into()).into())
            }
            // A token key: whatever holds this engine's keys loads the
            // module and reads the PIN; this process only when it holds
            // them itself.
            (KeySource::Pkcs11(uri), Some(kp), None) => Ok(kp.load(KeySource::Pkcs11(uri))?),
            (KeySource::Pkcs11(uri), None, None) => {
                Ok(Arc::new(crate::sign::pkcs11::load(&uri, &crate::sign::pkcs11::Pkcs11Settings::from_env())?))
            }
            (_, Some(_), None) if agent => Err(SignError::InvalidArgument(
                "an engine whose keys are in an agent loads envelopes only, which the agent opens, and token keys".into(),
            )
            .into()),
            (KeySource::File(path), Some(kp), None) => Ok(kp.load(KeySource::File(path))?),
            (KeySource::File(path), None, None) => Ok(Arc::new(PrivateKey::from_bytes(&read(&path)?)?)),
            (KeySource::Bytes(bytes), kp, None) => {
                // Parsed here first, so that a bad key has the same typed
                // error wherever the keys are held.
                let local = PrivateKey::from_bytes(&bytes)?;
                match kp {
                    Some(kp) => Ok(kp.load(KeySource::Bytes(bytes))?),
                    None => Ok(Arc::new(local)),
                }
            }
        }
    }

    /// The key an envelope holds: from the peers that may open it, from an
    /// agent (which opens it with its own machine key and store; the ones
    /// named here are not read: a worker holding only the agent's socket
    /// has none), or opened with `machine` here or in the key process.
    fn open_envelope(self, machine: Option<&MachineFiles>, envelope: &[u8]) -> Result<Arc<PrivateKey>, LoadError> {
        let parse = || Envelope::parse(envelope).map_err(KeyRingError::from);
        match (self.remote, self.key_process, machine) {
            (Some(remote), ..) => Ok(remote.key(&parse()?)?),
            (None, Some(kp), _) if kp.is_agent() => {
                parse()?;
                Ok(kp.load(KeySource::agent_envelope(envelope.to_vec()))?)
            }
            (None, kp, Some(machine)) => Ok(load_envelope(kp, machine, envelope)?),
            (None, _, None) => Err(SignError::InvalidArgument(
                "an envelope needs the machine key and the store that open it: only an engine whose keys are in a key agent, which opens it with its own, loads one without them".into(),
            )
            .into()),
        }
    }
}

/// Loads the private key `envelope` holds, opened with
/// `machine`'s machine key against its store, where keys are kept: with
/// `keys` (a key process), this process reads only the machine key's
/// public part (wiped at once) to check, without decrypting, that the
/// envelope can be opened, and the key process opens it and holds the
/// key, reloading the same envelope bytes after a restart; so neither the
/// machine key's secret nor the private key is ever in this process.
/// Without `keys`, the envelope is opened here, the machine's floor kept
/// beside its key.
fn load_envelope(keys: Option<&KeyProcess>, machine: &MachineFiles, envelope: &[u8]) -> Result<Arc<PrivateKey>, KeyRingError> {
    use crate::wrap::{open_store_path, CacheConfig, Machine, MachineInfo, MachineKey, PublicMachine, WrapError};
    let (store, machine_key) = (&machine.store, &machine.machine_key);
    // `fs::read` sizes its buffer from the file: one allocation, wiped on
    // drop, no copy left behind by growth.
    let bytes = Zeroizing::new(
        std::fs::read(machine_key).map_err(|e| KeyRingError::Io(format!("cannot read the machine key {}: {e}", machine_key.display())))?,
    );
    let parsed = &Envelope::parse(envelope)?;
    let dir = open_store_path(store).map_err(WrapError::from)?;
    match keys {
        Some(kp) => {
            let info = MachineInfo::from_key_bytes(&bytes)?;
            drop(bytes);
            PublicMachine::new(info, dir).can_open(parsed)?;
            // The store's name as given (a directory or `etcd://...`): the
            // key process is sent the objects read from it here, never the
            // name (`KeyProcess::load`).
            Ok(kp.load(KeySource::envelope(envelope.to_vec(), store.clone(), machine_key.clone()))?)
        }
        None => {
            let machine = Machine::new(MachineKey::from_bytes(&bytes)?, dir, CacheConfig::default()).keep_newest_beside(machine_key)?;
            let secret = machine.open_envelope(parsed)?;
            Ok(Arc::new(PrivateKey::from_bytes(&secret)?))
        }
    }
}

/// Loads `source` in this process, by the rules of an engine whose keys
/// are in process ([`ManagedEngine::load`]), without one: what a binding
/// calls for a key it loads without an engine (C's NULL engine).
///
/// # Errors
/// As [`ManagedEngine::load`].
pub fn load_in_process(source: KeySource) -> Result<Arc<PrivateKey>, LoadError> {
    Holders { key_process: None, remote: None }.load(source)
}

/// An [`Engine`] together with what holds its keys, started, kept and
/// stopped as one: the call every binding makes.
///
/// Thread-safe. [`ManagedEngine::close`] (or dropping it) shuts the engine
/// down (queued operations fail with [`SignError::ShutDown`]) and ends its
/// key process at once, even while key handles from it live on; every
/// later call fails with [`SignError::ShutDown`].
pub struct ManagedEngine {
    parts: RwLock<Option<Parts>>,
    /// What the parts were started from, to start them again in a forked
    /// child.
    config: ManagedConfig,
    /// The process the engine was made in.
    origin: Origin,
    /// The parts a forked child started for itself (see
    /// [`ManagedEngine::child_parts`]). Never locked in the process the
    /// engine was made in, so no thread of that process can hold it when
    /// it forks.
    child: Mutex<Option<(Origin, Arc<Parts>)>>,
    closed: AtomicBool,
}

impl std::fmt::Debug for ManagedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedEngine").field("closed", &self.is_closed()).field("key_process_pid", &self.key_process_pid()).finish()
    }
}

/// A timeout given in milliseconds, checked: a whole number from 1 to
/// 2^32 - 1 (bindings receive numbers that may be negative, fractional or
/// huge; none of them is silently wrapped or truncated).
///
/// # Errors
/// [`SignError::InvalidArgument`] naming `name` and the value.
pub fn millis(ms: f64, name: &str) -> Result<Duration, SignError> {
    if ms >= 1.0 && ms <= f64::from(u32::MAX) && ms.fract() == 0.0 {
        Ok(Duration::from_millis(ms as u64))
    } else {
        Err(SignError::InvalidArgument(format!("{name} must be a positive whole number of milliseconds, not {ms}")))
    }
}

/// Sets a remote signer's limits as a binding receives them: the connect
/// and request timeouts in milliseconds ([`millis`]) and the attempts per
/// operation, each left as it is when `None`.
///
/// # Errors
/// [`SignError::InvalidArgument`] for a timeout [`millis`] refuses or zero
/// attempts; `config` is unchanged then.
pub fn set_remote_limits(
    config: &mut RemoteConfig, connect_ms: Option<f64>, request_ms: Option<f64>, max_attempts: Option<u32>,
) -> Result<(), SignError> {
    let connect = connect_ms.map(|ms| millis(ms, "the connect timeout")).transpose()?;
    let request = request_ms.map(|ms| millis(ms, "the request timeout")).transpose()?;
    if max_attempts == Some(0) {
        return Err(SignError::InvalidArgument("max_attempts must be at least 1".into()));
    }
    config.connect_timeout = connect.unwrap_or(config.connect_timeout);
    config.request_timeout = request.unwrap_or(config.request_timeout);
    config.max_attempts = max_attempts.unwrap_or(config.max_attempts);
    Ok(())
}

impl ManagedEngine {
    /// Starts the engine's threads, then what its [`Isolation`] names: the
    /// key process (waiting for its hello) or the remote signer (whose
    /// figures join the engine's metrics).
    ///
    /// # Errors
    /// [`SignError::Config`] for a bad configuration or no key-process
    /// program, [`SignError::Io`] if threads or the key process cannot be
    /// started; nothing is left running then.
    pub fn start(config: ManagedConfig) -> Result<Self, SignError> {
        let parts = Parts::start(&config)?;
        Ok(ManagedEngine {
            parts: RwLock::new(Some(parts)),
            config,
            origin: Origin::here(),
            child: Mutex::new(None),
            closed: AtomicBool::new(false),
        })
    }

    /// Runs `f` on the running parts: in a child forked after the engine
    /// was made, the child's own ([`ManagedEngine::child_parts`]).
    fn with<T, E: From<SignError>>(&self, f: impl FnOnce(&Parts) -> Result<T, E>) -> Result<T, E> {
        if self.origin.forked() {
            let parts = self.child_parts()?;
            return f(&parts);
        }
        match &*self.parts.read().unwrap_or_else(|e| e.into_inner()) {
            Some(parts) => f(parts),
            None => Err(SignError::ShutDown.into()),
        }
    }

    /// The parts of this process, a child forked after the engine was made
    /// (a preforking server, gunicorn `--preload`, multiprocessing's fork
    /// start method). The child has the parent's memory but none of its
    /// threads, and the parent's key process and sockets are the parent's:
    /// on first use, the child starts its own engine threads, key process,
    /// agent connection or remote signer, from the engine's configuration,
    /// and never touches the parent's. Keys in this process's memory keep
    /// working; keys the parent loaded into a key process, an agent or key
    /// servers fail at once ([`SignError::Forked`]) and are loaded again.
    fn child_parts(&self) -> Result<Arc<Parts>, SignError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(SignError::ShutDown);
        }
        // The lock is never taken in the process the engine was made in;
        // a grandchild may find it held by a thread of the child it forked
        // from, which is not here: bounded, then an error, never a hang.
        let until = Instant::now() + Duration::from_millis(200);
        let mut guard = loop {
            match self.child.try_lock() {
                Ok(g) => break g,
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(TryLockError::WouldBlock) if Instant::now() < until => std::thread::sleep(Duration::from_millis(1)),
                Err(TryLockError::WouldBlock) => {
                    return Err(SignError::forked(
                        "this engine",
                        self.origin.pid(),
                        "it could not start again here, as a thread of the process that forked held it; make an engine in this process",
                    ))
                }
            }
        };
        if let Some((origin, parts)) = &*guard {
            if !origin.forked() {
                return Ok(parts.clone());
            }
        }
        // A grandchild: the child's parts are another process's too.
        if let Some(old) = guard.take() {
            std::mem::forget(old);
        }
        let parts = Arc::new(Parts::start(&self.config)?);
        *guard = Some((Origin::here(), parts.clone()));
        Ok(parts)
    }

    /// The request bindings build from their arguments: `data` signed with
    /// `key` by the algorithm named `algorithm` (`"ecdsa-p256-sha256"`,
    /// ...), within `timeout_ms` ([`millis`]) or the engine's default.
    ///
    /// # Errors
    /// [`SignError::UnknownAlgorithm`], [`SignError::InvalidArgument`] for
    /// a timeout [`millis`] refuses.
    pub fn request(key: Arc<PrivateKey>, algorithm: &str, data: Vec<u8>, timeout_ms: Option<f64>) -> Result<Request, SignError> {
        let alg: Algorithm = algorithm.parse()?;
        let req = Request::sign(key, alg, data);
        Ok(match timeout_ms {
            Some(ms) => req.with_timeout(millis(ms, "the timeout")?),
            None => req,
        })
    }

    /// Loads a key where the engine holds keys, and returns its handle.
    ///
    /// - In process: key bytes are parsed here, a key file is read here, an
    ///   envelope is opened here with the machine key.
    /// - Key process: key bytes are parsed here first, so that a bad key
    ///   has the same typed error either way, then handed over; files and
    ///   envelopes are read by the key process, after this process checks
    ///   an envelope against the machine key's public part only
    ///   ([`load_envelope_key`]). Every source is loaded again after a
    ///   restart.
    /// - Remote: only envelopes; the peers that may open one hold the key.
    /// - A PKCS#11 URI ([`KeySource::Pkcs11`]) is loaded where the keys are
    ///   held: in this process, or in the key process or agent, so that an
    ///   isolated engine's process never maps the token's module nor reads
    ///   its PIN. The module and PIN come from the URI or the holder's
    ///   environment (`KEYFENCE_PKCS11_MODULE`, `KEYFENCE_PKCS11_PIN_FILE`,
    ///   `KEYFENCE_PKCS11_PIN`); an agent's from its own configuration.
    ///
    /// # Errors
    /// [`LoadError::Key`] for bytes or a file that are not a usable key,
    /// [`LoadError::Io`] for a file that cannot be read,
    /// [`LoadError::Envelope`] for an envelope that cannot be opened
    /// (as [`load_envelope_key`]), [`LoadError::Refused`] when the key
    /// process or the peers refuse, for a key file or bytes given to a
    /// remote engine ([`SignError::InvalidArgument`]), or once the engine
    /// is closed ([`SignError::ShutDown`]).
    pub fn load(&self, source: KeySource) -> Result<Arc<PrivateKey>, LoadError> {
        self.with(|parts| parts.load(source))
    }

    /// Submits `req` ([`Engine::submit`]).
    ///
    /// # Errors
    /// As [`Engine::submit`]; [`SignError::ShutDown`] once closed.
    pub fn submit(&self, req: Request) -> Result<SignFuture, SignError> {
        self.with(|p| p.engine.submit(req))
    }

    /// Performs `req` and waits ([`Engine::perform`]: on the calling
    /// thread for a key in this process).
    ///
    /// # Errors
    /// As [`Engine::perform`]; [`SignError::ShutDown`] once closed.
    pub fn perform(&self, req: Request) -> Result<Output, SignError> {
        self.with(|p| p.engine.perform(req))
    }

    /// Submits `req` with a callback ([`Engine::submit_with_callback`]).
    ///
    /// # Errors
    /// As [`Engine::submit_with_callback`]; [`SignError::ShutDown`] once
    /// closed (the callback is then dropped uncalled).
    pub fn submit_with_callback<F>(&self, req: Request, callback: F) -> Result<OpHandle, SignError>
    where
        F: FnOnce(Result<Output, SignError>) + Send + 'static,
    {
        self.with(|p| p.engine.submit_with_callback(req, callback))
    }

    /// Submits `req` to `queue` ([`Engine::submit_to_queue`]).
    ///
    /// # Errors
    /// As [`Engine::submit_to_queue`]; [`SignError::ShutDown`] once closed.
    pub fn submit_to_queue(&self, req: Request, queue: &CompletionQueue, user_data: u64) -> Result<OpHandle, SignError> {
        self.with(|p| p.engine.submit_to_queue(req, queue, user_data))
    }

    /// The engine's metrics ([`Engine::metrics`]), with the remote
    /// signer's figures when it has one.
    ///
    /// # Errors
    /// [`SignError::ShutDown`] once closed.
    pub fn metrics(&self) -> Result<EngineMetrics, SignError> {
        self.with(|p| Ok(p.engine.metrics()))
    }

    /// Reports `source`'s figures with the engine's metrics from now on
    /// ([`Engine::attach_metrics`]).
    ///
    /// # Errors
    /// [`SignError::ShutDown`] once closed.
    pub fn attach_metrics(&self, source: Arc<dyn MetricsSource>) -> Result<(), SignError> {
        self.with(|p| {
            p.engine.attach_metrics(source);
            Ok(())
        })
    }

    /// Whether keys loaded through the engine go to a key process (false
    /// once closed).
    pub fn has_key_process(&self) -> bool {
        self.with(|p| Ok::<_, SignError>(p.key_process.is_some())).unwrap_or(false)
    }

    /// The pid of the engine's key process while one runs.
    pub fn key_process_pid(&self) -> Option<u32> {
        self.with(|p| Ok::<_, SignError>(p.key_process.as_ref().and_then(KeyProcess::pid))).ok().flatten()
    }

    /// Whether the engine's keys are held by a key agent
    /// ([`Isolation::Agent`]), whose envelopes need no store or machine key
    /// here. False once closed.
    pub fn is_agent(&self) -> bool {
        self.with(|p| Ok::<_, SignError>(p.key_process.as_ref().is_some_and(KeyProcess::is_agent))).unwrap_or(false)
    }

    /// The engine's key process, for its status and restart counts.
    ///
    /// # Errors
    /// [`SignError::ShutDown`] once closed.
    pub fn key_process(&self) -> Result<Option<KeyProcess>, SignError> {
        self.with(|p| Ok(p.key_process.clone()))
    }

    /// Whether [`ManagedEngine::close`] has been called.
    pub fn is_closed(&self) -> bool {
        // A flag, not the parts' lock: in a forked child that lock may be
        // held by a thread that is not there.
        self.closed.load(Ordering::Acquire)
    }

    /// Shuts the engine down now: queued operations fail with
    /// [`SignError::ShutDown`] (running ones finish), the key process is
    /// ended and reaped before this returns, the remote signer's
    /// connections close, and every later call fails with
    /// [`SignError::ShutDown`]. Calling it again does nothing.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        if self.origin.forked() {
            // A forked child ends what it started itself, and never the
            // parent's parts.
            let mine = match self.child.try_lock() {
                Ok(mut g) => g.take(),
                Err(TryLockError::Poisoned(p)) => p.into_inner().take(),
                Err(TryLockError::WouldBlock) => None,
            };
            match mine {
                Some((origin, parts)) if !origin.forked() => parts.stop(),
                Some(other) => std::mem::forget(other),
                None => {}
            }
            return;
        }
        let parts = self.parts.write().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(parts) = parts {
            parts.stop();
        }
    }
}

impl Drop for ManagedEngine {
    fn drop(&mut self) {
        self.close();
        if self.origin.forked() {
            // The parent's parts: dropping them here would wait for its
            // threads and end its key process. Left as they are.
            let parent = self.parts.get_mut().unwrap_or_else(|e| e.into_inner()).take();
            std::mem::forget(parent);
        }
    }
}
