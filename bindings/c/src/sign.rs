//! Asynchronous signing from C: an engine, private keys (in this process
//! or in a key process), and three ways to get a result: block,
//! a callback, or a completion queue whose file descriptor an event loop
//! polls.

use std::ffi::{c_char, c_int, c_void};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use keyfence_core::sign::key_process::{KeyProcessConfig, KeySource, MachineFiles};
use keyfence_core::sign::managed::{load_in_process, Isolation, ManagedConfig, ManagedEngine};
use keyfence_core::sign::offload::OffloadMode;
use keyfence_core::sign::{ClassConfig, CompletionQueue, OpClass, OpHandle, PrivateKey, Request};
use keyfence_core::ErrorCode;
use zeroize::Zeroizing;

use crate::bytes::{self, keyfence_bytes};
use crate::error::{keyfence_result, Error};
use crate::ffi;

/// The engine's executor classes, each with its own threads and bounded
/// queue, so a slow class never delays a fast one.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum keyfence_op_class {
    /// RSA in software (about a millisecond per signature).
    KEYFENCE_CLASS_RSA = 0,
    /// ECDSA and Ed25519 in software (tens of microseconds).
    KEYFENCE_CLASS_EC = 1,
    /// Operations that wait on something outside the process: the
    /// key process, an offload device.
    KEYFENCE_CLASS_SLOW = 2,
    /// Keys in a PKCS#11 token this process loaded
    /// (`keyfence_key_load_pkcs11`): each operation blocks one of these
    /// threads until the token answers, so they never hold up software
    /// keys. A token key held by a key process or an agent counts here
    /// on `KEYFENCE_CLASS_RSA` or `KEYFENCE_CLASS_EC` by its kind, as every
    /// key they hold; the token's threads are theirs.
    KEYFENCE_CLASS_TOKEN = 3,
}

fn class_of(n: u32) -> Result<OpClass, Error> {
    OpClass::ALL.get(n as usize).copied().ok_or_else(|| Error::new(ErrorCode::InvalidArgument, format!("no executor class {n}")))
}

/// An engine's settings, built before `keyfence_engine_new`. Not
/// thread-safe; free it with `keyfence_engine_config_free` (the engine
/// does not keep it).
pub struct keyfence_engine_config(ManagedConfig);

/// A signing engine. Thread-safe: any thread may submit to it. Freeing it
/// shuts it down: operations still queued fail with `KEYFENCE_SHUT_DOWN`.
pub struct keyfence_engine(pub(crate) ManagedEngine);

/// A private key: in this process's memory, or a handle on one held by an
/// key process. Thread-safe and immutable; operations hold their
/// own reference, so it may be freed while they run.
pub struct keyfence_private_key(pub(crate) Arc<PrivateKey>);

/// A completion queue: finished operations submitted with
/// `keyfence_engine_submit_to_queue` wait here, and its file descriptor is
/// readable while any do. Thread-safe.
pub struct keyfence_completion_queue(CompletionQueue);

/// A submitted operation, for cancelling it: returned by the submit
/// functions when asked for. It does not keep the operation alive and may
/// be freed at any time (before or after the operation ends). Thread-safe.
pub struct keyfence_operation(OpHandle);

/// One finished operation, as `keyfence_completion_queue_drain` returns it.
/// Free its `signature` and `message` with `keyfence_bytes_free`.
#[repr(C)]
#[derive(Debug)]
pub struct keyfence_completion {
    /// The `user_data` given at submission.
    pub user_data: *mut c_void,
    /// The operation's id (`keyfence_operation_id`).
    pub op_id: u64,
    /// `KEYFENCE_OK`, or why the operation failed (`KEYFENCE_TIMED_OUT`,
    /// `KEYFENCE_BACKEND_FAILED`, ...).
    pub result: keyfence_result,
    /// The signature when `result` is `KEYFENCE_OK`, else empty.
    pub signature: keyfence_bytes,
    /// The error message when `result` is not `KEYFENCE_OK`, else empty.
    pub message: keyfence_bytes,
}

/// Called once with an operation's outcome, on an engine thread: keep it
/// short (hand the result to your own loop). `signature` is valid only
/// during the call (copy it), and `message` is the error text (NUL-
/// terminated) when `result` is not `KEYFENCE_OK`, else NULL.
pub type keyfence_sign_callback = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        result: keyfence_result,
        signature: *const u8,
        signature_len: usize,
        message: *const c_char,
    ),
>;

