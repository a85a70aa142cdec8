//! Result codes and the per-thread error message.
//!
//! A result is `KEYFENCE_OK` (0) or the number of one of the core's stable
//! [`ErrorCode`]s (`docs/errors.md`). This crate keeps no list of its own:
//! `keyfence.h`'s enum is written from the core's table by
//! `tests/header.rs`, and every core error converts through
//! [`keyfence_core::Coded`].

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::fmt;
use std::sync::OnceLock;

use keyfence_core::{Coded, ErrorCode};

/// The result of every keyfence function as C receives it: 0 for success
/// or an [`ErrorCode`]'s number, in a `uint32_t` (what the header's enum
/// is in C and C++).
// cbindgen skips the type (the annotation below): the header declares the
// enum that tests/header.rs generates from the core's table instead.
///
/// cbindgen:ignore
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub struct keyfence_result(u32);

impl keyfence_result {
    /// `KEYFENCE_OK`: success.
    pub(crate) const OK: keyfence_result = keyfence_result(0);
}

impl From<ErrorCode> for keyfence_result {
    fn from(code: ErrorCode) -> Self {
        keyfence_result(code as u32)
    }
}

impl PartialEq<ErrorCode> for keyfence_result {
    fn eq(&self, code: &ErrorCode) -> bool {
        self.0 == *code as u32
    }
}

/// The C name, `KEYFENCE_POLICY_SYNTAX`, for test failures.
impl fmt::Debug for keyfence_result {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match ErrorCode::from_u32(self.0) {
            Some(code) => write!(f, "KEYFENCE_{}", code.name()),
            None if self.0 == 0 => f.write_str("KEYFENCE_OK"),
            None => write!(f, "keyfence_result({})", self.0),
        }
    }
}

/// An error on its way to C: a code and the message for
/// `keyfence_error_message`.
#[derive(Debug)]
pub(crate) struct Error {
    code: ErrorCode,
    message: String,
    /// The byte offset in a policy text the error is about.
    position: Option<usize>,
}

impl Error {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error { code, message: message.into(), position: None }
    }

    /// The same error, about byte `position` of a policy text.
    pub(crate) fn at(self, position: usize) -> Self {
        Error { position: Some(position), ..self }
    }
}

/// Every core error: its code, its message and, for a policy that does
/// not parse, the byte position.
impl<E: Coded> From<E> for Error {
    fn from(e: E) -> Self {
        Error { position: e.policy_position(), ..Error::new(e.code(), e.to_string()) }
    }
}

thread_local! {
    static LAST: RefCell<Option<Error>> = const { RefCell::new(None) };
}

/// Records `e` as the calling thread's last error and returns its code.
pub(crate) fn set(e: Error) -> keyfence_result {
    let code = e.code.into();
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
    let names = NAMES.get_or_init(|| ErrorCode::ALL.iter().filter_map(|c| Some((*c as u32, CString::new(c.name()).ok()?))).collect());
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
        return ErrorCode::InvalidArgument.into();
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
    keyfence_result::OK
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
    fn a_result_is_the_core_code_by_number_and_name() {
        for &c in ErrorCode::ALL {
            let r = keyfence_result::from(c);
            assert_eq!(r.0, c as u32, "{c:?}");
            assert_eq!(r, c);
            assert_eq!(format!("{r:?}"), format!("KEYFENCE_{}", c.name()));
            // SAFETY: the function returns a static C string.
            let name = unsafe { CStr::from_ptr(keyfence_result_name(c as u32)) };
            assert_eq!(name.to_str().unwrap(), c.name());
        }
        assert_eq!(format!("{:?}", keyfence_result::OK), "KEYFENCE_OK");
        // SAFETY: as above.
        unsafe {
            assert_eq!(CStr::from_ptr(keyfence_result_name(0)).to_str().unwrap(), "OK");
            assert_eq!(CStr::from_ptr(keyfence_result_name(99_999)).to_str().unwrap(), "UNKNOWN");
        }
    }
}
