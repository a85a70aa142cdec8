//! What the key process's and the agent's tests share: the key-process
//! program, scratch folders, fresh keys, signature checks, and an agent's
//! world (a store, a machine key and envelopes).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use keyfence::sign::{Algorithm, KeyKind, PrivateKey, SignError};
use openssl::pkey::PKey;

pub const KEY_PROCESS: &str = env!("CARGO_BIN_EXE_keyfence-key-process");

// What every test file shares, under the names these files use.
#[allow(unused_imports)]
pub use crate::common::{key_process_config as config, program, verify_key as verifies, Dir};

/// Writes a fresh key of `kind` as PKCS#8 PEM into `dir` and returns the
/// path.
pub fn key_file(dir: &Path, name: &str, kind: KeyKind) -> PathBuf {
    let pkey = match kind {
        KeyKind::Rsa { bits } => PKey::from_rsa(openssl::rsa::Rsa::generate(bits).unwrap()).unwrap(),
        KeyKind::EcP256 | KeyKind::EcP384 => {
            let nid = if kind == KeyKind::EcP256 { openssl::nid::Nid::X9_62_PRIME256V1 } else { openssl::nid::Nid::SECP384R1 };
            let g = openssl::ec::EcGroup::from_curve_name(nid).unwrap();
            PKey::from_ec_key(openssl::ec::EcKey::generate(&g).unwrap()).unwrap()
        }
        _ => PKey::generate_ed25519().unwrap(),
    };
    let path = dir.join(name);
    std::fs::write(&path, pkey.private_key_to_pem_pkcs8().unwrap()).unwrap();
    path
}

/// An agent's world: a store and a machine key (region=EU) in `dir`, and
/// envelopes of a P-256 key and an RSA key under `region: EU` and of a
/// P-256 key under `region: US`, which the agent's machine may not open.
pub struct AgentWorld {
    /// The authority's store.
    pub store: PathBuf,
    /// The servers' copy of it the agent reads.
    pub served: PathBuf,
    pub machine_key: PathBuf,
    pub eu_ec: (PathBuf, Vec<u8>),
    pub eu_rsa: (PathBuf, Vec<u8>),
    pub us_ec: Vec<u8>,
}

pub fn agent_world(dir: &Path) -> AgentWorld {
    use keyfence::wrap::{Authority, FileStore};
    let store = dir.join("store");
    let mut a = Authority::init(Arc::new(FileStore::open(&store).unwrap())).unwrap();
    let machine_key = dir.join("eu.machine");
    std::fs::write(&machine_key, a.issue(&"region=EU".parse().unwrap()).unwrap().to_bytes()).unwrap();
    let mut wrapped = |name: &str, kind: KeyKind, policy: &str| {
        let pem = std::fs::read(key_file(dir, &format!("{name}.pem"), kind)).unwrap();
        let env = a.wrap(policy, &pem).unwrap().to_bytes().to_vec();
        let path = dir.join(format!("{name}.env"));
        std::fs::write(&path, &env).unwrap();
        (path, env)
    };
    let eu_ec = wrapped("eu-ec", KeyKind::EcP256, "region: EU");
    let eu_rsa = wrapped("eu-rsa", KeyKind::Rsa { bits: 2048 }, "region: EU");
    let us_ec = wrapped("us-ec", KeyKind::EcP256, "region: US").1;
    // The agent reads a servers' copy, as deployed: never the authority's
    // store, whose secrets it refuses to be able to read.
    let served = dir.join("served");
    keyfence::wrap::export_for_servers(
        &*keyfence::wrap::open_store(store.to_str().unwrap()).unwrap(),
        &*keyfence::wrap::create_store(served.to_str().unwrap()).unwrap(),
    )
    .unwrap();
    AgentWorld { store, served, machine_key, eu_ec, eu_rsa, us_ec }
}

