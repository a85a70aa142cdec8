//! TLS handshakes signed by the engine, through the private-key method hook
//! (`SSL_CTX_set_private_key_method`) of AWS-LC's TLS library, for servers
//! built on the `openssl` crate over AWS-LC (`openssl-sys`'s `aws-lc`
//! feature, as keyfence itself is): the connection and the signature in
//! one library.
//!
//! When AWS-LC needs a signature (or, for the TLS 1.2 RSA key exchange, a
//! decryption) it calls the hook, which submits the operation to the
//! [`Engine`] and answers "retry": the handshake call returns with
//! [`WANT_PRIVATE_KEY_OPERATION`] and the server's event loop goes on with
//! other connections. When the engine finishes, the connection's resume
//! callback ([`set_resume`]) tells the loop to call the handshake again;
//! AWS-LC then asks for the result and the handshake continues. This is
//! the asynchronous handshake Fastly built into h2o (on BoringSSL, whose
//! hook AWS-LC keeps).
//!
//! The hook is AWS-LC's and BoringSSL's, not OpenSSL's; `rust-openssl`
//! does not wrap it, so this module declares the two calls it needs.
//! (BoringSSL itself cannot sit beside AWS-LC in one program: their TLS
//! libraries define the same unprefixed symbols.)
//!
//! ```no_run
//! use std::sync::Arc;
//! use openssl::ssl::{SslAcceptor, SslMethod};
//! use keyfence::sign::{tls, Engine, EngineConfig, PrivateKey};
//! # fn cert() -> openssl::x509::X509 { unimplemented!() }
//! # let key_pem: Vec<u8> = Vec::new();
//! let engine = Engine::new(EngineConfig::default())?;
//! let key = Arc::new(PrivateKey::from_pem(&key_pem)?);
//! let mut builder = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls())?;
//! tls::configure(&mut builder, &cert(), tls::EngineKeyMethod::new(engine, key))?;
//! // Per connection: `tls::set_resume(&mut ssl, move || wake_my_loop(conn_id))`,
//! // and while `tls::waits_for_the_engine(error.code())`, wait for that call.
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
// The private-key hook and the algorithm preferences have no safe wrapper:
// the hook's three callbacks are C functions, each behind a panic boundary.
#![allow(unsafe_code)]

use std::os::raw::c_int;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use foreign_types::ForeignTypeRef;
use openssl::ex_data::Index;
use openssl::ssl::{ErrorCode, Ssl, SslContext, SslContextBuilder, SslRef};
use openssl::x509::X509Ref;

use super::backend::Backend;
use super::engine::Engine;
use super::local_key::crypto;
use super::op_record::OpHandle;
use super::private_key::PrivateKey;
use super::request::Request;
use super::types::{Algorithm, CryptoOp, KeyKind, Output, Resource, SignError};

/// The error code a handshake call fails with while the engine signs
/// (`SSL_ERROR_WANT_PRIVATE_KEY_OPERATION`): drive the handshake again
/// when the connection's resume callback runs. `rust-openssl` reports it
/// as a handshake failure (`HandshakeError::Failure`) whose stream can be
/// driven again; [`waits_for_the_engine`] tells it apart.
pub const WANT_PRIVATE_KEY_OPERATION: c_int = 13;

/// Whether a handshake error is the engine still signing (drive the
/// handshake again when the resume callback runs), not a failure.
pub fn waits_for_the_engine(code: ErrorCode) -> bool {
    code.as_raw() == WANT_PRIVATE_KEY_OPERATION
}

/// `enum ssl_private_key_result_t`.
const SUCCESS: c_int = 0;
const RETRY: c_int = 1;
const FAILURE: c_int = 2;

