//! The key server (`keyfence serve`): accepts mutual-TLS connections,
//! speaks the remote protocol, and signs on its own [`Engine`], whose
//! per-class executors and bounded queues answer `overloaded` at once
//! rather than letting work pile up.
//!
//! Before its certificate is checked, a connection is a stranger's: its
//! TLS handshake and hello get one deadline in all, and such connections
//! are bounded in all and per source address apart from certified ones
//! (see [`super::handshakes`]), so strangers cannot take certified
//! clients' places. Each connection has its own thread; the limits bound
//! them.
//!
//! A connection's tenant is read once, from its client certificate
//! ([`TenantSource`]), after the handshake; the tenant id in request frames
//! is ignored. Admission, in order, for each OP: a budget already spent is
//! answered `timed_out` without work; a key the server does not hold,
//! `unknown_key` (the client tries the next capable peer); a key the
//! tenant may not use ([`ServerConfig::allow`]), `not_allowed`; a
//! connection with its announced maximum in flight, `overloaded`; a tenant
//! with its maximum in flight, `tenant_limit`; a tenant or the whole server
//! with its maximum request bytes waiting, `overloaded`; then the engine,
//! whose full queue is `overloaded`. The engine is given the request's
//! budget as its timeout, so nothing is signed for a caller that has given
//! up. None of this does more than a hash-map lookup under a lock.

use crate::spawn::QuietSpawn;
use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openssl::ssl::SslAcceptor;

use super::handshakes::Handshakes;
use super::keyring::{KeyId, KeyRing};
use super::link::{self, Handler, Link, Outbox};
use super::metrics::{request_stats, Outcome, RequestStats};
use super::protocol::{self as p, kind, Frame, Head, RemoteErrorCode, Request as Wire};
use super::tenants::{AllowList, Keys, Limits, Refused, Tenant, TenantMetrics, TenantSource, Tenants};
use super::tls::{self, TlsFiles};
use crate::sign::exposition::Exposition;
use crate::sign::types::{ErrorKind, Operation, Output, Resource, SignError};
use crate::sign::{Backend, Engine, EngineConfig, EngineMetrics, Request};

