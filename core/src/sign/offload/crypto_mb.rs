//! Intel's multi-buffer crypto library, crypto_mb (`libcrypto_mb.so.13`,
//! from IPP Cryptography), opened at run time (`multibuffer` feature).
//!
//! crypto_mb signs eight requests at once with AVX-512 IFMA (Ice Lake
//! Xeons and later, AMD Zen 4 and later), about three times the
//! signatures per CPU-second of OpenSSL's one at a time: what QAT Engine's
//! software mode uses. It is opened with `dlopen`, so keyfence neither
//! links against it nor needs it to build or run; a machine without it, or
//! whose CPU lacks the instructions, signs in software.
//!
//! The library's own answer decides what runs: `mbx_is_crypto_mb_applicable(0)`
//! (whether any of its code paths runs on this CPU) and
//! `mbx_get_algo_info(algo)` (8 when the algorithm runs here, 0 when not).
//! Only those two and `mbx_getversion` are called on a CPU it has not
//! said yes for: on one without IFMA its RSA and P-256 code dies with an
//! illegal instruction rather than returning an error, so an operation is
//! never called for an algorithm whose answer is not 8, and
//! `mbx_set_cpu_features` (which overrides the detection) never at all.
//!
//! Only the raw-limb functions are used (`mbx_rsa_private_crt_mb8`,
//! `mbx_nistp256_ecdsa_sign_mb8`, `mbx_nistp384_ecdsa_sign_mb8`): the
//! `_ssl_` ones take OpenSSL's `BIGNUM`s, which are not AWS-LC's. Their
//! formats, from the library's headers and source: every argument is an
//! array of eight pointers, one per lane, a null pointer leaving its lane
//! out; an integer is either big-endian bytes of the operation's size
//! (`int8u*`: messages, results, `r` and `s`) or little-endian 64-bit words
//! (`int64u*`: the key's parts, the nonce); the status holds four bits per
//! lane, lane 0 lowest, any bit set meaning that lane failed.
// crypto_mb is C, reached through dlopen.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;

use libloading::Library;

/// Lanes of one call.
pub(crate) const LANES: usize = 8;

/// `mbx_status`: four bits per lane.
pub(crate) type Status = u32;

/// The status bits of lane `i`.
pub(crate) fn lane_status(status: Status, i: usize) -> u32 {
    (status >> (4 * i)) & 0xF
}

/// `enum MBX_ALGO` values (`cpu_features.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Algo {
    Rsa2k = 1,
    Rsa3k = 2,
    Rsa4k = 3,
    EcP256 = 5,
    EcP384 = 6,
}

impl Algo {
    /// Every algorithm keyfence sends to crypto_mb.
    pub(crate) const ALL: [Algo; 5] = [Algo::Rsa2k, Algo::Rsa3k, Algo::Rsa4k, Algo::EcP256, Algo::EcP384];

    /// Its name in messages and [`CryptoMbInfo`].
    pub(crate) fn name(self) -> &'static str {
        match self {
            Algo::Rsa2k => "RSA-2048",
            Algo::Rsa3k => "RSA-3072",
            Algo::Rsa4k => "RSA-4096",
            Algo::EcP256 => "ECDSA P-256",
            Algo::EcP384 => "ECDSA P-384",
        }
    }

    /// The RSA algorithm for a modulus of `bits`.
    pub(crate) fn rsa(bits: u32) -> Option<Algo> {
        match bits {
            2048 => Some(Algo::Rsa2k),
            3072 => Some(Algo::Rsa3k),
            4096 => Some(Algo::Rsa4k),
            _ => None,
        }
    }
}

/// `mbxVersion` (`version.h`).
#[repr(C)]
struct Version {
    major: c_int,
    minor: c_int,
    patch: c_int,
    target_cpu: [c_char; 4],
    name: *const c_char,
    build_date: *const c_char,
    str_version: *const c_char,
}

type VersionFn = unsafe extern "C" fn() -> *const Version;
type ApplicableFn = unsafe extern "C" fn(u64) -> c_int;
type AlgoInfoFn = unsafe extern "C" fn(c_int) -> u64;
type RsaMethodFn = unsafe extern "C" fn(c_int) -> *const c_void;
type BufSizeFn = unsafe extern "C" fn(*const c_void) -> c_int;
/// `mbx_rsa_private_crt_mb8(from_pa, to_pa, p_pa, q_pa, dp_pa, dq_pa,
/// iq_pa, rsaBitlen, m, pBuffer)`.
type RsaCrtFn = unsafe extern "C" fn(
    *const *const u8,
    *const *mut u8,
    *const *const u64,
    *const *const u64,
    *const *const u64,
    *const *const u64,
    *const *const u64,
    c_int,
    *const c_void,
    *mut u8,
) -> Status;
/// `mbx_nistp{256,384}_ecdsa_sign_mb8(pa_sign_r, pa_sign_s, pa_msg,
/// pa_eph_skey, pa_reg_skey, pBuffer)`.
type EcdsaSignFn =
    unsafe extern "C" fn(*const *mut u8, *const *mut u8, *const *const u8, *const *const u64, *const *const u64, *mut u8) -> Status;

