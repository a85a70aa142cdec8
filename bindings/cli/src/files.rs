//! Inputs, outputs and standard output: `-` for standard input or output,
//! outputs that never land on an input or a master secret key, secrets
//! written owner-readable only and read into buffers wiped on drop, and a
//! reader that closes standard output early ending the command quietly
//! instead of a panic.
//!
//! Every file a command writes goes through [`Output`]: its check (the same
//! file as an input? a master secret key?) cannot be skipped by a command
//! that forgets to call it.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use zeroize::Zeroizing;

use crate::exit::{self, Exit};

/// Whether `p` is `-`, standard input or output.
pub fn is_std(p: &Path) -> bool {
    p.as_os_str() == "-"
}

/// The contents of `p`, or all of standard input for `-`. A file that
/// cannot be read is bad input (exit 2): the caller named it. For public
/// inputs; secrets go through [`read_secret`].
pub fn read(p: &Path) -> Result<Vec<u8>> {
    if is_std(p) {
        let mut v = Vec::new();
        io::stdin().lock().read_to_end(&mut v).map_err(|e| exit::input(format!("cannot read standard input: {e}")))?;
        return Ok(v);
    }
    fs::read(p).map_err(|e| exit::input(format!("cannot read {}: {e}", p.display())))
}

/// [`read`] for a secret (a master secret key, an attribute or machine
/// key, a secret to wrap): the bytes live in a buffer wiped when dropped.
pub fn read_secret(p: &Path) -> Result<Zeroizing<Vec<u8>>> {
    let read = if is_std(p) {
        read_wiped(&mut io::stdin().lock(), 64 * 1024)
    } else {
        fs::File::open(p).and_then(|mut f| {
            let len = f.metadata()?.len();
            read_wiped(&mut f, usize::try_from(len).unwrap_or(0).saturating_add(1))
        })
    };
    read.map_err(|e| {
        let what = if is_std(p) { "standard input".to_string() } else { p.display().to_string() };
        exit::input(format!("cannot read {what}: {e}"))
    })
}

/// Reads `r` to its end into a buffer wiped on drop. A buffer that fills
/// up is copied into a bigger one and wiped, never reallocated in place: a
/// growing `Vec` leaves unwiped copies of what it held in the memory it
/// outgrew. `hint` (a file's length plus one) makes that rare.
fn read_wiped(r: &mut impl Read, hint: usize) -> io::Result<Zeroizing<Vec<u8>>> {
    let mut v = Zeroizing::new(Vec::with_capacity(hint.max(1)));
    let mut chunk = Zeroizing::new([0u8; 8192]);
    loop {
        let n = match r.read(&mut chunk[..]) {
            Ok(0) => return Ok(v),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if v.len() + n > v.capacity() {
            let mut bigger = Zeroizing::new(Vec::with_capacity((v.len() + n).max(2 * v.capacity())));
            bigger.extend_from_slice(&v);
            v = bigger;
        }
        v.extend_from_slice(&chunk[..n]);
    }
}

/// Writes to standard output; a closed pipe becomes [`Exit::Quiet`].
pub fn stdout_bytes(data: &[u8]) -> Result<()> {
    let mut o = io::stdout().lock();
    o.write_all(data).and_then(|()| o.flush()).map_err(stdout_error)
}

/// One line of standard output (what `outln!` calls).
pub fn line(args: std::fmt::Arguments<'_>) -> Result<()> {
    let mut o = io::stdout().lock();
    o.write_fmt(args).and_then(|()| o.write_all(b"\n")).map_err(stdout_error)
}

fn stdout_error(e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        Exit::Quiet.into()
    } else {
        anyhow::Error::new(e).context("cannot write to standard output")
    }
}

/// A file a command is about to write (or `-`, standard output), with the
/// inputs it must not land on.
///
/// [`Output::new`] refuses (exit 2, naming both paths) an output that is
/// the same file as one of the inputs, whatever the spelling: `./a/../a/f`,
/// a symbolic link and a hard link all name the one file, so files are
/// compared by device and inode. It also refuses to replace a file that
/// holds a master secret key, recognised by its contents: a CP-ABE master
/// secret key (CIRCL's encoding) or a wrap authority's state (`KFA` and a
/// version digit, docs/wrapping.md). A master key cannot be made again;
/// every key issued from it dies with it. Only a command with a `--force`
/// that says so passes [`Output::replacing_master_key`].
///
/// The check runs when the command starts (before any work) and again just
/// before the write.
pub struct Output {
    path: PathBuf,
    inputs: Vec<PathBuf>,
    force: bool,
}

impl Output {
    /// Checks `path` against `inputs` (`-` entries are ignored).
    pub fn new(path: &Path, inputs: &[&Path]) -> Result<Self> {
        let out = Output { path: path.to_path_buf(), inputs: inputs.iter().map(|p| p.to_path_buf()).collect(), force: false };
        out.check()?;
        Ok(out)
    }

    /// The same check, except that replacing a master secret key is
    /// allowed (`abe setup --force`).
    pub fn replacing_master_key(path: &Path, inputs: &[&Path]) -> Result<Self> {
        let out = Output { path: path.to_path_buf(), inputs: inputs.iter().map(|p| p.to_path_buf()).collect(), force: true };
        out.check()?;
        Ok(out)
    }

    /// The path given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the output is standard output.
    pub fn is_std(&self) -> bool {
        is_std(&self.path)
    }