/// How a key server listens, admits and signs.
#[derive(Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Where to listen (port 0 picks a free port; see
    /// [`KeyServer::local_addr`]).
    pub listen: SocketAddr,
    /// The server's certificate and key, and the CA its clients'
    /// certificates must come from.
    pub tls: TlsFiles,
    /// The signing engine's executors (RSA, EC, slow), each with its
    /// bounded queue.
    pub engine: EngineConfig,
    /// Requests one tenant may have in flight on this server. Default 256.
    pub tenant_in_flight: u32,
    /// Bytes of requests (whole frames) one tenant may have waiting or
    /// being signed on this server; beyond it, `overloaded`. Default
    /// 16 MiB.
    pub tenant_queued_bytes: usize,
    /// Bytes of requests all tenants together may have waiting or being
    /// signed; beyond it, `overloaded`. Default 64 MiB (what the isolated
    /// key process queues at most).
    pub queued_bytes: usize,
    /// Which part of a client's certificate names its tenant. Default: the
    /// subject's CN. A certificate without it is refused at the hello with
    /// `not_allowed`.
    pub tenant_from: TenantSource,
    /// Which keys each tenant may use; a tenant not listed may use none
    /// (`not_allowed`). `None` (the default) lets every certified client
    /// use every key the server holds, as before tenants were checked.
    pub allow: Option<AllowList>,
    /// Requests one connection may have in flight (announced in the
    /// hello). Default 1024.
    pub connection_in_flight: u32,
    /// Certified connections (past the TLS handshake and hello) served at
    /// once; a client beyond it is answered `overloaded` at the hello.
    /// Default 1024. Connections still in their handshake never count
    /// here: see [`ServerConfig::max_handshakes`].
    pub max_connections: usize,
    /// Time for a client's whole TLS handshake and hello, from the moment
    /// it is accepted: a deadline, not a time per read, so a client
    /// trickling its ClientHello is closed when it passes. Default 5 s.
    pub handshake_timeout: Duration,
    /// Connections accepted and not yet past their TLS handshake and hello
    /// (unauthenticated), each on its own thread. When this many are
    /// waiting, a new one takes the place of the oldest handshake of the
    /// source address holding the most, so strangers cannot keep a
    /// certified client from connecting. Default 256.
    pub max_handshakes: usize,
    /// Unauthenticated connections one source address may have; beyond
    /// it, new ones from that address are closed at once. Default 32.
    pub max_handshakes_per_address: usize,
    /// The server's name in spans and metrics.
    pub name: String,
    /// What signs for the engine instead of in-process AWS-LC (an
    /// offload device, or a stand-in for a slow one in tests). Keys held by
    /// the key process always sign there.
    pub backend: Option<Arc<dyn Backend>>,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("listen", &self.listen)
            .field("tls", &self.tls)
            .field("engine", &self.engine)
            .field("tenant_in_flight", &self.tenant_in_flight)
            .field("tenant_queued_bytes", &self.tenant_queued_bytes)
            .field("queued_bytes", &self.queued_bytes)
            .field("tenant_from", &self.tenant_from)
            .field("allow", &self.allow.as_ref().map(|a| a.tenants().count()))
            .field("connection_in_flight", &self.connection_in_flight)
            .field("max_connections", &self.max_connections)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("max_handshakes", &self.max_handshakes)
            .field("max_handshakes_per_address", &self.max_handshakes_per_address)
            .field("name", &self.name)
            .field("backend", &self.backend.as_ref().map(|b| b.name().to_string()))
            .finish()
    }
}

impl ServerConfig {
    /// Defaults for a server on `listen` with `tls`.
    pub fn new(listen: SocketAddr, tls: TlsFiles) -> Self {
        ServerConfig {
            listen,
            tls,
            engine: EngineConfig::default(),
            tenant_in_flight: 256,
            tenant_queued_bytes: 16 << 20,
            queued_bytes: 64 << 20,
            tenant_from: TenantSource::CommonName,
            allow: None,
            connection_in_flight: 1024,
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(5),
            max_handshakes: 256,
            max_handshakes_per_address: 32,
            name: "keyfence".into(),
            backend: None,
        }
    }
}

/// A snapshot of a server's counters.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerMetrics {
    /// Certified connections (past the hello) open now.
    pub connections: usize,
    /// Certified clients answered `overloaded` at the hello because
    /// `max_connections` were open.
    pub connections_refused: u64,
    /// Connections in their TLS handshake or hello now.
    pub handshakes: usize,
    /// Connections closed because their handshake and hello did not end
    /// by the deadline.
    pub handshakes_timed_out: u64,
    /// Connections closed at once because their address had
    /// `max_handshakes_per_address` handshakes under way, or twice
    /// `max_handshakes` handshake threads were still running.
    pub handshakes_refused: u64,
    /// Handshakes closed to make room for a newer one when
    /// `max_handshakes` were under way.
    pub handshakes_evicted: u64,
    /// TLS handshakes or hellos that failed (no certificate, another
    /// CA's certificate, another protocol).
    pub handshakes_failed: u64,
    /// Frames answered `malformed`.
    pub malformed: u64,
    /// Bytes of requests waiting or being signed now, all tenants.
    pub queued_bytes: usize,
    /// Per tenant (by the name its certificates give): requests and bytes
    /// in flight now, refusals of keys it may not use, counters and
    /// latency.
    pub tenants: Vec<TenantMetrics>,
    /// The signing engine's per-class metrics.
    pub engine: EngineMetrics,
}

