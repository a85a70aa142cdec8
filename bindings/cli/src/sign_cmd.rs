//! `keyfence sign` (one signature through the engine) and `keyfence bench
//! sign` (the engine against AWS-LC called directly, side by side).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use keyfence::sign::key_process::{KeyProcess, KeyProcessConfig, KeySource};
use keyfence::sign::pkcs11::{Pkcs11Settings, Pkcs11Uri};
use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyKind, PrivateKey, Request};
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::rsa::Padding;
use openssl::sign::{RsaPssSaltlen, Signer};
use zeroize::Zeroizing;

use crate::exit;
use crate::files::{outln, read, Output};
use crate::offload_paths;

/// Every algorithm the library signs with, by name: the one list the help,
/// the "unknown algorithm" message and docs/signing.md's table show.
pub fn alg_names() -> String {
    Algorithm::ALL.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
}

/// The help of `--alg`, built from [`Algorithm::ALL`] so it cannot drift.
pub fn alg_help() -> String {
    format!("The signature algorithm: {} (docs/signing.md)", alg_names())
}

/// `keyfence sign`.
#[derive(Args)]
pub struct SignArgs {
    /// Private key, PEM or DER (PKCS#1, PKCS#8 or SEC1): RSA 2048-4096,
    /// ECDSA P-256 or P-384, Ed25519; not password-protected. Or a key in
    /// a PKCS#11 token, by RFC 7512 URI (`pkcs11:token=edge;object=tls`,
    /// docs/pkcs11.md): the module and PIN come from the URI's
    /// `module-path` and `pin-source` or KEYFENCE_PKCS11_MODULE and
    /// KEYFENCE_PKCS11_PIN_FILE, never from the command line. Not with
    /// `--remote`; with `--agent`, only a URI (the agent loads it).
    #[arg(long, required_unless_present_any = ["remote", "agent"], conflicts_with = "remote")]
    key: Option<PathBuf>,
    /// The signature algorithm (the list is filled in from the library).
    #[arg(long)]
    alg: String,
    /// The message to sign (`-`: standard input).
    #[arg(long = "in")]
    input: PathBuf,
    /// Where to write the signature (`-`: standard output): raw for RSA
    /// and Ed25519, DER for ECDSA (what `openssl dgst -verify` and
    /// `openssl pkeyutl -verify` read).
    #[arg(long)]
    out: PathBuf,
    /// The input is a digest of the message (not for ed25519).
    #[arg(long)]
    digest: bool,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Sign in a key process: this process never reads the key
    /// file; a separate `keyfence key-process` loads it and signs.
    #[arg(long, conflicts_with_all = ["remote", "agent"])]
    isolated: bool,
    /// With --isolated: start the key process even when the kernel cannot
    /// give it its whole sandbox (no Landlock, no seccomp), which it is
    /// otherwise refused for; a warning names what is missing.
    #[arg(long, requires = "isolated")]
    unsafe_partial_sandbox: bool,
    /// Sign through the key agent on this socket (`keyfence agent`) with
    /// the key in `--envelope`, which the agent opens with its own machine
    /// key: this process reads neither.
    #[arg(long, conflicts_with = "remote")]
    agent: Option<PathBuf>,
    #[command(flatten)]
    remote: crate::remote_cmd::RemoteOpts,
}

