//! `keyfence serve` (a key server), the remote options of `keyfence sign`,
//! and `keyfence bench remote` (signatures per core through the server on
//! loopback against the in-process engine).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use keyfence::sign::key_process::KeySource;
use keyfence::sign::remote::{
    serve_metrics, AllowList, KeyId, KeyRing, KeyServer, PeerConfig, RemoteConfig, RemoteSigner, ServerConfig, TenantSource, TlsFiles,
};
use keyfence::sign::{Algorithm, ClassConfig, Engine, EngineConfig, PrivateKey, Request};
use keyfence::wrap::{Authority, CacheConfig, Envelope, FileStore, Machine, MachineInfo, PublicMachine, Store};

use crate::exit;
use crate::files::{outln, read};

/// `keyfence serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Where to listen (port 0 picks a free one; the address is printed
    /// as `listening ADDR` on standard output).
    #[arg(long, default_value = "127.0.0.1:7543")]
    listen: SocketAddr,
    /// This server's certificate chain (PEM); its DNS name is the name
    /// clients know it by.
    #[arg(long)]
    cert: PathBuf,
    /// The certificate's private key (PEM, owner-readable only).
    #[arg(long)]
    key: PathBuf,
    /// The CA certificates (PEM) a client's certificate must come from;
    /// clients without one get nothing.
    #[arg(long)]
    ca: PathBuf,
    /// The store (replicated sealed policy keys): a directory or
    /// etcd://HOST:PORT[,...]/PREFIX. With `--envelopes`.
    #[arg(long, required_unless_present = "pkcs11")]
    store: Option<PathBuf>,
    /// This machine's key (`keyfence authority issue --out`): its
    /// attributes decide which envelopes it may open. With `--envelopes`.
    #[arg(long, required_unless_present = "pkcs11")]
    machine_key: Option<PathBuf>,
    /// Envelope files, or directories of them (`*.env`; other files in
    /// them are listed as skipped); repeatable. Those this machine may not
    /// open are skipped and listed; with none left, it refuses to start
    /// (exit 2).
    #[arg(long = "envelopes", required_unless_present = "pkcs11", requires_all = ["store", "machine_key"])]
    envelopes: Vec<PathBuf>,
    /// A key in a PKCS#11 token, by RFC 7512 URI (docs/pkcs11.md), served
    /// under the SHA-256 of its public key (printed as `holding URI
    /// (ID)`); repeatable. The module and PIN come from the URI or
    /// KEYFENCE_PKCS11_MODULE and KEYFENCE_PKCS11_PIN_FILE; with
    /// `--isolated`, only the key process loads the module and reads the
    /// PIN. A key that does not load stops the server (exit 2).
    #[arg(long = "pkcs11", value_name = "URI")]
    pkcs11: Vec<String>,
    /// Serve Prometheus metrics over HTTP on this address.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// This server's name in logs and spans.
    #[arg(long, default_value = "keyfence")]
    name: String,
    /// Requests one tenant (zone) may have in flight.
    #[arg(long, default_value_t = 256)]
    tenant_in_flight: u32,
    /// Requests one connection may have in flight.
    #[arg(long, default_value_t = 1024)]
    connection_in_flight: u32,
    /// Seconds a client gets for its whole TLS handshake and hello, from
    /// the moment it is accepted (a deadline, not a time per read).
    #[arg(long, default_value_t = 5.0)]
    handshake_timeout: f64,
    /// Certified connections (past the hello) served at once; a client
    /// beyond it is answered `overloaded` at the hello.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Connections still in their handshake (unauthenticated) at once;
    /// when full, a newcomer takes the place of the oldest handshake of
    /// the address holding the most.
    #[arg(long, default_value_t = 256)]
    max_handshakes: usize,
    /// Connections still in their handshake from one source address;
    /// more are closed at once.
    #[arg(long, default_value_t = 32)]
    max_handshakes_per_address: usize,
    /// Bytes of requests one tenant may have waiting or being signed;
    /// beyond it, `overloaded`.
    #[arg(long, default_value_t = 16 << 20)]
    tenant_queued_bytes: usize,
    /// Bytes of requests all tenants together may have waiting or being
    /// signed; beyond it, `overloaded`.
    #[arg(long, default_value_t = 64 << 20)]
    queued_bytes: usize,
    /// Which part of a client's certificate names its tenant: `cn` (the
    /// subject's common name), `dns` (its DNS subject alternative name) or
    /// `uri` (its URI one). Never the request frames. A certificate that
    /// gives the field twice, or with a NUL or a control character in it,
    /// names no tenant and is refused (docs/security.md).
    #[arg(long, default_value = "cn")]
    tenant_from: TenantSource,
    /// TENANT=KEY[,KEY...]: the keys TENANT may use. KEY is an id as
    /// `holding FILE (ID)` prints it, a full 64-digit id, or an envelope
    /// file. Repeatable. With --allow or --allow-file, a tenant not listed
    /// may use no key (`not_allowed`); with neither, every certified
    /// client may use every key held.
    #[arg(long = "allow", value_name = "TENANT=KEYS")]
    allow: Vec<String>,
    /// A file of `TENANT = KEY, KEY...` lines (as --allow; `#` starts a
    /// comment).
    #[arg(long)]
    allow_file: Option<PathBuf>,
    /// RSA and EC signing threads each (default: the cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Keep the keys in a key process: this process never holds
    /// them.
    #[arg(long)]
    isolated: bool,
    /// With --isolated: start the key process even when the kernel cannot
    /// give it its whole sandbox (no Landlock, no seccomp), which it is
    /// otherwise refused for; a warning names what is missing.
    #[arg(long, requires = "isolated")]
    unsafe_partial_sandbox: bool,
    /// Stop after this many seconds (default: until killed).
    #[arg(long)]
    seconds: Option<f64>,
    /// Print the server's spans and events at this level and above on
    /// standard error (error, warn, info, debug, trace).
    #[arg(long)]
    log: Option<String>,
}

