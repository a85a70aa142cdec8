//! Result codes and the per-thread error message.
//!
//! The codes are the core's stable [`ErrorCode`]s (`docs/errors.md`), with
//! `KEYFENCE_OK` for success; a test checks that the two tables agree.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use keyfence_core::ErrorCode;

/// The result of every keyfence function: `KEYFENCE_OK` or the error's
/// stable code (`docs/errors.md`). Numbers never change meaning.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[non_exhaustive]
pub enum keyfence_result {
    /// Success.
    KEYFENCE_OK = 0,
    // 1-99: not specific to one area.
    /// An argument is unusable before any work starts: a NULL pointer
    /// across the C ABI, a value of the wrong type in a binding, text that
    /// is not UTF-8.
    KEYFENCE_INVALID_ARGUMENT = 1,
    /// An invariant of keyfence's own code did not hold: a bug, never the
    /// input's fault. Please report it.
    KEYFENCE_INTERNAL = 2,
    /// The operating system's random number generator failed.
    KEYFENCE_RNG = 3,
    /// A panic was caught at a binding boundary (a bug; reported instead of
    /// unwinding into the caller).
    KEYFENCE_PANIC = 4,
    /// The operating system refused a resource: a thread, a socket, a file.
    KEYFENCE_IO = 5,
    // 100-199: the policy language.
    /// The policy text does not parse; the message has the byte position.
    KEYFENCE_POLICY_SYNTAX = 100,
    /// The policy parses but is too large for the ciphertext format, or
    /// nested too deeply.
    KEYFENCE_POLICY_TOO_LARGE = 101,
    /// Attributes (`label=value,...`) that are malformed: no `=`, an empty
    /// label or value, a repeated label, text not in Unicode NFC.
    KEYFENCE_INVALID_ATTRIBUTES = 102,
    // 200-299: CP-ABE.
    /// A ciphertext is malformed, was tampered with, or belongs to another
    /// authority; the message names the field at fault.
    KEYFENCE_INVALID_CIPHERTEXT = 200,
    /// Bytes that do not decode as the key they are said to be (public key,
    /// master secret key, attribute key, machine key).
    KEYFENCE_INVALID_KEY = 201,
    /// The key's attributes do not satisfy the policy.
    KEYFENCE_POLICY_NOT_SATISFIED = 202,
    /// A policy or attribute uses a label keyfence reserves.
    KEYFENCE_RESERVED_LABEL = 203,
    /// An object would pass a limit of its binary format (attribute too
    /// long, too many attributes, a field over its length prefix).
    KEYFENCE_LIMIT_EXCEEDED = 204,
    // 300-399: policy-key wrapping.
    /// An envelope or sealed policy key is malformed or failed its
    /// integrity check.
    KEYFENCE_INVALID_ENVELOPE = 300,
    /// The machine holds keys only for retired master generations.
    KEYFENCE_RETIRED_GENERATION = 301,
    /// No sealed copy of the envelope's policy key is in the store for a
    /// generation the machine can use.
    KEYFENCE_UNKNOWN_POLICY_KEY = 302,
    /// An algorithm identifier this version does not know.
    KEYFENCE_UNKNOWN_ALGORITHM = 303,
    /// The store holds no authority (run `authority init`).
    KEYFENCE_NO_AUTHORITY = 304,
    /// The store already holds an authority.
    KEYFENCE_AUTHORITY_EXISTS = 305,
    /// The authority's state contradicts itself (a live generation without
    /// its master key, a policy key that is not there).
    KEYFENCE_INCONSISTENT_STATE = 306,
    /// An envelope or sealed policy key was made by another authority than
    /// the one the machine key trusts (its signature names another key).
    KEYFENCE_WRONG_AUTHORITY = 307,
    /// A store object the authority signed, but older than one the machine
    /// has already accepted (a generation list put back): the store was
    /// rolled back or replayed.
    KEYFENCE_REPLAYED_OBJECT = 308,
    /// The machine id is revoked: the authority refuses to issue it a key
    /// again, and a revoked machine cannot open the policy keys sealed
    /// since.
    KEYFENCE_MACHINE_REVOKED = 309,
    // 400-499: the store.
    /// The store could not read or write an object.
    KEYFENCE_STORE_IO = 400,
    /// A store object name that is not allowed.
    KEYFENCE_INVALID_STORE_KEY = 401,
    /// Another writer held the store's lock for longer than the wait.
    KEYFENCE_STORE_LOCKED = 402,
    /// Another writer committed to the store between this writer's read and
    /// its commit (a replicated store's compare-and-swap failed); nothing
    /// of this commit was written. Re-run the operation.
    KEYFENCE_STORE_CONFLICT = 403,
    // 500-599: signing.
    /// The executor's queue is full: shed load or retry later.
    KEYFENCE_OVERLOADED = 500,
    /// The operation's deadline passed.
    KEYFENCE_TIMED_OUT = 501,
    /// The operation was cancelled.
    KEYFENCE_CANCELLED = 502,
    /// The engine has shut down.
    KEYFENCE_SHUT_DOWN = 503,
    /// The private key could not be loaded: not a key, an unsupported type,
    /// size or curve, or inconsistent; or a PKCS#11 URI whose token or key
    /// object is not there.
    KEYFENCE_INVALID_PRIVATE_KEY = 504,
    /// The request does not fit the key: wrong algorithm family, a digest
    /// or ciphertext of the wrong length, an unknown algorithm name.
    KEYFENCE_INVALID_REQUEST = 505,
    /// AWS-LC refused the operation.
    KEYFENCE_CRYPTO_FAILED = 506,
    /// The backend that holds or runs the key failed (the isolated key
    /// process died, an offload device failed).
    KEYFENCE_BACKEND_FAILED = 507,
    /// The engine's configuration is unusable.
    KEYFENCE_INVALID_CONFIG = 508,
    /// A PKCS#11 token or its module is gone and did not come back after
    /// its sessions were opened again.
    KEYFENCE_TOKEN_UNAVAILABLE = 509,
    /// A PKCS#11 token needs a PIN none was given for, or refused the PIN
    /// (a refused PIN is never tried again).
    KEYFENCE_TOKEN_LOGIN = 510,
}

