//! Keys in a PKCS#11 token (SoftHSM2, vectors/softhsm-fixture.sh): every
//! algorithm signs through the engine's token class and BoringSSL verifies
//! it against the public key openssl wrote when it made the key; the
//! secret is never read out; every failure an operator meets (wrong PIN,
//! no PIN, no such key, no module, a PIN in the URI, the token's folder
//! deleted while in use) is a typed error, and nothing hangs; a refused
//! PIN reaches the token once, however many loads and threads ask, until
//! the PIN changes (counted by a module that logs each `C_Login`); an
//! agent's refusal names neither its module nor other tokens; 10,000
//! signatures with 64 in flight.

mod common;
mod pkcs11_support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{is_root, probe_as_nobody, skip_unless, verify, REQUIRE_ROOT};
use keyfence::sign::key_process::KeySource;
use keyfence::sign::managed::{ManagedConfig, ManagedEngine};
use keyfence::sign::pkcs11::{self, Pkcs11Settings};
use keyfence::sign::{Algorithm, Input, KeyKind, OpClass, Operation, PrivateKey, Request, SignError};
use keyfence::ErrorCode;
use openssl::pkey::PKey;
use pkcs11_support::{counting_module, logins, module, pin, token, uri, CKR_PIN_INCORRECT};

fn engine() -> ManagedEngine {
    ManagedEngine::start(ManagedConfig::default()).unwrap()
}

fn load(engine: &ManagedEngine, uri: &str) -> Result<Arc<PrivateKey>, keyfence::sign::managed::LoadError> {
    engine.load(KeySource::Pkcs11(uri.to_string()))
}

/// The public key openssl wrote when it made the key (not the token's).
fn pem_public(dir: &Path, label: &str) -> Vec<u8> {
    let pem = std::fs::read(dir.join("keys").join(format!("{label}.pem"))).unwrap();
    PKey::private_key_from_pem(&pem).unwrap().public_key_to_der().unwrap()
}

#[test]
fn every_algorithm_signs_on_the_token_class_and_verifies_against_openssls_key() {
    let Some(dir) = token() else { return };
    let engine = engine();
    // Every RSA signature but TLS 1.0's MD5+SHA-1, which has no PKCS#11
    // mechanism of its own.
    let rsa: Vec<Algorithm> =
        Algorithm::ALL.into_iter().filter(|a| a.name().starts_with("rsa-") && *a != Algorithm::RsaPkcs1Md5Sha1).collect();
    assert_eq!(rsa.len(), 6);
    let cases: &[(&str, KeyKind, &[Algorithm])] = &[
        ("tls-p256", KeyKind::EcP256, &[Algorithm::EcdsaP256Sha256]),
        ("tls-p384", KeyKind::EcP384, &[Algorithm::EcdsaP384Sha384]),
        ("tls-rsa", KeyKind::Rsa { bits: 2048 }, &rsa),
        ("tls-ed", KeyKind::Ed25519, &[Algorithm::Ed25519]),
    ];
    for (label, kind, algs) in cases {
        let key = load(&engine, &uri(dir, label)).unwrap_or_else(|e| panic!("{label}: {e}"));
        assert!(!key.is_local(), "{label}: the token holds the key");
        assert_eq!(key.kind(), *kind);
        let public = key.public_key_der().unwrap();
        assert_eq!(public, pem_public(dir, label), "{label}: the public key read from the token is openssl's");
        assert!(!format!("{key:?}").contains(&pin(dir)));
        for alg in *algs {
            let msg = format!("{label} signs with {alg}").into_bytes();
            let sig = engine.perform(Request::sign(key.clone(), *alg, msg.clone())).unwrap();
            assert!(verify(&public, *alg, &msg, &sig), "{label} {alg}: verifies");
            assert!(!verify(&public, *alg, b"another message", &sig), "{label} {alg}: the check can fail");
            if let Some(hash) = alg.hash() {
                let digest = hash.digest(&msg).unwrap();
                let op = Operation::Sign { alg: *alg, input: Input::Digest(digest) };
                let sig = engine.perform(Request::new(key.clone(), op)).unwrap();
                assert!(verify(&public, *alg, &msg, &sig), "{label} {alg}: a digest the caller computed");
            }
        }
    }
    // Raw RSA decryption, as TLS's RSA key exchange asks: the token's
    // answer is the padded block.
    let rsa = load(&engine, &uri(dir, "tls-rsa")).unwrap();
    let public = openssl::rsa::Rsa::public_key_from_der(&rsa.public_key_der().unwrap()).unwrap();
    let mut ct = vec![0; 256];
    public.public_encrypt(b"premaster", &mut ct, openssl::rsa::Padding::PKCS1).unwrap();
    let out = engine.perform(Request::new(rsa.clone(), Operation::DecryptRaw { ciphertext: ct })).unwrap();
    assert!(out.ends_with(b"\0premaster") && out[..2] == [0, 2]);
    let m = engine.metrics().unwrap();
    assert!(m.class(OpClass::Token).completed >= 13, "token keys run on the token class: {:?}", m.class(OpClass::Token));
    assert_eq!(m.class(OpClass::Ec).completed + m.class(OpClass::Rsa).completed, 0);
}

