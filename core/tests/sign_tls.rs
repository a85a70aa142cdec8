//! Real TLS 1.2 and 1.3 handshakes between a server on AWS-LC's TLS library
//! (the `openssl` crate) whose private key lives in the engine (the
//! private-key method hook) and a client, over loopback. Each handshake is
//! seen to suspend (the private-key operation answers "retry") and to
//! resume when the engine calls back.
#![cfg(feature = "sign")]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foreign_types::ForeignTypeRef;
use keyfence::sign::tls::{self, EngineKeyMethod};
use keyfence::sign::{Engine, EngineConfig, ErrorKind, KeyKind, LatencyBackend, OpClass, PrivateKey};
use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{HandshakeError, MidHandshakeSslStream, Ssl, SslConnector, SslContext, SslMethod, SslRef, SslStream, SslVersion};
use openssl::x509::extension::SubjectAlternativeName;
use openssl::x509::{X509NameBuilder, X509};

fn server_key(kind: KeyKind) -> (PKey<Private>, Arc<PrivateKey>) {
    let pkey = match kind {
        KeyKind::Rsa { bits } => PKey::from_rsa(openssl::rsa::Rsa::generate(bits).unwrap()).unwrap(),
        KeyKind::EcP256 => {
            let g = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap();
            PKey::from_ec_key(openssl::ec::EcKey::generate(&g).unwrap()).unwrap()
        }
        other => panic!("no certificate case for {other:?}"),
    };
    // The engine gets the key as bytes in memory, as from an envelope.
    let key = PrivateKey::from_der(&pkey.private_key_to_der().unwrap()).unwrap();
    (pkey, Arc::new(key))
}

/// A self-signed certificate for `localhost`, made with the X509 builder.
fn certificate(pkey: &PKey<Private>) -> X509 {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", "localhost").unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    b.set_serial_number(&BigNum::from_u32(1).unwrap().to_asn1_integer().unwrap()).unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(&name).unwrap();
    b.set_pubkey(pkey).unwrap();
    b.set_not_before(&Asn1Time::days_from_now(0).unwrap()).unwrap();
    b.set_not_after(&Asn1Time::days_from_now(1).unwrap()).unwrap();
    let san = SubjectAlternativeName::new().dns("localhost").build(&b.x509v3_context(None, None)).unwrap();
    b.append_extension(san).unwrap();
    b.sign(pkey, MessageDigest::sha256()).unwrap();
    b.build()
}

fn server_context(cert: &X509, method: EngineKeyMethod, version: SslVersion, cipher: Option<&str>) -> SslContext {
    let mut b = SslContext::builder(SslMethod::tls()).unwrap();
    b.set_min_proto_version(Some(version)).unwrap();
    b.set_max_proto_version(Some(version)).unwrap();
    if let Some(c) = cipher {
        b.set_cipher_list(c).unwrap();
    }
    tls::configure(&mut b, cert, method).unwrap();
    b.build()
}

struct ClientView {
    version: &'static str,
    /// The signature algorithm the server signed with (a TLS code point).
    peer_sigalg: Option<u16>,
    cipher: String,
}

extern "C" {
    /// AWS-LC's (and BoringSSL's): the peer's signature algorithm, 0 for none.
    fn SSL_get_peer_signature_algorithm(ssl: *const openssl_sys::SSL) -> u16;
}

fn peer_signature_algorithm(ssl: &SslRef) -> Option<u16> {
    // SAFETY: `ssl` is a live connection for the call, which only reads it.
    let alg = unsafe { SSL_get_peer_signature_algorithm(ssl.as_ptr()) };
    (alg != 0).then_some(alg)
}

/// TLS code points (RFC 8446).
const RSA_PSS_RSAE_SHA256: u16 = 0x0804;
const ECDSA_SECP256R1_SHA256: u16 = 0x0403;

/// A real client that trusts `cert`, verifies `localhost`, sends
/// "ping" and expects "pong".
fn client(
    addr: std::net::SocketAddr, cert: X509, version: SslVersion, cipher: Option<&'static str>,
) -> std::thread::JoinHandle<Result<ClientView, String>> {
    std::thread::spawn(move || {
        let mut b = SslConnector::builder(SslMethod::tls()).unwrap();
        b.cert_store_mut().add_cert(cert).unwrap();
        b.set_min_proto_version(Some(version)).unwrap();
        b.set_max_proto_version(Some(version)).unwrap();
        if let Some(c) = cipher {
            b.set_cipher_list(c).unwrap();
        }
        let tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut s = b.build().connect("localhost", tcp).map_err(|e| format!("client handshake: {e}"))?;
        s.write_all(b"ping").map_err(|e| e.to_string())?;
        let mut buf = [0; 4];
        s.read_exact(&mut buf).map_err(|e| e.to_string())?;
        assert_eq!(&buf, b"pong");
        Ok(ClientView {
            version: s.ssl().version_str(),
            peer_sigalg: peer_signature_algorithm(s.ssl()),
            cipher: s.ssl().current_cipher().map(|c| c.name().to_string()).unwrap_or_default(),
        })
    })
}

