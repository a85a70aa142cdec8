//! The policy language from C.

use std::ffi::c_char;

use keyfence_core::policy::{self, Attributes, Leaf, Policy};
use keyfence_core::{Coded, ErrorCode};

use crate::bytes::{self, keyfence_bytes};
use crate::error::{keyfence_result, Error};
use crate::ffi;

/// Parses attributes in the command line's `label=value,label=value` form.
pub(crate) fn attributes(text: &str) -> Result<Attributes, Error> {
    Ok(text.parse::<Attributes>()?)
}

/// One attribute, its label and value given apart as UTF-8 of a stated
/// length (no terminator needed, no quoting: the text is taken as it is).
/// The functions ending in `_pairs` take an array of these in place of
/// `label=value,...` text, so a program passes any label or value (commas,
/// `=`, quotes, spaces, any script) without writing the attribute syntax.
///
/// A pointer may be NULL only when its length is 0; a NUL byte inside a
/// label or value is refused, as in every text argument.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct keyfence_attribute {
    /// The label's bytes (UTF-8).
    pub label: *const c_char,
    /// How many bytes `label` has.
    pub label_len: usize,
    /// The value's bytes (UTF-8).
    pub value: *const c_char,
    /// How many bytes `value` has.
    pub value_len: usize,
}

/// Attributes from `attrs[0..count]`, checked as text is (no empty label or
/// value, no label twice, Unicode NFC), an error naming the pair by its
/// index in the array.
///
/// # Safety
/// `attrs` is NULL with `count == 0`, or points to `count` readable
/// `keyfence_attribute`s whose strings hold what their lengths say.
pub(crate) unsafe fn pairs(attrs: *const keyfence_attribute, count: usize) -> Result<Attributes, Error> {
    // SAFETY: the caller's promise, passed on (a NULL array only when empty).
    let array = unsafe { ffi::array(attrs, count, "attrs")? };
    let mut out = Vec::with_capacity(count);
    for (i, a) in array.iter().enumerate() {
        // SAFETY: each string holds its length's bytes, by the caller's promise.
        let (label, value) = unsafe {
            (
                ffi::text_len(a.label, a.label_len, &format!("attrs[{i}].label"))?,
                ffi::text_len(a.value, a.value_len, &format!("attrs[{i}].value"))?,
            )
        };
        out.push((label, value));
    }
    Ok(Attributes::try_from_pairs(out)?)
}

/// Writes `attrs[0..count]` as the `label=value,...` text every function
/// taking `attrs` text reads back to the same attributes (keyfence quotes
/// what needs it), into `*out`: for the functions that take attributes
/// only as text (`keyfence_remote_config_add_peer`), and for logs.
///
/// Errors: `KEYFENCE_INVALID_ATTRIBUTES` (an empty label or value, a label
/// twice, text not in Unicode NFC: the message gives the pair's index),
/// `KEYFENCE_INVALID_ARGUMENT` for a NULL pointer with a non-zero length,
/// a label or value that is not UTF-8 or holds a NUL byte.
///
/// # Safety
/// `attrs` is NULL with `count == 0`, or points to `count` readable
/// `keyfence_attribute`s; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_attributes_text(
    attrs: *const keyfence_attribute, count: usize, out: *mut keyfence_bytes,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = bytes::out(out, "out")?;
        // SAFETY: the caller's promise, passed on.
        let a = unsafe { pairs(attrs, count)? };
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { bytes::give(out, a.to_string().as_bytes()) };
        Ok(())
    })
}

/// Whether attributes satisfy a policy, without cryptography.
///
/// `policy` is policy text (`country: US or (not region: EU)`), `attrs`
/// the attributes as `label=value,label=value`; `*satisfied` is set on
/// success.
///
/// Every function that takes `attrs` reads it the same way: whitespace
/// around labels and values is trimmed, and a label or value that starts
/// with `"` is a quoted word as in a policy (`\"` and `\\` escapes), which
/// may hold commas, `=` and outer spaces. Quoting every label and value
/// passes any text through unchanged: `"team"="key ops, EU"`.
///
/// Errors: `KEYFENCE_POLICY_SYNTAX` / `KEYFENCE_POLICY_TOO_LARGE` (the
/// message has the byte position and a caret), `KEYFENCE_INVALID_ATTRIBUTES`,
/// `KEYFENCE_INVALID_ARGUMENT` for NULL or non-UTF-8 arguments.
///
/// # Safety
/// `policy` and `attrs` are NUL-terminated strings; `satisfied` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_policy_check(policy: *const c_char, attrs: *const c_char, satisfied: *mut bool) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { check(policy, satisfied, || attributes(ffi::text(attrs, "attrs")?)) }
}

