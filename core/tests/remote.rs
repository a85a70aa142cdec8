//! Remote signing on loopback (issue 18): three key servers with different
//! attributes, routing to the only one that may hold a key, a server killed
//! under load, tenant floods, refused certificates, malformed frames, the
//! server-side deadline and the metrics endpoint. Every wait is bounded.
#![cfg(feature = "sign")]

mod common;
mod remote_support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{key_process_config, verify};
use keyfence::sign::remote::protocol::{self as p, kind, Head, RemoteErrorCode};
use keyfence::sign::remote::{serve_metrics, BreakerState, RemoteSigner};
use keyfence::sign::{Algorithm, BackendFailure, Engine, EngineConfig, ErrorKind, LatencyBackend, Request, SignError};
use keyfence::ErrorCode;
use remote_support::*;

#[test]
fn a_key_only_one_server_may_hold_is_signed_through_it() {
    let world = World::new();
    let servers: Vec<_> = ["sfo1", "fra1", "nrt1"].iter().map(|n| start_server(&world, n, ServerOptions::default())).collect();
    let addrs: Vec<_> = ["sfo1", "fra1", "nrt1"].iter().zip(&servers).map(|(n, s)| (*n, s.local_addr())).collect();
    let remote = client(&addrs);
    assert!(remote.peers().iter().all(|p| p.latency < Duration::from_secs(1)), "round trips measured: {:?}", remote.peers());

    // Tokyo may open neither the US nor the EU key.
    let tokyo = world.machine("country=JP,region=APAC");
    let engine = Engine::new(EngineConfig::default()).unwrap();
    for (env, holder) in [(&world.us_key, "sfo1"), (&world.eu_key, "fra1")] {
        assert!(!tokyo.could_open(env));
        let key = remote.open_or_forward(&tokyo, env.to_bytes()).unwrap();
        assert!(!key.is_local());
        let der = key.public_key_der().unwrap();
        for i in 0..20u32 {
            let msg = format!("handshake {i}");
            let sig = engine.sign(&key, Algorithm::EcdsaP256Sha256, msg.as_bytes()).unwrap().wait().unwrap();
            assert!(verify(&der, Algorithm::EcdsaP256Sha256, msg.as_bytes(), &sig));
        }
        let m = remote.metrics();
        let by_name: HashMap<_, _> = m.peers.iter().map(|p| (p.name.as_str(), p)).collect();
        assert!(by_name[holder].stats.counts.ok >= 20, "{holder}: {:?}", by_name[holder]);
    }
    // Only the holders were ever asked: the others' attributes rule them out.
    let m = remote.metrics();
    let nrt = m.peers.iter().find(|p| p.name == "nrt1").unwrap();
    assert_eq!(nrt.stats.counts.requests, 0);
    // The servers' own view: each signed only what its attributes allow.
    let served = |i: usize| servers[i].metrics().tenants.iter().map(|t| t.stats.counts.ok).sum::<u64>();
    assert!(served(0) >= 20 && served(1) >= 20 && served(2) == 0);

    // A key Tokyo may open is opened and signed here, never forwarded.
    let local = remote.open_or_forward(&tokyo, world.jp_key.to_bytes()).unwrap();
    assert!(local.is_local());

    // RSA-2048 through the server too.
    let rsa = remote.key(&world.us_rsa).unwrap();
    let sig = engine.sign(&rsa, Algorithm::RsaPssSha256, b"rsa").unwrap().wait().unwrap();
    assert_eq!(sig.len(), 256);
}

/// For each operation under load: how many times it was answered, and how
/// long it took to end and how.
type Ended = Vec<(Duration, Result<(), SignError>)>;

struct Load {
    answers: Arc<Mutex<HashMap<u64, u32>>>,
    results: Arc<Mutex<Ended>>,
}

