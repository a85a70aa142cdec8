//! TLS handshakes signed by the engine, through BoringSSL's private-key
//! method hook (`SSL_CTX_set_private_key_method`).
//!
//! When BoringSSL needs a signature (or, for the TLS 1.2 RSA key exchange, a
//! decryption) it calls [`EngineKeyMethod`], which submits the operation to
//! the [`Engine`] and answers "retry": the handshake call returns with
//! `SSL_ERROR_WANT_PRIVATE_KEY_OPERATION` and the server's event loop goes
//! on with other connections. When the engine finishes, the connection's
//! resume callback ([`set_resume`]) tells the loop to call the handshake
//! again; BoringSSL then asks for the result and the handshake continues.
//! This is the asynchronous handshake Fastly built into h2o.
//!
//! ```no_run
//! use std::sync::Arc;
//! use boring::ssl::{SslAcceptor, SslMethod};
//! use keyfence::sign::{tls, Engine, EngineConfig, PrivateKey};
//! # fn cert() -> boring::x509::X509 { unimplemented!() }
//! # let key_pem: Vec<u8> = Vec::new();
//! let engine = Engine::new(EngineConfig::default())?;
//! let key = Arc::new(PrivateKey::from_pem(&key_pem)?);
//! let mut builder = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls())?;
//! tls::configure(&mut builder, &cert(), tls::EngineKeyMethod::new(engine, key))?;
//! // Per connection: `tls::set_resume(&mut ssl, move || wake_my_loop(conn_id))`,
//! // and on `ErrorCode::WANT_PRIVATE_KEY_OPERATION` wait for that call.
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
// BoringSSL's algorithm-preference call has no safe wrapper.
#![allow(unsafe_code)]

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use boring::ex_data::Index;
use boring::ssl::{PrivateKeyMethod, PrivateKeyMethodError, Ssl, SslContextBuilder, SslRef, SslSignatureAlgorithm};
use boring::x509::X509Ref;

use super::backend::Backend;
use super::engine::Engine;
use super::op_record::OpHandle;
use super::private_key::PrivateKey;
use super::request::Request;
use super::types::{Algorithm, CryptoOp, KeyKind, Output, Resource, SignError};

/// BoringSSL's error stack as an error (the keys themselves sign with
/// AWS-LC; BoringSSL here holds only the TLS connection).
fn crypto(op: CryptoOp) -> impl Fn(boring::error::ErrorStack) -> SignError {
    move |e| SignError::Crypto { op, reason: e.to_string() }
}

/// The algorithm for BoringSSL's code point, if keyfence signs with it.
pub fn algorithm_for(sigalg: SslSignatureAlgorithm) -> Option<Algorithm> {
    Algorithm::ALL.into_iter().find(|a| SslSignatureAlgorithm::from(a.tls_code()) == sigalg)
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

/// Registers `resume` on a connection: it is called, on an engine thread,
/// when the connection's private-key operation has finished and the
/// handshake should be driven again. Keep it short (wake the event loop).
///
/// # Errors
/// [`SignError::Io`] if BoringSSL cannot allocate the ex_data slot.
pub fn set_resume<F>(ssl: &mut SslRef, resume: F) -> Result<(), SignError>
where
    F: Fn() + Send + Sync + 'static,
{
    let index =
        resume_index().ok_or_else(|| SignError::io(Resource::TlsSlot, "no BoringSSL ex_data index for the resume callback"))?;
    ssl.set_ex_data(index, Resume(Arc::new(resume)));
    Ok(())
}

/// BoringSSL's private-key method backed by the engine, for one key.
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
    pub fn with_backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Gives each operation `timeout` (the handshake fails when it passes).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    fn start(&self, ssl: &mut SslRef, mut req: Request) -> Result<usize, PrivateKeyMethodError> {
        let index = slot_index().ok_or(PrivateKeyMethodError::FAILURE)?;
        if let Some(b) = &self.backend {
            req = req.with_backend(b.clone());
        }
        if let Some(t) = self.timeout {
            req = req.with_timeout(t);
        }
        let resume = resume_index().and_then(|i| ssl.ex_data(i)).map(|r| r.0.clone());
        let pending = Arc::new(Pending { state: Mutex::new(PendingState { result: None, handle: None }) });
        let done = pending.clone();
        let handle = self
            .engine
            .submit_with_callback(req, move |r| {
                done.lock().result = Some(r);
                if let Some(resume) = resume {
                    resume();
                }
            })
            // Overloaded or shut down: fail this handshake now rather than
            // queue it; the client may retry.
            .map_err(|_| PrivateKeyMethodError::FAILURE)?;
        pending.lock().handle = Some(handle);
        ssl.set_ex_data(index, Slot(pending));
        Err(PrivateKeyMethodError::RETRY)
    }
}

