//! Offloading private-key operations to an accelerator (Intel QAT), with a
//! simulated device for machines without one.
//!
//! Fastly's seed reports up to 5% less CPU in its TLS terminator once RSA
//! went to QAT, and that only because signing had already become
//! asynchronous: an accelerator answers in batches, later, on its own
//! threads. This module plugs such a device into the engine's
//! [`Backend`](crate::sign::Backend) interface:
//!
//! - [`OffloadBackend`]: per-algorithm [`Routing`] (RSA signatures and
//!   decryption to the device by default; ECDSA P-256/P-384 and Ed25519 in
//!   software unless routed otherwise); device requests are batched
//!   ([`OffloadConfig::batch_size`], [`OffloadConfig::batch_window`]) and
//!   completed asynchronously; in-flight requests are bounded
//!   ([`OffloadConfig::max_in_flight`]); on device failure an operation
//!   falls back to software or fails cleanly ([`OnDeviceError`]); counters
//!   in [`OffloadStats`].
//! - [`OffloadMode`]: `off`, `on` or `auto`, for
//!   [`OffloadBackend::start`]. `on` fails at start when no QAT device can
//!   be used; `auto` then runs in software and says why
//!   ([`OffloadBackend::software_reason`]).
//! - [`Device`]: the object-safe device interface (batches in, one
//!   completion per request out); `SimDevice` (behind the `bench` feature) implements it with
//!   configurable latency, batch size, in-flight limit and failure
//!   injection, and computes real signatures in software, so tests run the
//!   asynchronous path, batching and device failure in flight on any
//!   machine.
//! - `qat` (behind the `qat` cargo feature): QATlib (`libqat.so.4`) is
//!   opened at run time with `dlopen`; there is no link-time dependency and
//!   no install step that fetches it. Without the feature, mode `on` fails
//!   saying the build lacks it and `auto` runs in software.
//!
//! # What has and has not been tested on hardware
//!
//! Nothing in this module has run on a QAT device: none was available
//! where it was written. Concretely:
//!
//! - Tested (on machines without QAT): the whole asynchronous path with
//!   `SimDevice` (behind the `bench` feature), namely routing, batching, completions, the in-flight
//!   bound, deadlines, device failure in flight with both [`OnDeviceError`]
//!   settings, and the mode logic (`auto` without QAT runs in software, `on`
//!   fails with a clear error). With the `qat` feature: QATlib discovery
//!   against a missing library and against stub libraries (no instance,
//!   cannot start, no allocator, instances present), and the QAT RSA path,
//!   [`QatDevice`], against a stub QATlib that implements
//!   `cpaCyRsaDecrypt` in software with OpenSSL and answers from
//!   `icp_sal_CyPollInstance`: PKCS #1 v1.5, PSS and raw decryption
//!   through the engine, verified with the public key; a device that
//!   returns wrong results (caught by the public-key check, then software);
//!   a full ring (`CPA_STATUS_RETRY`, then software); failed callbacks.
//! - Not tested: anything against real QATlib or a real device. The
//!   structure layouts and function signatures come from QATlib's public
//!   headers (`cpa.h`, `cpa_cy_common.h`, `cpa_cy_im.h`, `cpa_cy_rsa.h`,
//!   `icp_sal_user.h`, `icp_sal_poll.h`, `qae_mem.h`) and were checked
//!   only against the stub, which was written from the same headers. How
//!   QATlib behaves under load (ring sizes, response latency, the polling
//!   interval that suits it) is unmeasured.
//! - Not done: ECDSA on QAT (QAT has it; routing sends ECDSA to software
//!   unless told otherwise, and [`QatDevice`] declines it, so it falls
//!   back to software), and per-key caching of the pinned CRT components
//!   (they are copied per request).
//!
//! ```
//! use std::sync::Arc;
//! use keyfence::sign::{Algorithm, Engine, EngineConfig, KeyKind, PrivateKey};
//! use keyfence::sign::offload::{OffloadBackend, OffloadConfig, OffloadMode};
//!
//! let mode: OffloadMode = "auto".parse()?;
//! let offload = OffloadBackend::start(mode, OffloadConfig::default())?;
//! // On a machine without QAT (or without the `qat` feature), software:
//! if offload.device_name().is_none() {
//!     println!("{}", offload.software_reason().unwrap_or_default());
//! }
//! let engine = Engine::with_backend(EngineConfig::default(), Arc::new(offload))?;
//! let key = Arc::new(PrivateKey::generate(KeyKind::Rsa { bits: 2048 })?);
//! let signature = engine.sign(&key, Algorithm::RsaPssSha256, b"hello")?.wait()?;
//! assert_eq!(signature.len(), 256);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod batcher;
#[cfg(feature = "multibuffer")]
mod crypto_mb;
mod device;
mod dispatcher;
#[cfg(feature = "multibuffer")]
mod multibuffer;
#[cfg(feature = "qat")]
pub mod qat;
#[cfg(feature = "qat")]
mod qat_device;
mod routing;
mod rsa_encoding;
#[cfg(feature = "bench")]
mod sim;
mod stats;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "multibuffer")]
pub use crypto_mb::CryptoMbInfo;
pub use device::{CompletionFn, Device, DeviceCompletion, DeviceError, DeviceRequest};
pub(crate) use dispatcher::Callback;
pub use dispatcher::OffloadBackend;
#[cfg(feature = "multibuffer")]
pub use multibuffer::{MultiBufferConfig, MultiBufferDevice, MultiBufferStats, MultiBufferUnavailable};
#[cfg(feature = "qat")]
pub use qat_device::QatDevice;
pub use routing::{Route, Routing};
#[cfg(feature = "bench")]
pub use sim::{SimConfig, SimControl, SimDevice, SimStats};
pub use stats::OffloadStats;