/// Runs `keyfence sign`.
pub fn sign(args: SignArgs) -> Result<ExitCode> {
    let Ok(alg) = args.alg.parse::<Algorithm>() else {
        return Err(exit::input(format!("unknown signature algorithm `{}`; known: {}", args.alg, alg_names())));
    };
    let timeout = Duration::from_millis(args.timeout_ms);
    // A `pkcs11:` URI names a token's key, not a file.
    let token_uri = args.key.as_ref().and_then(|k| k.to_str()).filter(|k| Pkcs11Uri::is_uri(k)).map(str::to_owned);
    if args.agent.is_some() && token_uri.is_none() && (args.key.is_some() || args.remote.envelope.is_none()) {
        return Err(exit::input(
            "with --agent, give the key as --envelope (which the agent opens) or as a pkcs11: URI (which the agent loads from its token)",
        ));
    }
    let inputs: Vec<&std::path::Path> = args
        .key
        .iter()
        .filter(|_| token_uri.is_none())
        .map(PathBuf::as_path)
        .chain([args.input.as_path()])
        .chain(args.remote.inputs())
        .collect();
    let out = Output::new(&args.out, &inputs)?;
    // --timeout-ms bounds the whole command: starting a key process or
    // reaching the agent, loading the key (a token module that hangs, an
    // agent that is slow to open an envelope) and the signature.
    let deadline = Instant::now() + timeout;
    let mut kp = match &args.agent {
        Some(socket) => Some(KeyProcessConfig::with_agent(socket)),
        None if args.isolated => Some(crate::key_process::key_process_config(1, args.unsafe_partial_sandbox)?),
        None => None,
    };
    if let Some(c) = kp.as_mut() {
        c.start_timeout = c.start_timeout.min(timeout);
    }
    let remote = if args.remote.remote { Some(crate::remote_cmd::remote_key(&args.remote, timeout)?) } else { None };
    let key_path = args.key.clone().unwrap_or_default();
    let envelope = args.remote.envelope.clone();
    let (uri, agent) = (token_uri.clone(), args.agent.is_some());
    let remote_key = remote.as_ref().map(|(key, _)| key.clone());
    let path = key_path.clone();
    // Started first so that they outlive the key handle.
    let (keys, key) = within(deadline, timeout, move || -> Result<(Option<KeyProcess>, Arc<PrivateKey>)> {
        let keys = match kp {
            Some(c) if agent => Some(KeyProcess::start(c).context("reaching the key agent")?),
            Some(c) => Some(KeyProcess::start(c).context("starting the key process")?),
            None => None,
        };
        let key = match (&keys, remote_key) {
            (_, Some(key)) => key,
            (keys, None) if uri.is_some() => {
                let uri = uri.unwrap_or_default();
                match keys {
                    Some(keys) => keys.load(KeySource::Pkcs11(uri)).context("loading the token's key")?,
                    None => Arc::new(keyfence::sign::pkcs11::load(&uri, &Pkcs11Settings::from_env()).context("loading the token's key")?),
                }
            }
            (Some(keys), None) if keys.is_agent() => {
                let envelope = envelope.unwrap_or_default();
                keys.load(KeySource::agent_envelope(read(&envelope)?))
                    .with_context(|| format!("the agent cannot load {}", envelope.display()))?
            }
            (Some(keys), None) => {
                let abs = std::path::absolute(&path).with_context(|| format!("resolving {}", path.display()))?;
                keys.load(KeySource::File(abs)).with_context(|| format!("loading {}", path.display()))?
            }
            (None, None) => {
                // The key file's bytes are secret: keep them in a zeroizing buffer.
                let key_bytes = Zeroizing::new(std::fs::read(&path).map_err(|e| exit::input(format!("reading {}: {e}", path.display())))?);
                Arc::new(PrivateKey::from_bytes(&key_bytes).with_context(|| format!("loading {}", path.display()))?)
            }
        };
        Ok((keys, key))
    })?;
    let _keys = keys;
    if !key.kind().supports(alg) {
        let what = match (&remote, &token_uri) {
            (Some(_), _) => "the envelope's key".to_string(),
            (None, Some(uri)) => uri.clone(),
            (None, None) => key_path.display().to_string(),
        };
        return Err(exit::input(format!("{alg} cannot be used with {} key ({what})", key.kind())));
    }
    let input = read(&args.input)?;
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let req = if args.digest { Request::sign_digest(key, alg, input) } else { Request::sign(key, alg, input) }.with_timeout(left);
    let engine = Engine::new(EngineConfig::default())?;
    let sig = engine.submit(req)?.wait()?;
    out.write_public(&sig[..])?;
    Ok(ExitCode::SUCCESS)
}

/// Runs `load` on a thread of its own and waits for it until `deadline`:
/// a key load that hangs (a token module, a slow agent) ends the command
/// at its `--timeout-ms`, as a timeout (exit 3), the thread left to end
/// with the process.
fn within<T: Send + 'static>(deadline: Instant, timeout: Duration, load: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("keyfence-load".into())
        .spawn(move || {
            let _ = tx.send(load());
        })
        .context("starting the key load")?;
    match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(loaded) => loaded,
        Err(_) => Err(anyhow::Error::new(keyfence::sign::SignError::TimedOut { timeout })
            .context(format!("loading the key did not finish within --timeout-ms {}", timeout.as_millis()))),
    }
}

