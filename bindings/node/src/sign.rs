//! Asynchronous signing: an engine (per-class executors with bounded
//! queues and deadlines, optionally a key process) and private
//! keys. `engine.sign` returns a promise that the engine settles through
//! [`Completions`]: no thread, and no libuv work item, per signature.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keyfence::sign::key_process::{KeyProcessConfig, KeySource};
use keyfence::sign::managed::{millis, Isolation, ManagedConfig, ManagedEngine};
use keyfence::sign::{self as core, ClassConfig, KeyKind, OpClass, Request};
use keyfence::ErrorCode;
use napi::bindgen_prelude::{Array, Buffer, Either, Function, Object, Uint8Array, Unknown};
use napi::Env;
use napi_derive::napi;
use zeroize::Zeroizing;

use crate::error::{js, KfError, KfResult};
use crate::promise::Completions;

/// PEM text or PEM/DER bytes.
type PemInput = Either<String, Uint8Array>;

fn pem_bytes(pem: &PemInput) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(match pem {
        Either::A(s) => s.as_bytes().to_vec(),
        Either::B(b) => b.to_vec(),
    })
}

/// A private key: in this process's memory, or a handle on one held by an
/// engine's key process. `util.inspect` shows only its kind.
#[napi(namespace = "sign")]
pub struct PrivateKey {
    pub(crate) inner: Arc<core::PrivateKey>,
}

#[napi(namespace = "sign")]
impl PrivateKey {
    /// Loads a private key held in this process from PEM or DER (PKCS#1,
    /// PKCS#8, SEC1; RSA 2048-4096, ECDSA P-256/P-384, Ed25519), or from a
    /// private `KeyObject` of `node:crypto`. For a key kept in a key
    /// process, use `engine.loadKey`.
    ///
    /// Throws `KeyfenceError` code `INVALID_PRIVATE_KEY` (what is wrong,
    /// never the key's contents).
    #[napi(factory)]
    pub fn from_pem(env: Env, #[napi(ts_arg_type = "PrivateKeyInput")] pem: Either<String, Uint8Array>) -> napi::Result<Self> {
        let bytes = pem_bytes(&pem);
        js(&env, core::PrivateKey::from_bytes(&bytes).map(|k| PrivateKey { inner: Arc::new(k) }).map_err(Into::into))
    }

    /// The kind of key: `rsa-2048` (any size), `ec-p256`, `ec-p384` or
    /// `ed25519`.
    #[napi(getter)]
    pub fn kind(&self) -> String {
        match self.inner.kind() {
            KeyKind::Rsa { bits } => format!("rsa-{bits}"),
            KeyKind::EcP256 => "ec-p256".into(),
            KeyKind::EcP384 => "ec-p384".into(),
            KeyKind::Ed25519 => "ed25519".into(),
        }
    }

    /// Whether the key is in this process (false: a key process
    /// or remote key servers hold it).
    #[napi(getter)]
    pub fn is_local(&self) -> bool {
        self.inner.is_local()
    }

    /// The public half as DER `SubjectPublicKeyInfo` (for
    /// `crypto.createPublicKey({ key, format: 'der', type: 'spki' })`).
    ///
    /// Throws `KeyfenceError` code `BACKEND_FAILED` if the key process
    /// holding the key cannot answer.
    #[napi]
    pub fn public_key_der(&self, env: Env) -> napi::Result<Buffer> {
        js(&env, self.inner.public_key_der().map(Buffer::from).map_err(Into::into))
    }
}

/// The size of one executor class.
#[napi(object, namespace = "sign")]
pub struct ClassOptions {
    /// Worker threads, a whole number from 1 to 4096.
    pub threads: Option<u32>,
    /// Operations that may wait in the queue, a whole number from 1 to
    /// 16777216 (2^24); beyond it, `sign` rejects at once with code
    /// `OVERLOADED`.
    pub queue_capacity: Option<u32>,
}

