//! Isolation composes with tokens: an engine whose keys are in a key
//! process has that process load the PKCS#11 module and read the PIN.
//! This test process (the server, as it were) signs with the token key and
//! never maps the module, and a scan of its whole memory finds the key's
//! public point (the control: the scanner sees what is there) but not its
//! private scalar. A test binary of its own, so that no other test loads
//! the module in this process.

mod common;
mod pkcs11_support;

use std::io::{Read, Seek, SeekFrom};

use common::{key_process_engine, openssl};
use keyfence::sign::key_process::KeySource;
use keyfence::sign::{Algorithm, Request};
use pkcs11_support::{counting_module, logins, token, uri, CKR_PIN_INCORRECT};

/// The private scalar of the PEM key, XOR-masked as it is read from
/// `openssl pkey -text` (hex), so this process never holds it in clear.
fn masked_scalar(pem: &std::path::Path, mask: u8) -> Vec<u8> {
    let text = String::from_utf8(openssl(pem.parent().unwrap(), &["pkey", "-noout", "-text", "-in", pem.to_str().unwrap()])).unwrap();
    let hex: String = text.split("priv:").nth(1).unwrap().split("pub:").next().unwrap().chars().filter(char::is_ascii_hexdigit).collect();
    let mut out: Vec<u8> =
        hex.as_bytes().chunks(2).map(|c| u8::from_str_radix(std::str::from_utf8(c).unwrap(), 16).unwrap() ^ mask).collect();
    // `openssl` prints a leading zero byte when the top bit is set.
    while out.len() > 32 && out[0] == mask {
        out.remove(0);
    }
    out
}

/// Whether any readable mapping of this process holds `needle ^ mask`.
fn in_my_memory(masked: &[u8], mask: u8) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mut mem = std::fs::File::open("/proc/self/mem").unwrap();
    let first = masked[0] ^ mask;
    let mut buf = vec![0u8; 1 << 20];
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (range, perms) = (f.next().unwrap(), f.next().unwrap());
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let (a, b) = range.split_once('-').unwrap();
        let (mut at, end) = (u64::from_str_radix(a, 16).unwrap(), u64::from_str_radix(b, 16).unwrap());
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            if mem.seek(SeekFrom::Start(at)).is_err() {
                break;
            }
            let Ok(got) = mem.read(&mut buf[..n]) else { break };
            if got == 0 {
                break;
            }
            let hay = &buf[..got];
            for i in 0..hay.len().saturating_sub(masked.len() - 1) {
                if hay[i] == first && hay[i..i + masked.len()].iter().zip(masked).all(|(h, m)| *h == m ^ mask) {
                    return true;
                }
            }
            // Overlap by the needle's length, so a match across two reads counts.
            at += (got.max(masked.len()) - (masked.len() - 1)) as u64;
        }
    }
    false
}

fn maps_module(pid: u32) -> Option<bool> {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).ok().map(|m| m.contains("libsofthsm2"))
}

#[test]
fn only_the_key_process_loads_the_module_and_no_scalar_is_here() {
    let Some(dir) = token() else { return };
    let engine = key_process_engine();
    let key = engine.load(KeySource::Pkcs11(uri(dir, "tls-p256"))).unwrap();
    assert!(!key.is_local());
    let public = key.public_key_der().unwrap();
    for i in 0..100u32 {
        engine.perform(Request::sign(key.clone(), Algorithm::EcdsaP256Sha256, i.to_be_bytes().to_vec())).unwrap();
    }
    // The module is the key process's alone.
    assert_eq!(maps_module(std::process::id()), Some(false), "this process mapped the PKCS#11 module");
    let kp = engine.key_process_pid().unwrap();
    if let Some(mapped) = maps_module(kp) {
        assert!(mapped, "the key process signs with the token, so it maps the module");
    }
    // The scan: the public point is found (the scanner works), the private
    // scalar is not.
    let mask = 0x5a;
    let point: Vec<u8> = public[public.len() - 64..].iter().map(|b| b ^ mask).collect();
    assert!(in_my_memory(&point, mask), "the scanner does not see this process's memory");
    // BoringSSL keeps a scalar as little-endian words: both byte orders.
    let scalar = masked_scalar(&dir.join("keys/tls-p256.pem"), mask);
    assert_eq!(scalar.len(), 32);
    let reversed: Vec<u8> = scalar.iter().rev().copied().collect();
    assert!(!in_my_memory(&scalar, mask), "the token key's private scalar is in this process's memory");
    assert!(!in_my_memory(&reversed, mask), "the token key's private scalar (little-endian) is in this process's memory");
    // The control for the scalar: the same key loaded into this process
    // from its PEM is found, so the scan would see a scalar keyfence read
    // out of the token.
    let pem = zeroize::Zeroizing::new(std::fs::read(dir.join("keys/tls-p256.pem")).unwrap());
    let here = keyfence::sign::PrivateKey::from_pem(&pem).unwrap();
    drop(pem);
    assert!(in_my_memory(&scalar, mask) || in_my_memory(&reversed, mask), "the scan misses a scalar this process holds");
    drop(here);
}

