//! Where the authority keeps its state and the objects machines need.
//!
//! Keys are `/`-separated names. By convention `authority/…` is the
//! authority's private state (master keys, policy private keys) and
//! everything else (`public/…`, `sealed/…`, `envelopes/…`) is meant to be
//! replicated to machines. A deployment can implement [`Store`] over its
//! own key-value system; [`FileStore`] is the embedded default.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::watch::{self, Watch};

/// A store failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An I/O error on the named object.
    #[error("store object {key:?}: {source}")]
    Io {
        /// The object.
        key: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A name with characters outside `[A-Za-z0-9._-/]`, an empty part or
    /// a `..` part.
    #[error("invalid store key {0:?}")]
    InvalidKey(String),
    /// Another writer held the store's lock for longer than the wait.
    #[error("the store is locked by {}; gave up after {waited:?}", holder.map_or("another process".to_string(), |p| format!("pid {p}")))]
    Locked {
        /// The process holding the lock, when it said so.
        holder: Option<u32>,
        /// How long this writer waited.
        waited: Duration,
    },
    /// Another long operation (a rotation, a revocation) held the store's
    /// fence for longer than this one waits.
    #[error("{operation} by {process} is still running on this store; gave up waiting after {waited:?}")]
    Fenced {
        /// What holds it.
        operation: String,
        /// The holder, `pid@host`.
        process: String,
        /// How long this writer waited.
        waited: Duration,
    },
    /// Another writer committed between this writer's read of `key` and
    /// its commit; nothing of the commit was written. Re-run the operation.
    #[error("store object {key:?} changed since it was read (another writer committed first); nothing was written: run it again")]
    Conflict {
        /// The object that changed.
        key: String,
    },
    /// A value or a commit larger than the store accepts (etcd refuses
    /// requests over 1.5 MiB by default); refused before anything is sent,
    /// never written in part.
    #[error("store object {key:?}: {len} {what}, over the store's limit of {max}")]
    TooLarge {
        /// The object (or the first object of the commit).
        key: String,
        /// What is counted: `bytes`, `writes in one commit`.
        what: &'static str,
        /// Its size, or the commit's.
        len: usize,
        /// The largest the store takes.
        max: usize,
    },
    /// A store name ([`open_store`](super::open_store)) that names no
    /// store: an unknown scheme, no endpoint, an unreadable certificate.
    #[error("store {name:?}: {reason}")]
    InvalidName {
        /// The name as given, with any password removed.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A name that names no keyfence store: a directory that does not
    /// exist or holds none, an etcd prefix without one. Opening never
    /// creates a store; only an authority's `init` does.
    #[error("{name} is not a keyfence store: no authority has been created there (`keyfence authority init --store {name}` creates one)")]
    NotAStore {
        /// The name as given, with any password removed.
        name: String,
    },
    /// A store whose name lies inside another keyfence store's, or holds
    /// one: a store owns its prefix (its directory) and nothing else, and
    /// the outer store's clean-up must never meet the inner store's keys.
    #[error("{store} {} the keyfence store at {other}: a store owns its prefix and nothing else; choose a name outside it", if *.inside { "lies inside" } else { "holds" })]
    Nested {
        /// The store refused.
        store: String,
        /// The other store.
        other: String,
        /// Whether `store` lies inside `other` (else it holds it).
        inside: bool,
    },
}

impl StoreError {
    /// The stable code of this error (`docs/errors.md`).
    pub fn code(&self) -> crate::ErrorCode {
        match self {
            StoreError::Io { .. } | StoreError::NotAStore { .. } => crate::ErrorCode::StoreIo,
            StoreError::InvalidKey(_) => crate::ErrorCode::InvalidStoreKey,
            StoreError::Locked { .. } | StoreError::Fenced { .. } => crate::ErrorCode::StoreLocked,
            StoreError::Conflict { .. } => crate::ErrorCode::StoreConflict,
            StoreError::TooLarge { .. } => crate::ErrorCode::LimitExceeded,
            StoreError::InvalidName { .. } | StoreError::Nested { .. } => crate::ErrorCode::InvalidArgument,
        }
    }
}

/// How often a store without a change feed is polled by
/// [`Store::watch`]: the most a change waits before a watcher sees it.
pub const POLL_EVERY: Duration = Duration::from_millis(100);

/// What [`Store::scan`] hands each page to: the page's names and their
/// values (`None` for one deleted in between); an error stops the scan.
pub type PageVisitor<'a> = dyn FnMut(Vec<String>, Vec<Option<Vec<u8>>>) -> Result<(), StoreError> + 'a;

/// A key-value store with atomic, durable single-object writes.
///
/// `put` must be atomic (a reader sees the old or the new value, never a
/// mix) and durable when it returns: the authority's crash safety rests on
/// that alone.
pub trait Store: Send + Sync + 'static {
    /// The object, if present.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Creates or replaces the object atomically.
    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// Removes the object; absent is not an error.
    fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// Names of the objects under `prefix` (which ends with `/`), sorted.
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError>;
    /// Refuses ([`StoreError::Nested`]) a store whose name lies inside
    /// another keyfence store, or that holds one: when `creating` (an
    /// authority's `init`), anywhere below it; else where the authority
    /// would meet it (at its top and among its sealed copies), so that
    /// opening stays cheap in a store of many envelopes. The default
    /// (stores with no names around them, such as [`MemoryStore`]) finds
    /// nothing.
    ///
    /// # Errors
    /// [`StoreError::Nested`]; what listing the store can fail with.
    fn check_nesting(&self, creating: bool) -> Result<(), StoreError> {
        let _ = creating;
        Ok(())
    }

    /// Takes the store's writer lock, waiting up to `wait` for another
    /// writer to finish. An authority holds it from re-reading its state to
    /// committing the change, so two processes (or two handles) on one store
    /// never write from stale state; readers never take it. Released when
    /// the returned guard is dropped, or when the holding process dies.
    ///
    /// # Errors
    /// [`StoreError::Locked`] after `wait`; [`StoreError::Io`].
    fn lock(&self, wait: Duration) -> Result<StoreLock, StoreError>;

    /// Whether [`Store::lock`] keeps every other writer out until it is
    /// released (true by default: a file lock, a mutex). A store whose lock
    /// holds nothing ([`EtcdStore`](super::EtcdStore)) says false, and an
    /// authority's long operations then take the fence in
    /// `authority/fence` instead, so that two of them never interleave.
    /// A wrapper must answer as the store it wraps.
    fn lock_is_exclusive(&self) -> bool {
        true
    }

    /// Forgets the store's history: the earlier values and the deleted
    /// objects a reader could still ask for by revision. etcd keeps them
    /// until a compaction, so after a revocation the old envelopes and
    /// sealed copies stay readable (`etcdctl get --rev OLD`) to whoever can
    /// read the store, the revoked machine included. Whether there was a
    /// history to forget; the default (a store that keeps none) does
    /// nothing.
    ///
    /// # Errors
    /// The store's, when it cannot compact.
    fn compact(&self) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// The object and the [`Stamp`] of the version read, for a later
    /// [`Store::commit`] to check that it has not changed. By default the
    /// stamp is a digest of the value, which is right for any store whose
    /// writers are serialised by [`Store::lock`].
    ///
    /// # Errors
    /// As [`Store::get`].
    fn get_stamped(&self, key: &str) -> Result<Option<(Vec<u8>, Stamp)>, StoreError> {
        Ok(self.get(key)?.map(|v| {
            let stamp = Stamp::of_value(&v);
            (v, stamp)
        }))
    }

    /// Applies `batch` if every object it expects is still as read. A
    /// replicated store does it as one atomic transaction (all or nothing,
    /// [`StoreError::Conflict`] when an expectation fails). The default
    /// checks the expectations and then applies the writes one by one in
    /// their order: right for a store whose writers hold [`Store::lock`],
    /// where the order of the writes is what makes a crash midway safe.
    ///
    /// # Errors
    /// [`StoreError::Conflict`]; [`StoreError::TooLarge`]; the errors of
    /// the writes.
    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        for (key, expected) in &batch.expect {
            let now = self.get_stamped(key)?.map(|(_, s)| s);
            if now != *expected {
                return Err(StoreError::Conflict { key: key.clone() });
            }
        }
        for op in &batch.ops {
            match op {
                Op::Put(k, v) => self.put(k, v)?,
                Op::Delete(k) => self.delete(k)?,
            }
        }
        Ok(())
    }

    /// The objects `keys` names, in order (`None` for an absent one): for a
    /// caller that reads many, such as a policy-key rotation reading every
    /// envelope. By default one [`Store::get`] each; a replicated store
    /// answers many in one request ([`EtcdStore`](super::EtcdStore): up to
    /// 128 a transaction).
    ///
    /// # Errors
    /// As [`Store::get`].
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    /// Every object under `prefix` (which ends with `/`), in name order,
    /// handed to `each` a page at a time (at most `page` names, with their
    /// values; `None` for one deleted in between): for a caller that
    /// reads a whole prefix, such as a revocation re-wrapping every
    /// envelope, without holding it all. Pages reflect the store as each
    /// is read, not one snapshot. By default a listing, then
    /// [`Store::get_many`] per page; [`EtcdStore`](super::EtcdStore) reads
    /// names and values together, one range request a page, with no
    /// listing first.
    ///
    /// # Errors
    /// As [`Store::list`] and [`Store::get_many`]; `each`'s own, which
    /// stops the scan.
    fn scan(&self, prefix: &str, page: usize, each: &mut PageVisitor<'_>) -> Result<(), StoreError> {
        for names in self.list(prefix)?.chunks(page.max(1)) {
            each(names.to_vec(), self.get_many(names)?)?;
        }
        Ok(())
    }

    /// Watches the objects under `prefix` (which ends with `/`) for
    /// changes after revision `after`: 0 for "from now", or the revision
    /// of an event an earlier watch on this store delivered, to resume
    /// where it stopped. Events come in revision order, each once; when
    /// the changes since `after` cannot be told (etcd compacted them, or
    /// the store keeps no history) the watch begins with
    /// [`WatchEvent::Compacted`] and the watcher reads the prefix again.
    ///
    /// By default the store is polled every [`POLL_EVERY`]: a listing of
    /// the prefix and a digest of each value, so a store whose values are
    /// large should override it ([`FileStore`] compares file metadata,
    /// [`EtcdStore`](super::EtcdStore) follows etcd's watch stream).
    ///
    /// # Errors
    /// [`StoreError::InvalidKey`] for a prefix that is not a store key;
    /// the errors of the first listing.
    fn watch(self: Arc<Self>, prefix: &str, after: i64) -> Result<Watch, StoreError> {
        check_key(prefix.trim_end_matches('/'))?;
        let p = prefix.to_owned();
        watch::poll(prefix, POLL_EVERY, after != 0, move || {
            let mut snap = watch::Snapshot::new();
            for key in self.list(&p)? {
                if let Some((value, _)) = self.get_stamped(&key)? {
                    snap.insert(key, digest(&value));
                }
            }
            Ok(snap)
        })
    }
}