use crate::sign::types::SignError;

/// Whether to sign on a device (a QAT card, else crypto_mb's multi-buffer
/// device where the CPU runs it): `off`, `on` or `auto`.
///
/// ```
/// use keyfence::sign::offload::OffloadMode;
/// assert_eq!("auto".parse::<OffloadMode>().unwrap(), OffloadMode::Auto);
/// assert!("maybe".parse::<OffloadMode>().unwrap_err().to_string().contains("off, on or auto"));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum OffloadMode {
    /// Software only. The default of an engine made in process; the key
    /// process and the agent default to `Auto`.
    #[default]
    Off,
    /// A device; starting fails, saying why, if none can be used.
    On,
    /// A device if one can be used, else software (the reason is logged).
    Auto,
}

impl OffloadMode {
    /// `off`, `on` or `auto`.
    pub fn name(self) -> &'static str {
        match self {
            OffloadMode::Off => "off",
            OffloadMode::On => "on",
            OffloadMode::Auto => "auto",
        }
    }
}

impl fmt::Display for OffloadMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OffloadMode {
    type Err = SignError;

    /// Parses `off`, `on` or `auto` (ASCII case ignored).
    ///
    /// # Errors
    /// [`SignError::Config`] listing the three modes.
    fn from_str(s: &str) -> Result<Self, SignError> {
        match s.to_ascii_lowercase().as_str() {
            "off" => Ok(OffloadMode::Off),
            "on" => Ok(OffloadMode::On),
            "auto" => Ok(OffloadMode::Auto),
            _ => Err(SignError::Config(format!("unknown offload mode `{}`; expected off, on or auto", s.escape_debug()))),
        }
    }
}

/// What the backend does with an operation the device failed (a device
/// reset, a fault, a full device).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum OnDeviceError {
    /// Perform it in software on the backend's fallback threads. The
    /// default: a failing device costs CPU, not handshakes.
    #[default]
    Fallback,
    /// Answer it with a [`SignError::Backend`] error from backend `offload`
    /// that names the device.
    Fail,
}

/// Where QATlib is and how to register with it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QatConfig {
    /// The QATlib library to open: a file name searched the `dlopen` way
    /// (`LD_LIBRARY_PATH`, the system directories) or a path. Default
    /// `libqat.so.4`.
    pub library: String,
    /// The libraries tried, in order, for QATlib's memory allocator
    /// (`qaeMemAllocNUMA`) when `library` does not itself export it.
    /// Default `libusdm.so.0` (QATlib) and `libusdm_drv.so.0` (the
    /// out-of-tree QAT driver package).
    pub memory_libraries: Vec<String>,
    /// The process section name given to `icp_sal_userStart`. Default
    /// `SSL`, QATlib's default section.
    pub section: String,
}

impl Default for QatConfig {
    fn default() -> Self {
        QatConfig {
            library: "libqat.so.4".into(),
            memory_libraries: vec!["libusdm.so.0".into(), "libusdm_drv.so.0".into()],
            section: "SSL".into(),
        }
    }
}

