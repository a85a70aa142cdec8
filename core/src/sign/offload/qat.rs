//! Intel QAT discovery through QATlib, opened at run time (`qat` feature).
//!
//! QATlib (`libqat.so.4`, package `qatlib` or `intel-qatlib`) is opened
//! with `dlopen`, so keyfence neither links against it nor needs it
//! installed to build or run. [`probe`] tells whether this machine could
//! offload to QAT: the library is there, exports the entry points an RSA
//! path needs, and reports at least one crypto instance.
//!
//! **Untested on hardware.** The function signatures below come from
//! QATlib's public headers (`cpa.h`, `lac/cpa_cy_common.h`,
//! `lac/cpa_cy_im.h`, `lac/cpa_cy_rsa.h`, `icp_sal_user.h`,
//! `icp_sal_poll.h`, `qae_mem.h`); this code has run against a missing
//! library and against stub libraries exporting those entry points, never
//! against QATlib with a device. The RSA path that uses what the probe
//! finds is [`QatDevice`](super::QatDevice).
//!
//! A successful probe leaves the library loaded for the life of the
//! process: QATlib's code has run, and unloading it under threads or exit
//! handlers it may have registered would be unsound.
// QATlib is C, reached through dlopen.
#![allow(unsafe_code)]

use std::ffi::{c_char, CString};
use std::fmt;
use std::sync::Mutex;

use libloading::Library;

use super::QatConfig;

/// `CpaStatus` (`cpa.h`).
type CpaStatus = i32;

/// `CpaStatus icp_sal_userStart(const char *pProcessName)`.
type UserStartFn = unsafe extern "C" fn(*const c_char) -> CpaStatus;
/// `CpaStatus icp_sal_userStop(void)`.
type UserStopFn = unsafe extern "C" fn() -> CpaStatus;
/// `CpaStatus cpaCyGetNumInstances(Cpa16U *pNumInstances)`.
type GetNumInstancesFn = unsafe extern "C" fn(*mut u16) -> CpaStatus;
/// Any function, for entry points whose presence is checked but which are
/// never called here.
type AnyFn = unsafe extern "C" fn();

/// The entry points an RSA offload path needs, checked for presence:
/// instance discovery and start (`cpa_cy_common.h`, `cpa_cy_im.h`), the
/// RSA operation (`cpa_cy_rsa.h`) and the response poll (`icp_sal_poll.h`).
const RSA_PATH_SYMBOLS: [&str; 6] = [
    "cpaCyGetInstances",
    "cpaCyStartInstance",
    "cpaCyStopInstance",
    "cpaCySetAddressTranslation",
    "cpaCyRsaDecrypt",
    "icp_sal_CyPollInstance",
];

/// QATlib's pinned-memory allocator (`qae_mem.h`), in libqat or in its
/// memory driver library.
const MEMORY_SYMBOLS: [&str; 3] = ["qaeMemAllocNUMA", "qaeMemFreeNUMA", "qaeVirtToPhysNUMA"];

/// QATlib keeps per-process state: one probe at a time.
static PROBE: Mutex<()> = Mutex::new(());

/// What [`probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QatInfo {
    /// The QATlib library that was opened.
    pub library: String,
    /// Where `qaeMemAllocNUMA` was found (`library` itself, or a memory
    /// driver library).
    pub memory_library: String,
    /// Crypto instances QATlib reports.
    pub instances: u16,
}

/// Why [`probe`] found no usable QAT.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProbeError {
    /// QATlib could not be opened (not installed, or not on the library
    /// path).
    LibraryMissing(String),
    /// The library lacks an entry point the offload path needs.
    MissingSymbol(String),
    /// QATlib is there but reports no crypto instance, or cannot start
    /// (no device, the `qat` service not running, or no permission).
    NoInstance(String),
    /// The configuration cannot be passed to QATlib.
    Config(String),
}

impl ProbeError {
    /// The human-readable reason.
    pub fn reason(&self) -> &str {
        match self {
            ProbeError::LibraryMissing(r) | ProbeError::MissingSymbol(r) | ProbeError::NoInstance(r) | ProbeError::Config(r) => r,
        }
    }
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for ProbeError {}

/// QATlib's name for a status code (`cpa.h`).
pub(crate) fn status_name(status: CpaStatus) -> &'static str {
    match status {
        0 => "CPA_STATUS_SUCCESS",
        -1 => "CPA_STATUS_FAIL",
        -2 => "CPA_STATUS_RETRY",
        -3 => "CPA_STATUS_RESOURCE",
        -4 => "CPA_STATUS_INVALID_PARAM",
        -5 => "CPA_STATUS_FATAL",
        -6 => "CPA_STATUS_UNSUPPORTED",
        -7 => "CPA_STATUS_RESTARTING",
        _ => "unknown status",
    }
}

fn has_symbol(lib: &Library, name: &str) -> bool {
    let mut symbol = Vec::with_capacity(name.len() + 1);
    symbol.extend_from_slice(name.as_bytes());
    symbol.push(0);
    // SAFETY: the symbol is only looked up, never called or read through
    // the `AnyFn` type.
    unsafe { lib.get::<AnyFn>(&symbol).is_ok() }
}

