//! `keyfence sign` (one signature through the engine) and `keyfence bench
//! sign` (the engine against BoringSSL called directly, side by side).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use boring::hash::MessageDigest;
use boring::pkey::{PKey, Private};
use boring::rsa::Padding;
use boring::sign::{RsaPssSaltlen, Signer};
use clap::Args;
use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyKind, PrivateKey, Request};
use zeroize::Zeroizing;

/// The algorithms `keyfence sign` offers (the list).
const CLI_ALGS: [Algorithm; 6] = [
    Algorithm::RsaPkcs1Sha256,
    Algorithm::RsaPkcs1Sha384,
    Algorithm::RsaPssSha256,
    Algorithm::EcdsaP256Sha256,
    Algorithm::EcdsaP384Sha384,
    Algorithm::Ed25519,
];

/// `keyfence sign`.
#[derive(Args)]
pub struct SignArgs {
    /// Private key, PEM or DER (PKCS#1, PKCS#8 or SEC1).
    #[arg(long)]
    key: PathBuf,
    /// rsa-pkcs1-sha256, rsa-pkcs1-sha384, rsa-pss-sha256, ecdsa-p256-sha256,
    /// ecdsa-p384-sha384 or ed25519.
    #[arg(long)]
    alg: String,
    /// The message to sign.
    #[arg(long = "in")]
    input: PathBuf,
    /// Where to write the signature: raw for RSA and Ed25519, DER for ECDSA
    /// (what `openssl dgst -verify` and `openssl pkeyutl -verify` read).
    #[arg(long)]
    out: PathBuf,
    /// The input is a digest of the message (not for ed25519).
    #[arg(long)]
    digest: bool,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
}