/// How an engine is sized. Unset fields take the core's defaults, which
/// derive from the number of cores.
#[napi(object, namespace = "sign")]
pub struct EngineOptions {
    /// The RSA executor.
    pub rsa: Option<ClassOptions>,
    /// The ECDSA/Ed25519 executor.
    pub ec: Option<ClassOptions>,
    /// The executor of operations that wait on something outside the
    /// process (the key process).
    pub slow: Option<ClassOptions>,
    /// The executor of PKCS#11 token keys this process loaded
    /// (`engine.loadPkcs11` on an engine without a key process): each
    /// operation waits on the token, so they have threads of their own.
    pub token: Option<ClassOptions>,
    /// The deadline of a signature that does not set its own, in
    /// milliseconds, a whole number from 1 to 2^32 - 1 (default 2000); past
    /// it the promise rejects with code `TIMED_OUT`.
    pub timeout_ms: Option<f64>,
    /// Keep keys loaded with `engine.loadKey` in a key process
    /// (`keyfence-key-process`, found beside the addon), so that a memory
    /// disclosure in this process cannot reach them. Default false.
    pub isolated: Option<bool>,
    /// The key-process program, a path (never looked up on `PATH`);
    /// default: `keyfence-key-process` beside the addon.
    pub key_process: Option<String>,
    /// The socket of the machine's key agent (`keyfence agent`,
    /// docs/deploy.md), e.g. `'/run/keyfence/agent.sock'`: the agent holds
    /// the machine key and the store, opens the envelopes this engine loads
    /// (`engine.loadEnvelope(envelope)`, no store or machine key here) and
    /// signs for it. The engine connects when it is made, and again, loading
    /// its keys again, when the agent restarts. Not with `isolated` or
    /// `keyProcess`.
    pub agent: Option<String>,
    /// Whether keys in this process, or in its key process (`isolated`),
    /// sign on Intel's crypto_mb multi-buffer device (docs/offload.md):
    /// `'on'` (the engine is refused, code `BACKEND_FAILED`, where crypto_mb
    /// cannot run: no library, or a CPU without AVX-512 IFMA), `'auto'` (the
    /// device where it runs, else software) or `'off'`. Default: software
    /// in this process, `'auto'` in a key process. Not with `agent`: the
    /// agent chooses (`keyfence agent --offload`).
    #[napi(ts_type = "'off' | 'on' | 'auto'")]
    pub offload: Option<String>,
    /// crypto_mb's library for `offload` (a path, or a name the loader
    /// finds); default `KEYFENCE_CRYPTO_MB`, else `libcrypto_mb.so.13`.
    pub crypto_mb: Option<String>,
}

/// Options of one signature.
#[napi(object, namespace = "sign", object_to_js = false)]
pub struct SignOptions<'env> {
    /// This signature's deadline in milliseconds (a whole number from 1
    /// to 2^32 - 1), instead of the engine's.
    pub timeout_ms: Option<f64>,
    /// Aborting it cancels the signature; a signature still queued never
    /// runs. The promise rejects with a `KeyfenceError` named `AbortError`,
    /// code `ABORT_ERR`, whose `cause` is the signal's reason; when that
    /// reason is a `TimeoutError` (`AbortSignal.timeout(ms)`), one named
    /// `TimeoutError` with code `TIMED_OUT`, as the engine's own deadline
    /// gives. An already aborted signal rejects at once.
    #[napi(ts_type = "AbortSignal | null")]
    pub signal: Option<Object<'env>>,
}

/// Options of one `signSync` (which cannot be aborted: no `signal`).
#[napi(object, namespace = "sign", object_to_js = false)]
pub struct SignSyncOptions {
    /// This signature's deadline in milliseconds (a whole number from 1
    /// to 2^32 - 1), instead of the engine's.
    pub timeout_ms: Option<f64>,
}