/// `keyfence bench sign`.
#[derive(Args)]
pub struct BenchSignArgs {
    /// One JSON object per line: alg, path, ops_per_s, p50_us, p99_us,
    /// cpu_us_per_op; with --per-cpu also per_cpu_second, vs_raw, target.
    #[arg(long)]
    json: bool,
    /// Seconds per measurement (throughput and latency, per path).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Signing threads for every path (default: the available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Only these cases (rsa2048-pkcs1-sha256, rsa2048-pss-sha256,
    /// ecdsa-p256-sha256, ecdsa-p384-sha384, ed25519); repeatable.
    /// Default: all; with --per-cpu, ecdsa-p256-sha256, ed25519 and
    /// rsa2048-pss-sha256.
    #[arg(long = "case")]
    cases: Vec<String>,
    /// Only these paths (raw, engine, isolated, offload-sim, remote,
    /// agent, multibuffer, isolated-multibuffer); repeatable. `raw` is
    /// always measured: the others are compared with it. Default: raw,
    /// engine, isolated, offload-sim; with --per-cpu, raw, engine,
    /// isolated, remote. `agent` is a key agent in this process, on a
    /// socket in a scratch folder, with a store and machine key made for
    /// the run: the agent's protocol, fair queues and memory accounting as
    /// `keyfence agent` runs them, one client. `multibuffer` and
    /// `isolated-multibuffer` sign RSA and ECDSA on Intel's crypto_mb (in
    /// this process, in the key process) and fail, saying why, where it
    /// cannot run; `isolated` never uses it.
    #[arg(long = "path")]
    paths: Vec<String>,
    /// crypto_mb's library for the multibuffer paths (a path, or a name
    /// the loader finds). Default: KEYFENCE_CRYPTO_MB, else
    /// libcrypto_mb.so.13.
    #[arg(long)]
    crypto_mb: Option<String>,
    /// Signatures per CPU-second of everything a path uses (user and
    /// system time of every thread: this process; and the key process for
    /// `isolated`; and the key server, a `keyfence serve` on loopback, for
    /// `remote`), each path's figure over raw's in the same run (`vs_raw`)
    /// and its target (issue 29). Paths alternate in four blocks each.
    #[arg(long)]
    per_cpu: bool,
}

struct Case {
    name: &'static str,
    alg: Algorithm,
    kind: KeyKind,
}

const CASES: [Case; 7] = [
    Case { name: "rsa2048-pkcs1-sha256", alg: Algorithm::RsaPkcs1Sha256, kind: KeyKind::Rsa { bits: 2048 } },
    Case { name: "rsa2048-pss-sha256", alg: Algorithm::RsaPssSha256, kind: KeyKind::Rsa { bits: 2048 } },
    Case { name: "ecdsa-p256-sha256", alg: Algorithm::EcdsaP256Sha256, kind: KeyKind::EcP256 },
    Case { name: "ecdsa-p384-sha384", alg: Algorithm::EcdsaP384Sha384, kind: KeyKind::EcP384 },
    Case { name: "ed25519", alg: Algorithm::Ed25519, kind: KeyKind::Ed25519 },
    Case { name: "rsa3072-pkcs1-sha256", alg: Algorithm::RsaPkcs1Sha256, kind: KeyKind::Rsa { bits: 3072 } },
    Case { name: "rsa4096-pkcs1-sha256", alg: Algorithm::RsaPkcs1Sha256, kind: KeyKind::Rsa { bits: 4096 } },
];

/// The cases a run without `--case` measures: the larger RSA keys are
/// asked for by name (benches/sign_vs_openssl.py compares them with
/// `openssl speed`), since generating them alone takes seconds.
const DEFAULT_CASES: [&str; 5] = ["rsa2048-pkcs1-sha256", "rsa2048-pss-sha256", "ecdsa-p256-sha256", "ecdsa-p384-sha384", "ed25519"];

/// The cases `--per-cpu` measures unless told otherwise: the cheap
/// operations where a hop's cost shows, and RSA for scale.
const PER_CPU_CASES: [&str; 3] = ["ecdsa-p256-sha256", "ed25519", "rsa2048-pss-sha256"];

/// A TLS 1.3 CertificateVerify input is about this long.
const MSG: [u8; 130] = [0x20; 130];