/// The envelope files named by `--envelopes`: files as given, and the
/// `*.env` files of directories. A directory's other files are named on
/// standard error (an envelope saved as `key.envelope` is not silently
/// ignored), and finding no envelope at all is bad input: a key server
/// with no key would say "ready" and refuse every request.
fn envelope_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| exit::input(format!("cannot read {}: {e}", p.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            files.sort();
            for f in files {
                if f.extension().is_some_and(|e| e == "env") {
                    out.push(f);
                } else {
                    eprintln!("keyfence serve: skipping {}: not a *.env file", f.display());
                    skipped.push(f);
                }
            }
        } else {
            out.push(p.clone());
        }
    }
    if out.is_empty() && !paths.is_empty() {
        let names: Vec<String> = skipped.iter().map(|f| f.display().to_string()).collect();
        let dirs: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(exit::input(format!(
            "no envelope to serve: {} holds no *.env file{}",
            dirs.join(", "),
            if names.is_empty() { String::new() } else { format!(" (skipped: {})", names.join(", ")) }
        )));
    }
    Ok(out)
}

/// A key named on the command line or in an allow file: an id as `serve`
/// prints it (the first 8 bytes, among the envelopes given), a full id, or
/// an envelope file.
fn key_ref(s: &str, envelopes: &[PathBuf]) -> Result<KeyId> {
    let hex = |s: &str| -> Option<Vec<u8>> {
        (s.len().is_multiple_of(2) && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16)).collect::<Result<_, _>>().ok())
            .flatten()
    };
    if s.len() == 64 {
        if let Some(b) = hex(s) {
            return Ok(KeyId(b.try_into().map_err(|_| exit::input("a key id is 32 bytes"))?));
        }
    }
    if s.len() == 16 && hex(s).is_some() {
        let wanted = s.to_ascii_lowercase();
        let mut found = Vec::new();
        for f in envelopes {
            let id = KeyId::of_envelope(&read(f)?);
            if id.to_string() == wanted && !found.contains(&id) {
                found.push(id);
            }
        }
        return match found[..] {
            [id] => Ok(id),
            [] => Err(exit::input(format!("no envelope given to --envelopes has the key id {s}"))),
            _ => Err(exit::input(format!("the key id {s} names more than one envelope: give the full id"))),
        };
    }
    let path = Path::new(s);
    if path.is_file() {
        return Ok(KeyId::of_envelope(&read(path)?));
    }
    Err(exit::input(format!("`{s}` is neither a key id (16 or 64 hex digits) nor an envelope file")))
}