impl keyfence_result {
    /// The C result for a core error code.
    pub(crate) fn from_code(code: ErrorCode) -> Self {
        // The discriminants are the core's numbers (checked by a test), so
        // one lookup in the C table by number is exact.
        Self::ALL.iter().copied().find(|r| *r as u32 == code as u32).unwrap_or(keyfence_result::KEYFENCE_INTERNAL)
    }

    /// Every result, success first.
    pub(crate) const ALL: &'static [keyfence_result] = &ALL_RESULTS;
}

const ALL_RESULTS: [keyfence_result; 39] = [
    keyfence_result::KEYFENCE_OK,
    keyfence_result::KEYFENCE_INVALID_ARGUMENT,
    keyfence_result::KEYFENCE_INTERNAL,
    keyfence_result::KEYFENCE_RNG,
    keyfence_result::KEYFENCE_PANIC,
    keyfence_result::KEYFENCE_IO,
    keyfence_result::KEYFENCE_POLICY_SYNTAX,
    keyfence_result::KEYFENCE_POLICY_TOO_LARGE,
    keyfence_result::KEYFENCE_INVALID_ATTRIBUTES,
    keyfence_result::KEYFENCE_INVALID_CIPHERTEXT,
    keyfence_result::KEYFENCE_INVALID_KEY,
    keyfence_result::KEYFENCE_POLICY_NOT_SATISFIED,
    keyfence_result::KEYFENCE_RESERVED_LABEL,
    keyfence_result::KEYFENCE_LIMIT_EXCEEDED,
    keyfence_result::KEYFENCE_INVALID_ENVELOPE,
    keyfence_result::KEYFENCE_RETIRED_GENERATION,
    keyfence_result::KEYFENCE_UNKNOWN_POLICY_KEY,
    keyfence_result::KEYFENCE_UNKNOWN_ALGORITHM,
    keyfence_result::KEYFENCE_NO_AUTHORITY,
    keyfence_result::KEYFENCE_AUTHORITY_EXISTS,
    keyfence_result::KEYFENCE_INCONSISTENT_STATE,
    keyfence_result::KEYFENCE_WRONG_AUTHORITY,
    keyfence_result::KEYFENCE_REPLAYED_OBJECT,
    keyfence_result::KEYFENCE_MACHINE_REVOKED,
    keyfence_result::KEYFENCE_STORE_IO,
    keyfence_result::KEYFENCE_INVALID_STORE_KEY,
    keyfence_result::KEYFENCE_STORE_LOCKED,
    keyfence_result::KEYFENCE_STORE_CONFLICT,
    keyfence_result::KEYFENCE_OVERLOADED,
    keyfence_result::KEYFENCE_TIMED_OUT,
    keyfence_result::KEYFENCE_CANCELLED,
    keyfence_result::KEYFENCE_SHUT_DOWN,
    keyfence_result::KEYFENCE_INVALID_PRIVATE_KEY,
    keyfence_result::KEYFENCE_INVALID_REQUEST,
    keyfence_result::KEYFENCE_CRYPTO_FAILED,
    keyfence_result::KEYFENCE_BACKEND_FAILED,
    keyfence_result::KEYFENCE_INVALID_CONFIG,
    keyfence_result::KEYFENCE_TOKEN_UNAVAILABLE,
    keyfence_result::KEYFENCE_TOKEN_LOGIN,
];

