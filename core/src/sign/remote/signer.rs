//! The client backend: keys this machine cannot open are handles on keys
//! held by remote peers, and the engine sends their operations here, on
//! its slow executor (so they never wait in front of local RSA or ECDSA).
//!
//! Each operation goes to the nearest capable peer; on a connect failure,
//! a lost connection, an attempt timeout, `overloaded` or a peer that does
//! not hold the key, to the next, up to `max_attempts` attempts, each
//! after an exponential backoff with full jitter and only while the retry
//! budget lasts; a peer whose breaker is open is skipped. The caller's
//! deadline bounds it all: each request carries what is left of it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use rand_core::{OsRng, RngCore};

use super::breaker::{BreakerConfig, BreakerState, Permit};
use super::conn::{error_of, CallError};
use super::keyring::KeyId;
use super::metrics::{request_stats, Outcome, RequestStats};
use super::pool::Pool;
use super::protocol::{self as p, kind, Frame, Head, RemoteErrorCode};
use super::retry_budget::{RetryBudget, RetryBudgetConfig};
use super::routing::{self, PeerConfig, PeerState};
use super::tls::{self, TlsFiles};
use crate::backoff::backoff;
use crate::sign::executor;
use crate::sign::exposition::Exposition;
use crate::sign::held_key::{Answer, HeldKey, KeyHolder};
use crate::sign::threads::{Joined, Origin};
use crate::sign::types::{BackendFailure, CryptoOp, KeyKind, OpClass, Operation, Output, Resource, SignError, TokenFailure};
use crate::sign::wire;
use crate::sign::PrivateKey;
use crate::wrap::{CanonicalPolicy, Envelope, Machine, Peer, RevocationList, MACHINE_LABEL};

/// The backend name in errors and metrics.
pub const NAME: &str = "remote";

/// How a client reaches its peers.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RemoteConfig {
    /// The key servers.
    pub peers: Vec<PeerConfig>,
    /// The client's certificate and key, and the CA the servers'
    /// certificates must come from.
    pub tls: TlsFiles,
    /// The tenant id written in the requests for keys made with
    /// [`RemoteSigner::key`]. Default 0. Servers ignore it: they take a
    /// client's tenant from its certificate (`docs/remote.md`, "Tenants").
    pub tenant: u64,
    /// Connections per peer, each multiplexing many requests. Default 2.
    pub connections_per_peer: usize,
    /// Time for a TCP connect, TLS handshake and hello. Default 1 s.
    pub connect_timeout: Duration,
    /// Time one attempt waits for its reply before the next peer is
    /// tried (never past the operation's deadline). Default 1 s.
    pub request_timeout: Duration,
    /// Attempts per operation, the first included. Default 3.
    pub max_attempts: u32,
    /// The first retry waits up to this (full jitter); each further one up
    /// to twice as long. Default 5 ms.
    pub backoff_base: Duration,
    /// The longest wait between attempts. Default 100 ms.
    pub backoff_cap: Duration,
    /// How many retries recent traffic allows.
    pub retry_budget: RetryBudgetConfig,
    /// When a peer is skipped.
    pub breaker: BreakerConfig,
    /// How often each peer's round-trip time is measured. Default 5 s.
    pub rtt_interval: Duration,
}

impl RemoteConfig {
    /// Defaults for `peers` with `tls`.
    pub fn new(peers: Vec<PeerConfig>, tls: TlsFiles) -> Self {
        RemoteConfig {
            peers,
            tls,
            tenant: 0,
            connections_per_peer: 2,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            max_attempts: 3,
            backoff_base: Duration::from_millis(5),
            backoff_cap: Duration::from_millis(100),
            retry_budget: RetryBudgetConfig::default(),
            breaker: BreakerConfig::default(),
            rtt_interval: Duration::from_secs(5),
        }
    }
}

/// One peer's counters, as [`RemoteSigner::metrics`] reports them.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PeerMetrics {
    /// The peer's name.
    pub name: String,
    /// Its smoothed round-trip time, once measured.
    pub rtt: Option<Duration>,
    /// Its breaker.
    pub breaker: BreakerState,
    /// How many times its breaker opened.
    pub breaker_opens: u64,
    /// Live connections to it.
    pub connections: usize,
    /// Attempts that failed over from it to another peer.
    pub failovers: u64,
    /// Attempts sent to it, how they ended, and their latency.
    pub stats: RequestStats,
}

/// A snapshot of a client's counters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientMetrics {
    /// Per peer.
    pub peers: Vec<PeerMetrics>,
    /// Operations routed.
    pub operations: u64,
    /// Attempts after the first (retries and failovers).
    pub retries: u64,
    /// Retries the budget refused.
    pub retries_refused: u64,
}

