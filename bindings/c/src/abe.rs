//! CP-ABE from C: keys and ciphertexts in CIRCL's byte formats.
//!
//! The three key handles are immutable once made: every function takes
//! them `const`, and one handle may be used from several threads at once.

use std::ffi::c_char;

use keyfence_core::abe::{self, AttributeKey, MasterSecretKey, PublicKey};
use keyfence_core::policy::Attributes;

use crate::bytes::{self, keyfence_bytes};
use crate::error::{keyfence_result, Error};
use crate::ffi;
use crate::policy;

/// An authority's public key (what encryptors need). Thread-safe.
pub struct keyfence_abe_public_key(PublicKey);

/// An authority's master secret key (issues attribute keys). Wiped when
/// freed. Thread-safe.
pub struct keyfence_abe_master_key(MasterSecretKey);

/// An attribute key (decrypts what its attributes satisfy). Wiped when
/// freed. Thread-safe.
pub struct keyfence_abe_attribute_key(AttributeKey);

/// Generates a new authority: `*pk` and `*msk`, to be freed with
/// `keyfence_abe_public_key_free` and `keyfence_abe_master_key_free`.
///
/// Errors: `KEYFENCE_RNG` if the system's random source fails,
/// `KEYFENCE_INVALID_ARGUMENT` for NULL outputs.
///
/// # Safety
/// `pk` and `msk` are writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_setup(
    pk: *mut *mut keyfence_abe_public_key, msk: *mut *mut keyfence_abe_master_key,
) -> keyfence_result {
    ffi::boundary(|| {
        let (pk_out, msk_out) = (ffi::out(pk, "pk")?, ffi::out(msk, "msk")?);
        let (p, m) = abe::setup()?;
        // SAFETY: both checked non-NULL; writable by the caller's promise.
        unsafe {
            ffi::give(pk_out, keyfence_abe_public_key(p));
            ffi::give(msk_out, keyfence_abe_master_key(m));
        }
        Ok(())
    })
}

/// Issues an attribute key for `attrs` (`label=value,label=value`) into
/// `*key` (free it with `keyfence_abe_attribute_key_free`).
///
/// Errors: `KEYFENCE_INVALID_ATTRIBUTES`, `KEYFENCE_RESERVED_LABEL`,
/// `KEYFENCE_LIMIT_EXCEEDED` (attributes too many or too long for the key
/// format), `KEYFENCE_INVALID_ARGUMENT`.
///
/// # Safety
/// `msk` is a live handle; `attrs` a NUL-terminated string; `key` writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_keygen(
    msk: *const keyfence_abe_master_key, attrs: *const c_char, key: *mut *mut keyfence_abe_attribute_key,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { keygen(msk, key, || policy::attributes(ffi::text(attrs, "attrs")?)) }
}

/// `keyfence_abe_keygen` with the attributes as `attrs[0..count]`, each
/// label and value apart and taken as it is (see `keyfence_attribute`).
///
/// Errors: as `keyfence_abe_keygen`; `KEYFENCE_INVALID_ATTRIBUTES` and
/// `KEYFENCE_INVALID_ARGUMENT` as `keyfence_attributes_text`.
///
/// # Safety
/// `msk` is a live handle; `attrs` is NULL with `count == 0`, or points to
/// `count` readable `keyfence_attribute`s; `key` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_keygen_pairs(
    msk: *const keyfence_abe_master_key, attrs: *const policy::keyfence_attribute, count: usize, key: *mut *mut keyfence_abe_attribute_key,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { keygen(msk, key, || policy::pairs(attrs, count)) }
}

/// The body of both keygens.
///
/// # Safety
/// `msk` is a live handle; `key` is writable.
unsafe fn keygen(
    msk: *const keyfence_abe_master_key, key: *mut *mut keyfence_abe_attribute_key, attrs: impl FnOnce() -> Result<Attributes, Error>,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(key, "key")?;
        // SAFETY: the caller's promise.
        let msk = unsafe { ffi::borrow(msk, "msk")? };
        let k = abe::keygen(&msk.0, &attrs()?)?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { ffi::give(out, keyfence_abe_attribute_key(k)) };
        Ok(())
    })
}

