//! The multi-buffer device: a [`Device`] that signs eight requests at a
//! time with Intel's crypto_mb (AVX-512 IFMA), on threads of its own
//! (`multibuffer` feature).
//!
//! The [`OffloadBackend`](super::OffloadBackend)'s batcher gathers
//! requests for a window; the device's threads take what has come, sort it
//! by algorithm (RSA per modulus size, ECDSA per curve) and hand crypto_mb
//! eight lanes at a time, as QAT Engine's software mode does
//! (`qat_sw_rsa.c`). A group smaller than [`MultiBufferConfig::min_lanes`]
//! goes to software instead (one lane costs crypto_mb as much as eight, so
//! a lone request is cheaper there): a lone request waits one window, never
//! for company.
//!
//! What each algorithm gets:
//!
//! - RSA 2048, 3072, 4096 with balanced primes (PKCS #1 v1.5 and PSS
//!   signatures, raw decryption): keyfence encodes the message with
//!   AWS-LC (as for QAT), crypto_mb raises it with the CRT parts, and the
//!   backend checks every result with the public key before it leaves, a
//!   wrong one redone in software and counted (a faulty CRT signature
//!   reveals the key's factors).
//! - ECDSA P-256 (SHA-256) and P-384 (SHA-384): the digest becomes the
//!   integer e reduced mod n (crypto_mb refuses e ≥ n and does neither
//!   truncation nor reduction); each signature's nonce is drawn from the
//!   system's random number generator (`getrandom`), uniformly in
//!   [1, n − 1], never reused and never derived from the batch; r and s
//!   come back as big-endian halves and are DER-encoded here. ECDSA
//!   results are not verified (a verification costs twice the signature,
//!   and the library is deterministic arithmetic, not a device that faults).
//! - Ed25519 stays in software: AWS-LC signs it in a fifth of OpenSSL's
//!   CPU already, and crypto_mb's batch would not beat it.
//!
//! The device is tested on every machine against a stand-in library
//! (`vectors/crypto-mb-stand-in/`, the same names and ABI, each lane
//! computed with OpenSSL) and against Intel's where the CPU has the
//! instructions (`core/tests/offload_multibuffer.rs`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use rand_core::{OsRng, RngCore};
use zeroize::Zeroizing;

use super::crypto_mb::{lane_status, le_words, Algo, CryptoMb, CryptoMbInfo, EcdsaLane, RsaLane, Unavailable, LANES};
use super::device::{Device, DeviceError, DeviceRequest};
use super::rsa_encoding::{rsa_crt, rsa_encode};
use crate::sign::local_key::digest_of;
use crate::sign::types::{Family, Input, KeyKind, Operation, Output, SignError};
use crate::spawn::QuietSpawn;

/// Where crypto_mb is and how the device uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MultiBufferConfig {
    /// The library to open: a file name searched the `dlopen` way
    /// (`LD_LIBRARY_PATH`, the system directories) or a path. Default:
    /// `KEYFENCE_CRYPTO_MB` when the environment sets it, else
    /// `libcrypto_mb.so.13`.
    pub library: String,
    /// The fewest requests of one algorithm signed together; fewer go to
    /// software. Default 3: eight lanes cost crypto_mb about as much as
    /// three signatures one at a time.
    pub min_lanes: usize,
    /// Threads that make crypto_mb's calls. Default: the core count.
    pub threads: usize,
}

