//! A case written once runs as a test of its own on each store: the
//! memory store, a directory and a three-member etcd cluster
//! ([`on_every_store!`]). Each failure is then its own, and names its
//! case and its store; none hides the cases after it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use keyfence::wrap::{FileStore, MemoryStore, Store};

use crate::etcd_support::Cluster;

/// Where a case takes its stores from: a new, empty store of one kind at
/// each call.
pub type Stores = dyn Fn() -> Arc<dyn Store>;

/// New memory stores.
pub fn memory() -> Box<Stores> {
    Box::new(|| Arc::new(MemoryStore::default()))
}

/// New directory stores, in a temporary directory removed with the
/// returned function.
pub fn files() -> Box<Stores> {
    let dir = tempfile::tempdir().unwrap();
    let n = AtomicUsize::new(0);
    Box::new(move || Arc::new(FileStore::open(dir.path().join(format!("store-{}", n.fetch_add(1, Ordering::Relaxed)))).unwrap()))
}

/// New stores under prefixes of their own on the cluster that the etcd
/// cases running now share (one is started when none runs; the last case
/// to end stops it), or `None` when the calling test must skip: no etcd
/// (said loudly by [`Cluster::start`], and a failure instead when
/// `KEYFENCE_REQUIRE_ETCD` is set).
pub fn etcd() -> Option<Box<Stores>> {
    // A weak reference: a cluster held by no running case is dropped,
    // which kills its members (a static's value is never dropped).
    static SHARED: Mutex<Weak<Cluster>> = Mutex::new(Weak::new());
    static PREFIX: AtomicUsize = AtomicUsize::new(0);
    let cluster = {
        let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        match shared.upgrade() {
            Some(cluster) => cluster,
            None => {
                let cluster = Arc::new(Cluster::start()?);
                *shared = Arc::downgrade(&cluster);
                cluster
            }
        }
    };
    Some(Box::new(move || cluster.store(&format!("case/{}", PREFIX.fetch_add(1, Ordering::Relaxed)))))
}

/// For each case (a `fn(&Stores)` of the calling file), the tests
/// `on_memory::CASE`, `on_files::CASE` and `on_etcd::CASE`.
macro_rules! on_every_store {
    ($($case:ident),+ $(,)?) => {
        mod on_memory {
            $(#[test]
            fn $case() {
                super::$case(&*$crate::every_store::memory());
            })+
        }
        mod on_files {
            $(#[test]
            fn $case() {
                super::$case(&*$crate::every_store::files());
            })+
        }
        mod on_etcd {
            $(#[test]
            fn $case() {
                // `None`: no etcd, and the skip said so.
                if let Some(stores) = $crate::every_store::etcd() {
                    super::$case(&*stores);
                }
            })+
        }
    };
}
pub(crate) use on_every_store;
