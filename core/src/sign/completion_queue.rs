//! A completion queue with a pollable file descriptor, for event loops
//! (epoll, kqueue-style loops, the C ABI) that integrate by fd.
//!
//! The descriptor is the read end of a Unix socket pair from the standard
//! library, so no `unsafe` is needed. Completions are pushed onto an
//! in-memory queue; the first push after a drain writes one byte, making the
//! descriptor readable. A drain empties the socket, clears the flag and then
//! takes the queue, so a completion is never left behind without the
//! descriptor being readable (at worst there is one spurious wake-up).

use std::collections::VecDeque;
use std::io::{ErrorKind as IoErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::batch;
use super::threads::Origin;
use super::types::{Output, Resource, SignError};

/// One finished operation taken from a [`CompletionQueue`].
#[derive(Debug)]
pub struct Completion {
    /// The token given at submission.
    pub user_data: u64,
    /// The operation's engine-wide id ([`OpHandle::id`](super::OpHandle::id)).
    pub id: u64,
    /// The signature or decryption, or why there is none.
    pub result: Result<Output, SignError>,
}

pub(crate) struct CqShared {
    items: Mutex<VecDeque<Completion>>,
    signaled: AtomicBool,
    reader: UnixStream,
    writer: UnixStream,
    /// The process the queue was made in: a forked child shares its
    /// socket pair with the parent, and may find its lock held forever.
    pub(crate) origin: Origin,
}

impl CqShared {
    /// Queues a completion and makes the descriptor readable; in a batch
    /// (an executor worker with more operations waiting), once the batch
    /// ends, so that the loop wakes once for several completions.
    pub(crate) fn push(self: &Arc<Self>, user_data: u64, id: u64, result: Result<Output, SignError>) {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).push_back(Completion { user_data, id, result });
        if !batch::defer_arc(self) {
            self.signal();
        }
    }

    fn signal(&self) {
        if !self.signaled.swap(true, Ordering::SeqCst) {
            // One byte per drain cycle at most, so the socket buffer never
            // fills; a failed write could only mean the reader is gone.
            let _ = (&self.writer).write(&[1]);
        }
    }
}

impl batch::Flush for CqShared {
    fn flush(&self) {
        self.signal();
    }
}

/// Completions delivered through a pollable file descriptor.
///
/// Submit with [`Engine::submit_to_queue`](super::Engine::submit_to_queue);
/// register [`CompletionQueue::as_fd`] for readability in the event loop;
/// when it is readable, call [`CompletionQueue::drain`]. One queue can
/// serve many operations and engines; clones share the queue.
///
/// ```
/// use std::sync::Arc;
/// use keyfence::sign::{Algorithm, CompletionQueue, Engine, EngineConfig, KeyKind, PrivateKey, Request};
/// let engine = Engine::new(EngineConfig::default()).unwrap();
/// let key = Arc::new(PrivateKey::generate(KeyKind::Ed25519).unwrap());
/// let cq = CompletionQueue::new().unwrap();
/// engine.submit_to_queue(Request::sign(key, Algorithm::Ed25519, b"hi".to_vec()), &cq, 7).unwrap();
/// let mut done = Vec::new();
/// while done.is_empty() {
///     // An event loop would wait for `cq.as_fd()` to become readable here.
///     cq.drain_into(&mut done);
/// }
/// assert_eq!(done[0].user_data, 7);
/// assert_eq!(done[0].result.as_ref().unwrap().len(), 64);
/// ```
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) shared: Arc<CqShared>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue").field("fd", &self.as_raw_fd()).field("pending", &self.len()).finish()
    }
}

impl CompletionQueue {
    /// A new, empty queue.
    ///
    /// # Errors
    /// [`SignError::Io`] if the socket pair cannot be created.
    pub fn new() -> Result<Self, SignError> {
        let io = |e: std::io::Error| SignError::io(Resource::Socket, format!("completion queue socket pair: {e}"));
        let (reader, writer) = UnixStream::pair().map_err(io)?;
        reader.set_nonblocking(true).map_err(io)?;
        writer.set_nonblocking(true).map_err(io)?;
        Ok(CompletionQueue {
            shared: Arc::new(CqShared {
                items: Mutex::new(VecDeque::new()),
                signaled: AtomicBool::new(false),
                reader,
                writer,
                origin: Origin::here(),
            }),
        })
    }