/// What was found of crypto_mb.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CryptoMbInfo {
    /// The library that was opened.
    pub library: String,
    /// Its version string (`mbx_getversion`).
    pub version: String,
    /// Whether any of its code paths runs on this CPU
    /// (`mbx_is_crypto_mb_applicable`).
    pub applicable: bool,
    /// For each algorithm keyfence would send it, whether it runs here
    /// (`mbx_get_algo_info` answered 8).
    pub algorithms: Vec<(String, bool)>,
}

/// Why crypto_mb cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unavailable {
    /// The library could not be opened (not installed, not on the library
    /// path, or its own dependencies missing).
    NotFound(String),
    /// It opened but lacks an entry point keyfence calls.
    Incomplete(String),
    /// It runs none of keyfence's algorithms on this CPU.
    NotApplicable(CryptoMbInfo),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NotFound(why) => write!(f, "crypto_mb could not be opened: {why}"),
            Unavailable::Incomplete(why) => write!(f, "crypto_mb lacks an entry point: {why}"),
            Unavailable::NotApplicable(info) => write!(
                f,
                "crypto_mb ({}, {}) runs none of RSA-2048/3072/4096 and ECDSA P-256/P-384 on this CPU (it needs AVX-512 IFMA: mbx_is_crypto_mb_applicable says {}, mbx_get_algo_info 0 for each)",
                info.library,
                info.version,
                u8::from(info.applicable)
            ),
        }
    }
}

/// crypto_mb's entry points, resolved once; the library stays loaded for
/// the life of the value.
pub(crate) struct CryptoMb {
    rsa_method: RsaMethodFn,
    buf_size: BufSizeFn,
    rsa_crt: RsaCrtFn,
    p256_sign: EcdsaSignFn,
    p384_sign: EcdsaSignFn,
    /// Which algorithms run here, by [`Algo`] index.
    runs: [bool; 7],
    info: CryptoMbInfo,
    _lib: Library,
}

fn symbol<T: Copy>(lib: &Library, name: &str) -> Result<T, Unavailable> {
    // SAFETY: each `T` is the function pointer type of the prototype in
    // crypto_mb's headers for `name` (see the type aliases above), so the
    // symbol is used at its own type; the library outlives every use.
    unsafe { lib.get::<T>(name.as_bytes()).map(|s| *s).map_err(|e| Unavailable::Incomplete(format!("{name}: {e}"))) }
}

impl CryptoMb {
    /// Opens `library` (a file name searched the `dlopen` way, or a path)
    /// and asks it which of keyfence's algorithms run on this CPU.
    ///
    /// # Errors
    /// [`Unavailable`]: not found, incomplete, or running none of them.
    pub(crate) fn open(library: &str) -> Result<CryptoMb, Unavailable> {
        let runtime = preload_runtime(library);
        // SAFETY: opening a library runs its initialisers; crypto_mb's set
        // up its dispatch table only (no threads, no handlers).
        let lib = unsafe { Library::new(library) }.map_err(|e| {
            let hint = if runtime.is_empty() {
                format!(" (crypto_mb needs Intel's compiler runtime: {} beside it, or on the library path)", RUNTIME.join(", "))
            } else {
                String::new()
            };
            Unavailable::NotFound(format!("{library}: {e}{hint}"))
        })?;
        let version: VersionFn = symbol(&lib, "mbx_getversion")?;
        let applicable: ApplicableFn = symbol(&lib, "mbx_is_crypto_mb_applicable")?;
        let algo_info: AlgoInfoFn = symbol(&lib, "mbx_get_algo_info")?;
        // SAFETY: `mbx_getversion` takes nothing and returns a pointer to a
        // static `mbxVersion` (or null, checked), whose string fields are
        // static NUL-terminated strings or null (checked).
        let version = unsafe {
            let v = version();
            match v.as_ref() {
                Some(v) if !v.str_version.is_null() => CStr::from_ptr(v.str_version).to_string_lossy().into_owned(),
                Some(v) => format!("{}.{}.{}", v.major, v.minor, v.patch),
                None => "unknown version".into(),
            }
        };
        // SAFETY: both take plain integers and only read CPUID (0 asks for
        // this CPU's features); neither runs vector code.
        let (applicable, widths) = unsafe { (applicable(0) == 1, Algo::ALL.map(|a| algo_info(a as c_int))) };
        let mut runs = [false; 7];
        for (a, w) in Algo::ALL.iter().zip(widths) {
            runs[*a as usize] = applicable && w == LANES as u64;
        }
        let info = CryptoMbInfo {
            library: library.to_string(),
            version,
            applicable,
            algorithms: Algo::ALL.iter().map(|a| (a.name().to_string(), runs[*a as usize])).collect(),
        };
        if !runs.iter().any(|r| *r) {
            return Err(Unavailable::NotApplicable(info));
        }
        Ok(CryptoMb {
            rsa_method: symbol(&lib, "mbx_RSA_private_crt_Method")?,
            buf_size: symbol(&lib, "mbx_RSA_Method_BufSize")?,
            rsa_crt: symbol(&lib, "mbx_rsa_private_crt_mb8")?,
            p256_sign: symbol(&lib, "mbx_nistp256_ecdsa_sign_mb8")?,
            p384_sign: symbol(&lib, "mbx_nistp384_ecdsa_sign_mb8")?,
            runs,
            info,
            _lib: lib,
        })
    }