/// Which version of an object was read: a store's revision, or a digest of
/// the value for stores without revisions. Compared by [`Store::commit`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stamp(StampKind);

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum StampKind {
    Revision(i64),
    Digest([u8; 32]),
}

impl Stamp {
    /// The stamp of a store with revisions (etcd's `mod_revision`).
    pub fn revision(rev: i64) -> Self {
        Stamp(StampKind::Revision(rev))
    }

    /// The stamp of a value in a store without revisions: its BLAKE2b-256.
    pub fn of_value(value: &[u8]) -> Self {
        Stamp(StampKind::Digest(digest(value)))
    }

    /// The revision, for a stamp made by [`Stamp::revision`].
    pub fn as_revision(&self) -> Option<i64> {
        match self.0 {
            StampKind::Revision(r) => Some(r),
            StampKind::Digest(_) => None,
        }
    }
}

impl std::fmt::Debug for Stamp {
    // A digest of a value may be of a secret (the authority state): only
    // its first bytes, which tell versions apart in a message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            StampKind::Revision(r) => write!(f, "Stamp(revision {r})"),
            StampKind::Digest(d) => write!(f, "Stamp(digest {:02x}{:02x}{:02x}{:02x}…)", d[0], d[1], d[2], d[3]),
        }
    }
}

