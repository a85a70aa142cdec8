//! `keyfence bench soak`: load and faults for a bounded time, as figures.
//!
//! Signer threads sign through the engine, in this process and through an
//! key process that a killer thread ends with SIGKILL every few
//! seconds; wrapper and opener threads wrap and open envelopes on one file
//! store at the same time. The run prints one JSON object: operations
//! done, failures by kind, keys and envelopes lost (must be 0), peak
//! memory, and calls that waited past their deadline (must be none). It
//! exits 3 if anything was lost or late.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use keyfence::policy::Attributes;
use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyKind, PrivateKey, Request, SignError};
use keyfence::wrap::{Authority, CacheConfig, FileStore, Machine};
use openssl::pkey::PKey;
use zeroize::Zeroizing;

use crate::files::outln;
use crate::key_process::key_process;

/// `keyfence bench soak`.
#[derive(Args)]
pub struct SoakArgs {
    /// How long to run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Signing threads (each keeps one operation in flight).
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// Kill the key process this often (milliseconds).
    #[arg(long, default_value_t = 2000)]
    kill_every_ms: u64,
    /// Each signature's deadline (milliseconds).
    #[arg(long, default_value_t = 2000)]
    deadline_ms: u64,
    /// Where the store and key files go (default: a new directory under
    /// the system's temporary directory, removed afterwards).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

/// Envelopes handed out with the secrets they must open to.
type HandedOut = Arc<Mutex<Vec<(Vec<u8>, Vec<u8>)>>>;

/// How late a result may arrive after its deadline before it counts as
/// late: the deadline thread's wake-up and scheduling on a busy machine.
const LATE_SLACK: Duration = Duration::from_millis(250);

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: Mutex<BTreeMap<String, u64>>,
    late: AtomicU64,
    max_overrun_us: AtomicU64,
}

impl Tally {
    fn fail(&self, kind: String) {
        *self.failed.lock().unwrap_or_else(|e| e.into_inner()).entry(kind).or_default() += 1;
    }
}

/// A failure's kind for the report: backend failures by how the backend
/// failed (the key process died, was restarting, ...), others by
/// [`SignError::kind`].
fn kind_of(e: &SignError) -> String {
    match e {
        SignError::Backend { failure, .. } => format!("backend_{failure:?}").to_lowercase(),
        other => other.kind().name().to_string(),
    }
}

/// The peak resident memory of a process, in KiB (`VmHWM`).
fn peak_rss_kb(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn pem(kind: KeyKind) -> Result<Zeroizing<Vec<u8>>> {
    let pkey = match kind {
        KeyKind::Rsa { bits } => PKey::from_rsa(openssl::rsa::Rsa::generate(bits)?)?,
        KeyKind::EcP256 => {
            let g = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1)?;
            PKey::from_ec_key(openssl::ec::EcKey::generate(&g)?)?
        }
        _ => PKey::generate_ed25519()?,
    };
    Ok(Zeroizing::new(pkey.private_key_to_pem_pkcs8()?))
}

/// Runs `keyfence bench soak`.
pub fn soak(args: SoakArgs) -> Result<ExitCode> {
    match &args.dir {
        Some(dir) => {
            crate::files::create_private_dir(dir)?;
            run(&args, dir)
        }
        None => {
            // Random name, created new, mode 700, removed on drop.
            let scratch = crate::files::scratch_dir("soak")?;
            run(&args, scratch.path())
        }
    }
}