/// One `TENANT=KEY,KEY` (or `TENANT = KEY, KEY`) into `allow`.
fn allow_entry(allow: &mut AllowList, entry: &str, envelopes: &[PathBuf], at: &str) -> Result<()> {
    let Some((tenant, keys)) = entry.split_once('=') else {
        return Err(exit::input(format!("{at}`{entry}`: expected TENANT=KEY[,KEY...]")));
    };
    let tenant = tenant.trim();
    if tenant.is_empty() {
        return Err(exit::input(format!("{at}`{entry}`: the tenant is empty")));
    }
    for key in keys.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        allow.allow(tenant, key_ref(key, envelopes)?);
    }
    Ok(())
}

/// The allow-list from `--allow` and `--allow-file`, or `None` with
/// neither (every certified client may use every key).
fn allow_list(entries: &[String], file: Option<&Path>, envelopes: &[PathBuf]) -> Result<Option<AllowList>> {
    if entries.is_empty() && file.is_none() {
        return Ok(None);
    }
    let mut allow = AllowList::new();
    for e in entries {
        allow_entry(&mut allow, e, envelopes, "--allow ")?;
    }
    if let Some(f) = file {
        let text = String::from_utf8(read(f)?).map_err(|_| exit::input(format!("{} is not UTF-8", f.display())))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if !line.is_empty() {
                allow_entry(&mut allow, line, envelopes, &format!("{}:{}: ", f.display(), n + 1))?;
            }
        }
    }
    Ok(Some(allow))
}

/// Installs a subscriber printing spans and events at `level` and above.
fn init_log(level: &str) -> Result<()> {
    let level: tracing::Level = level.parse().map_err(|_| exit::input(format!("unknown log level {level}")))?;
    crate::journal::init(level);
    Ok(())
}

/// What `serve` opens envelopes with: the machine, or (isolated) only its
/// public view, the key process opening them. One is made per command,
/// on the stack: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Opener {
    Machine(Machine),
    Isolated(PublicMachine),
}

/// A key id in full (64 hex digits), as `--allow` and clients take it.
fn hex_id(id: &KeyId) -> String {
    id.0.iter().map(|b| format!("{b:02x}")).collect()
}

/// The public view of the machine key in `key` with the store in `dir`.
/// The file's bytes (secret) are wiped as soon as the view is read.
fn public_machine(dir: &Path, key: &Path) -> Result<PublicMachine> {
    let store = crate::wrap_cmd::store(dir)?;
    // `fs::read` sizes its buffer from the file's length: one allocation,
    // wiped on drop, no copy left behind by growth.
    let bytes = zeroize::Zeroizing::new(std::fs::read(key).map_err(|e| exit::input(format!("cannot read {}: {e}", key.display())))?);
    let info = MachineInfo::from_key_bytes(&bytes).context("machine key")?;
    Ok(PublicMachine::new(info, store))
}