/// BLAKE2b-256 of a value: its stamp in a store without revisions, its
/// fingerprint in a polled watch.
fn digest(value: &[u8]) -> [u8; 32] {
    let h = blake2b_simd::Params::new().hash_length(32).personal(b"keyfence-stamp").hash(value);
    let mut d = [0u8; 32];
    d.copy_from_slice(h.as_bytes());
    d
}

/// One write of a [`Batch`].
#[derive(Clone, PartialEq, Eq)]
pub enum Op {
    /// Create or replace the object.
    Put(String, Vec<u8>),
    /// Remove the object (absent is not an error).
    Delete(String),
}

impl Op {
    /// The object written.
    pub fn key(&self) -> &str {
        match self {
            Op::Put(k, _) | Op::Delete(k) => k,
        }
    }
}

impl std::fmt::Debug for Op {
    // Values hold sealed keys and the authority's state: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Put(k, v) => write!(f, "Put({k:?}, {} bytes)", v.len()),
            Op::Delete(k) => write!(f, "Delete({k:?})"),
        }
    }
}

/// Writes to apply together, if the objects read are still as read
/// ([`Store::commit`]). One write per object: a later write of an object
/// replaces the earlier one in its place (a replicated store's transaction
/// refuses two writes of one key, and the order of first writes is the
/// crash-safety order of a store without transactions).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Objects and the stamp each had when read (`None`: absent).
    pub expect: Vec<(String, Option<Stamp>)>,
    /// The writes, in order.
    pub ops: Vec<Op>,
}

