//! CP-ABE (TKN20, CIRCL-compatible): keys and ciphertexts in CIRCL's byte
//! formats. Setup, keygen, encrypt and decrypt take milliseconds, so each
//! returns a promise computed on the libuv thread pool, with a `*Sync`
//! twin for scripts that runs the same computation on the calling thread.

use std::collections::HashMap;
use std::sync::Arc;

use keyfence::abe;
use napi::bindgen_prelude::{AsyncTask, Buffer, Uint8Array};
use napi::Env;
use napi_derive::napi;

use crate::error::js;
use crate::policy;
use crate::task::Job;

/// An authority's public key: what encryptors need.
#[napi(namespace = "abe")]
pub struct PublicKey {
    pub(crate) inner: Arc<abe::PublicKey>,
}

#[napi(namespace = "abe")]
impl PublicKey {
    /// Reads a public key in CIRCL's format.
    ///
    /// Throws `KeyfenceError` with code `INVALID_KEY` for bytes that are not
    /// one (the message names the field at fault).
    #[napi(factory)]
    pub fn from_bytes(env: Env, #[napi(ts_arg_type = "Bytes")] bytes: Uint8Array) -> napi::Result<Self> {
        js(&env, abe::PublicKey::from_bytes(&bytes).map(|k| PublicKey { inner: Arc::new(k) }).map_err(Into::into))
    }

    /// The key in CIRCL's format.
    #[napi]
    pub fn to_bytes(&self) -> Buffer {
        self.inner.to_bytes().into()
    }
}

/// An authority's master secret key: issues attribute keys. Secret: keep
/// it in the authority. `util.inspect` never shows its bytes.
#[napi(namespace = "abe")]
pub struct MasterKey {
    pub(crate) inner: Arc<abe::MasterSecretKey>,
}

#[napi(namespace = "abe")]
impl MasterKey {
    /// Reads a master secret key in CIRCL's format.
    ///
    /// Throws `KeyfenceError` with code `INVALID_KEY`.
    #[napi(factory)]
    pub fn from_bytes(env: Env, #[napi(ts_arg_type = "Bytes")] bytes: Uint8Array) -> napi::Result<Self> {
        js(&env, abe::MasterSecretKey::from_bytes(&bytes).map(|k| MasterKey { inner: Arc::new(k) }).map_err(Into::into))
    }

    /// The key in CIRCL's format: a secret in a JavaScript buffer, which
    /// keyfence cannot wipe (overwrite it with `fill(0)` when done).
    #[napi]
    pub fn to_bytes(&self) -> Buffer {
        self.inner.to_bytes().to_vec().into()
    }
}

/// An attribute key: decrypts what its attributes satisfy. Secret;
/// `util.inspect` never shows its bytes.
#[napi(namespace = "abe")]
pub struct AttributeKey {
    pub(crate) inner: Arc<abe::AttributeKey>,
}

#[napi(namespace = "abe")]
impl AttributeKey {
    /// Reads an attribute key in CIRCL's format.
    ///
    /// Throws `KeyfenceError` with code `INVALID_KEY`.
    #[napi(factory)]
    pub fn from_bytes(env: Env, #[napi(ts_arg_type = "Bytes")] bytes: Uint8Array) -> napi::Result<Self> {
        js(&env, abe::AttributeKey::from_bytes(&bytes).map(|k| AttributeKey { inner: Arc::new(k) }).map_err(Into::into))
    }

    /// The key in CIRCL's format: a secret in a JavaScript buffer, which
    /// keyfence cannot wipe (overwrite it with `fill(0)` when done).
    #[napi]
    pub fn to_bytes(&self) -> Buffer {
        self.inner.to_bytes().to_vec().into()
    }

    /// The attribute labels the key holds (not their values, which the key
    /// stores only hashed).
    #[napi(getter)]
    pub fn labels(&self) -> Vec<String> {
        self.inner.labels().map(str::to_owned).collect()
    }
}

/// A new authority's keys, as `setup` returns them.
#[napi(object, object_from_js = false, namespace = "abe")]
pub struct AuthorityKeys {
    /// The public key, for encryptors.
    pub public_key: PublicKey,
    /// The master secret key, for issuing attribute keys.
    pub master_key: MasterKey,
}

type KeyPair = (abe::PublicKey, abe::MasterSecretKey);

fn setup_job() -> Job<KeyPair, AuthorityKeys> {
    Job::new(
        || Ok(abe::setup()?),
        |(pk, msk)| AuthorityKeys { public_key: PublicKey { inner: Arc::new(pk) }, master_key: MasterKey { inner: Arc::new(msk) } },
    )
}

/// Generates a new authority: its public key and master secret key, from
/// the operating system's random source.
///
/// Rejects with `KeyfenceError` code `RNG` only if the random source fails.
#[napi(namespace = "abe", ts_return_type = "Promise<AuthorityKeys>")]
pub fn setup() -> AsyncTask<Job<KeyPair, AuthorityKeys>> {
    setup_job().spawn()
}

/// `setup` on the calling thread (it blocks for a few milliseconds).
#[napi(namespace = "abe")]
pub fn setup_sync(env: Env) -> napi::Result<AuthorityKeys> {
    setup_job().run_sync(&env)
}

fn keygen_job(master_key: &MasterKey, attrs: HashMap<String, String>) -> Job<abe::AttributeKey, AttributeKey> {
    let msk = master_key.inner.clone();
    Job::new(move || Ok(abe::keygen(&msk, &policy::attributes(attrs)?)?), |k| AttributeKey { inner: Arc::new(k) })
}