/// The module opened directly (this process's keyfence has it initialized
/// already, which the second `C_Initialize` says), and the slot of `label`.
fn token_slot(dir: &Path, label: &str) -> (cryptoki::context::Pkcs11, cryptoki::slot::Slot) {
    token_slot_in(Path::new(&module(dir)), label)
}

/// The same, through the module `module`.
fn token_slot_in(module: &Path, label: &str) -> (cryptoki::context::Pkcs11, cryptoki::slot::Slot) {
    use cryptoki::context::{CInitializeArgs, Pkcs11};
    let ctx = Pkcs11::new(module).unwrap();
    let _ = ctx.initialize(CInitializeArgs::OsThreads);
    let slot =
        ctx.get_slots_with_token().unwrap().into_iter().find(|s| ctx.get_token_info(*s).unwrap().label().trim_end() == label).unwrap();
    (ctx, slot)
}

#[test]
fn the_secret_stays_in_the_token() {
    use cryptoki::object::{Attribute, AttributeType, ObjectClass};
    let Some(dir) = token() else { return };
    // Loaded through keyfence first (which reads no secret attribute)...
    let key = pkcs11::load(&uri(dir, "tls-p256"), &Pkcs11Settings::default()).unwrap();
    assert!(!key.is_local());
    // ...then asked directly: the key is sensitive and not extractable,
    // and its value cannot be read, so keyfence cannot have read it.
    let (ctx, slot) = token_slot(dir, "edge");
    let session = ctx.open_ro_session(slot).unwrap();
    session.login(cryptoki::session::UserType::User, Some(&cryptoki::types::AuthPin::new(pin(dir)))).ok();
    let handle = session.find_objects(&[Attribute::Class(ObjectClass::PRIVATE_KEY), Attribute::Label(b"tls-p256".to_vec())]).unwrap()[0];
    let attrs = session.get_attributes(handle, &[AttributeType::Sensitive, AttributeType::Extractable]).unwrap();
    assert!(attrs.contains(&Attribute::Sensitive(true)) && attrs.contains(&Attribute::Extractable(false)), "{attrs:?}");
    assert!(session.get_attributes(handle, &[AttributeType::Value]).map_or(true, |v| v.is_empty()), "the scalar cannot be read");
    std::mem::forget(ctx); // keyfence's module handle is the same library
    key.sign(Algorithm::EcdsaP256Sha256, b"still signs").unwrap();
}

