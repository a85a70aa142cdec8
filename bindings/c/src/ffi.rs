//! The plumbing every exported function shares: the panic boundary and the
//! conversions of C arguments, each refusing NULL with a result code.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use keyfence_core::ErrorCode;

use crate::error::{self, keyfence_result, Error};

/// Runs `f`, records its error for `keyfence_error_message`, and returns
/// the code. A panic is caught here and reported as `KEYFENCE_PANIC`:
/// unwinding into C is undefined behaviour.
pub(crate) fn boundary(f: impl FnOnce() -> Result<(), Error>) -> keyfence_result {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            error::clear();
            keyfence_result::OK
        }
        Ok(Err(e)) => error::set(e),
        Err(_) => error::set(Error::new(ErrorCode::Panic, "internal error: keyfence panicked (a bug; please report it)")),
    }
}

/// A required argument was NULL.
pub(crate) fn null(name: &str) -> Error {
    Error::new(ErrorCode::InvalidArgument, format!("{name} is NULL"))
}

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid and
/// unchanged for `'a`.
pub(crate) unsafe fn text<'a>(p: *const c_char, name: &str) -> Result<&'a str, Error> {
    if p.is_null() {
        return Err(null(name));
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|_| Error::new(ErrorCode::InvalidArgument, format!("{name} is not UTF-8")))
}

/// A UTF-8 string argument given as pointer and length, with no
/// terminator needed; NULL is allowed only for an empty one. A NUL byte
/// inside is refused, as it could not be in a NUL-terminated argument:
/// every text of this API means the same whichever way it was passed.
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes that stay valid and
/// unchanged for `'a`.
pub(crate) unsafe fn text_len<'a>(p: *const c_char, len: usize, name: &str) -> Result<&'a str, Error> {
    // SAFETY: the caller's promise, passed on.
    let b = unsafe { slice(p.cast(), len, name)? };
    let s = std::str::from_utf8(b).map_err(|_| Error::new(ErrorCode::InvalidArgument, format!("{name} is not UTF-8")))?;
    if s.contains('\0') {
        return Err(Error::new(ErrorCode::InvalidArgument, format!("{name} contains a NUL character")));
    }
    Ok(s)
}

/// A byte string argument as pointer and length; NULL is allowed only for
/// an empty one.
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes that stay valid and
/// unchanged for `'a`.
pub(crate) unsafe fn slice<'a>(p: *const u8, len: usize, name: &str) -> Result<&'a [u8], Error> {
    // SAFETY: the caller's promise, passed on.
    unsafe { array(p, len, name) }
}

/// An array argument as pointer and count; NULL is allowed only for an
/// empty one.
///
/// # Safety
/// `p` is NULL or points to `count` readable, initialized `T`s that stay
/// valid and unchanged for `'a`.
pub(crate) unsafe fn array<'a, T>(p: *const T, count: usize, name: &str) -> Result<&'a [T], Error> {
    if count == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(null(name));
    }
    // SAFETY: non-NULL, and the caller promises `count` readable elements.
    Ok(unsafe { std::slice::from_raw_parts(p, count) })
}

/// A shared reference to the object behind a handle.
///
/// # Safety
/// `p` is NULL or a pointer this library returned for a `T` that has not
/// been freed, and no other thread frees it during `'a`.
pub(crate) unsafe fn borrow<'a, T>(p: *const T, name: &str) -> Result<&'a T, Error> {
    // SAFETY: the caller's promise; NULL becomes `None`.
    unsafe { p.as_ref() }.ok_or_else(|| null(name))
}

/// An exclusive reference to the object behind a handle.
///
/// # Safety
/// As [`borrow`], and no other reference to the object is in use during
/// `'a` (the handle is not shared between threads while this runs).
pub(crate) unsafe fn borrow_mut<'a, T>(p: *mut T, name: &str) -> Result<&'a mut T, Error> {
    // SAFETY: the caller's promise; NULL becomes `None`.
    unsafe { p.as_mut() }.ok_or_else(|| null(name))
}

/// Checks that an output pointer is not NULL before any work is done.
pub(crate) fn out<T>(p: *mut T, name: &str) -> Result<*mut T, Error> {
    if p.is_null() {
        Err(null(name))
    } else {
        Ok(p)
    }
}

/// Hands a new object to C through `*out`.
///
/// # Safety
/// `out` is non-NULL (checked with [`out`]) and writable.
pub(crate) unsafe fn give<T>(out: *mut *mut T, value: T) {
    // SAFETY: the caller checked `out` and promises it is writable.
    unsafe { out.write(Box::into_raw(Box::new(value))) };
}

/// The body of a constructor: checks `out`, runs `f` inside the
/// [`boundary`] and hands the object it makes to C through `*out`.
///
/// # Safety
/// `out` is NULL or writable.
pub(crate) unsafe fn make<T>(out: *mut *mut T, name: &str, f: impl FnOnce() -> Result<T, Error>) -> keyfence_result {
    boundary(|| {
        let out = self::out(out, name)?;
        let value = f()?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { give(out, value) };
        Ok(())
    })
}

/// Takes back and drops an object handed out by [`give`]; NULL is a no-op.
///
/// # Safety
/// `p` is NULL or came from [`give`] with the same `T` and has not been
/// freed.
pub(crate) unsafe fn free<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: the caller's promise: `p` is a live `Box<T>` we made.
        let owned = unsafe { Box::from_raw(p) };
        // A destructor that panicked (joining an engine's threads, say)
        // must not unwind into C; the object is gone either way.
        let _ = catch_unwind(AssertUnwindSafe(move || drop(owned)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_result_code_and_a_message() {
        let code = boundary(|| panic!("a bug"));
        assert_eq!(code, ErrorCode::Panic);
        let mut buf = [0 as c_char; 128];
        let mut n = 0;
        // SAFETY: a local buffer of the stated size and a local length.
        unsafe { crate::error::keyfence_error_message(buf.as_mut_ptr(), buf.len(), &mut n) };
        // SAFETY: the function NUL-terminates within the buffer.
        let msg = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
        assert!(msg.contains("panicked"), "{msg}");
        assert_eq!(boundary(|| Ok(())), keyfence_result::OK);
    }

    #[test]
    fn null_and_non_utf8_arguments_are_refused() {
        // SAFETY: NULL and a NUL-terminated literal.
        unsafe {
            assert!(text(std::ptr::null(), "policy").is_err());
            assert!(text(c"\xff".as_ptr(), "policy").is_err());
            assert!(slice(std::ptr::null(), 3, "msg").is_err());
            assert_eq!(slice(std::ptr::null(), 0, "msg").unwrap(), b"");
            assert_eq!(text_len(std::ptr::null(), 0, "label").unwrap(), "");
            assert!(text_len(std::ptr::null(), 1, "label").is_err());
            assert!(text_len(c"\xff".as_ptr(), 1, "label").is_err());
            // Only the given length is read: no terminator needed.
            assert_eq!(text_len(c"abc".as_ptr(), 2, "label").unwrap(), "ab");
            let nul = b"a\0b";
            let e = text_len(nul.as_ptr().cast(), 3, "label").unwrap_err();
            assert!(format!("{e:?}").contains("NUL"), "{e:?}");
        }
    }
}