/// A token that refuses the PIN inside the key process: SoftHSM2 logs the
/// refusal through `syslog()`, whose socket the sandbox refuses rather
/// than kills, so the caller hears `TOKEN_LOGIN` and the key process (the
/// same pid) goes on signing with the keys it holds. Every load error has
/// the code it has in process.
#[test]
fn a_refused_pin_in_the_key_process_is_token_login_and_the_process_lives() {
    let Some(dir) = token() else { return };
    let engine = key_process_engine();
    let key = engine.load(KeySource::Pkcs11(uri(dir, "tls-p256"))).unwrap();
    let pid = engine.key_process_pid().unwrap();
    let module = pkcs11_support::module(dir);
    let load = |u: String| engine.load(KeySource::Pkcs11(u)).map(|_| ()).unwrap_err();
    let e = load(format!("pkcs11:token=logins;object=k?module-path={module}&pin-source=file:{}", dir.join("logins.badpin").display()));
    assert_eq!(e.code(), keyfence::ErrorCode::TokenLogin, "{e}");
    assert_eq!(engine.key_process_pid(), Some(pid), "the key process died at the refused PIN");
    let e = load(format!("pkcs11:token=edge;object=nothing?module-path={module}&pin-source=file:{}", dir.join("pin").display()));
    assert_eq!(e.code(), keyfence::ErrorCode::InvalidPrivateKey, "{e}");
    assert!(e.to_string().starts_with("pkcs11:token=edge: no private key with object=nothing"), "{e}");
    let e = load(format!("pkcs11:token=edge;object=tls-p256?module-path={module}&pin-value=1"));
    assert_eq!(e.code(), keyfence::ErrorCode::InvalidArgument, "{e}");
    let e = load("pkcs11:token=edge;object=tls-p256?module-path=/nonexistent/lib.so".into());
    assert_eq!(e.code(), keyfence::ErrorCode::InvalidConfig, "{e}");
    engine.perform(Request::sign(key, Algorithm::EcdsaP256Sha256, b"still here".to_vec())).unwrap();
    assert_eq!(engine.key_process_pid(), Some(pid));
}

/// A key process remembers a refused PIN as a process does (issue 55): the
/// memory is the key process's own, so loads through it, from several
/// threads at once and twenty after, send the wrong PIN to the token once;
/// the fixed PIN file's PIN logs in. (A key process started again after a
/// crash starts with an empty memory, and may send a refused PIN once
/// more: a restart is rare, and not worth keeping the memory on disk.)
#[test]
fn a_refused_pin_reaches_the_token_once_per_key_process() {
    let Some(dir) = token() else { return };
    let engine = key_process_engine();
    let pid = engine.key_process_pid().unwrap();
    let pin_file = dir.join("counted.try");
    std::fs::write(&pin_file, "0000\n").unwrap();
    let uri = format!(
        "pkcs11:token=counted;object=payments?module-path={}&pin-source=file:{}",
        counting_module(dir).display(),
        pin_file.display()
    );
    let refused = |e: keyfence::sign::managed::LoadError| {
        assert_eq!(e.code(), keyfence::ErrorCode::TokenLogin, "{e}");
        assert!(e.to_string().contains("the token refused the PIN from") && e.to_string().contains("until the PIN changes"), "{e}");
    };
    std::thread::scope(|s| {
        let loads: Vec<_> = (0..4).map(|_| s.spawn(|| engine.load(KeySource::Pkcs11(uri.clone())).map(|_| ()).unwrap_err())).collect();
        loads.into_iter().for_each(|t| refused(t.join().unwrap()));
    });
    for _ in 0..20 {
        refused(engine.load(KeySource::Pkcs11(uri.clone())).map(|_| ()).unwrap_err());
    }
    assert_eq!(logins(dir, "counted"), [CKR_PIN_INCORRECT], "the key process sent a refused PIN again");
    assert_eq!(engine.key_process_pid(), Some(pid), "the key process was started again");
    std::fs::write(&pin_file, "4321\n").unwrap();
    let key = engine.load(KeySource::Pkcs11(uri.clone())).unwrap_or_else(|e| panic!("{e}"));
    engine.perform(Request::sign(key, Algorithm::EcdsaP256Sha256, b"paid".to_vec())).unwrap();
    assert_eq!(logins(dir, "counted"), [CKR_PIN_INCORRECT, 0]);
    assert_eq!(maps_module(std::process::id()), Some(false), "this process mapped the PKCS#11 module");
}