/// An error on its way to C: a code and the message for
/// `keyfence_error_message`.
#[derive(Debug)]
pub(crate) struct Error {
    code: keyfence_result,
    message: String,
    /// The byte offset in a policy text the error is about.
    position: Option<usize>,
}

impl Error {
    pub(crate) fn new(code: keyfence_result, message: impl Into<String>) -> Self {
        Error { code, message: message.into(), position: None }
    }

    /// The same error, about byte `position` of a policy text.
    pub(crate) fn at(self, position: usize) -> Self {
        Error { position: Some(position), ..self }
    }
}

/// Core errors that know their stable code.
pub(crate) trait Coded: std::fmt::Display {
    fn code(&self) -> ErrorCode;
    /// The byte offset in a policy text, for policy syntax errors.
    fn position(&self) -> Option<usize> {
        None
    }
}

impl Coded for keyfence_core::abe::AbeError {
    fn code(&self) -> ErrorCode {
        keyfence_core::abe::AbeError::code(self)
    }
    fn position(&self) -> Option<usize> {
        self.policy_position()
    }
}

impl Coded for keyfence_core::policy::ParseError {
    fn code(&self) -> ErrorCode {
        ErrorCode::from(self)
    }
    fn position(&self) -> Option<usize> {
        Some(self.offset())
    }
}

impl Coded for keyfence_core::policy::AttributesError {
    fn code(&self) -> ErrorCode {
        ErrorCode::from(self)
    }
}

impl Coded for keyfence_core::wrap::WrapError {
    fn code(&self) -> ErrorCode {
        keyfence_core::wrap::WrapError::code(self)
    }
    fn position(&self) -> Option<usize> {
        self.policy_position()
    }
}

impl Coded for keyfence_core::wrap::StoreError {
    fn code(&self) -> ErrorCode {
        keyfence_core::wrap::StoreError::code(self)
    }
}

impl Coded for keyfence_core::sign::SignError {
    fn code(&self) -> ErrorCode {
        keyfence_core::sign::SignError::code(self)
    }
}

impl Coded for keyfence_core::sign::KeyError {
    fn code(&self) -> ErrorCode {
        keyfence_core::sign::KeyError::code(self)
    }
}

impl Coded for keyfence_core::key_file::KeyFileError {
    fn code(&self) -> ErrorCode {
        keyfence_core::key_file::KeyFileError::code(self)
    }
}

impl Coded for keyfence_core::sign::remote::KeyRingError {
    fn code(&self) -> ErrorCode {
        keyfence_core::sign::remote::KeyRingError::code(self)
    }
}

impl<E: Coded> From<E> for Error {
    fn from(e: E) -> Self {
        Error { position: e.position(), ..Error::new(keyfence_result::from_code(e.code()), e.to_string()) }
    }
}

thread_local! {
    static LAST: RefCell<Option<Error>> = const { RefCell::new(None) };
}

/// Records `e` as the calling thread's last error and returns its code.
pub(crate) fn set(e: Error) -> keyfence_result {
    let code = e.code;
    LAST.with(|l| *l.borrow_mut() = Some(e));
    code
}