/// How an [`OffloadBackend`] routes, batches and bounds its work.
///
/// ```
/// use std::time::Duration;
/// use keyfence::sign::offload::{OffloadConfig, OnDeviceError, Route};
/// let mut config = OffloadConfig::default();
/// config.routing.ecdsa_p256 = Route::Device;
/// config.on_device_error = OnDeviceError::Fail;
/// config.batch_window = Duration::from_micros(50);
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OffloadConfig {
    /// Which algorithms go to the device. Default [`Routing::default`]:
    /// RSA to the device, the rest in software.
    pub routing: Routing,
    /// What to do with operations the device fails. Default
    /// [`OnDeviceError::Fallback`].
    pub on_device_error: OnDeviceError,
    /// Operations outstanding at the device at most (lowered to the
    /// device's own limit). Beyond it, operations wait for room on their
    /// executor thread until their deadline. Default 1024.
    pub max_in_flight: usize,
    /// The largest batch handed to the device (lowered to the device's own
    /// limit). Default 32.
    pub batch_size: usize,
    /// How long a batch waits for more requests after its first before it
    /// goes to the device unfilled. This is latency added to a lone
    /// request; zero sends whatever has arrived at once. Default 100 µs.
    pub batch_window: Duration,
    /// Threads that perform operations in software after the device failed
    /// them ([`OnDeviceError::Fallback`]). Default 2.
    pub fallback_threads: usize,
    /// Where QATlib is (modes `on` and `auto`).
    pub qat: QatConfig,
    /// Where crypto_mb is, for the multi-buffer device that modes `on` and
    /// `auto` use where no QAT device is (`multibuffer` feature).
    #[cfg(feature = "multibuffer")]
    pub multibuffer: MultiBufferConfig,
}

impl Default for OffloadConfig {
    fn default() -> Self {
        OffloadConfig {
            routing: Routing::default(),
            on_device_error: OnDeviceError::default(),
            max_in_flight: 1024,
            batch_size: 32,
            batch_window: Duration::from_micros(100),
            fallback_threads: 2,
            qat: QatConfig::default(),
            #[cfg(feature = "multibuffer")]
            multibuffer: MultiBufferConfig::default(),
        }
    }
}

impl OffloadConfig {
    /// Checks the sizes: `max_in_flight` 1 to 1 048 576, `batch_size` 1 to
    /// 4096, `batch_window` at most 100 ms, `fallback_threads` 1 to 64.
    ///
    /// # Errors
    /// [`SignError::Config`] naming the first bad field.
    pub fn validate(&self) -> Result<(), SignError> {
        let bad = |m: String| Err(SignError::Config(format!("offload: {m}")));
        if !(1..=1 << 20).contains(&self.max_in_flight) {
            return bad(format!("max_in_flight must be 1 to 1048576, not {}", self.max_in_flight));
        }
        if !(1..=4096).contains(&self.batch_size) {
            return bad(format!("batch_size must be 1 to 4096, not {}", self.batch_size));
        }
        if self.batch_window > Duration::from_millis(100) {
            return bad(format!("batch_window must be at most 100 ms, not {:?}", self.batch_window));
        }
        if !(1..=64).contains(&self.fallback_threads) {
            return bad(format!("fallback_threads must be 1 to 64, not {}", self.fallback_threads));
        }
        Ok(())
    }
}

/// The device modes `on` and `auto` use: a QAT card where one can be
/// used, else the multi-buffer device where crypto_mb runs on this CPU;
/// otherwise why neither.
pub(crate) fn open_device(config: &OffloadConfig) -> Result<Arc<dyn Device>, QatUnavailable> {
    let qat = match open_qat(&config.qat) {
        Ok(device) => return Ok(device),
        Err(QatUnavailable::NotBuilt(why) | QatUnavailable::NoDevice(why)) => why,
    };
    #[cfg(feature = "multibuffer")]
    {
        match MultiBufferDevice::open(&config.multibuffer) {
            Ok(device) => Ok(device),
            Err(mb) => Err(QatUnavailable::NoDevice(format!("no QAT device ({qat}); and {mb}"))),
        }
    }
    #[cfg(not(feature = "multibuffer"))]
    Err(QatUnavailable::NoDevice(format!(
        "no QAT device ({qat}); and this build lacks the `multibuffer` cargo feature for Intel's crypto_mb"
    )))
}