impl ClientMetrics {
    /// The Prometheus text exposition of these metrics.
    pub fn prometheus(&self) -> String {
        let mut e = Exposition::new();
        for (name, help, v) in [
            ("keyfence_remote_client_operations_total", "Operations routed to peers.", self.operations),
            ("keyfence_remote_client_retries_total", "Attempts after the first.", self.retries),
            ("keyfence_remote_client_retries_refused_total", "Retries the retry budget refused.", self.retries_refused),
        ] {
            e.family(name, "counter", help);
            e.sample(name, &[], v as f64);
        }
        let n = "keyfence_remote_client_peer_rtt_seconds";
        e.family(n, "gauge", "Smoothed round-trip time, by peer.");
        for p in &self.peers {
            if let Some(rtt) = p.rtt {
                e.sample(n, &[("peer", &p.name)], rtt.as_secs_f64());
            }
        }
        let n = "keyfence_remote_client_peer_breaker_open";
        e.family(n, "gauge", "1 while the peer's breaker is open.");
        for p in &self.peers {
            e.sample(n, &[("peer", &p.name)], f64::from(u8::from(p.breaker == BreakerState::Open)));
        }
        let n = "keyfence_remote_client_peer_connections";
        e.family(n, "gauge", "Live connections, by peer.");
        for p in &self.peers {
            e.sample(n, &[("peer", &p.name)], p.connections as f64);
        }
        let n = "keyfence_remote_client_peer_failovers_total";
        e.family(n, "counter", "Attempts that failed over to another peer, by the peer failed.");
        for p in &self.peers {
            e.sample(n, &[("peer", &p.name)], p.failovers as f64);
        }
        let series: Vec<(String, &RequestStats)> = self.peers.iter().map(|p| (p.name.clone(), &p.stats)).collect();
        request_stats(&mut e, "keyfence_remote_client_peer", "peer", &series);
        e.finish()
    }
}

/// A key held by the peers: its id, who may hold it, its tenant.
struct RemoteKey {
    key_id: [u8; 32],
    capable: Vec<usize>,
    tenant: u64,
}

pub(crate) struct Client {
    config: RemoteConfig,
    peers: Vec<PeerState>,
    keys: Mutex<HashMap<u64, Arc<RemoteKey>>>,
    next_key: AtomicU64,
    budget: RetryBudget,
    operations: AtomicU64,
    retries: AtomicU64,
    retries_refused: AtomicU64,
    /// Dropped with the client: stops the round-trip thread.
    _stop: Sender<()>,
    /// The client itself, for answers that arrive on other threads.
    me: Weak<Client>,
    /// Where work that must not wait where it is goes
    /// ([`Client::on_helper`]); dropped with the client, which ends the
    /// helper threads.
    helpers: OnceLock<Sender<Box<dyn FnOnce() + Send>>>,
    /// Jobs reserved on the helpers' queue and not yet started.
    helpers_queued: AtomicUsize,
    /// The round-trip thread and the helpers, joined when the client is
    /// dropped.
    threads: Mutex<Joined>,
    /// The process it was started in.
    origin: Origin,
}

impl Drop for Client {
    /// Stops the round-trip thread and the helpers (their channels close)
    /// and joins them; the pools then close and join their connections.
    fn drop(&mut self) {
        let (closed, _) = bounded(0);
        drop(std::mem::replace(&mut self._stop, closed));
        drop(self.helpers.take());
        self.threads.get_mut().unwrap_or_else(|e| e.into_inner()).join();
    }
}

/// Helper threads per client: retries after an attempt sent without
/// waiting failed, and connects needed on a submitting thread. Both are
/// rare while peers are up; when a connection with many requests in flight
/// ends, its retries queue here (each bounded by its deadline and the
/// retry budget).
const HELPERS: usize = 8;

/// Jobs that may wait for a helper; past it a retry is refused as if over
/// the retry budget (the caller hears the attempt's error), so a flood of
/// failures cannot grow the queue without bound.
const HELPER_QUEUE: usize = 4096;

/// How one attempt ended, for routing.
enum Attempt<T> {
    Done(T),
    /// Try the next peer; `breaker` says whether it counts against this
    /// one's breaker.
    Next {
        error: SignError,
        breaker: bool,
    },
    /// Stop: the answer is this error.
    Final(SignError),
}

fn backend_error(failure: BackendFailure, reason: impl Into<String>) -> SignError {
    SignError::backend(NAME, failure, reason)
}

/// A client of remote key servers, the engine's backend for keys this
/// machine may not open. Cheap to clone.
///
/// ```no_run
/// use keyfence::sign::{Algorithm, Engine, EngineConfig};
/// use keyfence::sign::remote::{PeerConfig, RemoteConfig, RemoteSigner, TlsFiles};
/// use keyfence::wrap::Envelope;
///
/// let tls = TlsFiles { cert: "client.pem".into(), key: "client.key".into(), ca: "ca.pem".into() };
/// let peers = vec![PeerConfig::new("sfo1", "10.0.0.7:7543".parse()?, "region=US,country=US".parse()?)];
/// let remote = RemoteSigner::start(RemoteConfig::new(peers, tls))?;
/// let envelope = Envelope::parse(&std::fs::read("key.env")?)?;
/// let key = remote.key(&envelope)?; // a handle; the secret stays in the US
/// let engine = Engine::new(EngineConfig::default())?;
/// let signature = engine.sign(&key, Algorithm::EcdsaP256Sha256, b"hello")?.wait()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RemoteSigner {
    client: Arc<Client>,
}

