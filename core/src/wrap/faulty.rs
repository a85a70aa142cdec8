//! A [`Store`] that fails on purpose, for crash-safety tests (the
//! `testing` feature): it passes everything to another store and, from a
//! chosen write on, refuses every write, as if the process had died just
//! before it. Reads keep working so the test can look at what is left.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::store::{Store, StoreError, StoreLock};

/// A store wrapper that counts writes (`put`, `delete`) and fails the
/// `n`-th one (counting from 0) and every one after it.
///
/// ```
/// use std::sync::Arc;
/// use keyfence::wrap::{Authority, FaultyStore, MemoryStore, Store};
///
/// let inner: Arc<dyn Store> = Arc::new(MemoryStore::default());
/// let faulty = Arc::new(FaultyStore::failing_from(inner.clone(), 1));
/// // `init` publishes the generation list, then commits the state: the
/// // commit fails, so there is no authority yet...
/// assert!(Authority::init(faulty.clone()).is_err());
/// assert_eq!(faulty.writes(), 2);
/// assert!(Authority::open(inner.clone()).is_err());
/// // ...and running it again succeeds.
/// faulty.heal();
/// assert!(Authority::init(faulty).is_ok());
/// assert!(Authority::open(inner).is_ok());
/// ```
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    fail_from: AtomicUsize,
    writes: AtomicUsize,
}

impl std::fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultyStore").field("fail_from", &self.fail_from.load(Ordering::SeqCst)).field("writes", &self.writes()).finish()
    }
}

impl FaultyStore {
    /// A wrapper that never fails: to count an operation's writes.
    pub fn counting(inner: Arc<dyn Store>) -> Self {
        Self::failing_from(inner, usize::MAX)
    }

    /// A wrapper whose write number `n` (from 0) and every later one fail
    /// with [`StoreError::Io`].
    pub fn failing_from(inner: Arc<dyn Store>, n: usize) -> Self {
        Self { inner, fail_from: AtomicUsize::new(n), writes: AtomicUsize::new(0) }
    }

    /// Lets every later write through: the "restarted process" of a test
    /// that re-runs an operation on the same handle.
    pub fn heal(&self) {
        self.fail_from.store(usize::MAX, Ordering::SeqCst);
    }

    /// Writes attempted so far, failed ones included.
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    fn write(&self, key: &str) -> Result<(), StoreError> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        if n >= self.fail_from.load(Ordering::SeqCst) {
            return Err(StoreError::Io { key: key.to_owned(), source: std::io::Error::other(format!("injected failure at write {n}")) });
        }
        Ok(())
    }
}

impl Store for FaultyStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(key)
    }
    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.write(key)?;
        self.inner.put(key, value)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.write(key)?;
        self.inner.delete(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list(prefix)
    }
    fn lock(&self, wait: Duration) -> Result<StoreLock, StoreError> {
        self.inner.lock(wait)
    }
    fn lock_is_exclusive(&self) -> bool {
        self.inner.lock_is_exclusive()
    }
}
