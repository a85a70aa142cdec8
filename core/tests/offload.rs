//! The offload backend on the simulated device: routing, batching,
//! completions, the in-flight bound, deadlines, device failure in flight
//! (fallback and clean failure), and the off/on/auto mode logic on a
//! machine without QAT.

mod common;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::verify_key;
use keyfence::sign::offload::{
    Device, DeviceRequest, OffloadBackend, OffloadConfig, OffloadMode, OnDeviceError, Route, Routing, SimConfig, SimControl, SimDevice,
};
use keyfence::sign::{
    Algorithm, Backend, BackendFailure, Engine, EngineConfig, Input, KeyKind, OpClass, Operation, Output, PrivateKey, Request, SignError,
    SignFuture,
};

fn rsa_key() -> Arc<PrivateKey> {
    static KEY: OnceLock<Arc<PrivateKey>> = OnceLock::new();
    KEY.get_or_init(|| Arc::new(PrivateKey::generate(KeyKind::Rsa { bits: 2048 }).unwrap())).clone()
}

fn p256_key() -> Arc<PrivateKey> {
    static KEY: OnceLock<Arc<PrivateKey>> = OnceLock::new();
    KEY.get_or_init(|| Arc::new(PrivateKey::generate(KeyKind::EcP256).unwrap())).clone()
}

fn sim(config: impl FnOnce(&mut SimConfig)) -> (Arc<SimDevice>, SimControl) {
    let mut c = SimConfig::default();
    config(&mut c);
    let device = SimDevice::new(c).unwrap();
    let control = device.control();
    (Arc::new(device), control)
}

fn offload(device: Arc<SimDevice>, config: impl FnOnce(&mut OffloadConfig)) -> OffloadBackend {
    let mut c = OffloadConfig::default();
    config(&mut c);
    OffloadBackend::with_device(device, c).unwrap()
}

fn engine_on(backend: &OffloadBackend) -> Engine {
    Engine::with_backend(EngineConfig::default(), Arc::new(backend.clone())).unwrap()
}

fn msg(i: usize) -> Vec<u8> {
    format!("message {i}").into_bytes()
}

fn submit_many(engine: &Engine, key: &Arc<PrivateKey>, alg: Algorithm, n: usize, timeout: Duration) -> Vec<SignFuture> {
    (0..n).map(|i| engine.submit(Request::sign(key.clone(), alg, msg(i)).with_timeout(timeout)).unwrap()).collect()
}

fn wait_all(futures: Vec<SignFuture>) -> Vec<Result<Output, SignError>> {
    futures.into_iter().map(SignFuture::wait).collect()
}

/// Waits until nothing is in flight at the device (completions run just
/// after the caller is answered).
fn wait_idle(backend: &OffloadBackend) {
    let until = Instant::now() + Duration::from_secs(2);
    while backend.stats().in_flight != 0 {
        assert!(Instant::now() < until, "device slots leaked: {:?}", backend.stats());
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until the sim device has started its first batch.
fn wait_first_batch(control: &SimControl) {
    let until = Instant::now() + Duration::from_secs(2);
    while control.stats().batches == 0 {
        assert!(Instant::now() < until, "the device never started a batch");
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn rsa_signatures_through_the_device_verify_equal_software_and_are_batched() {
    let key = rsa_key();
    let (device, control) = sim(|c| {
        c.latency = Duration::from_millis(5);
        c.batch_size = 8;
    });
    let backend = offload(device, |c| c.batch_window = Duration::from_millis(5));
    let sign = Operation::Sign { alg: Algorithm::RsaPkcs1Sha256, input: Input::Message(msg(0)) };
    assert_eq!(backend.class(&key, &sign), OpClass::Slow);
    assert_eq!(backend.route(&key, &sign), Route::Device);
    let engine = engine_on(&backend);

    let results = wait_all(submit_many(&engine, &key, Algorithm::RsaPkcs1Sha256, 32, Duration::from_secs(5)));
    for (i, r) in results.into_iter().enumerate() {
        let sig = r.unwrap();
        assert!(verify_key(&key, Algorithm::RsaPkcs1Sha256, &msg(i), &sig), "signature {i}");
        // PKCS#1 v1.5 is deterministic: the device's signature is software's.
        assert_eq!(*sig, *key.sign(Algorithm::RsaPkcs1Sha256, &msg(i)).unwrap(), "signature {i}");
    }
    // Raw decryption goes to the device too, and agrees with software.
    let input = key.sign(Algorithm::RsaPkcs1Sha256, b"any value below the modulus").unwrap().to_vec();
    let out = engine.submit(Request::decrypt_raw(key.clone(), input.clone())).unwrap().wait().unwrap();
    assert_eq!(*out, *key.decrypt_raw(&input).unwrap());

    wait_idle(&backend);
    let stats = backend.stats();
    assert_eq!((stats.submitted, stats.completed), (33, 33), "{stats:?}");
    assert_eq!((stats.software, stats.fallbacks, stats.device_errors), (0, 0, 0), "{stats:?}");
    assert!(stats.mean_batch_size() > 1.0, "no batching: {stats:?}");
    assert!(stats.batches < 33, "{stats:?}");
    assert!(control.stats().largest_batch <= 8, "{:?}", control.stats());
    assert_eq!(control.stats().completed, 33);
    assert_eq!(engine.metrics().class(OpClass::Slow).completed, 33);
    assert_eq!(engine.metrics().class(OpClass::Rsa).completed, 0);
}

#[test]
fn ecdsa_and_ed25519_follow_the_routing() {
    let key = p256_key();
    let op = Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: Input::Message(msg(0)) };

    // Default routing: ECDSA stays in software, on the EC executor.
    let (device, control) = sim(|_| {});
    let backend = offload(device, |_| {});
    assert_eq!(backend.route(&key, &op), Route::Software);
    assert_eq!(backend.class(&key, &op), OpClass::Ec);
    let engine = engine_on(&backend);
    for (i, r) in wait_all(submit_many(&engine, &key, Algorithm::EcdsaP256Sha256, 8, Duration::from_secs(5))).into_iter().enumerate() {
        assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, &msg(i), &r.unwrap()));
    }
    assert_eq!((backend.stats().software, backend.stats().submitted), (8, 0));
    assert_eq!(control.stats().accepted, 0);
    assert_eq!(engine.metrics().class(OpClass::Ec).completed, 8);

    // Routed to the device.
    let (device, control) = sim(|_| {});
    let backend = offload(device, |c| c.routing.ecdsa_p256 = Route::Device);
    assert_eq!(backend.class(&key, &op), OpClass::Slow);
    let engine = engine_on(&backend);
    for (i, r) in wait_all(submit_many(&engine, &key, Algorithm::EcdsaP256Sha256, 8, Duration::from_secs(5))).into_iter().enumerate() {
        assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, &msg(i), &r.unwrap()));
    }
    assert_eq!((backend.stats().submitted, backend.stats().completed, backend.stats().software), (8, 8, 0));
    assert_eq!(control.stats().completed, 8);

    // Ed25519 routed to a device that does not do it: software.
    let ed = Arc::new(PrivateKey::generate(KeyKind::Ed25519).unwrap());
    let (device, control) = sim(|_| {});
    let backend = offload(device, |c| c.routing = Routing::all(Route::Device));
    let ed_op = Operation::Sign { alg: Algorithm::Ed25519, input: Input::Message(msg(0)) };
    assert_eq!(backend.route(&ed, &ed_op), Route::Software);
    assert_eq!(backend.class(&ed, &ed_op), OpClass::Ec);
    let sig = engine_on(&backend).sign(&ed, Algorithm::Ed25519, &msg(0)).unwrap().wait().unwrap();
    assert!(verify_key(&ed, Algorithm::Ed25519, &msg(0), &sig));
    assert_eq!((backend.stats().software, control.stats().accepted), (1, 0));
}

