//! Remote signing: a client of key servers (`keyfence serve`) whose keys
//! are ordinary `PrivateKey`s, signed through any engine's slow class.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use keyfence::sign::remote::{self as core, PeerConfig, RemoteConfig, TlsFiles};
use keyfence::wrap::Envelope;
use keyfence::ErrorCode;
use napi::bindgen_prelude::{AsyncTask, Uint8Array};
use napi::Env;
use napi_derive::napi;

use crate::error::{js, KfError, KfResult};
use crate::sign::{Engine, PrivateKey};
use crate::task::Job;
use crate::wrap::Machine;

/// A key server a `RemoteSigner` may ask.
#[napi(object, namespace = "sign")]
pub struct Peer {
    /// Its name in metrics and errors, and the DNS name its TLS
    /// certificate must carry unless `serverName` is given.
    pub name: String,
    /// `host:port` where it listens.
    pub address: String,
    /// Its machine's attributes (`{ country: 'US' }`): the keys whose
    /// policy they satisfy are the keys it is asked for. An object or a
    /// `Map`, as everywhere attributes are taken.
    #[napi(ts_type = "Attributes")]
    pub attributes: HashMap<String, String>,
    /// The DNS name its certificate carries, when not `name`.
    pub server_name: Option<String>,
}

/// How a `RemoteSigner` connects and retries.
#[napi(object, namespace = "sign")]
pub struct RemoteOptions {
    /// The key servers.
    pub peers: Vec<Peer>,
    /// This client's certificate chain (a PEM file).
    pub cert: String,
    /// This client's private key (a PEM file, owner-readable only).
    pub key: String,
    /// The CA certificates (a PEM file) the servers' certificates must
    /// chain to; nothing else is trusted.
    pub ca: String,
    /// An id sent with each request for older servers, a whole number
    /// from 0 to 2^32 - 1 (default 0); servers of this version ignore it
    /// and take the tenant from this client's certificate (docs/remote.md,
    /// "Tenants").
    pub tenant: Option<u32>,
    /// Milliseconds for a TCP connect and TLS handshake, a whole number
    /// from 1 to 2^32 - 1 (default 1000).
    pub connect_timeout_ms: Option<u32>,
    /// Milliseconds one attempt waits for its reply before the next peer
    /// is tried, never past the signature's deadline; a whole number from
    /// 1 to 2^32 - 1 (default 1000).
    pub request_timeout_ms: Option<u32>,
    /// Attempts per operation, the first included; a whole number from 1
    /// to 2^32 - 1 (default 3).
    pub max_attempts: Option<u32>,
}

fn invalid(message: impl Into<String>) -> KfError {
    KfError::new(ErrorCode::InvalidArgument, message)
}

fn millis(ms: Option<u32>, default: Duration, name: &str) -> KfResult<Duration> {
    match ms {
        None => Ok(default),
        Some(0) => Err(invalid(format!("{name} must be at least 1"))),
        Some(ms) => Ok(Duration::from_millis(u64::from(ms))),
    }
}

fn config(o: RemoteOptions) -> KfResult<RemoteConfig> {
    let mut peers = Vec::with_capacity(o.peers.len());
    for p in o.peers {
        let mut pairs: Vec<_> = p.attributes.into_iter().collect();
        pairs.sort();
        let attrs = keyfence::policy::Attributes::try_from_pairs(pairs)?;
        let mut peer = PeerConfig::resolve(&p.name, &p.address, attrs)?;
        if let Some(s) = p.server_name {
            peer.server_name = s;
        }
        peers.push(peer);
    }
    let mut c = RemoteConfig::new(peers, TlsFiles { cert: o.cert.into(), key: o.key.into(), ca: o.ca.into() });
    c.tenant = u64::from(o.tenant.unwrap_or(0));
    c.connect_timeout = millis(o.connect_timeout_ms, c.connect_timeout, "connectTimeoutMs")?;
    c.request_timeout = millis(o.request_timeout_ms, c.request_timeout, "requestTimeoutMs")?;
    if let Some(n) = o.max_attempts {
        if n == 0 {
            return Err(invalid("maxAttempts must be at least 1"));
        }
        c.max_attempts = n;
    }
    Ok(c)
}

/// A client of remote key servers, for keys this machine may not open: a
/// bounded pool of multiplexed mutual-TLS connections per peer, the
/// nearest capable peer first (by round-trip times it measures itself),
/// the next on failure, a circuit breaker per peer, and retries with
/// backoff under a retry budget (docs/remote.md). Its keys are
/// `PrivateKey`s any engine signs with, on its slow class.
#[napi(namespace = "sign")]
pub struct RemoteSigner {
    pub(crate) inner: Option<core::RemoteSigner>,
}

