//! The key process's sandbox: what code running inside it (a bug in a
//! parser, a hostile PKCS#11 module) can still do once it runs.
//!
//! An allow-list, as OpenSSH's privilege-separated child and Chromium's
//! renderers have, not a list of what is forbidden: io_uring, another
//! process's `/proc/PID/mem` and an inherited socket each walked around
//! the deny list this replaced. Three layers, set up in this order before
//! the first request is read:
//!
//! 1. `sys::close_inherited`: nothing but the socket pair on standard input
//!    survives from the parent (its listening or connected sockets, its
//!    files); standard output and error become `/dev/null`.
//! 2. [`files`]: Landlock confines the file system (read everywhere but
//!    other processes' `/proc`, write only a token module's folder) and,
//!    on newer kernels, TCP, abstract sockets and signals.
//! 3. [`syscalls`]: a seccomp allow-list on every thread.
//!
//! `docs/security.md` ("The key process") says what this closes and what
//! it cannot; the tests run attacker code inside it
//! (`bindings/cli/tests/sandbox_escape.rs`).

mod files;
mod syscalls;

use std::io;

/// What [`install`] achieved.
#[derive(Debug)]
pub(crate) struct Installed {
    /// The system call filter is installed.
    pub(crate) syscalls: bool,
    /// Landlock confines the files (and, from ABI 4, TCP), with the ABI
    /// the kernel enforces.
    pub(crate) files_abi: Option<i32>,
    /// Another thread was running when the sandbox was set up (a library
    /// preloaded into the key process can start one), so Landlock, which
    /// binds only the calling thread and those it starts, was not applied.
    pub(crate) other_thread: bool,
}

/// Installs Landlock (while this is the process's only thread: Landlock
/// binds the calling thread and those it starts) and then the system call
/// filter (on every thread). A layer the kernel lacks (or, for Landlock,
/// another thread running) is left out here and said in the hello's
/// flags: the client then refuses the key process, unless its user
/// allowed a partial sandbox (`KeyProcessConfig::unsafe_partial_sandbox`),
/// and without Landlock the filter refuses every opening for writing.
pub(crate) fn install() -> Installed {
    // Test builds can leave Landlock out, to test the filter's fallback on
    // a kernel that has Landlock.
    #[cfg(feature = "testing")]
    if std::env::var_os("KEYFENCE_TEST_SANDBOX_WITHOUT_LANDLOCK").is_some() {
        return Installed { syscalls: syscalls::install(false).is_ok(), files_abi: None, other_thread: false };
    }
    let alone = only_thread();
    let files_abi = match alone.as_ref().map_err(|_| ()).and_then(|()| files::confine(&files::token_dirs()).map_err(|_| ())) {
        Ok(c) => c.map(|c| c.abi),
        Err(()) => None,
    };
    let syscalls = syscalls::install(files_abi.is_some()).is_ok();
    Installed { syscalls, files_abi, other_thread: alone.is_err() }
}

/// Landlock restricts the calling thread and its later threads only: with
/// another thread running, that one would stay free.
fn only_thread() -> io::Result<()> {
    let tasks = std::fs::read_dir("/proc/self/task")?.count();
    if tasks == 1 {
        Ok(())
    } else {
        Err(io::Error::other(format!("{tasks} threads are running, and Landlock would bind only this one")))
    }
}