#[test]
fn a_server_killed_under_load_fails_over_and_nothing_hangs_or_is_answered_twice() {
    let world = World::new();
    let sfo = start_server(&world, "sfo1", ServerOptions::default());
    let iad = start_server(&world, "iad1", ServerOptions::default());
    let mut config = client_config(&[("sfo1", sfo.local_addr()), ("iad1", iad.local_addr())]);
    // Plenty of budget for failovers in this test; the budget has its own.
    config.retry_budget.min_per_second = 1000;
    let remote = RemoteSigner::start(config).unwrap();
    remote.measure();
    let key = remote.key(&world.us_key).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let timeout = Duration::from_millis(1500);
    let load = Load { answers: Arc::default(), results: Arc::default() };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut next_id = 0u64;
    let started = Instant::now();
    let mut killed = None;
    // Keep ~32 operations in flight through both servers; kill the one
    // serving the traffic half-way.
    while started.elapsed() < Duration::from_millis(1200) {
        for _ in 0..8 {
            next_id += 1;
            let id = next_id;
            let (answers, results) = (load.answers.clone(), load.results.clone());
            let t = Instant::now();
            let req = Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, id.to_be_bytes().to_vec()).with_timeout(timeout);
            engine
                .submit_with_callback(req, move |r| {
                    *answers.lock().unwrap().entry(id).or_default() += 1;
                    results.lock().unwrap().push((t.elapsed(), r.map(drop)));
                })
                .unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
        if killed.is_none() && started.elapsed() > Duration::from_millis(400) {
            // The one that served most is the nearest: kill it.
            let m = remote.metrics();
            let busiest = m.peers.iter().max_by_key(|p| p.stats.counts.ok).unwrap().name.clone();
            if busiest == "sfo1" {
                sfo.shutdown()
            } else {
                iad.shutdown()
            }
            killed = Some(busiest);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // Every operation ends by its deadline (plus scheduling slack).
    let until = Instant::now() + timeout + Duration::from_secs(2);
    while load.answers.lock().unwrap().len() < next_id as usize && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let answers = load.answers.lock().unwrap();
    assert_eq!(answers.len(), next_id as usize, "some operations were never answered");
    assert!(answers.values().all(|&n| n == 1), "an operation was answered twice");
    let results = load.results.lock().unwrap();
    let ok = results.iter().filter(|r| r.1.is_ok()).count();
    for (took, r) in results.iter() {
        assert!(*took < timeout + Duration::from_millis(500), "ended after {took:?}: {r:?}");
        if let Err(e) = r {
            // Clean failures only: the deadline, or the backend saying why.
            assert!(matches!(e.code(), ErrorCode::TimedOut | ErrorCode::BackendFailed | ErrorCode::Overloaded), "{e}");
        }
    }
    // Nearly everything succeeded: in-flight work on the killed server
    // failed over to the other one.
    assert!(ok * 100 >= results.len() * 95, "{ok} of {} succeeded", results.len());
    let killed = killed.unwrap();
    let m = remote.metrics();
    let dead = m.peers.iter().find(|p| p.name == killed).unwrap();
    let alive = m.peers.iter().find(|p| p.name != killed).unwrap();
    assert!(alive.stats.counts.ok > 0 && dead.failovers > 0, "{m:?}");
    // After the kill, new operations go to the survivor at once.
    for i in 0..10u8 {
        engine.sign(&key, Algorithm::EcdsaP256Sha256, &[i]).unwrap().wait().unwrap();
    }

    // With no capable server left, operations fail cleanly within their
    // deadlines, and the breaker stops sending to the dead peers.
    sfo.shutdown();
    iad.shutdown();
    let t = Instant::now();
    for i in 0..20u8 {
        let r = engine.submit(Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, vec![i]).with_timeout(timeout)).unwrap().wait();
        let e = r.unwrap_err();
        assert!(matches!(e.code(), ErrorCode::BackendFailed | ErrorCode::TimedOut), "{e}");
    }
    assert!(t.elapsed() < 20 * timeout);
    let m = remote.metrics();
    assert!(m.peers.iter().any(|p| p.breaker != BreakerState::Closed || p.breaker_opens > 0), "{m:?}");
}

#[test]
fn one_tenants_flood_is_refused_while_another_tenant_is_served() {
    let world = World::new();
    // A slow server (50 ms per signature) so the flood stays in flight.
    let slow: Arc<dyn keyfence::sign::Backend> = Arc::new(LatencyBackend::new(Duration::from_millis(50)));
    let sfo = start_server(
        &world,
        "sfo1",
        ServerOptions { backend: Some(slow), tenant_in_flight: Some(4), slow_threads: Some(64), ..Default::default() },
    );
    // Tenants are who the certificates say; both clients send tenant id 0.
    let remote = client_as("tenant-a", &[("sfo1", sfo.local_addr())]);
    let remote_b = client_as("tenant-b", &[("sfo1", sfo.local_addr())]);
    let flooder = remote.key(&world.us_key).unwrap();
    let other = remote_b.key(&world.us_key).unwrap();
    let mut config = EngineConfig::default();
    config.slow.threads = 64;
    config.slow.queue_capacity = 1024;
    let engine = Engine::new(config).unwrap();
    let flood: Vec<_> = (0..48u8)
        .map(|i| {
            engine.submit(Request::sign(flooder.clone(), Algorithm::EcdsaP256Sha256, vec![i]).with_timeout(Duration::from_secs(3))).unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    // The other tenant is served while the flood is refused.
    let t = Instant::now();
    for i in 0..5u8 {
        engine.submit(Request::sign(other.clone(), Algorithm::EcdsaP256Sha256, vec![i])).unwrap().wait().unwrap();
    }
    assert!(t.elapsed() < Duration::from_secs(2));
    let results: Vec<_> = flood.into_iter().map(|f| f.wait()).collect();
    let refused = results.iter().filter(|r| matches!(r, Err(e) if e.code() == ErrorCode::Overloaded)).count();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert!(refused > 0 && ok > 0, "ok {ok}, refused {refused}: {:?}", results.iter().find(|r| r.is_err()));
    assert!(results.iter().all(|r| r.is_ok() || matches!(r, Err(e) if e.kind() == ErrorKind::Overloaded)));
    let tenants = sfo.metrics().tenants;
    let t1 = tenants.iter().find(|t| t.name == "tenant-a").unwrap();
    let t2 = tenants.iter().find(|t| t.name == "tenant-b").unwrap();
    assert!(t1.stats.counts.overloaded > 0, "{t1:?}");
    assert_eq!((t2.stats.counts.ok, t2.stats.counts.overloaded), (5, 0), "{t2:?}");
    let m = remote.metrics();
    assert!(m.retries_refused > 0 || m.retries > 0, "refusals were retried under the budget: {m:?}");
}

fn tls_connect(
    files: Option<keyfence::sign::remote::TlsFiles>, addr: std::net::SocketAddr,
) -> Result<openssl::ssl::SslStream<TcpStream>, String> {
    use openssl::ssl::{SslConnector, SslFiletype, SslMethod};
    let pki = Pki::get();
    let mut b = SslConnector::builder(SslMethod::tls()).unwrap();
    b.set_ca_file(pki.dir.join("ca.pem")).unwrap();
    if let Some(f) = files {
        b.set_certificate_chain_file(&f.cert).unwrap();
        b.set_private_key_file(&f.key, SslFiletype::PEM).unwrap();
    }
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    tcp.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
    b.build().connect("sfo1", tcp).map_err(|e| e.to_string())
}

/// Sends a hello and reads the server's first frame: `Err` when the
/// connection is refused or closed first.
fn hello(stream: &mut openssl::ssl::SslStream<TcpStream>) -> Result<p::Frame, String> {
    let mut f = Vec::new();
    p::encode(&mut f, kind::HELLO, 0, &[&p::hello_request()]);
    stream.write_all(&f).map_err(|e| e.to_string())?;
    read_frame(stream)
}

#[test]
fn clients_without_a_certificate_or_with_another_cas_are_refused() {
    let world = World::new();
    let sfo = start_server(&world, "sfo1", ServerOptions::default());
    let pki = Pki::get();
    // The right certificate gets a hello.
    let mut good = tls_connect(Some(pki.files("client", "ca")), sfo.local_addr()).unwrap();
    assert_eq!(hello(&mut good).unwrap().kind, kind::HELLO);
    // No certificate, or one from another CA: no hello, ever.
    for files in [None, Some(pki.files("rogue-client", "ca"))] {
        let refused = match tls_connect(files.clone(), sfo.local_addr()) {
            Err(_) => true,
            Ok(mut s) => hello(&mut s).is_err(),
        };
        assert!(refused, "a client with {files:?} got a hello");
    }
    // The server counts them once its side of the handshake has ended.
    let until = Instant::now() + Duration::from_secs(3);
    while sfo.metrics().handshakes_failed < 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(sfo.metrics().handshakes_failed >= 2, "{:?}", sfo.metrics());

    // The client backend with the rogue certificate gets nothing either.
    let mut config = client_config(&[("sfo1", sfo.local_addr())]);
    config.tls = pki.files("rogue-client", "ca");
    let rogue = RemoteSigner::start(config).unwrap();
    let e = rogue.key(&world.us_key).unwrap_err();
    assert!(matches!(e, SignError::Backend { failure: BackendFailure::Unavailable, .. }), "{e}");
    // And a client that trusts another CA refuses the server.
    let mut config = client_config(&[("sfo1", sfo.local_addr())]);
    config.tls = pki.files("client", "rogue");
    let e = RemoteSigner::start(config).unwrap().key(&world.us_key).unwrap_err();
    assert!(matches!(e, SignError::Backend { failure: BackendFailure::Unavailable, .. }), "{e}");
    assert!(e.to_string().contains("certificate verify failed") || e.to_string().contains("CERTIFICATE"), "{e}");
    // A server certificate for another name is refused as well.
    let mut config = client_config(&[("sfo1", sfo.local_addr())]);
    config.peers[0].server_name = "iad1".into();
    let e = RemoteSigner::start(config).unwrap().key(&world.us_key).unwrap_err();
    assert!(matches!(e, SignError::Backend { failure: BackendFailure::Unavailable, .. }), "{e}");
    assert!(e.to_string().contains("certificate verify failed") || e.to_string().contains("CERTIFICATE"), "{e}");
}

#[test]
fn malformed_frames_get_an_error_or_a_closed_connection_never_a_crash() {
    let world = World::new();
    let sfo = start_server(&world, "sfo1", ServerOptions::default());
    let pki = Pki::get();
    let files = || Some(pki.files("client", "ca"));

    // Before the hello: anything else ends the connection with an error.
    let mut s = tls_connect(files(), sfo.local_addr()).unwrap();
    let mut f = Vec::new();
    p::encode_ping(&mut f, 1);
    s.write_all(&f).unwrap();
    let reply = read_frame(&mut s).unwrap();
    assert_eq!((reply.kind, p::parse_error(&reply.body).0), (kind::ERR, RemoteErrorCode::Malformed));
    assert!(read_frame(&mut s).is_err(), "closed after a bad hello");

    // A hello of another version is told so.
    let mut s = tls_connect(files(), sfo.local_addr()).unwrap();
    let mut f = Vec::new();
    p::encode(&mut f, kind::HELLO, 0, &[b"KFRS\x00\x07"]);
    s.write_all(&f).unwrap();
    let reply = read_frame(&mut s).unwrap();
    assert_eq!(p::parse_error(&reply.body).0, RemoteErrorCode::Version);

    // After the hello: bad bodies and kinds get `malformed`, and the
    // connection goes on serving.
    let mut s = tls_connect(files(), sfo.local_addr()).unwrap();
    hello(&mut s).unwrap();
    let head = Head { key_id: [0; 32], budget: Duration::from_secs(1), trace_id: [1; 16], tenant: 0 };
    let mut public = Vec::new();
    p::encode_public(&mut public, 0, &head);
    let bad: Vec<(u8, Vec<u8>)> = vec![
        (kind::OP, vec![]),
        (kind::OP, vec![0; p::HEAD + 2]),
        (kind::OP, [vec![0; p::HEAD], vec![1, 0x12, 0x34]].concat()),
        (kind::PUBLIC, vec![0; 3]),
        (kind::PING, vec![1]),
        (kind::HELLO, p::hello_request()),
        (kind::OK, vec![]),
        (0x55, vec![1, 2, 3]),
    ];
    for (i, (k, body)) in bad.iter().enumerate() {
        let mut f = Vec::new();
        p::encode(&mut f, *k, 100 + i as u64, &[body]);
        s.write_all(&f).unwrap();
        let reply = read_frame(&mut s).unwrap();
        assert_eq!((reply.id, reply.kind), (100 + i as u64, kind::ERR));
        assert_eq!(p::parse_error(&reply.body).0, RemoteErrorCode::Malformed);
    }
    // An unknown key is `unknown_key`; a spent budget is `timed_out`.
    let mut f = Vec::new();
    p::encode_public(&mut f, 7, &head);
    p::encode_op(
        &mut f,
        8,
        &Head { budget: Duration::ZERO, key_id: keyfence::sign::remote::KeyId::of_envelope(world.us_key.to_bytes()).0, ..head },
        &keyfence::sign::Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: keyfence::sign::Input::Message(b"m".to_vec()) },
    );
    s.write_all(&f).unwrap();
    let mut codes: Vec<_> = (0..2).map(|_| read_frame(&mut s).unwrap()).map(|f| (f.id, p::parse_error(&f.body).0)).collect();
    codes.sort_by_key(|c| c.0);
    assert_eq!(codes, [(7, RemoteErrorCode::UnknownKey), (8, RemoteErrorCode::TimedOut)]);
    // A length word out of range cannot be skipped: the connection closes.
    s.write_all(&u32::MAX.to_be_bytes()).unwrap();
    assert!(read_frame(&mut s).is_err());
    // Random bytes on fresh connections, then the server still serves.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..20 {
        let mut s = tls_connect(files(), sfo.local_addr()).unwrap();
        let _ = hello(&mut s);
        let junk: Vec<u8> = (0..200)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let _ = s.write_all(&junk);
    }
    assert!(sfo.metrics().malformed >= bad.len() as u64);
    let remote = client(&[("sfo1", sfo.local_addr())]);
    let key = remote.key(&world.us_key).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    engine.sign(&key, Algorithm::EcdsaP256Sha256, b"still here").unwrap().wait().unwrap();
}

#[test]
fn the_server_honours_the_remaining_budget() {
    let world = World::new();
    let slow: Arc<dyn keyfence::sign::Backend> = Arc::new(LatencyBackend::new(Duration::from_millis(300)));
    let sfo = start_server(&world, "sfo1", ServerOptions { backend: Some(slow), ..Default::default() });
    let remote = client(&[("sfo1", sfo.local_addr())]);
    let key = remote.key(&world.us_key).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let t = Instant::now();
    let e = engine
        .submit(Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"late".to_vec()).with_timeout(Duration::from_millis(100)))
        .unwrap()
        .wait()
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::TimedOut);
    assert!(t.elapsed() < Duration::from_millis(300), "{:?}", t.elapsed());
    // The server gave up at the budget too: it counted a time-out, not a
    // signature nobody waited for.
    std::thread::sleep(Duration::from_millis(400));
    let tenants = sfo.metrics().tenants;
    assert_eq!(tenants[0].stats.counts.timed_out, 1, "{tenants:?}");
    assert_eq!(tenants[0].stats.counts.ok, 0);
    // With budget enough, it signs.
    engine
        .submit(Request::sign(key, Algorithm::EcdsaP256Sha256, b"ok".to_vec()).with_timeout(Duration::from_secs(2)))
        .unwrap()
        .wait()
        .unwrap();
}