    fn check(&self) -> Result<()> {
        if self.is_std() {
            return Ok(());
        }
        // Follows links: a link to an input is that input. A path that does
        // not exist (or a dangling link) names no file to protect; one that
        // cannot be looked at is left to the write to report.
        let Ok(meta) = fs::metadata(&self.path) else { return Ok(()) };
        let master = if meta.is_file() { master_key_kind(&self.path) } else { None };
        for input in self.inputs.iter().filter(|i| !is_std(i)) {
            if let Ok(im) = fs::metadata(input) {
                if same_file(&meta, &im) {
                    return Err(exit::input(format!(
                        "refusing to write {}: it is the same file as the input {}{}; choose another output",
                        self.path.display(),
                        input.display(),
                        master.map_or(String::new(), |kind| format!(", which holds {kind}"))
                    )));
                }
            }
        }
        if let (Some(kind), false) = (master, self.force) {
            let inputs: Vec<String> = self.inputs.iter().map(|i| i.display().to_string()).collect();
            return Err(exit::input(format!(
                "refusing to replace {}: it holds {kind}, which cannot be made again (every key issued from it would be orphaned); choose another output{}",
                self.path.display(),
                if inputs.is_empty() { String::new() } else { format!(" (inputs: {})", inputs.join(", ")) }
            )));
        }
        Ok(())
    }

    /// Writes a public output (`-`: standard output) the way
    /// [`Output::write_private`] does, with the mode the umask allows.
    pub fn write_public(&self, data: &[u8]) -> Result<()> {
        self.write(data, None)
    }

    /// Writes secrets owner-readable only (mode 600; `-`: standard output,
    /// where protecting them is the caller's business).
    ///
    /// The bytes go to a new temporary file created in the target's
    /// directory, which is synced and renamed over the target, and the
    /// directory is synced. So an existing file's looser mode is never
    /// kept, a symbolic link at the target is replaced rather than followed
    /// (a link planted there cannot redirect the output), a crash leaves
    /// the old file or the new one, never half, and a completed write
    /// survives a power cut.
    pub fn write_private(&self, data: &[u8]) -> Result<()> {
        self.write(data, Some(0o600))
    }

    fn write(&self, data: &[u8], mode: Option<u32>) -> Result<()> {
        if self.is_std() {
            return stdout_bytes(data);
        }
        // Again: the command's work took time, and an input may have been
        // moved into place meanwhile.
        self.check()?;
        replace(&self.path, data, mode).with_context(|| format!("cannot write {}", self.path.display()))
    }
}

#[cfg(unix)]
fn same_file(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_file(_: &fs::Metadata, _: &fs::Metadata) -> bool {
    false
}

/// Longest file read to see whether it is a CP-ABE master secret key:
/// CIRCL's encoding is about 1 KiB (fixed matrices and a short PRF key).
const MSK_MAX: u64 = 64 * 1024;

/// What master secret key the file at `p` holds, if any, from its
/// contents. Read into a buffer wiped on drop: it may well be one.
fn master_key_kind(p: &Path) -> Option<&'static str> {
    let f = fs::File::open(p).ok()?;
    let mut head = Zeroizing::new(Vec::with_capacity(MSK_MAX as usize + 1));
    f.take(MSK_MAX + 1).read_to_end(&mut head).ok()?;
    // The authority state's magic: "KFA2" now, and any other version of it.
    if head.len() >= 4 && head.starts_with(b"KFA") && head[3].is_ascii_digit() {
        return Some("a wrap authority's state with its master secret keys");
    }
    if head.len() as u64 <= MSK_MAX && keyfence::abe::MasterSecretKey::from_bytes(&head).is_ok() {
        return Some("a CP-ABE master secret key");
    }
    None
}

/// Replaces `path` with `data` through a new temporary file in its
/// directory: created new (never an existing file, never through a link),
/// synced, renamed over `path`, and the directory synced.
fn replace(path: &Path, data: &[u8], mode: Option<u32>) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}-{:016x}", std::process::id(), rand_core::RngCore::next_u64(&mut rand_core::OsRng)));
    let mut o = fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    if let Some(mode) = mode {
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let result = (|| -> io::Result<()> {
        let mut f = o.open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    sync_dir(dir)
}

/// Makes a rename or a new entry in `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        fs::File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Creates `path`, which must not exist, with `data`, owner-readable only:
/// for files in the scratch directories of the benchmarks and the demo,
/// which are this process's own, but where a link or a file that is already
/// there is never written through.
pub fn create_new(path: &Path, data: &[u8]) -> Result<()> {
    let mut o = fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    (|| -> io::Result<()> {
        let mut f = o.open(path)?;
        f.write_all(data)?;
        f.sync_all()
    })()
    .with_context(|| format!("cannot create {}", path.display()))
}

/// A new private scratch directory (random name, created new, mode 700),
/// removed with everything in it when dropped.
pub fn scratch_dir(what: &str) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("keyfence-{what}-"))
        .tempdir()
        .with_context(|| format!("cannot create a scratch directory for {what}"))
}

/// Creates a directory for secrets (and any missing parents), mode 700
/// whatever the umask. An existing directory is left as it is.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    let mut b = fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir).with_context(|| format!("cannot create {}", dir.display()))
}

/// `println!` that ends the command quietly when the reader has gone.
macro_rules! outln {
    () => {
        outln!("")
    };
    ($($t:tt)*) => {
        if let Err(e) = $crate::files::line(format_args!($($t)*)) {
            return Err(e.into());
        }
    };
}
pub(crate) use outln;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_secret_reads_every_byte_across_chunk_and_hint_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 1, 8191, 8192, 8193, 100_000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let p = dir.path().join(format!("f{len}"));
            fs::write(&p, &data).unwrap();
            assert_eq!(&read_secret(&p).unwrap()[..], &data[..], "{len}");
            // A reader with no useful length hint grows by copying.
            assert_eq!(&read_wiped(&mut &data[..], 1).unwrap()[..], &data[..], "{len}");
        }
        assert!(read_secret(&dir.path().join("missing")).is_err());
    }
}
