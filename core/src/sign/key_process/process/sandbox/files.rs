//! The key process's files: a Landlock ruleset (Linux 5.13 and later),
//! through the Landlock maintainers' own crate.
//!
//! What it may do, and nothing else:
//! - read (files and folders) everywhere but `/proc`: the key files,
//!   machine keys and envelopes its client names arrive after it starts,
//!   so they cannot be listed beforehand, and reading is no way out (the
//!   ways out, writing and the network, are closed);
//! - read its own `/proc/PID` and a few system-wide files under `/proc`
//!   that the C library reads; no other process's `/proc/PID` (which
//!   Landlock also refuses through its ptrace rule: a sandboxed process
//!   may not trace, nor open the `mem` of, a process outside its sandbox);
//! - read, write, create and remove in a token module's own folders
//!   ([`token_dirs`]), and nowhere else;
//! - no TCP `bind` or `connect` (ABI 4, Linux 6.7), no abstract Unix
//!   socket outside its sandbox and no signal to another process (ABI 6,
//!   Linux 6.12): the system call filter closes these already; Landlock
//!   closes them again below io_uring and any call the filter lets by.
//!
//! The rights are those of ABI 6, whatever newer ABI the kernel has, so
//! the rules mean the same on every kernel; an older kernel enforces the
//! part it knows ([`Confined::abi`]), and one without Landlock none, which
//! the system call filter then makes up for by refusing every opening for
//! writing (`syscalls.rs`).

use std::io;
use std::path::{Path, PathBuf};

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, CompatLevel, Compatible, LandlockStatus, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope, ABI,
};

/// How far the file rules hold on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Confined {
    /// The Landlock ABI the kernel enforced (1 or more).
    pub(crate) abi: i32,
}

/// The files under `/proc` that are not another process's: what glibc
/// and the standard library read (memory overcommit, CPU and memory
/// counts, file systems).
const PROC_SHARED: &[&str] = &["/proc/sys", "/proc/cpuinfo", "/proc/meminfo", "/proc/filesystems", "/proc/stat"];

/// Restricts this thread and the threads it starts later (Landlock does
/// not reach threads already running: call it while the process has one).
/// `writable`: the folders it may write (a token module's).
///
/// # Errors
/// A kernel without Landlock (or with it turned off) is `Ok(None)`; an
/// error is a rule that could not be made or a refusal to restrict.
pub(crate) fn confine(writable: &[PathBuf]) -> io::Result<Option<Confined>> {
    let abi = ABI::V6;
    let fail = |what: &str, e: &dyn std::fmt::Display| io::Error::other(format!("landlock {what}: {e}"));
    let mut readable: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir("/")? {
        let entry = entry?;
        if entry.file_name() != "proc" {
            readable.push(entry.path());
        }
    }
    // Its own /proc/PID (through /proc/self, which the rule resolves).
    readable.push(PathBuf::from("/proc/self"));
    readable.extend(PROC_SHARED.iter().map(PathBuf::from));
    // A path that is gone, or that this user cannot reach, is no rule.
    let exists = |p: &PathBuf| Path::new(p).exists();
    let readable: Vec<&PathBuf> = readable.iter().filter(|p| exists(p)).collect();
    let writable: Vec<&PathBuf> = writable.iter().filter(|p| p.is_dir()).collect();
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| fail("file rights", &e))?
        .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
        .map_err(|e| fail("network rights", &e))?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(|e| fail("scopes", &e))?
        .create()
        .map_err(|e| fail("ruleset", &e))?
        .add_rules(path_beneath_rules(readable, AccessFs::ReadFile | AccessFs::ReadDir))
        .map_err(|e| fail("read rules", &e))?
        .add_rules(path_beneath_rules(writable, AccessFs::from_all(abi)))
        .map_err(|e| fail("token folder rules", &e))?
        .restrict_self()
        .map_err(|e| fail("restrict", &e))?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Ok(None);
    }
    let abi = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => effective_abi as i32,
        _ => 1,
    };
    Ok(Some(Confined { abi: abi.min(ABI::V6 as i32) }))
}

/// The folders a token module in the key process may write: those named
/// in `KEYFENCE_PKCS11_TOKEN_DIRS` (separated by `:`), and SoftHSM2's
/// token folder (`directories.tokendir` in `SOFTHSM2_CONF`, else
/// `/etc/softhsm/softhsm2.conf`), read at start because the rules are
/// fixed before the first key is loaded.
pub(crate) fn token_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("KEYFENCE_PKCS11_TOKEN_DIRS")
        .map(|v| std::env::split_paths(&v).filter(|p| p.is_absolute()).collect())
        .unwrap_or_default();
    let conf = std::env::var_os("SOFTHSM2_CONF")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/etc/softhsm/softhsm2.conf"));
    if let Ok(text) = std::fs::read_to_string(&conf) {
        dirs.extend(softhsm_token_dir(&text));
    }
    dirs
}

/// SoftHSM2's `directories.tokendir = PATH` line, if its configuration
/// has one.
fn softhsm_token_dir(conf: &str) -> Option<PathBuf> {
    conf.lines().find_map(|line| {
        let line = line.trim();
        let (key, value) = line.split_once('=')?;
        (key.trim() == "directories.tokendir" && !line.starts_with('#')).then(|| PathBuf::from(value.trim())).filter(|p| p.is_absolute())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softhsm_configurations_name_their_token_folder() {
        let conf = "# a comment\ndirectories.tokendir = /var/lib/softhsm/tokens/\nobjectstore.backend = file\n";
        assert_eq!(softhsm_token_dir(conf), Some(PathBuf::from("/var/lib/softhsm/tokens/")));
        assert_eq!(softhsm_token_dir("#directories.tokendir = /x\n"), None);
        assert_eq!(softhsm_token_dir("directories.tokendir = relative\n"), None);
    }
}