/// AWS-LC called directly, the way a program without keyfence would:
/// one `EVP_DigestSign` per signature.
fn raw_sign(pkey: &PKey<Private>, alg: Algorithm) -> Result<Vec<u8>> {
    let mut signer = match alg {
        Algorithm::Ed25519 => Signer::new_without_digest(pkey)?,
        Algorithm::EcdsaP384Sha384 => Signer::new(MessageDigest::sha384(), pkey)?,
        _ => Signer::new(MessageDigest::sha256(), pkey)?,
    };
    if alg == Algorithm::RsaPssSha256 {
        signer.set_rsa_padding(Padding::PKCS1_PSS)?;
        signer.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH)?;
    }
    Ok(signer.sign_oneshot_to_vec(&MSG)?)
}

fn generate(kind: KeyKind) -> Result<PKey<Private>> {
    use openssl::ec::{EcGroup, EcKey};
    use openssl::nid::Nid;
    Ok(match kind {
        KeyKind::Rsa { bits } => PKey::from_rsa(openssl::rsa::Rsa::generate(bits)?)?,
        KeyKind::EcP256 | KeyKind::EcP384 => {
            let nid = if kind == KeyKind::EcP256 { Nid::X9_62_PRIME256V1 } else { Nid::SECP384R1 };
            let group = EcGroup::from_curve_name(nid)?;
            PKey::from_ec_key(EcKey::generate(&group)?)?
        }
        KeyKind::Ed25519 => PKey::generate_ed25519()?,
    })
}

/// `threads` threads signing back to back for `dur`; operations completed.
fn raw_throughput(pkey: &PKey<Private>, alg: Algorithm, threads: usize, dur: Duration) -> Result<u64> {
    let total = AtomicU64::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    let start = Instant::now();
                    let mut n = 0;
                    while start.elapsed() < dur {
                        std::hint::black_box(raw_sign(pkey, alg)?);
                        n += 1;
                    }
                    total.fetch_add(n, Ordering::Relaxed);
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a bench thread panicked"))))
    })?;
    Ok(total.into_inner())
}

/// Keeps the engine's executor saturated for `dur` the way an event loop
/// would: batches of requests in flight, one wake-up per finished batch
/// (as one readiness event of a completion queue covers many
/// completions). Returns operations completed and the time taken.
fn engine_throughput(engine: &Engine, key: &Arc<PrivateKey>, alg: Algorithm, dur: Duration) -> Result<(u64, Duration)> {
    const BATCH: usize = 128;
    let errors = Arc::new(AtomicU64::new(0));
    let me = std::thread::current();
    // One submission batch per wake-up, as an event loop submits what
    // one readiness event produced (`Engine::batch`).
    let submit_batch = || -> Result<Arc<AtomicUsize>> {
        let remaining = Arc::new(AtomicUsize::new(BATCH));
        engine.batch(|| -> Result<()> {
            for _ in 0..BATCH {
                let (remaining, errors, me) = (remaining.clone(), errors.clone(), me.clone());
                engine.submit_with_callback(Request::sign(key.clone(), alg, MSG.to_vec()), move |r| {
                    if r.is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                        me.unpark();
                    }
                })?;
            }
            Ok(())
        })?;
        Ok(remaining)
    };
    let start = Instant::now();
    let mut inflight = std::collections::VecDeque::new();
    inflight.push_back(submit_batch()?);
    inflight.push_back(submit_batch()?);
    let mut done = 0u64;
    while let Some(batch) = inflight.pop_front() {
        while batch.load(Ordering::Acquire) > 0 {
            std::thread::park();
        }
        done += BATCH as u64;
        if start.elapsed() < dur {
            inflight.push_back(submit_batch()?);
        }
    }
    let elapsed = start.elapsed();
    let errors = errors.load(Ordering::Relaxed);
    if errors > 0 {
        bail!("{errors} engine operations failed during the benchmark");
    }
    Ok((done, elapsed))
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e6
}

struct Figures {
    ops_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us_per_op: f64,
    per_cpu_second: f64,
}

