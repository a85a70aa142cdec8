//! What the remote tests share: a throwaway CA and certificates made with
//! the `openssl` command line (never checked-in private keys), a wrap
//! authority with envelopes, and key servers on 127.0.0.1 whose machines
//! hold different attributes.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use keyfence::sign::remote::protocol as p;
use keyfence::sign::remote::{KeyRing, KeyServer, PeerConfig, RemoteConfig, RemoteSigner, ServerConfig, TlsFiles};
use keyfence::sign::{Backend, ClassConfig, EngineConfig};
use keyfence::wrap::{Authority, CacheConfig, Envelope, Machine, MemoryStore, Store};

/// A fresh directory under the system's temporary directory.
pub fn temp_dir(what: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!("keyfence-{what}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Makes `NAME.key` and `NAME.pem` signed by the CA `ca` (files `ca.pem`,
/// `ca.key` in `dir`), with `NAME` as its DNS name.
pub fn issue_cert(dir: &Path, ca: &str, name: &str) {
    issue_cert_with(dir, ca, name, &format!("/CN={name}"), &format!("DNS:{name}"));
}

/// Makes `NAME.key` and `NAME.pem` signed by `ca` with the subject `subj`
/// (`/CN=...`, or `/O=...` for none) and the subject alternative names
/// `san` (`DNS:a,URI:spiffe://b`).
pub fn issue_cert_with(dir: &Path, ca: &str, name: &str, subj: &str, san: &str) {
    crate::common::issue_cert_ext(dir, ca, name, subj, &format!("subjectAltName={san}"));
}

/// Makes a self-signed CA `NAME.pem`/`NAME.key`.
pub fn make_ca(dir: &Path, name: &str) {
    crate::common::make_ca(dir, name, &format!("/CN={name}"));
}

/// The test PKI: CA `ca` with servers `sfo1`, `iad1`, `fra1`, `nrt1`, a
/// `client`, tenants' clients `tenant-a` and `tenant-b`, and `spiffe-a`
/// (CN `tenant-b`, but URI `spiffe://example.org/shop-a`) and `no-cn`
/// (no common name, DNS `dns-only`); a second CA `rogue` with a
/// `rogue-client`.
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn get() -> &'static Pki {
        static PKI: OnceLock<Pki> = OnceLock::new();
        PKI.get_or_init(|| {
            let dir = temp_dir("pki");
            make_ca(&dir, "ca");
            for n in ["sfo1", "iad1", "fra1", "nrt1", "client", "tenant-a", "tenant-b"] {
                issue_cert(&dir, "ca", n);
            }
            issue_cert_with(&dir, "ca", "spiffe-a", "/CN=tenant-b", "DNS:tenant-b,URI:spiffe://example.org/shop-a");
            issue_cert_with(&dir, "ca", "no-cn", "/O=keyfence tests", "DNS:dns-only");
            make_ca(&dir, "rogue");
            issue_cert(&dir, "rogue", "rogue-client");
            Pki { dir }
        })
    }

    /// `name`'s certificate and key, trusting `ca`.
    pub fn files(&self, name: &str, ca: &str) -> TlsFiles {
        TlsFiles {
            cert: self.dir.join(format!("{name}.pem")),
            key: self.dir.join(format!("{name}.key")),
            ca: self.dir.join(format!("{ca}.pem")),
        }
    }
}

/// An authority with US-only, EU-only and Japan-only ECDSA P-256 keys and
/// a US-only RSA-2048 key.
pub struct World {
    pub store: Arc<dyn Store>,
    pub authority: Authority,
    pub us_key: Envelope,
    pub eu_key: Envelope,
    pub us_rsa: Envelope,
    pub jp_key: Envelope,
}

pub fn ec_pem() -> Vec<u8> {
    let group = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap();
    openssl::ec::EcKey::generate(&group).unwrap().private_key_to_pem().unwrap()
}

pub fn rsa_pem() -> Vec<u8> {
    openssl::rsa::Rsa::generate(2048).unwrap().private_key_to_pem().unwrap()
}

impl World {
    pub fn new() -> World {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut authority = Authority::init(store.clone()).unwrap();
        let us_key = authority.wrap("country: US", &ec_pem()).unwrap();
        let eu_key = authority.wrap("region: EU", &ec_pem()).unwrap();
        let us_rsa = authority.wrap("country: US", &rsa_pem()).unwrap();
        let jp_key = authority.wrap("country: JP", &ec_pem()).unwrap();
        World { store, authority, us_key, eu_key, us_rsa, jp_key }
    }