#[test]
fn every_failure_is_a_typed_error_and_nothing_hangs() {
    let Some(dir) = token() else { return };
    let engine = engine();
    let code = |uri: &str| load(&engine, uri).map(|_| ()).unwrap_err();
    let m = module(dir);
    let good_pin = format!("pin-source=file:{}", dir.join("pin").display());

    let e = code(&format!("pkcs11:token=edge;object=nothing-here?module-path={m}&{good_pin}"));
    assert_eq!(e.code(), ErrorCode::InvalidPrivateKey, "{e}");
    assert!(e.to_string().contains("no private key with object=nothing-here"), "{e}");

    let e = code(&format!("pkcs11:token=no-such-token;object=tls-p256?module-path={m}&{good_pin}"));
    assert_eq!(e.code(), ErrorCode::InvalidPrivateKey, "{e}");
    assert!(e.to_string().contains("its tokens: ") && e.to_string().contains("edge"), "{e}");

    let e = code(&format!("pkcs11:token=edge;object=tls-p256?module-path={m}&pin-value=1234"));
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("pin-source") && !e.to_string().contains("1234"), "{e}");

    let e = code("pkcs11:token=edge;object=tls-p256?module-path=/nonexistent/libnothing.so");
    assert_eq!(e.code(), ErrorCode::InvalidConfig, "{e}");

    let e = code(&format!("pkcs11:token=edge;object=tls-p256;type=cert?module-path={m}&{good_pin}"));
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");

    let e = code(&format!("pkcs11:token=edge;object=tls-p256?module-path={m}&pin-source=file:{}/missing", dir.display()));
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("cannot read the PIN file"), "{e}");
}

/// The URI of a spare token's key `k` (no PIN source).
fn spare_token(dir: &Path, label: &str) -> String {
    assert!(pkcs11_support::SPARE_TOKENS.contains(&label));
    format!("pkcs11:token={label};object=k?module-path={}", module(dir))
}

#[test]
fn a_wrong_or_missing_pin_is_token_login_and_is_not_tried_again() {
    let Some(dir) = token() else { return };
    let base = spare_token(dir, "logins");
    let settings = Pkcs11Settings::default();
    let with = |file: &str| format!("{base}&pin-source=file:{}", dir.join(file).display());
    pkcs11::generate(&with("logins.pin"), KeyKind::EcP256, &settings).unwrap_or_else(|e| panic!("{e}"));
    let e = pkcs11::generate(&with("logins.pin"), KeyKind::EcP256, &settings).unwrap_err();
    assert!(e.to_string().contains("exists already"), "{e}");
    // A second process-wide load of the same token with another PIN is
    // refused; a fresh token keeps the test independent of that rule.
    let base = spare_token(dir, "logins2");
    let with = |file: &str| format!("{base}&pin-source=file:{}", dir.join(file).display());
    pkcs11::generate(&with("logins2.pin"), KeyKind::Ed25519, &settings).unwrap();

    let wrong = pkcs11::load(&with("logins2.badpin"), &settings).unwrap_err();
    assert_eq!(wrong.code(), ErrorCode::TokenLogin, "{wrong}");
    assert!(wrong.to_string().contains("PinIncorrect") && !wrong.to_string().contains("0000"), "{wrong}");
    let again = pkcs11::load(&with("logins2.badpin"), &settings).unwrap_err();
    assert!(again.to_string().contains("does not try it again"), "{again}");
    // The operator fixes the PIN: the next load uses it.
    let key = pkcs11::load(&with("logins2.pin"), &settings).unwrap();
    key.sign(Algorithm::Ed25519, b"x").unwrap();

    // No PIN at all, on a token that needs one.
    let base = spare_token(dir, "nopin");
    let e = pkcs11::load(&base, &settings).unwrap_err();
    assert_eq!(e.code(), ErrorCode::TokenLogin, "{e}");
    assert!(e.to_string().contains("needs a PIN"), "{e}");
}