#[test]
fn device_failure_in_flight_falls_back_to_software() {
    let key = rsa_key();
    let (device, control) = sim(|c| {
        c.latency = Duration::from_millis(50);
        c.batch_size = 8;
    });
    let backend = offload(device, |c| c.on_device_error = OnDeviceError::Fallback);
    let engine = engine_on(&backend);
    let start = Instant::now();
    let futures = submit_many(&engine, &key, Algorithm::RsaPkcs1Sha256, 32, Duration::from_secs(10));
    wait_first_batch(&control);
    control.fail();
    let results = wait_all(futures);
    let elapsed = start.elapsed();
    for (i, r) in results.into_iter().enumerate() {
        let sig = r.unwrap_or_else(|e| panic!("operation {i} failed: {e}"));
        assert!(verify_key(&key, Algorithm::RsaPkcs1Sha256, &msg(i), &sig), "signature {i}");
    }
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
    wait_idle(&backend);
    let stats = backend.stats();
    assert!(stats.fallbacks > 0, "{stats:?}");
    assert_eq!(stats.fallbacks, stats.device_errors, "{stats:?}");
    assert_eq!(stats.completed + stats.fallbacks, 32, "{stats:?}");
    assert_eq!(control.stats().resets, 1);
}

#[test]
fn device_failure_in_flight_fails_cleanly_and_promptly() {
    let key = rsa_key();
    let (device, control) = sim(|c| {
        c.latency = Duration::from_millis(50);
        c.batch_size = 8;
    });
    let backend = offload(device, |c| c.on_device_error = OnDeviceError::Fail);
    let engine = engine_on(&backend);
    let futures = submit_many(&engine, &key, Algorithm::RsaPkcs1Sha256, 32, Duration::from_secs(10));
    wait_first_batch(&control);
    let failed_at = Instant::now();
    control.fail();
    let results = wait_all(futures);
    let elapsed = failed_at.elapsed();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Err(SignError::Backend { backend, reason, failure: BackendFailure::Refused }) => {
                assert_eq!(backend, "offload", "operation {i}");
                assert!(reason.contains("`sim`"), "operation {i}: {reason}");
            }
            other => panic!("operation {i}: expected a backend error, got {other:?}"),
        }
    }
    // Nothing waited for the device, let alone the 10 s deadline.
    assert!(elapsed < Duration::from_secs(1), "took {elapsed:?} after the failure");
    wait_idle(&backend);
    let stats = backend.stats();
    assert_eq!((stats.failed, stats.fallbacks, stats.completed), (32, 0, 0), "{stats:?}");

    // The device recovers; later operations go through it again.
    control.recover();
    let sig = engine.sign(&key, Algorithm::RsaPkcs1Sha256, &msg(1)).unwrap().wait().unwrap();
    assert!(verify_key(&key, Algorithm::RsaPkcs1Sha256, &msg(1), &sig));
    assert_eq!(backend.stats().completed, 1);
}

