//! The multi-buffer device (issue 60) against a stand-in crypto_mb on
//! every machine (`vectors/crypto-mb-stand-in/`: the same names and ABI,
//! each lane computed with OpenSSL), and against Intel's library where the
//! CPU has AVX-512 IFMA and `./x setup` fetched it
//! (`KEYFENCE_CRYPTO_MB_REAL`). Every signature is checked with the
//! public key by OpenSSL.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use keyfence::sign::offload::{MultiBufferConfig, MultiBufferDevice, OffloadBackend, OffloadConfig, OffloadMode, Route, Routing};
use keyfence::sign::{Algorithm, Engine, EngineConfig, Input, KeyKind, Operation, PrivateKey, Request};
use openssl::pkey::PKey;

mod common;
mod key_process_support;

/// A folder of this test binary's own, removed at exit by nobody: under
/// the target directory, so builds are reused across tests.
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let d = exe.parent().unwrap().join(format!("crypto-mb-stand-in-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

fn vectors() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors/crypto-mb-stand-in")
}

/// The stand-in library, built once.
fn stand_in() -> &'static str {
    static LIB: OnceLock<String> = OnceLock::new();
    LIB.get_or_init(|| {
        let out = scratch().join("libcrypto_mb_stand_in.so");
        let status = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&out)
            .arg(vectors().join("crypto_mb_stand_in.c"))
            .arg("-lcrypto")
            .status()
            .expect("a C compiler and OpenSSL's headers (libssl-dev) build the stand-in crypto_mb");
        assert!(status.success(), "building the stand-in: {status}");
        out.display().to_string()
    })
}

/// The stand-in's behaviour is read from the environment at each call:
/// the tests that change it run one at a time.
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn with_env<T>(vars: &[(&str, &str)], f: impl FnOnce() -> T) -> T {
    let _held = ENV.lock().unwrap_or_else(|e| e.into_inner());
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let out = f();
    for (k, _) in vars {
        std::env::remove_var(k);
    }
    out
}

fn device(library: &str, min_lanes: usize) -> Arc<MultiBufferDevice> {
    let mut config = MultiBufferConfig::default();
    config.library = library.to_string();
    config.min_lanes = min_lanes;
    config.threads = 2;
    MultiBufferDevice::open(&config).unwrap()
}

fn engine(device: Arc<MultiBufferDevice>) -> (Engine, OffloadBackend) {
    let mut config = OffloadConfig::default();
    config.routing = Routing::all(Route::Device);
    config.batch_window = Duration::from_millis(2);
    config.batch_size = 64;
    let backend = OffloadBackend::with_device(device, config).unwrap();
    (Engine::with_backend(EngineConfig::default(), Arc::new(backend.clone())).unwrap(), backend)
}

fn key(kind: KeyKind) -> Arc<PrivateKey> {
    Arc::new(PrivateKey::generate(kind).unwrap())
}

/// OpenSSL's verdict on `sig` of `msg` by `key`'s public key.
fn verifies(key: &PrivateKey, alg: Algorithm, msg: &[u8], sig: &[u8]) -> bool {
    use openssl::hash::MessageDigest;
    let public = PKey::public_key_from_der(&key.public_key_der().unwrap()).unwrap();
    let md = match alg.hash().map(|h| h.len()) {
        Some(48) => MessageDigest::sha384(),
        Some(64) => MessageDigest::sha512(),
        _ => MessageDigest::sha256(),
    };
    let mut v = openssl::sign::Verifier::new(md, &public).unwrap();
    if alg.name().starts_with("rsa-pss") {
        v.set_rsa_padding(openssl::rsa::Padding::PKCS1_PSS).unwrap();
        v.set_rsa_pss_saltlen(openssl::sign::RsaPssSaltlen::DIGEST_LENGTH).unwrap();
    }
    v.verify_oneshot(sig, msg).unwrap_or(false)
}