/// The review's case (issue 55): a token whose PIN is not the one given,
/// loaded again and again. The token hears the wrong PIN once, from eight
/// threads at once and twenty loads after them; every load after the
/// first refusal fails at once with `TOKEN_LOGIN`, saying why. The same
/// wrong PIN from another source is another login, tried once too. Then
/// the operator fixes the PIN file, and the next load logs in and signs.
#[test]
fn a_refused_pin_reaches_the_token_once_until_the_pin_file_changes() {
    let Some(dir) = token() else { return };
    let label = "counted";
    let counting = counting_module(dir);
    let pin_file = dir.join("counted.try");
    std::fs::write(&pin_file, "0000\n").unwrap();
    let base = format!("pkcs11:token={label};object=payments?module-path={}", counting.display());
    let uri = format!("{base}&pin-source=file:{}", pin_file.display());
    let settings = Pkcs11Settings::default();
    let refused = |e: &SignError| {
        assert_eq!(e.code(), ErrorCode::TokenLogin, "{e}");
        assert!(e.to_string().starts_with("pkcs11:token=counted: the token refused the PIN from"), "{e}");
        assert!(e.to_string().contains("until the PIN changes") && !e.to_string().contains("0000"), "{e}");
    };

    // Eight threads at once: one sends the PIN, the others hear its answer.
    let barrier = std::sync::Barrier::new(8);
    let errors: Vec<SignError> = std::thread::scope(|s| {
        let loads: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    pkcs11::load(&uri, &settings).map(|_| ()).unwrap_err()
                })
            })
            .collect();
        loads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    errors.iter().for_each(refused);
    assert_eq!(logins(dir, label), [CKR_PIN_INCORRECT], "one C_Login for eight loads at once");

    // Twenty loads after: none reaches the token, each says why.
    for _ in 0..20 {
        let e = pkcs11::load(&uri, &settings).map(|_| ()).unwrap_err();
        refused(&e);
        assert!(e.to_string().contains(&format!("the PIN file {} before (Login returned PinIncorrect)", pin_file.display())), "{e}");
    }
    // Through an engine as well (the same process's memory).
    let e = load(&engine(), &uri).map(|_| ()).unwrap_err();
    assert_eq!(e.code(), ErrorCode::TokenLogin, "{e}");
    assert_eq!(logins(dir, label), [CKR_PIN_INCORRECT], "a refused PIN was sent again");

    // The same wrong PIN as the settings' PIN (KEYFENCE_PKCS11_PIN) is
    // another source: tried once, then remembered too.
    let mut by_value = Pkcs11Settings::default();
    by_value.pin = Some(zeroize::Zeroizing::new("0000".to_string()));
    for _ in 0..5 {
        let e = pkcs11::load(&base, &by_value).map(|_| ()).unwrap_err();
        assert_eq!(e.code(), ErrorCode::TokenLogin, "{e}");
        assert!(e.to_string().contains("the PIN setting (KEYFENCE_PKCS11_PIN)"), "{e}");
    }
    assert_eq!(logins(dir, label), [CKR_PIN_INCORRECT; 2]);

    // The operator fixes the PIN file: the next load logs in and signs.
    std::fs::write(&pin_file, "4321\n").unwrap();
    let key = pkcs11::load(&uri, &settings).unwrap_or_else(|e| panic!("{e}"));
    let sig = key.sign(Algorithm::EcdsaP256Sha256, b"paid").unwrap();
    assert!(verify(&key.public_key_der().unwrap(), Algorithm::EcdsaP256Sha256, b"paid", &sig));
    assert_eq!(logins(dir, label), [CKR_PIN_INCORRECT, CKR_PIN_INCORRECT, 0]);
    // Logged in: more keys of the token need no login.
    pkcs11::load(&uri, &settings).unwrap();
    assert_eq!(logins(dir, label).len(), 3);

    // The control: the module counts every C_Login it is given (the
    // token, logged in, answers CKR_USER_ALREADY_LOGGED_IN).
    let (ctx, slot) = token_slot_in(&counting, label);
    let session = ctx.open_ro_session(slot).unwrap();
    for _ in 0..2 {
        let _ = session.login(cryptoki::session::UserType::User, Some(&cryptoki::types::AuthPin::new("0000".into())));
    }
    drop(session);
    std::mem::forget(ctx); // keyfence's module handle is the same library
    assert_eq!(logins(dir, label).len(), 5, "the counting module missed a C_Login");
}

