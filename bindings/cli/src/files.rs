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

    /// Whether the output goes to standard output: `-`, or a path that
    /// leads there (`/dev/stdout`, a link to `/proc/self/fd/1`). A command
    /// then prints what it did on standard error, not into its output.
    pub fn is_std(&self) -> bool {
        is_std(&self.path) || matches!(resolve(&self.path), Ok(Target::Stdout))
    }

    fn check(&self) -> Result<()> {
        if is_std(&self.path) {
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
    /// Where the bytes go depends on what the path names ([`resolve`],
    /// docs/security.md "Files keyfence writes"):
    /// - nothing yet, or a regular file: a new temporary file created in
    ///   the target's folder, synced and renamed over the target, and the
    ///   folder synced. So an existing file's looser mode is never kept, a
    ///   crash leaves the old file or the new one, never half, and a
    ///   completed write survives a power cut;
    /// - a device, a FIFO or a socket: opened and written in place, never
    ///   replaced (`--out /dev/null` must not turn the machine's
    ///   `/dev/null` into a file);
    /// - this process's own standard output or error (`/dev/stdout`,
    ///   `/proc/self/fd/2`): written to the descriptor, as `cat` writes;
    /// - a symbolic link is followed to what it names when its owner may be
    ///   trusted, by the rule of the kernel's `protected_symlinks`: a link
    ///   in a sticky, world-writable folder (`/tmp`) is followed only when
    ///   it belongs to this user or to the folder's owner. Another's link
    ///   there is refused (exit 2): a link planted in a shared folder
    ///   cannot redirect the output.
    pub fn write_private(&self, data: &[u8]) -> Result<()> {
        self.write(data, Some(0o600))
    }

    fn write(&self, data: &[u8], mode: Option<u32>) -> Result<()> {
        if is_std(&self.path) {
            return stdout_bytes(data);
        }
        // Again: the command's work took time, and an input may have been
        // moved into place meanwhile.
        self.check()?;
        let target = resolve(&self.path)?;
        let written = match &target {
            Target::Replace(p) => replace(p, data, mode),
            Target::Stdout => return stdout_bytes(data),
            Target::Stderr => {
                let mut e = io::stderr().lock();
                e.write_all(data).and_then(|()| e.flush())
            }
            Target::InPlace(p) => write_in_place(p, data),
        };
        written.with_context(|| format!("cannot write {}", self.path.display()))
    }
}

/// Where an output's bytes go: what its path names once trusted links are
/// followed.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// A regular file, or nothing yet: replaced through a new file renamed
    /// over this path (the link-free path of what the output names).
    Replace(PathBuf),
    /// A device, a FIFO, a socket, or a descriptor of another process:
    /// written in place.
    InPlace(PathBuf),
    /// This process's standard output.
    Stdout,
    /// This process's standard error.
    Stderr,
}

/// Links followed before a path is refused: the kernel's own limit.
const MAX_LINKS: usize = 40;