fn class_config(c: &mut ClassConfig, o: Option<ClassOptions>) {
    if let Some(o) = o {
        if let Some(t) = o.threads {
            c.threads = t as usize;
        }
        if let Some(q) = o.queue_capacity {
            c.queue_capacity = q as usize;
        }
    }
}

/// The asynchronous signing engine: one executor per class of operation
/// (RSA, EC/Ed25519, slow, PKCS#11 token), each with its own threads and bounded queue,
/// a deadline on every operation. Signatures complete as promises without
/// blocking the event loop.
#[napi(namespace = "sign")]
pub struct Engine {
    pub(crate) inner: ManagedEngine,
    completions: Arc<Completions>,
    /// The key agent's socket, for an agent's engine.
    agent: Option<String>,
}

/// Latency of successful operations, in milliseconds.
#[napi(object, namespace = "sign")]
pub struct Latency {
    /// Operations recorded.
    pub count: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest.
    pub max: f64,
}

/// A snapshot of one executor class.
#[napi(object, namespace = "sign")]
pub struct ClassMetrics {
    /// Worker threads.
    pub workers: u32,
    /// Queue capacity.
    pub queue_capacity: u32,
    /// Operations waiting in the queue now.
    pub queue_depth: u32,
    /// Operations being performed now.
    pub in_flight: u32,
    /// Operations accepted since the engine started.
    pub submitted: f64,
    /// Operations completed successfully.
    pub completed: f64,
    /// Operations that ended in an error, by kind.
    pub errors: ErrorCounts,
    /// Latency of successful operations.
    pub latency: Latency,
}

/// Operations of one executor class that ended in an error, by kind.
#[napi(object, namespace = "sign")]
pub struct ErrorCounts {
    /// Refused at submission: the queue was full (`OVERLOADED`).
    pub overloaded: f64,
    /// Past their deadline (`TIMED_OUT`).
    pub timed_out: f64,
    /// Cancelled through their `AbortSignal`.
    pub cancelled: f64,
    /// Dropped by `close` (`SHUT_DOWN`).
    pub shut_down: f64,
    /// Refused as invalid (`INVALID_REQUEST`).
    pub invalid: f64,
    /// Failed in the backend (`BACKEND_FAILED`).
    pub failed: f64,
}

fn error_counts(errors: &core::ErrorCounts) -> ErrorCounts {
    let mut out = ErrorCounts { overloaded: 0.0, timed_out: 0.0, cancelled: 0.0, shut_down: 0.0, invalid: 0.0, failed: 0.0 };
    for (kind, n) in errors.iter() {
        // Exhaustive: a new kind in the core is a compile error here, not a
        // key missing from JavaScript.
        let slot = match kind {
            core::ErrorKind::Overloaded => &mut out.overloaded,
            core::ErrorKind::TimedOut => &mut out.timed_out,
            core::ErrorKind::Cancelled => &mut out.cancelled,
            core::ErrorKind::ShutDown => &mut out.shut_down,
            core::ErrorKind::Invalid => &mut out.invalid,
            core::ErrorKind::Failed => &mut out.failed,
        };
        *slot = n as f64;
    }
    out
}