impl Drop for RemoteSigner {
    /// In a forked child, the parent's connections and threads are left
    /// alone (closing them here would end the parent's TLS sessions).
    fn drop(&mut self) {
        if self.client.origin.forked() {
            std::mem::forget(self.client.clone());
        }
    }
}

impl std::fmt::Debug for RemoteSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSigner")
            .field("peers", &self.client.peers.iter().map(|p| p.config.name.as_str()).collect::<Vec<_>>())
            .finish()
    }
}

impl RemoteSigner {
    /// Starts a client: reads the TLS files, and starts measuring each
    /// peer's round-trip time (the first round at once, in the
    /// background). Connections are made when first needed.
    ///
    /// # Errors
    /// [`SignError::Config`] for unusable TLS files, no peers, or zero
    /// sizes; [`SignError::Io`] if the measuring thread cannot start.
    pub fn start(config: RemoteConfig) -> Result<Self, SignError> {
        if config.peers.is_empty() {
            return Err(SignError::Config("a remote signer needs at least one peer".into()));
        }
        if config.connections_per_peer == 0 || config.max_attempts == 0 {
            return Err(SignError::Config("connections_per_peer and max_attempts must be at least 1".into()));
        }
        if config.connect_timeout.is_zero() || config.request_timeout.is_zero() || config.rtt_interval.is_zero() {
            return Err(SignError::Config("connect_timeout, request_timeout and rtt_interval must not be zero".into()));
        }
        let connector = tls::connector(&config.tls)?;
        let peers = config
            .peers
            .iter()
            .map(|pc| {
                let pool =
                    Pool::new(pc.addr, pc.server_name.clone(), connector.clone(), config.connections_per_peer, config.connect_timeout);
                PeerState::new(pc.clone(), pool, config.breaker)
            })
            .collect();
        let (stop, stopped) = bounded(0);
        let client = Arc::new_cyclic(|me| Client {
            me: me.clone(),
            helpers: OnceLock::new(),
            helpers_queued: AtomicUsize::new(0),
            budget: RetryBudget::new(config.retry_budget),
            config,
            peers,
            keys: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(1),
            operations: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            retries_refused: AtomicU64::new(0),
            _stop: stop,
            threads: Mutex::new(Joined::new()),
            origin: Origin::here(),
        });
        let weak = Arc::downgrade(&client);
        client
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .spawn("keyfence-remote-rtt".into(), move || measure_loop(&weak, &stopped))
            .map_err(|e| SignError::io(Resource::Thread, format!("cannot start the round-trip thread: {e}")))?;
        Ok(RemoteSigner { client })
    }

    /// A handle on the key in `envelope`, held by the peers whose
    /// attributes satisfy its policy, for the configured tenant. Asks the
    /// nearest of them for the key's public half (with the same failover
    /// as an operation), bounded by `connect_timeout + request_timeout`.
    ///
    /// # Errors
    /// [`SignError::Backend`] when no peer may hold the key
    /// ([`BackendFailure::Refused`]) or none answered.
    pub fn key(&self, envelope: &Envelope) -> Result<Arc<PrivateKey>, SignError> {
        self.key_for_tenant(envelope, self.client.config.tenant)
    }

    /// As [`RemoteSigner::key`], for keys of `tenant`.
    ///
    /// # Errors
    /// As [`RemoteSigner::key`].
    pub fn key_for_tenant(&self, envelope: &Envelope, tenant: u64) -> Result<Arc<PrivateKey>, SignError> {
        self.key_among(envelope, tenant, None)
    }

    /// As [`RemoteSigner::key`], never from a peer whose attributes name a
    /// machine id in `revoked` (its `machine` attribute): a revoked
    /// machine's key server is not trusted with the request.
    ///
    /// # Errors
    /// As [`RemoteSigner::key`]; [`BackendFailure::Refused`] naming the
    /// revoked peers when every peer that may hold the key is revoked.
    pub fn key_avoiding(&self, envelope: &Envelope, revoked: &RevocationList) -> Result<Arc<PrivateKey>, SignError> {
        self.key_among(envelope, self.client.config.tenant, Some(revoked))
    }

    fn key_among(&self, envelope: &Envelope, tenant: u64, revoked: Option<&RevocationList>) -> Result<Arc<PrivateKey>, SignError> {
        let c = &self.client;
        let mut capable = routing::capable(&envelope.policy, &c.peers);
        if let Some(revoked) = revoked {
            let is_revoked = |i: &usize| c.peers[*i].config.attributes.get(MACHINE_LABEL).is_some_and(|id| revoked.contains(id));
            let out: Vec<String> = capable.iter().filter(|i| is_revoked(i)).map(|&i| c.peers[i].config.name.clone()).collect();
            capable.retain(|i| !is_revoked(i));
            if capable.is_empty() && !out.is_empty() {
                return Err(backend_error(
                    BackendFailure::Refused,
                    format!("every peer that may hold the key is a revoked machine ({}): none is asked", out.join(", ")),
                ));
            }
        }
        if capable.is_empty() {
            return Err(no_capable_peer(&envelope.policy));
        }
        self.handle_on(RemoteKey { key_id: KeyId::of_envelope(envelope.to_bytes()).0, capable, tenant }, |_| Ok(()))
    }

