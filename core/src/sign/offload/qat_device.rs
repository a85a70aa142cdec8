//! The QAT RSA path: a [`Device`] that hands RSA private-key operations to
//! QATlib's `cpaCyRsaDecrypt` and completes them from a polling thread
//! (`qat` feature).
//!
//! The device computes only the RSA primitive, `m^d mod n`, from the key's
//! CRT components (PKCS #1 representation 2); keyfence encodes the message
//! first (EMSA-PKCS1-v1_5 or EMSA-PSS, with AWS-LC) and checks every
//! result with the public key before using it, as AWS-LC checks its own
//! CRT results: a faulty CRT signature would reveal the key's factors. A
//! result that fails the check, a refused submission (a full ring answers
//! `CPA_STATUS_RETRY`) and a failed callback are device faults, which the
//! [`OffloadBackend`](super::OffloadBackend) retries in software or fails
//! as configured.
//!
//! Key material and inputs are copied into QATlib's pinned memory
//! (`qaeMemAllocNUMA`), which the device reads by physical address (hence
//! `cpaCySetAddressTranslation` with `qaeVirtToPhysNUMA`); every buffer is
//! zeroed before it is freed.
//!
//! **Untested on hardware** (see [`super::qat`]): this code has run
//! against a stub QATlib that does the arithmetic in software (the tests
//! in `core/tests/offload.rs`), never against a QAT device.
// QATlib is C, reached through dlopen.
#![allow(unsafe_code)]

use crate::spawn::QuietSpawn;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use super::device::{Device, DeviceError, DeviceRequest};
use super::qat::{self, status_name, ProbeError, QatInfo};
use super::rsa_encoding::{rsa_crt, rsa_encode, rsa_result_matches};
use super::QatConfig;
use crate::sign::types::{KeyKind, Operation};

type CpaStatus = i32;
const CPA_STATUS_SUCCESS: CpaStatus = 0;
const CPA_STATUS_RETRY: CpaStatus = -2;
/// `CPA_CY_RSA_VERSION_TWO_PRIME`.
const RSA_VERSION_TWO_PRIME: i32 = 1;
/// `CPA_CY_RSA_PRIVATE_KEY_REP_TYPE_2` (p, q, dP, dQ, qInv).
const RSA_PRIVATE_KEY_REP_TYPE_2: i32 = 2;

/// `CpaFlatBuffer` (`cpa.h`).
#[repr(C)]
struct FlatBuffer {
    len: u32,
    data: *mut u8,
}

impl FlatBuffer {
    const EMPTY: FlatBuffer = FlatBuffer { len: 0, data: std::ptr::null_mut() };

    fn of(p: &Pinned) -> FlatBuffer {
        FlatBuffer { len: p.len as u32, data: p.ptr }
    }
}

/// `CpaCyRsaPrivateKeyRep1` (`cpa_cy_rsa.h`); unused with representation 2
/// but part of the key structure's layout.
#[repr(C)]
struct PrivateKeyRep1 {
    modulus_n: FlatBuffer,
    private_exponent_d: FlatBuffer,
}

/// `CpaCyRsaPrivateKeyRep2`.
#[repr(C)]
struct PrivateKeyRep2 {
    prime1_p: FlatBuffer,
    prime2_q: FlatBuffer,
    exponent1_dp: FlatBuffer,
    exponent2_dq: FlatBuffer,
    coefficient_qinv: FlatBuffer,
}

/// `CpaCyRsaPrivateKey`; the two enums are C `int`s.
#[repr(C)]
struct RsaPrivateKey {
    version: i32,
    private_key_rep_type: i32,
    rep1: PrivateKeyRep1,
    rep2: PrivateKeyRep2,
}

/// `CpaCyRsaDecryptOpData`.
#[repr(C)]
struct DecryptOpData {
    private_key: *mut RsaPrivateKey,
    input: FlatBuffer,
}