/// Encrypts `msg[0..len]` under `policy` into `*out` (a ciphertext in
/// CIRCL's `tkn20` format).
///
/// Errors: `KEYFENCE_POLICY_SYNTAX` / `KEYFENCE_POLICY_TOO_LARGE` (with
/// the position), `KEYFENCE_RESERVED_LABEL`, `KEYFENCE_LIMIT_EXCEEDED` for
/// a message near 4 GiB, `KEYFENCE_INVALID_ARGUMENT`.
///
/// # Safety
/// `pk` is a live handle; `policy` a NUL-terminated string; `msg` points to
/// `len` readable bytes (or is NULL with `len == 0`); `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_encrypt(
    pk: *const keyfence_abe_public_key, policy: *const c_char, msg: *const u8, len: usize, out: *mut keyfence_bytes,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = bytes::out(out, "out")?;
        // SAFETY: the caller's promises, passed on.
        let (pk, text, msg) = unsafe { (ffi::borrow(pk, "pk")?, ffi::text(policy, "policy")?, ffi::slice(msg, len, "msg")?) };
        let ct = abe::encrypt_policy(&pk.0, &policy::parse(text)?, msg)?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { bytes::give(out, &ct) };
        Ok(())
    })
}

/// Decrypts the ciphertext `ct[0..len]` with `key` into `*out` (free it
/// with `keyfence_bytes_free`, which wipes the plaintext).
///
/// Errors: `KEYFENCE_POLICY_NOT_SATISFIED` if the key's attributes do not
/// satisfy the ciphertext's policy; `KEYFENCE_INVALID_CIPHERTEXT` if it is
/// malformed (the message names the field), tampered with, or made for
/// another authority. Never a wrong plaintext.
///
/// # Safety
/// `key` is a live handle; `ct` points to `len` readable bytes; `out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_decrypt(
    key: *const keyfence_abe_attribute_key, ct: *const u8, len: usize, out: *mut keyfence_bytes,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = bytes::out(out, "out")?;
        // SAFETY: the caller's promises, passed on.
        let (key, ct) = unsafe { (ffi::borrow(key, "key")?, ffi::slice(ct, len, "ct")?) };
        let pt = abe::decrypt(&key.0, ct)?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { bytes::give(out, &pt) };
        Ok(())
    })
}

/// Whether a key with `attrs` could decrypt `ct[0..len]`, from its policy
/// alone (no cryptography), into `*could`.
///
/// Errors: `KEYFENCE_INVALID_CIPHERTEXT`, `KEYFENCE_INVALID_ATTRIBUTES`.
///
/// # Safety
/// `attrs` is a NUL-terminated string; `ct` points to `len` readable
/// bytes; `could` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_could_decrypt(attrs: *const c_char, ct: *const u8, len: usize, could: *mut bool) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { could_decrypt(ct, len, could, || policy::attributes(ffi::text(attrs, "attrs")?)) }
}

/// `keyfence_abe_could_decrypt` with the attributes as `attrs[0..count]`,
/// each label and value apart and taken as it is (see
/// `keyfence_attribute`).
///
/// Errors: as `keyfence_abe_could_decrypt`; `KEYFENCE_INVALID_ARGUMENT` as
/// `keyfence_attributes_text`.
///
/// # Safety
/// `attrs` is NULL with `count == 0`, or points to `count` readable
/// `keyfence_attribute`s; `ct` points to `len` readable bytes; `could` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_could_decrypt_pairs(
    attrs: *const policy::keyfence_attribute, count: usize, ct: *const u8, len: usize, could: *mut bool,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { could_decrypt(ct, len, could, || policy::pairs(attrs, count)) }
}

/// The body of both `could_decrypt`s.
///
/// # Safety
/// `ct` points to `len` readable bytes; `could` is writable.
unsafe fn could_decrypt(ct: *const u8, len: usize, could: *mut bool, attrs: impl FnOnce() -> Result<Attributes, Error>) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(could, "could")?;
        // SAFETY: the caller's promise.
        let ct = unsafe { ffi::slice(ct, len, "ct")? };
        let yes = abe::could_decrypt(&attrs()?, ct)?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { out.write(yes) };
        Ok(())
    })
}

/// The canonical text of the policy `ct[0..len]` was encrypted under, into
/// `*out` (NUL-terminated in `out->data`).
///
/// Errors: `KEYFENCE_INVALID_CIPHERTEXT`.
///
/// # Safety
/// `ct` points to `len` readable bytes; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_policy_of(ct: *const u8, len: usize, out: *mut keyfence_bytes) -> keyfence_result {
    ffi::boundary(|| {
        let out = bytes::out(out, "out")?;
        // SAFETY: the caller's promise.
        let p = abe::policy_of(unsafe { ffi::slice(ct, len, "ct")? })?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { bytes::give(out, p.to_string().as_bytes()) };
        Ok(())
    })
}