#[test]
fn a_device_slower_than_the_deadline_times_out_promptly() {
    let key = rsa_key();
    let (device, _control) = sim(|c| c.latency = Duration::from_millis(200));
    let backend = offload(device, |_| {});
    let engine = engine_on(&backend);
    let start = Instant::now();
    let r = engine
        .submit(Request::sign(key.clone(), Algorithm::RsaPkcs1Sha256, msg(0)).with_timeout(Duration::from_millis(50)))
        .unwrap()
        .wait();
    let elapsed = start.elapsed();
    assert!(matches!(r, Err(SignError::TimedOut { .. })), "{r:?}");
    assert!(elapsed < Duration::from_millis(150), "took {elapsed:?}");

    // The synchronous path gives up at its deadline too.
    let op = Operation::Sign { alg: Algorithm::RsaPkcs1Sha256, input: Input::Message(msg(0)) };
    let start = Instant::now();
    let r = backend.perform(&key, &op, start + Duration::from_millis(50));
    let elapsed = start.elapsed();
    assert!(matches!(r, Err(SignError::TimedOut { .. })), "{r:?}");
    assert!(elapsed < Duration::from_millis(150), "took {elapsed:?}");
    assert!(backend.stats().expired >= 1);
}

#[test]
fn synchronous_perform_uses_the_device_and_handles_its_failure() {
    let key = rsa_key();
    let op = Operation::Sign { alg: Algorithm::RsaPkcs1Sha256, input: Input::Message(msg(3)) };
    let expected = key.sign(Algorithm::RsaPkcs1Sha256, &msg(3)).unwrap();
    let deadline = || Instant::now() + Duration::from_secs(5);

    let (device, control) = sim(|_| {});
    let backend = offload(device, |_| {});
    assert_eq!(*backend.perform(&key, &op, deadline()).unwrap(), *expected);
    assert_eq!((backend.stats().submitted, backend.stats().completed), (1, 1));
    assert_eq!(control.stats().completed, 1);
    control.fail();
    assert_eq!(*backend.perform(&key, &op, deadline()).unwrap(), *expected);
    assert_eq!((backend.stats().device_errors, backend.stats().fallbacks), (1, 1));

    let (device, control) = sim(|_| {});
    let backend = offload(device, |c| c.on_device_error = OnDeviceError::Fail);
    control.fail();
    let r = backend.perform(&key, &op, deadline());
    assert!(
        matches!(&r, Err(SignError::Backend { backend, reason, failure: BackendFailure::Refused }) if backend == "offload" && reason.contains("`sim`")),
        "{r:?}"
    );
    // Requests that are wrong for the key fail as they would in software.
    let bad = Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: Input::Message(msg(0)) };
    assert!(matches!(backend.perform(&key, &bad, deadline()), Err(SignError::KeyMismatch { .. })));
}

#[test]
fn in_flight_requests_are_bounded_and_none_is_lost() {
    let key = p256_key();
    let (device, control) = sim(|c| {
        c.latency = Duration::from_millis(20);
        c.batch_size = 8;
    });
    let backend = offload(device, |c| {
        c.max_in_flight = 2;
        c.routing.ecdsa_p256 = Route::Device;
    });
    assert_eq!(backend.max_in_flight(), 2);
    let engine = engine_on(&backend);

    // Enough time for all: everything completes, two at a time.
    let results = wait_all(submit_many(&engine, &key, Algorithm::EcdsaP256Sha256, 12, Duration::from_secs(5)));
    for (i, r) in results.into_iter().enumerate() {
        assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, &msg(i), &r.unwrap()), "signature {i}");
    }
    wait_idle(&backend);
    let stats = backend.stats();
    assert_eq!(stats.completed, 12, "{stats:?}");
    assert!(stats.peak_in_flight <= 2, "{stats:?}");
    assert!(control.stats().peak_in_device <= 2, "{:?}", control.stats());
    assert!(control.stats().largest_batch <= 2, "{:?}", control.stats());

    // Not enough time for all: each one completes or times out, none is
    // lost and none hangs.
    let start = Instant::now();
    let results = wait_all(submit_many(&engine, &key, Algorithm::EcdsaP256Sha256, 12, Duration::from_millis(45)));
    assert!(start.elapsed() < Duration::from_secs(1), "took {:?}", start.elapsed());
    assert_eq!(results.len(), 12);
    let mut timed_out = 0;
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(sig) => assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, &msg(i), &sig), "signature {i}"),
            Err(SignError::TimedOut { .. }) => timed_out += 1,
            Err(e) => panic!("operation {i}: {e}"),
        }
    }
    assert!(timed_out > 0, "12 operations two at a time at 20 ms each cannot all finish in 45 ms");
    wait_idle(&backend);
    assert!(backend.stats().peak_in_flight <= 2);
}

#[test]
fn transient_faults_fall_back_and_fail_after_stops_the_device() {
    let key = p256_key();
    let (device, control) = sim(|c| {
        c.latency = Duration::from_millis(1);
        c.fail_every = Some(3);
    });
    let backend = offload(device, |c| c.routing.ecdsa_p256 = Route::Device);
    let engine = engine_on(&backend);
    for (i, r) in wait_all(submit_many(&engine, &key, Algorithm::EcdsaP256Sha256, 12, Duration::from_secs(5))).into_iter().enumerate() {
        assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, &msg(i), &r.unwrap()), "signature {i}");
    }
    wait_idle(&backend);
    assert_eq!((backend.stats().fallbacks, backend.stats().completed), (4, 8), "{:?}", backend.stats());
    assert!(!control.is_failed());

    let (device, control) = sim(|c| {
        c.latency = Duration::from_millis(1);
        c.fail_after = Some(3);
    });
    let backend = offload(device, |c| {
        c.routing.ecdsa_p256 = Route::Device;
        c.on_device_error = OnDeviceError::Fail;
    });
    let engine = engine_on(&backend);
    let results: Vec<_> = (0..6).map(|i| engine.sign(&key, Algorithm::EcdsaP256Sha256, &msg(i)).unwrap().wait()).collect();
    assert!(results[..3].iter().all(Result::is_ok), "{results:?}");
    assert!(results[3..].iter().all(|r| matches!(r, Err(SignError::Backend { .. }))), "{results:?}");
    assert!(control.is_failed());
}