/// Forgets the calling thread's last error (after a success).
pub(crate) fn clear() {
    LAST.with(|l| *l.borrow_mut() = None);
}

/// The name of a result code without its `KEYFENCE_` prefix (`"OK"`,
/// `"POLICY_SYNTAX"`, ...), as a static NUL-terminated string; `"UNKNOWN"`
/// for a number that is not a code. Never NULL, never freed.
#[no_mangle]
pub extern "C" fn keyfence_result_name(code: u32) -> *const c_char {
    static NAMES: OnceLock<Vec<(u32, CString)>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        ErrorCode::ALL.iter().filter_map(|c| Some((*c as u32, CString::new(c.name()).ok()?))).collect()
    });
    match names.iter().find(|(n, _)| *n == code) {
        Some((_, name)) => name.as_ptr(),
        None if code == 0 => c"OK".as_ptr(),
        None => c"UNKNOWN".as_ptr(),
    }
}

/// Copies the calling thread's last error message into `buf` (at most
/// `cap - 1` bytes and a NUL; UTF-8, possibly cut inside a character when
/// `cap` is too small) and writes its full length, without the NUL, to
/// `*out_n` when `out_n` is not NULL. With no error since the last success,
/// the message is empty.
///
/// Call it with `buf = NULL, cap = 0` to learn the length. The message is
/// for people: it names the field or byte position at fault and never
/// contains key material. It stays until the thread's next keyfence call.
///
/// Returns `KEYFENCE_OK`, or `KEYFENCE_INVALID_ARGUMENT` if `buf` is NULL
/// while `cap` is not 0.
///
/// # Safety
/// `buf` is NULL or points to `cap` writable bytes; `out_n` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_error_message(buf: *mut c_char, cap: usize, out_n: *mut usize) -> keyfence_result {
    if buf.is_null() && cap != 0 {
        return keyfence_result::KEYFENCE_INVALID_ARGUMENT;
    }
    LAST.with(|l| {
        let l = l.borrow();
        let msg = l.as_ref().map_or("", |e| e.message.as_str()).as_bytes();
        if !out_n.is_null() {
            // SAFETY: non-NULL and writable by the caller's promise.
            unsafe { out_n.write(msg.len()) };
        }
        if cap > 0 {
            let n = msg.len().min(cap - 1);
            // SAFETY: `buf` has `cap > n` writable bytes; `msg` is ours and
            // does not overlap memory the caller handed us.
            unsafe {
                std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
                buf.add(n).write(0);
            }
        }
    });
    keyfence_result::KEYFENCE_OK
}

/// Writes the byte offset into the policy text that the calling thread's
/// last error is about to `*position` and returns true, when that error is
/// a policy that does not parse (`KEYFENCE_POLICY_SYNTAX`,
/// `KEYFENCE_POLICY_TOO_LARGE`); returns false (and leaves `*position`
/// alone) otherwise. Bindings use it to point at the mistake.
///
/// # Safety
/// `position` is NULL (then only the answer is returned) or writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_error_position(position: *mut usize) -> bool {
    LAST.with(|l| match l.borrow().as_ref().and_then(|e| e.position) {
        Some(p) => {
            if !position.is_null() {
                // SAFETY: non-NULL and writable by the caller's promise.
                unsafe { position.write(p) };
            }
            true
        }
        None => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn the_c_codes_are_the_core_codes() {
        assert_eq!(keyfence_result::ALL.len(), ErrorCode::ALL.len() + 1, "one C result per core code, plus OK");
        for &c in ErrorCode::ALL {
            let r = keyfence_result::from_code(c);
            assert_eq!(r as u32, c as u32, "{c:?}");
            assert_eq!(format!("{r:?}"), format!("KEYFENCE_{}", c.name()));
            // SAFETY: the function returns a static C string.
            let name = unsafe { CStr::from_ptr(keyfence_result_name(c as u32)) };
            assert_eq!(name.to_str().unwrap(), c.name());
        }
        // SAFETY: as above.
        unsafe {
            assert_eq!(CStr::from_ptr(keyfence_result_name(0)).to_str().unwrap(), "OK");
            assert_eq!(CStr::from_ptr(keyfence_result_name(99_999)).to_str().unwrap(), "UNKNOWN");
        }
    }
}