/// CPU time (user and system, every thread) this process and, if any,
/// the other process a path uses (`other`: the key process or the key
/// server) have used so far, from `/proc` (Linux only; zero elsewhere).
/// On a shared machine throughput moves with the neighbours' load; CPU
/// per operation barely does, so `bench sign` reports both.
fn cpu_time(other: Option<u32>) -> Duration {
    let this = crate::remote_cmd::cpu_of("self");
    this + other.map_or(Duration::ZERO, |pid| crate::remote_cmd::cpu_of(&pid.to_string()))
}

/// `/proc` counts CPU time in ticks of 10 ms: a measurement that used less
/// than one reads as one rather than as a division by zero.
const CPU_TICK: Duration = Duration::from_millis(10);

/// The ways of signing that `bench sign` compares.
const PATHS: [&str; 8] = ["raw", "engine", "isolated", "offload-sim", "remote", "agent", "multibuffer", "isolated-multibuffer"];

/// The targets for signatures per CPU-second over raw AWS-LC's: issue
/// 29's for the software paths (ECDSA P-256 and Ed25519; RSA-2048 is
/// reported without one), issue 60's for crypto_mb's (RSA-2048 and P-256
/// at no more than 0.4x the CPU a signature: 2.5x the signatures).
fn per_cpu_target(case: &str, path: &str) -> Option<f64> {
    if matches!(path, "multibuffer" | "isolated-multibuffer") {
        return matches!(case, "ecdsa-p256-sha256" | "rsa2048-pss-sha256" | "rsa2048-pkcs1-sha256").then_some(2.5);
    }
    if !matches!(case, "ecdsa-p256-sha256" | "ed25519") {
        return None;
    }
    match path {
        "engine" => Some(0.97),
        "isolated" => Some(0.9),
        "remote" => Some(0.85),
        _ => None,
    }
}

/// One path's engine and key, or AWS-LC called directly.
enum Path {
    Raw,
    Engine(Engine, Arc<PrivateKey>),
}

/// A path as measured: its name, how it signs, and the process besides
/// this one whose CPU it uses (the key process, the key server).
struct Measured {
    name: &'static str,
    path: Path,
    other: Option<u32>,
}

/// What the paths run on, started once for every case.
struct Rig<'a> {
    engine: Engine,
    keys: Option<KeyProcess>,
    offload: Option<Engine>,
    /// crypto_mb's device in this process, and a key process on it.
    multibuffer: Option<Engine>,
    multibuffer_keys: Option<KeyProcess>,
    /// The key server and the engine that signs through it (a slow class
    /// as large as the requests the bench keeps in flight, which it bounds
    /// even though the remote client holds no thread per operation).
    remote: Option<(crate::remote_cmd::LoopbackServer, Engine)>,
    /// A key agent in this process (its CPU is this process's), its
    /// client, and each case's envelope.
    agent: Option<(keyfence::sign::agent::Agent, KeyProcess, Vec<Vec<u8>>)>,
    scratch: &'a std::path::Path,
}

/// A key agent for `keyfence bench sign --path agent`: an authority, a
/// machine key and a servers' copy made in `dir`, each case's key wrapped
/// to it.
fn bench_agent(dir: &std::path::Path, ders: &[&[u8]], threads: usize) -> Result<(keyfence::sign::agent::Agent, KeyProcess, Vec<Vec<u8>>)> {
    use keyfence::wrap::{create_store, export_for_servers, Authority};
    std::fs::create_dir(dir)?;
    let store = dir.join("store");
    let served = dir.join("served");
    let mut authority = Authority::init(create_store(&store.to_string_lossy())?)?;
    let machine_key = dir.join("machine.key");
    crate::files::create_new(&machine_key, &authority.issue(&"bench=yes".parse()?)?.to_bytes())?;
    let envelopes = ders.iter().map(|der| Ok(authority.wrap("bench: yes", der)?.to_bytes().to_vec())).collect::<Result<Vec<_>>>()?;
    export_for_servers(&*keyfence::wrap::open_store(&store.to_string_lossy())?, &*create_store(&served.to_string_lossy())?)?;
    let mut config = keyfence::sign::agent::AgentConfig::new(dir.join("agent.sock"), served.to_string_lossy(), &machine_key);
    config.state_dir = Some(dir.to_path_buf());
    config.rsa_threads = threads;
    config.ec_threads = threads;
    let agent = keyfence::sign::agent::Agent::start(config)?;
    let client = KeyProcess::start(KeyProcessConfig::with_agent(agent.socket()))?;
    Ok((agent, client, envelopes))
}

