//! `keyfence provider-key` and `keyfence provider-config`: the files
//! OpenSSL programs need to use keyfence keys through the OpenSSL 3
//! provider (bindings/openssl, docs/openssl.md). `provider-key` writes a
//! `KEYFENCE KEY` file that says where the private key is and carries its
//! public half; `provider-config` prints an `openssl.cnf` loading the
//! provider beside OpenSSL's default one.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use keyfence::key_file::{KeyFile, KeyFilePeer, KeyLocation, PEM_LABEL};
use keyfence::sign::remote::{RemoteConfig, RemoteSigner, TlsFiles};
use keyfence::sign::PrivateKey;
use keyfence::wrap::Envelope;

use crate::exit;
use crate::files::{read, Output};
use crate::remote_cmd::parse_peer;
use crate::wrap_cmd::open_machine;

/// `keyfence provider-key`.
#[derive(Args)]
pub struct ProviderKeyArgs {
    /// The key's envelope (`keyfence authority wrap --out`).
    #[arg(long, required_unless_present = "pkcs11", conflicts_with = "pkcs11")]
    envelope: Option<PathBuf>,
    /// Token key: its RFC 7512 URI (docs/pkcs11.md). Loaded once now, to
    /// take the public key: here, or by the agent with `--agent`. The
    /// file then names the URI, which holds no PIN.
    #[arg(long, value_name = "URI", conflicts_with_all = ["remote", "store", "machine_key"])]
    pkcs11: Option<String>,
    /// Where the key file goes (`-`: standard output). It holds no secret.
    #[arg(long)]
    out: PathBuf,
    /// Local key: the store a machine opens the envelope against (a
    /// directory or etcd://...). The envelope is opened once here, to
    /// prove this machine may and to take the public key.
    #[arg(long, conflicts_with_all = ["remote", "agent"], required_unless_present_any = ["remote", "agent", "pkcs11"])]
    store: Option<PathBuf>,
    /// Local key: this machine's key file.
    #[arg(long, conflicts_with_all = ["remote", "agent"], required_unless_present_any = ["remote", "agent", "pkcs11"])]
    machine_key: Option<PathBuf>,
    /// Agent's key: the socket of the key agent that holds it (`keyfence
    /// agent`, docs/deploy.md). The agent loads the envelope once now, to
    /// prove it may and to give the public key; the server then needs only
    /// the socket.
    #[arg(long, conflicts_with = "remote")]
    agent: Option<PathBuf>,
    /// Remote key: signed by key servers (`keyfence serve`); the public
    /// key is asked of them now.
    #[arg(long, requires = "peers")]
    remote: bool,
    /// A key server: NAME,HOST:PORT,ATTRIBUTES (as `keyfence sign --peer`).
    #[arg(long = "peer", requires = "remote")]
    peers: Vec<String>,
    /// This client's certificate (PEM).
    #[arg(long, requires = "remote", required_if_eq("remote", "true"))]
    tls_cert: Option<PathBuf>,
    /// This client's certificate key (PEM).
    #[arg(long, requires = "remote", required_if_eq("remote", "true"))]
    tls_key: Option<PathBuf>,
    /// The CA certificates (PEM) the servers' certificates must come from.
    #[arg(long, requires = "remote", required_if_eq("remote", "true"))]
    tls_ca: Option<PathBuf>,
    /// The certificate the server will present with this key (PEM): its
    /// public key must be the key's, or no file is written. Catches a
    /// token key or envelope paired with another key's certificate before
    /// a server starts with it.
    #[arg(long)]
    cert: Option<PathBuf>,
}

/// `keyfence provider-config`.
#[derive(Args)]
pub struct ProviderConfigArgs {
    /// The provider module (`lib/ossl-modules/keyfence.so` under the
    /// prefix keyfence was installed to).
    #[arg(long)]
    module: PathBuf,
    /// The store key files name when they name none.
    #[arg(long)]
    store: Option<PathBuf>,
    /// The machine key key files use when they name none.
    #[arg(long)]
    machine_key: Option<PathBuf>,
    /// Keep private keys in the isolated key process, not in the server.
    #[arg(long)]
    isolated: bool,
    /// The deadline of one signature, in milliseconds (default: the
    /// engine's).
    #[arg(long)]
    timeout_ms: Option<u32>,
    /// Where the provider also writes the reasons some programs drop or
    /// never show (Apache's key loads and failed handshakes, stunnel's
    /// error details): auto (standard error, or syslog when it goes
    /// nowhere), stderr, syslog or off.
    #[arg(long, value_parser = ["auto", "stderr", "syslog", "off"])]
    log: Option<String>,
    /// Print what to `.include` at the end of an existing openssl.cnf (the
    /// system's, whose other settings stay) instead of a whole file for
    /// OPENSSL_CONF (docs/openssl.md).
    #[arg(long)]
    include: bool,
}