/// A device that loses every request, and one that panics: every operation
/// is still answered.
#[test]
fn a_device_that_drops_or_panics_never_leaves_an_operation_hanging() {
    struct Lossy {
        panic: bool,
    }
    impl Device for Lossy {
        fn name(&self) -> &str {
            "lossy"
        }
        fn supports(&self, _kind: KeyKind, _op: &Operation) -> bool {
            true
        }
        fn max_batch(&self) -> usize {
            4
        }
        fn max_in_flight(&self) -> usize {
            16
        }
        fn submit(&self, batch: Vec<DeviceRequest>) {
            assert!(!self.panic, "the device panics (as intended by the test)");
            drop(batch);
        }
    }
    let key = p256_key();
    for (panic, policy) in [(false, OnDeviceError::Fallback), (true, OnDeviceError::Fallback), (false, OnDeviceError::Fail)] {
        let mut config = OffloadConfig::default();
        config.routing.ecdsa_p256 = Route::Device;
        config.on_device_error = policy;
        let backend = OffloadBackend::with_device(Arc::new(Lossy { panic }), config).unwrap();
        let engine = engine_on(&backend);
        let results = wait_all(submit_many(&engine, &key, Algorithm::EcdsaP256Sha256, 10, Duration::from_secs(5)));
        for (i, r) in results.into_iter().enumerate() {
            match policy {
                OnDeviceError::Fallback => {
                    assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, &msg(i), &r.unwrap()), "signature {i}")
                }
                OnDeviceError::Fail => {
                    assert!(matches!(&r, Err(SignError::Backend { reason, .. }) if reason.contains("`lossy`")), "{r:?}")
                }
            }
        }
        wait_idle(&backend);
        assert_eq!(backend.stats().device_errors, 10);
    }
}

#[test]
fn modes_parse_and_auto_runs_in_software_without_qat() {
    assert_eq!("auto".parse::<OffloadMode>().unwrap(), OffloadMode::Auto);
    assert_eq!("on".parse::<OffloadMode>().unwrap(), OffloadMode::On);
    assert_eq!("OFF".parse::<OffloadMode>().unwrap(), OffloadMode::Off);
    let e = "fast".parse::<OffloadMode>().unwrap_err();
    assert!(matches!(e, SignError::Config(_)), "{e:?}");
    assert!(e.to_string().contains("`fast`") && e.to_string().contains("off, on or auto"), "{e}");

    // This machine has no QAT (and maybe no `qat` feature): auto is software.
    let mut config = OffloadConfig::default();
    config.qat.library = "libqat-keyfence-test-absent.so.4".into();
    // Nor crypto_mb, whatever this machine has installed (the multi-buffer
    // device's own tests are offload_multibuffer.rs).
    config.multibuffer.library = "libcrypto_mb-keyfence-test-absent.so.13".into();
    let auto = OffloadBackend::start(OffloadMode::Auto, config.clone()).unwrap();
    assert_eq!(auto.device_name(), None);
    let reason = auto.software_reason().unwrap();
    if cfg!(feature = "qat") {
        assert!(reason.contains("libqat-keyfence-test-absent.so.4 not found (install QATlib / intel-qatlib)"), "{reason}");
    } else {
        assert!(reason.contains("lacks the `qat` cargo feature"), "{reason}");
    }
    let key = rsa_key();
    let op = Operation::Sign { alg: Algorithm::RsaPkcs1Sha256, input: Input::Message(msg(0)) };
    assert_eq!(auto.class(&key, &op), OpClass::Rsa);
    let engine = engine_on(&auto);
    let sig = engine.sign(&key, Algorithm::RsaPkcs1Sha256, &msg(0)).unwrap().wait().unwrap();
    assert!(verify_key(&key, Algorithm::RsaPkcs1Sha256, &msg(0), &sig));
    assert_eq!((auto.stats().software, auto.stats().submitted), (1, 0));
    assert_eq!(engine.metrics().class(OpClass::Rsa).completed, 1);

    // On: a clear error at start.
    let e = OffloadBackend::start(OffloadMode::On, config.clone()).unwrap_err();
    if cfg!(feature = "qat") {
        assert!(matches!(&e, SignError::Backend { backend, .. } if backend == "offload"), "{e:?}");
        assert!(e.to_string().contains("not found (install QATlib / intel-qatlib)"), "{e}");
    } else {
        // No QAT in this build; the multi-buffer device is tried next, and
        // its library is not there either: both reasons, as unavailable.
        assert!(matches!(&e, SignError::Backend { backend, .. } if backend == "offload"), "{e:?}");
        assert!(e.to_string().contains("lacks the `qat` cargo feature") && e.to_string().contains("crypto_mb"), "{e}");
    }
    // The default QAT library name, whatever this machine has: never a
    // device in this build.
    let mut default_qat = OffloadConfig::default();
    default_qat.multibuffer = config.multibuffer.clone();
    assert!(OffloadBackend::start(OffloadMode::On, default_qat).is_err());

    let off = OffloadBackend::start(OffloadMode::Off, config).unwrap();
    assert_eq!((off.device_name(), off.software_reason()), (None, Some("offload mode is off")));
}