/// Reads a key into a new handle: the body of the three `_from_bytes`.
///
/// # Safety
/// As each `_from_bytes`: `b` points to `len` readable bytes, `out` is
/// writable.
unsafe fn from_bytes<K, H>(
    b: *const u8, len: usize, out: *mut *mut H, parse: fn(&[u8]) -> abe::Result<K>, wrap: fn(K) -> H,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(out, "out")?;
        // SAFETY: the caller's promise.
        let k = parse(unsafe { ffi::slice(b, len, "bytes")? })?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { ffi::give(out, wrap(k)) };
        Ok(())
    })
}

/// Writes a key's encoding: the body of the three `_to_bytes`.
///
/// # Safety
/// `key` is NULL or a live handle; `out` is writable.
unsafe fn to_bytes<H>(key: *const H, out: *mut keyfence_bytes, encode: impl FnOnce(&H) -> Vec<u8>) -> keyfence_result {
    ffi::boundary(|| {
        let out = bytes::out(out, "out")?;
        // SAFETY: the caller's promise.
        let enc = zeroize::Zeroizing::new(encode(unsafe { ffi::borrow(key, "key")? }));
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { bytes::give(out, &enc) };
        Ok(())
    })
}

/// Reads a public key in CIRCL's format from `b[0..len]` into `*out`.
///
/// Errors: `KEYFENCE_INVALID_KEY` naming the field at fault (every point is
/// checked to be on its curve and in its group).
///
/// # Safety
/// `b` points to `len` readable bytes; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_public_key_from_bytes(
    b: *const u8, len: usize, out: *mut *mut keyfence_abe_public_key,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { from_bytes(b, len, out, PublicKey::from_bytes, keyfence_abe_public_key) }
}

/// Writes a public key in CIRCL's format to `*out`.
///
/// # Safety
/// `key` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_public_key_to_bytes(
    key: *const keyfence_abe_public_key, out: *mut keyfence_bytes,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { to_bytes(key, out, |k| k.0.to_bytes()) }
}

/// Frees a public key; NULL is a no-op.
///
/// # Safety
/// `key` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_public_key_free(key: *mut keyfence_abe_public_key) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(key) }
}

/// Reads a master secret key in CIRCL's format from `b[0..len]` into
/// `*out`.
///
/// Errors: `KEYFENCE_INVALID_KEY` naming the field at fault.
///
/// # Safety
/// `b` points to `len` readable bytes; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_master_key_from_bytes(
    b: *const u8, len: usize, out: *mut *mut keyfence_abe_master_key,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { from_bytes(b, len, out, MasterSecretKey::from_bytes, keyfence_abe_master_key) }
}

/// Writes a master secret key in CIRCL's format to `*out` (a secret: free
/// it with `keyfence_bytes_free`, which wipes it).
///
/// # Safety
/// `key` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_master_key_to_bytes(
    key: *const keyfence_abe_master_key, out: *mut keyfence_bytes,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { to_bytes(key, out, |k| k.0.to_bytes().to_vec()) }
}

/// Frees (and wipes) a master secret key; NULL is a no-op.
///
/// # Safety
/// `key` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_master_key_free(key: *mut keyfence_abe_master_key) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(key) }
}

/// Reads an attribute key in CIRCL's format from `b[0..len]` into `*out`.
///
/// Errors: `KEYFENCE_INVALID_KEY` naming the field at fault.
///
/// # Safety
/// `b` points to `len` readable bytes; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_attribute_key_from_bytes(
    b: *const u8, len: usize, out: *mut *mut keyfence_abe_attribute_key,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { from_bytes(b, len, out, AttributeKey::from_bytes, keyfence_abe_attribute_key) }
}

/// Writes an attribute key in CIRCL's format to `*out` (a secret: free it
/// with `keyfence_bytes_free`, which wipes it).
///
/// # Safety
/// `key` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_attribute_key_to_bytes(
    key: *const keyfence_abe_attribute_key, out: *mut keyfence_bytes,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { to_bytes(key, out, |k| k.0.to_bytes().to_vec()) }
}

/// Frees (and wipes) an attribute key; NULL is a no-op.
///
/// # Safety
/// `key` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_abe_attribute_key_free(key: *mut keyfence_abe_attribute_key) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(key) }
}