    /// Asks the nearest of `key`'s peers for its public half (with the
    /// failover of an operation, bounded by `connect_timeout +
    /// request_timeout`), has `check` accept it, and gives a handle on it.
    fn handle_on(&self, key: RemoteKey, check: impl Fn(&[u8]) -> Result<(), SignError>) -> Result<Arc<PrivateKey>, SignError> {
        let c = &self.client;
        let key = Arc::new(key);
        let deadline = Instant::now() + c.config.connect_timeout + c.config.request_timeout;
        let (kind, der) = c.route(&key, deadline, |peer, head, until| {
            let frame = peer.pool.get(until).and_then(|conn| conn.call(|out, id| p::encode_public(out, id, head), until));
            attempt_of(frame, |f| {
                p::parse_public_reply(&f.body).map_err(|e| backend_error(BackendFailure::Protocol, format!("bad public-key reply: {e}")))
            })
        })?;
        check(&der)?;
        let id = c.next_key.fetch_add(1, Ordering::Relaxed);
        c.keys.lock().unwrap_or_else(|e| e.into_inner()).insert(id, key);
        let holder: Arc<dyn KeyHolder> = c.clone();
        Ok(Arc::new(PrivateKey::held(HeldKey::new(holder, id, kind, der))))
    }

    /// A handle on a key without an envelope, a PKCS#11 token's, served
    /// under `id` ([`KeyId::of_public_key`]) by whichever peers hold it
    /// (`keyfence serve --pkcs11`): every configured peer is a candidate,
    /// nearest first, and one that does not hold the key passes the
    /// request on. The public key a peer returns must hash to `id`, so a
    /// peer cannot substitute another key.
    ///
    /// # Errors
    /// [`SignError::Backend`] when no peer holds the key or none answered,
    /// or when the public key a peer gave does not match `id`.
    pub fn token_key(&self, id: KeyId) -> Result<Arc<PrivateKey>, SignError> {
        let c = &self.client;
        let key = RemoteKey { key_id: id.0, capable: (0..c.peers.len()).collect(), tenant: c.config.tenant };
        self.handle_on(key, |der| match KeyId::of_public_key(der) {
            theirs if theirs == id => Ok(()),
            theirs => {
                Err(backend_error(BackendFailure::Protocol, format!("a peer answered for key {id} with a public key whose id is {theirs}")))
            }
        })
    }

    /// The key in `envelope` from `machine` if its attributes allow it
    /// (opened here, signed in this process), otherwise a handle on the
    /// peers that may hold it, but no peer whose `machine` attribute the
    /// store's revocation list names: the Geo Key Manager decision.
    ///
    /// # Errors
    /// [`OpenOrForwardError::Wrap`] for a malformed envelope or one the
    /// machine may open but cannot, [`OpenOrForwardError::Key`] when it
    /// holds no usable key, [`OpenOrForwardError::Remote`] with the errors
    /// of [`RemoteSigner::key`].
    pub fn open_or_forward(&self, machine: &Machine, envelope: &[u8]) -> Result<Arc<PrivateKey>, OpenOrForwardError> {
        let env = Envelope::parse(envelope)?;
        if machine.could_open(&env) {
            let secret = machine.open_envelope(&env)?;
            return Ok(Arc::new(PrivateKey::from_bytes(&secret)?));
        }
        // What a forwarder checks: the store's signed list of revoked
        // machines (refused if it goes back on the newest this machine has
        // seen); a peer it names is not asked.
        let revoked = machine.revocations()?;
        Ok(self.key_avoiding(&env, &revoked)?)
    }

    /// Measures every peer's round-trip time now (one ping each, in
    /// parallel, bounded by `connect_timeout + request_timeout`).
    pub fn measure(&self) {
        self.client.measure();
    }

    /// The peers as the wrap layer's chooser sees them: name, attributes,
    /// measured round-trip time (`Duration::MAX` before the first).
    pub fn peers(&self) -> Vec<Peer> {
        self.client.peers.iter().map(PeerState::as_peer).collect()
    }

    /// A snapshot of the counters.
    pub fn metrics(&self) -> ClientMetrics {
        let c = &self.client;
        let now = Instant::now();
        ClientMetrics {
            peers: c
                .peers
                .iter()
                .map(|p| PeerMetrics {
                    name: p.config.name.clone(),
                    rtt: p.rtt(),
                    breaker: p.breaker.state(now),
                    breaker_opens: p.breaker.opens(),
                    connections: p.pool.live(),
                    failovers: p.failovers.load(Ordering::Relaxed),
                    stats: p.stats.snapshot(),
                })
                .collect(),
            operations: c.operations.load(Ordering::Relaxed),
            retries: c.retries.load(Ordering::Relaxed),
            retries_refused: c.retries_refused.load(Ordering::Relaxed),
        }
    }

    /// Closes every connection (requests in flight on them fail over or
    /// fail); later requests connect again.
    pub fn disconnect(&self) {
        for p in &self.client.peers {
            p.pool.close_all();
        }
    }
}

