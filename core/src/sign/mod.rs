//! Asynchronous private-key operations on AWS-LC.
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
//!   named by [`Algorithm`] or by TLS SignatureScheme code point. A key is
//!   in this process or held by a key process; the handle is the
//!   same.
//! - [`Engine`]: submit a [`Request`], get the result later as a
//!   [`SignFuture`], a callback, or through a [`CompletionQueue`] whose file
//!   descriptor an event loop polls. One executor per [`OpClass`] (RSA,
//!   EC/Ed25519, slow), each with a bounded queue that answers
//!   [`SignError::Overloaded`] at once; a deadline on every operation
//!   ([`SignError::TimedOut`]); cancellation through [`OpHandle`];
//!   per-class [`EngineMetrics`]. Every error has a stable
//!   [`code`](SignError::code).
//! - [`Backend`]: what performs an operation ([`SoftwareBackend`] in
//!   process); backends may answer later through a [`Reply`].
//!   [`key_process`] keeps keys in a separate key process, restarted when it
//!   dies; [`offload`] sends RSA to an offload device (Intel QAT through
//!   QATlib behind the `qat` feature, with the RSA encoding the device
//!   needs; a simulated device behind `bench`).
//! - [`pkcs11`]: keys in a PKCS#11 token (an HSM, a TPM, a cloud KMS's
//!   library, SoftHSM2), named by RFC 7512 URIs; the token holds the key
//!   and signs on the engine's own token class.
//! - [`remote`]: a key server (`keyfence serve`) and the client backend
//!   that forwards operations on keys this machine may not open to the
//!   nearest peer that may, over mutual TLS.
//! - [`wire`]: the frame codec the key process's protocol and the key
//!   server's share; each protocol module keeps only its own messages.
//! - [`managed`]: an engine that owns where its keys live: it starts its
//!   key process (or remote signer) with itself, and stops it when it
//!   closes. What every binding builds on.
//! - [`tls`]: AWS-LC's private-key-method hook, so a TLS handshake
//!   suspends while the engine signs and resumes when it is done.
//!
//! # Layers
//!
//! Each module imports only from the rows above it (and `key_process` and
//! `offload` from everything above them):
//!
//! | layer | modules | what |
//! | --- | --- | --- |
//! | 0 | `types`, `batch`, `sys` | plain types: [`KeyKind`], [`Algorithm`], [`Hash`](enum@Hash) (names, lengths), [`OpClass`], [`Operation`], [`Output`], [`SignError`], [`KeyError`]; no AWS-LC; the submitting thread's batch, which backends that write requests join; the operating system's calls the key process, its clients and the agent make (credentials, sockets, privileges, limits) |
//! | 1 | `local_key`, `held_key` | a key in AWS-LC memory (and hashing); a handle on a key held elsewhere, with the `KeyHolder` trait its holder implements |
//! | 2 | `private_key`; `wire` | [`PrivateKey`], the one public handle over both; the codec both signing protocols speak (framing, the hello's shape, the operation in an OP body, the ERR body and its codes) |
//! | 3 | `exposition`, then `metrics`; `completion_queue` | Prometheus text; per-class counters and latency, [`MetricsSource`]; the pollable [`CompletionQueue`] |
//! | 4 | `op_record` | one operation's record and how its result is delivered: [`SignFuture`], [`OpHandle`] |
//! | 5 | `deadline`, `backend` | the deadline thread; the [`Backend`] trait, its [`Reply`], [`SoftwareBackend`], the holder of a held key as a backend |
//! | 6 | `executor`, `request` | one bounded queue and thread pool per class; [`Request`] |
//! | 7 | `engine` | [`Engine`]: validation, routing (a held key to its holder), deadlines |
//! | 8 | `tls` | the TLS private-key method |
//! | 9 | `pkcs11`, then `key_process`, `offload` | backends: the key process, in three parts: its client (`KeyProcess`, supervisor, protocol), the connection engine both of keyfence's local servers run on (`key_process/server/`), and what runs in the key process under its sandbox (`key_process/process/`: its main, its service's table, the sandbox); the offload device |
//! | 9b | `agent` | the key agent (`keyfence agent`): the other service on the key process's engine, with its own table, poller and token grants |
//! | 10 | `remote` | the key server and the client backend that forwards to the nearest capable peer (uses `key_process` and `wrap`) |
//! | 11 | `managed` | [`ManagedEngine`](managed::ManagedEngine): an engine that starts, owns and stops what holds its keys (in process, a key process, remote key servers), loads keys there, refuses work once closed; the one call the bindings and the OpenSSL provider make |
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