/// What a key process or an agent signs with besides software: crypto_mb's
/// device where `mode` asks for it and the library runs here, opened in
/// two steps (the library before the key process's sandbox, the threads
/// after it).
pub(crate) struct ServerOffload {
    mode: OffloadMode,
    #[cfg(feature = "multibuffer")]
    loaded: Option<multibuffer::LoadedMultiBuffer>,
    /// Why software signs, when it does.
    reason: Option<String>,
}

impl ServerOffload {
    /// Opens the library `mode` asks for (`off`: none; `on` and `auto`:
    /// crypto_mb, as `library` names it or its default; a QAT card is
    /// for an engine in process, not yet for these servers).
    ///
    /// # Errors
    /// [`SignError::Backend`] (`Unavailable`) in mode `on` when crypto_mb
    /// cannot be used, saying why.
    pub(crate) fn prepare(mode: OffloadMode, library: Option<&str>) -> Result<ServerOffload, SignError> {
        if mode == OffloadMode::Off {
            return Ok(ServerOffload {
                mode,
                #[cfg(feature = "multibuffer")]
                loaded: None,
                reason: Some("offload mode is off".into()),
            });
        }
        #[cfg(feature = "multibuffer")]
        {
            let mut config = MultiBufferConfig::default();
            if let Some(l) = library {
                config.library = l.to_string();
            }
            match MultiBufferDevice::load(&config) {
                Ok(loaded) => Ok(ServerOffload { mode, loaded: Some(loaded), reason: None }),
                Err(why) if mode == OffloadMode::On => {
                    Err(SignError::backend("offload", crate::sign::BackendFailure::Unavailable, format!("offload mode `on`: {why}")))
                }
                Err(why) => Ok(ServerOffload { mode, loaded: None, reason: Some(format!("offload mode `auto` signs in software: {why}")) }),
            }
        }
        #[cfg(not(feature = "multibuffer"))]
        {
            let _ = library;
            let why = "this build lacks the `multibuffer` cargo feature for Intel's crypto_mb";
            match mode {
                OffloadMode::On => Err(SignError::Config(format!("offload mode `on`: {why}"))),
                _ => Ok(ServerOffload { mode, reason: Some(format!("offload mode `auto` signs in software: {why}")) }),
            }
        }
    }

    /// Why the server signs in software, when it does.
    pub(crate) fn software_reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// Starts the device (its threads, the backend's batching and
    /// fallback threads): the backend to hand operations to, or `None`
    /// for software. Every algorithm the device signs goes to it.
    ///
    /// # Errors
    /// [`SignError::Io`] for a thread that cannot start.
    pub(crate) fn start(self) -> Result<Option<OffloadBackend>, SignError> {
        let _ = self.mode;
        #[cfg(feature = "multibuffer")]
        if let Some(loaded) = self.loaded {
            let device = loaded.start().map_err(|e| SignError::io(crate::sign::types::Resource::Thread, e.to_string()))?;
            let config = OffloadConfig { routing: Routing::all(Route::Device), batch_size: device.max_batch(), ..OffloadConfig::default() };
            return OffloadBackend::with_device(device, config).map(Some);
        }
        Ok(None)
    }
}

/// Why no QAT device can be used.
pub(crate) enum QatUnavailable {
    /// This build lacks the `qat` feature.
    #[cfg_attr(feature = "qat", allow(dead_code))]
    NotBuilt(String),
    /// QATlib or a device is missing, or the QAT path cannot run.
    #[cfg_attr(not(feature = "qat"), allow(dead_code))]
    NoDevice(String),
}

/// The QAT device, if one can be used.
#[cfg(feature = "qat")]
pub(crate) fn open_qat(config: &QatConfig) -> Result<Arc<dyn Device>, QatUnavailable> {
    match QatDevice::open(config) {
        Ok(device) => Ok(device),
        Err(e) => Err(QatUnavailable::NoDevice(e.reason().to_string())),
    }
}

/// The QAT device, if one can be used: never, in a build without the
/// `qat` feature.
#[cfg(not(feature = "qat"))]
pub(crate) fn open_qat(_config: &QatConfig) -> Result<Arc<dyn Device>, QatUnavailable> {
    Err(QatUnavailable::NotBuilt(
        "this build of keyfence lacks the `qat` cargo feature, so it cannot use Intel QAT \
         (rebuild with `--features qat`, or use offload mode `auto` or `off`)"
            .into(),
    ))
}