/// Signs `n` messages with `key` and `alg` all at once (so batches form)
/// and checks each with OpenSSL.
fn sign_many(engine: &Engine, key: &Arc<PrivateKey>, alg: Algorithm, n: usize) {
    let msgs: Vec<Vec<u8>> = (0..n).map(|i| format!("message {i}").into_bytes()).collect();
    let futures: Vec<_> = msgs.iter().map(|m| engine.submit(Request::sign(key.clone(), alg, m.clone())).unwrap()).collect();
    for (m, f) in msgs.iter().zip(futures) {
        let sig = f.wait().unwrap_or_else(|e| panic!("{alg:?}: {e}"));
        assert!(verifies(key, alg, m, &sig), "{alg:?}: a signature OpenSSL does not verify");
    }
}

/// Every algorithm the device signs, 64 at a time, verified by OpenSSL:
/// the lanes went through crypto_mb (the device's counters), eight to a
/// call when the batch allows. `library` is the stand-in or Intel's.
fn every_algorithm_signs_through(library: &str) {
    let dev = device(library, 2);
    let (engine, backend) = engine(dev.clone());
    let cases = [
        (KeyKind::Rsa { bits: 2048 }, Algorithm::RsaPkcs1Sha256),
        (KeyKind::Rsa { bits: 2048 }, Algorithm::RsaPssSha256),
        (KeyKind::Rsa { bits: 3072 }, Algorithm::RsaPssSha384),
        (KeyKind::Rsa { bits: 4096 }, Algorithm::RsaPkcs1Sha512),
        (KeyKind::EcP256, Algorithm::EcdsaP256Sha256),
        (KeyKind::EcP384, Algorithm::EcdsaP384Sha384),
    ];
    for (kind, alg) in cases {
        let k = key(kind);
        assert!(dev.info().algorithms.iter().any(|(_, runs)| *runs), "{:?}", dev.info());
        sign_many(&engine, &k, alg, 64);
    }
    // Raw decryption (TLS's RSA key exchange) of a value below n.
    let k = key(KeyKind::Rsa { bits: 2048 });
    let mut ct = vec![0u8; 256];
    ct[1] = 7;
    let out = engine.submit(Request::new(k.clone(), Operation::DecryptRaw { ciphertext: ct.clone() })).unwrap().wait().unwrap();
    assert_eq!(&out[..], &k.perform(&Operation::DecryptRaw { ciphertext: ct }).unwrap()[..], "raw decryption as AWS-LC's");
    let stats = dev.stats();
    assert!(stats.calls > 0 && stats.lanes >= 6 * 64, "{stats:?}");
    assert!(stats.lanes as f64 / stats.calls as f64 > 3.0, "batches of a few lanes only: {stats:?}");
    assert_eq!(backend.stats().mismatches, 0);
}

/// Wycheproof's RSA signature generation vectors (PKCS #1 v1.5 is
/// deterministic: each signature must match byte for byte) through the
/// device, every test of a key at once so that its lanes fill; the count
/// of exact matches.
fn wycheproof_rsa_through(library: &str) -> usize {
    use wycheproof::rsa_pkcs1_sign::{TestName, TestSet};
    use wycheproof::HashFunction;
    let dev = device(library, 2);
    let (engine, backend) = engine(dev.clone());
    let set = TestSet::load(TestName::RsaMisc).unwrap();
    let mut exact = 0;
    for group in set.test_groups.iter().filter(|g| g.key_size >= 2048) {
        let alg = match group.hash {
            HashFunction::Sha2_256 => Algorithm::RsaPkcs1Sha256,
            HashFunction::Sha2_384 => Algorithm::RsaPkcs1Sha384,
            HashFunction::Sha2_512 => Algorithm::RsaPkcs1Sha512,
            _ => continue,
        };
        let key = Arc::new(PrivateKey::from_pem(group.private_pem.as_bytes()).unwrap());
        let pending: Vec<_> =
            group.tests.iter().map(|t| (t, engine.submit(Request::sign(key.clone(), alg, t.msg.to_vec())).unwrap())).collect();
        for (t, f) in pending {
            assert_eq!(&f.wait().unwrap()[..], &t.sig[..], "tcId {}", t.tc_id);
            exact += 1;
        }
    }
    assert!(dev.stats().lanes > 0, "{:?}", dev.stats());
    assert_eq!(backend.stats().mismatches, 0);
    exact
}