// Layer 0 builds without AWS-LC (the `testing` feature alone), for the
// protocol codecs and their fuzzers; the rest needs `sign`.
#[cfg_attr(not(feature = "sign"), allow(dead_code))]
mod types;

/// Declares what builds without the `sign` feature, for the fuzzers: the
/// wire codec and each protocol's messages, none of which needs
/// AWS-LC. The one place that names the feature exposing them.
macro_rules! codecs_without_sign {
    ($($item:item)*) => {
        $(
            #[cfg(all(not(feature = "sign"), feature = "testing"))]
            $item
        )*
    };
}

codecs_without_sign! {
    pub mod wire;

    /// Without the `sign` feature, only the key-process protocol codec.
    pub mod key_process {
        #[path = "protocol.rs"]
        pub mod protocol;
    }

    /// Without the `sign` feature, only the remote protocol codec.
    pub mod remote {
        #[path = "protocol.rs"]
        pub mod protocol;
    }
}

#[cfg(feature = "sign")]
pub mod agent;
#[cfg(feature = "sign")]
mod backend;
#[cfg(feature = "sign")]
mod batch;
#[cfg(feature = "sign")]
mod completion_queue;
#[cfg(feature = "sign")]
mod deadline;
#[cfg(feature = "sign")]
mod engine;
#[cfg(feature = "sign")]
mod executor;
#[cfg(feature = "sign")]
mod exposition;
#[cfg(feature = "sign")]
mod held_key;
#[cfg(feature = "sign")]
pub mod key_process;
#[cfg(feature = "sign")]
mod local_key;
#[cfg(feature = "sign")]
pub mod managed;
#[cfg(feature = "sign")]
mod metrics;
#[cfg(feature = "sign")]
pub mod offload;
#[cfg(feature = "sign")]
mod op_record;
#[cfg(feature = "sign")]
pub mod pkcs11;
#[cfg(feature = "sign")]
mod private_key;
#[cfg(feature = "sign")]
pub mod remote;
#[cfg(feature = "sign")]
mod request;
#[cfg(feature = "sign")]
pub(crate) mod sys;
#[cfg(feature = "sign")]
mod threads;
#[cfg(feature = "sign")]
pub mod tls;
#[cfg(feature = "sign")]
pub mod wire;

pub use types::{
    Algorithm, AlgorithmError, BackendFailure, CryptoOp, ErrorKind, Hash, Input, KeyError, KeyKind, OpClass, Operation, Output, Resource,
    SignError, TokenFailure,
};

#[cfg(all(feature = "sign", feature = "testing"))]
pub use backend::LatencyBackend;
#[cfg(feature = "sign")]
pub use backend::{Backend, Reply, SoftwareBackend};
#[cfg(feature = "sign")]
pub use batch::{flush_later, Flush};
#[cfg(feature = "sign")]
pub use completion_queue::{Completion, CompletionQueue};
#[cfg(feature = "sign")]
pub use engine::{Engine, EngineConfig};
#[cfg(feature = "sign")]
pub use executor::ClassConfig;
#[cfg(feature = "sign")]
pub use metrics::{ClassMetrics, EngineMetrics, ErrorCounts, LatencySummary, MetricsSource, SourceMetrics};
#[cfg(feature = "sign")]
pub use op_record::{OpHandle, SignFuture};
#[cfg(feature = "sign")]
pub use private_key::PrivateKey;
#[cfg(feature = "sign")]
pub use request::Request;