struct ServerView {
    stream: Option<SslStream<TcpStream>>,
    retries: usize,
    resumes: usize,
    error: Option<String>,
}

/// Drives a server handshake on a blocking socket: the only "would block"
/// left is the private-key operation. Each time it suspends, wait for the
/// engine's resume call, then drive the handshake again.
fn serve_one(ctx: &SslContext, tcp: TcpStream) -> ServerView {
    let (tx, rx) = mpsc::channel();
    let mut ssl = Ssl::new(ctx).unwrap();
    tls::set_resume(&mut ssl, move || {
        let _ = tx.send(());
    })
    .unwrap();
    let mut view = ServerView { stream: None, retries: 0, resumes: 0, error: None };
    let mut attempt = ssl.accept(tcp);
    loop {
        match attempt {
            Ok(s) => {
                view.stream = Some(s);
                return view;
            }
            Err(HandshakeError::Failure(m)) if tls::waits_for_the_engine(m.error().code()) => {
                view.retries += 1;
                rx.recv_timeout(Duration::from_secs(10)).expect("the engine never resumed the handshake");
                view.resumes += 1;
                attempt = m.handshake();
            }
            Err(e) => {
                view.error = Some(e.to_string());
                return view;
            }
        }
    }
}

#[test]
fn tls12_and_tls13_handshakes_suspend_and_resume_on_the_engine() {
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let rsa = server_key(KeyKind::Rsa { bits: 2048 });
    let ec = server_key(KeyKind::EcP256);
    let cases = [
        // (key, version, cipher, expected server signature algorithm, class)
        (&rsa, SslVersion::TLS1_3, None, Some(RSA_PSS_RSAE_SHA256), OpClass::Rsa),
        (&ec, SslVersion::TLS1_3, None, Some(ECDSA_SECP256R1_SHA256), OpClass::Ec),
        (&rsa, SslVersion::TLS1_2, None, Some(RSA_PSS_RSAE_SHA256), OpClass::Rsa),
        (&ec, SslVersion::TLS1_2, None, Some(ECDSA_SECP256R1_SHA256), OpClass::Ec),
        // TLS 1.2 RSA key exchange: the hook decrypts the premaster secret.
        (&rsa, SslVersion::TLS1_2, Some("AES128-GCM-SHA256"), None, OpClass::Rsa),
    ];
    for (i, ((pkey, key), version, cipher, sigalg, class)) in cases.into_iter().enumerate() {
        let cert = certificate(pkey);
        let ctx = server_context(&cert, EngineKeyMethod::new(engine.clone(), key.clone()), version, cipher);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let before = engine.metrics().class(class).completed;
        let c = client(listener.local_addr().unwrap(), cert, version, cipher);
        let (tcp, _) = listener.accept().unwrap();
        let mut server = serve_one(&ctx, tcp);
        assert!(server.error.is_none(), "case {i}: server: {:?}", server.error);
        let mut s = server.stream.take().unwrap();
        let mut buf = [0; 4];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
        s.write_all(b"pong").unwrap();
        let view = c.join().unwrap().unwrap_or_else(|e| panic!("case {i}: {e}"));

        // Suspended exactly once (one private-key operation per full
        // handshake) and resumed by the engine.
        assert_eq!((server.retries, server.resumes), (1, 1), "case {i}");
        assert_eq!(engine.metrics().class(class).completed, before + 1, "case {i}");
        let expected_version = if version == SslVersion::TLS1_3 { "TLSv1.3" } else { "TLSv1.2" };
        assert_eq!(view.version, expected_version, "case {i}");
        match sigalg {
            Some(alg) => assert_eq!(view.peer_sigalg, Some(alg), "case {i}"),
            None => assert_eq!(view.cipher, "AES128-GCM-SHA256", "case {i}"), // TLS_RSA_WITH_AES_128_GCM_SHA256
        }
    }
}

