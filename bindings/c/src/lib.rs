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
pub mod fleet;
pub mod key_file;
pub mod policy;
pub mod remote;
pub mod sign;
pub mod wrap;

pub use bytes::keyfence_bytes;
pub use error::keyfence_result;

/// The major version of the header a program was compiled against
/// (`keyfence_version()` is the library's, at run time). The soname
/// `libkeyfence.so.0` changes with it from 1.0 on; before 1.0 each minor
/// version may break the ABI (README.md, "Versions").
pub const KEYFENCE_VERSION_MAJOR: u32 = 0;
/// The header's minor version.
pub const KEYFENCE_VERSION_MINOR: u32 = 1;
/// The header's patch version.
pub const KEYFENCE_VERSION_PATCH: u32 = 0;

/// The library's version, `MAJOR.MINOR.PATCH`, as a static NUL-terminated
/// string (never freed): compare it with `KEYFENCE_VERSION_MAJOR` and
/// `KEYFENCE_VERSION_MINOR` to check at run time that the library loaded
/// is the one the program was compiled for.
#[no_mangle]
pub extern "C" fn keyfence_version() -> *const std::ffi::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

#[cfg(test)]
mod tests {
    /// The header's version macros are the workspace's version: a release
    /// that bumps one without the other fails here.
    #[test]
    fn the_version_macros_are_the_packages_version() {
        let v = format!("{}.{}.{}", super::KEYFENCE_VERSION_MAJOR, super::KEYFENCE_VERSION_MINOR, super::KEYFENCE_VERSION_PATCH);
        assert_eq!(v, env!("CARGO_PKG_VERSION"));
    }
}
