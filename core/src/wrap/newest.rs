//! The newest signed lists a machine has accepted (the generation list
//! and the revocation list), kept across processes.
//!
//! A machine refuses a list that goes back on one it has accepted
//! ([`WrapError::Replayed`]), but a fresh process has accepted none: a
//! store writer could serve every process that starts (each CLI run, each
//! key process, each server restart) a list from before a revocation or a
//! retirement, which the authority did sign. So a machine can keep the
//! newest lists in a file ([`Machine::keep_newest_in`](super::Machine::keep_newest_in),
//! by default beside its key: [`newest_lists_beside`]) and start from
//! them; and a caller that carries lists itself (an agent, a client of a
//! key process) can require them as a floor
//! ([`Machine::require`](super::Machine::require)).
//!
//! The file holds only what the authority signed, so it is no secret and
//! cannot be forged: whoever can write it can at most delete it, which
//! loses the floor (as a fresh machine has none), never lowers it below
//! what the store proves.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::error::{codec, malformed, Result, WrapError};
use super::floor::is_newer_or_same;
use super::format::{reader, writer, NEWEST_MAGIC};
use super::generation_list::GenerationList;
use super::revocation::RevocationList;
use super::store::StoreError;

const O: &str = "newest lists";

/// The newest generation list and revocation list a machine has accepted,
/// as the authority signed them: what a process hands to the next one so
/// that it never accepts older lists ([`Machine::require`](super::Machine::require)).
///
/// ```
/// use std::sync::Arc;
/// use keyfence::wrap::{Authority, CacheConfig, Machine, MemoryStore, NewestLists, Store};
///
/// let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
/// let mut authority = Authority::init(store.clone())?;
/// let env = authority.wrap("region: EU", b"secret")?;
/// let key = authority.issue(&"region=EU".parse()?)?;
/// let first = Machine::new(key.clone(), store.clone(), CacheConfig::default());
/// first.open(env.to_bytes())?;
/// // A later process starts where this one left off.
/// let kept = NewestLists::from_bytes(&first.newest_lists().to_bytes())?;
/// let next = Machine::new(key, store, CacheConfig::default());
/// next.require(&kept)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct NewestLists {
    generations: Option<Vec<u8>>,
    revoked: Option<Vec<u8>>,
}

impl std::fmt::Debug for NewestLists {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewestLists")
            .field("generations", &self.generations.as_ref().map(Vec::len))
            .field("revoked", &self.revoked.as_ref().map(Vec::len))
            .finish()
    }
}

impl NewestLists {
    pub(crate) fn new(generations: Option<Vec<u8>>, revoked: Option<Vec<u8>>) -> Self {
        Self { generations, revoked }
    }

    /// The signed generation list, if one was accepted.
    pub fn generations(&self) -> Option<&[u8]> {
        self.generations.as_deref()
    }

    /// The signed revocation list, if one was accepted.
    pub fn revoked(&self) -> Option<&[u8]> {
        self.revoked.as_deref()
    }

    /// Whether it holds neither list.
    pub fn is_empty(&self) -> bool {
        self.generations.is_none() && self.revoked.is_none()
    }

    /// The encoding: `KFN2`, then each list behind a 32-bit length (0 for
    /// one not accepted). The lists are checked by whoever requires them,
    /// with the authority key its machine key carries.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = writer(NEWEST_MAGIC);
        // Lists are read from a store whose replies are capped far below 4 GiB.
        w.bytes32(self.generations.as_deref().unwrap_or_default()).bytes32(self.revoked.as_deref().unwrap_or_default());
        w.into_bytes().to_vec()
    }

    /// Decodes [`NewestLists::to_bytes`]; the signatures are checked when
    /// a machine requires the lists.
    ///
    /// # Errors
    /// [`WrapError::Malformed`] (`newest lists`) naming the field.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut r = reader(bytes, O, NEWEST_MAGIC)?;
        let some = |b: &[u8]| (!b.is_empty()).then(|| b.to_vec());
        let generations = some(r.bytes32("generation list").map_err(codec(O))?);
        let revoked = some(r.bytes32("revocation list").map_err(codec(O))?);
        r.finish().map_err(codec(O))?;
        Ok(Self { generations, revoked })
    }
}

