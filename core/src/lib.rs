//! keyfence: keep private keys inside a policy.
//!
//! This crate is the core library. Its policy language lives in
//! [`keyfence_policy`] and is re-exported as [`policy`].

#![warn(missing_docs)]
#![deny(unsafe_code)]

pub use keyfence_policy as policy;

pub mod abe;
mod backoff;
#[cfg(feature = "bench")]
pub mod bench;
pub mod codec;
mod error;
pub mod key_file;
pub(crate) mod wipe;
pub mod wrap;

pub use error::{Coded, ErrorCode};

#[cfg(any(feature = "sign", feature = "testing"))]
pub mod sign;
mod spawn;
