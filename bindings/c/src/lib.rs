//! keyfence's C ABI.
//!
//! A thin skin over the core: every function converts its arguments,
//! calls one core function inside a panic boundary ([`ffi`]), and turns the
//! core's error into a [`keyfence_result`] code plus a per-thread message
//! ([`error`]). Nothing here decides anything about cryptography.
//!
//! Handles are opaque to C. Each is a `Box` owned by the caller between
//! its constructor and its `_free`; the comment on each type says whether
//! it may be shared between threads.

// Every exported function dereferences pointers from C: the FFI needs
// `unsafe`, and each block says why it holds.
#![allow(unsafe_code)]
#![allow(non_camel_case_types)]
#![warn(missing_docs)]

pub mod abe;
pub mod bytes;
pub mod error;
mod ffi;
pub mod key_file;
pub mod policy;
pub mod remote;
pub mod sign;
pub mod wrap;

pub use bytes::keyfence_bytes;
pub use error::keyfence_result;

/// The library's version, `MAJOR.MINOR.PATCH`, as a static NUL-terminated
/// string (never freed).
#[no_mangle]
pub extern "C" fn keyfence_version() -> *const std::ffi::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