/// Default settings: threads per class from the core count, bounded
/// queues, a 2 s deadline per operation, keys in this process.
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_config_new(out: *mut *mut keyfence_engine_config) -> keyfence_result {
    // SAFETY: the caller's promise.
    unsafe { ffi::make(out, "out", || Ok(keyfence_engine_config(ManagedConfig::default()))) }
}

/// Sets one class's worker threads and queue capacity (0 keeps the
/// current value). A full queue answers `KEYFENCE_OVERLOADED` at once.
///
/// Errors: `KEYFENCE_INVALID_ARGUMENT` for an unknown class.
///
/// # Safety
/// `config` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_config_set_class(
    config: *mut keyfence_engine_config, class: u32, threads: u32, queue_capacity: u32,
) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promise.
        let c = unsafe { ffi::borrow_mut(config, "config")? };
        let class = class_of(class)?;
        let cc: &mut ClassConfig = match class {
            OpClass::Rsa => &mut c.0.engine.rsa,
            OpClass::Ec => &mut c.0.engine.ec,
            OpClass::Slow => &mut c.0.engine.slow,
            OpClass::Token => &mut c.0.engine.token,
        };
        if threads > 0 {
            cc.threads = threads as usize;
        }
        if queue_capacity > 0 {
            cc.queue_capacity = queue_capacity as usize;
        }
        Ok(())
    })
}

/// Sets the deadline of operations submitted without one, in
/// milliseconds; 0 restores the default (2000 ms), as a 0 deadline means
/// "the engine's" everywhere else in this API.
///
/// # Safety
/// `config` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_config_set_timeout_ms(config: *mut keyfence_engine_config, timeout_ms: u32) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promise.
        let c = unsafe { ffi::borrow_mut(config, "config")? };
        c.0.engine.default_timeout = match timeout_ms {
            0 => keyfence_core::sign::EngineConfig::default().default_timeout,
            ms => Duration::from_millis(u64::from(ms)),
        };
        Ok(())
    })
}

/// Keeps the engine's keys in a key process: keys loaded with
/// `keyfence_key_from_pem(engine, ...)` live only there, and a memory
/// disclosure in the server cannot reach them. `key_process` is the path of
/// the `keyfence-key-process` program, or NULL for the one installed beside
/// libkeyfence (never looked up on `PATH`).
///
/// # Safety
/// `config` is a live handle; `key_process` is NULL or a NUL-terminated
/// string.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_config_set_isolated(
    config: *mut keyfence_engine_config, key_process: *const c_char,
) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promise.
        let c = unsafe { ffi::borrow_mut(config, "config")? };
        c.0.isolation = Isolation::KeyProcess(if key_process.is_null() {
            KeyProcessConfig::default()
        } else {
            // SAFETY: non-NULL; a NUL-terminated string by the caller's promise.
            KeyProcessConfig::with_command([unsafe { ffi::text(key_process, "key_process")? }])
        });
        Ok(())
    })
}

/// Keeps the engine's keys in the key agent listening on `socket`
/// (`keyfence agent`, docs/deploy.md): keys loaded with
/// `keyfence_key_from_envelope(engine, NULL, NULL, ...)` are opened and
/// held by the agent, with its own machine key and store, so this process
/// needs neither (a server's workers running as `www-data` hold only the
/// socket). The engine connects when it is made (`keyfence_engine_new`
/// fails with `KEYFENCE_BACKEND_FAILED` and the reason when no agent
/// answers or it refuses this user), and again, loading its keys again,
/// when the agent restarts.
///
/// # Safety
/// `config` is a live handle; `socket` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_config_set_agent(config: *mut keyfence_engine_config, socket: *const c_char) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promises.
        let (c, socket) = unsafe { (ffi::borrow_mut(config, "config")?, ffi::text(socket, "socket")?) };
        if socket.is_empty() {
            return Err(Error::new(ErrorCode::InvalidArgument, "socket is empty"));
        }
        c.0.isolation = Isolation::Agent(socket.into());
        Ok(())
    })
}