impl Batch {
    /// Adds a write, replacing an earlier write of the same object in its
    /// place.
    pub fn push(&mut self, op: Op) {
        match self.ops.iter_mut().find(|o| o.key() == op.key()) {
            Some(earlier) => *earlier = op,
            None => self.ops.push(op),
        }
    }

    /// Bytes of keys and values, to check against a store's request limit.
    pub fn size(&self) -> usize {
        let ops: usize = self.ops.iter().map(|o| o.key().len() + if let Op::Put(_, v) = o { v.len() } else { 0 }).sum();
        ops + self.expect.iter().map(|(k, _)| k.len() + 8).sum::<usize>()
    }
}

/// The writer lock of a store, held until dropped.
pub struct StoreLock {
    _held: Box<dyn Send>,
}

impl StoreLock {
    /// A guard that releases the lock when `held` is dropped: for
    /// implementations of [`Store::lock`].
    pub fn new(held: impl Send + 'static) -> Self {
        StoreLock { _held: Box::new(held) }
    }
}

impl std::fmt::Debug for StoreLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreLock")
    }
}

/// How long [`FileStore`] and [`MemoryStore`] sleep between attempts.
const LOCK_POLL: Duration = Duration::from_millis(5);

pub(crate) fn check_key(key: &str) -> Result<(), StoreError> {
    let ok = !key.is_empty()
        && key.split('/').all(|p| !p.is_empty() && p != "." && p != "..")
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidKey(key.to_owned()))
    }
}

/// Objects as files under a directory. Writes go to a temporary file that
/// is synced and renamed over the target, then the directory is synced, so
/// a crash leaves either the old object or the new one. Directories it
/// creates are made durable in their parents before anything is put in
/// them, and deletions are synced too: once `put` or `delete` returns, a
/// power cut cannot undo it (`docs/wrapping.md`, "Durability").
#[derive(Clone)]
pub struct FileStore {
    root: PathBuf,
    sync: Syncer,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore").field("root", &self.root).finish_non_exhaustive()
    }
}

/// Called with every file or directory [`FileStore`] is about to `fsync`:
/// lets the unit tests see (and fail) each sync.
type SyncHook = Arc<dyn Fn(&Path) -> std::io::Result<()> + Send + Sync>;

/// How [`FileStore`] makes a file or directory durable.
#[derive(Clone, Default)]
struct Syncer {
    hook: Option<SyncHook>,
}

impl Syncer {
    fn file(&self, path: &Path, file: &fs::File) -> std::io::Result<()> {
        if let Some(h) = &self.hook {
            h(path)?;
        }
        file.sync_all()
    }

    /// A directory's entries (a rename, a new child, a removal) are durable
    /// only once the directory itself is synced.
    fn dir(&self, dir: &Path) -> std::io::Result<()> {
        if let Some(h) = &self.hook {
            h(dir)?;
        }
        fs::File::open(dir)?.sync_all()
    }

    /// Creates `dir` and any missing ancestors up to (not including)
    /// `stop`, syncing the parent of each so the new entries survive a
    /// power cut. A directory another process is creating at the same
    /// moment is synced here too: that process may die before it does.
    fn create_dirs(&self, stop: &Path, dir: &Path) -> std::io::Result<()> {
        if dir == stop || dir.is_dir() {
            return Ok(());
        }
        // A bare relative name (`store`) has the empty path as its parent,
        // which names no directory: its parent is the current one.
        let parent = match dir.parent() {
            Some(p) if p.as_os_str().is_empty() => Path::new("."),
            Some(p) => p,
            None => stop,
        };
        self.create_dirs(stop, parent)?;
        // Owner-only whatever the umask: the store holds the authority's
        // master keys, and a directory others can write is one they can
        // plant links in.
        let mut builder = fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        match builder.create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(e),
        }
        self.dir(parent)
    }
}