/// Where a machine keeps its newest lists by default: beside its key,
/// `KEY.newest` (`machine.key` keeps `machine.key.newest`). `None` when
/// the key is not a regular file (standard input, a descriptor), which
/// has no place beside it.
pub fn newest_lists_beside(machine_key: &Path) -> Option<PathBuf> {
    let meta = fs::metadata(machine_key).ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut name = machine_key.file_name()?.to_os_string();
    name.push(".newest");
    Some(machine_key.with_file_name(name))
}

/// Reads the lists kept at `path`; `None` when there is no file.
///
/// # Errors
/// [`WrapError::Store`] (`STORE_IO`) if it cannot be read;
/// [`WrapError::Malformed`] if it does not decode (delete it to start
/// again from the store: the floor is lost, nothing else).
pub(crate) fn read(path: &Path) -> Result<Option<NewestLists>> {
    match fs::read(path) {
        Ok(b) => NewestLists::from_bytes(&b)
            .map(Some)
            .map_err(|e| malformed(O, format!("{}: {e} (delete the file to start again from the store)", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(WrapError::Store(StoreError::Io { key: path.display().to_string(), source: e })),
    }
}

/// Which list a [`Keeper`] records.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Generations,
    Revoked,
}

/// Writes the newest lists of one machine to its file as they are
/// accepted. Several processes of one machine (of one user) share the
/// file: each update is made under an advisory lock (`PATH.lock`, mode
/// 600, so no other user can hold it), merged with what the file holds (a
/// list only replaces one it does not go back on) and written by rename,
/// so the file only ever moves forward and is never torn.
pub(crate) struct Keeper {
    path: PathBuf,
    authority: [u8; 32],
    /// One update at a time in this process (the file lock is per open
    /// file description, and each update opens its own).
    busy: Mutex<()>,
}

impl Keeper {
    /// A keeper of the lists at `path`, after checking that it can keep
    /// them there: its folder exists and the lock file opens. What cannot
    /// be kept is said when a machine starts, not at its first update.
    ///
    /// # Errors
    /// [`WrapError::Store`] (`STORE_IO`) naming the file and why.
    pub(crate) fn new(path: PathBuf, authority: [u8; 32]) -> Result<Self> {
        let keeper = Self { path, authority, busy: Mutex::new(()) };
        open_lock(&keeper.lock_path()).map_err(|e| keeper.error(e))?;
        Ok(keeper)
    }

    fn lock_path(&self) -> PathBuf {
        let mut name = self.path.as_os_str().to_os_string();
        name.push(".lock");
        PathBuf::from(name)
    }

    fn error(&self, e: std::io::Error) -> WrapError {
        let source = std::io::Error::new(
            e.kind(),
            format!(
                "the newest lists cannot be kept there ({e}): a machine that cannot keep them would accept a store rolled back after its next restart; give it a folder it owns (an agent's --state-dir)"
            ),
        );
        WrapError::Store(StoreError::Io { key: self.path.display().to_string(), source })
    }

    /// Records `bytes` (a list of `kind`, already verified and accepted)
    /// as the newest, unless the file holds a newer one.
    ///
    /// # Errors
    /// [`WrapError::Store`] (`STORE_IO`) when the file cannot be locked
    /// (another process of this machine held it for more than a second)
    /// or written: never skipped in silence, since a floor that is not
    /// kept is no floor after a restart.
    pub(crate) fn record(&self, kind: Kind, bytes: &[u8]) -> Result<()> {
        let _busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        self.update(kind, bytes).map_err(|e| self.error(e))
    }

    fn update(&self, kind: Kind, bytes: &[u8]) -> std::io::Result<()> {
        let lock = open_lock(&self.lock_path())?;
        // Bounded: a process stopped while it holds the lock (a command
        // suspended at a terminal) must not stall opens for ever; it is an
        // error after that, not a skipped update.
        let start = std::time::Instant::now();
        loop {
            match lock.try_lock() {
                Ok(()) => break,
                Err(fs::TryLockError::WouldBlock) if start.elapsed() < LOCK_WAIT => std::thread::sleep(std::time::Duration::from_millis(5)),
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::WouldBlock,
                        format!("its lock {} was held by another process for more than {LOCK_WAIT:?}", self.lock_path().display()),
                    ))
                }
                Err(fs::TryLockError::Error(e)) => return Err(e),
            }
        }
        // A file that does not decode was no floor and is replaced; one
        // that cannot be read is left alone (rewriting it would drop the
        // other list's floor).
        let mut lists = match fs::read(&self.path) {
            Ok(b) => NewestLists::from_bytes(&b).unwrap_or_default(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => NewestLists::default(),
            Err(e) => return Err(e),
        };
        let slot = match kind {
            Kind::Generations => &mut lists.generations,
            Kind::Revoked => &mut lists.revoked,
        };
        let newer = |floor: &[u8]| match kind {
            Kind::Generations => is_newer_or_same::<GenerationList>(bytes, floor, &self.authority),
            Kind::Revoked => is_newer_or_same::<RevocationList>(bytes, floor, &self.authority),
        };
        if slot.as_deref() == Some(bytes) || slot.as_deref().is_some_and(|floor| !newer(floor)) {
            return Ok(());
        }
        *slot = Some(bytes.to_vec());
        write_replacing(&self.path, &lists.to_bytes())
    }
}