/// Runs `keyfence serve`.
pub fn serve(args: ServeArgs) -> Result<ExitCode> {
    if let Some(level) = &args.log {
        init_log(level)?;
    }
    // Isolated, this process holds only the machine key's public view: the
    // key process alone decodes the secret one, for each load.
    let key_process =
        if args.isolated { Some(crate::key_process::key_process(args.threads.unwrap_or(1), args.unsafe_partial_sandbox)?) } else { None };
    let opener = match (&args.store, &args.machine_key, &key_process) {
        (Some(store), Some(machine_key), Some(_)) => Some(Opener::Isolated(public_machine(store, machine_key)?)),
        (Some(store), Some(machine_key), None) => Some(Opener::Machine(crate::wrap_cmd::open_machine(store, machine_key)?)),
        _ => None,
    };
    let mut ring = KeyRing::new();
    for file in envelope_files(&args.envelopes)? {
        let opened = match (&opener, &key_process) {
            (Some(Opener::Isolated(public)), Some(kp)) => {
                let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
                // The key process may run elsewhere than here: a directory
                // goes to it absolute, an `etcd://` name as it is.
                let store = args.store.clone().unwrap_or_default();
                let etcd = store.to_str().is_some_and(|s| s.starts_with("etcd://"));
                let store = if etcd { store } else { abs(&store) };
                ring.open_isolated(public, kp, &store, &abs(args.machine_key.as_deref().unwrap_or(Path::new(""))), &abs(&file))
            }
            (Some(Opener::Machine(machine)), _) => ring.open(machine, &read(&file)?),
            _ => return Err(exit::input("--envelopes needs --store and --machine-key")),
        };
        match opened {
            Ok(id) => eprintln!("keyfence serve: holding {} ({id})", file.display()),
            Err(e) => eprintln!("keyfence serve: skipping {}: {e}", file.display()),
        }
    }
    // Token keys: loaded where the keys are kept (the key process, when
    // isolated), filed under their public key's hash. One that does not
    // load is the operator's mistake to see now, not a key missing later.
    for uri in &args.pkcs11 {
        let key = match &key_process {
            Some(kp) => kp.load(KeySource::Pkcs11(uri.clone())),
            None => keyfence::sign::pkcs11::load(uri, &keyfence::sign::pkcs11::Pkcs11Settings::from_env()).map(Arc::new),
        }
        .map_err(|e| exit::input(format!("--pkcs11 {uri}: {e}")))?;
        let id = KeyId::of_public_key(&key.public_key_der()?);
        eprintln!("keyfence serve: holding {uri} ({id}, {})", hex_id(&id));
        ring.insert(id, key);
    }
    if ring.is_empty() {
        return Err(exit::input("no envelope to serve: this machine could open none of the envelopes given (listed above)"));
    }
    let mut config = ServerConfig::new(args.listen, TlsFiles { cert: args.cert, key: args.key, ca: args.ca });
    config.name = args.name;
    config.tenant_in_flight = args.tenant_in_flight;
    config.connection_in_flight = args.connection_in_flight;
    if !(args.handshake_timeout > 0.0 && args.handshake_timeout <= 3600.0) {
        return Err(exit::input("--handshake-timeout must be more than 0 and at most 3600 seconds"));
    }
    config.handshake_timeout = Duration::from_secs_f64(args.handshake_timeout);
    if args.max_connections == 0 || args.max_handshakes == 0 || args.max_handshakes_per_address == 0 {
        return Err(exit::input("--max-connections, --max-handshakes and --max-handshakes-per-address must be at least 1"));
    }
    config.max_connections = args.max_connections;
    config.max_handshakes = args.max_handshakes;
    config.max_handshakes_per_address = args.max_handshakes_per_address;
    config.tenant_queued_bytes = args.tenant_queued_bytes;
    config.queued_bytes = args.queued_bytes;
    config.tenant_from = args.tenant_from;
    config.allow = allow_list(&args.allow, args.allow_file.as_deref(), &envelope_files(&args.envelopes)?)?;
    if let Some(allow) = &config.allow {
        let mut tenants: Vec<&str> = allow.tenants().collect();
        tenants.sort_unstable();
        eprintln!("keyfence serve: tenants named by {}: {}", config.tenant_from, tenants.join(", "));
    }
    if let Some(t) = args.threads {
        config.engine.rsa = ClassConfig { threads: t, queue_capacity: 256 * t };
        config.engine.ec = ClassConfig { threads: t, queue_capacity: 4096 * t };
    }
    let server = Arc::new(KeyServer::start(config, ring)?);
    outln!("listening {}", server.local_addr());
    let _endpoint = match args.metrics {
        Some(addr) => {
            let s = server.clone();
            let e = serve_metrics(addr, move || s.metrics().prometheus())?;
            outln!("metrics http://{}/metrics", e.local_addr());
            Some(e)
        }
        None => None,
    };
    match args.seconds {
        Some(s) if s > 0.0 && s.is_finite() => std::thread::sleep(Duration::from_secs_f64(s)),
        Some(_) => return Err(exit::input("--seconds must be positive")),
        None => loop {
            std::thread::park();
        },
    }
    // The key process lives as long as the server.
    drop((opener, key_process));
    Ok(ExitCode::SUCCESS)
}