    pub fn machine(&self, attrs: &str) -> Machine {
        Machine::new(self.authority.issue(&attrs.parse().unwrap()).unwrap(), self.store.clone(), CacheConfig::default())
    }

    /// The envelopes every machine has (replicated).
    pub fn envelopes(&self) -> Vec<&Envelope> {
        vec![&self.us_key, &self.eu_key, &self.us_rsa, &self.jp_key]
    }
}

/// The data centers of the tests: name and attributes.
pub const SITES: [(&str, &str); 4] = [
    ("sfo1", "country=US,region=NA"),
    ("iad1", "country=US,region=NA"),
    ("fra1", "country=DE,region=EU"),
    ("nrt1", "country=JP,region=APAC"),
];

pub fn attrs_of(name: &str) -> &'static str {
    SITES.iter().find(|(n, _)| *n == name).unwrap().1
}

/// Server options for tests.
#[derive(Clone, Default)]
pub struct ServerOptions {
    pub backend: Option<Arc<dyn Backend>>,
    pub tenant_in_flight: Option<u32>,
    pub slow_threads: Option<usize>,
    pub tenant_from: Option<keyfence::sign::remote::TenantSource>,
    pub allow: Option<keyfence::sign::remote::AllowList>,
    /// Per tenant and in all.
    pub queued_bytes: Option<(usize, usize)>,
}

/// A key server called `name` on 127.0.0.1, with the keys its machine may
/// open among the world's envelopes.
pub fn start_server(world: &World, name: &str, opts: ServerOptions) -> KeyServer {
    let machine = world.machine(attrs_of(name));
    let mut ring = KeyRing::new();
    for env in world.envelopes() {
        // Keys of other regions are refused by the machine: skipped.
        let _ = ring.open(&machine, env.to_bytes());
    }
    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), Pki::get().files(name, "ca"));
    config.name = name.into();
    config.backend = opts.backend;
    if let Some(t) = opts.tenant_in_flight {
        config.tenant_in_flight = t;
    }
    if let Some(t) = opts.tenant_from {
        config.tenant_from = t;
    }
    config.allow = opts.allow;
    if let Some((tenant, all)) = opts.queued_bytes {
        config.tenant_queued_bytes = tenant;
        config.queued_bytes = all;
    }
    let mut engine = EngineConfig::default();
    if let Some(n) = opts.slow_threads {
        engine.slow = ClassConfig { threads: n, queue_capacity: 4 * n };
    }
    config.engine = engine;
    KeyServer::start(config, ring).unwrap()
}

/// A client whose peers are `servers` (name, address).
pub fn client_config(servers: &[(&str, SocketAddr)]) -> RemoteConfig {
    let peers = servers.iter().map(|(n, a)| PeerConfig::new(*n, *a, attrs_of(n).parse().unwrap())).collect();
    let mut config = RemoteConfig::new(peers, Pki::get().files("client", "ca"));
    config.connect_timeout = Duration::from_millis(500);
    config.request_timeout = Duration::from_millis(1000);
    config
}

pub fn client(servers: &[(&str, SocketAddr)]) -> RemoteSigner {
    client_as("client", servers)
}

/// A client with the certificate `cert` (a tenant's).
pub fn client_as(cert: &str, servers: &[(&str, SocketAddr)]) -> RemoteSigner {
    let mut config = client_config(servers);
    config.tls = Pki::get().files(cert, "ca");
    let c = RemoteSigner::start(config).unwrap();
    c.measure();
    c
}

/// Reads one frame of the remote protocol from `stream`: `Err` when the
/// connection ends first. Byte by byte after the length, so that nothing
/// read belongs to the next frame.
pub fn read_frame(stream: &mut impl std::io::Read) -> Result<p::Frame, String> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).map_err(|e| e.to_string())?;
    let mut rest = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut rest).map_err(|e| e.to_string())?;
    let mut d = p::Decoder::new();
    d.push(&len);
    d.push(&rest);
    d.next_frame().map_err(|e| e.to_string())?.ok_or_else(|| "short frame".into())
}