/// Runs `keyfence sign`.
pub fn sign(args: SignArgs) -> Result<ExitCode> {
    let alg: Algorithm = args.alg.parse()?;
    if !CLI_ALGS.contains(&alg) {
        bail!(
            "--alg {alg} is not offered here; use one of {}",
            CLI_ALGS.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
        );
    }
    // The key file's bytes are secret: keep them in a zeroizing buffer.
    let key_bytes =
        Zeroizing::new(std::fs::read(&args.key).with_context(|| format!("reading {}", args.key.display()))?);
    let key = PrivateKey::from_bytes(&key_bytes).with_context(|| format!("loading {}", args.key.display()))?;
    drop(key_bytes);
    if !key.kind().supports(alg) {
        bail!("{alg} cannot be used with {} key ({})", key.kind(), args.key.display());
    }
    let input = std::fs::read(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let key = Arc::new(key);
    let req = if args.digest { Request::sign_digest(key, alg, input) } else { Request::sign(key, alg, input) }
        .with_timeout(Duration::from_millis(args.timeout_ms));
    let engine = Engine::new(EngineConfig::default())?;
    let sig = engine.submit(req)?.wait()?;
    std::fs::write(&args.out, &sig[..]).with_context(|| format!("writing {}", args.out.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// `keyfence bench sign`.
#[derive(Args)]
pub struct BenchSignArgs {
    /// One JSON object per line: alg, path, ops_per_s, p50_us, p99_us.
    #[arg(long)]
    json: bool,
    /// Seconds per measurement (throughput and latency, per path).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Signing threads for both paths (default: the available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Only these cases (rsa2048-pkcs1-sha256, rsa2048-pss-sha256,
    /// ecdsa-p256-sha256, ecdsa-p384-sha384, ed25519); repeatable.
    #[arg(long = "case")]
    cases: Vec<String>,
}

struct Case {
    name: &'static str,
    alg: Algorithm,
    kind: KeyKind,
}

const CASES: [Case; 5] = [
    Case { name: "rsa2048-pkcs1-sha256", alg: Algorithm::RsaPkcs1Sha256, kind: KeyKind::Rsa { bits: 2048 } },
    Case { name: "rsa2048-pss-sha256", alg: Algorithm::RsaPssSha256, kind: KeyKind::Rsa { bits: 2048 } },
    Case { name: "ecdsa-p256-sha256", alg: Algorithm::EcdsaP256Sha256, kind: KeyKind::EcP256 },
    Case { name: "ecdsa-p384-sha384", alg: Algorithm::EcdsaP384Sha384, kind: KeyKind::EcP384 },
    Case { name: "ed25519", alg: Algorithm::Ed25519, kind: KeyKind::Ed25519 },
];

/// A TLS 1.3 CertificateVerify input is about this long.
const MSG: [u8; 130] = [0x20; 130];

/// BoringSSL called directly, the way a program without keyfence would:
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
    use boring::ec::{EcGroup, EcKey};
    use boring::nid::Nid;
    Ok(match kind {
        KeyKind::Rsa { bits } => PKey::from_rsa(boring::rsa::Rsa::generate(bits)?)?,
        KeyKind::EcP256 | KeyKind::EcP384 => {
            let nid = if kind == KeyKind::EcP256 { Nid::X9_62_PRIME256V1 } else { Nid::SECP384R1 };
            let group = EcGroup::from_curve_name(nid)?;
            PKey::from_ec_key(EcKey::generate(&group)?)?
        }
        KeyKind::Ed25519 => PKey::generate(boring::pkey::Id::ED25519)?,
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
        handles.into_iter().try_for_each(|h| h.join().expect("bench thread panicked"))
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
    let submit_batch = || -> Result<Arc<AtomicUsize>> {
        let remaining = Arc::new(AtomicUsize::new(BATCH));
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
}

/// Runs `keyfence bench sign`.
pub fn bench(args: BenchSignArgs) -> Result<ExitCode> {
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    if !(args.seconds > 0.0 && args.seconds <= 600.0) {
        bail!("--seconds must be in (0, 600]");
    }
    let dur = Duration::from_secs_f64(args.seconds);
    for c in &args.cases {
        if !CASES.iter().any(|k| k.name == c) {
            bail!("unknown case {c}; known: {}", CASES.iter().map(|k| k.name).collect::<Vec<_>>().join(", "));
        }
    }
    let mut config = EngineConfig::default();
    config.rsa.threads = threads;
    config.ec.threads = threads;
    let engine = Engine::new(config)?;
    if !args.json {
        println!("{threads} signing threads per path, {:.1} s per measurement", args.seconds);
        println!(
            "{:<22} {:<7} {:>11} {:>9} {:>9}   {:>16} {:>15}",
            "alg", "path", "ops_per_s", "p50_us", "p99_us", "engine/raw ops", "added p50_us"
        );
    }
    for case in CASES.iter().filter(|c| args.cases.is_empty() || args.cases.iter().any(|n| n == c.name)) {
        let pkey = generate(case.kind)?;
        let key = Arc::new(PrivateKey::from_der(&Zeroizing::new(pkey.private_key_to_der_pkcs8()?))?);
        // Warm up both paths (threads, caches, CPU frequency).
        raw_throughput(&pkey, case.alg, threads, Duration::from_millis(200))?;
        engine_throughput(&engine, &key, case.alg, Duration::from_millis(200))?;

        // Throughput with every core busy, alternating halves so that
        // machine noise drifting over the run hits both paths alike.
        let (mut raw_ops, mut raw_time, mut eng_ops, mut eng_time) = (0, Duration::ZERO, 0, Duration::ZERO);
        for _ in 0..2 {
            let t = Instant::now();
            raw_ops += raw_throughput(&pkey, case.alg, threads, dur / 2)?;
            raw_time += t.elapsed();
            let (n, e) = engine_throughput(&engine, &key, case.alg, dur / 2)?;
            eng_ops += n;
            eng_time += e;
        }

        // Latency of one operation at a time, issued back to back, in
        // alternating blocks of raw and engine operations (drift hits both).
        // The caller blocks in `wait`, as a thread without an event loop
        // would. (After the engine has been idle for a while, the first
        // operation also pays for waking a parked worker: see
        // docs/signing.md.)
        const BLOCK: usize = 32;
        let (mut raw_lat, mut eng_lat) = (Vec::new(), Vec::new());
        let start = Instant::now();
        while start.elapsed() < dur || raw_lat.len() < 4 * BLOCK {
            for _ in 0..BLOCK {
                let t = Instant::now();
                std::hint::black_box(raw_sign(&pkey, case.alg)?);
                raw_lat.push(t.elapsed());
            }
            for _ in 0..BLOCK {
                let t = Instant::now();
                std::hint::black_box(engine.sign(&key, case.alg, &MSG)?.wait()?);
                eng_lat.push(t.elapsed());
            }
        }
        raw_lat.sort();
        eng_lat.sort();
        let raw = Figures {
            ops_per_s: raw_ops as f64 / raw_time.as_secs_f64(),
            p50_us: percentile(&raw_lat, 0.5),
            p99_us: percentile(&raw_lat, 0.99),
        };
        let eng = Figures {
            ops_per_s: eng_ops as f64 / eng_time.as_secs_f64(),
            p50_us: percentile(&eng_lat, 0.5),
            p99_us: percentile(&eng_lat, 0.99),
        };
        for (path, f) in [("raw", &raw), ("engine", &eng)] {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "alg": case.name,
                        "path": path,
                        "ops_per_s": (f.ops_per_s * 10.0).round() / 10.0,
                        "p50_us": (f.p50_us * 100.0).round() / 100.0,
                        "p99_us": (f.p99_us * 100.0).round() / 100.0,
                    })
                );
            } else {
                let extra = if path == "engine" {
                    format!("{:>16.3} {:>15.1}", eng.ops_per_s / raw.ops_per_s, eng.p50_us - raw.p50_us)
                } else {
                    String::new()
                };
                println!(
                    "{:<22} {:<7} {:>11.0} {:>9.1} {:>9.1}   {extra}",
                    case.name, path, f.ops_per_s, f.p50_us, f.p99_us
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