/// Runs `keyfence bench sign`.
pub fn bench(args: BenchSignArgs) -> Result<ExitCode> {
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    if !(args.seconds > 0.0 && args.seconds <= 600.0) {
        return Err(exit::input("--seconds must be in (0, 600]"));
    }
    let dur = Duration::from_secs_f64(args.seconds);
    for c in &args.cases {
        if !CASES.iter().any(|k| k.name == c) {
            return Err(exit::input(format!("unknown case {c}; known: {}", CASES.iter().map(|k| k.name).collect::<Vec<_>>().join(", "))));
        }
    }
    for p in &args.paths {
        if !PATHS.contains(&p.as_str()) {
            return Err(exit::input(format!("unknown path {p}; known: {}", PATHS.join(", "))));
        }
    }
    let default_path = |p: &str| {
        !matches!(p, "agent" | "multibuffer" | "isolated-multibuffer") && if args.per_cpu { p != "offload-sim" } else { p != "remote" }
    };
    let wanted = |p: &str| p == "raw" || if args.paths.is_empty() { default_path(p) } else { args.paths.iter().any(|w| w == p) };
    let cases: Vec<&Case> = CASES
        .iter()
        .filter(|c| match (args.cases.is_empty(), args.per_cpu) {
            (false, _) => args.cases.iter().any(|n| n == c.name),
            (true, true) => PER_CPU_CASES.contains(&c.name),
            (true, false) => DEFAULT_CASES.contains(&c.name),
        })
        .collect();
    // Every key first: the key server is started holding all of them.
    let mut keys = Vec::new();
    for case in &cases {
        let pkey = generate(case.kind)?;
        let der = Zeroizing::new(pkey.private_key_to_pkcs8()?);
        keys.push((pkey, der));
    }
    let mut config = EngineConfig::default();
    config.rsa.threads = threads;
    config.ec.threads = threads;
    // Random name, created new, mode 700, removed on drop: no other user
    // can have made it first and planted links in it.
    let scratch = crate::files::scratch_dir("bench-sign")?;
    let remote = if wanted("remote") {
        let dir = scratch.path().join("remote");
        std::fs::create_dir(&dir)?;
        let named: Vec<(&str, &[u8])> = cases.iter().zip(&keys).map(|(c, (_, der))| (c.name, &der[..])).collect();
        let server = crate::remote_cmd::loopback_server(&dir, &named, Some(threads), 2)?;
        let mut remote_config = config.clone();
        remote_config.slow = keyfence::sign::ClassConfig { threads: 8, queue_capacity: 4096 };
        Some((server, Engine::new(remote_config)?))
    } else {
        None
    };
    let rig = Rig {
        engine: Engine::new(config.clone())?,
        keys: if wanted("isolated") { Some(offload_paths::key_process(threads, None)?) } else { None },
        offload: if wanted("offload-sim") { Some(offload_paths::sim_engine(config.clone(), threads)?) } else { None },
        multibuffer: if wanted("multibuffer") {
            Some(offload_paths::multibuffer_engine(config.clone(), args.crypto_mb.as_deref(), threads)?)
        } else {
            None
        },
        multibuffer_keys: if wanted("isolated-multibuffer") {
            Some(offload_paths::key_process(threads, Some(args.crypto_mb.as_deref()))?)
        } else {
            None
        },
        remote,
        agent: if wanted("agent") {
            let ders: Vec<&[u8]> = keys.iter().map(|(_, der)| &der[..]).collect();
            Some(bench_agent(&scratch.path().join("agent"), &ders, threads)?)
        } else {
            None
        },
        scratch: scratch.path(),
    };
    let result = run_cases(&args, threads, dur, &rig, &cases, &keys, &wanted);
    // The client before the server it is connected to, both before the
    // scratch folder their files are in.
    drop(rig);
    drop(scratch);
    result
}