/// Chooses whether keys this engine holds, in this process or in its key
/// process (`keyfence_engine_config_set_isolated`), sign on Intel's
/// crypto_mb multi-buffer device (docs/offload.md): `mode` is `"off"`,
/// `"on"` (`keyfence_engine_new` fails with `KEYFENCE_BACKEND_FAILED` and
/// the reason where crypto_mb cannot run: no library, or a CPU without
/// AVX-512 IFMA) or `"auto"` (the device where it runs, else software).
/// `mode` NULL restores the default: keys in this process sign in software
/// and a key process chooses `auto`. `crypto_mb` names the library (a
/// path, or a name the loader finds); NULL for `KEYFENCE_CRYPTO_MB`, else
/// `libcrypto_mb.so.13`; with a NULL `mode`, `keyfence_engine_new` refuses
/// it (`KEYFENCE_INVALID_CONFIG`).
/// An agent's engine refuses it at `keyfence_engine_new`
/// (`KEYFENCE_INVALID_CONFIG`): the agent chooses for the keys it holds.
///
/// # Safety
/// `config` is a live handle; `mode` and `crypto_mb` are each NULL or a
/// NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_config_set_offload(
    config: *mut keyfence_engine_config, mode: *const c_char, crypto_mb: *const c_char,
) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promises.
        let c = unsafe { ffi::borrow_mut(config, "config")? };
        let mode = if mode.is_null() {
            None
        } else {
            // SAFETY: non-NULL; a NUL-terminated string by the caller's promise.
            Some(unsafe { ffi::text(mode, "mode")? }.parse::<OffloadMode>()?)
        };
        let library = if crypto_mb.is_null() {
            None
        } else {
            // SAFETY: non-NULL; a NUL-terminated string by the caller's promise.
            Some(unsafe { ffi::text(crypto_mb, "crypto_mb")? }.to_string())
        };
        if library.as_deref().is_some_and(str::is_empty) {
            return Err(Error::new(ErrorCode::InvalidArgument, "crypto_mb is empty: pass NULL for the default library"));
        }
        c.0.offload = mode;
        c.0.crypto_mb = library;
        Ok(())
    })
}

/// Frees an engine configuration; NULL is a no-op.
///
/// # Safety
/// `config` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_config_free(config: *mut keyfence_engine_config) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(config) }
}

/// Starts an engine with `config` (NULL for the defaults) into `*out`:
/// its worker threads, and its key process when the configuration asks
/// for one.
///
/// Errors: `KEYFENCE_INVALID_CONFIG`, `KEYFENCE_IO` (threads),
/// `KEYFENCE_BACKEND_FAILED` if the key process does not start.
///
/// # Safety
/// `config` is NULL or a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_new(config: *const keyfence_engine_config, out: *mut *mut keyfence_engine) -> keyfence_result {
    // SAFETY: the caller's promises; NULL `config` means the defaults.
    unsafe {
        let config = config.as_ref().map_or_else(ManagedConfig::default, |c| c.0.clone());
        ffi::make(out, "out", || Ok(keyfence_engine(ManagedEngine::start(config)?)))
    }
}

/// Shuts the engine down and frees it; NULL is a no-op. Queued operations
/// fail with `KEYFENCE_SHUT_DOWN`; keys from its key process stop working.
/// It returns once every thread the engine started has ended (an
/// operation under way is let finish, at most 5 s in all), so a library
/// unloaded right after finds none of its threads running. Do not call it
/// from a completion callback while holding a lock that callbacks take.
///
/// # Safety
/// `engine` is NULL or a live handle no other thread uses, not used
/// afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_free(engine: *mut keyfence_engine) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(engine) }
}

/// `source` loaded by `engine`'s keys' home, or in this process when the
/// engine is NULL: what every key-loading function does once it has read
/// its arguments.
fn load(engine: Option<&keyfence_engine>, source: KeySource) -> Result<Arc<PrivateKey>, Error> {
    Ok(match engine {
        Some(e) => e.0.load(source)?,
        None => load_in_process(source)?,
    })
}

/// Loads a private key from PEM or DER bytes (PKCS#1, PKCS#8, SEC1; RSA
/// 2048-4096, ECDSA P-256/P-384, Ed25519) into `*out`. With `engine` NULL,
/// or an engine without a key process, the key is held in this process;
/// with an isolated engine it is handed to the key process and this process
/// keeps only a handle. The caller should wipe its copy of the bytes.
///
/// Errors: `KEYFENCE_INVALID_PRIVATE_KEY` (what is wrong with it, never
/// its contents), `KEYFENCE_BACKEND_FAILED` if the key process refuses it.
///
/// # Safety
/// `engine` is NULL or a live handle; `pem` points to `len` readable
/// bytes; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_from_pem(
    engine: *const keyfence_engine, pem: *const u8, len: usize, out: *mut *mut keyfence_private_key,
) -> keyfence_result {
    // SAFETY: the caller's promises; NULL engine means in-process.
    let (engine, pem) = unsafe { (engine.as_ref(), ffi::slice(pem, len, "pem")) };
    // SAFETY: `out` is NULL or writable, by the caller's promise.
    unsafe {
        key_out(out, || {
            let source = KeySource::Bytes(Zeroizing::new(pem?.to_vec()));
            load(engine, source)
        })
    }
}