/// A snapshot of every executor class of an engine.
#[napi(object, namespace = "sign")]
pub struct EngineMetrics {
    /// RSA in software.
    pub rsa: ClassMetrics,
    /// ECDSA and Ed25519 in software.
    pub ec: ClassMetrics,
    /// Operations that wait outside the process (the key process).
    pub slow: ClassMetrics,
    /// Operations of PKCS#11 token keys loaded in this process (a key
    /// process's or an agent's token keys count under `rsa` or `ec`, by
    /// their kind).
    pub token: ClassMetrics,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn class_metrics(m: &core::ClassMetrics) -> ClassMetrics {
    let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    ClassMetrics {
        workers: n(m.workers),
        queue_capacity: n(m.queue_capacity),
        queue_depth: n(m.queue_depth),
        in_flight: n(m.in_flight),
        submitted: m.submitted as f64,
        completed: m.completed as f64,
        errors: error_counts(&m.errors),
        latency: Latency {
            count: m.latency.count as f64,
            p50: ms(m.latency.p50),
            p90: ms(m.latency.p90),
            p99: ms(m.latency.p99),
            p999: ms(m.latency.p999),
            max: ms(m.latency.max),
        },
    }
}

/// The request `sign` and `signSync` submit. The timeout is a number, not
/// u32, so that -1 or 1.5 is refused rather than wrapped or truncated
/// (index.js refuses them first, with a `RangeError`).
fn request(key: &PrivateKey, algorithm: &str, data: &[u8], timeout_ms: Option<f64>) -> KfResult<Request> {
    Ok(ManagedEngine::request(key.inner.clone(), algorithm, data.to_vec(), timeout_ms)?)
}

#[napi(namespace = "sign")]
impl Engine {
    /// Starts an engine: its worker threads, and its key process when
    /// `isolated` is set, or its connection to the key agent when `agent`
    /// is.
    ///
    /// Throws `KeyfenceError` code `INVALID_CONFIG` (a size out of range,
    /// no key process found, an `offload` not `off`, `on` or `auto`,
    /// `offload` with `agent`, `cryptoMb` without `offload`),
    /// `INVALID_ARGUMENT` (`agent` with `isolated` or `keyProcess`, or
    /// empty), `IO` (threads), `BACKEND_FAILED` (the key process does not
    /// start; `offload: 'on'` where crypto_mb cannot run; no agent answers
    /// on `agent`, or it refuses this user: the reason in the message).
    #[napi(constructor)]
    pub fn new(env: Env, options: Option<EngineOptions>) -> napi::Result<Self> {
        let completions = Completions::new(&env)?;
        let mut config = ManagedConfig::default();
        let mut agent = None;
        if let Some(o) = options {
            class_config(&mut config.engine.rsa, o.rsa);
            class_config(&mut config.engine.ec, o.ec);
            class_config(&mut config.engine.slow, o.slow);
            class_config(&mut config.engine.token, o.token);
            if let Some(t) = o.timeout_ms {
                // A number, not u32, so that nothing wraps (index.js
                // refuses what this would, with a `RangeError`).
                match millis(t, "options.timeoutMs") {
                    Ok(d) => config.engine.default_timeout = d,
                    Err(e) => return Err(KfError::from(e).into_napi(&env)),
                }
            }
            if let Some(socket) = o.agent {
                let refused = if o.isolated.unwrap_or(false) || o.key_process.is_some() {
                    Some("options.agent and options.isolated (or keyProcess) are exclusive: an engine's keys are either in its own key process or in the key agent")
                } else if socket.is_empty() {
                    Some("options.agent is empty: name the agent's socket, such as '/run/keyfence/agent.sock'")
                } else {
                    None
                };
                if let Some(message) = refused {
                    return Err(KfError::new(ErrorCode::InvalidArgument, message).into_napi(&env));
                }
                config.isolation = Isolation::Agent(socket.clone().into());
                agent = Some(socket);
            } else if o.isolated.unwrap_or(false) || o.key_process.is_some() {
                config.isolation = Isolation::KeyProcess(match o.key_process {
                    Some(p) => KeyProcessConfig::with_command([p]),
                    None => KeyProcessConfig::default(),
                });
            }
            if let Some(mode) = o.offload {
                match mode.parse() {
                    Ok(mode) => config.offload = Some(mode),
                    Err(e) => return Err(KfError::from(e).into_napi(&env)),
                }
            }
            config.crypto_mb = o.crypto_mb;
        }
        js(&env, ManagedEngine::start(config).map_err(Into::into)).map(|inner| Engine { inner, completions, agent })
    }

    /// The key agent's socket when the engine's keys are in an agent
    /// (`new Engine({ agent })`), else null.
    #[napi(getter)]
    pub fn agent(&self) -> Option<String> {
        self.agent.clone()
    }