/// The remote options of `keyfence sign`.
#[derive(Args)]
pub struct RemoteOpts {
    /// Sign through remote key servers (`--peer`) with the key in
    /// `--envelope`, which this machine does not open (or, with `--store`
    /// and `--machine-key`, opens only if its attributes allow); or with
    /// the token key whose public key (or certificate) is in
    /// `--public-key`, which the servers hold (`keyfence serve --pkcs11`).
    #[arg(long, requires = "peers")]
    pub remote: bool,
    /// The key's envelope (`keyfence authority wrap --out`).
    #[arg(long, conflicts_with = "public_key")]
    pub envelope: Option<PathBuf>,
    /// With `--remote`: the public key (PEM) or certificate of a key the
    /// servers hold in a PKCS#11 token; its id is the SHA-256 of the
    /// public key, as `keyfence serve` prints it.
    #[arg(long, requires = "remote")]
    pub public_key: Option<PathBuf>,
    /// A key server: NAME,HOST:PORT,ATTRIBUTES, for example
    /// `sfo1,10.0.0.7:7543,country=US,region=NA`; its certificate must
    /// name it NAME. Repeatable: the nearest whose attributes satisfy the
    /// key's policy is asked first.
    #[arg(long = "peer")]
    peers: Vec<String>,
    /// This client's certificate (PEM).
    #[arg(long, requires = "remote")]
    tls_cert: Option<PathBuf>,
    /// This client's certificate key (PEM).
    #[arg(long, requires = "remote")]
    tls_key: Option<PathBuf>,
    /// The CA certificates (PEM) the servers' certificates must come from.
    #[arg(long, requires = "remote")]
    tls_ca: Option<PathBuf>,
    /// The tenant (zone) the key belongs to.
    #[arg(long, default_value_t = 0)]
    tenant: u64,
    /// With `--machine-key`: sign here when this machine may open the
    /// envelope, forward otherwise.
    #[arg(long, requires = "machine_key")]
    store: Option<PathBuf>,
    /// This machine's key.
    #[arg(long, requires = "store")]
    machine_key: Option<PathBuf>,
}

impl RemoteOpts {
    /// The files these options read, which an output must not replace.
    pub fn inputs(&self) -> impl Iterator<Item = &Path> {
        [&self.envelope, &self.public_key, &self.tls_cert, &self.tls_key, &self.tls_ca, &self.machine_key]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
    }
}

/// The public key (DER `SubjectPublicKeyInfo`) in `path`: a PEM public
/// key or certificate.
pub fn public_key_der(path: &Path) -> Result<Vec<u8>> {
    let pem = read(path)?;
    let key = match openssl::x509::X509::from_pem(&pem) {
        Ok(cert) => cert.public_key().and_then(|k| k.public_key_to_der()),
        Err(_) => openssl::pkey::PKey::public_key_from_pem(&pem).and_then(|k| k.public_key_to_der()),
    };
    key.map_err(|_| exit::input(format!("{} holds no PEM public key or certificate", path.display())))
}

/// Parses `NAME,HOST:PORT,ATTRIBUTES`.
pub fn parse_peer(s: &str) -> Result<PeerConfig> {
    let mut parts = s.splitn(3, ',');
    let (Some(name), Some(addr), Some(attrs)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(exit::input(format!("--peer {s}: expected NAME,HOST:PORT,ATTRIBUTES")));
    };
    let addr: SocketAddr = addr.parse().map_err(|e| exit::input(format!("--peer {s}: address {addr}: {e}")))?;
    let attrs = attrs.parse().map_err(|e| exit::input(format!("--peer {s}: attributes: {e}")))?;
    if name.is_empty() {
        return Err(exit::input(format!("--peer {s}: empty name")));
    }
    Ok(PeerConfig::new(name, addr, attrs))
}

/// The key for `keyfence sign --remote`: a handle on the peers' copy, or
/// this machine's own when it may open the envelope. (`--isolated`, which
/// would keep the machine key out of this process, is refused with
/// `--remote`.)
pub fn remote_key(opts: &RemoteOpts, timeout: Duration) -> Result<(Arc<PrivateKey>, RemoteSigner)> {
    if opts.envelope.is_none() && opts.public_key.is_none() {
        return Err(exit::input("--remote needs --envelope, or --public-key for a key the servers hold in a token"));
    }
    let peers = opts.peers.iter().map(|p| parse_peer(p)).collect::<Result<Vec<_>>>()?;
    let (Some(cert), Some(key), Some(ca)) = (&opts.tls_cert, &opts.tls_key, &opts.tls_ca) else {
        return Err(exit::input("--remote needs --tls-cert, --tls-key and --tls-ca"));
    };
    let mut config = RemoteConfig::new(peers, TlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() });
    config.tenant = opts.tenant;
    config.connect_timeout = timeout.min(config.connect_timeout);
    config.request_timeout = timeout.min(config.request_timeout);
    let remote = RemoteSigner::start(config)?;
    if let Some(public) = &opts.public_key {
        let id = KeyId::of_public_key(&public_key_der(public)?);
        let key = remote.token_key(id).with_context(|| format!("the key servers' key {id}"))?;
        return Ok((key, remote));
    }
    let envelope_path = opts.envelope.as_ref().context("--remote needs --envelope")?;
    let bytes = read(envelope_path)?;
    let key = match (&opts.store, &opts.machine_key) {
        (Some(store), Some(machine_key)) => {
            let machine = crate::wrap_cmd::open_machine(store, machine_key)?;
            remote.open_or_forward(&machine, &bytes).map_err(anyhow::Error::new)?
        }
        _ => {
            let env = Envelope::parse(&bytes).with_context(|| format!("reading {}", envelope_path.display()))?;
            remote.key(&env)?
        }
    };
    Ok((key, remote))
}

