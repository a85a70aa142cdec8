//! Owned byte strings handed to C.

use zeroize::Zeroize;

use crate::error::Error;
use crate::ffi;

/// A byte string keyfence allocated and the caller owns: a ciphertext, a
/// plaintext, a key encoding, a policy's text.
///
/// `data[len]` is always 0, so text results can be used as C strings.
/// Release it with `keyfence_bytes_free`, which wipes the bytes first
/// (plaintexts and key encodings are secrets). A zeroed `keyfence_bytes`
/// (`{NULL, 0}`) is empty and may be freed.
#[repr(C)]
#[derive(Debug)]
pub struct keyfence_bytes {
    /// The bytes; NULL only when empty and never filled.
    pub data: *mut u8,
    /// How many bytes, not counting the trailing 0.
    pub len: usize,
}

impl keyfence_bytes {
    /// A fresh allocation holding `b` and a trailing 0. Built at its exact
    /// size, so no reallocation leaves an unwiped copy of a secret behind.
    fn from_slice(b: &[u8]) -> Self {
        let mut v = vec![0u8; b.len() + 1];
        v[..b.len()].copy_from_slice(b);
        let len = b.len();
        let data = Box::into_raw(v.into_boxed_slice()).cast::<u8>();
        keyfence_bytes { data, len }
    }
}

/// Writes `b` (copied) to `*out`.
///
/// # Safety
/// `out` is non-NULL (checked with [`ffi::out`]) and writable.
pub(crate) unsafe fn give(out: *mut keyfence_bytes, b: &[u8]) {
    // SAFETY: the caller checked `out` and promises it is writable.
    unsafe { out.write(keyfence_bytes::from_slice(b)) };
}

/// The body of a function whose result is bytes: checks `out`, runs `f`
/// inside the boundary and copies what it returns to `*out`.
///
/// # Safety
/// `out` is NULL or writable.
pub(crate) unsafe fn make<B: AsRef<[u8]>>(
    out: *mut keyfence_bytes, name: &str, f: impl FnOnce() -> Result<B, Error>,
) -> crate::keyfence_result {
    ffi::boundary(|| {
        let out = self::out(out, name)?;
        let b = f()?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { give(out, b.as_ref()) };
        Ok(())
    })
}

/// Checks an output `keyfence_bytes` pointer.
pub(crate) fn out(p: *mut keyfence_bytes, name: &str) -> Result<*mut keyfence_bytes, Error> {
    ffi::out(p, name)
}

/// Wipes and releases the bytes in `*b` and sets it to `{NULL, 0}`. `b`
/// may be NULL, and `*b` may already be empty; freeing twice through the
/// same struct is therefore harmless.
///
/// # Safety
/// `b` is NULL or points to a `keyfence_bytes` that keyfence filled (or
/// one that is `{NULL, 0}`), not copied elsewhere and freed there.
#[no_mangle]
pub unsafe extern "C" fn keyfence_bytes_free(b: *mut keyfence_bytes) {
    // SAFETY: the caller's promise; NULL is a no-op.
    let Some(b) = (unsafe { b.as_mut() }) else { return };
    if !b.data.is_null() {
        let slice = std::ptr::slice_from_raw_parts_mut(b.data, b.len + 1);
        // SAFETY: `data` came from `from_slice`'s boxed slice of `len + 1`
        // bytes and is freed once: the struct is reset below.
        let mut owned = unsafe { Box::from_raw(slice) };
        owned.zeroize();
    }
    b.data = std::ptr::null_mut();
    b.len = 0;
}