#[test]
fn bad_configurations_are_refused() {
    let mut config = OffloadConfig::default();
    config.batch_size = 0;
    assert!(matches!(OffloadBackend::start(OffloadMode::Off, config), Err(SignError::Config(_))));
    let mut config = OffloadConfig::default();
    config.max_in_flight = 0;
    let (device, _) = sim(|_| {});
    assert!(matches!(OffloadBackend::with_device(device, config), Err(SignError::Config(_))));
    let mut sim_config = SimConfig::default();
    sim_config.engines = 0;
    assert!(matches!(SimDevice::new(sim_config), Err(SignError::Config(_))));
    assert!("gpu".parse::<Route>().is_err());
}

/// QAT against stub libraries built here with the system C compiler:
/// discovery (the library is there but has no instance, cannot start, lacks
/// the allocator, or has instances that do not start), then the RSA path
/// against a stub that implements `cpaCyRsaDecrypt` with OpenSSL.
/// Issue 33: a faulty device's RSA result would reveal the key (one wrong
/// CRT half and the public key factor the modulus). Every device result is
/// checked with the public key; a wrong one is counted and redone in
/// software, never passed on: PKCS #1 v1.5 and PSS signatures and raw
/// decryption, asynchronously and through `perform`.
#[test]
fn a_corrupted_device_rsa_result_is_caught_counted_and_redone_in_software() {
    use openssl::rsa::Padding;
    let key = rsa_key();
    let verify_rsa = |alg: Algorithm, m: &[u8], sig: &[u8]| verify_key(&key, alg, m, sig);
    let (device, control) = sim(|_| {});
    let backend = offload(device, |_| {});
    let engine = engine_on(&backend);
    control.corrupt_results(2);
    for (i, alg) in [Algorithm::RsaPkcs1Sha256, Algorithm::RsaPssSha256].into_iter().enumerate() {
        let sig = engine.sign(&key, alg, &msg(i)).unwrap().wait().unwrap();
        assert!(verify_rsa(alg, &msg(i), &sig), "{alg}: a wrong signature left the backend");
    }
    let stats = backend.stats();
    assert_eq!((stats.mismatches, stats.device_errors, stats.fallbacks), (2, 2, 2), "{stats:?}");
    assert_eq!(control.stats().completed, 2, "the device did compute (wrong) results");

    // Raw decryption: the result raised to e must give the ciphertext back.
    let rsa = openssl::rsa::Rsa::public_key_from_der(&key.public_key_der().unwrap()).unwrap();
    let secret = [7u8; 48];
    let mut ct = vec![0u8; rsa.size() as usize];
    let n = rsa.public_encrypt(&secret, &mut ct, Padding::PKCS1).unwrap();
    ct.truncate(n);
    control.corrupt_results(1);
    let op = Operation::DecryptRaw { ciphertext: ct.clone() };
    let padded = engine.submit(Request::new(key.clone(), op.clone())).unwrap().wait().unwrap();
    assert_eq!(&padded[padded.len() - secret.len()..], &secret);
    assert_eq!(backend.stats().mismatches, 3);

    // The synchronous path checks too.
    control.corrupt_results(1);
    let deadline = Instant::now() + Duration::from_secs(5);
    let sign = Operation::Sign { alg: Algorithm::RsaPssSha256, input: Input::Message(msg(9)) };
    let sig = backend.perform(&key, &sign, deadline).unwrap();
    assert!(verify_rsa(Algorithm::RsaPssSha256, &msg(9), &sig));
    assert_eq!(backend.stats().mismatches, 4);

    // A right result passes the check untouched and uncounted.
    let sig = engine.sign(&key, Algorithm::RsaPssSha256, &msg(10)).unwrap().wait().unwrap();
    assert!(verify_rsa(Algorithm::RsaPssSha256, &msg(10), &sig));
    let stats = backend.stats();
    assert_eq!((stats.mismatches, stats.fallbacks), (4, 4), "{stats:?}");
}

#[cfg(feature = "qat")]
mod qat {
    use super::*;
    use keyfence::sign::offload::qat::{probe, ProbeError};
    use keyfence::sign::offload::QatConfig;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    const STUB: &str = r#"
        #include <stddef.h>
        #include <stdint.h>
        int icp_sal_userStart(const char *name) { (void)name; return STUB_START; }
        int icp_sal_userStop(void) { return 0; }
        int cpaCyGetNumInstances(uint16_t *n) { *n = STUB_INSTANCES; return 0; }
        int cpaCyGetInstances(uint16_t n, void **h) { for (uint16_t i = 0; i < n; i++) h[i] = (void *)(uintptr_t)(i + 1); return 0; }
        int cpaCyStartInstance(void *h) { (void)h; return -1; }
        int cpaCyStopInstance(void *h) { (void)h; return 0; }
        int cpaCySetAddressTranslation(void *h, void *f) { (void)h; (void)f; return 0; }
        int cpaCyRsaDecrypt(void) { return -6; }
        int icp_sal_CyPollInstance(void *h, uint32_t q) { (void)h; (void)q; return 0; }
        #ifndef STUB_NO_MEMORY
        void *qaeMemAllocNUMA(size_t s, int node, size_t a) { (void)s; (void)node; (void)a; return NULL; }
        void qaeMemFreeNUMA(void **p) { (void)p; }
        uint64_t qaeVirtToPhysNUMA(void *p) { return (uint64_t)(uintptr_t)p; }
        #endif
    "#;

    fn stub(name: &str, defines: &[&str]) -> PathBuf {
        build(name, STUB, defines, &[])
    }

