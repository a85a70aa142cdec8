//! The policy language from C.

use std::ffi::c_char;

use keyfence_core::policy::{self, Attributes};

use crate::bytes::{self, keyfence_bytes};
use crate::error::{keyfence_result, Error};
use crate::ffi;

/// Parses attributes in the command line's `label=value,label=value` form.
pub(crate) fn attributes(text: &str) -> Result<Attributes, Error> {
    Ok(text.parse::<Attributes>()?)
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
pub unsafe extern "C" fn keyfence_policy_check(
    policy: *const c_char,
    attrs: *const c_char,
    satisfied: *mut bool,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(satisfied, "satisfied")?;
        // SAFETY: the caller's promises, passed on.
        let (text, attrs) = unsafe { (ffi::text(policy, "policy")?, ffi::text(attrs, "attrs")?) };
        let p = parse(text)?;
        let ok = p.eval(&attributes(attrs)?);
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { out.write(ok) };
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
    policy::parse(text).map_err(|e| {
        let code = keyfence_result::from_code(keyfence_core::ErrorCode::from(&e));
        Error::new(code, e.render(text)).at(e.offset())
    })
}
