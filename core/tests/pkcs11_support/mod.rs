//! The SoftHSM2 token the PKCS#11 tests share: vectors/softhsm-fixture.sh
//! run once per test process (SoftHSM reads its configuration once per
//! process), in the target's scratch folder.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::{openssl, skip_unless, REQUIRE_SERVERS};

/// The fixture's folder, or `None` when SoftHSM2 is not installed and the
/// calling test must skip: said loudly, and a failure instead when
/// `KEYFENCE_REQUIRE_SERVERS` is set.
pub fn token() -> Option<&'static Path> {
    let dir = fixture();
    if skip_unless(dir.is_some(), "no SoftHSM2 (./x installs softhsm2)", REQUIRE_SERVERS) {
        return None;
    }
    dir
}

/// The fixture, made by the first test that asks; `None` without SoftHSM2.
fn fixture() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("pkcs11-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors/softhsm-fixture.sh");
        let status = Command::new("bash").arg(script).arg(&dir).status().expect("bash runs");
        match status.code() {
            Some(0) => {}
            Some(77) => return None,
            _ => panic!("vectors/softhsm-fixture.sh failed: {status}"),
        }
        // Tokens for the tests that break a login or remove a token, made
        // now: SoftHSM lists the tokens it finds when it initializes.
        for label in SPARE_TOKENS {
            let before: Vec<_> = std::fs::read_dir(dir.join("tokens")).unwrap().map(|e| e.unwrap().path()).collect();
            let status = Command::new("softhsm2-util")
                .args(["--init-token", "--free", "--label", label, "--pin", "4321", "--so-pin", "8765"])
                .env("SOFTHSM2_CONF", dir.join("softhsm2.conf"))
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "softhsm2-util --init-token {label}");
            let folder = std::fs::read_dir(dir.join("tokens")).unwrap().map(|e| e.unwrap().path()).find(|p| !before.contains(p)).unwrap();
            std::fs::write(dir.join(format!("{label}.folder")), folder.as_os_str().as_encoded_bytes()).unwrap();
            std::fs::write(dir.join(format!("{label}.pin")), "4321\n").unwrap();
            std::fs::write(dir.join(format!("{label}.badpin")), "0000\n").unwrap();
        }
        // The counted tokens hold a key `payments` (imported as the
        // fixture imports its keys, so that no test needs to load the
        // module in its own process to make one).
        for label in COUNTED_TOKENS {
            let pem = dir.join("keys").join(format!("{label}-payments.pem"));
            openssl(&dir, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", pem.to_str().unwrap()]);
            let o = Command::new("softhsm2-util")
                .args(["--import"])
                .arg(&pem)
                .args(["--token", label, "--label", "payments", "--id", "10", "--pin", "4321"])
                .env("SOFTHSM2_CONF", dir.join("softhsm2.conf"))
                .output()
                .unwrap();
            assert!(o.status.success(), "softhsm2-util --import on {label}: {}", String::from_utf8_lossy(&o.stderr));
        }
        // SoftHSM finds its tokens through SOFTHSM2_CONF, read when the
        // module initializes: before any test loads it. The counting
        // module finds its log the same way (a key process inherits both).
        std::env::set_var("SOFTHSM2_CONF", dir.join("softhsm2.conf"));
        std::env::set_var(LOGIN_LOG, login_log(&dir));
        Some(dir)
    })
    .as_deref()
}

/// Tokens besides `edge`, with the user PIN 4321 (in DIR/LABEL.pin; a
/// wrong one in DIR/LABEL.badpin) and no keys; DIR/LABEL.folder names the
/// token's folder.
pub const SPARE_TOKENS: [&str; 7] = ["logins", "logins2", "nopin", "doomed", "relogin", "counted", "counted-agent"];

/// The spare tokens that hold a P-256 key `payments` (id 10), for the
/// tests that count logins through [`counting_module`].
pub const COUNTED_TOKENS: [&str; 2] = ["counted", "counted-agent"];

/// The variable naming the file the counting module logs each `C_Login`
/// to ([`login_log`]).
pub const LOGIN_LOG: &str = "KEYFENCE_TEST_LOGIN_LOG";

/// The counting module's log: in SoftHSM2's token folder, where a key
/// process's sandbox lets a token module write (SoftHSM2 lists only the
/// folder's subfolders as tokens, so a file there is no token).
fn login_log(dir: &Path) -> PathBuf {
    dir.join("tokens").join("logins.log")
}

/// `CKR_PIN_INCORRECT`, as the counting module logs it.
pub const CKR_PIN_INCORRECT: u64 = 0xa0;

/// A PKCS#11 module that forwards to SoftHSM2's and logs every `C_Login`
/// (counting_module.c), built once per test process with `cc` into DIR.
pub fn counting_module(dir: &Path) -> PathBuf {
    static MODULE: OnceLock<PathBuf> = OnceLock::new();
    MODULE
        .get_or_init(|| {
            let src = dir.join("counting_module.c");
            let lib = dir.join("counting_module.so");
            std::fs::write(&src, include_str!("counting_module.c")).unwrap();
            let o = Command::new("cc")
                .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
                .arg(&lib)
                .arg(format!("-DTARGET_MODULE=\"{}\"", module(dir)))
                .arg(&src)
                .args(["-ldl", "-lpthread"])
                .output()
                .expect("a C compiler (cc) builds the counting PKCS#11 module");
            assert!(o.status.success(), "cc counting_module.c: {}", String::from_utf8_lossy(&o.stderr));
            lib
        })
        .clone()
}

/// The codes of the `C_Login` calls made through the counting module on
/// token `label`, in order (0: logged in).
pub fn logins(dir: &Path, label: &str) -> Vec<u64> {
    let log = std::fs::read_to_string(login_log(dir)).unwrap_or_default();
    log.lines().filter_map(|l| l.rsplit_once(' ')).filter(|(token, _)| *token == label).map(|(_, rv)| rv.parse().unwrap()).collect()
}

/// The module the fixture found.
pub fn module(dir: &Path) -> String {
    let env = std::fs::read_to_string(dir.join("env")).unwrap();
    env.lines().find_map(|l| l.strip_prefix("KEYFENCE_PKCS11_MODULE=")).unwrap().to_string()
}

/// The URI of the fixture's key `label`, with the module and PIN file.
pub fn uri(dir: &Path, label: &str) -> String {
    format!("pkcs11:token=edge;object={label};type=private?module-path={}&pin-source=file:{}", module(dir), dir.join("pin").display())
}

/// The PIN the fixture set.
pub fn pin(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("pin")).unwrap().trim().to_string()
}
