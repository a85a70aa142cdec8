//! A servers' copy of a store: what a machine reads and nothing of the
//! authority's.
//!
//! A store holds two kinds of object. What machines read is public or
//! sealed, and signed by the authority (`public/`: the generation and
//! revocation lists; `sealed/`: the policy keys, each sealed under CP-ABE;
//! `envelopes/`: the customer secrets, each sealed to a policy key).
//! What the authority alone reads is in `authority/`: the master secret
//! keys, the policy private keys and the key that signs every object. A
//! server that can read `authority/` is its own authority: it can open
//! every envelope whatever its attributes. So servers read a copy made by
//! [`export_for_servers`] (a directory they keep, or an etcd prefix), never the
//! authority's store; the agent refuses to start on a store whose
//! authority state it can read.
//!
//! The copy is brought up to date by running [`export_for_servers`] again: new and
//! changed objects are written first (sealed keys and envelopes, then the
//! lists that name them, so a server reading meanwhile never meets a list
//! that names what is not there yet), then objects gone from the source
//! are deleted.

use super::layout;
use super::store::{Store, StoreError};
use super::{Result, WrapError};

/// What [`export_for_servers`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Exported {
    /// Objects written (new, or changed since the last export).
    pub written: usize,
    /// Objects already as the source has them.
    pub unchanged: usize,
    /// Objects deleted (gone from the source: retired policy keys,
    /// re-wrapped or deleted envelopes).
    pub deleted: usize,
}

/// The prefixes a servers' copy holds, in the order they are written.
const COPIED: [&str; 3] = [layout::SEALED, layout::ENVELOPES, layout::PUBLIC];

/// Objects read and compared per round trip.
const BATCH: usize = 256;

/// Brings `to` up to date as a servers' copy of `from`: every object under
/// `sealed/`, `envelopes/` and `public/`, and nothing under `authority/`.
/// `from` is the authority's store, or a copy of it (a server brings the
/// store its agent reads up to date from a copy it received, in the order
/// that never shows the agent a list naming what is not there yet).
///
/// # Errors
/// [`WrapError::Store`] ([`StoreError::InvalidName`]) when `to` holds an
/// authority's state (a servers' copy never does: it would be an
/// authority's store, whose objects this would overwrite), or `from` is no
/// store; the stores' own errors.
pub fn export_for_servers(from: &dyn Store, to: &dyn Store) -> Result<Exported> {
    let refused = |why: String| WrapError::Store(StoreError::InvalidName { name: "export".into(), reason: why });
    if to.get(layout::STATE)?.is_some() {
        return Err(refused(
            "the destination holds an authority's state: a servers' copy never does, and this would overwrite that authority's objects"
                .into(),
        ));
    }
    // The authority's store, or a servers' copy of it: a server brings its
    // own store up to date from the copy it received, in this order.
    if from.get(layout::GENERATIONS)?.is_none() {
        return Err(refused("the source holds no generation list: it is no keyfence store".into()));
    }
    let mut done = Exported::default();
    let mut keep = Vec::new();
    for prefix in COPIED {
        let names = match prefix {
            // Not a folder of objects: its two lists, by name.
            layout::PUBLIC => [layout::GENERATIONS, layout::REVOKED].map(str::to_owned).to_vec(),
            _ => from.list(prefix)?,
        };
        for chunk in names.chunks(BATCH) {
            let ours = from.get_many(chunk)?;
            let theirs = to.get_many(chunk)?;
            for ((name, ours), theirs) in chunk.iter().zip(ours).zip(theirs) {
                let Some(value) = ours else { continue };
                if theirs.as_deref() == Some(value.as_slice()) {
                    done.unchanged += 1;
                } else {
                    to.put(name, &value)?;
                    done.written += 1;
                }
            }
        }
        keep.push(names);
    }
    // Then what the source no longer has, once the lists that no longer
    // name it are in place.
    for (prefix, names) in COPIED.iter().zip(&keep) {
        if *prefix == layout::PUBLIC {
            for name in [layout::GENERATIONS, layout::REVOKED] {
                if from.get(name)?.is_none() && to.get(name)?.is_some() {
                    to.delete(name)?;
                    done.deleted += 1;
                }
            }
            continue;
        }
        let wanted: std::collections::HashSet<&String> = names.iter().collect();
        for name in to.list(prefix)? {
            if !wanted.contains(&name) {
                to.delete(&name)?;
                done.deleted += 1;
            }
        }
    }
    Ok(done)
}

/// Whether `store` lets this process read the authority's state: a
/// servers' store must not (see the module documentation).
///
/// # Errors
/// The store's, other than a refusal to read (which is the answer no).
pub fn holds_readable_authority(store: &dyn Store) -> Result<bool> {
    match store.get(layout::STATE) {
        Ok(state) => Ok(state.is_some()),
        Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::PermissionDenied => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::wrap::{Authority, CacheConfig, Machine, MemoryStore};

    #[test]
    fn a_servers_copy_opens_envelopes_follows_changes_and_holds_no_authority_state() {
        let source: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut a = Authority::init(source.clone()).unwrap();
        let env = a.wrap("region: EU", b"secret").unwrap().to_bytes().to_vec();
        let key = a.issue(&"region=EU".parse().unwrap()).unwrap();
        let copy: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let first = export_for_servers(&*source, &*copy).unwrap();
        assert!(first.written >= 3 && first.deleted == 0, "{first:?}");
        assert!(!holds_readable_authority(&*copy).unwrap() && holds_readable_authority(&*source).unwrap());
        assert!(copy.list("authority/").unwrap().is_empty());
        let m = Machine::new(key.clone(), copy.clone(), CacheConfig::default());
        assert_eq!(&m.open(&env).unwrap()[..], b"secret");
        // Again: nothing to write.
        let again = export_for_servers(&*source, &*copy).unwrap();
        assert_eq!((again.written, again.deleted), (0, 0), "{again:?}");
        // A rotation and a retirement reach the copy; the retired key goes.
        a.rotate_policy_key("region: EU").unwrap();
        a.retire_policy_keys("region: EU").unwrap();
        let after = export_for_servers(&*source, &*copy).unwrap();
        assert!(after.written > 0 && after.deleted > 0, "{after:?}");
        let m = Machine::new(key, copy.clone(), CacheConfig::default());
        assert_eq!(&m.open_current(&env).unwrap()[..], b"secret");
        // Never onto an authority's store, never from nothing; from a copy
        // to another (a server's own store), the same objects.
        assert!(export_for_servers(&*copy, &*source).is_err());
        let other: Arc<dyn Store> = Arc::new(MemoryStore::default());
        assert!(export_for_servers(&*other, &*copy).is_err());
        let again = export_for_servers(&*copy, &*other).unwrap();
        assert!(again.written > 0 && other.list("authority/").unwrap().is_empty());
    }
}