impl Default for MultiBufferConfig {
    fn default() -> Self {
        MultiBufferConfig {
            library: std::env::var("KEYFENCE_CRYPTO_MB").ok().filter(|v| !v.is_empty()).unwrap_or_else(|| "libcrypto_mb.so.13".into()),
            min_lanes: 3,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// What the device has done, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MultiBufferStats {
    /// crypto_mb calls made.
    pub calls: u64,
    /// Lanes filled over those calls (at most eight a call).
    pub lanes: u64,
    /// Requests sent to software for a group too small to batch.
    pub too_few: u64,
    /// Lanes crypto_mb failed (its status not 0).
    pub lane_errors: u64,
}

struct Queue {
    pending: VecDeque<DeviceRequest>,
    stop: bool,
}

struct Shared {
    mb: CryptoMb,
    queue: Mutex<Queue>,
    ready: Condvar,
    min_lanes: usize,
    calls: AtomicU64,
    lanes: AtomicU64,
    too_few: AtomicU64,
    lane_errors: AtomicU64,
}

/// The multi-buffer device. Dropping it ends its threads once what was
/// queued is done.
pub struct MultiBufferDevice {
    shared: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for MultiBufferDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiBufferDevice").field("info", self.info()).finish_non_exhaustive()
    }
}

/// crypto_mb opened, its device not started yet.
pub(crate) struct LoadedMultiBuffer {
    mb: CryptoMb,
    config: MultiBufferConfig,
}

impl LoadedMultiBuffer {
    /// Starts the device's threads.
    ///
    /// # Errors
    /// A thread that cannot start.
    pub(crate) fn start(self) -> Result<Arc<MultiBufferDevice>, MultiBufferUnavailable> {
        MultiBufferDevice::start(self.mb, &self.config)
    }
}

/// Why no multi-buffer device can be used, in words an operator acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiBufferUnavailable(pub String);

impl std::fmt::Display for MultiBufferUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MultiBufferUnavailable {}

impl MultiBufferDevice {
    /// Opens crypto_mb as `config` says and starts the device's threads,
    /// if the library runs at least one of keyfence's algorithms on this
    /// CPU.
    ///
    /// # Errors
    /// [`MultiBufferUnavailable`] saying why not: the library missing (or
    /// its dependencies), incomplete, or not running here (no AVX-512
    /// IFMA); or a thread that cannot start.
    pub fn open(config: &MultiBufferConfig) -> Result<Arc<MultiBufferDevice>, MultiBufferUnavailable> {
        Self::load(config)?.start()
    }

    /// Opens crypto_mb without starting threads: the key process does this
    /// before its sandbox (which a second thread would keep from binding
    /// it) and [`LoadedMultiBuffer::start`]s the device after.
    ///
    /// # Errors
    /// As [`MultiBufferDevice::open`].
    pub(crate) fn load(config: &MultiBufferConfig) -> Result<LoadedMultiBuffer, MultiBufferUnavailable> {
        let mb = CryptoMb::open(&config.library).map_err(|e| MultiBufferUnavailable(e.to_string()))?;
        Ok(LoadedMultiBuffer { mb, config: config.clone() })
    }

    /// What crypto_mb said of itself, without starting a device: for
    /// `keyfence bench sign` and tests, which report why `auto` chose
    /// what it chose.
    ///
    /// # Errors
    /// [`MultiBufferUnavailable`] when the library does not open; a
    /// library that runs nothing here is `Ok` with `applicable` false.
    pub fn probe(config: &MultiBufferConfig) -> Result<CryptoMbInfo, MultiBufferUnavailable> {
        match CryptoMb::open(&config.library) {
            Ok(mb) => Ok(mb.info().clone()),
            Err(Unavailable::NotApplicable(info)) => Ok(info),
            Err(e) => Err(MultiBufferUnavailable(e.to_string())),
        }
    }

    fn start(mb: CryptoMb, config: &MultiBufferConfig) -> Result<Arc<MultiBufferDevice>, MultiBufferUnavailable> {
        let shared = Arc::new(Shared {
            mb,
            queue: Mutex::new(Queue { pending: VecDeque::new(), stop: false }),
            ready: Condvar::new(),
            min_lanes: config.min_lanes.clamp(1, LANES),
            calls: AtomicU64::new(0),
            lanes: AtomicU64::new(0),
            too_few: AtomicU64::new(0),
            lane_errors: AtomicU64::new(0),
        });
        let mut threads = Vec::new();
        for i in 0..config.threads.clamp(1, 256) {
            let s = shared.clone();
            let t = std::thread::Builder::new()
                .name(format!("keyfence-mb-{i}"))
                .spawn_quiet(move || run(&s))
                .map_err(|e| MultiBufferUnavailable(format!("cannot start a multi-buffer thread: {e}")))?;
            threads.push(t);
        }
        Ok(Arc::new(MultiBufferDevice { shared, threads: Mutex::new(threads) }))
    }

    /// What crypto_mb said of itself when opened.
    pub fn info(&self) -> &CryptoMbInfo {
        self.shared.mb.info()
    }

    /// What the device has done.
    pub fn stats(&self) -> MultiBufferStats {
        let s = &self.shared;
        MultiBufferStats {
            calls: s.calls.load(Ordering::Relaxed),
            lanes: s.lanes.load(Ordering::Relaxed),
            too_few: s.too_few.load(Ordering::Relaxed),
            lane_errors: s.lane_errors.load(Ordering::Relaxed),
        }
    }
}

impl Drop for MultiBufferDevice {
    fn drop(&mut self) {
        self.shared.queue.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        self.shared.ready.notify_all();
        for t in self.threads.get_mut().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = t.join();
        }
    }
}