#[test]
fn metrics_are_served_in_prometheus_text() {
    let world = World::new();
    let sfo = Arc::new(start_server(&world, "sfo1", ServerOptions::default()));
    let s = sfo.clone();
    let endpoint = serve_metrics("127.0.0.1:0".parse().unwrap(), move || s.metrics().prometheus()).unwrap();
    let remote = client(&[("sfo1", sfo.local_addr())]);
    let key = remote.key_for_tenant(&world.us_key, 77).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    engine.sign(&key, Algorithm::EcdsaP256Sha256, b"m").unwrap().wait().unwrap();
    let mut c = TcpStream::connect(endpoint.local_addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    // The tenant is the client certificate's CN, whatever id the frames carry.
    assert!(text.contains("keyfence_remote_server_tenant_requests_total{tenant=\"client\",outcome=\"ok\"} 1\n"), "{text}");
    assert!(!text.contains("tenant=\"77\""), "{text}");
    assert!(text.contains("keyfence_engine_queue_depth{class=\"ec\"} 0\n"), "{text}");
    let client_text = remote.metrics().prometheus();
    assert!(client_text.contains("keyfence_remote_client_peer_requests_total{peer=\"sfo1\",outcome=\"ok\"} 2\n"), "{client_text}");
    assert!(client_text.contains("keyfence_remote_client_peer_rtt_seconds{peer=\"sfo1\"}"), "{client_text}");
}

/// Records the `trace_id` field of every span named `name`, process-wide.
struct Spans(Mutex<Vec<(String, String)>>);

struct TraceId(Option<String>);

impl tracing::field::Visit for TraceId {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "trace_id" {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl tracing::Subscriber for &'static Spans {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut t = TraceId(None);
        span.record(&mut t);
        let mut v = self.0.lock().unwrap();
        if let Some(id) = t.0 {
            v.push((span.metadata().name().to_string(), id));
        }
        tracing::span::Id::from_u64(v.len() as u64 + 1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn the_trace_id_is_carried_across_the_hop_and_metrics_reach_the_engine() {
    static SPANS: Spans = Spans(Mutex::new(Vec::new()));
    // Process-wide, since the server's spans are on its own threads.
    let _ = tracing::subscriber::set_global_default(&SPANS);
    tracing::callsite::rebuild_interest_cache();
    let world = World::new();
    let sfo = start_server(&world, "sfo1", ServerOptions::default());
    let remote = client(&[("sfo1", sfo.local_addr())]);
    let key = remote.key(&world.us_key).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    engine.attach_metrics(Arc::new(remote.clone()));
    engine.sign(&key, Algorithm::EcdsaP256Sha256, b"traced").unwrap().wait().unwrap();
    let spans = SPANS.0.lock().unwrap().clone();
    let routed: Vec<&String> = spans.iter().filter(|s| s.0 == "keyfence.remote.route").map(|s| &s.1).collect();
    let served: Vec<&String> = spans.iter().filter(|s| s.0 == "keyfence.remote.serve").map(|s| &s.1).collect();
    assert!(!routed.is_empty() && !served.is_empty(), "{spans:?}");
    assert!(routed.iter().any(|id| served.contains(id)), "no trace id on both sides of the hop: {spans:?}");
    assert!(routed.iter().all(|id| id.len() == 32));

    // The engine's metrics carry the remote backend's per-peer figures.
    let m = engine.metrics();
    assert_eq!(m.sources.len(), 1);
    let text = m.prometheus();
    assert!(text.contains("keyfence_engine_completed_total{class=\"slow\"} 1\n"), "{text}");
    assert!(text.contains("keyfence_remote_client_peer_requests_total{peer=\"sfo1\",outcome=\"ok\"}"), "{text}");
}

#[test]
fn a_server_can_keep_its_keys_in_the_isolated_key_process() {
    use keyfence::sign::key_process::KeyProcess;
    use keyfence::sign::remote::{KeyRing, KeyServer, ServerConfig};
    use keyfence::wrap::{FileStore, Store};
    let dir = temp_dir("remote-isolated");
    let store: Arc<dyn Store> = Arc::new(FileStore::open(dir.join("store")).unwrap());
    let mut authority = keyfence::wrap::Authority::init(store.clone()).unwrap();
    let us = authority.wrap("country: US", &ec_pem()).unwrap();
    let eu = authority.wrap("region: EU", &ec_pem()).unwrap();
    std::fs::write(dir.join("us.env"), us.to_bytes()).unwrap();
    std::fs::write(dir.join("eu.env"), eu.to_bytes()).unwrap();
    let mk = authority.issue(&"country=US,region=NA".parse().unwrap()).unwrap();
    std::fs::write(dir.join("sfo1.machine"), &mk.to_bytes()[..]).unwrap();
    // This process reads only the public view; the key process the key.
    let info = keyfence::wrap::MachineInfo::from_key_bytes(&std::fs::read(dir.join("sfo1.machine")).unwrap()).unwrap();
    let machine = keyfence::wrap::PublicMachine::new(info, store);

    let keys = KeyProcess::start(key_process_config()).unwrap();
    let mut ring = KeyRing::new();
    let open =
        |ring: &mut KeyRing, env: &str| ring.open_isolated(&machine, &keys, &dir.join("store"), &dir.join("sfo1.machine"), &dir.join(env));
    open(&mut ring, "us.env").unwrap();
    // The EU key is refused before the key process is asked.
    assert_eq!(open(&mut ring, "eu.env").unwrap_err().code(), ErrorCode::PolicyNotSatisfied);
    assert_eq!((ring.len(), keys.status().unwrap().keys), (1, 1));
    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), Pki::get().files("sfo1", "ca"));
    config.name = "sfo1".into();
    let server = KeyServer::start(config, ring).unwrap();

    let remote = client(&[("sfo1", server.local_addr())]);
    let key = remote.key(&us).unwrap();
    let der = key.public_key_der().unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let sig = engine.sign(&key, Algorithm::EcdsaP256Sha256, b"isolated").unwrap().wait().unwrap();
    assert!(verify(&der, Algorithm::EcdsaP256Sha256, b"isolated", &sig));
    let e = remote.key(&eu).unwrap_err();
    assert!(matches!(e, SignError::Backend { failure: BackendFailure::Refused, .. }), "no peer holds the EU key: {e}");
    assert!(e.to_string().contains("no configured peer's attributes satisfy"), "{e}");
}

/// Issue 33: the id a key server files an isolated key under names the
/// envelope bytes it read; the key process must hold the key of those
/// bytes, even when the file is replaced afterwards and the key process
/// restarts (it used to read the file again, and then held the new key
/// under the old key's id).
#[test]
fn an_isolated_key_stays_the_key_its_id_names_when_the_file_changes() {
    use keyfence::sign::key_process::KeyProcess;
    use keyfence::sign::remote::{KeyId, KeyRing};
    use keyfence::wrap::{FileStore, MachineInfo, PublicMachine, Store};
    let dir = temp_dir("remote-isolated-swap");
    let store: Arc<dyn Store> = Arc::new(FileStore::open(dir.join("store")).unwrap());
    let mut authority = keyfence::wrap::Authority::init(store.clone()).unwrap();
    let first = authority.wrap("country: US", &ec_pem()).unwrap();
    let second = authority.wrap("country: US", &ec_pem()).unwrap();
    let mk = authority.issue(&"country=US".parse().unwrap()).unwrap();
    std::fs::write(dir.join("m.machine"), &mk.to_bytes()[..]).unwrap();
    std::fs::write(dir.join("k.env"), first.to_bytes()).unwrap();
    let machine = PublicMachine::new(MachineInfo::from_key_bytes(&mk.to_bytes()).unwrap(), store);

    let keys = KeyProcess::start(key_process_config()).unwrap();
    let mut ring = KeyRing::new();
    let id = ring.open_isolated(&machine, &keys, &dir.join("store"), &dir.join("m.machine"), &dir.join("k.env")).unwrap();
    assert_eq!(id, KeyId::of_envelope(first.to_bytes()));
    let der = ring.get(&id).unwrap().public_key_der().unwrap();

    // Another key in the same file, then the key process dies and comes back.
    std::fs::write(dir.join("k.env"), second.to_bytes()).unwrap();
    let pid = keys.pid().unwrap();
    assert!(std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
    let t = Instant::now();
    while keys.restarts() == 0 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(keys.wait_running(Duration::from_secs(5)));
    assert_eq!(keys.status().unwrap().keys, 1, "the key was loaded again");
    let sig = ring.get(&id).unwrap().sign(Algorithm::EcdsaP256Sha256, b"same key").unwrap();
    assert!(verify(&der, Algorithm::EcdsaP256Sha256, b"same key", &sig), "the key process signed with another key than the id names");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TCP relay to `to` that holds every chunk for `delay` each way: a
/// distant peer on loopback.
fn distant(to: std::net::SocketAddr, delay: Duration) -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(to) else { continue };
            for (mut from, mut into) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16384];
                    while let Ok(n) = from.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        std::thread::sleep(delay);
                        if into.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = into.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    addr
}

#[test]
fn the_nearest_capable_peer_by_measured_round_trip_is_asked_first() {
    let world = World::new();
    let sfo = start_server(&world, "sfo1", ServerOptions::default());
    let iad = start_server(&world, "iad1", ServerOptions::default());
    // iad1 is listed first but is 2 x 15 ms away; sfo1 is near.
    let remote = client(&[("iad1", distant(iad.local_addr(), Duration::from_millis(15))), ("sfo1", sfo.local_addr())]);
    let peers = remote.peers();
    let rtt = |n: &str| peers.iter().find(|p| p.name == n).unwrap().latency;
    assert!(rtt("iad1") >= Duration::from_millis(30) && rtt("sfo1") < Duration::from_millis(30), "{peers:?}");
    // The wrap layer's chooser and the router agree.
    assert_eq!(keyfence::wrap::nearest_capable(&world.us_key, &peers).unwrap().name, "sfo1");
    let key = remote.key(&world.us_key).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    for i in 0..10u8 {
        engine.sign(&key, Algorithm::EcdsaP256Sha256, &[i]).unwrap().wait().unwrap();
    }
    let by = |m: &keyfence::sign::remote::ClientMetrics, n: &str| m.peers.iter().find(|p| p.name == n).unwrap().stats.counts.ok;
    let m = remote.metrics();
    assert_eq!((by(&m, "sfo1"), by(&m, "iad1")), (11, 0), "{m:?}");
    // When the near one dies, the far one answers.
    sfo.shutdown();
    let t = Instant::now();
    engine.sign(&key, Algorithm::EcdsaP256Sha256, b"far").unwrap().wait().unwrap();
    assert!(t.elapsed() >= Duration::from_millis(30));
    assert_eq!(by(&remote.metrics(), "iad1"), 1);
}

#[test]
fn a_dead_peer_is_not_hammered() {
    let world = World::new();
    // A port nobody listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let sfo = start_server(&world, "sfo1", ServerOptions::default());
    let remote = client(&[("sfo1", sfo.local_addr())]);
    let key = remote.key(&world.us_key).unwrap();
    drop(remote);
    // A second client, whose only capable peer is dead from the start.
    let mut config = client_config(&[("sfo1", dead)]);
    config.retry_budget.ratio = 0.1;
    config.retry_budget.min_per_second = 0;
    config.max_attempts = 3;
    let sick = RemoteSigner::start(config).unwrap();
    let e = sick.key(&world.us_key).unwrap_err();
    assert!(matches!(e, SignError::Backend { failure: BackendFailure::Unavailable, .. }), "{e}");
    drop(key);
    let t = Instant::now();
    for _ in 0..200 {
        let e = sick.key(&world.us_key).unwrap_err();
        assert!(matches!(e, SignError::Backend { failure: BackendFailure::Unavailable, .. }), "{e}");
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let m = sick.metrics();
    let peer = &m.peers[0];
    // 201 operations; without the budget and the breaker, 603 attempts.
    assert!(m.retries <= 21, "{m:?}");
    assert!(peer.breaker_opens >= 1, "{m:?}");
    // The breaker opened after 5 consecutive failures: the dead peer saw
    // about that many attempts, not one per operation.
    assert!(peer.stats.counts.requests <= 10, "{m:?}");
}

#[test]
fn a_peer_that_never_reads_its_replies_is_cut_off() {
    let world = World::new();
    let sfo = start_server(&world, "sfo1", ServerOptions::default());
    let mut s = tls_connect(Some(Pki::get().files("client", "ca")), sfo.local_addr()).unwrap();
    hello(&mut s).unwrap();
    // Pings whose 13-byte replies are never read: past 16 MiB unwritten the
    // server closes, and the writes here start failing.
    let mut batch = Vec::new();
    for id in 0..10_000u64 {
        p::encode_ping(&mut batch, id);
    }
    let t = Instant::now();
    let mut sent = 0usize;
    while s.write_all(&batch).is_ok() {
        sent += batch.len();
        assert!(t.elapsed() < Duration::from_secs(20), "still accepted after {sent} bytes");
    }
    assert!(sent >= 16 << 20, "cut off after only {sent} bytes");
    // And it still serves others.
    let remote = client(&[("sfo1", sfo.local_addr())]);
    remote.key(&world.us_key).unwrap();
}

/// A peer that takes requests and never answers them (its signer stalls)
/// is left when the attempt's request timeout passes, and the operation
/// is answered by the next capable peer, well before the caller's
/// deadline. The first attempt is sent without waiting (the connection is
/// up after `key`), so the connection's own timer must end it.
#[test]
fn a_peer_that_stops_answering_is_left_after_the_request_timeout() {
    let world = World::new();
    let stalled: Arc<dyn keyfence::sign::Backend> = Arc::new(LatencyBackend::new(Duration::from_secs(10)));
    let iad = start_server(&world, "iad1", ServerOptions { backend: Some(stalled), ..Default::default() });
    let sfo = start_server(&world, "sfo1", ServerOptions::default());
    // The stalled peer is the nearest: sfo1 is 2 x 15 ms away.
    let mut config = client_config(&[("iad1", iad.local_addr()), ("sfo1", distant(sfo.local_addr(), Duration::from_millis(15)))]);
    config.request_timeout = Duration::from_millis(200);
    let remote = RemoteSigner::start(config).unwrap();
    remote.measure();
    let key = remote.key(&world.us_key).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let t = Instant::now();
    let req = Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"failover".to_vec()).with_timeout(Duration::from_secs(3));
    let sig = engine.submit(req).unwrap().wait().unwrap();
    let took = t.elapsed();
    assert!(verify(&key.public_key_der().unwrap(), Algorithm::EcdsaP256Sha256, b"failover", &sig));
    assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(3), "{took:?}");
    let m = remote.metrics();
    let peer = |n: &str| m.peers.iter().find(|p| p.name == n).unwrap().stats.counts.clone();
    assert_eq!((peer("iad1").timed_out, peer("sfo1").ok), (1, 1), "{m:?}");
}

/// Issue 44.6: a forwarder reads the store's signed revocation list and
/// never asks a peer whose `machine` attribute it names. Before, nothing
/// read `public/revoked` outside a test.
#[test]
fn forwarding_never_asks_a_revoked_machine() {
    let mut world = World::new();
    let servers: Vec<_> = ["sfo1", "iad1"].iter().map(|n| start_server(&world, n, ServerOptions::default())).collect();
    // The peers as the forwarder knows them, each with its machine id.
    let peers = [("sfo1", "mSFO"), ("iad1", "mIAD")]
        .iter()
        .zip(&servers)
        .map(|((n, id), s)| {
            keyfence::sign::remote::PeerConfig::new(*n, s.local_addr(), format!("{},machine={id}", attrs_of(n)).parse().unwrap())
        })
        .collect();
    let mut config = client_config(&[]);
    config.peers = peers;
    let remote = RemoteSigner::start(config).unwrap();
    let tokyo = world.machine("country=JP,region=APAC");
    let engine = Engine::new(EngineConfig::default()).unwrap();

    world.authority.revoke("mSFO").unwrap();
    for i in 0..10 {
        let key = remote.open_or_forward(&tokyo, world.us_key.to_bytes()).unwrap();
        engine.sign(&key, keyfence::sign::Algorithm::EcdsaP256Sha256, format!("m{i}").as_bytes()).unwrap().wait().unwrap();
    }
    let m = remote.metrics();
    let asked = |n: &str| m.peers.iter().find(|p| p.name == n).unwrap().stats.counts.requests;
    assert_eq!(asked("sfo1"), 0, "the revoked machine was asked");
    assert!(asked("iad1") >= 10);

    // Both revoked: none is asked, and the error says why.
    world.authority.revoke("mIAD").unwrap();
    let err = remote.open_or_forward(&tokyo, world.us_key.to_bytes()).err().unwrap().to_string();
    assert!(err.contains("revoked machine (sfo1, iad1)"), "{err}");
    // A key server that is no forwarder is asked as before.
    assert!(remote.key(&world.us_key).is_ok());
}

/// A backend that counts the operations under way in it.
struct Counting {
    inner: LatencyBackend,
    running: Arc<std::sync::atomic::AtomicUsize>,
}

impl keyfence::sign::Backend for Counting {
    fn name(&self) -> &str {
        "counting"
    }
    fn class(&self, key: &keyfence::sign::PrivateKey, op: &keyfence::sign::Operation) -> keyfence::sign::OpClass {
        self.inner.class(key, op)
    }
    fn perform(
        &self, key: &keyfence::sign::PrivateKey, op: &keyfence::sign::Operation, deadline: Instant,
    ) -> Result<keyfence::sign::Output, SignError> {
        use std::sync::atomic::Ordering;
        self.running.fetch_add(1, Ordering::SeqCst);
        let out = self.inner.perform(key, op, deadline);
        self.running.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

/// Dropping a server with signatures under way returns only once they
/// have ended: a program that drops its server and exits must not sign
/// while the process ends (AWS-LC clears every thread's random state at
/// exit, and a thread drawing from it then aborts the process: this
/// aborted remote_hol's test binary after its test had passed).
#[test]
fn dropping_a_server_waits_for_the_signatures_under_way() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let world = World::new();
    let running = Arc::new(AtomicUsize::new(0));
    let backend: Arc<dyn keyfence::sign::Backend> =
        Arc::new(Counting { inner: LatencyBackend::new(Duration::from_millis(300)), running: running.clone() });
    let sfo = start_server(&world, "sfo1", ServerOptions { backend: Some(backend), slow_threads: Some(16), ..Default::default() });
    let remote = client(&[("sfo1", sfo.local_addr())]);
    let key = remote.key(&world.us_key).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let pending: Vec<_> = (0..8).map(|_| engine.sign(&key, Algorithm::EcdsaP256Sha256, b"under way").unwrap()).collect();
    let t = Instant::now();
    while running.load(Ordering::SeqCst) < 8 {
        assert!(t.elapsed() < Duration::from_secs(10), "the server never began the signatures");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(sfo);
    assert_eq!(running.load(Ordering::SeqCst), 0, "the server was dropped with signatures still under way");
    for p in pending {
        // Cut off with the server: each ends, answered or not.
        let _ = p.wait();
    }
}
