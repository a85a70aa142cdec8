//! Inputs, outputs and standard output: `-` for standard input or output,
//! secrets written owner-readable only, and a reader that closes standard
//! output early ending the command quietly instead of a panic.

use std::fs;
use std::io::{self, Read, Write};
use std::path::Path;

use anyhow::{Context, Result};

use crate::exit::{self, Exit};

/// Whether `p` is `-`, standard input or output.
pub fn is_std(p: &Path) -> bool {
    p.as_os_str() == "-"
}

/// The contents of `p`, or all of standard input for `-`. A file that
/// cannot be read is bad input (exit 2): the caller named it.
pub fn read(p: &Path) -> Result<Vec<u8>> {
    if is_std(p) {
        let mut v = Vec::new();
        io::stdin().lock().read_to_end(&mut v).map_err(|e| exit::input(format!("cannot read standard input: {e}")))?;
        return Ok(v);
    }
    fs::read(p).map_err(|e| exit::input(format!("cannot read {}: {e}", p.display())))
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

/// Writes a public output (`-`: standard output).
pub fn write_public(p: &Path, data: &[u8]) -> Result<()> {
    if is_std(p) {
        return stdout_bytes(data);
    }
    fs::write(p, data).with_context(|| format!("cannot write {}", p.display()))
}

/// Writes secrets owner-readable only (mode 600; `-`: standard output,
/// where protecting them is the caller's business).
///
/// The bytes go to a new temporary file created with mode 600 in the
/// target's directory, which is synced and renamed over the target. So an
/// existing file's looser mode is never kept, a symbolic link at the target
/// is replaced rather than followed (a link planted there cannot redirect a
/// secret), and a crash leaves the old file or the new one, never half.
pub fn write_private(p: &Path, data: &[u8]) -> Result<()> {
    if is_std(p) {
        return stdout_bytes(data);
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}-{}", std::process::id(), rand_core::RngCore::next_u64(&mut rand_core::OsRng)));
    let mut o = fs::OpenOptions::new();
    // create_new: never opens an existing file or follows a link there.
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let result = (|| -> io::Result<()> {
        let mut f = o.open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, p)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", p.display()))
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