    /// Moves every completion that has arrived into `out` and returns how
    /// many; never blocks. Afterwards the descriptor is readable again only
    /// when new completions arrive.
    pub fn drain_into(&self, out: &mut Vec<Completion>) -> usize {
        self.drain_up_to(out, usize::MAX)
    }

    /// Like [`CompletionQueue::drain_into`], but moves at most `max`
    /// completions, for callers that drain into a fixed-size array (the C
    /// ABI). When more remain, the descriptor is left readable, so a
    /// level-triggered loop comes back for them and an edge-triggered one
    /// sees a new edge.
    pub fn drain_up_to(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        // A queue made before this process forked never receives anything
        // here (the engine refuses to queue onto it), and its lock may be
        // held by a thread that is not here.
        if self.shared.origin.forked() {
            return 0;
        }
        let s = &self.shared;
        // Empty the socket first, then clear the flag. The other order loses
        // wake-ups: a push between clearing and reading sets the flag and
        // writes a byte that the read then swallows, leaving the flag set
        // with no byte behind it, so no later push would ever signal again.
        // In this order, a push before the clear either wrote a byte we just
        // read (its item is taken below) or saw the flag still set and wrote
        // nothing (its item too is already queued and taken below).
        let mut buf = [0u8; 64];
        loop {
            match (&s.reader).read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == IoErrorKind::Interrupted => continue,
                Err(_) => break, // WouldBlock: empty.
            }
        }
        s.signaled.store(false, Ordering::SeqCst);
        let mut items = s.items.lock().unwrap_or_else(|e| e.into_inner());
        let n = items.len().min(max);
        out.extend(items.drain(..n));
        if !items.is_empty() && !s.signaled.swap(true, Ordering::SeqCst) {
            let _ = (&s.writer).write(&[1]);
        }
        n
    }

    /// [`CompletionQueue::drain_into`] into a new vector.
    pub fn drain(&self) -> Vec<Completion> {
        let mut out = Vec::new();
        self.drain_into(&mut out);
        out
    }

    /// Completions waiting to be drained.
    pub fn len(&self) -> usize {
        self.shared.items.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl AsFd for CompletionQueue {
    /// The descriptor to poll for readability.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.shared.reader.as_fd()
    }
}

impl AsRawFd for CompletionQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.shared.reader.as_raw_fd()
    }
}

#[cfg(test)]
#[allow(unsafe_code)] // poll(2) in the test, to look at readability without reading
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn readable(q: &CompletionQueue) -> bool {
        let mut p = libc::pollfd { fd: q.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd on the stack, a zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    /// Producers push while a consumer behaves like an event loop: it
    /// drains only when the descriptor is readable (peeked, so the byte
    /// stays), a few at a time. Every completion must arrive; a lost
    /// wake-up leaves items queued behind a silent descriptor.
    #[test]
    fn no_wake_up_is_lost_under_concurrent_pushes_and_partial_drains() {
        for _round in 0..20 {
            let q = CompletionQueue::new().unwrap();
            const PRODUCERS: u64 = 4;
            const EACH: u64 = 2_000;
            let producers: Vec<_> = (0..PRODUCERS)
                .map(|p| {
                    let shared = q.shared.clone();
                    std::thread::spawn(move || {
                        for i in 0..EACH {
                            shared.push(p, i, Err(SignError::Cancelled));
                        }
                    })
                })
                .collect();
            let mut got = Vec::new();
            let give_up = Instant::now() + Duration::from_secs(20);
            while (got.len() as u64) < PRODUCERS * EACH {
                match readable(&q) {
                    true => {
                        q.drain_up_to(&mut got, 3);
                    }
                    false => {
                        assert!(Instant::now() < give_up, "{} completions queued behind a descriptor that is not readable", q.len());
                        std::thread::yield_now();
                    }
                }
            }
            for p in producers {
                p.join().unwrap();
            }
            assert_eq!(got.len() as u64, PRODUCERS * EACH);
        }
    }
}