/// `SSL_PRIVATE_KEY_METHOD` (AWS-LC's `ssl.h`).
#[repr(C)]
struct RawMethod {
    sign: Option<unsafe extern "C" fn(*mut openssl_sys::SSL, *mut u8, *mut usize, usize, u16, *const u8, usize) -> c_int>,
    decrypt: Option<unsafe extern "C" fn(*mut openssl_sys::SSL, *mut u8, *mut usize, usize, *const u8, usize) -> c_int>,
    complete: Option<unsafe extern "C" fn(*mut openssl_sys::SSL, *mut u8, *mut usize, usize) -> c_int>,
}

extern "C" {
    fn SSL_CTX_set_private_key_method(ctx: *mut openssl_sys::SSL_CTX, method: *const RawMethod);
    fn SSL_CTX_set_signing_algorithm_prefs(ctx: *mut openssl_sys::SSL_CTX, prefs: *const u16, n: usize) -> c_int;
}

/// The one hook every context shares: it finds the context's
/// [`EngineKeyMethod`] in the context's ex_data.
static METHOD: RawMethod = RawMethod { sign: Some(raw_sign), decrypt: Some(raw_decrypt), complete: Some(raw_complete) };

/// The algorithm for a TLS code point, if keyfence signs with it.
pub fn algorithm_for(code: u16) -> Option<Algorithm> {
    Algorithm::ALL.into_iter().find(|a| a.tls_code() == code)
}

/// The TLS 1.2+ signature algorithms a key of `kind` signs with, in
/// preference order (PSS first for RSA, as TLS 1.3 requires it anyway).
pub fn signing_algorithms(kind: KeyKind) -> Vec<Algorithm> {
    match kind {
        KeyKind::Rsa { .. } => vec![
            Algorithm::RsaPssSha256,
            Algorithm::RsaPssSha384,
            Algorithm::RsaPssSha512,
            Algorithm::RsaPkcs1Sha256,
            Algorithm::RsaPkcs1Sha384,
            Algorithm::RsaPkcs1Sha512,
        ],
        KeyKind::EcP256 => vec![Algorithm::EcdsaP256Sha256],
        KeyKind::EcP384 => vec![Algorithm::EcdsaP384Sha384],
        KeyKind::Ed25519 => vec![Algorithm::Ed25519],
    }
}

struct PendingState {
    result: Option<Result<Output, SignError>>,
    handle: Option<OpHandle>,
}

struct Pending {
    state: Mutex<PendingState>,
}

impl Pending {
    fn lock(&self) -> MutexGuard<'_, PendingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A connection's operation, kept in the connection's ex_data. Dropping it
/// (the connection is freed, or the next operation replaces it) cancels an
/// unfinished operation, releasing its resources.
struct Slot(Arc<Pending>);

impl Drop for Slot {
    fn drop(&mut self) {
        let handle = self.0.lock().handle.take();
        if let Some(h) = handle {
            h.cancel();
        }
    }
}

/// A connection's resume callback.
struct Resume(Arc<dyn Fn() + Send + Sync>);

fn slot_index() -> Option<Index<Ssl, Slot>> {
    static INDEX: OnceLock<Option<Index<Ssl, Slot>>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().ok())
}

fn resume_index() -> Option<Index<Ssl, Resume>> {
    static INDEX: OnceLock<Option<Index<Ssl, Resume>>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().ok())
}

fn method_index() -> Option<Index<SslContext, EngineKeyMethod>> {
    static INDEX: OnceLock<Option<Index<SslContext, EngineKeyMethod>>> = OnceLock::new();
    *INDEX.get_or_init(|| SslContext::new_ex_index().ok())
}

/// Registers `resume` on a connection: it is called, on an engine thread,
/// when the connection's private-key operation has finished and the
/// handshake should be driven again. Keep it short (wake the event loop).
///
/// # Errors
/// [`SignError::Io`] if the TLS library cannot allocate the ex_data slot.
pub fn set_resume<F>(ssl: &mut SslRef, resume: F) -> Result<(), SignError>
where
    F: Fn() + Send + Sync + 'static,
{
    let index = resume_index().ok_or_else(|| SignError::io(Resource::TlsSlot, "no ex_data index for the resume callback"))?;
    ssl.set_ex_data(index, Resume(Arc::new(resume)));
    Ok(())
}