impl FileStore {
    /// Each object under `prefix` and a digest of its inode, size and
    /// modification time (what a poll compares).
    fn fingerprints(&self, prefix: &str) -> Result<watch::Snapshot, StoreError> {
        let mut snap = watch::Snapshot::new();
        for key in self.list(prefix)? {
            let meta = match fs::metadata(self.path(&key)?) {
                Ok(m) => m,
                // Deleted since the listing: absent from this snapshot.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(&key)(e)),
            };
            let mut id = Vec::with_capacity(40);
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                id.extend_from_slice(&meta.dev().to_le_bytes());
                id.extend_from_slice(&meta.ino().to_le_bytes());
                id.extend_from_slice(&meta.ctime().to_le_bytes());
                id.extend_from_slice(&meta.ctime_nsec().to_le_bytes());
            }
            id.extend_from_slice(&meta.len().to_le_bytes());
            let modified = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
            id.extend_from_slice(&modified.as_nanos().to_le_bytes());
            snap.insert(key, digest(&id));
        }
        Ok(snap)
    }
    /// Opens (creating if needed) a store rooted at `root`. Directories it
    /// creates (the root, its missing parents, the folders inside) are
    /// mode 700; an existing root keeps its mode.
    ///
    /// # Errors
    /// [`StoreError::Io`] if the directory cannot be created.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        Self::open_with(root.into(), Syncer::default())
    }

    fn open_with(root: PathBuf, sync: Syncer) -> Result<Self, StoreError> {
        let err = |source| StoreError::Io { key: root.display().to_string(), source };
        if !root.is_dir() {
            // The new root must survive a power cut as well as what goes in it.
            let top = root.ancestors().find(|a| a.is_dir()).unwrap_or(Path::new("/")).to_path_buf();
            sync.create_dirs(&top, &root).map_err(err)?;
        }
        Ok(Self { root, sync })
    }

    /// The directory this store lives in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        check_key(key)?;
        Ok(self.root.join(key))
    }
}

fn io(key: &str) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { key: key.to_owned(), source }
}

/// The object whose presence makes a prefix a keyfence store (the
/// authority writes it first at `init`; every machine's copy has it).
pub(crate) const STORE_MARK: &str = "public/generations";
/// The names a store's directory holds at its top.
const STORE_TOP: [&str; 5] = ["authority", "public", "sealed", "envelopes", ".lock"];
/// Entries an `init` looks through for a store below at most: a directory
/// with more is no place to create a store in.
const NESTING_WALK: usize = 100_000;

impl FileStore {
    /// A directory below `dir` (or `dir` itself unless `skip_self`) that
    /// holds a store's mark, looking at `budget` entries at most (an error
    /// past it).
    fn store_below(&self, dir: &Path, skip_self: bool, budget: &mut usize) -> Result<Option<PathBuf>, StoreError> {
        if !skip_self && dir.join(STORE_MARK).is_file() {
            return Ok(Some(dir.to_path_buf()));
        }
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::Io { key: dir.display().to_string(), source: e }),
        };
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::Io { key: dir.display().to_string(), source: e })?;
            *budget = budget.checked_sub(1).ok_or_else(|| StoreError::Io {
                key: self.root.display().to_string(),
                source: std::io::Error::other(format!(
                    "holds more than {NESTING_WALK} entries: create a store in a new or empty directory"
                )),
            })?;
            // Never through a link: what it leads to is not in this store.
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if let Some(found) = self.store_below(&entry.path(), false, budget)? {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }
}

