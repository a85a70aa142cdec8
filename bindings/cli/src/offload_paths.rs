//! The offload paths of `keyfence bench sign`.
//!
//! - `offload-sim`: the engine on the offload backend with a simulated
//!   device that adds no latency of its own and signs in software on
//!   `threads` device threads, so the figure is the cost of the
//!   asynchronous offload path itself (routing, batching, completion), not
//!   of any hardware.
//! - `multibuffer` and `isolated-multibuffer`: Intel's crypto_mb, eight
//!   signatures a call, in this process and in the key process. Without a
//!   library that runs on this CPU they fail, saying why, rather than
//!   measure software under the device's name.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use keyfence::sign::key_process::KeyProcess;
use keyfence::sign::offload::{
    MultiBufferConfig, MultiBufferDevice, OffloadBackend, OffloadConfig, OffloadMode, Route, Routing, SimConfig, SimDevice,
};
use keyfence::sign::{Engine, EngineConfig};

/// An engine whose every operation the simulated device can do (RSA,
/// ECDSA) goes to it.
pub fn sim_engine(config: EngineConfig, threads: usize) -> Result<Engine> {
    let mut sim = SimConfig::default();
    sim.latency = Duration::ZERO;
    sim.engines = threads;
    let mut offload = OffloadConfig::default();
    offload.routing = Routing::all(Route::Device);
    let backend = OffloadBackend::with_device(Arc::new(SimDevice::new(sim)?), offload)?;
    Ok(Engine::with_backend(config, Arc::new(backend))?)
}

/// crypto_mb's settings for `library` (`None`: `KEYFENCE_CRYPTO_MB`, else
/// `libcrypto_mb.so.13`), with `threads` device threads.
fn multibuffer_config(library: Option<&str>, threads: usize) -> MultiBufferConfig {
    let mut config = MultiBufferConfig::default();
    if let Some(l) = library {
        config.library = l.to_string();
    }
    config.threads = threads;
    config
}

/// An engine whose RSA and ECDSA go to crypto_mb's device, in this process.
pub fn multibuffer_engine(config: EngineConfig, library: Option<&str>, threads: usize) -> Result<Engine> {
    let device =
        MultiBufferDevice::open(&multibuffer_config(library, threads)).context("--path multibuffer needs crypto_mb running on this CPU")?;
    let mut offload = OffloadConfig::default();
    offload.routing = Routing::all(Route::Device);
    offload.batch_size = keyfence::sign::offload::Device::max_batch(&*device);
    let backend = OffloadBackend::with_device(device, offload)?;
    Ok(Engine::with_backend(config, Arc::new(backend))?)
}

/// A key process that signs on crypto_mb's device (mode `on`: it does not
/// start where the device cannot run), and one that never does, so that
/// `isolated` measures software wherever the library is installed.
pub fn key_process(threads: usize, multibuffer: Option<Option<&str>>) -> Result<KeyProcess> {
    let mut config = crate::key_process::key_process_config(threads, false)?;
    match multibuffer {
        Some(library) => {
            config.offload = OffloadMode::On;
            config.crypto_mb = library.map(str::to_string);
        }
        None => config.offload = OffloadMode::Off,
    }
    KeyProcess::start(config).context(if multibuffer.is_some() {
        "--path isolated-multibuffer needs crypto_mb running on this CPU"
    } else {
        "starting the key process"
    })
}