type InstanceHandle = *mut c_void;
/// `CpaCyGenFlatBufCbFunc` (`cpa_cy_common.h`).
type FlatBufCb = unsafe extern "C" fn(*mut c_void, CpaStatus, *mut c_void, *mut FlatBuffer);
type UserStartFn = unsafe extern "C" fn(*const std::ffi::c_char) -> CpaStatus;
type UserStopFn = unsafe extern "C" fn() -> CpaStatus;
type GetNumInstancesFn = unsafe extern "C" fn(*mut u16) -> CpaStatus;
type GetInstancesFn = unsafe extern "C" fn(u16, *mut InstanceHandle) -> CpaStatus;
type InstanceFn = unsafe extern "C" fn(InstanceHandle) -> CpaStatus;
type VirtToPhysFn = unsafe extern "C" fn(*mut c_void) -> u64;
type SetAddressTranslationFn = unsafe extern "C" fn(InstanceHandle, VirtToPhysFn) -> CpaStatus;
type RsaDecryptFn =
    unsafe extern "C" fn(InstanceHandle, Option<FlatBufCb>, *mut c_void, *const DecryptOpData, *mut FlatBuffer) -> CpaStatus;
type PollFn = unsafe extern "C" fn(InstanceHandle, u32) -> CpaStatus;
type MemAllocFn = unsafe extern "C" fn(usize, i32, usize) -> *mut c_void;
type MemFreeFn = unsafe extern "C" fn(*mut *mut c_void);

/// QATlib's entry points, resolved once; the libraries stay loaded for the
/// life of the process (see [`super::qat`]), so the pointers stay valid.
#[derive(Clone, Copy)]
struct Api {
    user_stop: UserStopFn,
    stop_instance: InstanceFn,
    rsa_decrypt: RsaDecryptFn,
    poll: PollFn,
    mem_alloc: MemAllocFn,
    mem_free: MemFreeFn,
}

/// A buffer in QATlib's pinned memory, zeroed and freed on drop.
struct Pinned {
    ptr: *mut u8,
    len: usize,
    free: MemFreeFn,
}

impl Pinned {
    fn new(api: &Api, bytes: &[u8]) -> Result<Pinned, DeviceError> {
        // 64-byte alignment: what QATlib's own samples ask for.
        // SAFETY: qaeMemAllocNUMA takes a size, a NUMA node and an
        // alignment and returns memory it owns or null.
        let ptr = unsafe { (api.mem_alloc)(bytes.len().max(1), 0, 64) }.cast::<u8>();
        if ptr.is_null() {
            return Err(DeviceError::Busy("QAT pinned memory exhausted (qaeMemAllocNUMA failed)".into()));
        }
        // SAFETY: `ptr` is a fresh allocation of at least `bytes.len()`
        // bytes that nothing else references.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
        Ok(Pinned { ptr, len: bytes.len(), free: api.mem_free })
    }

    /// A copy of the contents.
    fn read(&self) -> Zeroizing<Vec<u8>> {
        // SAFETY: `ptr` is valid for `len` bytes while `self` lives, and
        // the device has finished writing (this runs after its callback).
        Zeroizing::new(unsafe { std::slice::from_raw_parts(self.ptr, self.len) }.to_vec())
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from qaeMemAllocNUMA with at least `len`
        // bytes; volatile writes keep the wipe from being optimised away.
        // The device no longer uses the buffer (its request completed, or
        // it was never submitted).
        unsafe {
            for i in 0..self.len {
                std::ptr::write_volatile(self.ptr.add(i), 0);
            }
            let mut p = self.ptr.cast::<c_void>();
            (self.free)(&mut p);
        }
    }
}

/// One request at the device, with everything the device reads or writes
/// through pointers. The structures are boxed so that their addresses stay
/// fixed while the record moves in and out of the registry.
struct InFlight {
    req: DeviceRequest,
    /// The encoded input, kept to check the result against.
    em: Zeroizing<Vec<u8>>,
    _key: Box<RsaPrivateKey>,
    _op: Box<DecryptOpData>,
    _out: Box<FlatBuffer>,
    output: Pinned,
    /// p, q, dP, dQ, qInv and the input.
    _inputs: Vec<Pinned>,
}