/// Follows `path` component by component to what it names, as the kernel
/// would, but checking every symbolic link on the way with the rule of
/// `protected_symlinks` (which many machines leave off): a link in a
/// sticky, world-writable folder is followed only when it belongs to this
/// user or to the folder's owner. Another user's link there is refused
/// with exit 2 and the rule. A descriptor link under `/proc/PID/fd` (what
/// `/dev/stdout` and `/dev/fd/N` lead to) names an open file, not a path:
/// it ends the walk.
fn resolve(path: &Path) -> Result<Target> {
    use std::collections::VecDeque;
    use std::ffi::OsString;
    use std::path::Component;

    let mut todo: VecDeque<OsString> = VecDeque::new();
    let mut cur = PathBuf::new();
    let push = |todo: &mut VecDeque<OsString>, cur: &mut PathBuf, p: &Path, front: bool| {
        let mut parts = Vec::new();
        for c in p.components() {
            match c {
                Component::RootDir => {
                    *cur = PathBuf::from("/");
                    // A link to an absolute path restarts from the root:
                    // what was left of it still follows.
                    parts.clear();
                }
                Component::Prefix(_) | Component::CurDir => {}
                Component::ParentDir => parts.push(OsString::from("..")),
                Component::Normal(n) => parts.push(n.to_os_string()),
            }
        }
        if front {
            for part in parts.into_iter().rev() {
                todo.push_front(part);
            }
        } else {
            todo.extend(parts);
        }
    };
    push(&mut todo, &mut cur, path, false);
    if cur.as_os_str().is_empty() {
        cur = PathBuf::from(".");
    }
    let mut links = 0;
    while let Some(part) = todo.pop_front() {
        let last = todo.is_empty();
        if part == ".." {
            // `cur` holds no link, so `..` is its real parent.
            cur.push("..");
            continue;
        }
        let next = cur.join(&part);
        let meta = match fs::symlink_metadata(&next) {
            Ok(m) => m,
            // A missing last component is a file to create; a missing
            // folder is left to the write to report.
            Err(_) if last => return Ok(Target::Replace(next)),
            Err(_) => {
                cur = next;
                continue;
            }
        };
        if meta.file_type().is_symlink() {
            if let Some(fd) = descriptor_link(&cur, &part) {
                if !last {
                    return Err(exit::input(format!("{}: {} is a descriptor, not a folder", path.display(), next.display())));
                }
                return Ok(match fd {
                    Descriptor::Stdout => Target::Stdout,
                    Descriptor::Stderr => Target::Stderr,
                    Descriptor::Other => Target::InPlace(next),
                });
            }
            trusted_link(path, &cur, &next, &meta)?;
            links += 1;
            if links > MAX_LINKS {
                return Err(exit::input(format!("{}: more than {MAX_LINKS} symbolic links to follow", path.display())));
            }
            let to = fs::read_link(&next).map_err(|e| exit::input(format!("cannot read the link {}: {e}", next.display())))?;
            push(&mut todo, &mut cur, &to, true);
            continue;
        }
        if last {
            let ft = meta.file_type();
            if ft.is_dir() {
                return Err(exit::input(format!("{} is a folder; name a file to write", path.display())));
            }
            return Ok(if ft.is_file() { Target::Replace(next) } else { Target::InPlace(next) });
        }
        cur = next;
    }
    // The path named no file at all (`.`, `/`, `a/..`).
    Err(exit::input(format!("{} is a folder; name a file to write", path.display())))
}

/// What a link in a descriptor folder (`/proc/PID/fd`,
/// `/proc/PID/task/TID/fd`) stands for.
#[derive(Debug, PartialEq, Eq)]
enum Descriptor {
    Stdout,
    Stderr,
    /// Another descriptor, or another process's.
    Other,
}

/// Whether `dir/name` is a descriptor link: `dir` (free of links) is a
/// process's `fd` folder under `/proc`, and `name` a number.
fn descriptor_link(dir: &Path, name: &std::ffi::OsStr) -> Option<Descriptor> {
    let n: u32 = name.to_str()?.parse().ok()?;
    let dir = dir.canonicalize().ok()?;
    let parts: Vec<&str> = dir.iter().map(|c| c.to_str().unwrap_or("")).collect();
    let pid = match parts.as_slice() {
        ["/", "proc", pid, "fd"] | ["/", "proc", pid, "task", _, "fd"] => pid.parse::<u32>().ok()?,
        _ => return None,
    };
    Some(match (pid == std::process::id(), n) {
        (true, 1) => Descriptor::Stdout,
        (true, 2) => Descriptor::Stderr,
        _ => Descriptor::Other,
    })
}

/// The rule of the kernel's `protected_symlinks`: a link is followed
/// unless it sits in a sticky, world-writable folder and belongs neither
/// to this user nor to the folder's owner. `output` is the path given, for
/// the message.
#[cfg(unix)]
fn trusted_link(output: &Path, dir: &Path, link: &Path, meta: &fs::Metadata) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(dmeta) = fs::metadata(dir) else { return Ok(()) };
    let shared = dmeta.mode() & 0o1002 == 0o1002;
    // SAFETY: geteuid has no preconditions, cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    if !shared || meta.uid() == me || meta.uid() == dmeta.uid() {
        return Ok(());
    }
    Err(exit::input(format!(
        "refusing to write {} through the symbolic link {}: the link belongs to user {} in the shared folder {} \
         (sticky and writable by all), so anyone could have planted it; keyfence follows such a link only when it \
         belongs to you or to the folder's owner (the kernel's protected_symlinks rule)",
        output.display(),
        link.display(),
        meta.uid(),
        dir.display()
    )))
}