/// The private-key method backed by the engine, for one key.
pub struct EngineKeyMethod {
    engine: Engine,
    key: Arc<PrivateKey>,
    backend: Option<Arc<dyn Backend>>,
    timeout: Option<Duration>,
}

impl std::fmt::Debug for EngineKeyMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineKeyMethod").field("key", &self.key).field("timeout", &self.timeout).finish()
    }
}

impl EngineKeyMethod {
    /// Handshake operations with `key`, on `engine`'s default backend and
    /// timeout.
    pub fn new(engine: Engine, key: Arc<PrivateKey>) -> Self {
        EngineKeyMethod { engine, key, backend: None, timeout: None }
    }

    /// Runs the operations on `backend`.
    pub fn with_backend(self, backend: Arc<dyn Backend>) -> Self {
        EngineKeyMethod { backend: Some(backend), ..self }
    }

    /// Gives each operation `timeout` (the handshake fails when it passes).
    pub fn with_timeout(self, timeout: Duration) -> Self {
        EngineKeyMethod { timeout: Some(timeout), ..self }
    }

    /// Submits `req` and keeps its slot on the connection: "retry".
    fn start(&self, ssl: &mut SslRef, mut req: Request) -> c_int {
        let Some(index) = slot_index() else { return FAILURE };
        if let Some(b) = &self.backend {
            req = req.with_backend(b.clone());
        }
        if let Some(t) = self.timeout {
            req = req.with_timeout(t);
        }
        let resume = resume_index().and_then(|i| ssl.ex_data(i)).map(|r| r.0.clone());
        let pending = Arc::new(Pending { state: Mutex::new(PendingState { result: None, handle: None }) });
        let done = pending.clone();
        let submitted = self.engine.submit_with_callback(req, move |r| {
            done.lock().result = Some(r);
            if let Some(resume) = resume {
                resume();
            }
        });
        // Overloaded or shut down: fail this handshake now rather than
        // queue it; the client may retry.
        let Ok(handle) = submitted else { return FAILURE };
        pending.lock().handle = Some(handle);
        ssl.set_ex_data(index, Slot(pending));
        RETRY
    }

    /// The finished operation's result into `out`, or "retry" while it runs.
    fn complete(ssl: &mut SslRef, out: &mut [u8], out_len: &mut usize) -> c_int {
        let Some(index) = slot_index() else { return FAILURE };
        let Some(slot) = ssl.ex_data(index) else { return FAILURE };
        let mut st = slot.0.lock();
        match st.result.take() {
            None => RETRY,
            Some(Ok(result)) if result.len() <= out.len() => {
                st.handle = None;
                out[..result.len()].copy_from_slice(&result);
                *out_len = result.len();
                SUCCESS
            }
            Some(_) => {
                st.handle = None;
                FAILURE
            }
        }
    }
}

/// The context's method for the connection `ssl`.
///
/// # Safety
/// `ssl` is the live connection the TLS library called the hook for.
unsafe fn method_of<'a>(ssl: *mut openssl_sys::SSL) -> Option<(&'a mut SslRef, &'a EngineKeyMethod)> {
    // SAFETY: the caller's promise; the reference lives no longer than the
    // callback that received the pointer.
    let ssl = unsafe { SslRef::from_ptr_mut(ssl) };
    let index = method_index()?;
    // SAFETY: the context outlives its connections, and the method stays in
    // its ex_data until the context is freed.
    let method: &'a EngineKeyMethod = unsafe { &*(ssl.ssl_context().ex_data(index)? as *const EngineKeyMethod) };
    Some((ssl, method))
}

/// Runs `f` behind a panic boundary: a panic is a failed handshake, never
/// an unwind into C.
fn guarded(f: impl FnOnce() -> c_int) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(FAILURE)
}