#[test]
fn wycheproofs_rsa_signatures_come_out_of_the_stand_in_byte_for_byte() {
    assert_eq!(with_env(&[], || wycheproof_rsa_through(stand_in())), 77);
}

#[test]
fn the_stand_in_gives_crypto_mbs_own_known_answers() {
    let kat = scratch().join("kat");
    let status = Command::new("cc")
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&kat)
        .arg(vectors().join("kat.c"))
        .arg("-ldl")
        .status()
        .unwrap();
    assert!(status.success());
    // Under the lock, as every call here: another test's `KF_MB_MODE`
    // would otherwise reach the child (it once made the stand-in say
    // that nothing runs on this CPU).
    let out = with_env(&[], || Command::new(&kat).arg(stand_in()).output().unwrap());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && said.matches("OK ").count() == 2, "{said}");
    // The control: a stand-in whose P-256 answer is off by a byte fails.
    let out = with_env(&[("KF_MB_WRONG_LANE", "3")], || Command::new(&kat).arg(stand_in()).output().unwrap());
    assert!(!out.status.success(), "the known-answer check cannot fail: {}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn every_algorithm_signs_through_the_stand_in() {
    with_env(&[], || every_algorithm_signs_through(stand_in()));
}

/// Nonces come from the system's generator for each signature: one
/// digest signed many times never repeats `r` (a repeated nonce gives the
/// key away from two signatures).
#[test]
fn one_digest_signed_many_times_never_repeats_r() {
    with_env(&[], || {
        let (engine, _) = engine(device(stand_in(), 2));
        let k = key(KeyKind::EcP256);
        let digest = openssl::sha::sha256(b"the same message");
        let futures: Vec<_> = (0..512)
            .map(|_| engine.submit(Request::sign_digest(k.clone(), Algorithm::EcdsaP256Sha256, digest.to_vec())).unwrap())
            .collect();
        let mut rs = std::collections::HashSet::new();
        for f in futures {
            let der = f.wait().unwrap();
            let sig = openssl::ecdsa::EcdsaSig::from_der(&der).unwrap();
            assert!(rs.insert(sig.r().to_vec()), "r repeated");
        }
    });
}

/// A lane crypto_mb fails is signed in software (counted); a lane whose
/// result is wrong is caught by the public-key check, redone in software
/// and counted: no caller sees either.
#[test]
fn a_failed_lane_and_a_wrong_lane_are_redone_in_software() {
    for (var, counter) in [("KF_MB_FAIL_LANE", "fallbacks"), ("KF_MB_WRONG_LANE", "mismatches")] {
        with_env(&[(var, "2")], || {
            let (engine, backend) = engine(device(stand_in(), 2));
            let k = key(KeyKind::Rsa { bits: 2048 });
            sign_many(&engine, &k, Algorithm::RsaPssSha256, 64);
            let s = backend.stats();
            let n = if counter == "fallbacks" { s.fallbacks } else { s.mismatches };
            assert!(n > 0, "{var}: {s:?}");
        });
    }
}

/// A lone request waits one window, never for company: with fewer than
/// `min_lanes` of an algorithm, software signs it (counted), and a slow
/// device does not hold it.
#[test]
fn a_lone_request_goes_to_software_after_one_window() {
    with_env(&[("KF_MB_SLOW_US", "200000")], || {
        let dev = device(stand_in(), 3);
        let (engine, backend) = engine(dev.clone());
        let k = key(KeyKind::EcP256);
        let t = std::time::Instant::now();
        let sig = engine.sign(&k, Algorithm::EcdsaP256Sha256, b"alone").unwrap().wait().unwrap();
        assert!(verifies(&k, Algorithm::EcdsaP256Sha256, b"alone", &sig));
        assert!(t.elapsed() < Duration::from_millis(150), "the lone request waited {:?}", t.elapsed());
        assert_eq!(dev.stats().calls, 0);
        assert_eq!(dev.stats().too_few, 1);
        assert_eq!(backend.stats().software, 1, "{:?}", backend.stats());
    });
}

