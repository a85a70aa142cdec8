//! The `offload-sim` path of `keyfence bench sign`: the engine on the
//! offload backend with a simulated device. The device adds no latency of
//! its own and signs in software on `threads` device threads, so the figure
//! is the cost of the asynchronous offload path itself (routing, batching,
//! completion), not of any hardware.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use keyfence::sign::offload::{OffloadBackend, OffloadConfig, Route, Routing, SimConfig, SimDevice};
use keyfence::sign::{Engine, EngineConfig};

/// An engine whose every operation the simulated device can do (RSA,
/// ECDSA) goes to it.
pub fn engine(config: EngineConfig, threads: usize) -> Result<Engine> {
    let mut sim = SimConfig::default();
    sim.latency = Duration::ZERO;
    sim.engines = threads;
    let mut offload = OffloadConfig::default();
    offload.routing = Routing::all(Route::Device);
    let backend = OffloadBackend::with_device(Arc::new(SimDevice::new(sim)?), offload)?;
    Ok(Engine::with_backend(config, Arc::new(backend))?)
}
