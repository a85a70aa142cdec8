//! An engine that owns its key process: it starts it, a killed one is
//! restarted with the keys, and closing the engine ends it (checked by
//! pid) even while key handles live on. Also the calls every binding
//! makes instead of checking things its own way: timeouts, closed engines,
//! key loading.

mod common;
mod remote_support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{key_process_engine, verify, verify_key};
use keyfence::sign::key_process::KeySource;
use keyfence::sign::managed::{millis, Isolation, ManagedConfig, ManagedEngine};
use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyKind, PrivateKey, SignError};
use keyfence::ErrorCode;
use openssl::pkey::PKey;
use zeroize::Zeroizing;

fn p256_pem() -> Zeroizing<Vec<u8>> {
    let g = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap();
    let pkey = PKey::from_ec_key(openssl::ec::EcKey::generate(&g).unwrap()).unwrap();
    Zeroizing::new(pkey.private_key_to_pem_pkcs8().unwrap())
}

/// Whether `pid` is a key process this test process started and has not
/// reaped: a reaped pid the system gave to someone else is not.
fn our_key_process(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // `pid (comm) state ppid ...`; comm may hold spaces, so split after
    // its closing parenthesis. comm is cut to 15 bytes, so the program is
    // named by its executable's link instead.
    let Some((_, rest)) = stat.rsplit_once(')') else { return false };
    let ppid: u32 = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    ppid == std::process::id() && exe.file_name().is_some_and(|n| n == "keyfence-key-process")
}

fn sign(engine: &ManagedEngine, key: &Arc<PrivateKey>, msg: &[u8]) -> Result<Vec<u8>, SignError> {
    let req = ManagedEngine::request(key.clone(), "ecdsa-p256-sha256", msg.to_vec(), None)?;
    Ok(engine.submit(req)?.wait()?.to_vec())
}

#[test]
fn the_engine_starts_restarts_and_stops_its_key_process() {
    let engine = key_process_engine();
    assert!(engine.has_key_process());
    let first = engine.key_process_pid().expect("a key process runs once the engine has started");
    assert!(our_key_process(first), "pid {first} is not this process's key process");

    let key = engine.load(KeySource::Bytes(p256_pem())).unwrap();
    assert!(!key.is_local(), "the key lives in the key process");
    let sig = sign(&engine, &key, b"before").unwrap();
    assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, b"before", &sig));

    // Killed: the engine's key process comes back, with the key.
    assert!(Command::new("kill").args(["-9", &first.to_string()]).status().unwrap().success());
    let keys = engine.key_process().unwrap().unwrap();
    let t = std::time::Instant::now();
    while keys.restarts() == 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(keys.wait_running(Duration::from_secs(10)));
    let second = engine.key_process_pid().unwrap();
    assert_ne!(second, first);
    assert!(our_key_process(second));
    assert!(!our_key_process(first), "the killed key process was reaped");
    let sig = sign(&engine, &key, b"after").unwrap();
    assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, b"after", &sig), "the same key, loaded again");
    drop(keys);

    // Closed: the key process is gone when `close` returns, although a
    // key handle from it is still alive here.
    engine.close();
    assert!(!our_key_process(second), "key process {second} outlived the engine's close");
    assert_eq!(engine.key_process_pid(), None);
    assert!(!engine.has_key_process());
    // The handle stays safe to use: on any engine it fails as shut down
    // (its engine was closed), not as a key process that crashed.
    let other = Engine::new(EngineConfig::default()).unwrap();
    let e = other.sign(&key, keyfence::sign::Algorithm::EcdsaP256Sha256, b"x").unwrap().wait().unwrap_err();
    assert_eq!(e, SignError::ShutDown, "{e}");
    assert_eq!(e.code(), ErrorCode::ShutDown);
    // Later calls say the engine is closed, with the code bindings report.
    assert_eq!(sign(&engine, &key, b"x").unwrap_err(), SignError::ShutDown);
    assert_eq!(engine.metrics().unwrap_err(), SignError::ShutDown);
    assert_eq!(engine.load(KeySource::Bytes(p256_pem())).unwrap_err().code(), ErrorCode::ShutDown);
    engine.close(); // idempotent
    assert!(engine.is_closed());
}

#[test]
fn operations_in_flight_when_the_engine_closes_fail_as_shut_down() {
    let engine = key_process_engine();
    let key = engine.load(KeySource::Bytes(p256_pem())).unwrap();
    let keys = engine.key_process().unwrap().unwrap();
    // Queued, sent to the key process, or waiting for its reply when the
    // engine closes: each signs or fails with ShutDown, never with the
    // key process's death (the engine killed it, on purpose).
    let futures: Vec<_> = (0..300u32)
        .map(|i| {
            let req = ManagedEngine::request(key.clone(), "ecdsa-p256-sha256", i.to_be_bytes().to_vec(), None).unwrap();
            engine.submit(req).unwrap()
        })
        .collect();
    engine.close();
    for f in futures {
        if let Err(e) = f.wait() {
            assert_eq!(e, SignError::ShutDown, "{e}");
        }
    }
    // The key process's own handle says the same.
    assert_eq!(keys.status().unwrap_err(), SignError::ShutDown);
    assert_eq!(keys.load(KeySource::Bytes(p256_pem())).unwrap_err(), SignError::ShutDown);
}

