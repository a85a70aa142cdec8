//! Threads keyfence starts in its host's process, with the host's signals
//! blocked in them.
//!
//! A process-directed signal (SIGHUP, SIGCHLD, SIGTERM, ...) goes to any
//! thread that does not block it. nginx's master blocks them in its own
//! thread and waits for them in `sigsuspend()`: with keyfence's threads in
//! the master (the OpenSSL provider's engine) and not blocking them, a
//! SIGHUP sent while the master's thread blocked it ran nginx's handler on
//! a keyfence thread, the master's `sigsuspend()` was never woken, and
//! `nginx -s reload` did nothing until some later signal (about once per
//! 150 reloads). So every thread keyfence starts blocks every signal a
//! host may wait for: it is created while the starting thread blocks them
//! (a thread starts with its creator's mask), and the creator's mask is
//! put back at once. The faults a thread causes itself (SIGSEGV, SIGBUS,
//! SIGFPE, SIGILL, SIGTRAP, SIGSYS) stay unblocked: blocking them would
//! only turn a crash into a hang.
#![allow(unsafe_code)]

use std::io;
use std::thread::{Builder, JoinHandle, Scope, ScopedJoinHandle};

/// The creating thread's signal mask, blocked while a thread starts and
/// restored when dropped.
struct Blocked(libc::sigset_t);

impl Blocked {
    fn now() -> Option<Blocked> {
        // SAFETY: both sets are live locals the calls write; sigfillset and
        // sigdelset only write `all`; pthread_sigmask reads `all` and writes
        // the old mask into `old`.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            for sync in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS] {
                libc::sigdelset(&mut all, sync);
            }
            (libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) == 0).then_some(Blocked(old))
        }
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `now`, a live set the call
        // only reads.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// [`Builder`]'s spawns, the new thread blocking the host's signals.
pub(crate) trait QuietSpawn {
    /// `spawn`, the new thread blocking the host's signals.
    ///
    /// # Errors
    /// The operating system's refusal to start a thread.
    fn spawn_quiet<F, T>(self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static;

    /// `spawn_scoped`, the new thread blocking the host's signals.
    ///
    /// # Errors
    /// The operating system's refusal to start a thread.
    fn spawn_scoped_quiet<'scope, 'env, F, T>(self, scope: &'scope Scope<'scope, 'env>, f: F) -> io::Result<ScopedJoinHandle<'scope, T>>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope;
}

impl QuietSpawn for Builder {
    fn spawn_quiet<F, T>(self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        spawn(self, f)
    }

    fn spawn_scoped_quiet<'scope, 'env, F, T>(self, scope: &'scope Scope<'scope, 'env>, f: F) -> io::Result<ScopedJoinHandle<'scope, T>>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        spawn_scoped(self, scope, f)
    }
}

/// `builder.spawn(f)`, the new thread blocking the host's signals.
///
/// # Errors
/// The operating system's refusal to start a thread.
pub(crate) fn spawn<F, T>(builder: Builder, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let _blocked = Blocked::now();
    builder.spawn(f)
}

/// `builder.spawn_scoped(scope, f)`, the new thread blocking the host's
/// signals.
///
/// # Errors
/// The operating system's refusal to start a thread.
pub(crate) fn spawn_scoped<'scope, 'env, F, T>(
    builder: Builder, scope: &'scope Scope<'scope, 'env>, f: F,
) -> io::Result<ScopedJoinHandle<'scope, T>>
where
    F: FnOnce() -> T + Send + 'scope,
    T: Send + 'scope,
{
    let _blocked = Blocked::now();
    builder.spawn_scoped(scope, f)
}

#[cfg(test)]
mod tests {
    /// A thread started here blocks SIGHUP and SIGCHLD; its creator's mask
    /// is as it was.
    #[test]
    fn threads_start_with_the_hosts_signals_blocked() {
        fn blocked(sig: i32) -> bool {
            // SAFETY: `set` is a live local the calls write and read.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
                libc::sigismember(&set, sig) == 1
            }
        }
        let before = blocked(libc::SIGHUP);
        let inside = super::spawn(std::thread::Builder::new(), || (blocked(libc::SIGHUP), blocked(libc::SIGCHLD), blocked(libc::SIGSEGV)))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(inside, (true, true, false));
        assert_eq!(blocked(libc::SIGHUP), before, "the creator's mask is put back");
    }
}