/// The crypto_mb algorithm `op` with a key of `kind` runs as, if any.
fn algo_of(kind: KeyKind, op: &Operation) -> Option<Algo> {
    match (kind, op) {
        (KeyKind::Rsa { bits }, Operation::DecryptRaw { .. }) => Algo::rsa(bits),
        (KeyKind::Rsa { bits }, Operation::Sign { alg, .. }) if matches!(alg.family(), Family::RsaPkcs1 | Family::RsaPss) => {
            Algo::rsa(bits)
        }
        (KeyKind::EcP256, Operation::Sign { alg, .. }) if alg.family() == Family::EcdsaP256 => Some(Algo::EcP256),
        (KeyKind::EcP384, Operation::Sign { alg, .. }) if alg.family() == Family::EcdsaP384 => Some(Algo::EcP384),
        _ => None,
    }
}

impl Device for MultiBufferDevice {
    fn name(&self) -> &str {
        "crypto_mb"
    }

    fn supports(&self, kind: KeyKind, op: &Operation) -> bool {
        algo_of(kind, op).is_some_and(|a| self.shared.mb.runs(a))
    }

    fn max_batch(&self) -> usize {
        // Several groups of eight from one window.
        8 * LANES
    }

    fn max_in_flight(&self) -> usize {
        4096
    }

    fn submit(&self, batch: Vec<DeviceRequest>) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.stop {
            // Dropped: each fails as a device failure, then software.
            return;
        }
        q.pending.extend(batch);
        drop(q);
        self.shared.ready.notify_one();
    }
}

/// A device thread: takes what is queued, in groups of one algorithm, and
/// signs each group eight lanes at a time.
fn run(s: &Shared) {
    loop {
        let mut q = s.queue.lock().unwrap_or_else(|e| e.into_inner());
        while q.pending.is_empty() && !q.stop {
            q = s.ready.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        if q.pending.is_empty() {
            return;
        }
        // One algorithm's requests, at most a call's worth; the rest for
        // the next turn (of this thread or another, woken for them).
        let first = q.pending.front().and_then(|r| algo_of(r.key().kind(), r.operation()));
        let mut group = Vec::with_capacity(LANES);
        let mut rest = VecDeque::with_capacity(q.pending.len());
        while let Some(r) = q.pending.pop_front() {
            if group.len() < LANES && algo_of(r.key().kind(), r.operation()) == first {
                group.push(r);
            } else {
                rest.push_back(r);
            }
        }
        q.pending = rest;
        let more = !q.pending.is_empty();
        drop(q);
        if more {
            s.ready.notify_one();
        }
        let now = std::time::Instant::now();
        let (live, expired): (Vec<_>, Vec<_>) = group.into_iter().partition(|r| r.deadline() > now);
        for r in expired {
            r.complete(Err(DeviceError::Expired));
        }
        match first {
            _ if live.is_empty() => {}
            Some(_) if live.len() < s.min_lanes => {
                s.too_few.fetch_add(live.len() as u64, Ordering::Relaxed);
                for r in live {
                    r.complete(Err(DeviceError::Unsupported(format!("a batch smaller than {} lanes (software is cheaper)", s.min_lanes))));
                }
            }
            Some(Algo::EcP256 | Algo::EcP384) => ecdsa(s, first.unwrap_or(Algo::EcP256), live),
            Some(_) => rsa(s, live),
            None => {
                for r in live {
                    r.complete(Err(DeviceError::Unsupported("not an operation crypto_mb signs".into())));
                }
            }
        }
    }
}

/// What one request needs for an RSA lane.
struct RsaPrepared {
    em: Zeroizing<Vec<u8>>,
    parts: [Zeroizing<Vec<u64>>; 5],
    out: Zeroizing<Vec<u8>>,
}

fn rsa(s: &Shared, reqs: Vec<DeviceRequest>) {
    let bits = match reqs.first().map(|r| r.key().kind()) {
        Some(KeyKind::Rsa { bits }) => bits,
        _ => return fail_all(reqs, "not an RSA group"),
    };
    let words = bits as usize / 128;
    let mut ready = Vec::with_capacity(reqs.len());
    for r in reqs {
        let em = match rsa_encode(r.key(), r.operation()) {
            Ok(em) => em,
            Err(e) => {
                r.complete(Err(DeviceError::Rejected(e)));
                continue;
            }
        };
        let Some(crt) = rsa_crt(r.key()) else {
            r.complete(Err(DeviceError::Unsupported("an RSA key without balanced CRT parts".into())));
            continue;
        };
        let parts = [&crt.p, &crt.q, &crt.dp, &crt.dq, &crt.qinv].map(|p| le_words(p, words));
        let out = Zeroizing::new(vec![0u8; crt.modulus_len]);
        ready.push((r, RsaPrepared { em, parts, out }));
    }
    if ready.is_empty() {
        return;
    }
    let status = {
        let mut lanes: [Option<RsaLane<'_>>; LANES] = Default::default();
        for (lane, (_, p)) in lanes.iter_mut().zip(ready.iter_mut()) {
            let [a, b, c, d, e] = &p.parts;
            *lane = Some(RsaLane { from: &p.em, to: &mut p.out, parts: [a, b, c, d, e] });
        }
        s.mb.rsa_private_crt(bits, &mut lanes)
    };
    finish(s, status, ready.into_iter().map(|(r, p)| (r, Ok(p.out))));
}

/// The order n of P-256 and of P-384, big-endian.
const P256_N: [u8; 32] = hex32("ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551");
const P384_N: [u8; 48] = hex48("ffffffffffffffffffffffffffffffffffffffffffffffffc7634d81f4372ddf581a0db248b0a77aecec196accc52973");

const fn nibble(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("not a hex digit"),
    }
}

const fn hex32(s: &str) -> [u8; 32] {
    let b = s.as_bytes();
    let mut out = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = nibble(b[2 * i]) << 4 | nibble(b[2 * i + 1]);
        i += 1;
    }
    out
}