// SAFETY: the raw pointers in an `InFlight` point into its own boxes and
// pinned buffers, which move with it and which only the thread holding the
// record touches (the device reads them until the callback, after which
// the record is taken out of the registry by exactly one thread).
unsafe impl Send for InFlight {}

impl InFlight {
    /// Completes the request with the device's answer.
    fn finish(self, status: CpaStatus) {
        let result = if status != CPA_STATUS_SUCCESS {
            Err(DeviceError::Failed(format!("QAT completed the request with {status} ({})", status_name(status))))
        } else {
            let out = self.output.read();
            if rsa_result_matches(self.req.key(), &self.em, &out) {
                Ok(out)
            } else {
                Err(DeviceError::Failed("the QAT result failed the public-key check (a device fault); not used".into()))
            }
        };
        let InFlight { req, output, _inputs, .. } = self;
        // Wipe and free the key material before answering.
        drop((output, _inputs));
        req.complete(result);
    }
}

/// The callback tag: which device, which request.
struct Tag {
    shared: Arc<Shared>,
    id: u64,
}

struct Shared {
    api: Api,
    instances: Vec<usize>,
    registry: Mutex<HashMap<u64, InFlight>>,
    /// Wakes the poller when work arrives or the device stops.
    wake: Condvar,
    stopping: AtomicBool,
}

impl Shared {
    fn registry(&self) -> MutexGuard<'_, HashMap<u64, InFlight>> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// QATlib calls this from `icp_sal_CyPollInstance`, on the poller thread.
unsafe extern "C" fn on_complete(tag: *mut c_void, status: CpaStatus, _op: *mut c_void, _out: *mut FlatBuffer) {
    // Nothing may unwind into QATlib's C frames.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if tag.is_null() {
            return;
        }
        // SAFETY: every tag passed to cpaCyRsaDecrypt is a `Box<Tag>`
        // turned into a raw pointer, and QATlib calls back once per
        // accepted request, so the box is reclaimed exactly once.
        let tag = unsafe { Box::from_raw(tag.cast::<Tag>()) };
        let record = tag.shared.registry().remove(&tag.id);
        if let Some(record) = record {
            record.finish(status);
        }
    }));
}

/// The QAT device (see the [module documentation](self)).
pub struct QatDevice {
    shared: Arc<Shared>,
    info: QatInfo,
    next_instance: AtomicU64,
    poller: Mutex<Option<JoinHandle<()>>>,
    max_in_flight: usize,
}

impl std::fmt::Debug for QatDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QatDevice").field("info", &self.info).finish_non_exhaustive()
    }
}

/// How long [`QatDevice`]'s drop waits for requests at the device.
const DRAIN: Duration = Duration::from_secs(2);
/// Poll interval while requests are at the device and none completed.
const POLL_IDLE: Duration = Duration::from_micros(20);

fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, ProbeError> {
    let mut s = Vec::with_capacity(name.len() + 1);
    s.extend_from_slice(name.as_bytes());
    s.push(0);
    // SAFETY: each caller names a QATlib entry point with the type `T`
    // that QATlib's headers give it (see the type aliases above).
    unsafe { lib.get::<T>(&s).map(|f| *f) }.map_err(|e| ProbeError::MissingSymbol(format!("{name} is missing from QATlib: {e}")))
}