#[cfg(not(unix))]
fn trusted_link(_: &Path, _: &Path, _: &Path, _: &fs::Metadata) -> Result<()> {
    Ok(())
}

/// Writes `data` into the existing non-regular file at `path` (a device, a
/// FIFO, another process's descriptor), opened without creating it. A
/// socket is connected to, as a stream. Opening a FIFO waits for its
/// reader, as `cat > fifo` does.
fn write_in_place(path: &Path, data: &[u8]) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
        if fs::metadata(path)?.file_type().is_socket() {
            let mut s = std::os::unix::net::UnixStream::connect(path)?;
            return s.write_all(data).and_then(|()| s.flush());
        }
        // A descriptor link is the kernel's to follow; any other link was
        // followed by `resolve`, so one found here now was put there since.
        let follow = path.parent().and_then(|d| descriptor_link(d, path.file_name()?)).is_some();
        let mut o = fs::OpenOptions::new();
        o.write(true).custom_flags(libc::O_NOCTTY | if follow { 0 } else { libc::O_NOFOLLOW });
        let mut f = o.open(path)?;
        // What was opened is what was written into, as `cat` would: a
        // regular file behind another process's descriptor starts empty.
        if f.metadata()?.file_type().is_file() {
            f.set_len(0)?;
        }
        f.write_all(data)?;
        f.flush()
    }
    #[cfg(not(unix))]
    {
        fs::OpenOptions::new().write(true).open(path)?.write_all(data)
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

/// A store inside the store `name` that nobody else uses, for a benchmark's
/// scratch objects: `name/bench-PID-RANDOM` (before an etcd name's
/// options).
pub fn scratch_store(name: &str) -> String {
    let tag = format!("bench-{}-{:016x}", std::process::id(), rand_core::RngCore::next_u64(&mut rand_core::OsRng));
    match name.split_once('?') {
        Some((main, opts)) => format!("{}/{tag}?{opts}", main.trim_end_matches('/')),
        None => format!("{}/{tag}", name.trim_end_matches('/')),
    }
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

    /// The spellings people type, resolved without writing anything: the
    /// machine's own devices must never become `Target::Replace`.
    #[test]
    fn the_machines_devices_and_descriptors_resolve_to_in_place_writes() {
        assert_eq!(resolve(Path::new("/dev/stdout")).unwrap(), Target::Stdout);
        assert_eq!(resolve(Path::new("/dev/fd/1")).unwrap(), Target::Stdout);
        assert_eq!(resolve(Path::new("/proc/self/fd/1")).unwrap(), Target::Stdout);
        assert_eq!(resolve(Path::new("/dev/stderr")).unwrap(), Target::Stderr);
        assert_eq!(resolve(Path::new("/proc/thread-self/fd/2")).unwrap(), Target::Stderr);
        assert_eq!(resolve(Path::new("/dev/null")).unwrap(), Target::InPlace(PathBuf::from("/dev/null")));
        assert_eq!(resolve(Path::new("/dev/./null")).unwrap(), Target::InPlace(PathBuf::from("/dev/null")));
        assert!(matches!(resolve(Path::new("/proc/self/fd/0")).unwrap(), Target::InPlace(_)));
        assert!(resolve(Path::new("/")).is_err());
        assert!(resolve(Path::new("/dev")).is_err());
    }

    #[test]
    fn links_are_followed_to_the_file_they_name_relative_to_their_folder() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        fs::create_dir(d.join("a")).unwrap();
        fs::create_dir(d.join("b")).unwrap();
        std::os::unix::fs::symlink("../b/file", d.join("a/link")).unwrap();
        std::os::unix::fs::symlink("a", d.join("dirlink")).unwrap();
        // A link to a file not yet there: the file is made where it points.
        assert_eq!(resolve(&d.join("dirlink/link")).unwrap(), Target::Replace(d.join("a/../b/file")));
        fs::write(d.join("b/file"), b"x").unwrap();
        assert_eq!(resolve(&d.join("a/link")).unwrap(), Target::Replace(d.join("a/../b/file")));
        // A loop ends with an error, not a hang.
        std::os::unix::fs::symlink("loop2", d.join("loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", d.join("loop2")).unwrap();
        assert!(resolve(&d.join("loop1")).is_err());
        // A plain new name in a plain folder.
        assert_eq!(resolve(&d.join("new")).unwrap(), Target::Replace(d.join("new")));
    }
}