impl crate::sign::MetricsSource for RemoteSigner {
    fn name(&self) -> String {
        NAME.to_string()
    }

    fn prometheus(&self) -> String {
        self.metrics().prometheus()
    }
}

/// Why [`RemoteSigner::open_or_forward`] gave no key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenOrForwardError {
    /// The envelope is malformed, or the machine may open it but cannot.
    #[error(transparent)]
    Wrap(#[from] crate::wrap::WrapError),
    /// The envelope opened but holds no usable key.
    #[error(transparent)]
    Key(#[from] crate::sign::KeyError),
    /// No peer could be asked for the key.
    #[error(transparent)]
    Remote(#[from] SignError),
}

impl OpenOrForwardError {
    /// The stable error code.
    pub fn code(&self) -> crate::ErrorCode {
        match self {
            OpenOrForwardError::Wrap(e) => e.code(),
            OpenOrForwardError::Key(e) => e.code(),
            OpenOrForwardError::Remote(e) => e.code(),
        }
    }
}

fn no_capable_peer(policy: &CanonicalPolicy) -> SignError {
    backend_error(BackendFailure::Refused, format!("no configured peer's attributes satisfy the policy {policy}"))
}

/// Maps a reply (or its absence) to an attempt outcome; `ok` decodes an
/// OK frame.
fn attempt_of<T>(frame: Result<Frame, CallError>, ok: impl FnOnce(Frame) -> Result<T, SignError>) -> Attempt<T> {
    let frame = match frame {
        Ok(f) => f,
        Err(CallError::Connect(why)) => return Attempt::Next { error: backend_error(BackendFailure::Unavailable, why), breaker: true },
        Err(CallError::Lost(why)) => return Attempt::Next { error: backend_error(BackendFailure::Died, why), breaker: true },
        Err(CallError::TimedOut) => {
            let e = backend_error(BackendFailure::GaveUp, "no reply within the request timeout");
            return Attempt::Next { error: e, breaker: true };
        }
        Err(CallError::NoRoom) => {
            let e = backend_error(BackendFailure::NoRoom, "every request slot of the connection is in use");
            return Attempt::Next { error: e, breaker: false };
        }
    };
    let Some((code, msg, detail)) = error_of(&frame) else {
        return match frame.kind {
            kind::OK => match ok(frame) {
                Ok(v) => Attempt::Done(v),
                Err(e) => Attempt::Final(e),
            },
            k => Attempt::Final(backend_error(BackendFailure::Protocol, format!("unexpected reply kind {k:#04x}"))),
        };
    };
    match code {
        RemoteErrorCode::Overloaded | RemoteErrorCode::TenantLimit | RemoteErrorCode::ShuttingDown => {
            Attempt::Next { error: SignError::PeerOverloaded { reason: format!("{}: {msg}", code.name()) }, breaker: false }
        }
        RemoteErrorCode::UnknownKey | RemoteErrorCode::NotAllowed => {
            Attempt::Next { error: backend_error(BackendFailure::Refused, msg), breaker: false }
        }
        RemoteErrorCode::TimedOut => Attempt::Final(SignError::TimedOut { timeout: Duration::ZERO }),
        RemoteErrorCode::Crypto => Attempt::Final(SignError::Crypto { op: CryptoOp::Sign, reason: msg }),
        RemoteErrorCode::Invalid => Attempt::Final(backend_error(BackendFailure::Refused, format!("invalid request: {msg}"))),
        RemoteErrorCode::Malformed | RemoteErrorCode::Version => {
            Attempt::Final(backend_error(BackendFailure::Protocol, format!("{}: {msg}", code.name())))
        }
        // The peer's token is gone or will not log in: another peer may
        // hold the key on a token that works.
        // The peer answers; its token may serve no key at all, but its
        // envelopes' keys still work: the breaker is not touched. The
        // token's code reaches the caller if no peer signs.
        RemoteErrorCode::TokenUnavailable | RemoteErrorCode::TokenLogin => {
            let error = detail.rebuild(&msg).unwrap_or_else(|| {
                let failure = if code == RemoteErrorCode::TokenLogin { TokenFailure::Login } else { TokenFailure::Unavailable };
                SignError::Token { token: "pkcs11".into(), failure, reason: msg }
            });
            Attempt::Next { error, breaker: false }
        }
        // A server never sends the key process's own codes (the protocol
        // reads them as internal).
        RemoteErrorCode::Internal | RemoteErrorCode::Load | RemoteErrorCode::Privileges => {
            Attempt::Next { error: backend_error(BackendFailure::Refused, msg), breaker: true }
        }
    }
}

/// One attempt of `op` that waits for its reply: a connection from the
/// peer's pool (connecting if need be), the request, the reply.
fn blocking_attempt(op: &Operation) -> impl FnMut(&PeerState, &Head, Instant) -> Attempt<Output> + '_ {
    move |peer, head, until| {
        let frame = peer.pool.get(until).and_then(|conn| conn.call(|out, id| p::encode_op(out, id, head, op), until));
        attempt_of(frame, |f| Ok(f.body))
    }
}

/// A fresh random trace id.
fn trace_id() -> [u8; 16] {
    let mut t = [0u8; 16];
    OsRng.fill_bytes(&mut t);
    t
}

/// One operation's way through the peers: what its attempts so far have
/// left, so that routing can stop after any attempt and go on later on
/// another thread (an attempt sent without waiting, answered on a
/// connection's thread).
struct Route {
    key: Arc<RemoteKey>,
    deadline: Instant,
    start: Instant,
    head: Head,
    tried: Vec<usize>,
    last: Option<SignError>,
    /// Attempts made.
    made: u32,
    /// The operation's span, entered wherever its routing runs.
    span: tracing::Span,
}

/// What routing does after an attempt.
enum Step<T> {
    Done(T),
    Stop(SignError),
    Next,
}

impl Client {
    /// Starts routing an operation on `key` until `deadline`.
    fn begin(&self, key: Arc<RemoteKey>, deadline: Instant) -> Route {
        self.operations.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        self.budget.request(start);
        let head = Head { key_id: key.key_id, budget: Duration::ZERO, trace_id: trace_id(), tenant: key.tenant };
        let span = tracing::debug_span!("keyfence.remote.route", trace_id = %head.trace_hex(), tenant = key.tenant);
        Route { key, deadline, start, head, tried: Vec::new(), last: None, made: 0, span }
    }

    /// The peer for the next attempt, its breaker's permit, and the
    /// backoff to wait before it (zero for a first attempt); `None` when
    /// routing must stop (attempts, deadline, retry budget, every breaker
    /// open). Never waits itself, so a connection's thread may decide.
    fn next_peer(&self, r: &mut Route) -> Option<(usize, Permit, Duration)> {
        if r.made >= self.config.max_attempts {
            return None;
        }
        let now = Instant::now();
        if now >= r.deadline {
            return None;
        }
        // The nearest capable peer not yet tried whose breaker lets a
        // request through; when all were tried, the nearest again.
        let order = routing::order(&r.key.capable, &self.peers, now);
        let fresh: Vec<usize> = order.iter().copied().filter(|i| !r.tried.contains(i)).collect();
        let candidates = if fresh.is_empty() { order } else { fresh };
        let Some((i, permit)) = candidates.iter().find_map(|&i| self.peers[i].breaker.allow(now).map(|p| (i, p))) else {
            r.last.get_or_insert_with(|| backend_error(BackendFailure::Unavailable, "every capable peer's circuit breaker is open"));
            return None;
        };
        if r.made > 0 {
            if !self.budget.try_retry(now) {
                self.retries_refused.fetch_add(1, Ordering::Relaxed);
                self.peers[i].breaker.neutral(permit);
                return None;
            }
            self.retries.fetch_add(1, Ordering::Relaxed);
            let wait = backoff(r.made - 1, self.config.backoff_base, self.config.backoff_cap, OsRng.next_u64());
            if Instant::now() + wait >= r.deadline {
                self.peers[i].breaker.neutral(permit);
                return None;
            }
            return Some((i, permit, wait));
        }
        Some((i, permit, Duration::ZERO))
    }

    /// An attempt on peer `i` leaves now: its budget in the head, and
    /// when it gives up (the request timeout, never past the deadline).
    fn sending(&self, r: &mut Route, i: usize) -> (Instant, Instant) {
        let peer = &self.peers[i];
        r.made += 1;
        r.tried.push(i);
        let sent = Instant::now();
        r.head.budget = r.deadline.saturating_duration_since(sent);
        peer.stats.begin();
        tracing::debug!(peer = %peer.config.name, attempt = r.made, budget_us = r.head.budget.as_micros() as u64, "sending");
        (sent, r.deadline.min(sent + self.config.request_timeout))
    }

    /// Records how the attempt sent to peer `i` at `sent` ended: breaker,
    /// counters, and what routing does next.
    fn end_attempt<T>(&self, r: &mut Route, i: usize, permit: Permit, sent: Instant, attempt: Attempt<T>) -> Step<T> {
        let peer = &self.peers[i];
        match attempt {
            Attempt::Done(v) => {
                peer.breaker.success(permit);
                peer.stats.end(Outcome::Ok, sent.elapsed());
                Step::Done(v)
            }
            Attempt::Final(e) => {
                peer.breaker.neutral(permit);
                // The server's `timed_out` carries no duration: report
                // the caller's own timeout.
                let e = match e {
                    SignError::TimedOut { .. } => SignError::TimedOut { timeout: r.deadline.saturating_duration_since(r.start) },
                    e => e,
                };
                let outcome = if e.kind() == crate::sign::ErrorKind::TimedOut { Outcome::TimedOut } else { Outcome::Failed };
                peer.stats.end(outcome, sent.elapsed());
                tracing::debug!(peer = %peer.config.name, error = %e, "final");
                Step::Stop(e)
            }
            Attempt::Next { error, breaker } => {
                if breaker {
                    peer.breaker.failure(permit, Instant::now());
                } else {
                    peer.breaker.neutral(permit);
                }
                let outcome = match &error {
                    SignError::PeerOverloaded { .. } => Outcome::Overloaded,
                    SignError::Backend { failure: BackendFailure::GaveUp, .. } => Outcome::TimedOut,
                    _ => Outcome::Failed,
                };
                peer.stats.end(outcome, sent.elapsed());
                peer.failovers.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = %peer.config.name, error = %error, "trying the next peer");
                r.last = Some(error);
                Step::Next
            }
        }
    }

    /// The error routing ends with when no attempt succeeded.
    fn give_up(r: &mut Route) -> SignError {
        match r.last.take() {
            Some(e) if Instant::now() < r.deadline => e,
            _ => SignError::TimedOut { timeout: r.deadline.saturating_duration_since(r.start) },
        }
    }

    /// Runs `attempt` on the capable peers of `r`'s key, nearest first,
    /// with failover, backoff, the retry budget and breakers, until one
    /// answers or the deadline; blocks throughout.
    fn run_route<T>(&self, r: &mut Route, attempt: impl FnMut(&PeerState, &Head, Instant) -> Attempt<T>) -> Result<T, SignError> {
        let next = self.next_peer(r);
        self.run_route_from(r, next, attempt)
    }

    /// As [`Client::run_route`], with the next attempt already chosen.
    fn run_route_from<T>(
        &self, r: &mut Route, mut next: Option<(usize, Permit, Duration)>,
        mut attempt: impl FnMut(&PeerState, &Head, Instant) -> Attempt<T>,
    ) -> Result<T, SignError> {
        let _entered = r.span.clone().entered();
        while let Some((i, permit, wait)) = next {
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            let (sent, until) = self.sending(r, i);
            match self.end_attempt(r, i, permit, sent, attempt(&self.peers[i], &r.head, until)) {
                Step::Done(v) => return Ok(v),
                Step::Stop(e) => return Err(e),
                Step::Next => next = self.next_peer(r),
            }
        }
        Err(Self::give_up(r))
    }

    /// As [`Client::run_route`], for a new operation.
    fn route<T>(
        &self, key: &Arc<RemoteKey>, deadline: Instant, attempt: impl FnMut(&PeerState, &Head, Instant) -> Attempt<T>,
    ) -> Result<T, SignError> {
        let mut r = self.begin(key.clone(), deadline);
        self.run_route(&mut r, attempt)
    }

    /// Routes an operation, blocking, from wherever `r` stands.
    fn run_op(&self, r: &mut Route, op: &Operation) -> Result<Output, SignError> {
        let op = wire::op::fit(op, p::MAX_OP_DATA)?;
        self.run_route(r, blocking_attempt(&op))
    }

    /// As [`Client::run_op`], with the next attempt already chosen (on a
    /// connection's thread). `op` fitted once already, so it fits again.
    fn run_op_from(&self, r: &mut Route, next: (usize, Permit, Duration), op: &Operation) -> Result<Output, SignError> {
        let op = match wire::op::fit(op, p::MAX_OP_DATA) {
            Ok(op) => op,
            Err(e) => {
                self.peers[next.0].breaker.neutral(next.1);
                return Err(e);
            }
        };
        self.run_route_from(r, Some(next), blocking_attempt(&op))
    }

    /// Runs `job` on one of the client's helper threads (started when
    /// first needed): what cannot wait where it is (a retry decided on a
    /// connection's thread, a connect needed on the submitting thread).
    /// Call [`Client::reserve_helper`] first.
    fn on_helper(&self, job: impl FnOnce() + Send + 'static) {
        let tx = self.helpers.get_or_init(|| {
            let (tx, rx) = crossbeam_channel::unbounded::<Box<dyn FnOnce() + Send>>();
            let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
            for n in 0..HELPERS {
                let rx = rx.clone();
                // A thread that cannot start leaves the others; with none,
                // the job's answer is dropped unsent, which answers its
                // caller with an error.
                let _ = threads.spawn(format!("keyfence-remote-{n}"), move || {
                    for job in rx {
                        job();
                    }
                });
            }
            tx
        });
        let queued = self.me.clone();
        let _ = tx.send(Box::new(move || {
            if let Some(c) = queued.upgrade() {
                c.helpers_queued.fetch_sub(1, Ordering::AcqRel);
            }
            job();
        }));
    }

    /// Reserves a place for one job on the helpers' queue; false when
    /// [`HELPER_QUEUE`] jobs are waiting already.
    fn reserve_helper(&self) -> bool {
        if self.helpers_queued.fetch_add(1, Ordering::AcqRel) >= HELPER_QUEUE {
            self.helpers_queued.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Sends the first attempt of `op` without waiting, when the nearest
    /// peer is connected; its answer (or the rest of the routing, on a
    /// helper thread, if it fails over) reaches `answer`. Gives `answer`
    /// back when no connection is ready.
    fn start_async(&self, r: Route, op: Operation, answer: Answer) -> Result<(), Box<(Route, Operation, Answer)>> {
        let Some(me) = self.me.upgrade() else { return Err(Box::new((r, op, answer))) };
        let mut r = r;
        let span = r.span.clone();
        let _entered = span.enter();
        let Some((i, permit, _)) = self.next_peer(&mut r) else {
            answer.send(Err(Self::give_up(&mut r)));
            return Ok(());
        };
        let Some(conn) = self.peers[i].pool.ready() else {
            self.peers[i].breaker.neutral(permit);
            return Err(Box::new((r, op, answer)));
        };
        let fitted = match wire::op::fit(&op, p::MAX_OP_DATA) {
            Ok(f) => f,
            Err(e) => {
                self.peers[i].breaker.neutral(permit);
                answer.send(Err(e));
                return Ok(());
            }
        };
        let (sent, until) = self.sending(&mut r, i);
        let id = conn.next_request_id();
        let mut frame = Vec::new();
        p::encode_op(&mut frame, id, &r.head, &fitted);
        drop(fitted);
        conn.send_async(id, &frame, until, move |reply| {
            let span = r.span.clone();
            let _entered = span.enter();
            let attempt = attempt_of(reply, |f| Ok(f.body));
            match me.end_attempt(&mut r, i, permit, sent, attempt) {
                Step::Done(v) => answer.send(Ok(v)),
                Step::Stop(e) => answer.send(Err(e)),
                // The retry is decided here (budget, breakers, deadline);
                // only its backoff and attempt, which wait, go to a helper.
                // Too many retries waiting already: this one is refused
                // like one over the retry budget.
                Step::Next if !me.reserve_helper() => {
                    me.retries_refused.fetch_add(1, Ordering::Relaxed);
                    answer.send(Err(Client::give_up(&mut r)));
                }
                Step::Next => match me.next_peer(&mut r) {
                    None => {
                        me.helpers_queued.fetch_sub(1, Ordering::AcqRel);
                        answer.send(Err(Client::give_up(&mut r)));
                    }
                    Some(next) => {
                        let client = me.clone();
                        me.on_helper(move || answer.send(client.run_op_from(&mut r, next, &op)));
                    }
                },
            }
        });
        Ok(())
    }

    fn key(&self, id: u64) -> Option<Arc<RemoteKey>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).get(&id).cloned()
    }

    fn measure(&self) {
        let until = Instant::now() + self.config.connect_timeout + self.config.request_timeout;
        std::thread::scope(|s| {
            for peer in &self.peers {
                s.spawn(move || {
                    let Ok(conn) = peer.pool.get(until) else { return };
                    let sent = Instant::now();
                    if let Ok(f) = conn.call(p::encode_ping, until) {
                        if f.kind == kind::OK {
                            peer.measured(sent.elapsed());
                        }
                    }
                });
            }
        });
    }
}

