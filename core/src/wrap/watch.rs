//! Watching a store: the changes under a prefix, delivered in order, the
//! same for every store ([`Store::watch`](super::Store::watch)).
//!
//! A store with a change feed (etcd) streams its own events. Any other
//! store is polled: [`poll`] takes a snapshot of the prefix (each object's
//! name and a fingerprint that changes whenever the object is replaced),
//! compares it with the previous one, and reports the difference. A
//! polled store keeps no history, so resuming a polled watch from an
//! earlier revision always starts with [`WatchEvent::Compacted`]: the
//! watcher must read everything again, exactly as after an etcd
//! compaction.

use crate::spawn::QuietSpawn;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// A change to an object under a watched prefix. `Debug` shows a value's
/// length only (a watch on `authority/` carries the authority's state).
#[derive(Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// The object was created or replaced at `revision`.
    Put {
        /// The object's name (as given to [`Store::get`](super::Store::get)).
        key: String,
        /// The revision of the change.
        revision: i64,
        /// The value written, when the store's feed carries it (etcd's
        /// does; a poll does not read values): a watcher then needs no read
        /// of its own. As untrusted as a read: verify it the same way.
        value: Option<Vec<u8>>,
    },
    /// The object was deleted at `revision`.
    Delete {
        /// The object's name.
        key: String,
        /// The revision of the change.
        revision: i64,
    },
    /// The changes between the revision the watch was to resume from and
    /// `revision` are lost to it (etcd compacted them away, or the store
    /// keeps no history): the watcher must read the prefix again in full.
    /// The watch goes on with the changes after `revision`.
    Compacted {
        /// The revision the watch resumes after.
        revision: i64,
    },
}

impl std::fmt::Debug for WatchEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WatchEvent::Put { key, revision, value } => f
                .debug_struct("Put")
                .field("key", key)
                .field("revision", revision)
                .field("value", &value.as_ref().map(|v| format!("{} bytes", v.len())))
                .finish(),
            WatchEvent::Delete { key, revision } => f.debug_struct("Delete").field("key", key).field("revision", revision).finish(),
            WatchEvent::Compacted { revision } => f.debug_struct("Compacted").field("revision", revision).finish(),
        }
    }
}

impl WatchEvent {
    /// The revision of the change (or the one resumed after a compaction).
    /// On etcd it is the cluster's revision; on a polled store it counts
    /// the polls that found a change since the watch began, and means
    /// nothing to another watch.
    pub fn revision(&self) -> i64 {
        match self {
            WatchEvent::Put { revision, .. } | WatchEvent::Delete { revision, .. } | WatchEvent::Compacted { revision } => *revision,
        }
    }

    /// The object changed (`None` for [`WatchEvent::Compacted`]).
    pub fn key(&self) -> Option<&str> {
        match self {
            WatchEvent::Put { key, .. } | WatchEvent::Delete { key, .. } => Some(key),
            WatchEvent::Compacted { .. } => None,
        }
    }
}

/// The changes under a prefix from a revision on, in revision order, each
/// once ([`Store::watch`](super::Store::watch)). The thread that feeds it
/// stops when it is dropped.
pub struct Watch {
    rx: mpsc::Receiver<WatchEvent>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watch")
    }
}

impl Watch {
    /// A watch fed through `rx` by a thread of a [`Store`](super::Store)
    /// implementation, which stops once `stop` is set (when this value is
    /// dropped) or `rx` is gone.
    pub fn from_channel(rx: mpsc::Receiver<WatchEvent>, stop: Arc<AtomicBool>) -> Self {
        Watch { rx, stop }
    }

    /// The next change, waiting up to `wait`; `None` if there was none.
    pub fn next_timeout(&self, wait: Duration) -> Option<WatchEvent> {
        self.rx.recv_timeout(wait).ok()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// What a poll sees of an object: anything that changes when it is
/// replaced (a digest of its value, or a file's inode, size and time).
pub(crate) type Fingerprint = [u8; 32];

/// A snapshot of a prefix: every object's name and fingerprint.
pub(crate) type Snapshot = BTreeMap<String, Fingerprint>;

/// A watch that calls `snapshot` every `every` and reports what changed.
/// The first snapshot is taken before this returns, so every change made
/// after the call is seen; `resume` (a revision of an earlier watch) asks
/// for what came before too, which a poll cannot know: the watch then
/// begins with [`WatchEvent::Compacted`]. A failed snapshot is tried
/// again at the next poll (the store may be back).
///
/// # Errors
/// The first snapshot's error; the thread's, if it cannot start.
pub(crate) fn poll<F>(name: &str, every: Duration, resume: bool, snapshot: F) -> Result<Watch, super::StoreError>
where
    F: Fn() -> Result<Snapshot, super::StoreError> + Send + 'static,
{
    let mut seen = snapshot()?;
    let (tx, rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    if resume {
        // The receiver is held below: the send cannot fail.
        let _ = tx.send(WatchEvent::Compacted { revision: 0 });
    }
    let flag = stop.clone();
    std::thread::Builder::new()
        .name("keyfence-store-poll".into())
        .spawn_quiet(move || {
            let mut revision = 0i64;
            loop {
                std::thread::sleep(every);
                if flag.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(now) = snapshot() else { continue };
                let changes = diff(&seen, &now, revision + 1);
                if !changes.is_empty() {
                    revision += 1;
                    for e in changes {
                        if tx.send(e).is_err() {
                            return;
                        }
                    }
                }
                seen = now;
            }
        })
        .map_err(|e| super::StoreError::Io { key: name.to_owned(), source: e })?;
    Ok(Watch { rx, stop })
}

/// The events that turn `before` into `after`, in name order, deletions
/// and puts alike at `revision`.
fn diff(before: &Snapshot, after: &Snapshot, revision: i64) -> Vec<WatchEvent> {
    let mut out = Vec::new();
    for (key, fp) in after {
        if before.get(key) != Some(fp) {
            out.push(WatchEvent::Put { key: key.clone(), revision, value: None });
        }
    }
    for key in before.keys().filter(|k| !after.contains_key(*k)) {
        out.push(WatchEvent::Delete { key: key.clone(), revision });
    }
    out.sort_by(|a, b| a.key().cmp(&b.key()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diff_reports_new_replaced_and_deleted_objects_only() {
        let snap = |v: &[(&str, u8)]| v.iter().map(|(k, f)| (k.to_string(), [*f; 32])).collect::<Snapshot>();
        let before = snap(&[("a", 1), ("b", 1), ("c", 1)]);
        let after = snap(&[("a", 1), ("b", 2), ("d", 1)]);
        assert_eq!(
            diff(&before, &after, 7),
            vec![
                WatchEvent::Put { key: "b".into(), revision: 7, value: None },
                WatchEvent::Delete { key: "c".into(), revision: 7 },
                WatchEvent::Put { key: "d".into(), revision: 7, value: None },
            ]
        );
        assert!(diff(&after, &after, 8).is_empty());
    }
}