/// One more envelope in `world`, of a fresh key of `kind` under `policy`,
/// in the servers' copy too: its file and bytes.
#[allow(dead_code)]
pub fn wrap_more(dir: &Path, world: &AgentWorld, name: &str, kind: KeyKind, policy: &str) -> (PathBuf, Vec<u8>) {
    use keyfence::wrap::{Authority, FileStore};
    let mut a = Authority::open(Arc::new(FileStore::open(&world.store).unwrap())).unwrap();
    let pem = std::fs::read(key_file(dir, &format!("{name}.pem"), kind)).unwrap();
    let env = a.wrap(policy, &pem).unwrap().to_bytes().to_vec();
    let path = dir.join(format!("{name}.env"));
    std::fs::write(&path, &env).unwrap();
    keyfence::wrap::export_for_servers(
        &*keyfence::wrap::open_store(world.store.to_str().unwrap()).unwrap(),
        &*keyfence::wrap::open_store(world.served.to_str().unwrap()).unwrap(),
    )
    .unwrap();
    (path, env)
}

pub fn agent_config(dir: &Path, world: &AgentWorld) -> keyfence::sign::agent::AgentConfig {
    let mut c = keyfence::sign::agent::AgentConfig::new(dir.join("agent.sock"), world.served.to_str().unwrap(), &world.machine_key);
    c.rsa_threads = 1;
    c.ec_threads = 1;
    c
}

/// An engine whose keys are in the agent on `socket`.
pub fn agent_engine(socket: &Path) -> Result<keyfence::sign::managed::ManagedEngine, SignError> {
    use keyfence::sign::managed::{Isolation, ManagedConfig, ManagedEngine};
    let mut config = ManagedConfig::default();
    config.isolation = Isolation::Agent(socket.to_path_buf());
    ManagedEngine::start(config)
}

pub fn managed_sign(engine: &keyfence::sign::managed::ManagedEngine, key: &Arc<PrivateKey>, alg: Algorithm) -> Result<Vec<u8>, SignError> {
    let req = keyfence::sign::managed::ManagedEngine::request(key.clone(), alg.name(), b"through the agent".to_vec(), None)?;
    Ok(engine.submit(req)?.wait()?.to_vec())
}

/// A socket pair to start a key process on, as its client makes one: the
/// key process's end has `SO_PASSCRED` on, so that every byte it reads
/// carries its sender (it serves the process that started it, not a
/// child that inherited its end).
#[allow(dead_code)]
pub fn key_process_pair() -> (std::os::unix::net::UnixStream, std::os::unix::net::UnixStream) {
    use std::os::fd::AsRawFd;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let on: libc::c_int = 1;
    // SAFETY: `on` is a live c_int and the length is its size; the
    // descriptor is `theirs`, open for the call.
    let rc = unsafe {
        libc::setsockopt(
            theirs.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_PASSCRED");
    (ours, theirs)
}

/// Runs the attacker program as `nobody` with `env`, returning it with its
/// output's lines: read them up to `ATTACK: ready`, then the `done` line.
#[allow(dead_code)]
pub fn attacker(env: &[(&str, String)]) -> Attacker {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(program("agent-attacker"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.uid(65534).gid(65534).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Attacker { child, lines: std::sync::Mutex::new(rx) }
}

/// The attacker program running; killed when dropped.
pub struct Attacker {
    child: std::process::Child,
    lines: std::sync::Mutex<std::sync::mpsc::Receiver<String>>,
}

#[allow(dead_code)]
impl Attacker {
    /// The rest of its first line that starts with `prefix`, waiting up to
    /// `within`.
    pub fn said(&self, prefix: &str, within: std::time::Duration) -> String {
        let until = std::time::Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match self.lines.lock().unwrap().recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_string();
                    }
                }
                Err(_) => panic!("the attacker did not say `{prefix}` within {within:?}"),
            }
        }
    }

    /// The number after `key=` in its done line `done`.
    pub fn field(done: &str, key: &str) -> f64 {
        done.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key}= in `{done}`"))
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