    /// Whether the engine's keys are outside this process: in its key
    /// process (`isolated`), or in the key agent (`agent`).
    #[napi(getter)]
    pub fn isolated(&self) -> bool {
        self.inner.has_key_process()
    }

    /// The key process's pid, while one runs.
    #[napi(getter)]
    pub fn key_process_pid(&self) -> Option<u32> {
        self.inner.key_process_pid()
    }

    /// Loads a private key for this engine from PEM or DER, or a private
    /// `KeyObject` of `node:crypto`: into its
    /// key process when it has one (this process keeps only a
    /// handle), else into this process as `PrivateKey.fromPem` does.
    ///
    /// Throws `KeyfenceError` code `INVALID_PRIVATE_KEY`, `BACKEND_FAILED`
    /// if the key process refuses it, `SHUT_DOWN` after `close`.
    #[napi]
    pub fn load_key(&self, env: Env, #[napi(ts_arg_type = "PrivateKeyInput")] pem: Either<String, Uint8Array>) -> napi::Result<PrivateKey> {
        let inner = self.inner.load(KeySource::Bytes(pem_bytes(&pem)));
        js(&env, inner.map(|inner| PrivateKey { inner }).map_err(Into::into))
    }

    /// Loads the private key an envelope holds, opened with the machine key
    /// file `machineKey` against the store folder `store`. With an isolated
    /// engine the key process opens it and keeps the key: this process
    /// reads only the machine key's public part (to check that the
    /// envelope can be opened, with the same errors either way), so neither
    /// the machine key's secret nor the private key is ever here. Without
    /// one, it is opened here, as `Machine.open` does.
    ///
    /// With an agent's engine (`new Engine({ agent })`) the envelope alone:
    /// `loadEnvelope(envelope)`; the agent opens it with its own machine key
    /// and store, and this process reads neither (a store and machine key
    /// given anyway are not read).
    ///
    /// Throws `KeyfenceError` code `IO` (the machine key file cannot be
    /// read), `INVALID_KEY`, `INVALID_ENVELOPE`, `POLICY_NOT_SATISFIED`,
    /// `RETIRED_GENERATION`, `UNKNOWN_POLICY_KEY`, `WRONG_AUTHORITY`,
    /// `STORE_IO`, `INVALID_PRIVATE_KEY` (the same when an agent opens it,
    /// with the agent's reason), `BACKEND_FAILED` (the key process or the
    /// agent itself failed), `INVALID_ARGUMENT` (the
    /// envelope alone with an engine that is not an agent's), `SHUT_DOWN`
    /// after `close`.
    #[napi(ts_args_type = "...args: [store: string, machineKey: string, envelope: Bytes] | [envelope: Bytes]")]
    pub fn load_envelope(
        &self, env: Env, first: Either<String, Uint8Array>, machine_key: Option<String>, envelope: Option<Uint8Array>,
    ) -> napi::Result<PrivateKey> {
        let source = match (first, machine_key, envelope) {
            (Either::A(store), Some(machine_key), Some(envelope)) => KeySource::envelope(envelope.to_vec(), store, machine_key),
            // Without a store and machine key: the core decides (only an
            // engine whose keys are in an agent names neither).
            (Either::B(envelope), None, None) => KeySource::agent_envelope(envelope.to_vec()),
            _ => {
                return Err(KfError::new(
                    ErrorCode::InvalidArgument,
                    "invalid argument: loadEnvelope takes (store: string, machineKey: string, envelope: Uint8Array), \
                     or (envelope: Uint8Array) with an agent's engine",
                )
                .into_napi(&env))
            }
        };
        js(&env, self.inner.load(source).map(|inner| PrivateKey { inner }).map_err(Into::into))
    }