impl ServerMetrics {
    /// The Prometheus text exposition of these metrics.
    pub fn prometheus(&self) -> String {
        let mut e = Exposition::new();
        let open = "keyfence_remote_server_connections";
        e.family(open, "gauge", "Connections open now.");
        e.sample(open, &[], self.connections as f64);
        let hs = "keyfence_remote_server_handshakes";
        e.family(hs, "gauge", "Connections in their TLS handshake or hello now.");
        e.sample(hs, &[], self.handshakes as f64);
        for (name, help, v) in [
            ("keyfence_remote_server_connections_refused_total", "Certified connections refused: too many open.", self.connections_refused),
            ("keyfence_remote_server_handshakes_timed_out_total", "Handshakes closed at their deadline.", self.handshakes_timed_out),
            (
                "keyfence_remote_server_handshakes_refused_total",
                "Connections closed at once: too many handshakes from one address, or handshake threads.",
                self.handshakes_refused,
            ),
            ("keyfence_remote_server_handshakes_evicted_total", "Handshakes closed to make room for a newer one.", self.handshakes_evicted),
            ("keyfence_remote_server_handshakes_failed_total", "TLS handshakes or hellos that failed.", self.handshakes_failed),
            ("keyfence_remote_server_malformed_total", "Frames answered malformed.", self.malformed),
        ] {
            e.family(name, "counter", help);
            e.sample(name, &[], v as f64);
        }
        let q = "keyfence_remote_server_queued_bytes";
        e.family(q, "gauge", "Bytes of requests waiting or being signed.");
        e.sample(q, &[], self.queued_bytes as f64);
        let n = "keyfence_remote_server_tenant_in_flight";
        e.family(n, "gauge", "Requests in flight, by tenant.");
        for t in &self.tenants {
            e.sample(n, &[("tenant", &t.name)], f64::from(t.in_flight));
        }
        let n = "keyfence_remote_server_tenant_queued_bytes";
        e.family(n, "gauge", "Bytes of requests waiting or being signed, by tenant.");
        for t in &self.tenants {
            e.sample(n, &[("tenant", &t.name)], t.queued_bytes as f64);
        }
        let n = "keyfence_remote_server_tenant_not_allowed_total";
        e.family(n, "counter", "Requests for a key the tenant may not use, by tenant.");
        for t in &self.tenants {
            e.sample(n, &[("tenant", &t.name)], t.not_allowed as f64);
        }
        let series: Vec<(String, &RequestStats)> = self.tenants.iter().map(|t| (t.name.clone(), &t.stats)).collect();
        request_stats(&mut e, "keyfence_remote_server_tenant", "tenant", &series);
        e.engine("keyfence_engine", &self.engine);
        e.finish()
    }
}

struct Inner {
    config: ServerConfig,
    acceptor: SslAcceptor,
    engine: Engine,
    keys: KeyRing,
    tenants: Tenants,
    stop: AtomicBool,
    connections: Mutex<HashMap<u64, Arc<Outbox>>>,
    /// Certified connections open (past the hello).
    open: AtomicUsize,
    handshakes: Handshakes,
    next_conn: AtomicU64,
    refused: AtomicU64,
    handshakes_failed: AtomicU64,
    malformed: AtomicU64,
}

/// A running key server. Dropping it (or [`KeyServer::shutdown`]) stops
/// it.
pub struct KeyServer {
    inner: Arc<Inner>,
    addr: SocketAddr,
}

impl std::fmt::Debug for KeyServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyServer").field("name", &self.inner.config.name).field("addr", &self.addr).finish()
    }
}