/// Measures round-trip times every `rtt_interval` until the client is
/// dropped.
fn measure_loop(client: &Weak<Client>, stopped: &Receiver<()>) {
    loop {
        let interval = match client.upgrade() {
            Some(c) => {
                c.measure();
                c.config.rtt_interval
            }
            None => return,
        };
        match stopped.recv_timeout(interval) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    }
}

impl KeyHolder for Client {
    fn name(&self) -> &str {
        NAME
    }

    fn class(&self, _kind: KeyKind) -> OpClass {
        OpClass::Slow
    }

    /// On the submitting thread when the key's nearest peer is connected:
    /// the request is then only written, and its answer comes on the
    /// connection's thread, so no executor thread is held per operation
    /// in flight. Otherwise (a connect to make, every breaker open) on the
    /// slow executor, which may wait.
    fn admit(&self, id: u64, _class: OpClass) -> Result<bool, SignError> {
        let Some(key) = self.key(id) else { return Ok(false) };
        let now = Instant::now();
        let first = routing::nearest(&key.capable, &self.peers, now);
        Ok(first.is_some_and(|i| self.peers[i].pool.ready().is_some()))
    }

    fn perform(&self, id: u64, op: &Operation, deadline: Instant) -> Result<Output, SignError> {
        let key = self.key(id).ok_or_else(|| backend_error(BackendFailure::Refused, "the key was forgotten"))?;
        let mut r = self.begin(key, deadline);
        self.run_op(&mut r, op)
    }

    fn start(&self, id: u64, op: Operation, deadline: Instant, answer: Answer) {
        let Some(key) = self.key(id) else {
            return answer.send(Err(backend_error(BackendFailure::Refused, "the key was forgotten")));
        };
        let r = self.begin(key, deadline);
        let Err(back) = self.start_async(r, op, answer) else { return };
        let (mut r, op, answer) = *back;
        // No connection ready: connecting waits, which an executor worker
        // may do and the submitting thread may not.
        if executor::on_worker() {
            answer.send(self.run_op(&mut r, &op));
        } else if let Some(me) = self.me.upgrade().filter(|_| self.reserve_helper()) {
            self.on_helper(move || answer.send(me.run_op(&mut r, &op)));
        } else {
            answer.send(Err(SignError::Overloaded { class: OpClass::Slow, capacity: HELPER_QUEUE }));
        }
    }

    fn forget(&self, id: u64) {
        self.keys.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    fn max_input(&self) -> usize {
        p::MAX_OP_DATA
    }
}