    /// Loads the private key that the PKCS#11 URI `uri` (RFC 7512) names:
    /// a handle on a key that never leaves its token (an HSM, a TPM,
    /// SoftHSM2), which signs for it on the engine's `token` class.
    ///
    /// The URI names the token and the key object, and may name the
    /// module (`module-path=`) and a file whose first line is the PIN
    /// (`pin-source=file:/path`); what it leaves out comes from the
    /// environment of the process that loads the key:
    /// `KEYFENCE_PKCS11_MODULE`, then `KEYFENCE_PKCS11_PIN_FILE` or
    /// `KEYFENCE_PKCS11_PIN`. A PIN in the URI (`pin-value=`) is refused.
    /// Without a key process this process loads the module (once; every
    /// key of a token shares its sessions and login); with `isolated` the
    /// key process does, with the environment it inherited from this
    /// process, and with `agent` the agent, with its own module and PIN
    /// file: this process then never maps the module nor reads the PIN.
    /// It waits on the calling thread for the token, as `loadKey` and
    /// `loadEnvelope` do.
    ///
    /// ```js
    /// const { sign } = require('keyfence')
    /// const engine = new sign.Engine({ isolated: true })
    /// const key = engine.loadPkcs11('pkcs11:token=edge;object=tls-p256?pin-source=file:/etc/keyfence/pin')
    /// const signature = await engine.sign(key, 'ecdsa-p256-sha256', data)
    /// ```
    ///
    /// Throws `KeyfenceError` code `INVALID_ARGUMENT` (a URI that does not
    /// parse, holds a PIN, or names a PIN file that cannot be read; an
    /// engine whose keys are on remote key servers), `INVALID_CONFIG` (no
    /// module named, or one that cannot be loaded), `INVALID_PRIVATE_KEY`
    /// (no such token, the message listing the module's tokens, or no such
    /// key on it), `TOKEN_LOGIN` (no PIN, or a PIN the token refused: it is
    /// not tried again, so fix the PIN file and load again),
    /// `TOKEN_UNAVAILABLE`, `BACKEND_FAILED` (the key process or the agent
    /// failed or refused), `SHUT_DOWN` after `close`. No message holds the
    /// PIN.
    #[napi]
    pub fn load_pkcs11(&self, env: Env, uri: String) -> napi::Result<PrivateKey> {
        js(&env, self.inner.load(KeySource::Pkcs11(uri)).map(|inner| PrivateKey { inner }).map_err(Into::into))
    }