impl QatDevice {
    /// Probes for QAT ([`qat::probe`]), then registers with QATlib, starts
    /// every crypto instance with address translation set, and starts the
    /// polling thread.
    ///
    /// # Errors
    /// Those of [`qat::probe`]; [`ProbeError::NoInstance`] when QATlib
    /// refuses to start or to start an instance.
    pub fn open(config: &QatConfig) -> Result<Arc<QatDevice>, ProbeError> {
        let info = qat::probe(config)?;
        let section =
            CString::new(config.section.as_bytes()).map_err(|_| ProbeError::Config("the QAT section name contains a NUL byte".into()))?;
        let lib =
            qat::open(&info.library).map_err(|e| ProbeError::LibraryMissing(format!("{} could not be opened again: {e}", info.library)))?;
        let mem = qat::open(&info.memory_library)
            .map_err(|e| ProbeError::LibraryMissing(format!("{} could not be opened again: {e}", info.memory_library)))?;
        let user_start: UserStartFn = symbol(&lib, "icp_sal_userStart")?;
        let num_instances: GetNumInstancesFn = symbol(&lib, "cpaCyGetNumInstances")?;
        let get_instances: GetInstancesFn = symbol(&lib, "cpaCyGetInstances")?;
        let start_instance: InstanceFn = symbol(&lib, "cpaCyStartInstance")?;
        let set_translation: SetAddressTranslationFn = symbol(&lib, "cpaCySetAddressTranslation")?;
        let virt_to_phys: VirtToPhysFn = symbol(&mem, "qaeVirtToPhysNUMA")?;
        let api = Api {
            user_stop: symbol(&lib, "icp_sal_userStop")?,
            stop_instance: symbol(&lib, "cpaCyStopInstance")?,
            rsa_decrypt: symbol(&lib, "cpaCyRsaDecrypt")?,
            poll: symbol(&lib, "icp_sal_CyPollInstance")?,
            mem_alloc: symbol(&mem, "qaeMemAllocNUMA")?,
            mem_free: symbol(&mem, "qaeMemFreeNUMA")?,
        };
        // Never unloaded: QATlib's code is about to run (see `qat`).
        std::mem::forget((lib, mem));

        let fail = |what: String| ProbeError::NoInstance(format!("QATlib found but the device cannot start: {what}"));
        // SAFETY: `section` is NUL-terminated and outlives the call.
        let status = unsafe { user_start(section.as_ptr()) };
        if status != CPA_STATUS_SUCCESS {
            return Err(fail(format!("icp_sal_userStart failed with {status} ({})", status_name(status))));
        }
        let stop_all = |started: &[InstanceHandle]| {
            for &h in started {
                // SAFETY: `h` was started by cpaCyStartInstance.
                unsafe { (api.stop_instance)(h) };
            }
            // SAFETY: paired with the successful icp_sal_userStart above.
            unsafe { (api.user_stop)() };
        };
        let mut count: u16 = 0;
        // SAFETY: QATlib writes one u16 through a pointer to a local.
        let status = unsafe { num_instances(&mut count) };
        if status != CPA_STATUS_SUCCESS || count == 0 {
            stop_all(&[]);
            return Err(fail(format!("cpaCyGetNumInstances gave {count} instance(s), status {status}")));
        }
        let mut handles: Vec<InstanceHandle> = vec![std::ptr::null_mut(); count as usize];
        // SAFETY: `handles` has room for `count` handles, as the call
        // requires.
        let status = unsafe { get_instances(count, handles.as_mut_ptr()) };
        if status != CPA_STATUS_SUCCESS {
            stop_all(&[]);
            return Err(fail(format!("cpaCyGetInstances failed with {status} ({})", status_name(status))));
        }
        let mut started = Vec::new();
        for &h in &handles {
            // SAFETY: `h` is an instance handle QATlib just returned;
            // `virt_to_phys` is QATlib's own translation function.
            let status = unsafe { set_translation(h, virt_to_phys) };
            // SAFETY: as above.
            let status = if status == CPA_STATUS_SUCCESS { unsafe { start_instance(h) } } else { status };
            if status != CPA_STATUS_SUCCESS {
                stop_all(&started);
                return Err(fail(format!("starting a crypto instance failed with {status} ({})", status_name(status))));
            }
            started.push(h);
        }
        let shared = Arc::new(Shared {
            api,
            // Kept as integers so that `Shared` is Send and Sync; QATlib
            // handles may be used from any thread.
            instances: started.iter().map(|&h| h as usize).collect(),
            registry: Mutex::new(HashMap::new()),
            wake: Condvar::new(),
            stopping: AtomicBool::new(false),
        });
        let poller = {
            let shared = shared.clone();
            std::thread::Builder::new().name("keyfence-qat-poll".into()).spawn_quiet(move || poll_loop(&shared))
        };
        let poller = match poller {
            Ok(p) => p,
            Err(e) => {
                stop_all(&started);
                return Err(fail(format!("cannot start the polling thread: {e}")));
            }
        };
        Ok(Arc::new(QatDevice { shared, info, next_instance: AtomicU64::new(0), poller: Mutex::new(Some(poller)), max_in_flight: 1024 }))
    }