/// Opens `name` with `dlopen`.
pub(crate) fn open(name: &str) -> Result<Library, libloading::Error> {
    // SAFETY: opening a shared library runs its ELF constructors. The
    // libraries opened here are the configured QATlib and memory driver
    // libraries, whose constructors only set up their own state.
    unsafe { Library::new(name) }
}

/// Looks for a usable QAT device through QATlib: opens
/// [`QatConfig::library`], checks the entry points an RSA offload path
/// needs (and `qaeMemAllocNUMA`/`qaeMemFreeNUMA`, there or in one of
/// [`QatConfig::memory_libraries`]), registers with `icp_sal_userStart`,
/// counts crypto instances with `cpaCyGetNumInstances`, and unregisters
/// with `icp_sal_userStop`.
///
/// Untested against real QATlib or hardware (see the module
/// documentation).
///
/// # Errors
/// [`ProbeError::LibraryMissing`] ("libqat.so.4 not found (install QATlib /
/// intel-qatlib)"), [`ProbeError::MissingSymbol`],
/// [`ProbeError::NoInstance`] ("QATlib found but no QAT crypto instance"),
/// [`ProbeError::Config`] for a section name with a NUL byte.
pub fn probe(config: &QatConfig) -> Result<QatInfo, ProbeError> {
    let section =
        CString::new(config.section.as_bytes()).map_err(|_| ProbeError::Config("the QAT section name contains a NUL byte".into()))?;
    let _one_at_a_time = PROBE.lock().unwrap_or_else(|e| e.into_inner());
    let name = &config.library;
    let lib = open(name).map_err(|e| ProbeError::LibraryMissing(format!("{name} not found (install QATlib / intel-qatlib): {e}")))?;
    for symbol in ["icp_sal_userStart", "icp_sal_userStop", "cpaCyGetNumInstances"].into_iter().chain(RSA_PATH_SYMBOLS) {
        if !has_symbol(&lib, symbol) {
            return Err(ProbeError::MissingSymbol(format!("{name} does not export `{symbol}`: not a QATlib this build can use")));
        }
    }
    let memory_library = if MEMORY_SYMBOLS.iter().all(|s| has_symbol(&lib, s)) {
        name.clone()
    } else {
        let found = config.memory_libraries.iter().find(|candidate| {
            // A memory library that is there but incomplete is skipped.
            open(candidate).is_ok_and(|m| {
                let ok = MEMORY_SYMBOLS.iter().all(|s| has_symbol(&m, s));
                if ok {
                    // Kept loaded with QATlib, which uses it.
                    std::mem::forget(m);
                }
                ok
            })
        });
        match found {
            Some(m) => m.clone(),
            None => {
                return Err(ProbeError::MissingSymbol(format!(
                    "QATlib's memory allocator (qaeMemAllocNUMA) is in neither {name} nor {}",
                    if config.memory_libraries.is_empty() {
                        "a memory library (none configured)".to_string()
                    } else {
                        config.memory_libraries.join(", ")
                    }
                )))
            }
        }
    };

    // SAFETY: the three symbols exist (checked above) and have these
    // types in QATlib's headers (`icp_sal_user.h`, `cpa_cy_common.h`).
    let (user_start, user_stop, num_instances) = unsafe {
        (
            *lib.get::<UserStartFn>(b"icp_sal_userStart\0").map_err(|e| ProbeError::MissingSymbol(e.to_string()))?,
            *lib.get::<UserStopFn>(b"icp_sal_userStop\0").map_err(|e| ProbeError::MissingSymbol(e.to_string()))?,
            *lib.get::<GetNumInstancesFn>(b"cpaCyGetNumInstances\0").map_err(|e| ProbeError::MissingSymbol(e.to_string()))?,
        )
    };
    // From here on QATlib code runs: never unload it (see the module
    // documentation). The copied function pointers stay valid because the
    // library stays mapped.
    std::mem::forget(lib);

    // SAFETY: `section` is a NUL-terminated string that outlives the call;
    // QATlib copies the name.
    let status = unsafe { user_start(section.as_ptr()) };
    if status != 0 {
        return Err(ProbeError::NoInstance(format!(
            "QATlib found but no QAT crypto instance: icp_sal_userStart(\"{}\") failed with {status} ({}); \
             is a QAT device present and configured, the qat service running, and this user allowed to use it?",
            config.section,
            status_name(status)
        )));
    }
    let mut count: u16 = 0;
    // SAFETY: QATlib writes one `Cpa16U` through the pointer, which points
    // at a live local.
    let status = unsafe { num_instances(&mut count) };
    // SAFETY: called once after a successful `icp_sal_userStart`, as the
    // header requires.
    unsafe {
        user_stop();
    }
    if status != 0 {
        return Err(ProbeError::NoInstance(format!(
            "QATlib found but no QAT crypto instance: cpaCyGetNumInstances failed with {status} ({})",
            status_name(status)
        )));
    }
    if count == 0 {
        return Err(ProbeError::NoInstance("QATlib found but no QAT crypto instance".into()));
    }
    Ok(QatInfo { library: name.clone(), memory_library, instances: count })
}
