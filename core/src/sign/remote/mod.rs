//! Remote signing: a key server, and forwarding to the nearest machine
//! that may hold a key.
//!
//! When this machine's attributes do not satisfy a key's policy (a US-only
//! key requested in Tokyo), the operation is sent to the nearest peer that
//! can open the key, which signs and answers: Geo Key Manager's central
//! flow. Both of its 2022 outages came from this path (local signatures
//! queued behind remote ones, pools sized by guesswork, a fixed connection
//! budget, retries to dead hosts, no visibility, no trace through the hop);
//! this module is built against each:
//!
//! - [`KeyServer`] (`keyfence serve`): mutual TLS on AWS-LC (a client
//!   without a certificate from the configured CA gets nothing); keys
//!   opened from their envelopes through the wrap machine, so it signs only
//!   with keys its attributes allow ([`KeyRing`]), optionally in the
//!   key process; its own [`Engine`](crate::sign::Engine) with
//!   per-class executors and bounded queues answering `overloaded` at once;
//!   tenants named by client certificates, each allowed its own keys;
//!   per-connection and per-tenant in-flight and byte limits; the caller's remaining
//!   budget honoured; Prometheus metrics ([`serve_metrics`]).
//! - [`protocol`]: one documented, versioned binary protocol on the key
//!   process's framing: request ids, replies in any order, the remaining
//!   budget and a trace id in every request.
//! - [`RemoteSigner`]: the engine's backend for keys held by peers, on its
//!   slow executor (local RSA and ECDSA never wait behind it). A bounded
//!   pool of multiplexed connections per peer, connect and request
//!   timeouts, peers described by attributes and a round-trip time it
//!   measures; the nearest capable peer first, the next on failure, a
//!   circuit breaker per peer, exponential backoff with full jitter under
//!   a retry budget.
//!
//! `docs/remote.md` covers deployment, certificates, composing timeouts
//! across hops and sizing by Little's law.
//!
//! # Layers
//!
//! Inside, each module imports only from rows above it:
//!
//! | layer | modules | what |
//! | --- | --- | --- |
//! | 0 | `protocol` | the wire format (no AWS-LC) |
//! | 1 | `tls`, `poll`, `listen`, `metrics`, `retry_budget`, `breaker`, `keyring` | mutual-TLS contexts; `poll(2)`; a listening socket with a deep accept queue; counters and Prometheus text; the retry policies (their backoff is the crate's `backoff`, shared with `wrap`); the server's keys |
//! | 2 | `link`, `tenants` | one TLS connection's thread: frames in, queued frames out; tenants from certificates, their keys and admission |
//! | 3 | `conn`, `server`, `exporter` | a client connection; the key server; the metrics endpoint |
//! | 4 | `pool`, `routing` | connections per peer; peers and their order |
//! | 5 | `signer` | [`RemoteSigner`] |

mod breaker;
mod conn;
mod exporter;
mod handshakes;
mod keyring;
mod link;
mod listen;
mod metrics;
mod poll;
mod pool;
pub mod protocol;
mod retry_budget;
mod routing;
mod server;
mod signer;
mod tenants;
mod tls;

pub use breaker::{BreakerConfig, BreakerState};
pub use exporter::{serve_metrics, MetricsEndpoint};
pub use keyring::{KeyId, KeyRing, KeyRingError};
pub use metrics::{RequestCounts, RequestStats};
pub use retry_budget::RetryBudgetConfig;
pub use routing::PeerConfig;
pub use server::{KeyServer, ServerConfig, ServerMetrics};
pub use signer::{ClientMetrics, OpenOrForwardError, PeerMetrics, RemoteConfig, RemoteSigner, NAME};
pub use tenants::{AllowList, TenantMetrics, TenantSource};
pub use tls::TlsFiles;