#[test]
fn a_suspended_handshake_does_not_hold_up_another_connection() {
    // One server thread, non-blocking sockets, two connections: the first
    // signs on a 300 ms backend, the second on the fast path. The second
    // completes while the first is suspended: the server's loop was free.
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let (pkey, key) = server_key(KeyKind::EcP256);
    let cert = certificate(&pkey);
    let slow_method =
        EngineKeyMethod::new(engine.clone(), key.clone()).with_backend(Arc::new(LatencyBackend::new(Duration::from_millis(300))));
    let contexts = [
        server_context(&cert, slow_method, SslVersion::TLS1_3, None),
        server_context(&cert, EngineKeyMethod::new(engine.clone(), key), SslVersion::TLS1_3, None),
    ];
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel::<usize>();
    // Each connection's handshake so far: its first step, then each one
    // after a wait.
    type Step = Result<SslStream<TcpStream>, HandshakeError<TcpStream>>;
    let mut pending: Vec<Option<Step>> = Vec::new();
    let mut clients = Vec::new();
    // Before the first step: `Ssl::accept` drives the handshake at once,
    // up to the private-key operation.
    let start = Instant::now();
    for (i, ctx) in contexts.iter().enumerate() {
        clients.push(client(addr, cert.clone(), SslVersion::TLS1_3, None));
        let (tcp, _) = listener.accept().unwrap();
        tcp.set_nonblocking(true).unwrap();
        let mut ssl = Ssl::new(ctx).unwrap();
        let tx = tx.clone();
        tls::set_resume(&mut ssl, move || {
            let _ = tx.send(i);
        })
        .unwrap();
        pending.push(Some(ssl.accept(tcp)));
    }
    let mut finished_at = [None, None];
    let mut streams = Vec::new();
    let mut suspended = [false, false];
    while finished_at.iter().any(Option::is_none) {
        assert!(start.elapsed() < Duration::from_secs(20), "handshakes did not finish");
        for i in 0..2 {
            let Some(step) = pending[i].take() else { continue };
            let mid: MidHandshakeSslStream<TcpStream> = match step {
                Ok(s) => {
                    finished_at[i] = Some(start.elapsed());
                    streams.push((i, s));
                    continue;
                }
                Err(HandshakeError::WouldBlock(m)) => m,
                Err(HandshakeError::Failure(m)) if tls::waits_for_the_engine(m.error().code()) => {
                    suspended[i] = true;
                    m
                }
                Err(e) => panic!("connection {i}: {e}"),
            };
            pending[i] = Some(mid.handshake());
        }
        // An event loop's wait: a resume call or socket readiness (here a
        // short timeout stands in for polling the sockets).
        let _ = rx.recv_timeout(Duration::from_millis(1));
    }
    for (_, s) in &mut streams {
        let mut buf = [0; 4];
        s.get_mut().set_nonblocking(false).unwrap();
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"pong").unwrap();
    }
    for c in clients {
        c.join().unwrap().unwrap();
    }
    let (slow, fast) = (finished_at[0].unwrap(), finished_at[1].unwrap());
    eprintln!("slow-backend handshake {slow:?}, fast one {fast:?}");
    assert!(suspended[0] && suspended[1]);
    assert!(slow >= Duration::from_millis(300), "{slow:?}");
    assert!(fast < slow, "the fast handshake waited for the slow one: {fast:?} vs {slow:?}");
    assert!(fast < Duration::from_millis(250), "{fast:?}");
}

#[test]
fn a_private_key_operation_past_its_deadline_fails_the_handshake_cleanly() {
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let (pkey, key) = server_key(KeyKind::EcP256);
    let cert = certificate(&pkey);
    let method = EngineKeyMethod::new(engine.clone(), key)
        .with_backend(Arc::new(LatencyBackend::new(Duration::from_secs(2))))
        .with_timeout(Duration::from_millis(50));
    let ctx = server_context(&cert, method, SslVersion::TLS1_3, None);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = client(listener.local_addr().unwrap(), cert, SslVersion::TLS1_3, None);
    let (tcp, _) = listener.accept().unwrap();
    let t = Instant::now();
    let server = serve_one(&ctx, tcp);
    let took = t.elapsed();
    assert!(server.error.is_some(), "the handshake should fail");
    assert_eq!(server.retries, 1);
    drop(server); // closes the connection
    assert!(c.join().unwrap().is_err(), "the client must not complete a handshake");
    assert!(took < Duration::from_secs(1), "failed after {took:?}, not at the 50 ms deadline");
    assert_eq!(engine.metrics().class(OpClass::Slow).errors.get(ErrorKind::TimedOut), 1);
}
