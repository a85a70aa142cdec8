//! `keyfence pkcs11`: make a key in a PKCS#11 token, and read a token
//! key's public half (docs/pkcs11.md).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use keyfence::sign::pkcs11::{self, Pkcs11Settings};
use keyfence::sign::KeyKind;

use crate::exit;
use crate::files::Output;

/// `keyfence pkcs11 ...`.
#[derive(Subcommand)]
pub enum Pkcs11Cmd {
    /// Generate a key pair in the token the URI names, labelled with its
    /// `object` (and `id`): the private key sensitive and not extractable.
    /// Writes the public key (PEM).
    Keygen(KeygenArgs),
    /// Write the public key (PEM) of the token key the URI names, read
    /// from the token, for a certificate request or a client's
    /// `--public-key`.
    Public(PublicArgs),
}

/// `keyfence pkcs11 keygen`.
#[derive(Args)]
pub struct KeygenArgs {
    /// The new key's RFC 7512 URI (`pkcs11:token=edge;object=tls-p256`);
    /// module and PIN as for `keyfence sign --key`.
    #[arg(long)]
    uri: String,
    /// ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096 or ed25519.
    #[arg(long = "type")]
    kind: String,
    /// Where to write the public key (`-`: standard output).
    #[arg(long, default_value = "-")]
    out: PathBuf,
}

/// `keyfence pkcs11 public`.
#[derive(Args)]
pub struct PublicArgs {
    /// The key's RFC 7512 URI.
    #[arg(long)]
    uri: String,
    /// Where to write the public key (`-`: standard output).
    #[arg(long, default_value = "-")]
    out: PathBuf,
}

/// Runs `keyfence pkcs11 ...`.
pub fn run(cmd: Pkcs11Cmd) -> Result<ExitCode> {
    let settings = Pkcs11Settings::from_env();
    let (der, out) = match cmd {
        Pkcs11Cmd::Keygen(a) => {
            let kind = match a.kind.as_str() {
                "ec-p256" => KeyKind::EcP256,
                "ec-p384" => KeyKind::EcP384,
                "rsa-2048" => KeyKind::Rsa { bits: 2048 },
                "rsa-3072" => KeyKind::Rsa { bits: 3072 },
                "rsa-4096" => KeyKind::Rsa { bits: 4096 },
                "ed25519" => KeyKind::Ed25519,
                other => {
                    return Err(exit::input(format!(
                        "unknown key type `{other}`; known: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096, ed25519"
                    )))
                }
            };
            let out = Output::new(&a.out, &[])?;
            (pkcs11::generate(&a.uri, kind, &settings).context("generating the key in the token")?, out)
        }
        Pkcs11Cmd::Public(a) => {
            let out = Output::new(&a.out, &[])?;
            (pkcs11::load(&a.uri, &settings).context("loading the token's key")?.public_key_der()?, out)
        }
    };
    let pem = openssl::pkey::PKey::public_key_from_der(&der).and_then(|k| k.public_key_to_pem()).context("encoding the public key")?;
    out.write_public(&pem)?;
    Ok(ExitCode::SUCCESS)
}

/// `keyfence bench pkcs11`.
#[derive(Args)]
pub struct BenchPkcs11Args {
    /// The token key to sign with (docs/pkcs11.md).
    #[arg(long)]
    uri: String,
    /// The signature algorithm.
    #[arg(long, default_value = "ecdsa-p256-sha256")]
    alg: String,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Rounds; each measures both paths, in alternating order.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Threads calling the token: the direct loop's, and the engine's
    /// token class (default: the cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Operations the engine's caller keeps in flight.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// One JSON object per round and one summary line.
    #[arg(long)]
    json: bool,
}