/// Loads the private key wrapped in the envelope `env[0..len]`, opened
/// with the machine key in the file `machine_key_path` against the store
/// directory `store_dir`, into `*out`.
///
/// With an isolated engine the key process reads the machine key file and
/// opens the envelope: neither the customer key nor the machine key's
/// secret (which opens every key the machine may open) ever enters this
/// process. This process reads only the machine key's public part (its
/// authority, attributes and generations; the file's bytes are wiped at
/// once) to check first, without decrypting, that the envelope can be
/// opened, so a refusal has the same typed error in both modes. The key
/// process is given the envelope's bytes, and loads the same ones again
/// after a restart. With `engine` NULL or an engine without a key process,
/// the envelope is opened here, as `keyfence_machine_open` does.
///
/// With an engine whose keys are in an agent
/// (`keyfence_engine_config_set_agent`), `store_dir` and
/// `machine_key_path` are NULL: the agent opens the envelope with its own
/// machine key and store, and this process reads nothing.
///
/// Errors: `KEYFENCE_IO` if the machine key file cannot be read,
/// `KEYFENCE_INVALID_KEY` if it does not decode, `KEYFENCE_STORE_IO`,
/// `KEYFENCE_INVALID_ENVELOPE`, `KEYFENCE_POLICY_NOT_SATISFIED`,
/// `KEYFENCE_RETIRED_GENERATION`, `KEYFENCE_UNKNOWN_POLICY_KEY`,
/// `KEYFENCE_WRONG_AUTHORITY` (as `keyfence_machine_open`),
/// `KEYFENCE_INVALID_PRIVATE_KEY` if the envelope holds no usable key,
/// the same codes when an agent opens it for this process (its reason in
/// the message), `KEYFENCE_BACKEND_FAILED` if the key process or the agent
/// itself fails, `KEYFENCE_INVALID_ARGUMENT` for
/// NULL names with an engine that has no agent.
///
/// # Safety
/// `engine` is NULL or a live handle; `store_dir` and `machine_key_path`
/// are NUL-terminated strings (or NULL, with an agent's engine); `env`
/// points to `len` readable bytes; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_from_envelope(
    engine: *const keyfence_engine, store_dir: *const c_char, machine_key_path: *const c_char, env: *const u8, len: usize,
    out: *mut *mut keyfence_private_key,
) -> keyfence_result {
    // SAFETY: the caller's promises; NULL engine means in-process.
    let engine = unsafe { engine.as_ref() };
    // A NULL store or machine key: the core decides (only an engine whose
    // keys are in an agent, which opens the envelope with its own, loads
    // one without them; a store and machine key given to it are not read).
    let machine = match (store_dir.is_null(), machine_key_path.is_null()) {
        (false, false) => {
            // SAFETY: the caller's promise: NUL-terminated strings.
            unsafe { ffi::text(store_dir, "store_dir").and_then(|s| Ok((s, ffi::text(machine_key_path, "machine_key_path")?))) }
                .map(|(store, machine_key)| Some(MachineFiles { store: store.into(), machine_key: machine_key.into() }))
        }
        _ => Ok(None),
    };
    // SAFETY: the caller's promise.
    let envelope = unsafe { ffi::slice(env, len, "env") };
    // SAFETY: `out` is NULL or writable, by the caller's promise.
    unsafe {
        key_out(out, || {
            let source = KeySource::Envelope { envelope: envelope?.to_vec(), machine: machine? };
            load(engine, source)
        })
    }
}