    /// What was found.
    pub(crate) fn info(&self) -> &CryptoMbInfo {
        &self.info
    }

    /// Whether `algo` runs on this CPU: the only condition under which an
    /// operation of it is ever called.
    pub(crate) fn runs(&self, algo: Algo) -> bool {
        self.runs[algo as usize]
    }

    /// RSA private operations with the CRT parts, up to eight lanes of
    /// `bits` (2048, 3072 or 4096): lane `i` raises `from[i]` (big-endian,
    /// `bits / 8` bytes) into `to[i]` (as long) with its key's parts
    /// `p, q, dp, dq, iq` (little-endian words, `bits / 128` each; iq is
    /// q⁻¹ mod p). `None` lanes are left out. The status, four bits a lane.
    pub(crate) fn rsa_private_crt(&self, bits: u32, lanes: &mut [Option<RsaLane<'_>>; LANES]) -> Status {
        if !Algo::rsa(bits).is_some_and(|a| self.runs(a)) {
            return u32::MAX;
        }
        let (words, bytes) = (bits as usize / 128, bits as usize / 8);
        let mut from = [std::ptr::null::<u8>(); LANES];
        let mut to = [std::ptr::null_mut::<u8>(); LANES];
        let mut parts = [[std::ptr::null::<u64>(); LANES]; 5];
        for (i, lane) in lanes.iter_mut().enumerate() {
            let Some(l) = lane else { continue };
            let sizes_ok = l.from.len() == bytes && l.to.len() == bytes && l.parts.iter().all(|p| p.len() == words);
            if !sizes_ok {
                // A lane of the wrong size stays out (null), as an absent one.
                *lane = None;
                continue;
            }
            from[i] = l.from.as_ptr();
            to[i] = l.to.as_mut_ptr();
            for (k, part) in l.parts.iter().enumerate() {
                parts[k][i] = part.as_ptr();
            }
        }
        // SAFETY: `rsa_method` takes a bit size and returns a pointer to a
        // static method (or null, which the operation then looks up
        // itself), `buf_size` reads it.
        let method = unsafe { (self.rsa_method)(bits as c_int) };
        // SAFETY: as above; a negative size is taken as none.
        let size = usize::try_from(unsafe { (self.buf_size)(method) }).unwrap_or(0);
        let mut scratch = zeroize::Zeroizing::new(vec![0u8; size]);
        let scratch_ptr = if size == 0 { std::ptr::null_mut() } else { scratch.as_mut_ptr() };
        // SAFETY: `runs(algo)` (checked above) says this CPU runs the
        // operation; every array holds eight pointers, each null or into a
        // buffer of the size the call reads or writes for `bits` (checked
        // per lane above), all alive for the call; `scratch` has the size
        // the library asked for, or the library allocates its own (null).
        unsafe {
            (self.rsa_crt)(
                from.as_ptr(),
                to.as_ptr(),
                parts[0].as_ptr(),
                parts[1].as_ptr(),
                parts[2].as_ptr(),
                parts[3].as_ptr(),
                parts[4].as_ptr(),
                bits as c_int,
                method,
                scratch_ptr,
            )
        }
    }

    /// ECDSA signatures on `algo`'s curve (P-256 or P-384), up to eight
    /// lanes: lane `i` signs `e` (big-endian, the curve's size, already
    /// reduced mod n and not 0) with private key `d` and nonce `k`
    /// (little-endian words, 4 or 6), writing `r` and `s` (big-endian, the
    /// curve's size). The status, four bits a lane.
    pub(crate) fn ecdsa_sign(&self, algo: Algo, lanes: &mut [Option<EcdsaLane<'_>>; LANES]) -> Status {
        let (sign, bytes) = match algo {
            Algo::EcP256 if self.runs(algo) => (self.p256_sign, 32),
            Algo::EcP384 if self.runs(algo) => (self.p384_sign, 48),
            _ => return u32::MAX,
        };
        let words = bytes / 8;
        let mut r = [std::ptr::null_mut::<u8>(); LANES];
        let mut s = [std::ptr::null_mut::<u8>(); LANES];
        let mut e = [std::ptr::null::<u8>(); LANES];
        let mut k = [std::ptr::null::<u64>(); LANES];
        let mut d = [std::ptr::null::<u64>(); LANES];
        for (i, lane) in lanes.iter_mut().enumerate() {
            let Some(l) = lane else { continue };
            if l.e.len() != bytes || l.r.len() != bytes || l.s.len() != bytes || l.k.len() != words || l.d.len() != words {
                *lane = None;
                continue;
            }
            r[i] = l.r.as_mut_ptr();
            s[i] = l.s.as_mut_ptr();
            e[i] = l.e.as_ptr();
            k[i] = l.k.as_ptr();
            d[i] = l.d.as_ptr();
        }
        // SAFETY: `runs(algo)` says this CPU runs it; every array holds
        // eight pointers, each null or into a buffer of the size the call
        // reads or writes for the curve (checked per lane), alive for the
        // call; the buffer argument is unused by the library (null).
        unsafe { sign(r.as_ptr(), s.as_ptr(), e.as_ptr(), k.as_ptr(), d.as_ptr(), std::ptr::null_mut()) }
    }
}

/// The libraries crypto_mb needs besides the system's (Intel's compiler
/// runtime, the `intel-cmplr-lib-rt` package), in the order they load.
const RUNTIME: [&str; 4] = ["libintlc.so.5", "libsvml.so", "libimf.so", "libirng.so"];

/// Loads crypto_mb's runtime libraries from the folder `library` is in,
/// where they are there (the way `docs/offload.md` installs it: one folder
/// for all five), so that it opens without `LD_LIBRARY_PATH`; the ones
/// loaded (kept for the life of the process, as the library needs them).
fn preload_runtime(library: &str) -> Vec<&'static str> {
    let Some(dir) = std::path::Path::new(library).parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Vec::new();
    };
    let mut loaded = Vec::new();
    for name in RUNTIME {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        // SAFETY: Intel's runtime libraries run no code at load that
        // depends on the caller; they stay loaded (leaked) for crypto_mb.
        if let Ok(lib) = unsafe { libloading::os::unix::Library::open(Some(&path), libc::RTLD_NOW | libc::RTLD_GLOBAL) } {
            std::mem::forget(lib);
            loaded.push(name);
        }
    }
    loaded
}

