//! The SoftHSM2 token the PKCS#11 tests share: vectors/softhsm-fixture.sh
//! run once per test process (SoftHSM reads its configuration once per
//! process), in the target's scratch folder.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The fixture's folder, or `None` (after saying so) when SoftHSM2 is not
/// installed and the tests may be skipped.
pub fn token() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("pkcs11-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors/softhsm-fixture.sh");
        let status = Command::new("bash").arg(script).arg(&dir).status().expect("bash runs");
        match status.code() {
            Some(0) => {}
            Some(77) => {
                eprintln!("*** SKIPPED: no SoftHSM2 (./x installs softhsm2) ***");
                return None;
            }
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
        // SoftHSM finds its tokens through SOFTHSM2_CONF, read when the
        // module initializes: before any test loads it.
        std::env::set_var("SOFTHSM2_CONF", dir.join("softhsm2.conf"));
        Some(dir)
    })
    .as_deref()
}

/// Tokens besides `edge`, with the user PIN 4321 (in DIR/LABEL.pin; a
/// wrong one in DIR/LABEL.badpin) and no keys; DIR/LABEL.folder names the
/// token's folder.
pub const SPARE_TOKENS: [&str; 5] = ["logins", "logins2", "nopin", "doomed", "relogin"];

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