    /// Signs `data` with `key` and `algorithm` (`'ecdsa-p256-sha256'`,
    /// `'ecdsa-p384-sha384'`, `'rsa-pss-sha256'`, `'rsa-pkcs1-sha256'`,
    /// `'ed25519'`, ...; see docs/signing.md). The promise is settled by
    /// the engine when the signature is done; the event loop never waits.
    ///
    /// Rejects with `KeyfenceError` code `OVERLOADED` (the class's queue is
    /// full: shed load), `TIMED_OUT`, `INVALID_REQUEST` (an unknown
    /// algorithm, or one that does not fit the key), `BACKEND_FAILED`,
    /// `SHUT_DOWN`.
    #[napi(ts_return_type = "Promise<Buffer>")]
    pub fn sign<'env>(
        &self, env: &'env Env, key: &PrivateKey, algorithm: String, #[napi(ts_arg_type = "Bytes")] data: Uint8Array,
        options: Option<SignOptions>,
    ) -> napi::Result<Unknown<'env>> {
        Ok(self.submit(env, key, &algorithm, &data, options.and_then(|o| o.timeout_ms))?.0)
    }

    /// `sign`, returning `[promise, cancel]`: what `index.js` uses for a
    /// signature with a `signal`, adding and removing its abort listener
    /// there. `cancel()` returns whether the operation was still pending.
    /// Its options come first: they carry the signal that makes it
    /// cancellable.
    #[napi(skip_typescript)]
    pub fn sign_cancellable<'env>(
        &self, env: &'env Env, options: SignOptions, key: &PrivateKey, algorithm: String, data: Uint8Array,
    ) -> napi::Result<Array<'env>> {
        let (promise, handle) = self.submit(env, key, &algorithm, &data, options.timeout_ms)?;
        let cancel: Function<(), bool> =
            env.create_function_from_closure("cancel", move |_| Ok(handle.as_ref().is_some_and(|h| h.cancel())))?;
        let mut out = env.create_array(2)?;
        out.set(0, promise)?;
        out.set(1, cancel)?;
        Ok(out)
    }

    /// Submits one signature; the promise, and the operation's handle
    /// when the engine accepted it.
    fn submit<'env>(
        &self, env: &'env Env, key: &PrivateKey, algorithm: &str, data: &[u8], timeout_ms: Option<f64>,
    ) -> napi::Result<(Unknown<'env>, Option<core::OpHandle>)> {
        let (pending, promise) = self.completions.begin(env)?;
        // The callback owns the promise's token; if the engine refuses the
        // request it drops the callback uncalled, and the token is taken
        // back from this slot to reject the promise at once.
        let slot = Arc::new(Mutex::new(Some(pending)));
        let submitted = request(key, algorithm, data, timeout_ms).and_then(|req| {
            let (done, slot) = (self.completions.clone(), slot.clone());
            Ok(self.inner.submit_with_callback(req, move |result| {
                if let Some(p) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    done.complete(p, result);
                }
            })?)
        });
        match submitted {
            Ok(handle) => Ok((promise, Some(handle))),
            Err(e) => {
                if let Some(p) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    self.completions.reject_now(env, p, e);
                }
                Ok((promise, None))
            }
        }
    }

    /// `sign`, waiting on the calling thread for the signature: for
    /// scripts, never for a server's event loop. It cannot be aborted:
    /// `options.signal` is refused (a `TypeError`); pass it to `sign`.
    ///
    /// Throws as `sign` rejects.
    #[napi]
    pub fn sign_sync(
        &self, env: Env, key: &PrivateKey, algorithm: String, #[napi(ts_arg_type = "Bytes")] data: Uint8Array,
        options: Option<SignSyncOptions>,
    ) -> napi::Result<Buffer> {
        let run = || -> KfResult<Buffer> {
            let sig = self.inner.submit(request(key, &algorithm, &data, options.and_then(|o| o.timeout_ms))?)?.wait()?;
            Ok(Buffer::from(sig.to_vec()))
        };
        js(&env, run())
    }

    /// A snapshot of every class's counters and latency percentiles.
    ///
    /// Throws `KeyfenceError` code `SHUT_DOWN` after `close`.
    #[napi]
    pub fn metrics(&self, env: Env) -> napi::Result<EngineMetrics> {
        let m = js(&env, self.inner.metrics().map_err(Into::into))?;
        Ok(EngineMetrics {
            rsa: class_metrics(m.class(OpClass::Rsa)),
            ec: class_metrics(m.class(OpClass::Ec)),
            slow: class_metrics(m.class(OpClass::Slow)),
            token: class_metrics(m.class(OpClass::Token)),
        })
    }

    /// Every class's queue depths, counters and latency histograms, and
    /// the figures of attached remote signers, in Prometheus text format:
    /// what a `/metrics` endpoint serves.
    ///
    /// Throws `KeyfenceError` code `SHUT_DOWN` after `close`.
    #[napi]
    pub fn metrics_prometheus(&self, env: Env) -> napi::Result<String> {
        js(&env, self.inner.metrics().map(|m| m.prometheus()).map_err(Into::into))
    }

    /// Shuts the engine down now rather than when it is garbage-collected:
    /// queued signatures reject with code `SHUT_DOWN`, running ones finish,
    /// the key process is ended (keys loaded into it stop working), and
    /// later calls reject with `SHUT_DOWN`.
    #[napi]
    pub fn close(&self) {
        self.inner.close();
    }
}