/// Issues an attribute key for `attrs` (`{ country: 'FR', region: 'EU' }`,
/// or a `Map`).
///
/// Rejects with `KeyfenceError` code `INVALID_ATTRIBUTES` (an empty label
/// or value, text with a lone surrogate), `RESERVED_LABEL`, or
/// `LIMIT_EXCEEDED` (attributes too many or too long for the key format).
#[napi(namespace = "abe", ts_return_type = "Promise<AttributeKey>")]
pub fn keygen(
    master_key: &MasterKey, #[napi(ts_arg_type = "Attributes")] attrs: HashMap<String, String>,
) -> AsyncTask<Job<abe::AttributeKey, AttributeKey>> {
    keygen_job(master_key, attrs).spawn()
}

/// `keygen` on the calling thread.
#[napi(namespace = "abe")]
pub fn keygen_sync(
    env: Env, master_key: &MasterKey, #[napi(ts_arg_type = "Attributes")] attrs: HashMap<String, String>,
) -> napi::Result<AttributeKey> {
    keygen_job(master_key, attrs).run_sync(&env)
}

fn encrypt_job(public_key: &PublicKey, policy: String, message: Uint8Array) -> Job<Vec<u8>, Buffer> {
    let pk = public_key.inner.clone();
    let msg = message.to_vec();
    Job::new(move || Ok(abe::encrypt_policy(&pk, &policy::parse(&policy)?, &msg)?), Buffer::from)
}

/// Encrypts `message` so that only attribute keys satisfying `policy`
/// (`'region: EU and not country: DE'`) can decrypt it; the ciphertext is
/// in CIRCL's `tkn20` format.
///
/// Rejects with `KeyfenceError` code `POLICY_SYNTAX` (with `position`),
/// `POLICY_TOO_LARGE`, `RESERVED_LABEL` or `LIMIT_EXCEEDED`.
#[napi(namespace = "abe", ts_return_type = "Promise<Buffer>")]
pub fn encrypt(
    public_key: &PublicKey, policy: String, #[napi(ts_arg_type = "Bytes")] message: Uint8Array,
) -> AsyncTask<Job<Vec<u8>, Buffer>> {
    encrypt_job(public_key, policy, message).spawn()
}

/// `encrypt` on the calling thread.
#[napi(namespace = "abe")]
pub fn encrypt_sync(
    env: Env, public_key: &PublicKey, policy: String, #[napi(ts_arg_type = "Bytes")] message: Uint8Array,
) -> napi::Result<Buffer> {
    encrypt_job(public_key, policy, message).run_sync(&env)
}

/// A plaintext leaving Rust: the Rust copy is wiped when dropped.
pub(crate) fn secret_buffer(s: zeroize::Zeroizing<Vec<u8>>) -> Buffer {
    Buffer::from(s.to_vec())
}

fn decrypt_job(key: &AttributeKey, ciphertext: Uint8Array) -> Job<zeroize::Zeroizing<Vec<u8>>, Buffer> {
    let key = key.inner.clone();
    let ct = ciphertext.to_vec();
    Job::new(move || Ok(abe::decrypt(&key, &ct)?), secret_buffer)
}

/// Decrypts `ciphertext` with `key`.
///
/// Rejects with `KeyfenceError` code `POLICY_NOT_SATISFIED` when the key's
/// attributes do not satisfy the policy, `INVALID_CIPHERTEXT` when the
/// bytes are malformed (the message names the field), tampered with, or
/// made for another authority. Never a wrong plaintext.
#[napi(namespace = "abe", ts_return_type = "Promise<Buffer>")]
pub fn decrypt(
    key: &AttributeKey, #[napi(ts_arg_type = "Bytes")] ciphertext: Uint8Array,
) -> AsyncTask<Job<zeroize::Zeroizing<Vec<u8>>, Buffer>> {
    decrypt_job(key, ciphertext).spawn()
}

/// `decrypt` on the calling thread.
#[napi(namespace = "abe")]
pub fn decrypt_sync(env: Env, key: &AttributeKey, #[napi(ts_arg_type = "Bytes")] ciphertext: Uint8Array) -> napi::Result<Buffer> {
    decrypt_job(key, ciphertext).run_sync(&env)
}

/// Whether a key with `attrs` could decrypt `ciphertext`, from its policy
/// alone (no cryptography), so a caller can forward it to one that can.
///
/// Throws `KeyfenceError` code `INVALID_CIPHERTEXT` or `INVALID_ATTRIBUTES`.
#[napi(namespace = "abe")]
pub fn could_decrypt(
    env: Env, #[napi(ts_arg_type = "Attributes")] attrs: HashMap<String, String>, #[napi(ts_arg_type = "Bytes")] ciphertext: Uint8Array,
) -> napi::Result<bool> {
    js(&env, policy::attributes(attrs).and_then(|a| Ok(abe::could_decrypt(&a, &ciphertext)?)))
}

/// The canonical text of the policy `ciphertext` was encrypted under.
///
/// Throws `KeyfenceError` code `INVALID_CIPHERTEXT`.
#[napi(namespace = "abe")]
pub fn policy_of(env: Env, #[napi(ts_arg_type = "Bytes")] ciphertext: Uint8Array) -> napi::Result<String> {
    js(&env, abe::policy_of(&ciphertext).map(|p| p.to_string()).map_err(Into::into))
}