fn run(args: &SoakArgs, dir: &Path) -> Result<ExitCode> {
    let keys = key_process(2, false)?;
    // Keys in the key process from a file and from bytes (both must
    // survive every restart), and in this process.
    let mut isolated = Vec::new();
    for (i, (kind, alg)) in [
        (KeyKind::Rsa { bits: 2048 }, Algorithm::RsaPssSha256),
        (KeyKind::EcP256, Algorithm::EcdsaP256Sha256),
        (KeyKind::Ed25519, Algorithm::Ed25519),
    ]
    .into_iter()
    .enumerate()
    {
        let bytes = pem(kind)?;
        let path = dir.join(format!("key{i}.pem"));
        crate::files::create_new(&path, &bytes)?;
        isolated.push((keys.load(keyfence::sign::key_process::KeySource::File(path))?, alg));
        isolated.push((keys.load(keyfence::sign::key_process::KeySource::Bytes(bytes))?, alg));
    }
    let local = vec![
        (Arc::new(PrivateKey::generate(KeyKind::EcP256)?), Algorithm::EcdsaP256Sha256),
        (Arc::new(PrivateKey::generate(KeyKind::Rsa { bits: 2048 })?), Algorithm::RsaPkcs1Sha256),
    ];
    let all: Vec<(Arc<PrivateKey>, Algorithm)> = isolated.iter().cloned().chain(local).collect();
    let engine = Engine::new(EngineConfig::default())?;

    let store_dir = dir.join("store");
    Authority::init(Arc::new(FileStore::open(&store_dir)?))?;
    let attrs: Attributes = "region=EU,tier=gold".parse()?;
    let machine_key = Authority::open(Arc::new(FileStore::open(&store_dir)?))?.issue(&attrs)?;
    let machine_key_bytes = machine_key.to_bytes();

    let stop = Arc::new(AtomicBool::new(false));
    let sign = Arc::new(Tally::default());
    let wraps = Arc::new(Tally::default());
    let opens = Arc::new(Tally::default());
    let wrapped: HandedOut = Arc::default();
    let deadline = Duration::from_millis(args.deadline_ms);
    let mut threads = Vec::new();

    for t in 0..args.threads.max(1) {
        let (engine, all, stop, tally) = (engine.clone(), all.clone(), stop.clone(), sign.clone());
        threads.push(std::thread::spawn(move || {
            let mut n = t;
            while !stop.load(Ordering::Relaxed) {
                let (key, alg) = &all[n % all.len()];
                n += 1;
                let msg = format!("soak {n}").into_bytes();
                let start = Instant::now();
                let result = engine.submit(Request::sign(key.clone(), *alg, msg.clone()).with_timeout(deadline)).and_then(|f| f.wait());
                let took = start.elapsed();
                if took > deadline + LATE_SLACK {
                    tally.late.fetch_add(1, Ordering::Relaxed);
                }
                let overrun = took.saturating_sub(deadline).as_micros() as u64;
                tally.max_overrun_us.fetch_max(overrun, Ordering::Relaxed);
                match result {
                    Ok(sig) if n % 50 != 0 || verifies(key, *alg, &msg, &sig) => {
                        tally.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => tally.fail("bad_signature".into()),
                    Err(e) => tally.fail(kind_of(&e)),
                }
            }
        }));
    }
    for w in 0..2 {
        let (store_dir, stop, tally, wrapped) = (store_dir.clone(), stop.clone(), wraps.clone(), wrapped.clone());
        threads.push(std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                // A policy per few envelopes: some wraps make a policy key.
                let policy = format!("region: EU and tier: gold or team: t{w}x{}", n / 4);
                let secret = format!("secret {w} {n}").into_bytes();
                let done = FileStore::open(&store_dir)
                    .map_err(|e| e.to_string())
                    .and_then(|s| Authority::open(Arc::new(s)).map_err(|e| e.to_string()))
                    .and_then(|mut a| a.wrap(&policy, &secret).map_err(|e| e.to_string()));
                match done {
                    Ok(env) => {
                        tally.ok.fetch_add(1, Ordering::Relaxed);
                        wrapped.lock().unwrap_or_else(|e| e.into_inner()).push((env.to_bytes().to_vec(), secret));
                    }
                    Err(e) => tally.fail(format!("wrap: {e}")),
                }
            }
        }));
    }
    for _ in 0..2 {
        let (store_dir, stop, tally, wrapped) = (store_dir.clone(), stop.clone(), opens.clone(), wrapped.clone());
        let mk = machine_key_bytes.clone();
        threads.push(std::thread::spawn(move || {
            let machine = match (keyfence::wrap::MachineKey::from_bytes(&mk), FileStore::open(&store_dir)) {
                (Ok(k), Ok(s)) => Machine::new(k, Arc::new(s), CacheConfig::default()),
                _ => return tally.fail("open: cannot set up the machine".into()),
            };
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let pick = {
                    let w = wrapped.lock().unwrap_or_else(|e| e.into_inner());
                    (!w.is_empty()).then(|| w[n % w.len()].clone())
                };
                n += 7;
                let Some((env, secret)) = pick else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                match machine.open(&env) {
                    Ok(s) if s[..] == secret[..] => {
                        tally.ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => tally.fail("open: wrong secret".into()),
                    Err(e) => tally.fail(format!("open: {e}")),
                }
            }
        }));
    }

    // The killer, on this thread: the key process's peak memory is read
    // just before each kill.
    let started = Instant::now();
    let end = started + Duration::from_secs(args.seconds);
    let mut kills = 0u64;
    let mut key_process_peak_kb = 0u64;
    let mut next_kill = started + Duration::from_millis(args.kill_every_ms);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20).min(end.saturating_duration_since(Instant::now())));
        if Instant::now() >= next_kill {
            next_kill += Duration::from_millis(args.kill_every_ms);
            if let Some(pid) = keys.pid() {
                key_process_peak_kb = key_process_peak_kb.max(peak_rss_kb(&pid.to_string()));
                let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
                if killed.is_ok_and(|s| s.success()) {
                    kills += 1;
                }
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let elapsed = started.elapsed();

    // Nothing lost: every key signs once the key process is back, and
    // every envelope handed out opens.
    keys.wait_running(Duration::from_secs(10));
    if let Some(pid) = keys.pid() {
        key_process_peak_kb = key_process_peak_kb.max(peak_rss_kb(&pid.to_string()));
    }
    let lost_keys = all
        .iter()
        .filter(|(key, alg)| {
            let msg = b"after the soak";
            !engine
                .submit(Request::sign(key.clone(), *alg, msg.to_vec()).with_timeout(Duration::from_secs(10)))
                .and_then(|f| f.wait())
                .is_ok_and(|sig| verifies(key, *alg, msg, &sig))
        })
        .count();
    let machine = Machine::new(
        keyfence::wrap::MachineKey::from_bytes(&machine_key_bytes)?,
        Arc::new(FileStore::open(&store_dir)?),
        CacheConfig::default(),
    );
    let envelopes = wrapped.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let lost_envelopes = envelopes.iter().filter(|(env, secret)| !machine.open(env).is_ok_and(|s| s[..] == secret[..])).count();

    let failed = |t: &Tally| t.failed.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let late = sign.late.load(Ordering::Relaxed);
    let report = serde_json::json!({
        "seconds": elapsed.as_secs_f64(),
        "signing_threads": args.threads,
        "deadline_ms": args.deadline_ms,
        "kills": kills,
        "restarts": keys.restarts(),
        "operations": {
            "sign": sign.ok.load(Ordering::Relaxed),
            "wrap": wraps.ok.load(Ordering::Relaxed),
            "open": opens.ok.load(Ordering::Relaxed),
        },
        "failed": {
            "sign": failed(&sign),
            "wrap": failed(&wraps),
            "open": failed(&opens),
        },
        "lost_keys": lost_keys,
        "lost_envelopes": lost_envelopes,
        "envelopes_checked": envelopes.len(),
        "peak_rss_kb": peak_rss_kb("self"),
        "key_process_peak_rss_kb": key_process_peak_kb,
        "late_calls": late,
        "max_overrun_ms": sign.max_overrun_us.load(Ordering::Relaxed) as f64 / 1e3,
    });
    outln!("{report}");
    Ok(if lost_keys == 0 && lost_envelopes == 0 && late == 0 { ExitCode::SUCCESS } else { ExitCode::from(crate::exit::FAILURE) })
}

/// Checks a signature with the key's public half (a sample of them: a
/// failure that returns a wrong signature must show).
fn verifies(key: &PrivateKey, alg: Algorithm, msg: &[u8], sig: &[u8]) -> bool {
    use openssl::hash::MessageDigest;
    use openssl::sign::{RsaPssSaltlen, Verifier};
    let Ok(public) = key.public_key_der().map_err(|_| ()).and_then(|d| PKey::public_key_from_der(&d).map_err(|_| ())) else {
        return false;
    };
    let v = match alg {
        Algorithm::Ed25519 => Verifier::new_without_digest(&public),
        _ => Verifier::new(MessageDigest::sha256(), &public),
    };
    let Ok(mut v) = v else { return false };
    if alg == Algorithm::RsaPssSha256
        && (v.set_rsa_padding(openssl::rsa::Padding::PKCS1_PSS).is_err() || v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).is_err())
    {
        return false;
    }
    v.verify_oneshot(sig, msg).unwrap_or(false)
}