#[test]
fn dropping_the_engine_ends_its_key_process() {
    let engine = key_process_engine();
    let pid = engine.key_process_pid().unwrap();
    let key = engine.load(KeySource::Bytes(p256_pem())).unwrap();
    drop(engine);
    assert!(!our_key_process(pid), "key process {pid} outlived its engine");
    drop(key);
}

#[test]
fn an_in_process_engine_holds_keys_here_and_closes_once() {
    let engine = ManagedEngine::start(ManagedConfig::default()).unwrap();
    assert!(!engine.has_key_process());
    assert_eq!(engine.key_process_pid(), None);
    let key = engine.load(KeySource::Bytes(p256_pem())).unwrap();
    assert!(key.is_local());
    let sig = sign(&engine, &key, b"here").unwrap();
    assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, b"here", &sig));
    engine.close();
    engine.close();
    assert_eq!(sign(&engine, &key, b"x").unwrap_err().code(), ErrorCode::ShutDown);
}

#[test]
fn a_bad_key_has_the_same_typed_error_in_both_modes() {
    let dir = std::env::temp_dir().join(format!("keyfence-managed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("missing.pem");
    for engine in [ManagedEngine::start(ManagedConfig::default()).unwrap(), key_process_engine()] {
        let junk = engine.load(KeySource::Bytes(Zeroizing::new(b"junk".to_vec()))).unwrap_err();
        assert_eq!(junk.code(), ErrorCode::InvalidPrivateKey, "{junk}");
        assert!(engine.load(KeySource::File(missing.clone())).is_err());
        let env = engine.load(KeySource::envelope(b"x".to_vec(), dir.clone(), missing.clone())).unwrap_err();
        assert_eq!(env.code(), ErrorCode::Io, "{env}");
    }
    let _ = std::fs::remove_dir_all(PathBuf::from(&dir));
}

#[test]
fn timeouts_are_whole_positive_milliseconds() {
    assert_eq!(millis(1.0, "t").unwrap(), Duration::from_millis(1));
    assert_eq!(millis(f64::from(u32::MAX), "t").unwrap(), Duration::from_millis(u64::from(u32::MAX)));
    for bad in [0.0, -1.0, 1.5, f64::from(u32::MAX) + 1.0, f64::NAN, f64::INFINITY] {
        let e = millis(bad, "timeoutMs").unwrap_err();
        assert_eq!(e.code(), ErrorCode::InvalidArgument, "{bad}");
        assert!(e.to_string().starts_with("timeoutMs must be"), "{e}");
    }
    let key = Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap());
    let e = ManagedEngine::request(key.clone(), "ecdsa-p256-sha256", b"m".to_vec(), Some(0.0)).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    let e = ManagedEngine::request(key, "no-such-alg", b"m".to_vec(), None).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
}

#[test]
fn a_remote_engine_owns_its_signer_and_loads_envelopes_only() {
    let world = remote_support::World::new();
    let server = remote_support::start_server(&world, "sfo1", remote_support::ServerOptions::default());
    let mut config = ManagedConfig::default();
    config.isolation = Isolation::Remote(remote_support::client_config(&[("sfo1", server.local_addr())]));
    let engine = ManagedEngine::start(config).unwrap();
    assert!(!engine.has_key_process());

    let source = |env: &keyfence::wrap::Envelope| KeySource::envelope(env.to_bytes().to_vec(), "unused", "unused");
    let key = engine.load(source(&world.us_key)).unwrap();
    assert!(!key.is_local(), "the peers hold the key");
    let sig = sign(&engine, &key, b"remote").unwrap();
    assert!(verify(&key.public_key_der().unwrap(), Algorithm::EcdsaP256Sha256, b"remote", &sig));
    // Its figures are the engine's: one scrape shows both.
    let text = engine.metrics().unwrap().prometheus();
    assert!(text.contains("keyfence_remote_client_operations_total"), "{text}");
    // A key in bytes would be a key in this process: refused.
    let e = engine.load(KeySource::Bytes(p256_pem())).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    let junk = KeySource::envelope(b"junk".to_vec(), "unused", "unused");
    let e = engine.load(junk).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidEnvelope, "{e}");
    engine.close();
    assert_eq!(engine.load(source(&world.us_key)).unwrap_err().code(), ErrorCode::ShutDown);
}