/// A path as the server will read it: absolute, since servers rarely run
/// in the directory the file was written from. etcd:// names stay as given.
fn absolute(p: &Path) -> Result<String> {
    let s = p.to_str().with_context(|| format!("{} is not UTF-8", p.display()))?;
    if s.starts_with("etcd://") {
        return Ok(s.to_string());
    }
    let abs = std::fs::canonicalize(p).map_err(|e| exit::input(format!("{}: {e}", p.display())))?;
    abs.to_str().map(str::to_string).with_context(|| format!("{} is not UTF-8", abs.display()))
}

/// The PEM text of a key file body.
pub fn pem(body: &[u8]) -> String {
    let b64 = openssl::base64::encode_block(body);
    let mut s = format!("-----BEGIN {PEM_LABEL}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        s.push('\n');
    }
    s.push_str(&format!("-----END {PEM_LABEL}-----\n"));
    s
}

/// Runs `keyfence provider-key`.
pub fn provider_key(args: ProviderKeyArgs) -> Result<ExitCode> {
    let inputs: Vec<&Path> = [&args.envelope, &args.machine_key, &args.tls_cert, &args.tls_key, &args.tls_ca, &args.cert]
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
        .collect();
    let out = Output::new(&args.out, &inputs)?;
    if let Some(uri) = &args.pkcs11 {
        return token_key_file(uri, args.agent.as_deref(), args.cert.as_deref(), out);
    }
    let envelope_path = args.envelope.clone().unwrap_or_default();
    let envelope = read(&envelope_path)?;
    let env = Envelope::parse(&envelope).with_context(|| format!("reading {}", envelope_path.display()))?;
    let (location, public_key) = if args.remote {
        let (Some(cert), Some(tls_key), Some(ca)) = (&args.tls_cert, &args.tls_key, &args.tls_ca) else {
            return Err(exit::input("--remote needs --tls-cert, --tls-key and --tls-ca"));
        };
        let peers = args.peers.iter().map(|p| parse_peer(p)).collect::<Result<Vec<_>>>()?;
        let (tls_cert, tls_key, tls_ca) = (absolute(cert)?, absolute(tls_key)?, absolute(ca)?);
        let files = TlsFiles { cert: tls_cert.clone().into(), key: tls_key.clone().into(), ca: tls_ca.clone().into() };
        let mut config = RemoteConfig::new(peers, files);
        config.connect_timeout = Duration::from_secs(5);
        let remote = RemoteSigner::start(config)?;
        let key = remote.key(&env).context("asking the key servers for the key's public half")?;
        let peers = args
            .peers
            .iter()
            .map(|p| {
                // NAME,HOST:PORT,ATTRIBUTES (parse_peer checked the three parts).
                let mut parts = p.splitn(3, ',').map(str::to_string);
                let [name, addr, attrs] = [parts.next(), parts.next(), parts.next()].map(Option::unwrap_or_default);
                KeyFilePeer { name, addr, attrs, server_name: None }
            })
            .collect();
        let location = KeyLocation::Remote { tls_cert, tls_key, tls_ca, peers };
        (location, key.public_key_der()?)
    } else if let Some(socket) = &args.agent {
        use keyfence::sign::key_process::KeySource;
        use keyfence::sign::managed::{Isolation, ManagedConfig, ManagedEngine};
        let mut config = ManagedConfig::default();
        config.isolation = Isolation::Agent(socket.clone());
        let engine = ManagedEngine::start(config).context("reaching the key agent")?;
        let key = engine.load(KeySource::agent_envelope(envelope.clone())).context("the agent cannot load the key")?;
        (KeyLocation::Agent { socket: absolute(socket)? }, key.public_key_der()?)
    } else {
        let (Some(store), Some(mk)) = (&args.store, &args.machine_key) else {
            return Err(exit::input("a local key needs --store and --machine-key (or --remote)"));
        };
        let machine = open_machine(store, mk)?;
        let secret = machine.open(&envelope).context("this machine cannot open the envelope")?;
        let key = PrivateKey::from_pem(&secret).map_err(|e| exit::input(format!("the envelope holds no usable private key: {e}")))?;
        let location = KeyLocation::Local { store: Some(absolute(store)?), machine_key: Some(absolute(mk)?) };
        (location, key.public_key_der()?)
    };
    if let Some(cert) = &args.cert {
        matches_certificate(cert, &public_key)?;
    }
    let body = KeyFile { location, public_key, envelope }.to_bytes().map_err(|e| exit::input(e.to_string()))?;
    out.write_public(pem(&body).as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// Refuses a certificate whose public key is not `spki` (DER).
fn matches_certificate(cert: &Path, spki: &[u8]) -> Result<()> {
    let theirs = crate::remote_cmd::public_key_der(cert)?;
    if theirs != spki {
        return Err(exit::input(format!("{}: the certificate's public key is not the key's", cert.display())));
    }
    Ok(())
}

/// `provider-key --pkcs11 URI`: loads the token key once (here, or in the
/// agent on `agent`) for its public half, and writes a file naming the URI.
///
/// Without an agent, the module and PIN file this process found in its
/// environment are written into the file's URI (`module-path`,
/// `pin-source`, absolute): servers clear their workers' environment
/// (nginx keeps only what `env` directives name), so the file must say
/// where the module and the PIN are, as it says where a store is. Neither
/// is a secret. An agent uses its own, and the URI is kept as given.
fn token_key_file(uri: &str, agent: Option<&Path>, cert: Option<&Path>, out: Output) -> Result<ExitCode> {
    use keyfence::sign::key_process::KeySource;
    use keyfence::sign::managed::{Isolation, ManagedConfig, ManagedEngine};
    use keyfence::sign::pkcs11::{Pkcs11Settings, Pkcs11Uri};
    let mut parsed = Pkcs11Uri::parse(uri).map_err(|e| exit::input(e.to_string()))?;
    if agent.is_none() {
        let settings = Pkcs11Settings::from_env();
        if parsed.module_path.is_none() && parsed.module_name.is_none() {
            if let Some(m) = &settings.module {
                parsed.module_path = Some(absolute(m)?.into());
            }
        }
        if parsed.pin_source.is_none() {
            match &settings.pin_file {
                Some(f) => parsed.pin_source = Some(absolute(f)?.into()),
                None if settings.pin.is_some() => eprintln!(
                    "keyfence provider-key: the PIN came from KEYFENCE_PKCS11_PIN, which the file cannot name: \
                     the server's processes need it too (or use a PIN file: KEYFENCE_PKCS11_PIN_FILE)"
                ),
                None => {}
            }
        }
    }
    let uri = parsed.to_string();
    let mut config = ManagedConfig::default();
    if let Some(socket) = agent {
        config.isolation = Isolation::Agent(socket.to_path_buf());
    }
    let engine = ManagedEngine::start(config).context("reaching the key agent")?;
    let key = engine.load(KeySource::Pkcs11(uri.clone())).context("loading the token's key")?;
    let agent = agent.map(absolute).transpose()?;
    let public_key = key.public_key_der()?;
    if let Some(cert) = cert {
        matches_certificate(cert, &public_key)?;
    }
    let file = KeyFile { location: KeyLocation::Pkcs11 { uri, agent }, public_key, envelope: Vec::new() };
    let body = file.to_bytes().map_err(|e| exit::input(e.to_string()))?;
    out.write_public(pem(&body).as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `keyfence provider-config`: an openssl.cnf for OPENSSL_CONF.
pub fn provider_config(args: ProviderConfigArgs) -> Result<ExitCode> {
    let module = absolute(&args.module)?;
    let mut s = if args.include {
        // Sections of their own names, so none of the including file's is
        // changed but [openssl_init], which the snippet reopens to name its
        // providers (OpenSSL merges a section given twice).
        String::from(
            "# keyfence's OpenSSL provider (keyfence provider-config --include): add\n\
             #   .include /path/to/this/file\n\
             # at the end of an openssl.cnf whose [openssl_init] names no providers\n\
             # (Debian's /etc/ssl/openssl.cnf). One that does: add `keyfence = keyfence_sect`\n\
             # to its providers section instead, and keep only [keyfence_sect] below.\n\n\
             [openssl_init]\nproviders = keyfence_providers\n\n\
             [keyfence_providers]\n# OpenSSL's own algorithms stay available: keyfence only signs with its keys.\n\
             default = keyfence_default\nkeyfence = keyfence_sect\n\n\
             [keyfence_default]\nactivate = 1\n\n\
             [keyfence_sect]\n",
        )
    } else {
        String::from(
            "# openssl.cnf for keyfence's OpenSSL provider (keyfence provider-config).\n\
             # Use it with OPENSSL_CONF=<this file>; docs/openssl.md.\n\
             openssl_conf = openssl_init\n\n\
             [openssl_init]\nproviders = provider_sect\n\n\
             [provider_sect]\n# OpenSSL's own algorithms stay available: keyfence only signs with its keys.\n\
             default = default_sect\nkeyfence = keyfence_sect\n\n\
             [default_sect]\nactivate = 1\n\n\
             [keyfence_sect]\n",
        )
    };
    s.push_str(&format!("module = {module}\nactivate = 1\n"));
    if let Some(store) = &args.store {
        s.push_str(&format!("store = {}\n", absolute(store)?));
    }
    if let Some(mk) = &args.machine_key {
        s.push_str(&format!("machine-key = {}\n", absolute(mk)?));
    }
    s.push_str(&format!("isolated = {}\n", if args.isolated { "yes" } else { "no" }));
    if let Some(t) = args.timeout_ms {
        if t == 0 || t > 600_000 {
            return Err(exit::input("--timeout-ms must be in 1..600000"));
        }
        s.push_str(&format!("timeout-ms = {t}\n"));
    }
    if let Some(log) = &args.log {
        s.push_str(&format!("log = {log}\n"));
    }
    crate::files::stdout_bytes(s.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}
