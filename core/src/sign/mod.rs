//! Asynchronous private-key operations on BoringSSL.
//!
//! A TLS server must never block its event loop on a private-key operation,
//! and one slow class of operation must never starve another: the seeds
//! (Geo Key Manager's 2022 outages, Fastly's neverbleed work) show both
//! failures taking TLS down. This module is the answer:
//!
//! - [`PrivateKey`]: RSA 2048-4096, ECDSA P-256/P-384 and Ed25519 keys from
//!   PEM, DER (PKCS#1, PKCS#8, SEC1) or bytes in memory, with synchronous
//!   operations: RSA PKCS#1 v1.5 and PSS signatures, raw RSA decryption,
//!   ECDSA and Ed25519 signatures, by message or by digest ([`Operation`]),
//!   named by [`Algorithm`] or by TLS SignatureScheme code point.
//! - [`Engine`]: submit a [`Request`], get the result later as a
//!   [`SignFuture`], a callback, or through a [`CompletionQueue`] whose file
//!   descriptor an event loop polls. One executor per [`OpClass`] (RSA,
//!   EC/Ed25519, slow), each with a bounded queue that answers
//!   [`SignError::Overloaded`] at once; a deadline on every operation
//!   ([`SignError::TimedOut`]); cancellation through [`OpHandle`];
//!   per-class [`EngineMetrics`].
//! - [`Backend`]: what performs an operation ([`SoftwareBackend`] in
//!   process; [`LatencyBackend`] adds latency for tests); backends may
//!   answer later through a [`Reply`]. [`isolated`] keeps keys in a
//!   separate key process; [`offload`] sends RSA to an offload device (a
//!   simulator in tests, Intel QAT discovery behind the `qat` feature).
//! - [`tls`]: BoringSSL's private-key-method hook, so a TLS handshake
//!   suspends while the engine signs and resumes when it is done.
//!
//! ```
//! use std::sync::Arc;
//! use keyfence::sign::{Algorithm, Engine, EngineConfig, PrivateKey, KeyKind, Request};
//!
//! let engine = Engine::new(EngineConfig::default())?;
//! let key = Arc::new(PrivateKey::generate(KeyKind::Rsa { bits: 2048 })?);
//! let fut = engine.submit(Request::sign(key, Algorithm::RsaPssSha256, b"hello".to_vec()))?;
//! let signature = fut.wait()?; // or `.await` in async code
//! assert_eq!(signature.len(), 256);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod alg;
mod backend;
mod completion;
mod deadline;
mod engine;
mod error;
mod executor;
mod fd;
pub mod isolated;
mod key;
mod metrics;
pub mod offload;
mod op;
pub mod tls;

pub use alg::{Algorithm, Hash};
pub use backend::{Backend, LatencyBackend, Reply, SoftwareBackend};
pub use completion::{OpHandle, SignFuture};
pub use engine::{Engine, EngineConfig};
pub use error::{ErrorKind, KeyError, SignError};
pub use executor::{ClassConfig, OpClass};
pub use fd::{Completion, CompletionQueue};
pub use key::{KeyKind, PrivateKey};
pub use metrics::{ClassMetrics, EngineMetrics, ErrorCounts, LatencySummary};
pub use op::{Input, Operation, Output, Request};