/// Loads the private key that the PKCS#11 URI `uri` names (RFC 7512) into
/// `*out`: a handle on a key that never leaves its token (an HSM, a TPM, a
/// cloud KMS's PKCS#11 library, SoftHSM2). The token signs; the engine
/// runs its operations on the `KEYFENCE_CLASS_TOKEN` executor.
///
/// `uri` names the token and the key object (`token=`, `object=`, `id=`;
/// `type=private` or none), and may name the module (`module-path=` or
/// `module-name=`) and a file whose first line is the PIN
/// (`pin-source=file:/path`). What it leaves out comes from the
/// environment of the process that loads the key: `KEYFENCE_PKCS11_MODULE`,
/// then `KEYFENCE_PKCS11_PIN_FILE` or `KEYFENCE_PKCS11_PIN`. A PIN in the
/// URI itself (`pin-value=`) is refused, so a URI may be logged.
///
/// With `engine` NULL or an engine without a key process, this process
/// loads the module, once, and logs into the token, once: every key of a
/// token shares its sessions and its login. With an isolated engine
/// (`keyfence_engine_config_set_isolated`) the URI is sent to the key
/// process, which loads the module and reads the PIN (with the
/// environment it inherited from this process): this process never maps
/// the module nor reads the PIN, and the key is loaded again after a
/// restart. With an agent's engine (`keyfence_engine_config_set_agent`)
/// the agent loads it with its own module and PIN settings. An engine
/// whose keys are on remote key servers refuses it.
///
/// Errors: `KEYFENCE_INVALID_ARGUMENT` (a URI that does not parse, with the
/// position; one that names no key, carries `pin-value`, or whose PIN
/// file cannot be read; an engine whose keys are remote),
/// `KEYFENCE_INVALID_CONFIG` (no module named, or one that cannot be
/// loaded or initialized), `KEYFENCE_INVALID_PRIVATE_KEY` (no such token,
/// the message listing the module's tokens, or no such key on it),
/// `KEYFENCE_TOKEN_LOGIN` (the token needs a PIN and none was given, or it
/// refused the PIN; a refused PIN is not tried again until another one is
/// given), `KEYFENCE_TOKEN_UNAVAILABLE` (the token does not answer),
/// `KEYFENCE_BACKEND_FAILED` (the key process or agent failed),
/// `KEYFENCE_SHUT_DOWN`. No message contains the PIN.
///
/// ```c
/// keyfence_private_key *key = NULL;
/// keyfence_result r = keyfence_key_load_pkcs11(engine,
///     "pkcs11:token=edge;object=tls-p256;type=private"
///     "?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/etc/keyfence/pin",
///     &key);
/// if (r == KEYFENCE_TOKEN_LOGIN) {
///     // the PIN is missing or wrong: fix the PIN file, then load again
/// }
/// ```
///
/// # Safety
/// `engine` is NULL or a live handle; `uri` is a NUL-terminated string;
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_load_pkcs11(
    engine: *const keyfence_engine, uri: *const c_char, out: *mut *mut keyfence_private_key,
) -> keyfence_result {
    // SAFETY: the caller's promises; NULL engine means in-process.
    let (engine, uri) = unsafe { (engine.as_ref(), ffi::text(uri, "uri")) };
    // SAFETY: `out` is NULL or writable, by the caller's promise.
    unsafe {
        key_out(out, || {
            let source = KeySource::Pkcs11(uri?.to_owned());
            load(engine, source)
        })
    }
}

/// Whether the key is in this process's memory (`*local` true) or a
/// handle on a key held elsewhere: a key process, or remote key
/// servers (`keyfence_remote_key`).
///
/// # Safety
/// `key` is a live handle; `local` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_is_local(key: *const keyfence_private_key, local: *mut bool) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(local, "local")?;
        // SAFETY: the caller's promise.
        let key = unsafe { ffi::borrow(key, "key")? };
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { out.write(key.0.is_local()) };
        Ok(())
    })
}

/// The key's public half as DER `SubjectPublicKeyInfo`, into `*out`, for
/// verifiers and certificates.
///
/// # Safety
/// `key` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_public_der(key: *const keyfence_private_key, out: *mut keyfence_bytes) -> keyfence_result {
    // SAFETY: the caller's promises.
    unsafe { bytes::make(out, "out", || Ok(ffi::borrow(key, "key")?.0.public_key_der()?)) }
}

/// Frees a key handle; NULL is a no-op. Operations already submitted keep
/// their own reference and finish.
///
/// # Safety
/// `key` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_free(key: *mut keyfence_private_key) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(key) }
}

/// Hands the key `f` loads to C through `*out`: the body of every function
/// that makes a `keyfence_private_key`.
///
/// # Safety
/// `out` is NULL or writable.
pub(crate) unsafe fn key_out(out: *mut *mut keyfence_private_key, f: impl FnOnce() -> Result<Arc<PrivateKey>, Error>) -> keyfence_result {
    // SAFETY: the caller's promise.
    unsafe { ffi::make(out, "out", || Ok(keyfence_private_key(f()?))) }
}

/// The request every submit function builds from its C arguments.
///
/// # Safety
/// As the submit functions: `key` live, `alg` a NUL-terminated string,
/// `msg` `len` readable bytes.
unsafe fn request(
    key: *const keyfence_private_key, alg: *const c_char, msg: *const u8, len: usize, timeout_ms: u32,
) -> Result<Request, Error> {
    // SAFETY: the caller's promises, passed on.
    let (key, alg, msg) = unsafe { (ffi::borrow(key, "key")?, ffi::text(alg, "alg")?, ffi::slice(msg, len, "msg")?) };
    let timeout = (timeout_ms > 0).then_some(f64::from(timeout_ms));
    Ok(ManagedEngine::request(key.0.clone(), alg, msg.to_vec(), timeout)?)
}