const fn hex48(s: &str) -> [u8; 48] {
    let b = s.as_bytes();
    let mut out = [0u8; 48];
    let mut i = 0;
    while i < 48 {
        out[i] = nibble(b[2 * i]) << 4 | nibble(b[2 * i + 1]);
        i += 1;
    }
    out
}

/// `a - b` in place, big-endian, for `a >= b` of equal lengths.
fn sub_be(a: &mut [u8], b: &[u8]) {
    let mut borrow = 0i16;
    for (x, y) in a.iter_mut().zip(b).rev() {
        let d = i16::from(*x) - i16::from(*y) - borrow;
        borrow = i16::from(d < 0);
        *x = (d + (borrow << 8)) as u8;
    }
}

/// A nonce uniformly in [1, n − 1] from the system's generator: whole
/// candidates drawn until one is in range (rejection sampling, so no value
/// is likelier than another), big-endian.
fn nonce(n: &[u8]) -> Result<Zeroizing<Vec<u8>>, DeviceError> {
    let mut k = Zeroizing::new(vec![0u8; n.len()]);
    for _ in 0..128 {
        OsRng.try_fill_bytes(&mut k).map_err(|e| DeviceError::Failed(format!("the system's random number generator: {e}")))?;
        if k.iter().any(|b| *b != 0) && k.as_slice() < n {
            return Ok(k);
        }
    }
    Err(DeviceError::Failed("no nonce below the group order after 128 draws".into()))
}

/// What one request needs for an ECDSA lane.
struct EcdsaPrepared {
    e: Zeroizing<Vec<u8>>,
    k: Zeroizing<Vec<u64>>,
    d: Zeroizing<Vec<u64>>,
    r: Vec<u8>,
    s: Vec<u8>,
}

