//! The threads an engine part starts, and their end: every one is joined
//! when its owner is dropped, so that no thread of keyfence's runs after
//! the call that dropped the owner returns.
//!
//! Why it matters: a library that is unloaded (OpenSSL unloads its
//! providers at exit, and `libkeyfence` with them) while one of its
//! threads still runs, or is still starting, crashes the process in
//! unmapped code (issue 43: `openssl pkey` after a failed key load, 2 runs
//! in 200). Joining is the only end that is certain: a thread that only
//! said it was done still runs the standard library's exit path in this
//! library's code.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an owner's drop waits for its threads, in all. A thread runs
/// at most one operation past its owner's end (a signature, or a connect
/// bounded by its own timeout); a thread still running after this is let
/// go rather than hang the caller (a callback that blocks on a lock the
/// dropping thread holds would otherwise wait forever).
pub(crate) const JOIN_BOUND: Duration = Duration::from_secs(5);

/// The process an object was made in, to tell a forked child from its
/// parent: after `fork()` the child has the parent's memory (engines,
/// key-process connections, locks) but none of its threads, and a thread
/// that held a lock at the fork holds it forever in the child. An object
/// made before the fork must then neither be used nor ended there (ending
/// it could kill the parent's key process or shut its sockets down).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Origin(u32);

impl Origin {
    /// This process.
    pub(crate) fn here() -> Self {
        Origin(std::process::id())
    }

    /// Whether this is a forked child of the process the object was made
    /// in (one `getpid` call).
    pub(crate) fn forked(self) -> bool {
        self.0 != std::process::id()
    }

    /// The process id it was made in.
    pub(crate) fn pid(self) -> u32 {
        self.0
    }
}

/// Threads to join, in the order they were started.
pub(crate) struct Joined(Vec<JoinHandle<()>>, Origin);

impl Default for Joined {
    fn default() -> Self {
        Joined(Vec::new(), Origin::here())
    }
}

impl Joined {
    /// No threads yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Starts a thread called `name` running `f`, to be joined with the
    /// others.
    ///
    /// # Errors
    /// The operating system's refusal to start a thread.
    pub(crate) fn spawn(&mut self, name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        self.start(std::thread::Builder::new().name(name), f)
    }

    /// As [`Joined::spawn`], with a stack of `stack` bytes (an agent's
    /// connection threads, thousands of them, need less than the default).
    ///
    /// # Errors
    /// The operating system's refusal to start a thread.
    pub(crate) fn spawn_sized(&mut self, name: String, stack: usize, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        self.start(std::thread::Builder::new().name(name).stack_size(stack), f)
    }

    fn start(&mut self, builder: std::thread::Builder, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        // An owner that starts threads over its life (a key process's
        // reader, once per restart) keeps only those still running.
        for h in std::mem::take(&mut self.0) {
            if h.is_finished() {
                let _ = h.join();
            } else {
                self.0.push(h);
            }
        }
        self.0.push(crate::spawn::spawn(builder, f)?);
        Ok(())
    }

    /// Waits for every thread to end, at most [`JOIN_BOUND`] in all, and
    /// joins those that did. The calling thread, when it is one of them
    /// (an owner dropped by its own thread: the last engine handle dropped
    /// in a callback), is left to end by itself.
    pub(crate) fn join(&mut self) {
        if self.1.forked() {
            // Another process's threads (this is a forked child): none of
            // them exists here, and nothing can be joined.
            std::mem::forget(std::mem::take(&mut self.0));
            return;
        }
        let me = std::thread::current().id();
        let handles: Vec<JoinHandle<()>> = self.0.drain(..).filter(|h| h.thread().id() != me).collect();
        let until = Instant::now() + JOIN_BOUND;
        let mut pause = Duration::from_micros(50);
        while handles.iter().any(|h| !h.is_finished()) && Instant::now() < until {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
        for h in handles {
            if h.is_finished() {
                // Its function returned; join waits for the rest of its
                // exit. A panic was already reported where it happened.
                let _ = h.join();
            }
        }
    }
}

impl Drop for Joined {
    fn drop(&mut self) {
        self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn dropping_joins_a_thread_still_at_work() {
        let ended = Arc::new(AtomicBool::new(false));
        let mut j = Joined::new();
        let e = ended.clone();
        j.spawn("t".into(), move || {
            std::thread::sleep(Duration::from_millis(50));
            e.store(true, Ordering::Release);
        })
        .unwrap();
        drop(j);
        assert!(ended.load(Ordering::Acquire), "the drop returned before the thread ended");
    }

    #[test]
    fn a_thread_that_drops_its_own_owner_is_not_joined_by_itself() {
        let (tx, rx) = std::sync::mpsc::channel::<Joined>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let mut j = Joined::new();
        j.spawn("self".into(), move || {
            // The owner arrives here and is dropped on its own thread: a
            // join of itself would never return.
            drop(rx.recv().unwrap());
            done_tx.send(()).unwrap();
        })
        .unwrap();
        tx.send(j).unwrap();
        assert!(done_rx.recv_timeout(Duration::from_secs(2)).is_ok(), "the thread joined itself");
    }
}