/// One RSA lane: the input, the output, and the key's five CRT parts
/// (p, q, dp, dq, iq).
pub(crate) struct RsaLane<'a> {
    pub(crate) from: &'a [u8],
    pub(crate) to: &'a mut [u8],
    pub(crate) parts: [&'a [u64]; 5],
}

/// One ECDSA lane: the message integer, the nonce, the private key and the
/// signature's two halves.
pub(crate) struct EcdsaLane<'a> {
    pub(crate) e: &'a [u8],
    pub(crate) k: &'a [u64],
    pub(crate) d: &'a [u64],
    pub(crate) r: &'a mut [u8],
    pub(crate) s: &'a mut [u8],
}

/// A big-endian integer as little-endian 64-bit words, `words` of them
/// (zero-padded at the high end).
pub(crate) fn le_words(be: &[u8], words: usize) -> zeroize::Zeroizing<Vec<u64>> {
    let mut out = zeroize::Zeroizing::new(vec![0u64; words]);
    for (i, b) in be.iter().rev().enumerate().take(words * 8) {
        out[i / 8] |= u64::from(*b) << (8 * (i % 8));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn words_are_the_integer_little_endian() {
        // The library's own self-test: the P-256 key 0x519b...b464 is
        // these little-endian bytes.
        let be = hex("519b423d715f8b581f4fa8ee59f4771a5b44c8130b4e3eacca54a56dda72b464");
        let words = super::le_words(&be, 4);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(bytes, hex("64b472da6da554caac3e4e0b13c8445b1a77f459eea84f1f588b5f713d429b51"));
        assert_eq!(&super::le_words(&[1, 2], 2)[..], &[0x0102, 0]);
        assert_eq!(super::lane_status(0x0000_8000, 3), 8);
        assert_eq!(super::lane_status(0xaaaa_aaaa, 7), 10);
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }
}