/// `keyfence bench pkcs11`: signatures per CPU-second with a token key
/// through the engine (its token class, `in_flight` outstanding) against
/// the same token called directly on as many threads (the floor: no queue,
/// no hand-off), alternated in one run so both see the same machine.
pub fn bench(args: BenchPkcs11Args) -> Result<ExitCode> {
    use keyfence::sign::key_process::KeySource;
    use keyfence::sign::managed::{ManagedConfig, ManagedEngine};
    use keyfence::sign::{Algorithm, ClassConfig, Request};
    use std::time::{Duration, Instant};

    let alg: Algorithm = args.alg.parse().map_err(|e| exit::input(format!("{e}")))?;
    if !(args.seconds > 0.0 && args.seconds <= 600.0) || args.rounds == 0 || args.in_flight == 0 {
        return Err(exit::input("--seconds must be in (0, 600], --rounds and --in-flight at least 1"));
    }
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let duration = Duration::from_secs_f64(args.seconds);
    let settings = Pkcs11Settings::from_env();
    let mut config = ManagedConfig::default();
    config.engine.token = ClassConfig { threads, queue_capacity: 4 * args.in_flight.max(threads) };
    let engine = ManagedEngine::start(config)?;
    let key = engine.load(KeySource::Pkcs11(args.uri.clone())).context("loading the token's key")?;
    let cpu = || crate::remote_cmd::cpu_of("self");
    let engine_run = || -> Result<(u64, Duration, Duration)> {
        let (start, cpu0) = (Instant::now(), cpu());
        let mut pending = std::collections::VecDeque::new();
        let mut done = 0u64;
        let mut i = 0u64;
        while start.elapsed() < duration {
            while pending.len() < args.in_flight {
                i += 1;
                pending.push_back(engine.submit(Request::sign(key.clone(), alg, i.to_be_bytes().to_vec()))?);
            }
            if let Some(f) = pending.pop_front() {
                f.wait()?;
                done += 1;
            }
        }
        for f in pending {
            f.wait()?;
            done += 1;
        }
        Ok((done, start.elapsed(), cpu() - cpu0))
    };
    let direct_run = || -> Result<(u64, Duration, Duration)> {
        let (start, cpu0) = (Instant::now(), cpu());
        let n = keyfence::sign::pkcs11::direct_sign_loop(&args.uri, &settings, alg, threads, duration)?;
        Ok((n, start.elapsed(), cpu() - cpu0))
    };
    let per_cpu = |(n, _, c): (u64, Duration, Duration)| n as f64 / c.max(Duration::from_millis(10)).as_secs_f64();
    let per_s = |(n, w, _): (u64, Duration, Duration)| n as f64 / w.as_secs_f64();
    let mut ratios = Vec::new();
    for round in 0..args.rounds {
        let (e, d) = if round % 2 == 0 {
            let e = engine_run()?;
            (e, direct_run()?)
        } else {
            let d = direct_run()?;
            (engine_run()?, d)
        };
        let ratio = per_cpu(e) / per_cpu(d);
        ratios.push(ratio);
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "round": round, "alg": alg.name(), "threads": threads, "in_flight": args.in_flight,
                    "keyfence_per_s": per_s(e).round(), "direct_per_s": per_s(d).round(),
                    "keyfence_per_cpu_s": per_cpu(e).round(), "direct_per_cpu_s": per_cpu(d).round(),
                    "per_cpu_ratio": (ratio * 1000.0).round() / 1000.0,
                })
            );
        } else {
            println!(
                "round {round}: keyfence {:.0}/s ({:.0}/CPU-s), direct {:.0}/s ({:.0}/CPU-s), per CPU-second {ratio:.3}x",
                per_s(e),
                per_cpu(e),
                per_s(d),
                per_cpu(d)
            );
        }
    }
    ratios.sort_by(|a, b| a.total_cmp(b));
    let median = ratios[ratios.len() / 2];
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "summary": true, "alg": alg.name(), "median_per_cpu_ratio": (median * 1000.0).round() / 1000.0, "target": 1.0 })
        );
    } else {
        println!("median per CPU-second: {median:.3}x the token called directly (target 1.0x)");
    }
    Ok(ExitCode::SUCCESS)
}