fn ecdsa(s: &Shared, algo: Algo, reqs: Vec<DeviceRequest>) {
    let n: &[u8] = if algo == Algo::EcP384 { &P384_N } else { &P256_N };
    let (bytes, words) = (n.len(), n.len() / 8);
    let mut ready = Vec::with_capacity(reqs.len());
    for r in reqs {
        match ecdsa_lane(&r, n) {
            Ok(Some((e, k, d))) => {
                let (rr, ss) = (vec![0u8; bytes], vec![0u8; bytes]);
                ready.push((r, EcdsaPrepared { e, k: le_words(&k, words), d: le_words(&d, words), r: rr, s: ss }));
            }
            // e = 0 (a digest that is a multiple of n): software signs it.
            Ok(None) => r.complete(Err(DeviceError::Unsupported("a digest whose integer is 0 mod n".into()))),
            Err(e) => r.complete(Err(e)),
        }
    }
    if ready.is_empty() {
        return;
    }
    let status = {
        let mut lanes: [Option<EcdsaLane<'_>>; LANES] = Default::default();
        for (lane, (_, p)) in lanes.iter_mut().zip(ready.iter_mut()) {
            *lane = Some(EcdsaLane { e: &p.e, k: &p.k, d: &p.d, r: &mut p.r, s: &mut p.s });
        }
        s.mb.ecdsa_sign(algo, &mut lanes)
    };
    let results = ready.into_iter().map(|(r, p)| {
        let mut raw = Zeroizing::new(Vec::with_capacity(2 * bytes));
        raw.extend_from_slice(&p.r);
        raw.extend_from_slice(&p.s);
        let der = crate::sign::pkcs11::der::ecdsa_der(&raw).map_err(DeviceError::Rejected);
        (r, der)
    });
    finish(s, status, results);
}

/// For an ECDSA request: e (the digest as an integer mod n, `None` when 0),
/// a fresh nonce, and the private key, all big-endian of the curve's size.
#[allow(clippy::type_complexity)]
fn ecdsa_lane(r: &DeviceRequest, n: &[u8]) -> Result<Option<(Zeroizing<Vec<u8>>, Zeroizing<Vec<u8>>, Zeroizing<Vec<u8>>)>, DeviceError> {
    let bytes = n.len();
    let Operation::Sign { alg, input } = r.operation() else {
        return Err(DeviceError::Unsupported("ECDSA signs only".into()));
    };
    let hash = alg.hash().ok_or_else(|| DeviceError::Unsupported("ECDSA without a hash".into()))?;
    let (data, prehashed) = match input {
        Input::Message(m) => (m, false),
        Input::Digest(d) => (d, true),
    };
    let digest = digest_of(hash, data, prehashed).map_err(DeviceError::Rejected)?;
    // bits2int: the leftmost bits of the digest, as many as the order has
    // (its bytes here: the orders of P-256 and P-384 fill whole bytes).
    let mut e = Zeroizing::new(vec![0u8; bytes]);
    let take = digest.len().min(bytes);
    e[bytes - take..].copy_from_slice(&digest[..take]);
    if e.as_slice() >= n {
        sub_be(&mut e, n);
    }
    if e.iter().all(|b| *b == 0) {
        return Ok(None);
    }
    let ec = r.key().as_local().and_then(|l| l.ec()).ok_or_else(|| DeviceError::Unsupported("an EC key held elsewhere".into()))?;
    let d = ec
        .private_key()
        .to_vec_padded(bytes as i32)
        .map(Zeroizing::new)
        .map_err(|e| DeviceError::Rejected(SignError::Crypto { op: crate::sign::CryptoOp::Sign, reason: e.to_string() }))?;
    Ok(Some((e, nonce(n)?, d)))
}

fn fail_all(reqs: Vec<DeviceRequest>, why: &str) {
    for r in reqs {
        r.complete(Err(DeviceError::Failed(why.into())));
    }
}

/// Completes each request from its lane's status and result, counting.
fn finish(s: &Shared, status: super::crypto_mb::Status, results: impl Iterator<Item = (DeviceRequest, Result<Output, DeviceError>)>) {
    s.calls.fetch_add(1, Ordering::Relaxed);
    for (i, (r, result)) in results.enumerate() {
        s.lanes.fetch_add(1, Ordering::Relaxed);
        let lane = lane_status(status, i);
        if lane != 0 {
            s.lane_errors.fetch_add(1, Ordering::Relaxed);
            r.complete(Err(DeviceError::Failed(format!("crypto_mb failed the lane (status {lane:#x})"))));
        } else {
            r.complete(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_and_subtraction() {
        assert_eq!(P256_N[0], 0xff);
        assert_eq!(P256_N[31], 0x51);
        assert_eq!(P384_N[47], 0x73);
        let mut a = P256_N;
        a[31] = 0x52;
        sub_be(&mut a, &P256_N);
        assert_eq!(a[..31], [0u8; 31]);
        assert_eq!(a[31], 1);
        let mut x = [0x01, 0x00];
        sub_be(&mut x, &[0x00, 0x01]);
        assert_eq!(x, [0x00, 0xff]);
    }

    #[test]
    fn nonces_are_in_range_and_never_repeat() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2000 {
            let k = nonce(&P256_N).unwrap();
            assert!(k.as_slice() < &P256_N[..] && k.iter().any(|b| *b != 0));
            assert!(seen.insert(k.to_vec()), "a nonce repeated");
        }
        // A small order: every draw is rejected until one is below it.
        let tiny = [0u8; 31].iter().copied().chain([3]).collect::<Vec<_>>();
        assert!(nonce(&tiny).is_err_and(|e| matches!(e, DeviceError::Failed(_))), "2^-256 odds of a draw below 3");
    }
}
