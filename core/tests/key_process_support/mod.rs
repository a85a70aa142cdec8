//! What the key process's and the agent's tests share: the key-process
//! program, scratch folders, fresh keys, signature checks, and an agent's
//! world (a store, a machine key and envelopes).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Verifier;
use keyfence::sign::key_process::KeyProcessConfig;
use keyfence::sign::{Algorithm, KeyKind, PrivateKey, SignError};

pub const KEY_PROCESS: &str = env!("CARGO_BIN_EXE_keyfence-key-process");

pub fn config() -> KeyProcessConfig {
    let mut c = KeyProcessConfig::with_command([KEY_PROCESS]);
    c.rsa_threads = 1;
    c.ec_threads = 1;
    c
}

pub struct Dir(pub PathBuf);
impl Dir {
    pub fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("keyfence-isolated-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a fresh key of `kind` as PKCS#8 PEM into `dir` and returns the
/// path.
pub fn key_file(dir: &Path, name: &str, kind: KeyKind) -> PathBuf {
    let pkey = match kind {
        KeyKind::Rsa { bits } => PKey::from_rsa(openssl::rsa::Rsa::generate(bits).unwrap()).unwrap(),
        KeyKind::EcP256 => {
            let g = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap();
            PKey::from_ec_key(openssl::ec::EcKey::generate(&g).unwrap()).unwrap()
        }
        _ => PKey::generate_ed25519().unwrap(),
    };
    let path = dir.join(name);
    std::fs::write(&path, pkey.private_key_to_pem_pkcs8().unwrap()).unwrap();
    path
}

pub fn verifies(key: &PrivateKey, alg: Algorithm, msg: &[u8], sig: &[u8]) -> bool {
    let public = PKey::public_key_from_der(&key.public_key_der().unwrap()).unwrap();
    let mut v = match alg {
        Algorithm::Ed25519 => Verifier::new_without_digest(&public).unwrap(),
        _ => Verifier::new(MessageDigest::sha256(), &public).unwrap(),
    };
    if alg == Algorithm::RsaPssSha256 {
        v.set_rsa_padding(openssl::rsa::Padding::PKCS1_PSS).unwrap();
        v.set_rsa_pss_saltlen(openssl::sign::RsaPssSaltlen::DIGEST_LENGTH).unwrap();
    }
    v.verify_oneshot(sig, msg).unwrap_or(false)
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
    keyfence::wrap::export_for_servers(&*keyfence::wrap::open_store(store.to_str().unwrap()).unwrap(), &*keyfence::wrap::create_store(served.to_str().unwrap()).unwrap()).unwrap();
    AgentWorld { store, served, machine_key, eu_ec, eu_rsa, us_ec }
}

pub fn agent_config(dir: &Path, world: &AgentWorld) -> keyfence::sign::key_process::AgentConfig {
    let mut c = keyfence::sign::key_process::AgentConfig::new(
        dir.join("agent.sock"),
        world.served.to_str().unwrap(),
        &world.machine_key,
    );
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

pub fn managed_sign(
    engine: &keyfence::sign::managed::ManagedEngine,
    key: &Arc<PrivateKey>,
    alg: Algorithm,
) -> Result<Vec<u8>, SignError> {
    let req = keyfence::sign::managed::ManagedEngine::request(key.clone(), alg.name(), b"through the agent".to_vec(), None)?;
    Ok(engine.submit(req)?.wait()?.to_vec())
}