/// `keyfence bench remote`.
#[derive(Args)]
pub struct BenchRemoteArgs {
    /// One JSON object per line: alg, engine and server signatures per
    /// core-second, their ratio and target, latencies, gokeyless's
    /// published figure.
    #[arg(long)]
    json: bool,
    /// Seconds per throughput measurement.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Remote operations kept in flight by the client.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// The server's RSA and EC signing threads each (default: the cores).
    #[arg(long)]
    server_threads: Option<usize>,
    /// Connections from the client to the server (the library's default
    /// is 2; fewer connections batch more frames per TLS record and per
    /// wake-up).
    #[arg(long, default_value_t = 2)]
    connections: usize,
}

/// CPU time (user and system) of process `pid` (`self` for this one) so
/// far. Linux only (`/proc`); zero elsewhere.
pub(crate) fn cpu_of(pid: &str) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return Duration::ZERO };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return Duration::ZERO };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime, in USER_HZ ticks (100 per second).
    Duration::from_millis((num(11) + num(12)) * 10)
}

/// Keeps `in_flight` operations going on `engine` with `key` for `dur`;
/// operations completed and the time taken.
fn saturate(engine: &Engine, key: &Arc<PrivateKey>, alg: Algorithm, in_flight: usize, dur: Duration) -> Result<(u64, Duration)> {
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let outstanding = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let me = std::thread::current();
    while start.elapsed() < dur {
        while outstanding.load(Ordering::Acquire) < in_flight {
            outstanding.fetch_add(1, Ordering::AcqRel);
            let (done, errors, outstanding, me) = (done.clone(), errors.clone(), outstanding.clone(), me.clone());
            engine.submit_with_callback(Request::sign(key.clone(), alg, vec![0x20; 130]), move |r| {
                if r.is_ok() {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                outstanding.fetch_sub(1, Ordering::AcqRel);
                me.unpark();
            })?;
        }
        std::thread::park_timeout(Duration::from_millis(5));
    }
    while outstanding.load(Ordering::Acquire) > 0 && start.elapsed() < dur + Duration::from_secs(10) {
        std::thread::park_timeout(Duration::from_millis(5));
    }
    let elapsed = start.elapsed();
    let errors = errors.load(Ordering::Relaxed);
    if errors > 0 {
        bail!("{errors} operations failed during the benchmark");
    }
    Ok((done.load(Ordering::Relaxed), elapsed))
}

/// p50 and p99 of one operation at a time, in microseconds, on `local`
/// and `remote` in alternation, so machine noise hits both alike.
fn latencies(engine: &Engine, local: &Arc<PrivateKey>, remote: &Arc<PrivateKey>, alg: Algorithm, n: usize) -> Result<[(f64, f64); 2]> {
    let mut v = [Vec::with_capacity(n), Vec::with_capacity(n)];
    for _ in 0..n {
        for (i, key) in [local, remote].into_iter().enumerate() {
            let t = Instant::now();
            engine.sign(key, alg, &[0x20; 130])?.wait()?;
            v[i].push(t.elapsed());
        }
    }
    Ok(v.map(|mut v| {
        v.sort();
        let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1].as_secs_f64() * 1e6;
        (at(0.5), at(0.99))
    }))
}

/// The server process, killed when dropped.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `keyfence bench remote`.
pub fn bench(args: BenchRemoteArgs) -> Result<ExitCode> {
    if !(args.seconds > 0.0 && args.seconds <= 600.0) {
        return Err(exit::input("--seconds must be in (0, 600]"));
    }
    if !(1..=4096).contains(&args.in_flight) {
        return Err(exit::input("--in-flight must be 1 to 4096"));
    }
    // Random name, created new, mode 700, removed on drop.
    let scratch = crate::files::scratch_dir("bench-remote")?;
    bench_in(&args, scratch.path())
}