impl Store for FileStore {
    fn check_nesting(&self, creating: bool) -> Result<(), StoreError> {
        let name = self.root.display().to_string();
        let abs = std::path::absolute(&self.root).unwrap_or_else(|_| self.root.clone());
        for outer in abs.ancestors().skip(1) {
            if outer.join(STORE_MARK).is_file() {
                return Err(StoreError::Nested { store: name, other: outer.display().to_string(), inside: true });
            }
        }
        let mut budget = NESTING_WALK;
        let inner = if creating {
            self.store_below(&self.root, true, &mut budget)?
        } else {
            // What the authority touches: its top (anything not its own
            // is looked through) and its sealed copies, which clean-up
            // deletes. Never the envelopes, which may be many.
            let mut found = self.store_below(&self.root.join("sealed"), true, &mut budget)?;
            if found.is_none() {
                if let Ok(entries) = fs::read_dir(&self.root) {
                    for entry in entries.flatten() {
                        let foreign = !STORE_TOP.iter().any(|t| entry.file_name() == *t);
                        if foreign && entry.file_type().is_ok_and(|t| t.is_dir()) {
                            found = self.store_below(&entry.path(), false, &mut budget)?;
                            if found.is_some() {
                                break;
                            }
                        }
                    }
                }
            }
            found
        };
        match inner {
            Some(inner) => Err(StoreError::Nested { store: name, other: inner.display().to_string(), inside: false }),
            None => Ok(()),
        }
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match fs::read(self.path(key)?) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(key)(e)),
        }
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        self.sync.create_dirs(&self.root, &dir).map_err(io(key))?;
        let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), rand_core::RngCore::next_u64(&mut rand_core::OsRng)));
        let mut opts = fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let result = (|| {
            let mut f = opts.open(&tmp)?;
            f.write_all(value)?;
            self.sync.file(&tmp, &f)?;
            fs::rename(&tmp, &path)?;
            self.sync.dir(&dir)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map_err(io(key))
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key)?;
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io(key)(e)),
        }
        // A removal not yet synced comes back after a power cut; a sealed
        // copy of a retired generation must not.
        self.sync.dir(path.parent().unwrap_or(&self.root)).map_err(io(key))
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let base = prefix.trim_end_matches('/');
        check_key(base)?;
        let mut out = Vec::new();
        let mut stack = vec![(self.root.join(base), base.to_owned())];
        while let Some((dir, name)) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(&name)(e)),
            };
            for e in entries {
                let e = e.map_err(io(&name))?;
                let file = e.file_name().to_string_lossy().into_owned();
                if file.starts_with(".tmp-") {
                    continue;
                }
                let child = format!("{name}/{file}");
                if e.file_type().map_err(io(&child))?.is_dir() {
                    stack.push((e.path(), child));
                } else {
                    out.push(child);
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Polls every [`POLL_EVERY`], comparing each file's inode, size and
    /// modification time, never its contents: a poll of `sealed/` costs a
    /// directory walk however large the objects. Polling rather than
    /// inotify, because a file store shared by several machines lives on a
    /// network file system (NFS, a replicated volume) where inotify sees
    /// only this machine's writes, and because inotify needs one watch per
    /// directory, against a per-user limit; a write is a rename of a new
    /// file, so its inode changes even within one tick of the clock.
    fn watch(self: Arc<Self>, prefix: &str, after: i64) -> Result<Watch, StoreError> {
        let p = prefix.to_owned();
        check_key(p.trim_end_matches('/'))?;
        watch::poll(prefix, POLL_EVERY, after != 0, move || self.fingerprints(&p))
    }

    /// An advisory lock (`flock`) on `ROOT/.lock`, which also records the
    /// holder's pid for the error another writer gets. The kernel releases
    /// it when the holder exits, so a crashed writer never wedges the store.
    ///
    /// The file is opened without following a link and never truncated
    /// before the lock is held: a `.lock` planted as a symbolic link is an
    /// error, and one planted as a hard link to another file is locked but
    /// not written, so neither reaches the file it points at.
    fn lock(&self, wait: Duration) -> Result<StoreLock, StoreError> {
        const NAME: &str = ".lock";
        let path = self.root.join(NAME);
        let mut opts = fs::OpenOptions::new();
        opts.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600).custom_flags(libc::O_NOFOLLOW);
        }
        let file = opts.open(&path).map_err(io(NAME))?;
        let meta = file.metadata().map_err(io(NAME))?;
        if !meta.is_file() {
            return Err(io(NAME)(std::io::Error::other("not a regular file")));
        }
        let start = Instant::now();
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(fs::TryLockError::WouldBlock) if start.elapsed() < wait => std::thread::sleep(LOCK_POLL),
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(StoreError::Locked { holder: lock_holder(&file), waited: start.elapsed() });
                }
                Err(fs::TryLockError::Error(e)) => return Err(io(NAME)(e)),
            }
        }
        record_holder(&file, &meta);
        Ok(StoreLock::new(file))
    }
}

/// Writes this process's pid into the lock file it holds, best effort:
/// the pid only improves another writer's message. Only into a file whose
/// one name is `.lock` (a single link): a hard link planted there would
/// make the write land in another file.
#[cfg(unix)]
fn record_holder(file: &fs::File, meta: &fs::Metadata) {
    use std::os::unix::fs::{FileExt, MetadataExt};
    if meta.nlink() != 1 {
        return;
    }
    let pid = format!("{}\n", std::process::id());
    let _ = file.write_all_at(pid.as_bytes(), 0).and_then(|()| file.set_len(pid.len() as u64));
}

#[cfg(not(unix))]
fn record_holder(_: &fs::File, _: &fs::Metadata) {}

/// The pid the lock's holder recorded, if it did (a whole line).
#[cfg(unix)]
fn lock_holder(file: &fs::File) -> Option<u32> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 24];
    let n = file.read_at(&mut buf, 0).ok()?;
    let line = buf[..n].split(|b| *b == b'\n').next().filter(|_| buf[..n].contains(&b'\n'))?;
    std::str::from_utf8(line).ok()?.parse().ok()
}

#[cfg(not(unix))]
fn lock_holder(_: &fs::File) -> Option<u32> {
    None
}

/// An in-memory store, for tests and for embedding behind another layer.
#[derive(Debug, Default)]
pub struct MemoryStore {
    map: Mutex<BTreeMap<String, Vec<u8>>>,
    writer: Arc<(Mutex<bool>, Condvar)>,
}