/// Signs `msg[0..len]` with `key` and the algorithm named `alg`
/// (`"ecdsa-p256-sha256"`, `"rsa-pss-sha256"`, `"ed25519"`, ...; see
/// docs/signing.md), waiting for the result: for scripts, tools and
/// synchronous callers (the OpenSSL provider), not for an event loop. A
/// key in this process's memory is signed on the calling thread, with no
/// hand-off to an engine thread; a key held by a key process or an agent
/// goes through the engine. `timeout_ms` 0 uses the engine's deadline.
///
/// Errors: `KEYFENCE_INVALID_REQUEST` (unknown algorithm, or one that does
/// not fit the key), `KEYFENCE_OVERLOADED` (a held key's queue is full),
/// `KEYFENCE_TIMED_OUT`, `KEYFENCE_BACKEND_FAILED`, `KEYFENCE_SHUT_DOWN`.
///
/// # Safety
/// `engine` and `key` are live handles; `alg` is a NUL-terminated string;
/// `msg` points to `len` readable bytes; `signature` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_sign(
    engine: *const keyfence_engine, key: *const keyfence_private_key, alg: *const c_char, msg: *const u8, len: usize, timeout_ms: u32,
    signature: *mut keyfence_bytes,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        bytes::make(signature, "signature", || {
            let (engine, req) = (ffi::borrow(engine, "engine")?, request(key, alg, msg, len, timeout_ms)?);
            // The caller waits: a key in this process is signed on its thread.
            Ok(engine.0.perform(req)?)
        })
    }
}

/// A `user_data` pointer carried to another thread: the engine never
/// dereferences it, it only hands it back.
#[derive(Clone, Copy)]
struct UserData(*mut c_void);
// SAFETY: the pointer is opaque to keyfence and only returned to the
// caller, who chose to pass it across threads.
unsafe impl Send for UserData {}

/// Submits a signature and returns at once; `callback(user_data, ...)` is
/// called exactly once with the outcome, on an engine thread, unless this
/// function returns an error (then never). When `op` is not NULL, `*op`
/// receives a handle to cancel the operation with (free it with
/// `keyfence_operation_free`).
///
/// Errors, at once: `KEYFENCE_OVERLOADED` (the class's queue is full: shed
/// load), `KEYFENCE_INVALID_REQUEST`, `KEYFENCE_SHUT_DOWN`,
/// `KEYFENCE_INVALID_ARGUMENT` (NULL callback).
///
/// # Safety
/// As `keyfence_engine_sign`; `callback` is safe to call from any thread
/// with `user_data`; `op` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_submit(
    engine: *const keyfence_engine, key: *const keyfence_private_key, alg: *const c_char, msg: *const u8, len: usize, timeout_ms: u32,
    callback: keyfence_sign_callback, user_data: *mut c_void, op: *mut *mut keyfence_operation,
) -> keyfence_result {
    ffi::boundary(|| {
        let cb = callback.ok_or_else(|| ffi::null("callback"))?;
        // SAFETY: the caller's promises, passed on.
        let (engine, req) = unsafe { (ffi::borrow(engine, "engine")?, request(key, alg, msg, len, timeout_ms)?) };
        let ud = UserData(user_data);
        let handle = engine.0.submit_with_callback(req, move |result| {
            let ud = ud;
            // Nothing may unwind out of the engine thread into C or
            // back; the callback is C and cannot unwind in Rust terms.
            match result {
                // SAFETY: `cb` is the caller's callback, callable from
                // any thread; the signature lives for the call.
                Ok(sig) => unsafe { cb(ud.0, keyfence_result::OK, sig.as_ptr(), sig.len(), std::ptr::null()) },
                Err(e) => {
                    let code = e.code().into();
                    let msg = std::ffi::CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
                    // SAFETY: as above; the message lives for the call.
                    unsafe { cb(ud.0, code, std::ptr::null(), 0, msg.as_ptr()) }
                }
            }
        })?;
        if !op.is_null() {
            // SAFETY: non-NULL and writable by the caller's promise.
            unsafe { ffi::give(op, keyfence_operation(handle)) };
        }
        Ok(())
    })
}

/// A new completion queue into `*out`.
///
/// Errors: `KEYFENCE_IO` if the system has no file descriptors left.
///
/// # Safety
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_completion_queue_new(out: *mut *mut keyfence_completion_queue) -> keyfence_result {
    // SAFETY: the caller's promise.
    unsafe { ffi::make(out, "out", || Ok(keyfence_completion_queue(CompletionQueue::new()?))) }
}