    /// What the probe found.
    pub fn info(&self) -> &QatInfo {
        &self.info
    }

    fn submit_one(&self, req: DeviceRequest) {
        let fail = |req: DeviceRequest, e: DeviceError| req.complete(Err(e));
        if Instant::now() >= req.deadline() {
            return fail(req, DeviceError::Expired);
        }
        let Some(crt) = rsa_crt(req.key()) else {
            return fail(req, DeviceError::Unsupported("a key without balanced CRT components".into()));
        };
        let em = match rsa_encode(req.key(), req.operation()) {
            Ok(em) => em,
            Err(e) => return fail(req, DeviceError::Rejected(e)),
        };
        let api = &self.shared.api;
        let pinned = (|| {
            let inputs = vec![
                Pinned::new(api, &crt.p)?,
                Pinned::new(api, &crt.q)?,
                Pinned::new(api, &crt.dp)?,
                Pinned::new(api, &crt.dq)?,
                Pinned::new(api, &crt.qinv)?,
                Pinned::new(api, &em)?,
            ];
            Ok::<_, DeviceError>((inputs, Pinned::new(api, &vec![0u8; crt.modulus_len])?))
        })();
        let (inputs, output) = match pinned {
            Ok(v) => v,
            Err(e) => return fail(req, e),
        };
        let mut key = Box::new(RsaPrivateKey {
            version: RSA_VERSION_TWO_PRIME,
            private_key_rep_type: RSA_PRIVATE_KEY_REP_TYPE_2,
            rep1: PrivateKeyRep1 { modulus_n: FlatBuffer::EMPTY, private_exponent_d: FlatBuffer::EMPTY },
            rep2: PrivateKeyRep2 {
                prime1_p: FlatBuffer::of(&inputs[0]),
                prime2_q: FlatBuffer::of(&inputs[1]),
                exponent1_dp: FlatBuffer::of(&inputs[2]),
                exponent2_dq: FlatBuffer::of(&inputs[3]),
                coefficient_qinv: FlatBuffer::of(&inputs[4]),
            },
        });
        let op = Box::new(DecryptOpData { private_key: &mut *key, input: FlatBuffer::of(&inputs[5]) });
        let mut out = Box::new(FlatBuffer::of(&output));
        let (op_ptr, out_ptr): (*const DecryptOpData, *mut FlatBuffer) = (&*op, &mut *out);
        let id = req.id();
        let record = InFlight { req, em, _key: key, _op: op, _out: out, output, _inputs: inputs };
        // Registered before submitting: the callback may run on the poller
        // before cpaCyRsaDecrypt returns here.
        let duplicate = {
            match self.shared.registry().entry(id) {
                std::collections::hash_map::Entry::Occupied(_) => Some(record),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(record);
                    None
                }
            }
        };
        if let Some(record) = duplicate {
            // Ids are unique per backend; a duplicate is the submitter's
            // bug, answered without touching the request already there.
            let InFlight { req, output, _inputs, .. } = record;
            drop((output, _inputs));
            return fail(req, DeviceError::Failed(format!("request id {id} is already at the device")));
        }
        let n = self.shared.instances.len() as u64;
        let instance = self.shared.instances[(self.next_instance.fetch_add(1, Ordering::Relaxed) % n) as usize];
        let tag = Box::into_raw(Box::new(Tag { shared: self.shared.clone(), id }));
        // SAFETY: `instance` is a started instance; `op_ptr` and `out_ptr`
        // point into boxes owned by the registered record, which stays
        // alive (and its pinned buffers with it) until the callback takes
        // it out, or until below if the request is refused; `tag` is a
        // leaked Box<Tag> that the callback reclaims.
        let status = unsafe { (api.rsa_decrypt)(instance as InstanceHandle, Some(on_complete), tag.cast(), op_ptr, out_ptr) };
        if status != CPA_STATUS_SUCCESS {
            // Refused: no callback will come for it.
            // SAFETY: `tag` came from Box::into_raw above and QATlib did
            // not keep it.
            drop(unsafe { Box::from_raw(tag) });
            if let Some(record) = self.shared.registry().remove(&id) {
                let InFlight { req, output, _inputs, .. } = record;
                drop((output, _inputs));
                let why = format!("cpaCyRsaDecrypt refused the request with {status} ({})", status_name(status));
                req.complete(Err(if status == CPA_STATUS_RETRY { DeviceError::Busy(why) } else { DeviceError::Failed(why) }));
            }
            return;
        }
        self.shared.wake.notify_one();
    }
}