/// What the library says runs decides: a library that runs nothing here
/// (a CPU without AVX-512 IFMA) leaves `auto` in software, saying why, and
/// `on` failing; one that runs RSA and P-256 only (AVX-IFMA without
/// AVX-512) keeps P-384 in software.
#[test]
fn auto_follows_what_the_library_says_runs_here() {
    with_env(&[("KF_MB_MODE", "unsupported")], || {
        let mut config = OffloadConfig::default();
        config.multibuffer.library = stand_in().to_string();
        let auto = OffloadBackend::start(OffloadMode::Auto, config.clone()).unwrap();
        assert_eq!(auto.device_name(), None);
        let why = auto.software_reason().unwrap();
        assert!(why.contains("crypto_mb") && why.contains("AVX-512 IFMA"), "{why}");
        let err = OffloadBackend::start(OffloadMode::On, config).unwrap_err().to_string();
        assert!(err.contains("crypto_mb"), "{err}");
    });
    with_env(&[("KF_MB_MODE", "l9")], || {
        let mut config = OffloadConfig::default();
        config.multibuffer.library = stand_in().to_string();
        config.routing = Routing::all(Route::Device);
        let auto = OffloadBackend::start(OffloadMode::Auto, config).unwrap();
        assert_eq!(auto.device_name(), Some("crypto_mb"));
        let p384 = key(KeyKind::EcP384);
        let sign = Operation::Sign { alg: Algorithm::EcdsaP384Sha384, input: Input::Message(b"m".to_vec()) };
        assert_eq!(auto.route(&p384, &sign), Route::Software);
        let p256 = key(KeyKind::EcP256);
        let sign = Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: Input::Message(b"m".to_vec()) };
        assert_eq!(auto.route(&p256, &sign), Route::Device);
    });
    // No library at all: software, naming what was looked for.
    let mut config = OffloadConfig::default();
    config.multibuffer.library = "/nonexistent/libcrypto_mb.so.13".into();
    let auto = OffloadBackend::start(OffloadMode::Auto, config).unwrap();
    assert!(auto.software_reason().unwrap().contains("/nonexistent/libcrypto_mb.so.13"));
}