#[allow(clippy::too_many_arguments)]
fn run_cases(
    args: &BenchSignArgs, threads: usize, dur: Duration, rig: &Rig, cases: &[&Case], keys: &[(PKey<Private>, Zeroizing<Vec<u8>>)],
    wanted: &dyn Fn(&str) -> bool,
) -> Result<ExitCode> {
    if !args.json {
        outln!("{threads} signing threads per path, {:.1} s per measurement", args.seconds);
        if args.per_cpu {
            outln!(
                "{:<22} {:<12} {:>14} {:>8} {:>8} {:>11} {:>9} {:>9}",
                "alg",
                "path",
                "per_cpu_second",
                "vs_raw",
                "target",
                "ops_per_s",
                "p50_us",
                "p99_us"
            );
        } else {
            outln!(
                "{:<22} {:<12} {:>11} {:>9} {:>9} {:>8}   {:>12} {:>13} {:>10}",
                "alg",
                "path",
                "ops_per_s",
                "p50_us",
                "p99_us",
                "cpu_us",
                "ops vs base",
                "added p50_us",
                "cpu vs base"
            );
        }
    }
    for (case_at, case) in cases.iter().enumerate() {
        let (pkey, der) = &keys[case_at];
        let key = Arc::new(PrivateKey::from_der(der)?);
        let mut paths = vec![Measured { name: "raw", path: Path::Raw, other: None }];
        if wanted("engine") {
            paths.push(Measured { name: "engine", path: Path::Engine(rig.engine.clone(), key.clone()), other: None });
        }
        // The key process reads the key from a file, as in production.
        let isolated = |keys: &KeyProcess| -> Result<Arc<PrivateKey>> {
            let file = rig.scratch.join(format!("{}.der", case.name));
            crate::files::create_new(&file, &der[..])?;
            let held = keys.load(KeySource::File(file.clone()));
            std::fs::remove_file(&file)?;
            Ok(held?)
        };
        if let Some(keys) = &rig.keys {
            paths.push(Measured { name: "isolated", path: Path::Engine(rig.engine.clone(), isolated(keys)?), other: keys.pid() });
        }
        if let Some(offload) = &rig.offload {
            paths.push(Measured { name: "offload-sim", path: Path::Engine(offload.clone(), key.clone()), other: None });
        }
        if let Some(mb) = &rig.multibuffer {
            paths.push(Measured { name: "multibuffer", path: Path::Engine(mb.clone(), key.clone()), other: None });
        }
        if let Some(keys) = &rig.multibuffer_keys {
            let held = isolated(keys)?;
            paths.push(Measured { name: "isolated-multibuffer", path: Path::Engine(rig.engine.clone(), held), other: keys.pid() });
        }
        if let Some((server, engine)) = &rig.remote {
            let held = server.remote.key(&server.envelopes[case_at])?;
            paths.push(Measured { name: "remote", path: Path::Engine(engine.clone(), held), other: Some(server.pid) });
        }
        if let Some((_, client, envelopes)) = &rig.agent {
            let held = client.load(KeySource::agent_envelope(envelopes[case_at].clone()))?;
            paths.push(Measured { name: "agent", path: Path::Engine(rig.engine.clone(), held), other: None });
        }
        let sign_once = |path: &Path| -> Result<()> {
            match path {
                Path::Raw => drop(std::hint::black_box(raw_sign(pkey, case.alg)?)),
                Path::Engine(e, k) => drop(std::hint::black_box(e.sign(k, case.alg, &MSG)?.wait()?)),
            }
            Ok(())
        };
        let throughput = |path: &Path, d: Duration| -> Result<(u64, Duration)> {
            match path {
                Path::Raw => {
                    let t = Instant::now();
                    let n = raw_throughput(pkey, case.alg, threads, d)?;
                    Ok((n, t.elapsed()))
                }
                Path::Engine(e, k) => engine_throughput(e, k, case.alg, d),
            }
        };
        // Warm up every path (threads, caches, CPU frequency, connections).
        for m in &paths {
            throughput(&m.path, Duration::from_millis(200))?;
        }

        // Throughput with every core busy, in alternating blocks so that
        // machine noise drifting over the run hits every path alike; each
        // path's CPU is that of the processes it uses, read around its
        // own block only.
        let rounds: u32 = if args.per_cpu { 4 } else { 2 };
        let mut totals = vec![(0u64, Duration::ZERO, Duration::ZERO); paths.len()];
        for _ in 0..rounds {
            for (i, m) in paths.iter().enumerate() {
                let cpu = cpu_time(m.other);
                let (n, e) = throughput(&m.path, dur / rounds)?;
                totals[i].0 += n;
                totals[i].1 += e;
                totals[i].2 += cpu_time(m.other).saturating_sub(cpu);
            }
        }

        // Latency of one operation at a time, issued back to back, in
        // alternating blocks per path (drift hits all). The caller blocks
        // in `wait`, as a thread without an event loop would. (After the
        // engine has been idle for a while, the first operation also pays
        // for waking a parked worker: see docs/signing.md.)
        const BLOCK: usize = 32;
        let mut lat: Vec<Vec<Duration>> = vec![Vec::new(); paths.len()];
        let start = Instant::now();
        while start.elapsed() < dur || lat[0].len() < 4 * BLOCK {
            for (i, m) in paths.iter().enumerate() {
                for _ in 0..BLOCK {
                    let t = Instant::now();
                    sign_once(&m.path)?;
                    lat[i].push(t.elapsed());
                }
            }
        }
        let figures: Vec<Figures> = lat
            .iter_mut()
            .zip(&totals)
            .map(|(l, (n, t, cpu))| {
                l.sort();
                Figures {
                    cpu_us_per_op: cpu.as_secs_f64() * 1e6 / (*n).max(1) as f64,
                    per_cpu_second: *n as f64 / (*cpu).max(CPU_TICK).as_secs_f64(),
                    ops_per_s: *n as f64 / t.as_secs_f64(),
                    p50_us: percentile(l, 0.5),
                    p99_us: percentile(l, 0.99),
                }
            })
            .collect();
        let raw = &figures[0];
        // `engine` is compared with `raw`; `isolated` and `offload-sim`
        // with the in-process engine when it was measured.
        let engine_at = paths.iter().position(|m| m.name == "engine");
        for (i, (m, f)) in paths.iter().zip(&figures).enumerate() {
            let name = m.name;
            // Raw over itself is 1 by definition, not by arithmetic.
            let vs_raw = if i == 0 { 1.0 } else { f.per_cpu_second / raw.per_cpu_second };
            if args.json {
                let mut row = serde_json::json!({
                    "alg": case.name,
                    "path": name,
                    "ops_per_s": (f.ops_per_s * 10.0).round() / 10.0,
                    "p50_us": (f.p50_us * 100.0).round() / 100.0,
                    "p99_us": (f.p99_us * 100.0).round() / 100.0,
                    "cpu_us_per_op": (f.cpu_us_per_op * 100.0).round() / 100.0,
                });
                if args.per_cpu {
                    row["per_cpu_second"] = serde_json::json!(f.per_cpu_second.round());
                    row["vs_raw"] = serde_json::json!((vs_raw * 1000.0).round() / 1000.0);
                    row["target"] = serde_json::json!(per_cpu_target(case.name, name));
                }
                outln!("{row}");
            } else if args.per_cpu {
                let target = per_cpu_target(case.name, name).map_or(String::new(), |t| format!(">= {t:.2}"));
                outln!(
                    "{:<22} {:<12} {:>14.0} {:>7.3}x {:>8} {:>11.0} {:>9.1} {:>9.1}",
                    case.name,
                    name,
                    f.per_cpu_second,
                    vs_raw,
                    target,
                    f.ops_per_s,
                    f.p50_us,
                    f.p99_us
                );
            } else {
                let base = match (name, engine_at) {
                    ("raw", _) => None,
                    ("engine", _) | (_, None) => Some((&figures[0], "raw")),
                    (_, Some(e)) => Some((&figures[e], "engine")),
                };
                let extra = match base {
                    Some((b, label)) if i > 0 => {
                        format!(
                            "{:>6.3}x {:<6}{:>12.1} {:>9.3}x",
                            f.ops_per_s / b.ops_per_s,
                            label,
                            f.p50_us - b.p50_us,
                            b.cpu_us_per_op / f.cpu_us_per_op
                        )
                    }
                    _ => String::new(),
                };
                outln!(
                    "{:<22} {:<12} {:>11.0} {:>9.1} {:>9.1} {:>8.1}   {extra}",
                    case.name,
                    name,
                    f.ops_per_s,
                    f.p50_us,
                    f.p99_us,
                    f.cpu_us_per_op
                );
            }
        }
    }
    if args.per_cpu && !args.json {
        outln!("per_cpu_second: signatures per CPU-second of every process the path uses (isolated: with the key");
        outln!("process; remote: with the key server); vs_raw: over raw AWS-LC's in this run.");
    }
    Ok(ExitCode::SUCCESS)
}