/// Polls every instance while requests are at the device; sleeps on the
/// condition variable otherwise.
fn poll_loop(shared: &Shared) {
    loop {
        {
            let registry = shared.registry();
            if registry.is_empty() {
                if shared.stopping.load(Ordering::Acquire) {
                    return;
                }
                // Timed, so that a stop is noticed without a wake-up.
                drop(shared.wake.wait_timeout(registry, Duration::from_millis(50)));
                continue;
            }
        }
        let mut completed = false;
        for &h in &shared.instances {
            // SAFETY: `h` is a started instance; a quota of 0 polls every
            // response available. Callbacks run inside this call.
            let status = unsafe { (shared.api.poll)(h as InstanceHandle, 0) };
            completed |= status == CPA_STATUS_SUCCESS;
        }
        if !completed {
            std::thread::sleep(POLL_IDLE);
        }
        if shared.stopping.load(Ordering::Acquire) && shared.registry().is_empty() {
            return;
        }
    }
}

impl Device for QatDevice {
    fn name(&self) -> &str {
        "qat"
    }

    /// RSA signatures (PKCS #1 v1.5 and PSS) and raw RSA decryption with
    /// 2048-, 3072- and 4096-bit keys: QAT's RSA sizes that keyfence
    /// loads. ECDSA and Ed25519 stay in software.
    fn supports(&self, kind: KeyKind, op: &Operation) -> bool {
        let KeyKind::Rsa { bits } = kind else { return false };
        if !matches!(bits, 2048 | 3072 | 4096) {
            return false;
        }
        match op {
            Operation::DecryptRaw { .. } => true,
            Operation::Sign { alg, .. } => kind.supports(*alg),
        }
    }

    fn max_batch(&self) -> usize {
        64
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    fn submit(&self, batch: Vec<DeviceRequest>) {
        for req in batch {
            self.submit_one(req);
        }
    }
}

impl Drop for QatDevice {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        let deadline = Instant::now() + DRAIN;
        while !self.shared.registry().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Requests the device never answered: fail them, and leak their
        // buffers, which the device might still write.
        let stuck: Vec<InFlight> = self.shared.registry().drain().map(|(_, r)| r).collect();
        for record in stuck {
            let InFlight { req, em, _key, _op, _out, output, _inputs } = record;
            std::mem::forget((_key, _op, _out, output, _inputs));
            drop(em);
            req.complete(Err(DeviceError::Failed("the QAT device stopped with the request unanswered".into())));
        }
        let poller = self.poller.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(p) = poller {
            let _ = p.join();
        }
        for &h in &self.shared.instances {
            // SAFETY: each handle was started in `open` and is stopped once.
            unsafe { (self.shared.api.stop_instance)(h as InstanceHandle) };
        }
        // SAFETY: paired with the icp_sal_userStart in `open`.
        unsafe { (self.shared.api.user_stop)() };
    }
}