    fn build(name: &str, source: &str, defines: &[&str], libs: &[&str]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("keyfence-qat-stub-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join(format!("{name}.c"));
        let lib = dir.join(format!("{name}.so"));
        std::fs::write(&src, source).unwrap();
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .args(defines.iter().map(|d| format!("-D{d}")))
            .arg(&src)
            .args(libs)
            .status()
            .expect("a C compiler (cc) builds the QATlib stubs");
        assert!(status.success());
        lib
    }

    fn config(lib: &Path) -> QatConfig {
        let mut c = QatConfig::default();
        c.library = lib.to_str().unwrap().into();
        c.memory_libraries = vec![];
        c
    }

    #[test]
    fn qat_discovery_against_stub_libraries() {
        let mut missing = QatConfig::default();
        missing.library = "libqat-keyfence-test-absent.so.4".into();
        let e = probe(&missing).unwrap_err();
        assert!(matches!(e, ProbeError::LibraryMissing(_)), "{e:?}");
        assert!(e.reason().contains("not found (install QATlib / intel-qatlib)"), "{e}");

        let none = stub("none", &["STUB_START=0", "STUB_INSTANCES=0"]);
        let e = probe(&config(&none)).unwrap_err();
        assert!(matches!(e, ProbeError::NoInstance(_)), "{e:?}");
        assert_eq!(e.reason(), "QATlib found but no QAT crypto instance");

        let down = stub("down", &["STUB_START=-1", "STUB_INSTANCES=1"]);
        let e = probe(&config(&down)).unwrap_err();
        assert!(e.reason().starts_with("QATlib found but no QAT crypto instance") && e.reason().contains("CPA_STATUS_FAIL"), "{e}");

        let nomem = stub("nomem", &["STUB_START=0", "STUB_INSTANCES=1", "STUB_NO_MEMORY"]);
        let e = probe(&config(&nomem)).unwrap_err();
        assert!(matches!(e, ProbeError::MissingSymbol(_)) && e.reason().contains("qaeMemAllocNUMA"), "{e:?}");

        let two = stub("two", &["STUB_START=0", "STUB_INSTANCES=2"]);
        let info = probe(&config(&two)).unwrap();
        assert_eq!(info.instances, 2);

        // This stub has instances, but every instance refuses to start.
        let mut offload_config = OffloadConfig::default();
        offload_config.qat = config(&two);
        let e = OffloadBackend::start(OffloadMode::On, offload_config.clone()).unwrap_err();
        assert!(e.to_string().contains("cannot start") && e.to_string().contains("CPA_STATUS_FAIL"), "{e}");
        let auto = OffloadBackend::start(OffloadMode::Auto, offload_config).unwrap();
        assert_eq!(auto.device_name(), None);
        assert!(auto.software_reason().unwrap().contains("cannot start"));

        let mut offload_config = OffloadConfig::default();
        offload_config.qat = config(&none);
        let e = OffloadBackend::start(OffloadMode::On, offload_config).unwrap_err();
        assert!(e.to_string().contains("QATlib found but no QAT crypto instance"), "{e}");
    }

    /// A QATlib stand-in with a working RSA path: `cpaCyRsaDecrypt` checks
    /// the request the way the header describes it and queues it (a ring of
    /// RING entries), `icp_sal_CyPollInstance` computes the queued CRT
    /// exponentiations with OpenSSL and calls back. Variants: FAULT flips a
    /// bit of every result, FULL refuses with CPA_STATUS_RETRY, FAIL calls
    /// back with CPA_STATUS_FAIL. It counts pinned allocations, and how
    /// many were handed back still holding non-zero bytes.
    const RSA_STUB: &str = r#"
        #include <pthread.h>
        #include <stdint.h>
        #include <stdlib.h>
        #include <string.h>
        #include <openssl/bn.h>
        typedef struct { uint32_t len; uint8_t *data; } FB;
        typedef struct { FB n, d; } Rep1;
        typedef struct { FB p, q, dp, dq, qinv; } Rep2;
        typedef struct { int version; int type; Rep1 r1; Rep2 r2; } Key;
        typedef struct { Key *key; FB in; } Op;
        typedef void (*Cb)(void *, int, void *, FB *);
        #define RING 64
        static struct { Cb cb; void *tag; const Op *op; FB *out; } ring[RING];
        static int count, started, instances_started;
        static long allocs, frees, dirty, ops;
        static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
        int icp_sal_userStart(const char *name) { (void)name; started = 1; return 0; }
        int icp_sal_userStop(void) { started = 0; return 0; }
        int cpaCyGetNumInstances(uint16_t *n) { *n = 2; return 0; }
        int cpaCyGetInstances(uint16_t n, void **h) { for (uint16_t i = 0; i < n; i++) h[i] = (void *)(uintptr_t)(i + 1); return 0; }
        int cpaCyStartInstance(void *h) { (void)h; instances_started++; return 0; }
        int cpaCyStopInstance(void *h) { (void)h; instances_started--; return 0; }
        int cpaCySetAddressTranslation(void *h, void *f) { (void)h; return f ? 0 : -4; }
        static int fb_ok(const FB *b, uint32_t len) { return b->data && b->len == len; }
        int cpaCyRsaDecrypt(void *h, Cb cb, void *tag, const Op *op, FB *out) {
            if (!started || !h || !cb || !op || !op->key || !out) return -4;
            const Key *k = op->key;
            uint32_t n = op->in.len, half = n / 2;
            if (k->version != 1 || k->type != 2 || !fb_ok(&op->in, n) || !fb_ok(out, n)
                || !fb_ok(&k->r2.p, half) || !fb_ok(&k->r2.q, half) || !fb_ok(&k->r2.dp, half)
                || !fb_ok(&k->r2.dq, half) || !fb_ok(&k->r2.qinv, half)) return -4;
        #ifdef FULL
            return -2;
        #endif
            pthread_mutex_lock(&mu);
            if (count == RING) { pthread_mutex_unlock(&mu); return -2; }
            ring[count].cb = cb; ring[count].tag = tag; ring[count].op = op; ring[count].out = out;
            count++;
            pthread_mutex_unlock(&mu);
            return 0;
        }
        static BIGNUM *bn(const FB *b) { return BN_bin2bn(b->data, (int)b->len, NULL); }
        static int crt(const Op *op, FB *out) {
            const Rep2 *r = &op->key->r2;
            BN_CTX *ctx = BN_CTX_new();
            BIGNUM *c = bn(&op->in), *p = bn(&r->p), *q = bn(&r->q), *dp = bn(&r->dp), *dq = bn(&r->dq),
                   *qi = bn(&r->qinv), *m1 = BN_new(), *m2 = BN_new(), *h = BN_new(), *m = BN_new();
            int ok = ctx && c && p && q && dp && dq && qi && m1 && m2 && h && m
                && BN_nnmod(m1, c, p, ctx) && BN_mod_exp(m1, m1, dp, p, ctx)
                && BN_nnmod(m2, c, q, ctx) && BN_mod_exp(m2, m2, dq, q, ctx)
                && BN_mod_sub(h, m1, m2, p, ctx) && BN_mod_mul(h, h, qi, p, ctx)
                && BN_mul(m, h, q, ctx) && BN_add(m, m, m2)
                && BN_bn2binpad(m, out->data, (int)out->len) == (int)out->len;
        #ifdef FAULT
            out->data[out->len / 2] ^= 1;
        #endif
            BN_clear_free(c); BN_clear_free(p); BN_clear_free(q); BN_clear_free(dp); BN_clear_free(dq);
            BN_clear_free(qi); BN_clear_free(m1); BN_clear_free(m2); BN_clear_free(h); BN_clear_free(m);
            BN_CTX_free(ctx);
            return ok;
        }
        int icp_sal_CyPollInstance(void *h, uint32_t quota) {
            (void)h; (void)quota;
            pthread_mutex_lock(&mu);
            int n = count;
            if (n == 0) { pthread_mutex_unlock(&mu); return -2; }
            Cb cb[RING]; void *tag[RING]; const Op *op[RING]; FB *out[RING];
            for (int i = 0; i < n; i++) { cb[i] = ring[i].cb; tag[i] = ring[i].tag; op[i] = ring[i].op; out[i] = ring[i].out; }
            count = 0;
            pthread_mutex_unlock(&mu);
            for (int i = 0; i < n; i++) {
                int status = crt(op[i], out[i]) ? 0 : -1;
        #ifdef FAIL
                status = -1;
        #endif
                __atomic_add_fetch(&ops, 1, __ATOMIC_SEQ_CST);
                cb[i](tag[i], status, (void *)op[i], out[i]);
            }
            return 0;
        }
        typedef struct { size_t size; size_t pad[7]; } Hdr;
        void *qaeMemAllocNUMA(size_t s, int node, size_t a) {
            (void)node; (void)a;
            Hdr *hd = aligned_alloc(64, sizeof(Hdr) + ((s + 63) / 64) * 64);
            if (!hd) return NULL;
            hd->size = s;
            __atomic_add_fetch(&allocs, 1, __ATOMIC_SEQ_CST);
            return hd + 1;
        }
        void qaeMemFreeNUMA(void **pp) {
            if (!pp || !*pp) return;
            Hdr *hd = (Hdr *)*pp - 1;
            const uint8_t *b = *pp;
            for (size_t i = 0; i < hd->size; i++) if (b[i]) { __atomic_add_fetch(&dirty, 1, __ATOMIC_SEQ_CST); break; }
            __atomic_add_fetch(&frees, 1, __ATOMIC_SEQ_CST);
            free(hd);
            *pp = NULL;
        }
        uint64_t qaeVirtToPhysNUMA(void *p) { return (uint64_t)(uintptr_t)p; }
        long stub_outstanding(void) { return allocs - frees; }
        long stub_dirty_frees(void) { return dirty; }
        long stub_ops(void) { return ops; }
        int stub_instances_started(void) { return instances_started; }
    "#;

    fn rsa_stub(name: &str, defines: &[&str]) -> PathBuf {
        build(name, RSA_STUB, defines, &["-lcrypto", "-lpthread"])
    }

    /// Reads one of the stub's counters.
    fn counter(lib: &Path, name: &str) -> i64 {
        // SAFETY: the stub was built above; its counters are
        // `long f(void)` or `int f(void)` functions without side effects.
        unsafe {
            let lib = libloading::Library::new(lib).unwrap();
            let mut sym = name.as_bytes().to_vec();
            sym.push(0);
            if name == "stub_instances_started" {
                i64::from(lib.get::<unsafe extern "C" fn() -> i32>(&sym).unwrap()())
            } else {
                #[allow(clippy::useless_conversion)] // c_long is 32 bits on some targets
                i64::from(lib.get::<unsafe extern "C" fn() -> std::ffi::c_long>(&sym).unwrap()())
            }
        }
    }

    fn qat_engine(lib: &Path, on_error: OnDeviceError) -> (OffloadBackend, Engine) {
        let mut c = OffloadConfig::default();
        c.qat = config(lib);
        c.on_device_error = on_error;
        let backend = OffloadBackend::start(OffloadMode::On, c).unwrap();
        assert_eq!(backend.device_name(), Some("qat"));
        let engine = engine_on(&backend);
        (backend, engine)
    }

    #[test]
    fn qat_rsa_path_signs_and_decrypts_through_a_stub_device() {
        let lib = rsa_stub("rsa-good", &[]);
        let (backend, engine) = qat_engine(&lib, OnDeviceError::Fail);
        assert_eq!(counter(&lib, "stub_instances_started"), 2);
        let key = rsa_key();
        let mut futures = Vec::new();
        for i in 0..24 {
            let alg = [Algorithm::RsaPkcs1Sha256, Algorithm::RsaPssSha256, Algorithm::RsaPkcs1Sha384][i % 3];
            futures.push((alg, msg(i), engine.sign(&key, alg, &msg(i)).unwrap()));
        }
        for (alg, m, f) in futures {
            let sig = f.wait().unwrap();
            assert!(verify_key(&key, alg, &m, &sig), "{alg} signature from the QAT path does not verify");
        }
        // Raw decryption: the device's answer is the plaintext integer.
        let public = openssl::pkey::PKey::public_key_from_der(&key.public_key_der().unwrap()).unwrap();
        let rsa = public.rsa().unwrap();
        let mut plain = vec![0u8; 256];
        plain[0] = 0;
        plain[1] = 2;
        plain[2..].fill(0x5a);
        let mut ct = vec![0u8; 256];
        rsa.public_encrypt(&plain, &mut ct, openssl::rsa::Padding::NONE).unwrap();
        let out = engine.submit(Request::new(key.clone(), Operation::DecryptRaw { ciphertext: ct })).unwrap();
        assert_eq!(&out.wait().unwrap()[..], &plain[..]);
        // A ciphertext not below the modulus is the operation's own error,
        // not a device fault: no software retry hides it.
        let e =
            engine.submit(Request::new(key.clone(), Operation::DecryptRaw { ciphertext: vec![0xff; 256] })).unwrap().wait().unwrap_err();
        assert!(e.to_string().contains("not smaller than the modulus"), "{e}");

        let stats = backend.stats();
        assert_eq!(stats.device_errors, 0, "{stats:?}");
        assert_eq!(stats.fallbacks, 0, "{stats:?}");
        assert!(counter(&lib, "stub_ops") >= 25, "the device did the work");
        // Every pinned buffer (key material included) was wiped and freed.
        assert_eq!(counter(&lib, "stub_outstanding"), 0);
        assert_eq!(counter(&lib, "stub_dirty_frees"), 0);
        // The batching thread lets go of the device when it sees the
        // backend gone; the instances stop then.
        drop(engine);
        drop(backend);
        let deadline = Instant::now() + Duration::from_secs(5);
        while counter(&lib, "stub_instances_started") != 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(counter(&lib, "stub_instances_started"), 0, "instances stop with the device");
    }

    #[test]
    fn a_faulty_qat_result_is_caught_by_the_public_key_check() {
        // Without the check, these would be faulty CRT signatures, which
        // reveal the key's factors to whoever sees one.
        let lib = rsa_stub("rsa-fault", &["FAULT"]);
        let (backend, engine) = qat_engine(&lib, OnDeviceError::Fallback);
        let key = rsa_key();
        for i in 0..6 {
            let sig = engine.sign(&key, Algorithm::RsaPkcs1Sha256, &msg(i)).unwrap().wait().unwrap();
            assert!(verify_key(&key, Algorithm::RsaPkcs1Sha256, &msg(i), &sig));
        }
        let stats = backend.stats();
        assert_eq!((stats.device_errors, stats.fallbacks), (6, 6), "{stats:?}");
        assert_eq!(counter(&lib, "stub_outstanding"), 0);

        let (_, failing) = qat_engine(&lib, OnDeviceError::Fail);
        let e = failing.sign(&key, Algorithm::RsaPkcs1Sha256, b"x").unwrap().wait().unwrap_err();
        assert!(e.to_string().contains("failed the public-key check"), "{e}");
    }

    #[test]
    fn a_full_ring_and_failed_callbacks_fall_back_to_software() {
        let key = rsa_key();
        for (name, define, why) in [("rsa-full", "FULL", "CPA_STATUS_RETRY"), ("rsa-fail", "FAIL", "completed the request with -1")] {
            let lib = rsa_stub(name, &[define]);
            let (backend, engine) = qat_engine(&lib, OnDeviceError::Fallback);
            for i in 0..4 {
                let sig = engine.sign(&key, Algorithm::RsaPssSha256, &msg(i)).unwrap().wait().unwrap();
                assert!(verify_key(&key, Algorithm::RsaPssSha256, &msg(i), &sig), "{name}");
            }
            let stats = backend.stats();
            assert_eq!(stats.fallbacks, 4, "{name}: {stats:?}");
            assert_eq!(counter(&lib, "stub_outstanding"), 0, "{name}");
            assert_eq!(counter(&lib, "stub_dirty_frees"), 0, "{name}");

            let (_, failing) = qat_engine(&lib, OnDeviceError::Fail);
            let e = failing.sign(&key, Algorithm::RsaPssSha256, b"x").unwrap().wait().unwrap_err();
            assert!(e.to_string().contains(why), "{name}: {e}");
        }
    }

    #[test]
    fn ecdsa_stays_in_software_with_qat_on() {
        let lib = rsa_stub("rsa-ec", &[]);
        let (backend, engine) = qat_engine(&lib, OnDeviceError::Fail);
        let key = p256_key();
        let sig = engine.sign(&key, Algorithm::EcdsaP256Sha256, b"ec").unwrap().wait().unwrap();
        assert!(verify_key(&key, Algorithm::EcdsaP256Sha256, b"ec", &sig));
        assert_eq!(counter(&lib, "stub_ops"), 0);
        assert_eq!(backend.stats().software, 1);
    }
}