unsafe extern "C" fn raw_sign(
    ssl: *mut openssl_sys::SSL, _out: *mut u8, _out_len: *mut usize, _max_out: usize, algorithm: u16, input: *const u8, input_len: usize,
) -> c_int {
    guarded(|| {
        // SAFETY: the TLS library passes the connection it calls for, and
        // `input` readable for `input_len` bytes for the call.
        let Some((ssl, method)) = (unsafe { method_of(ssl) }) else { return FAILURE };
        let Some(alg) = algorithm_for(algorithm) else { return FAILURE };
        let input = unsafe { std::slice::from_raw_parts(input, input_len) }.to_vec();
        method.start(ssl, Request::sign(method.key.clone(), alg, input))
    })
}

unsafe extern "C" fn raw_decrypt(
    ssl: *mut openssl_sys::SSL, _out: *mut u8, _out_len: *mut usize, _max_out: usize, input: *const u8, input_len: usize,
) -> c_int {
    guarded(|| {
        // SAFETY: as in `raw_sign`.
        let Some((ssl, method)) = (unsafe { method_of(ssl) }) else { return FAILURE };
        let input = unsafe { std::slice::from_raw_parts(input, input_len) }.to_vec();
        method.start(ssl, Request::decrypt_raw(method.key.clone(), input))
    })
}

unsafe extern "C" fn raw_complete(ssl: *mut openssl_sys::SSL, out: *mut u8, out_len: *mut usize, max_out: usize) -> c_int {
    guarded(|| {
        // SAFETY: the TLS library passes the connection it calls for, `out`
        // writable for `max_out` bytes and `out_len` writable, for the call.
        let ssl = unsafe { SslRef::from_ptr_mut(ssl) };
        let (out, out_len) = unsafe { (std::slice::from_raw_parts_mut(out, max_out), &mut *out_len) };
        EngineKeyMethod::complete(ssl, out, out_len)
    })
}

/// Sets up a server context to sign with `method`: installs `cert` (whose
/// public key must be `method`'s key), the signing algorithms the key
/// supports (the hook's callers must set these, or the TLS library may pick
/// one the key cannot do, such as ECDSA-SHA256 for a P-384 key in TLS 1.2),
/// and the hook itself.
///
/// # Errors
/// [`SignError::Config`] if the certificate does not match the key;
/// [`SignError::Crypto`] if the TLS library refuses the certificate or the
/// algorithm list; [`SignError::Io`] if it cannot allocate the context's
/// ex_data slot.
pub fn configure(builder: &mut SslContextBuilder, cert: &X509Ref, method: EngineKeyMethod) -> Result<(), SignError> {
    let cert_key = cert.public_key().and_then(|k| k.public_key_to_der()).map_err(crypto(CryptoOp::PublicKey))?;
    if cert_key != method.key.public_key_der()? {
        return Err(SignError::Config("the certificate's public key is not the signing key's".into()));
    }
    builder.set_certificate(cert).map_err(crypto(CryptoOp::Configure))?;
    let prefs: Vec<u16> = signing_algorithms(method.key.kind()).iter().map(|a| a.tls_code()).collect();
    // SAFETY: `builder.as_ptr()` is the live SSL_CTX the builder owns;
    // `prefs` is a live slice passed with its length, which the call copies.
    let ok = unsafe { SSL_CTX_set_signing_algorithm_prefs(builder.as_ptr(), prefs.as_ptr(), prefs.len()) };
    if ok != 1 {
        return Err(crypto(CryptoOp::Configure)(openssl::error::ErrorStack::get()));
    }
    let index = method_index().ok_or_else(|| SignError::io(Resource::TlsSlot, "no ex_data index for the key method"))?;
    builder.set_ex_data(index, method);
    // SAFETY: `METHOD` is a static that outlives every context; the
    // context's method it reaches is in the context's ex_data, set above.
    unsafe { SSL_CTX_set_private_key_method(builder.as_ptr(), &METHOD) };
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_algorithm_has_its_tls_code_point() {
        for alg in super::Algorithm::ALL {
            assert_eq!(super::algorithm_for(alg.tls_code()), Some(alg));
        }
    }
}