/// Releases a [`MemoryStore`]'s writer lock.
struct MemoryLock(Arc<(Mutex<bool>, Condvar)>);

impl Drop for MemoryLock {
    fn drop(&mut self) {
        *self.0 .0.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.0 .1.notify_one();
    }
}

impl Store for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(key)?;
        Ok(self.map.lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned())
    }
    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        check_key(key)?;
        self.map.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_owned(), value.to_vec());
        Ok(())
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        check_key(key)?;
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
        Ok(())
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        Ok(map.keys().filter(|k| k.starts_with(prefix)).cloned().collect())
    }
    fn lock(&self, wait: Duration) -> Result<StoreLock, StoreError> {
        let (flag, cv) = &*self.writer;
        let start = Instant::now();
        let mut held = flag.lock().unwrap_or_else(|e| e.into_inner());
        while *held {
            let left = wait.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(StoreError::Locked { holder: Some(std::process::id()), waited: start.elapsed() });
            }
            held = cv.wait_timeout(held, left.min(LOCK_POLL * 20)).unwrap_or_else(|e| e.into_inner()).0;
        }
        *held = true;
        Ok(StoreLock::new(MemoryLock(self.writer.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_writer_at_a_time_and_the_second_is_told_who_holds_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let file = FileStore::open(dir.path()).unwrap();
        let memory = MemoryStore::default();
        for store in [&file as &dyn Store, &memory] {
            let held = store.lock(Duration::from_secs(1)).unwrap();
            let err = store.lock(Duration::from_millis(30)).unwrap_err();
            assert!(matches!(err, StoreError::Locked { holder: Some(p), .. } if p == std::process::id()), "{err}");
            assert_eq!(err.code(), crate::ErrorCode::StoreLocked);
            assert!(err.to_string().contains(&format!("pid {}", std::process::id())), "{err}");
            // A writer waiting for the lock gets it once it is released.
            std::thread::scope(|t| {
                let waiter = t.spawn(|| store.lock(Duration::from_secs(5)).map(drop));
                std::thread::sleep(Duration::from_millis(20));
                drop(held);
                waiter.join().unwrap().unwrap();
            });
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_lock_file_planted_as_a_symbolic_link_is_refused_and_its_target_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        fs::write(&victim, b"the victim's data").unwrap();
        let root = tmp.path().join("store");
        let s = FileStore::open(&root).unwrap();
        std::os::unix::fs::symlink(&victim, root.join(".lock")).unwrap();
        let err = s.lock(Duration::from_millis(50)).unwrap_err();
        assert!(matches!(&err, StoreError::Io { key, .. } if key == ".lock"), "{err}");
        assert_eq!(fs::read(&victim).unwrap(), b"the victim's data");
        // A dangling link (a victim not yet there) is not created either.
        let absent = tmp.path().join("absent");
        fs::remove_file(root.join(".lock")).unwrap();
        std::os::unix::fs::symlink(&absent, root.join(".lock")).unwrap();
        assert!(s.lock(Duration::from_millis(50)).is_err());
        assert!(!absent.exists(), "the lock created the link's target");
    }

    #[cfg(unix)]
    #[test]
    fn a_lock_file_planted_as_a_hard_link_is_locked_but_never_written() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("store");
        let s = FileStore::open(&root).unwrap();
        let victim = tmp.path().join("victim");
        fs::write(&victim, b"the victim's data").unwrap();
        fs::hard_link(&victim, root.join(".lock")).unwrap();
        let held = s.lock(Duration::from_millis(50)).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"the victim's data");
        // Still one writer at a time, only without the pid.
        let err = s.lock(Duration::from_millis(20)).unwrap_err();
        assert!(matches!(err, StoreError::Locked { holder: None, .. }), "{err}");
        drop(held);
        assert_eq!(fs::read(&victim).unwrap(), b"the victim's data");
    }

    #[cfg(unix)]
    #[test]
    fn the_store_and_every_folder_it_creates_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        // The root, a missing parent of it, and folders made by `put`.
        let root = tmp.path().join("parent/store");
        let s = FileStore::open(&root).unwrap();
        s.put("authority/state", b"x").unwrap();
        s.put("sealed/ab/1/2", b"y").unwrap();
        for d in ["parent", "parent/store", "parent/store/authority", "parent/store/sealed", "parent/store/sealed/ab/1"] {
            let mode = fs::metadata(tmp.path().join(d)).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{d}: {mode:o}");
        }
        let mode = fs::metadata(root.join("authority/state")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    /// A file store whose every `fsync` is recorded, and fails when
    /// `fail` names its path.
    fn recording(dir: &Path, fail: Option<PathBuf>) -> (FileStore, Arc<Mutex<Vec<PathBuf>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let hook: SyncHook = Arc::new(move |p: &Path| {
            log.lock().unwrap().push(p.to_path_buf());
            if fail.as_deref() == Some(p) {
                return Err(std::io::Error::other("injected fsync failure"));
            }
            Ok(())
        });
        (FileStore::open_with(dir.to_path_buf(), Syncer { hook: Some(hook) }).unwrap(), seen)
    }

    #[test]
    fn new_directories_their_parents_renames_and_deletions_are_synced() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("new-parent");
        let root = base.join("new-root");
        let (s, seen) = recording(&root, None);
        // The new root is recorded in its parent, and that new parent in its own.
        assert_eq!(seen.lock().unwrap().drain(..).collect::<Vec<_>>(), vec![tmp.path().to_path_buf(), base.clone()]);

        s.put("sealed/ab/1/2", b"x").unwrap();
        let synced: Vec<PathBuf> = seen.lock().unwrap().drain(..).collect();
        // Every directory that gained an entry (a new child directory, the
        // renamed object) is synced, and the object's data before its rename.
        for d in ["", "sealed", "sealed/ab", "sealed/ab/1"] {
            let d = if d.is_empty() { root.clone() } else { root.join(d) };
            assert!(synced.contains(&d), "{} not synced: {synced:?}", d.display());
        }
        let tmp = synced.iter().position(|p| p.file_name().unwrap().to_string_lossy().starts_with(".tmp-"));
        let dir = synced.iter().rposition(|p| *p == root.join("sealed/ab/1"));
        assert!(tmp.is_some() && tmp < dir, "the data is synced before the rename is: {synced:?}");

        // A second object in an existing directory syncs only that directory.
        s.put("sealed/ab/1/3", b"y").unwrap();
        let synced: Vec<PathBuf> = seen.lock().unwrap().drain(..).collect();
        assert_eq!(synced.len(), 2, "{synced:?}");
        assert_eq!(synced[1], root.join("sealed/ab/1"));

        s.delete("sealed/ab/1/3").unwrap();
        assert_eq!(seen.lock().unwrap().drain(..).collect::<Vec<_>>(), vec![root.join("sealed/ab/1")]);
        s.delete("sealed/ab/1/3").unwrap();
        assert!(seen.lock().unwrap().is_empty(), "nothing to sync for an absent object");
    }

    #[test]
    fn a_failed_sync_is_an_error_and_leaves_no_temporary_file() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        for (fail, what) in [(root.join("envelopes"), "directory after the rename"), (root.clone(), "new directory's parent")] {
            let (s, _) = recording(&root, Some(fail.clone()));
            let _ = fs::remove_dir_all(root.join("envelopes"));
            let err = s.put("envelopes/aa", b"x").unwrap_err();
            assert!(matches!(&err, StoreError::Io { key, .. } if key == "envelopes/aa"), "{what}: {err}");
            assert_eq!(err.code(), crate::ErrorCode::StoreIo);
            assert!(err.to_string().contains("injected fsync failure"), "{err}");
            let left: Vec<_> = fs::read_dir(root.join("envelopes"))
                .map(|d| d.map(|e| e.unwrap().file_name()).filter(|n| n.to_string_lossy().starts_with(".tmp-")).collect())
                .unwrap_or_default();
            assert!(left.is_empty(), "{what}: {left:?}");
        }
        // And a failed sync after a deletion.
        let (s, _) = recording(&root, Some(root.join("envelopes")));
        fs::write(root.join("envelopes/bb"), b"x").unwrap();
        assert!(matches!(s.delete("envelopes/bb"), Err(StoreError::Io { .. })));
    }

    #[test]
    fn file_store_round_trips_and_refuses_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::open(dir.path()).unwrap();
        s.put("sealed/ab/1/2", b"x").unwrap();
        s.put("sealed/ab/1/3", b"y").unwrap();
        s.put("sealed/ab/1/2", b"z").unwrap();
        assert_eq!(s.get("sealed/ab/1/2").unwrap().as_deref(), Some(&b"z"[..]));
        assert_eq!(s.list("sealed/").unwrap(), vec!["sealed/ab/1/2", "sealed/ab/1/3"]);
        s.delete("sealed/ab/1/3").unwrap();
        s.delete("sealed/ab/1/3").unwrap();
        assert_eq!(s.get("sealed/ab/1/3").unwrap(), None);
        for bad in ["../x", "a//b", "/a", "a/./b", "a b", ""] {
            assert!(matches!(s.put(bad, b""), Err(StoreError::InvalidKey(_))), "{bad}");
        }
    }
}