/// `keyfence_policy_check` with the attributes as `attrs[0..count]`, each
/// label and value apart and taken as it is (see `keyfence_attribute`).
///
/// Errors: as `keyfence_policy_check`; `KEYFENCE_INVALID_ATTRIBUTES` and
/// `KEYFENCE_INVALID_ARGUMENT` as `keyfence_attributes_text`.
///
/// # Safety
/// `policy` is a NUL-terminated string; `attrs` is NULL with
/// `count == 0`, or points to `count` readable `keyfence_attribute`s;
/// `satisfied` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_policy_check_pairs(
    policy: *const c_char, attrs: *const keyfence_attribute, count: usize, satisfied: *mut bool,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { check(policy, satisfied, || pairs(attrs, count)) }
}

/// The body of both checks: the policy is parsed first, so that its syntax
/// error is the one reported when both arguments are wrong.
///
/// # Safety
/// `policy` is a NUL-terminated string; `satisfied` is writable.
unsafe fn check(policy: *const c_char, satisfied: *mut bool, attrs: impl FnOnce() -> Result<Attributes, Error>) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(satisfied, "satisfied")?;
        // SAFETY: the caller's promise.
        let p = parse(unsafe { ffi::text(policy, "policy")? })?;
        let ok = p.eval(&attrs()?);
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { out.write(ok) };
        Ok(())
    })
}

/// The policy term `label: value` as canonical policy text, with the label
/// and value (given apart, taken as they are) quoted by keyfence where
/// they need it, into `*out`. A program that builds a policy around
/// values it did not write joins such terms with `and`, `or`, `not` and
/// parentheses, and never quotes by hand: `team: "key ops, EU"`.
///
/// Errors: `KEYFENCE_INVALID_ATTRIBUTES` for an empty label or value or
/// text not in Unicode NFC (no policy could name it),
/// `KEYFENCE_INVALID_ARGUMENT` for NULL with a non-zero length, text that
/// is not UTF-8 or holds a NUL byte.
///
/// # Safety
/// `label` points to `label_len` readable bytes and `value` to
/// `value_len` (either may be NULL when its length is 0); `out` is
/// writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_policy_term(
    label: *const c_char, label_len: usize, value: *const c_char, value_len: usize, out: *mut keyfence_bytes,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = bytes::out(out, "out")?;
        // SAFETY: the caller's promises, passed on.
        let (label, value) = unsafe { (ffi::text_len(label, label_len, "label")?, ffi::text_len(value, value_len, "value")?) };
        // What a key could hold is what a term can name: the same checks.
        Attributes::try_from_pairs([(label, value)])?;
        let leaf = Leaf { label: label.to_owned(), value: value.to_owned(), positive: true, occurrence: 0 };
        let term = Policy::from_parts(vec![leaf], Vec::new()).map_err(|e| Error::new(ErrorCode::InvalidArgument, e.to_string()))?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { bytes::give(out, term.to_string().as_bytes()) };
        Ok(())
    })
}

/// The canonical text of a policy: what keyfence writes into ciphertexts
/// and envelopes, and re-parses to the same policy. Written to `*out` (a
/// NUL-terminated string in `out->data`).
///
/// Errors: as `keyfence_policy_check`.
///
/// # Safety
/// `policy` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_policy_canonical(policy: *const c_char, out: *mut keyfence_bytes) -> keyfence_result {
    ffi::boundary(|| {
        let out = bytes::out(out, "out")?;
        // SAFETY: the caller's promise.
        let p = parse(unsafe { ffi::text(policy, "policy")? })?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { bytes::give(out, p.to_string().as_bytes()) };
        Ok(())
    })
}

/// Parses policy text, keeping the rendered caret in the message.
pub(crate) fn parse(text: &str) -> Result<policy::Policy, Error> {
    policy::parse(text).map_err(|e| Error::new(Coded::code(&e), e.render(text)).at(e.offset()))
}