/// An agent answers clients it does not trust with its module and PIN
/// file: a refusal names neither the module's path, nor the PIN file's,
/// nor any token but the one the URI asked for, and a PIN refused for one
/// client is not sent again for the next (the review's agent: twenty loads
/// of a token whose PIN is not the agent's file's, one `C_Login`).
#[test]
fn an_agents_refusal_names_no_module_path_and_no_other_token() {
    use keyfence::sign::agent::{Agent, AgentConfig};
    use keyfence::sign::managed::{Isolation, ManagedConfig};
    let Some(dir) = token() else { return };
    let counting = counting_module(dir);
    let agent_dir = dir.join("agent");
    std::fs::create_dir_all(&agent_dir).unwrap();
    // The agent's PIN file is `edge`'s: the spare tokens' PIN is another.
    // An agent of token keys only: no store, no machine key.
    let mut settings = Pkcs11Settings::default();
    settings.module = Some(counting.clone());
    settings.pin_file = Some(dir.join("pin"));
    let mut config = AgentConfig::tokens_only(agent_dir.join("agent.sock"), settings);
    config.rsa_threads = 1;
    config.ec_threads = 1;
    let _agent = Agent::start(config).unwrap();
    let mut client = ManagedConfig::default();
    client.isolation = Isolation::Agent(agent_dir.join("agent.sock"));
    let client = ManagedEngine::start(client).unwrap();
    let load = |uri: &str| load(&client, uri).map(|_| ()).unwrap_err();
    let discreet = |e: &keyfence::sign::managed::LoadError, token: &str| {
        let msg = e.to_string();
        for secret in [counting.to_str().unwrap(), "libsofthsm2", dir.to_str().unwrap(), &pin(dir)] {
            assert!(!msg.contains(secret), "the refusal names {secret}: {msg}");
        }
        let words: Vec<&str> = msg.split(|c: char| !c.is_ascii_alphanumeric() && c != '-').collect();
        for other in ["edge"].iter().chain(pkcs11_support::SPARE_TOKENS.iter()).filter(|l| **l != token) {
            assert!(!words.contains(other), "the refusal names the token {other}: {msg}");
        }
    };

    // The control: the agent's module and PIN file work for `edge`.
    let key = client_key(&client, "pkcs11:token=edge;object=tls-p256");
    client.perform(Request::sign(key, Algorithm::EcdsaP256Sha256, b"m".to_vec())).unwrap();

    // The review's case: a token whose PIN is not the agent's file's.
    for _ in 0..20 {
        let e = load("pkcs11:token=counted-agent;object=payments");
        assert_eq!(e.code(), ErrorCode::TokenLogin, "{e}");
        assert!(e.to_string().contains("pkcs11:token=counted-agent") && e.to_string().contains("this signer's PIN file"), "{e}");
        discreet(&e, "counted-agent");
    }
    assert_eq!(logins(dir, "counted-agent"), [CKR_PIN_INCORRECT], "the agent sent a refused PIN again");

    // No such token; a URI that matches every token; another module; another PIN file.
    let e = load("pkcs11:token=no-such-token;object=payments");
    assert_eq!(e.code(), ErrorCode::InvalidPrivateKey, "{e}");
    assert!(e.to_string().contains("no token that matches the URI"), "{e}");
    discreet(&e, "no-such-token");
    let e = load("pkcs11:object=payments");
    assert_eq!(e.code(), ErrorCode::InvalidPrivateKey, "{e}");
    assert!(e.to_string().contains("tokens match the URI"), "{e}");
    discreet(&e, "");
    let e = load("pkcs11:token=edge;object=tls-p256?module-path=/usr/lib/other-pkcs11.so");
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("loads only the PKCS#11 module it was started with"), "{e}");
    discreet(&e, "edge");
    let e = load("pkcs11:token=edge;object=tls-p256?pin-source=file:/etc/other-pin");
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    discreet(&e, "edge");
}