/// Intel's library: where the CPU runs it, the same signatures as the
/// stand-in, verified by OpenSSL, and crypto_mb's known answers; where it
/// does not, one loud line saying so, and `auto` choosing software with
/// the real library loaded.
#[test]
fn intels_crypto_mb_where_the_cpu_runs_it() {
    let Some(real) = std::env::var("KEYFENCE_CRYPTO_MB_REAL").ok().filter(|p| Path::new(p).is_file()) else {
        assert!(
            std::env::var_os("KEYFENCE_REQUIRE_CRYPTO_MB").is_none(),
            "KEYFENCE_REQUIRE_CRYPTO_MB is set but KEYFENCE_CRYPTO_MB_REAL names no library"
        );
        eprintln!("*** NOT EXERCISED: Intel's crypto_mb (KEYFENCE_CRYPTO_MB_REAL names no library; ./x setup fetches it) ***");
        return;
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mut config = MultiBufferConfig::default();
    config.library = real.clone();
    let info = MultiBufferDevice::probe(&config).unwrap();
    if !cpu.contains("avx512ifma") {
        eprintln!(
            "*** NOT EXERCISED: Intel's crypto_mb ({}) cannot sign on this CPU: it lacks AVX-512 IFMA (mbx_is_crypto_mb_applicable = {}); auto is tested to choose software with it loaded ***",
            info.version,
            u8::from(info.applicable)
        );
        assert!(info.algorithms.iter().all(|(_, runs)| !runs), "{info:?}");
        let mut offload = OffloadConfig::default();
        offload.multibuffer = config;
        let auto = OffloadBackend::start(OffloadMode::Auto, offload).unwrap();
        assert_eq!(auto.device_name(), None);
        assert!(auto.software_reason().unwrap().contains("AVX-512 IFMA"));
        return;
    }
    assert!(info.algorithms.iter().filter(|(_, runs)| *runs).count() >= 4, "{info:?}");
    every_algorithm_signs_through(&real);
    assert_eq!(wycheproof_rsa_through(&real), 77);
    let kat = scratch().join("kat-real");
    assert!(Command::new("cc").args(["-O1", "-o"]).arg(&kat).arg(vectors().join("kat.c")).arg("-ldl").status().unwrap().success());
    // The C program opens crypto_mb with a plain dlopen: Intel's runtime
    // libraries beside it are found through the library path, as a C
    // program of a user's would find them.
    let dir = Path::new(&real).parent().unwrap();
    let out = Command::new(&kat).arg(&real).env("LD_LIBRARY_PATH", dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
}

/// The lines the stand-in logged (`KF_MB_LOG`): one per call, `rsa BITS
/// LANES` or `ecdsa BITS LANES`.
fn logged(path: &Path) -> Vec<(String, u32, usize)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// Where keys live when deployed: the isolated key process (under its
/// sandbox) and the agent sign on the device, their requests from many
/// callers forming its batches. Seen in the stand-in's own log.
#[test]
fn the_key_process_and_the_agent_sign_on_the_device() {
    use keyfence::sign::key_process::{KeyProcess, KeyProcessConfig, KeySource};
    use keyfence::sign::offload::OffloadMode;
    let dir = scratch().join("deployed");
    std::fs::create_dir_all(&dir).unwrap();
    // The key process may write only a token module's folder: the log goes there.
    let log = dir.join("calls.log");
    let pem = dir.join("rsa.pem");
    let rsa = openssl::rsa::Rsa::generate(2048).unwrap();
    std::fs::write(&pem, PKey::from_rsa(rsa).unwrap().private_key_to_pem_pkcs8().unwrap()).unwrap();
    let vars = [
        ("KEYFENCE_CRYPTO_MB", stand_in().to_string()),
        ("KF_MB_LOG", log.display().to_string()),
        ("KEYFENCE_PKCS11_TOKEN_DIRS", dir.display().to_string()),
    ];
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    with_env(&vars, || {
        let mut config = KeyProcessConfig::with_command([env!("CARGO_BIN_EXE_keyfence-key-process")]);
        config.offload = OffloadMode::On;
        let keys = KeyProcess::start(config).unwrap();
        assert!(keys.multibuffer(), "the key process says it signs on the device");
        let key = keys.load(KeySource::File(pem.clone())).unwrap();
        let engine = Engine::new(EngineConfig::default()).unwrap();
        sign_many(&engine, &key, Algorithm::RsaPssSha256, 96);
        let calls = logged(&log);
        assert!(calls.iter().any(|(what, bits, lanes)| what == "rsa" && *bits == 2048 && *lanes > 1), "{calls:?}");
        // Mode on without a library that runs: the key process does not start, saying why.
        std::env::set_var("KF_MB_MODE", "unsupported");
        let mut config = KeyProcessConfig::with_command([env!("CARGO_BIN_EXE_keyfence-key-process")]);
        config.offload = OffloadMode::On;
        let err = KeyProcess::start(config).unwrap_err().to_string();
        std::env::remove_var("KF_MB_MODE");
        assert!(err.contains("offload mode `on`") && err.contains("crypto_mb"), "{err}");

        // The agent: its clients' envelopes, opened with its machine key,
        // signed in groups on the device, many clients at once.
        std::fs::write(&log, b"").unwrap();
        let world = key_process_support::agent_world(&dir);
        let mut config = key_process_support::agent_config(&dir, &world);
        config.offload = OffloadMode::On;
        config.crypto_mb = Some(stand_in().to_string());
        let agent = keyfence::sign::agent::Agent::start(config).unwrap();
        let clients: Vec<_> = (0..4).map(|_| key_process_support::agent_engine(agent.socket()).unwrap()).collect();
        let keys: Vec<_> = clients.iter().map(|c| c.load(KeySource::agent_envelope(world.eu_rsa.1.clone())).unwrap()).collect();
        let pending: Vec<_> = (0..24)
            .flat_map(|i| clients.iter().zip(&keys).map(move |(c, k)| (c, k, format!("client message {i}").into_bytes())))
            .map(|(c, k, m)| {
                let req =
                    keyfence::sign::managed::ManagedEngine::request(k.clone(), Algorithm::RsaPssSha256.name(), m.clone(), None).unwrap();
                (k, m, c.submit(req).unwrap())
            })
            .collect();
        for (k, m, f) in pending {
            let sig = f.wait().unwrap();
            assert!(verifies(k, Algorithm::RsaPssSha256, &m, &sig), "an agent's signature OpenSSL does not verify");
        }
        let calls = logged(&log);
        assert!(calls.iter().any(|(what, bits, lanes)| what == "rsa" && *bits == 2048 && *lanes > 1), "the agent's calls: {calls:?}");
    });
}

/// What every binding goes through: a managed engine's `offload` and
/// `crypto_mb` choose the device for keys in this process and in its key
/// process (the library named by the setting, not the environment), and
/// an agent's engine refuses a mode, the agent's own being the one.
#[test]
fn a_managed_engine_signs_on_the_device_where_its_keys_are() {
    use keyfence::sign::key_process::{KeyProcessConfig, KeySource};
    use keyfence::sign::managed::{Isolation, ManagedConfig, ManagedEngine};
    let dir = scratch().join("managed");
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("calls.log");
    let pem = dir.join("ec.pem");
    let ec = openssl::ec::EcKey::generate(&openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap()).unwrap();
    std::fs::write(&pem, PKey::from_ec_key(ec).unwrap().private_key_to_pem_pkcs8().unwrap()).unwrap();
    let vars = [("KF_MB_LOG", log.display().to_string()), ("KEYFENCE_PKCS11_TOKEN_DIRS", dir.display().to_string())];
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    with_env(&vars, || {
        let in_process = ManagedConfig::default();
        let mut isolated = ManagedConfig::default();
        isolated.isolation = Isolation::KeyProcess(KeyProcessConfig::with_command([env!("CARGO_BIN_EXE_keyfence-key-process")]));
        for (name, mut config) in [("in process", in_process), ("isolated", isolated)] {
            std::fs::write(&log, b"").unwrap();
            config.offload = Some(OffloadMode::On);
            config.crypto_mb = Some(stand_in().to_string());
            let engine = ManagedEngine::start(config).unwrap();
            let key = engine.load(KeySource::File(pem.clone())).unwrap();
            let pending: Vec<_> = (0..64)
                .map(|i| {
                    let m = format!("{name} {i}").into_bytes();
                    let req = ManagedEngine::request(key.clone(), Algorithm::EcdsaP256Sha256.name(), m.clone(), None).unwrap();
                    (m, engine.submit(req).unwrap())
                })
                .collect();
            for (m, f) in pending {
                assert!(verifies(&key, Algorithm::EcdsaP256Sha256, &m, &f.wait().unwrap()), "{name}");
            }
            let calls = logged(&log);
            assert!(calls.iter().any(|(what, bits, lanes)| what == "ecdsa" && *bits == 256 && *lanes > 1), "{name}: {calls:?}");
        }
        // Off: the device is never opened, even with a library named.
        std::fs::write(&log, b"").unwrap();
        let mut config = ManagedConfig::default();
        config.offload = Some(OffloadMode::Off);
        config.crypto_mb = Some(stand_in().to_string());
        let engine = ManagedEngine::start(config).unwrap();
        let key = engine.load(KeySource::File(pem.clone())).unwrap();
        let req = ManagedEngine::request(key.clone(), Algorithm::EcdsaP256Sha256.name(), b"off".to_vec(), None).unwrap();
        engine.submit(req).unwrap().wait().unwrap();
        assert!(logged(&log).is_empty());
    });
    let mut config = ManagedConfig::default();
    config.isolation = Isolation::Agent(dir.join("no-agent.sock"));
    config.offload = Some(OffloadMode::On);
    let err = ManagedEngine::start(config).expect_err("an agent's engine with an offload mode").to_string();
    assert!(err.contains("choose their own"), "{err}");
}