/// The queue's file descriptor, for epoll/kqueue/poll: readable while
/// completions wait. Do not read, write or close it; drain with
/// `keyfence_completion_queue_drain`. -1 if `queue` is NULL.
///
/// # Safety
/// `queue` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn keyfence_completion_queue_fd(queue: *const keyfence_completion_queue) -> c_int {
    // SAFETY: the caller's promise; NULL becomes -1.
    match unsafe { queue.as_ref() } {
        Some(q) => q.0.as_raw_fd(),
        None => -1,
    }
}

/// Submits a signature and returns at once; its outcome is pushed onto
/// `queue` with `user_data` (never dereferenced by keyfence) and the queue's
/// descriptor becomes readable. When `op` is not NULL, `*op` receives a
/// handle to cancel it with (free it with `keyfence_operation_free`).
///
/// Errors, at once (then nothing is queued): as `keyfence_engine_submit`.
///
/// # Safety
/// As `keyfence_engine_sign`; `queue` is a live handle that outlives the
/// operation's completion or is drained before it is freed; `op` is NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_submit_to_queue(
    engine: *const keyfence_engine, key: *const keyfence_private_key, alg: *const c_char, msg: *const u8, len: usize, timeout_ms: u32,
    queue: *const keyfence_completion_queue, user_data: *mut c_void, op: *mut *mut keyfence_operation,
) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promises, passed on.
        let (engine, q, req) =
            unsafe { (ffi::borrow(engine, "engine")?, ffi::borrow(queue, "queue")?, request(key, alg, msg, len, timeout_ms)?) };
        let handle = engine.0.submit_to_queue(req, &q.0, user_data as usize as u64)?;
        if !op.is_null() {
            // SAFETY: non-NULL and writable by the caller's promise.
            unsafe { ffi::give(op, keyfence_operation(handle)) };
        }
        Ok(())
    })
}

/// The operation's id, as its completion reports it in `op_id`; 0 if `op`
/// is NULL.
///
/// # Safety
/// `op` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn keyfence_operation_id(op: *const keyfence_operation) -> u64 {
    // SAFETY: the caller's promise; NULL becomes 0.
    unsafe { op.as_ref() }.map_or(0, |o| o.0.id())
}

/// Cancels the operation: it completes with `KEYFENCE_CANCELLED` (through
/// its callback or queue) and its inputs are released. One still queued
/// never runs; one already running finishes and its result is discarded.
/// `*cancelled` (if not NULL) says whether this call ended it (false if it
/// had already ended).
///
/// # Safety
/// `op` is a live handle; `cancelled` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_operation_cancel(op: *const keyfence_operation, cancelled: *mut bool) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promise.
        let op = unsafe { ffi::borrow(op, "op")? };
        let ended_now = op.0.cancel();
        if !cancelled.is_null() {
            // SAFETY: non-NULL and writable by the caller's promise.
            unsafe { cancelled.write(ended_now) };
        }
        Ok(())
    })
}

/// Frees an operation handle (the operation itself goes on); NULL is a
/// no-op.
///
/// # Safety
/// `op` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_operation_free(op: *mut keyfence_operation) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(op) }
}

/// Moves up to `cap` finished operations into `out[0..]` without blocking
/// and writes how many to `*n` (0 when none wait). The descriptor stays
/// readable while more wait, so an edge-triggered loop should drain until
/// `*n < cap`. Free each completion's `signature` and `message` with
/// `keyfence_bytes_free`.
///
/// # Safety
/// `queue` is a live handle; `out` points to `cap` writable completions;
/// `n` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_completion_queue_drain(
    queue: *const keyfence_completion_queue, out: *mut keyfence_completion, cap: usize, n: *mut usize,
) -> keyfence_result {
    ffi::boundary(|| {
        let n_out = ffi::out(n, "n")?;
        // SAFETY: the caller's promise.
        let q = unsafe { ffi::borrow(queue, "queue")? };
        if cap > 0 {
            ffi::out(out, "out")?;
        }
        let mut batch = Vec::with_capacity(cap.min(1024));
        q.0.drain_up_to(&mut batch, cap);
        let mut taken = 0;
        for c in batch {
            let mut done = keyfence_completion {
                user_data: c.user_data as usize as *mut c_void,
                op_id: c.id,
                result: keyfence_result::OK,
                signature: keyfence_bytes { data: std::ptr::null_mut(), len: 0 },
                message: keyfence_bytes { data: std::ptr::null_mut(), len: 0 },
            };
            match c.result {
                // SAFETY: `done.signature` is a local we own.
                Ok(sig) => unsafe { bytes::give(&mut done.signature, &sig) },
                Err(e) => {
                    done.result = e.code().into();
                    // SAFETY: `done.message` is a local we own.
                    unsafe { bytes::give(&mut done.message, e.to_string().as_bytes()) };
                }
            }
            // SAFETY: `taken < cap` slots of `out` are writable by the
            // caller's promise.
            unsafe { out.add(taken).write(done) };
            taken += 1;
        }
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { n_out.write(taken) };
        Ok(())
    })
}