fn client_key(engine: &ManagedEngine, uri: &str) -> Arc<PrivateKey> {
    load(engine, uri).unwrap_or_else(|e| panic!("{uri}: {e}"))
}

#[test]
fn the_tokens_folder_deleted_mid_run_fails_in_bounded_time() {
    let Some(dir) = token() else { return };
    let base = spare_token(dir, "doomed");
    let folder = std::path::PathBuf::from(std::fs::read_to_string(dir.join("doomed.folder")).unwrap());
    let uri = format!("{base}&pin-source=file:{}", dir.join("doomed.pin").display());
    pkcs11::generate(&uri, KeyKind::EcP256, &Pkcs11Settings::default()).unwrap();
    let engine = engine();
    let key = load(&engine, &uri).unwrap();
    let sign = || engine.perform(Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, b"m".to_vec()));
    sign().unwrap();
    std::fs::remove_dir_all(&folder).unwrap();
    let started = Instant::now();
    let mut errors = Vec::new();
    for _ in 0..20 {
        if let Err(e) = sign() {
            errors.push(e);
        }
    }
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    eprintln!("after the folder went: {} of 20 failed; first: {:?}", errors.len(), errors.first().map(ToString::to_string));
    // The session copy of the key keyfence signs with is in the module's
    // memory, so signatures may go on (as with pkcs11-provider's cached
    // keys); what fails, fails as the token's own error.
    for e in &errors {
        assert_eq!(e.code(), ErrorCode::TokenUnavailable, "{e}");
    }
    // Loading it again finds no such token.
    let e = load(&engine, &uri).map(|_| ()).unwrap_err();
    assert!(matches!(e.code(), ErrorCode::InvalidPrivateKey | ErrorCode::TokenUnavailable), "{e}");
    // The other token is untouched.
    let other = load(&engine, &uri_for(dir, "tls-p256")).unwrap();
    engine.perform(Request::sign(other, Algorithm::EcdsaP256Sha256, b"m".to_vec())).unwrap();
}

fn uri_for(dir: &Path, label: &str) -> String {
    uri(dir, label)
}

/// The token forgets this process's login (another session logs out,
/// as a token reset or a removal and reinsertion would): the next
/// signature meets `CKR_USER_NOT_LOGGED_IN`, keyfence drops its sessions,
/// logs in again, finds the key again and retries once; the caller sees a
/// signature, never the error.
#[test]
fn a_token_that_forgets_the_login_is_logged_into_again_and_retried_once() {
    let Some(dir) = token() else { return };
    let uri = format!("{}&pin-source=file:{}", spare_token(dir, "relogin"), dir.join("relogin.pin").display());
    pkcs11::generate(&uri, KeyKind::EcP256, &Pkcs11Settings::default()).unwrap();
    let key = pkcs11::load(&uri, &Pkcs11Settings::default()).unwrap();
    key.sign(Algorithm::EcdsaP256Sha256, b"before").unwrap();
    let (ctx, slot) = token_slot(dir, "relogin");
    let session = ctx.open_ro_session(slot).unwrap();
    session.logout().unwrap();
    // The control: a private key object cannot be used now without logging in.
    let handles = session.find_objects(&[cryptoki::object::Attribute::Class(cryptoki::object::ObjectClass::PRIVATE_KEY)]).unwrap();
    assert!(handles.is_empty(), "logged out, the token hides its private keys");
    drop(session);
    let public = key.public_key_der().unwrap();
    let sig = key.sign(Algorithm::EcdsaP256Sha256, b"after").unwrap();
    assert!(verify(&public, Algorithm::EcdsaP256Sha256, b"after", &sig));
    std::mem::forget(ctx);
}