impl PrivateKeyMethod for EngineKeyMethod {
    fn sign(
        &self,
        ssl: &mut SslRef,
        input: &[u8],
        signature_algorithm: SslSignatureAlgorithm,
        _output: &mut [u8],
    ) -> Result<usize, PrivateKeyMethodError> {
        let alg = algorithm_for(signature_algorithm).ok_or(PrivateKeyMethodError::FAILURE)?;
        self.start(ssl, Request::sign(self.key.clone(), alg, input.to_vec()))
    }

    fn decrypt(&self, ssl: &mut SslRef, input: &[u8], _output: &mut [u8]) -> Result<usize, PrivateKeyMethodError> {
        self.start(ssl, Request::decrypt_raw(self.key.clone(), input.to_vec()))
    }

    fn complete(&self, ssl: &mut SslRef, output: &mut [u8]) -> Result<usize, PrivateKeyMethodError> {
        let index = slot_index().ok_or(PrivateKeyMethodError::FAILURE)?;
        let slot = ssl.ex_data(index).ok_or(PrivateKeyMethodError::FAILURE)?;
        let mut st = slot.0.lock();
        match st.result.take() {
            None => Err(PrivateKeyMethodError::RETRY),
            Some(Ok(out)) if out.len() <= output.len() => {
                st.handle = None;
                output[..out.len()].copy_from_slice(&out);
                Ok(out.len())
            }
            Some(_) => {
                st.handle = None;
                Err(PrivateKeyMethodError::FAILURE)
            }
        }
    }
}

/// Sets up a server context to sign with `method`: installs `cert` (whose
/// public key must be `method`'s key), the signing algorithms the key
/// supports (BoringSSL asks callers of the private-key hook to set these,
/// or it may pick one the key cannot do), and the hook itself.
///
/// # Errors
/// [`SignError::Config`] if the certificate does not match the key;
/// [`SignError::Crypto`] if BoringSSL refuses the certificate or the
/// algorithm list.
pub fn configure(builder: &mut SslContextBuilder, cert: &X509Ref, method: EngineKeyMethod) -> Result<(), SignError> {
    let cert_key = cert.public_key().and_then(|k| k.public_key_to_der()).map_err(crypto(CryptoOp::PublicKey))?;
    if cert_key != method.key.public_key_der()? {
        return Err(SignError::Config("the certificate's public key is not the signing key's".into()));
    }
    builder.set_certificate(cert).map_err(crypto(CryptoOp::Configure))?;
    let prefs: Vec<u16> = signing_algorithms(method.key.kind()).iter().map(|a| a.tls_code()).collect();
    // SAFETY: `builder.as_ptr()` is the live SSL_CTX the builder owns;
    // `prefs` is a live slice passed with its length, which BoringSSL copies.
    let ok = unsafe { boring_sys::SSL_CTX_set_signing_algorithm_prefs(builder.as_ptr(), prefs.as_ptr(), prefs.len()) };
    if ok != 1 {
        return Err(crypto(CryptoOp::Configure)(boring::error::ErrorStack::get()));
    }
    builder.set_private_key_method(method);
    Ok(())
}
