//! keyfence for Node.js: a napi-rs addon over the Rust core.
//!
//! Each module is one concept of the JavaScript API (`kf.policy`,
//! `kf.abe`, `kf.wrap`, `kf.sign`); `error` is the one place that maps the
//! core's errors to JavaScript, `task` the one shape of a promise computed
//! on the libuv thread pool. The behaviour lives in the core; this crate
//! only converts arguments and results.

// Direction, bottom to top (each module uses only those before it): error,
// task, promise; policy, abe, wrap, sign; remote (which also gives the
// engine its `attachRemote`).

#![deny(unsafe_op_in_unsafe_fn)]
// A test build has no addon registration (napi-rs registers the exports
// from the module's init, which only the cdylib has): the exported
// functions look unused to it.
#![cfg_attr(test, allow(dead_code))]

mod abe;
mod error;
mod policy;
mod promise;
mod remote;
mod sign;
mod task;
mod wrap;

use napi_derive::napi;

/// The version of the keyfence core this addon was built from.
#[napi]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}