#[test]
fn ten_thousand_signatures_with_64_in_flight() {
    let Some(dir) = token() else { return };
    let engine = engine();
    let key = load(&engine, &uri(dir, "tls-p256")).unwrap();
    let public = key.public_key_der().unwrap();
    let mut in_flight = std::collections::VecDeque::new();
    let mut done = 0;
    for i in 0..10_000u32 {
        if in_flight.len() == 64 {
            let (msg, fut): (Vec<u8>, keyfence::sign::SignFuture) = in_flight.pop_front().unwrap();
            let sig = fut.wait().unwrap();
            if done % 500 == 0 {
                assert!(verify(&public, Algorithm::EcdsaP256Sha256, &msg, &sig));
            }
            done += 1;
        }
        let msg = i.to_be_bytes().to_vec();
        let fut = engine
            .submit(Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, msg.clone()).with_timeout(Duration::from_secs(30)))
            .unwrap();
        in_flight.push_back((msg, fut));
    }
    for (_, fut) in in_flight {
        fut.wait().unwrap();
        done += 1;
    }
    assert_eq!(done, 10_000);
    let m = engine.metrics().unwrap();
    assert_eq!(m.class(OpClass::Token).completed, 10_000);
    assert_eq!(m.class(OpClass::Token).errors.total(), 0);
}

#[test]
fn a_sign_error_from_the_token_keeps_its_code() {
    // The code table: a token failure is never a generic backend error.
    let e = SignError::Token { token: "pkcs11:token=t".into(), failure: keyfence::sign::TokenFailure::Unavailable, reason: "r".into() };
    assert_eq!(e.code(), ErrorCode::TokenUnavailable);
    assert_eq!(e.to_string(), "pkcs11:token=t: r");
}

/// Issue 55.4: which token keys an agent's user may load is the agent's
/// configuration (`--allow-token`), not the client's URI. A user granted
/// `token=edge;object=tls-p256` loads it, and neither another object on
/// the same token nor the same object named without its token; a group's
/// grant serves its members; root loads any.
#[test]
fn an_agent_grants_token_keys_per_user_or_group() {
    use keyfence::sign::agent::{Agent, AgentConfig, Grantee, TokenGrant};
    if skip_unless(is_root(), "running a client as another user needs root", REQUIRE_ROOT) {
        return;
    }
    let Some(dir) = token() else { return };
    let agent_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(agent_dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let socket = agent_dir.path().join("agent.sock");
    let mut settings = Pkcs11Settings::default();
    settings.module = Some(module(dir).into());
    settings.pin_file = Some(dir.join("pin"));
    let probe = |uri: &str| {
        probe_as_nobody("token-grant-probe", &[("KEYFENCE_PROBE_SOCKET", socket.as_os_str()), ("KEYFENCE_PROBE_URI", uri.as_ref())])
    };
    let tls = "pkcs11:token=edge;object=tls-p256";
    for who in [Grantee::User(65534), Grantee::Group(65534)] {
        let mut config = AgentConfig::tokens_only(&socket, settings.clone());
        config.socket_mode = 0o666;
        config.allow_users = vec![65534];
        config.token_grants = vec![TokenGrant::new(who, tls).unwrap()];
        let agent = Agent::start(config).unwrap();
        assert_eq!(probe(tls), "LOADED", "{who:?}");
        assert_eq!(probe("pkcs11:token=edge;object=tls-p256;type=private"), "LOADED", "a narrower URI");
        for refused in ["pkcs11:token=edge;object=tls-rsa", "pkcs11:object=tls-p256"] {
            let said = probe(refused);
            assert!(said.starts_with("REFUSED") && said.contains("may not load this token key"), "{refused}: {said}");
            assert!(!said.contains("tls-p256") || refused.contains("tls-p256"), "the refusal names another key: {said}");
        }
        // Root, as the agent's own user would, loads what no grant names.
        let mut config = ManagedConfig::default();
        config.isolation = keyfence::sign::managed::Isolation::Agent(socket.clone());
        assert!(load(&ManagedEngine::start(config).unwrap(), "pkcs11:token=edge;object=tls-rsa").is_ok());
        drop(agent);
    }
}