/// A key server in its own process on loopback (`keyfence serve`, port
/// from the OS), holding envelopes of the keys it was given, and a client
/// connected to it: what `bench remote` and `bench sign --path remote`
/// measure. Its own process, so that its CPU time (`/proc/PID/stat`) is its
/// own; killed by pid when dropped, after the client.
pub(crate) struct LoopbackServer {
    /// The client, connected to the server alone.
    pub remote: RemoteSigner,
    /// The server's machine (its key and store), to open the same
    /// envelopes in this process.
    pub machine: Machine,
    /// One envelope per key given, in order.
    pub envelopes: Vec<Envelope>,
    /// The server process's id, for its CPU time.
    pub pid: u32,
    /// Where it listens.
    pub addr: SocketAddr,
    // Last: dropped (killed) after the client has closed its connections.
    _server: ServerProcess,
}

/// Starts [`LoopbackServer`] in `scratch` (certificates, store, machine key
/// and envelopes are written there) holding `keys` (PEM or DER), with
/// `server_threads` RSA and EC signing threads each (default: the cores)
/// and `connections` client connections.
///
/// # Errors
/// A key the authority cannot wrap, the server not starting or not saying
/// where it listens, the client not starting.
pub(crate) fn loopback_server(
    scratch: &Path, keys: &[(&str, &[u8])], server_threads: Option<usize>, connections: usize,
) -> Result<LoopbackServer> {
    let files = crate::pki::make(scratch, &["server", "client"])?;
    // An authority, a US machine key for the server, and US-only keys.
    let store_dir = scratch.join("store");
    let store: Arc<dyn Store> = Arc::new(FileStore::open(&store_dir)?);
    let mut authority = Authority::init(store.clone())?;
    let machine_key = authority.issue(&"country=US".parse()?)?;
    crate::files::create_new(&scratch.join("server.machine"), &machine_key.to_bytes())?;
    let env_dir = scratch.join("envelopes");
    std::fs::create_dir_all(&env_dir)?;
    let mut envelopes = Vec::new();
    for (name, key) in keys {
        let env = authority.wrap("country: US", key)?;
        crate::files::create_new(&env_dir.join(format!("{name}.env")), env.to_bytes())?;
        envelopes.push(env);
    }

    let exe = std::env::current_exe().context("finding the keyfence binary to start the server")?;
    let mut child = Command::new(exe)
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--name", "server"])
        .arg("--cert")
        .arg(&files[0].cert)
        .arg("--key")
        .arg(&files[0].key)
        .arg("--ca")
        .arg(&files[0].ca)
        .arg("--store")
        .arg(&store_dir)
        .arg("--machine-key")
        .arg(scratch.join("server.machine"))
        .arg("--envelopes")
        .arg(&env_dir)
        .args(["--connection-in-flight", "4096", "--tenant-in-flight", "4096"])
        .args(server_threads.map(|t| vec!["--threads".to_string(), t.to_string()]).unwrap_or_default())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the key server")?;
    let stdout = child.stdout.take().context("the server's standard output")?;
    let server = ServerProcess(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let addr: SocketAddr =
        line.strip_prefix("listening ").and_then(|a| a.trim().parse().ok()).with_context(|| format!("the server said {line:?}"))?;
    let pid = server.0.id();

    let mut rc = RemoteConfig::new(vec![PeerConfig::new("server", addr, "country=US".parse()?)], files[1].clone());
    rc.connections_per_peer = connections.max(1);
    let remote = RemoteSigner::start(rc)?;
    let machine = Machine::new(machine_key, store, CacheConfig::default());
    Ok(LoopbackServer { remote, machine, envelopes, pid, addr, _server: server })
}

fn bench_in(args: &BenchRemoteArgs, scratch: &Path) -> Result<ExitCode> {
    let dur = Duration::from_secs_f64(args.seconds);
    // Name, algorithm, key, target ratio, gokeyless's published figure.
    type Case = (&'static str, Algorithm, zeroize::Zeroizing<Vec<u8>>, f64, f64);
    let cases: [Case; 2] = [
        ("ecdsa-p256-sha256", Algorithm::EcdsaP256Sha256, ec_pem()?, 0.5, 10_000.0),
        ("rsa2048-pss-sha256", Algorithm::RsaPssSha256, rsa_pem()?, 0.8, 200.0),
    ];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let keys: Vec<(&str, &[u8])> = cases.iter().map(|(name, _, pem, _, _)| (*name, &pem[..])).collect();
    let server = loopback_server(scratch, &keys, args.server_threads, args.connections)?;
    let (addr, server_pid) = (server.addr, server.pid.to_string());
    let (remote, machine, envelopes) = (&server.remote, &server.machine, &server.envelopes);

    let mut config = EngineConfig::default();
    config.slow = ClassConfig { threads: args.in_flight, queue_capacity: 4 * args.in_flight };
    let engine = Engine::new(config)?;

    if !args.json {
        outln!(
            "keyfence serve on {addr} (separate process), {:.1} s per measurement, {} remote operations in flight",
            args.seconds,
            args.in_flight
        );
        outln!(
            "{:<20} {:>14} {:>14} {:>7} {:>7} {:>12} {:>11} {:>11} {:>11} {:>10}",
            "alg",
            "engine/core/s",
            "server/core/s",
            "ratio",
            "target",
            "server/s",
            "local p50",
            "remote p50",
            "remote p99",
            "gokeyless"
        );
    }
    for ((name, alg, _, target, gokeyless), env) in cases.iter().zip(envelopes.iter()) {
        let local = Arc::new(PrivateKey::from_bytes(&machine.open_envelope(env)?)?);
        let remote_key = remote.key(env)?;
        // Warm up both paths.
        saturate(&engine, &local, *alg, 128, Duration::from_millis(300))?;
        saturate(&engine, &remote_key, *alg, args.in_flight, Duration::from_millis(300))?;

        let cpu = cpu_of("self");
        let (n, t) = saturate(&engine, &local, *alg, 128, dur)?;
        let engine_cpu = cpu_of("self").saturating_sub(cpu);
        let engine_per_core = n as f64 / engine_cpu.as_secs_f64().max(0.01);
        let _ = t;

        let cpu = cpu_of(&server_pid);
        let (n, t) = saturate(&engine, &remote_key, *alg, args.in_flight, dur)?;
        let server_cpu = cpu_of(&server_pid).saturating_sub(cpu);
        let server_per_core = n as f64 / server_cpu.as_secs_f64().max(0.01);
        let server_per_s = n as f64 / t.as_secs_f64();

        let samples = if *alg == Algorithm::RsaPssSha256 { 300 } else { 2000 };
        let [(local_p50, _), (remote_p50, remote_p99)] = latencies(&engine, &local, &remote_key, *alg, samples)?;
        let ratio = server_per_core / engine_per_core;
        if args.json {
            outln!(
                "{}",
                serde_json::json!({
                    "bench": "remote", "alg": name,
                    "engine_ops_per_core_s": engine_per_core.round(),
                    "server_ops_per_core_s": server_per_core.round(),
                    "ratio": (ratio * 100.0).round() / 100.0, "target": target,
                    "server_ops_per_s": server_per_s.round(), "server_threads": args.server_threads.unwrap_or(threads),
                    "in_flight": args.in_flight, "connections": args.connections,
                    "local_p50_us": local_p50.round(), "remote_p50_us": remote_p50.round(),
                    "remote_p99_us": remote_p99.round(), "added_p50_us": (remote_p50 - local_p50).round(),
                    "gokeyless_published_per_core_s": gokeyless,
                })
            );
        } else {
            outln!(
                "{:<20} {:>14.0} {:>14.0} {:>6.2}x {:>6.1}x {:>12.0} {:>9.0}us {:>9.0}us {:>9.0}us {:>10.0}",
                name,
                engine_per_core,
                server_per_core,
                ratio,
                target,
                server_per_s,
                local_p50,
                remote_p50,
                remote_p99,
                gokeyless
            );
        }
    }
    if !args.json {
        outln!("per core: signatures per CPU-second of the signing process (the engine here; the server process for remote);");
        outln!("gokeyless: its published figures per core (it cannot be run here), for scale only.");
    }
    drop(server);
    Ok(ExitCode::SUCCESS)
}

fn ec_pem() -> Result<zeroize::Zeroizing<Vec<u8>>> {
    let group = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1)?;
    Ok(zeroize::Zeroizing::new(openssl::ec::EcKey::generate(&group)?.private_key_to_pem()?))
}

fn rsa_pem() -> Result<zeroize::Zeroizing<Vec<u8>>> {
    Ok(zeroize::Zeroizing::new(openssl::rsa::Rsa::generate(2048)?.private_key_to_pem()?))
}
