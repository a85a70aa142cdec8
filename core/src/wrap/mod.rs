//! Policy-key hybrid wrapping (the Geo Key Manager v2 indirection).
//!
//! Customer secrets are not encrypted under CP-ABE one by one. Each
//! distinct policy gets an X25519 *policy key*; secrets are sealed to it
//! with HPKE (RFC 9180) into [`Envelope`]s, and the policy private key is
//! sealed under CP-ABE with that policy, once per live master generation.
//! Rotating the master key therefore re-seals a handful of policy keys and
//! never touches the (possibly millions of) envelopes; machines cache
//! opened policy keys so CP-ABE stays off the request path.
//!
//! ```
//! use std::sync::Arc;
//! use keyfence::wrap::{Authority, CacheConfig, Machine, MemoryStore, Store};
//!
//! let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
//! let mut authority = Authority::init(store.clone())?;
//! let env = authority.wrap("region: EU", b"-----BEGIN PRIVATE KEY-----...")?;
//!
//! let fra = Machine::new(authority.issue(&"region=EU,country=DE".parse()?)?, store.clone(), CacheConfig::default());
//! assert_eq!(&fra.open(env.to_bytes())?[..], b"-----BEGIN PRIVATE KEY-----...");
//!
//! let report = authority.rotate_master()?;        // re-seals policy keys only
//! assert_eq!(report.resealed, 1);
//! fra.clear_cache();
//! assert!(fra.open(env.to_bytes()).is_ok());       // old generation still decrypts
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See `docs/wrapping.md` for the formats and the crash-safety argument.

// Direction, bottom to top (each module uses only those before it): watch
// (change feeds, and polling for stores without one), store
// (the contract and the file store), etcd (the store on etcd), name (a
// store named by one string), error, signing, hpke, policy,
// generation, layout (object names), format, revocation (machine ids, the
// negations that exclude revoked ones, the signed revocation list), sealed
// and generation_list (the signed objects), newest (the newest of those
// lists a machine accepted, kept across processes), cache; then the two roles that use all of it: machine (opens)
// and authority (writes). Beside them, fuzzing (`testing` only): doors to
// the parsers above that are not public, for the fuzzers.

mod authority;
mod cache;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod export;
#[cfg(feature = "testing")]
mod faulty;
mod fence;
mod floor;
mod format;
#[cfg(feature = "testing")]
pub mod fuzzing;
mod generation;
mod generation_list;
mod hpke;
mod layout;
mod machine;
mod name;
mod newest;
mod policy;
mod revocation;
mod sealed;
mod signing;
mod store;
mod watch;

pub use authority::{
    parse_inventory, Authority, Conflicts, Imported, InventoryMachine, Latencies, MasterRotation, PolicyRetirement, PolicyRotation,
    Revocation, SkipReason, Skipped, Status, Stranding, Traffic, WhereGroup, WhereQuery, WhereReport,
};
pub use cache::{CacheConfig, CacheStats};
pub use error::{Result, StateError, WrapError};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdConfig, EtcdStore, MAX_REQUEST as ETCD_MAX_REQUEST, MAX_TXN_OPS as ETCD_MAX_TXN_OPS};
pub use export::{export_for_servers, holds_readable_authority, Exported};
#[cfg(feature = "testing")]
pub use faulty::FaultyStore;
pub use format::{Envelope, SUITE_X25519_CHACHA};
pub use generation::GenerationState;
pub use machine::{
    current_envelope, nearest, nearest_capable, objects_for_opening, Follower, Machine, MachineHealth, MachineInfo, MachineKey, Peer,
    PublicMachine,
};
pub use name::{create_store, open_store, open_store_path};
pub use newest::{newest_lists_beside, NewestLists};
pub use policy::{policy_id, CanonicalPolicy};
pub use revocation::{RevocationList, MACHINE_LABEL, MAX_MACHINE_ID};
pub use store::{Batch, FileStore, MemoryStore, Op, PageVisitor, Stamp, Store, StoreError, StoreLock, POLL_EVERY};
pub use watch::{Watch, WatchEvent};
#[cfg(feature = "sign")]
pub(crate) use {
    layout::{GENERATIONS, REVOKED},
    newest::record_lists,
};