/// Records the lists a key process accepted (a client sent them, and the
/// key process opened an envelope with them) in the file at `path`, for
/// the machine whose authority is `authority`: the key process writes no
/// file, so its client keeps the floor it requires next time.
///
/// # Errors
/// As [`Keeper::record`].
#[cfg(feature = "sign")]
pub(crate) fn record_lists(path: &Path, authority: [u8; 32], generations: Option<&[u8]>, revoked: Option<&[u8]>) -> Result<()> {
    let keeper = Keeper::new(path.to_path_buf(), authority)?;
    if let Some(g) = generations {
        keeper.record(Kind::Generations, g)?;
    }
    if let Some(r) = revoked {
        keeper.record(Kind::Revoked, r)?;
    }
    Ok(())
}

/// How long an update waits for another process's update of the same file.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The lock file beside the lists, opened without following a link:
/// created with mode 600 when missing, so that no other user can open it
/// (an advisory lock needs only a descriptor, and a user who could open
/// it could hold it); an older one readable by others is made 600 when it
/// is this user's.
fn open_lock(path: &Path) -> std::io::Result<fs::File> {
    let mut read = fs::OpenOptions::new();
    read.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut read, libc::O_NOFOLLOW);
    let file = match read.open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut create = fs::OpenOptions::new();
            create.read(true).write(true).create(true).truncate(false);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                create.mode(0o600).custom_flags(libc::O_NOFOLLOW);
            }
            create.open(path)?
        }
        other => other?,
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // Tightening another user's file is refused (EPERM), and is theirs.
        if file.metadata()?.mode() & 0o077 != 0 {
            let _ = file.set_permissions(fs::Permissions::from_mode(0o600));
        }
    }
    Ok(file)
}

/// Writes `bytes` to a new file beside `path`, syncs it and renames it
/// over `path`, then syncs the folder: a crash leaves the old file or the
/// new one, never a torn one.
fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o644).custom_flags(libc::O_NOFOLLOW);
    }
    let result = (|| {
        let mut f = opts.open(&tmp)?;
        // Readable by every user whatever the umask: it is public, and the
        // key agent's user must read what a root command wrote.
        #[cfg(unix)]
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoding_reads_back_and_names_a_bad_field() {
        let l = NewestLists::new(Some(vec![1, 2, 3]), None);
        assert_eq!(NewestLists::from_bytes(&l.to_bytes()).unwrap(), l);
        assert!(NewestLists::from_bytes(&NewestLists::default().to_bytes()).unwrap().is_empty());
        let b = l.to_bytes();
        let e = NewestLists::from_bytes(&b[..b.len() - 1]).unwrap_err();
        assert!(e.to_string().contains("revocation list"), "{e}");
        assert!(NewestLists::from_bytes(b"KFE2").is_err());
    }
}
