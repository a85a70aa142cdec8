//! `keyfence offload probe`: what an operator asks before turning the
//! device on, answered by the library itself: whether crypto_mb opens
//! here, its version, and which of keyfence's algorithms it runs on this
//! CPU, so that `auto` choosing software is never a surprise found in a
//! benchmark.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use keyfence::sign::offload::{MultiBufferConfig, MultiBufferDevice};

use crate::files::outln;

/// `keyfence offload ...`.
#[derive(Subcommand)]
pub enum OffloadCmd {
    /// Whether Intel's crypto_mb opens here and which algorithms it runs
    /// on this CPU (docs/offload.md). Exits 0 when it runs at least one,
    /// 1 when it opens but runs none (a CPU without AVX-512 IFMA), 3 when
    /// it cannot be opened.
    Probe(ProbeArgs),
}

/// `keyfence offload probe`.
#[derive(Args)]
pub struct ProbeArgs {
    /// crypto_mb's library (a path, or a name the loader finds). Default:
    /// KEYFENCE_CRYPTO_MB, else libcrypto_mb.so.13.
    #[arg(long)]
    crypto_mb: Option<String>,
    /// One JSON object: library, version, applicable, algorithms.
    #[arg(long)]
    json: bool,
}

/// Runs `keyfence offload ...`.
pub fn run(cmd: OffloadCmd) -> Result<ExitCode> {
    let OffloadCmd::Probe(args) = cmd;
    let mut config = MultiBufferConfig::default();
    if let Some(l) = args.crypto_mb {
        config.library = l;
    }
    let info = MultiBufferDevice::probe(&config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let runs = info.algorithms.iter().any(|(_, r)| *r);
    if args.json {
        let algorithms: serde_json::Map<String, serde_json::Value> =
            info.algorithms.iter().map(|(name, r)| (name.clone(), serde_json::Value::Bool(*r))).collect();
        outln!(
            "{}",
            serde_json::json!({
                "library": info.library,
                "version": info.version,
                "applicable": info.applicable,
                "algorithms": algorithms,
            })
        );
    } else {
        outln!("library      {}", info.library);
        outln!("version      {}", info.version);
        for (name, r) in &info.algorithms {
            outln!("{name:<12} {}", if *r { "runs on this CPU" } else { "does not run on this CPU" });
        }
        if !runs {
            outln!("auto signs in software here: crypto_mb needs AVX-512 IFMA (grep -c avx512ifma /proc/cpuinfo)");
        }
    }
    Ok(if runs { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
