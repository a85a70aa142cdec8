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
use std::sync::Mutex;

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
}

impl StoreError {
    /// The stable code of this error (`docs/errors.md`).
    pub fn code(&self) -> crate::ErrorCode {
        match self {
            StoreError::Io { .. } => crate::ErrorCode::StoreIo,
            StoreError::InvalidKey(_) => crate::ErrorCode::InvalidStoreKey,
        }
    }
}

/// A key-value store with atomic, durable single-object writes.
///
/// `put` must be atomic (a reader sees the old or the new value, never a
/// mix) and durable when it returns: the authority's crash safety rests on
/// that alone.
pub trait Store: Send + Sync {
    /// The object, if present.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Creates or replaces the object atomically.
    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// Removes the object; absent is not an error.
    fn delete(&self, key: &str) -> Result<(), StoreError>;
    /// Names of the objects under `prefix` (which ends with `/`), sorted.
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError>;
}

fn check_key(key: &str) -> Result<(), StoreError> {
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
/// a crash leaves either the old object or the new one.
#[derive(Debug, Clone)]
pub struct FileStore {
    root: PathBuf,
}

impl FileStore {
    /// Opens (creating if needed) a store rooted at `root`.
    ///
    /// # Errors
    /// [`StoreError::Io`] if the directory cannot be created.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(|source| StoreError::Io { key: root.display().to_string(), source })?;
        Ok(Self { root })
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

impl Store for FileStore {
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
        fs::create_dir_all(&dir).map_err(io(key))?;
        let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), rand_core::RngCore::next_u64(&mut rand_core::OsRng)));
        let mut opts = fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let result = (|| {
            let mut f = opts.open(&tmp)?;
            f.write_all(value)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            // The rename is durable only once the directory is.
            fs::File::open(&dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map_err(io(key))
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        match fs::remove_file(self.path(key)?) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(key)(e)),
        }
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
}

/// An in-memory store, for tests and for embedding behind another layer.
#[derive(Debug, Default)]
pub struct MemoryStore {
    map: Mutex<BTreeMap<String, Vec<u8>>>,
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_store_round_trips_and_refuses_escapes() {
        let dir = std::env::temp_dir().join(format!("keyfence-store-{}", std::process::id()));
        let s = FileStore::open(&dir).unwrap();
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
        fs::remove_dir_all(&dir).unwrap();
    }
}