/// Frees a completion queue; NULL is a no-op. Completions still in it are
/// wiped and dropped; operations still running that would report to it
/// are discarded when they finish.
///
/// # Safety
/// `queue` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_completion_queue_free(queue: *mut keyfence_completion_queue) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(queue) }
}

/// A snapshot of one executor class's counters and latency.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct keyfence_class_metrics {
    /// Worker threads.
    pub workers: u32,
    /// Queue capacity (operations waiting beyond it are refused).
    pub queue_capacity: u32,
    /// Operations waiting now.
    pub queue_depth: u32,
    /// Operations being performed now.
    pub in_flight: u32,
    /// Operations accepted since start.
    pub submitted: u64,
    /// Operations finished successfully.
    pub completed: u64,
    /// Operations that failed, all kinds.
    pub errors: u64,
    /// Refused because the queue was full.
    pub overloaded: u64,
    /// Ended by their deadline.
    pub timed_out: u64,
    /// Latency percentiles of successful operations, in nanoseconds.
    pub p50_ns: u64,
    /// 99th percentile, nanoseconds.
    pub p99_ns: u64,
    /// 99.9th percentile, nanoseconds.
    pub p999_ns: u64,
}

/// Writes the metrics of executor `class` (a `keyfence_op_class`) to
/// `*out`.
///
/// # Safety
/// `engine` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_metrics(
    engine: *const keyfence_engine, class: u32, out: *mut keyfence_class_metrics,
) -> keyfence_result {
    let class = class_of(class);
    ffi::boundary(|| {
        let out = ffi::out(out, "out")?;
        // SAFETY: the caller's promise.
        let all = unsafe { ffi::borrow(engine, "engine")? }.0.metrics()?;
        let m = all.class(class?);
        let sat = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let kinds = keyfence_core::sign::ErrorKind::ALL;
        let count = |k| if kinds.contains(&k) { m.errors.get(k) } else { 0 };
        let metrics = keyfence_class_metrics {
            workers: sat(m.workers),
            queue_capacity: sat(m.queue_capacity),
            queue_depth: sat(m.queue_depth),
            in_flight: sat(m.in_flight),
            submitted: m.submitted,
            completed: m.completed,
            errors: m.errors.total(),
            overloaded: count(keyfence_core::sign::ErrorKind::Overloaded),
            timed_out: count(keyfence_core::sign::ErrorKind::TimedOut),
            p50_ns: ns(m.latency.p50),
            p99_ns: ns(m.latency.p99),
            p999_ns: ns(m.latency.p999),
        };
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { out.write(metrics) };
        Ok(())
    })
}

/// Every class's queue depths, counters and latency histograms, and the
/// figures of attached sources (`keyfence_engine_attach_remote`), in
/// Prometheus text exposition format, into `*out` (free it with
/// `keyfence_bytes_free`; NUL-terminated): what a server's `/metrics`
/// endpoint serves.
///
/// # Safety
/// `engine` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_metrics_prometheus(engine: *const keyfence_engine, out: *mut keyfence_bytes) -> keyfence_result {
    // SAFETY: the caller's promises.
    unsafe { bytes::make(out, "out", || Ok(ffi::borrow(engine, "engine")?.0.metrics()?.prometheus())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 0 is "the engine's default" for a per-call deadline; the engine's
    /// own default deadline takes 0 the same way, never as 1 ms.
    #[test]
    fn a_zero_default_deadline_restores_the_default() {
        let mut cfg: *mut keyfence_engine_config = std::ptr::null_mut();
        // SAFETY: `cfg` is a writable out-pointer; the handle made is used
        // and freed here only.
        unsafe {
            assert_eq!(keyfence_engine_config_new(&mut cfg), keyfence_result::OK);
            assert_eq!(keyfence_engine_config_set_timeout_ms(cfg, 5), keyfence_result::OK);
            assert_eq!((*cfg).0.engine.default_timeout, Duration::from_millis(5));
            assert_eq!(keyfence_engine_config_set_timeout_ms(cfg, 0), keyfence_result::OK);
            assert_eq!((*cfg).0.engine.default_timeout, keyfence_core::sign::EngineConfig::default().default_timeout);
            keyfence_engine_config_free(cfg);
        }
    }
}