impl KeyServer {
    /// Starts serving `keys` on `config.listen`.
    ///
    /// # Errors
    /// [`SignError::Config`] for unusable TLS files or sizes,
    /// [`SignError::Io`] when the address cannot be bound or threads
    /// cannot start.
    pub fn start(config: ServerConfig, keys: KeyRing) -> Result<Self, SignError> {
        if config.tenant_in_flight == 0 || !(1..=p::MAX_IN_FLIGHT).contains(&config.connection_in_flight) {
            return Err(SignError::Config("tenant_in_flight must be at least 1, connection_in_flight 1 to 65536".into()));
        }
        if config.tenant_queued_bytes < p::MAX_FRAME || config.queued_bytes < config.tenant_queued_bytes {
            return Err(SignError::Config(format!(
                "tenant_queued_bytes must be at least one frame ({} bytes), queued_bytes at least tenant_queued_bytes",
                p::MAX_FRAME
            )));
        }
        if config.max_connections == 0 || config.max_handshakes == 0 || config.max_handshakes_per_address == 0 {
            return Err(SignError::Config("max_connections, max_handshakes and max_handshakes_per_address must be at least 1".into()));
        }
        if config.handshake_timeout.is_zero() {
            return Err(SignError::Config("handshake_timeout must be more than zero".into()));
        }
        let acceptor = tls::acceptor(&config.tls)?;
        let engine = match &config.backend {
            Some(b) => Engine::with_backend(config.engine.clone(), b.clone())?,
            None => Engine::new(config.engine.clone())?,
        };
        let listener = super::listen::bind(config.listen)
            .map_err(|e| SignError::io(Resource::Socket, format!("cannot listen on {}: {e}", config.listen)))?;
        let addr = listener.local_addr().map_err(|e| SignError::io(Resource::Socket, e.to_string()))?;
        let inner = Arc::new(Inner {
            tenants: Tenants::new(Limits {
                tenant_requests: config.tenant_in_flight,
                tenant_bytes: config.tenant_queued_bytes,
                server_bytes: config.queued_bytes,
            }),
            handshakes: Handshakes::new(config.max_handshakes, config.max_handshakes_per_address, config.handshake_timeout),
            config,
            acceptor,
            engine,
            keys,
            stop: AtomicBool::new(false),
            connections: Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
            next_conn: AtomicU64::new(1),
            refused: AtomicU64::new(0),
            handshakes_failed: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
        });
        let i = inner.clone();
        std::thread::Builder::new()
            .name("keyfence-serve-accept".into())
            .spawn_quiet(move || accept(&i, &listener))
            .map_err(|e| SignError::io(Resource::Thread, format!("cannot start the accept thread: {e}")))?;
        let i = inner.clone();
        let reaper = std::thread::Builder::new().name("keyfence-serve-reaper".into()).spawn_quiet(move || {
            while !i.stop.load(Ordering::Acquire) {
                std::thread::sleep(i.handshakes.reap(REAP_AT_MOST_EVERY));
            }
        });
        if let Err(e) = reaper {
            inner.stop.store(true, Ordering::Release);
            let _ = TcpStream::connect_timeout(&addr, Duration::from_millis(200));
            return Err(SignError::io(Resource::Thread, format!("cannot start the handshake reaper: {e}")));
        }
        tracing::info!(server = %inner.config.name, %addr, keys = inner.keys.len(), "keyfence key server listening");
        Ok(KeyServer { inner, addr })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A snapshot of its counters.
    pub fn metrics(&self) -> ServerMetrics {
        let i = &self.inner;
        ServerMetrics {
            connections: i.open.load(Ordering::Relaxed),
            connections_refused: i.refused.load(Ordering::Relaxed),
            handshakes: i.handshakes.len(),
            handshakes_timed_out: i.handshakes.timed_out.load(Ordering::Relaxed),
            handshakes_refused: i.handshakes.refused.load(Ordering::Relaxed),
            handshakes_evicted: i.handshakes.evicted.load(Ordering::Relaxed),
            handshakes_failed: i.handshakes_failed.load(Ordering::Relaxed),
            malformed: i.malformed.load(Ordering::Relaxed),
            queued_bytes: i.tenants.queued_bytes(),
            tenants: i.tenants.snapshot(),
            engine: i.engine.metrics(),
        }
    }

    /// Stops at once: no more connections are accepted and every open one
    /// is closed, with whatever was in flight on it unanswered (what a
    /// crash looks like to clients, which is what tests use it for).
    pub fn shutdown(&self) {
        let i = &self.inner;
        if i.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the accept thread.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        i.handshakes.close_all();
        let conns: Vec<Arc<Outbox>> = i.connections.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        for c in conns {
            c.close();
        }
    }
}

/// How long dropping a server waits for its threads to end.
const DROP_JOIN_BOUND: Duration = Duration::from_secs(10);

/// Dropping a server shuts it down and waits (at most
/// [`DROP_JOIN_BOUND`]) until every thread of its own has ended and its
/// engine has joined its workers: a program that drops its server and
/// exits must not leave signatures running while the process ends, since
/// AWS-LC clears every thread's random state at exit and a thread that is
/// drawing from it then aborts the process.
impl Drop for KeyServer {
    fn drop(&mut self) {
        self.shutdown();
        // Every thread (accept, reaper, connections and their writers)
        // holds a clone of `inner` until it returns.
        let since = std::time::Instant::now();
        while Arc::strong_count(&self.inner) > 1 && since.elapsed() < DROP_JOIN_BOUND {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn accept(inner: &Arc<Inner>, listener: &TcpListener) {
    for stream in listener.incoming() {
        if inner.stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = stream else {
            // Out of descriptors, say: do not spin; connections wait in
            // the listen backlog meanwhile.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        // A thread is started only for an admitted handshake: threads are
        // bounded by `max_handshakes` plus `max_connections`.
        let (Ok(peer), Ok(clone)) = (stream.peer_addr(), stream.try_clone()) else { continue };
        let Ok(hs) = inner.handshakes.admit(peer.ip(), clone) else { continue };
        let i = inner.clone();
        let spawned = std::thread::Builder::new().name("keyfence-serve-conn".into()).spawn_quiet(move || connection(&i, stream, hs));
        if spawned.is_err() {
            inner.handshakes.finish(hs);
            inner.handshakes.thread_done();
        }
    }
}

/// How often the reaper looks at the handshakes when none is under way
/// (it otherwise wakes at the earliest deadline).
const REAP_AT_MOST_EVERY: Duration = Duration::from_millis(100);

/// A connection's thread, counted among the handshake threads until
/// dropped.
struct HandshakeThread<'a>(&'a Handshakes);

impl Drop for HandshakeThread<'_> {
    fn drop(&mut self) {
        self.0.thread_done();
    }
}

/// A certified connection's place among `max_connections`.
struct Open<'a>(&'a AtomicUsize);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Handshake, hello, then the connection's loop. `hs` is its entry among
/// the handshakes under way, whose deadline the reaper enforces by
/// shutting the socket down.
fn connection(inner: &Arc<Inner>, tcp: TcpStream, hs: u64) {
    let in_handshake = HandshakeThread(&inner.handshakes);
    let peer = tcp.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let failed = |why: String| {
        inner.handshakes.finish(hs);
        inner.handshakes_failed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(server = %inner.config.name, %peer, %why, "connection refused");
    };
    // The per-read time-outs only spare the reaper work; the deadline for
    // the whole handshake is its.
    let t = Some(inner.config.handshake_timeout);
    if tcp.set_nodelay(true).and_then(|()| tcp.set_read_timeout(t)).and_then(|()| tcp.set_write_timeout(t)).is_err() {
        return failed("cannot configure the socket".into());
    }
    let mut stream = match inner.acceptor.accept(tcp) {
        Ok(s) => s,
        Err(e) => return failed(format!("TLS handshake: {e}")),
    };
    // Who the client is comes from its certificate, which the CA signed,
    // and from nothing it sends.
    let source = inner.config.tenant_from;
    let tenant_name = match stream.ssl().peer_certificate() {
        Some(c) => source.tenant_of(&c),
        None => Err("no client certificate".to_string()),
    };
    let mut decoder = p::Decoder::new();
    let hello = match link::read_frame(&mut stream, &mut decoder) {
        Ok(f) => f,
        Err(e) => return failed(format!("hello: {e}")),
    };
    // A place among the certified connections is taken only now, by a
    // client the CA vouched for.
    let open = inner.open.fetch_add(1, Ordering::AcqRel);
    let open_slot = Open(&inner.open);
    let answer = match (hello.kind, p::parse_hello_request(&hello.body)) {
        (kind::HELLO, Ok(())) if tenant_name.is_err() => Err(p::error_body(
            RemoteErrorCode::NotAllowed,
            &format!("{} (this server reads the tenant from: {source})", tenant_name.as_ref().err().map_or("", String::as_str)),
        )),
        (kind::HELLO, Ok(())) if open >= inner.config.max_connections => {
            inner.refused.fetch_add(1, Ordering::Relaxed);
            Err(p::error_body(RemoteErrorCode::Overloaded, "this server has its maximum of connections open"))
        }
        (kind::HELLO, Ok(())) => Ok(p::hello_reply(inner.config.connection_in_flight)),
        (kind::HELLO, Err(p::BodyError::Value("hello version"))) => {
            Err(p::error_body(RemoteErrorCode::Version, "this server speaks version 1"))
        }
        _ => Err(p::error_body(RemoteErrorCode::Malformed, "expected a hello")),
    };
    let mut frame = Vec::new();
    match &answer {
        Ok(body) => p::encode(&mut frame, kind::HELLO, 0, &[body]),
        Err(body) => p::encode(&mut frame, kind::ERR, hello.id, &[body]),
    }
    let tenant_name = match (tenant_name, &answer) {
        (Ok(name), Ok(_)) => name,
        (Err(why), _) => {
            let _ = stream.write_all(&frame);
            return failed(format!("no tenant: {why}"));
        }
        (Ok(_), Err(_)) => {
            let _ = stream.write_all(&frame);
            return failed("bad hello".into());
        }
    };
    if stream.write_all(&frame).is_err() {
        return failed("cannot answer the hello".into());
    }
    if !inner.handshakes.finish(hs) {
        // Its deadline passed, or it was pushed out, while answering.
        inner.handshakes_failed.fetch_add(1, Ordering::Relaxed);
        return;
    }
    drop(in_handshake);
    if stream.get_ref().set_read_timeout(None).and_then(|()| stream.get_ref().set_write_timeout(None)).is_err() {
        return failed("cannot configure the socket".into());
    }
    let (link, outbox) = match Link::new(stream, decoder) {
        Ok(l) => l,
        Err(e) => return failed(format!("socket: {e}")),
    };
    let outbox = Arc::new(outbox);
    let id = inner.next_conn.fetch_add(1, Ordering::Relaxed);
    inner.connections.lock().unwrap_or_else(|e| e.into_inner()).insert(id, outbox.clone());
    // A shutdown that raced with this registration must still close it.
    if inner.stop.load(Ordering::Acquire) {
        outbox.close();
    }
    let keys = Keys::of(inner.config.allow.as_ref(), &tenant_name);
    let tenant = inner.tenants.get(&tenant_name);
    let mut handler = Conn {
        inner: inner.clone(),
        outbox: outbox.clone(),
        in_flight: Arc::new(AtomicU32::new(0)),
        unanswered: Arc::new(AtomicU32::new(0)),
        tenant,
        keys,
    };
    let why = link::run(link, &outbox, &mut handler);
    tracing::debug!(server = %inner.config.name, %peer, tenant = %tenant_name, %why, "connection ended");
    inner.connections.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    drop(open_slot);
}

/// One connection's request handling.
struct Conn {
    inner: Arc<Inner>,
    outbox: Arc<Outbox>,
    /// Requests counted against the connection's announced bound.
    in_flight: Arc<AtomicU32>,
    /// Requests whose answer is not yet in the outbox (released after the
    /// send, where `in_flight` is released before it).
    unanswered: Arc<AtomicU32>,
    /// The tenant its certificate names.
    tenant: Arc<Tenant>,
    /// The keys that tenant may use.
    keys: Keys,
}

/// A connection slot, released when the answer is sent.
struct Slot(Arc<AtomicU32>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn not_allowed(tenant: &Tenant, key: &KeyId) -> String {
    format!("tenant `{}` may not use key {key} on this server", tenant.name)
}

fn err_frame(id: u64, code: RemoteErrorCode, msg: &str) -> Vec<u8> {
    let mut f = Vec::new();
    p::encode(&mut f, kind::ERR, id, &[&p::error_body(code, msg)]);
    f
}

/// The ERR frame for an engine error: its wire code, and for a token's
/// failure its detail, from which the client rebuilds it.
fn error_frame(id: u64, code: RemoteErrorCode, e: &SignError) -> Vec<u8> {
    if !matches!(code, RemoteErrorCode::TokenUnavailable | RemoteErrorCode::TokenLogin) {
        return err_frame(id, code, &e.to_string());
    }
    let (message, detail) = p::Detail::of(e);
    let mut f = Vec::new();
    p::encode(&mut f, kind::ERR, id, &[&p::error_body_with(code, &message, &detail)]);
    f
}

/// The wire code for an engine error.
fn wire_code(e: &SignError) -> RemoteErrorCode {
    match e.code() {
        crate::ErrorCode::TokenUnavailable => return RemoteErrorCode::TokenUnavailable,
        crate::ErrorCode::TokenLogin => return RemoteErrorCode::TokenLogin,
        _ => {}
    }
    match e.kind() {
        ErrorKind::Overloaded => RemoteErrorCode::Overloaded,
        ErrorKind::TimedOut => RemoteErrorCode::TimedOut,
        ErrorKind::ShutDown | ErrorKind::Cancelled => RemoteErrorCode::ShuttingDown,
        ErrorKind::Invalid => RemoteErrorCode::Invalid,
        ErrorKind::Failed => match e {
            SignError::Crypto { .. } => RemoteErrorCode::Crypto,
            _ => RemoteErrorCode::Internal,
        },
    }
}

fn outcome(code: RemoteErrorCode) -> Outcome {
    match code {
        RemoteErrorCode::Overloaded | RemoteErrorCode::TenantLimit => Outcome::Overloaded,
        RemoteErrorCode::TimedOut => Outcome::TimedOut,
        _ => Outcome::Failed,
    }
}

impl Handler for Conn {
    fn frame(&mut self, frame: Frame) -> Result<(), String> {
        match p::parse_request(&frame) {
            Ok(Wire::Ping) => {
                let mut f = Vec::new();
                p::encode(&mut f, kind::OK, frame.id, &[]);
                self.outbox.send(&f);
            }
            Ok(Wire::Public(head)) => {
                let id = KeyId(head.key_id);
                let reply = match self.inner.keys.get(&id) {
                    Some(_) if !self.keys.contains(&id) => {
                        self.tenant.not_allowed.fetch_add(1, Ordering::Relaxed);
                        err_frame(frame.id, RemoteErrorCode::NotAllowed, &not_allowed(&self.tenant, &id))
                    }
                    Some(key) => match key.public_key_der() {
                        Ok(der) => {
                            let mut f = Vec::new();
                            p::encode(&mut f, kind::OK, frame.id, &[&p::public_reply(key.kind(), &der)]);
                            f
                        }
                        Err(e) => err_frame(frame.id, RemoteErrorCode::Internal, &e.to_string()),
                    },
                    None => err_frame(frame.id, RemoteErrorCode::UnknownKey, "this server does not hold that key"),
                };
                self.outbox.send(&reply);
            }
            Ok(Wire::Op(head, op)) => self.op(frame.id, head, op, p::HEADER + frame.body.len()),
            Err(e) => {
                self.inner.malformed.fetch_add(1, Ordering::Relaxed);
                self.outbox.send(&err_frame(frame.id, RemoteErrorCode::Malformed, &e.to_string()));
            }
        }
        Ok(())
    }

    fn busy(&self) -> bool {
        self.unanswered.load(Ordering::Acquire) > 0
    }
}

/// A request whose answer is not yet queued; see [`Conn::unanswered`].
struct Unanswered(Arc<AtomicU32>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Conn {
    fn op(&self, id: u64, head: Head, op: Operation, bytes: usize) {
        let received = Instant::now();
        let inner = &self.inner;
        let tenant = &self.tenant;
        tenant.stats.begin();
        let span = tracing::debug_span!("keyfence.remote.serve", server = %inner.config.name, trace_id = %head.trace_hex(), tenant = %tenant.name, request = id);
        let refuse = |code: RemoteErrorCode, msg: &str| {
            tenant.stats.end(outcome(code), Duration::ZERO);
            span.in_scope(|| tracing::debug!(code = code.name(), msg, "refused"));
            self.outbox.send(&err_frame(id, code, msg));
        };
        if head.budget.is_zero() {
            return refuse(RemoteErrorCode::TimedOut, "the request's budget was spent before it arrived");
        }
        let key_id = KeyId(head.key_id);
        let Some(key) = inner.keys.get(&key_id) else {
            return refuse(RemoteErrorCode::UnknownKey, "this server does not hold that key");
        };
        if !self.keys.contains(&key_id) {
            tenant.not_allowed.fetch_add(1, Ordering::Relaxed);
            return refuse(RemoteErrorCode::NotAllowed, &not_allowed(tenant, &key_id));
        }
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= inner.config.connection_in_flight {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return refuse(RemoteErrorCode::Overloaded, "this connection has its maximum in flight");
        }
        let slot = Slot(self.in_flight.clone());
        let admitted = match inner.tenants.admit(tenant.clone(), bytes) {
            Ok(a) => a,
            Err(Refused::TenantRequests) => {
                return refuse(RemoteErrorCode::TenantLimit, "this tenant has its maximum in flight on this server")
            }
            Err(Refused::TenantBytes) => {
                return refuse(RemoteErrorCode::Overloaded, "this tenant has its maximum request bytes waiting on this server")
            }
            Err(Refused::ServerBytes) => return refuse(RemoteErrorCode::Overloaded, "this server has its maximum request bytes waiting"),
        };
        self.unanswered.fetch_add(1, Ordering::AcqRel);
        let unanswered = Unanswered(self.unanswered.clone());
        let outbox = self.outbox.clone();
        let done_span = span.clone();
        let answer = move |result: Result<Output, SignError>| {
            let frame = match &result {
                Ok(out) => {
                    let mut f = Vec::with_capacity(p::HEADER + 4 + out.len());
                    p::encode(&mut f, kind::OK, id, &[out]);
                    admitted.tenant().stats.end(Outcome::Ok, received.elapsed());
                    f
                }
                Err(e) => {
                    let code = wire_code(e);
                    admitted.tenant().stats.end(outcome(code), received.elapsed());
                    error_frame(id, code, e)
                }
            };
            done_span.in_scope(|| tracing::debug!(ok = result.is_ok(), took_us = received.elapsed().as_micros() as u64, "answered"));
            drop((admitted, slot));
            link::send_batched(&outbox, &frame);
            drop(unanswered);
        };
        let req = Request::new(key.clone(), op).with_timeout(head.budget);
        if let Err(e) = span.in_scope(|| inner.engine.submit_with_callback(req, answer)) {
            // The callback was dropped uncalled, releasing its slots.
            let code = wire_code(&e);
            tenant.stats.end(outcome(code), Duration::ZERO);
            self.outbox.send(&error_frame(id, code, &e));
        }
    }
}