impl RemoteSigner {
    fn signer(&self) -> KfResult<core::RemoteSigner> {
        self.inner.clone().ok_or_else(|| KfError::new(ErrorCode::ShutDown, "the remote signer is closed"))
    }
}

fn key_job(
    signer: KfResult<core::RemoteSigner>, envelope: Vec<u8>, machine: Option<Arc<keyfence::wrap::Machine>>,
) -> Job<Arc<keyfence::sign::PrivateKey>, PrivateKey> {
    Job::new(
        move || {
            let signer = signer?;
            Ok(match machine {
                Some(m) => signer.open_or_forward(&m, &envelope)?,
                None => signer.key(&Envelope::parse(&envelope)?)?,
            })
        },
        |inner| PrivateKey { inner },
    )
}

#[napi(namespace = "sign")]
impl RemoteSigner {
    /// Starts a client: reads the TLS files and starts measuring each
    /// peer's round-trip time in the background; connections are made
    /// when first needed.
    ///
    /// Throws `KeyfenceError` code `INVALID_CONFIG` (no peers, TLS files
    /// that cannot be used, an address that is not `host:port`),
    /// `INVALID_ATTRIBUTES`, `INVALID_ARGUMENT` (a zero limit).
    #[napi(constructor)]
    pub fn new(env: Env, options: RemoteOptions) -> napi::Result<Self> {
        let start = || -> KfResult<core::RemoteSigner> { Ok(core::RemoteSigner::start(config(options)?)?) };
        js(&env, start()).map(|s| RemoteSigner { inner: Some(s) })
    }

    /// A handle on the key in `envelope`, held by the peers whose
    /// attributes satisfy its policy; the secret never comes here. Asks
    /// the nearest of them for the public half.
    ///
    /// Rejects with `KeyfenceError` code `INVALID_ENVELOPE`,
    /// `BACKEND_FAILED` (no configured peer may hold the key, or none
    /// answered), `OVERLOADED` (every capable peer refused for want of
    /// room), `SHUT_DOWN` after `close`.
    #[napi(ts_return_type = "Promise<sign.PrivateKey>")]
    pub fn key(&self, #[napi(ts_arg_type = "Bytes")] envelope: Uint8Array) -> AsyncTask<Job<Arc<keyfence::sign::PrivateKey>, PrivateKey>> {
        key_job(self.signer(), envelope.to_vec(), None).spawn()
    }

    /// The key in `envelope`: opened here when `machine`'s attributes
    /// satisfy its policy (signed in this process), otherwise a handle on
    /// the peers that may hold it, as `key` gives.
    ///
    /// Rejects as `machine.open` and `key`.
    #[napi(ts_args_type = "machine: wrap.Machine, envelope: Bytes", ts_return_type = "Promise<sign.PrivateKey>")]
    pub fn open_or_forward(&self, machine: &Machine, envelope: Uint8Array) -> AsyncTask<Job<Arc<keyfence::sign::PrivateKey>, PrivateKey>> {
        key_job(self.signer(), envelope.to_vec(), Some(machine.inner.clone())).spawn()
    }

    /// Per-peer round-trip time, breaker, connections, failovers, requests
    /// and latency, in Prometheus text format.
    ///
    /// Throws `KeyfenceError` code `SHUT_DOWN` after `close`.
    #[napi]
    pub fn metrics(&self, env: Env) -> napi::Result<String> {
        js(&env, self.signer().map(|s| s.metrics().prometheus()))
    }

    /// Closes the signer: later calls on it reject with `SHUT_DOWN`. Keys
    /// it gave keep their own reference and keep working.
    #[napi]
    pub fn close(&mut self) {
        self.inner = None;
    }
}

// The engine's side of remote signing lives here, above both, so that
// `sign` never reaches up into `remote`.
#[napi(namespace = "sign")]
impl Engine {
    /// Reports `remote`'s per-peer figures (round-trip time, breaker,
    /// connections, failovers, requests and latency) with this engine's
    /// `metricsPrometheus()` from now on.
    ///
    /// Throws `KeyfenceError` code `SHUT_DOWN` if either is closed.
    #[napi]
    pub fn attach_remote(&self, env: Env, remote: &RemoteSigner) -> napi::Result<()> {
        let attach = || -> KfResult<()> {
            let signer = remote.inner.clone().ok_or_else(|| KfError::new(ErrorCode::ShutDown, "the remote signer is closed"))?;
            Ok(self.inner.attach_metrics(Arc::new(signer))?)
        };
        js(&env, attach())
    }
}
