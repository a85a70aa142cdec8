//! The agent's poller: one thread that waits on sockets so that no other
//! thread has to.
//!
//! - Refusals: a client the agent will not serve is told why and its
//!   connection closed, but only once it has read the reason (closing
//!   with its hello unread would reset the connection, and the client
//!   would see the reset, not the reason). Waiting for that is this
//!   thread's, at most [`REFUSAL_WAIT`] per client and [`MAX_REFUSALS`]
//!   at once, never the accept thread's: a user who may not use the agent
//!   cannot slow the others' connections by dribbling bytes.
//! - Stalled replies: a client whose socket does not take its replies
//!   has them kept here (bounded by its writer) and written as the socket
//!   drains; one that takes nothing for [`STALL_LIMIT`] is cut off. The
//!   signing threads never wait on a client.

use std::collections::VecDeque;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::hush::Hush;
use crate::sign::key_process::protocol::{self as p, kind, ErrorCode};
use crate::sign::key_process::server::writer::{Stalled, Stalls};
use crate::sign::sys;

/// How long a refused client has to read its refusal.
pub(crate) const REFUSAL_WAIT: Duration = Duration::from_secs(1);
/// Refused connections waited on at once; more are closed at once.
pub(crate) const MAX_REFUSALS: usize = 1024;
/// How long a client may leave its replies unread (its socket taking
/// nothing) before it is cut off.
pub(crate) const STALL_LIMIT: Duration = Duration::from_secs(5);

/// How often, at most, the allocator's free memory is given back after
/// connections closed.
pub(crate) const TRIM_EVERY: Duration = Duration::from_secs(1);

/// Why a client is refused.
pub(crate) enum Refusal {
    /// Its user is not allowed: named by the poller (a user database
    /// lookup may be slow, and is kept off the accept thread).
    NotAllowed { uid: u32, pid: u32 },
    /// Over a bound.
    Busy(String),
}

#[derive(Default)]
struct Inbox {
    refused: Vec<(UnixStream, Refusal)>,
    stalled: Vec<Stalled>,
}

pub(crate) struct Poller {
    inbox: Mutex<Inbox>,
    /// A connection closed since the allocator was last trimmed.
    to_trim: AtomicBool,
    /// Written to wake the thread; it polls the other end.
    bell: UnixStream,
    stop: AtomicBool,
    refusals: Hush,
    cut_offs: Hush,
}

impl Poller {
    /// The poller and the end of its bell its thread listens on.
    pub(crate) fn new() -> std::io::Result<(Arc<Poller>, UnixStream)> {
        let (bell, hears) = UnixStream::pair()?;
        bell.set_nonblocking(true)?;
        hears.set_nonblocking(true)?;
        let poller = Arc::new(Poller {
            inbox: Mutex::new(Inbox::default()),
            to_trim: AtomicBool::new(false),
            bell,
            stop: AtomicBool::new(false),
            refusals: Hush::new(),
            cut_offs: Hush::new(),
        });
        Ok((poller, hears))
    }

    fn ring(&self) {
        let _ = sys::send_some(&self.bell, &[1]);
    }

    /// Tells `stream`'s client why it is refused and closes the connection
    /// once it has read the reason.
    pub(crate) fn refuse(&self, stream: UnixStream, why: Refusal) {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner()).refused.push((stream, why));
        self.ring();
    }

    /// A client's connection closed: what it held is given back to the
    /// system within [`TRIM_EVERY`] (trimming walks the allocator's heaps:
    /// a storm of closing connections trims once).
    pub(crate) fn closed(&self) {
        self.to_trim.store(true, Ordering::Release);
    }

    /// Ends the thread (its waiting connections are closed).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.ring();
    }

    /// The thread: runs until [`Poller::stop`].
    pub(crate) fn run(&self, hears: &UnixStream) {
        let mut refused: VecDeque<(UnixStream, Instant)> = VecDeque::new();
        let mut stalled: Vec<Stalled> = Vec::new();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut sink = [0u8; 512];
        let mut trimmed = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            if trimmed.elapsed() >= TRIM_EVERY && self.to_trim.swap(false, Ordering::AcqRel) {
                sys::give_back_memory();
                trimmed = Instant::now();
            }
            let inbox = std::mem::take(&mut *self.inbox.lock().unwrap_or_else(|e| e.into_inner()));
            for (stream, why) in inbox.refused {
                if refused.len() >= MAX_REFUSALS {
                    // Closed at once: the oldest waiting are not let go
                    // for a flood of new ones.
                    continue;
                }
                if let Some(waiting) = self.send_refusal(stream, why) {
                    refused.push_back((waiting, Instant::now() + REFUSAL_WAIT));
                }
            }
            for s in inbox.stalled {
                if !stalled.iter().any(|o| o.same(&s)) {
                    stalled.push(s);
                }
            }
            let now = Instant::now();
            while refused.front().is_some_and(|(_, until)| *until <= now) {
                refused.pop_front();
            }
            stalled.retain(|s| match s.since() {
                Some(since) if now.duration_since(since) >= STALL_LIMIT => {
                    s.cut_off();
                    if let Some(quiet) = self.cut_offs.say() {
                        tracing::warn!(more = quiet, "cut off a client that left its replies unread for {STALL_LIMIT:?}");
                    }
                    false
                }
                _ => true,
            });
            fds.clear();
            fds.push(libc::pollfd { fd: hears.as_raw_fd(), events: libc::POLLIN, revents: 0 });
            fds.extend(refused.iter().map(|(s, _)| libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 }));
            fds.extend(stalled.iter().map(|s| libc::pollfd { fd: s.fd(), events: libc::POLLOUT, revents: 0 }));
            let wait = if refused.is_empty() && stalled.is_empty() && !self.to_trim.load(Ordering::Acquire) {
                Duration::from_secs(1)
            } else {
                Duration::from_millis(100)
            };
            if sys::poll(&mut fds, wait).is_err() {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            if fds[0].revents != 0 {
                while matches!((&*hears).read(&mut sink), Ok(n) if n > 0) {}
            }
            let (ready_refused, ready_stalled) = fds[1..].split_at(refused.len());
            // Read what refused clients sent; those done (closed, failed)
            // are dropped, which closes them.
            let mut keep = Vec::with_capacity(refused.len());
            for ((stream, until), fd) in refused.drain(..).zip(ready_refused) {
                if fd.revents == 0 {
                    keep.push((stream, until));
                    continue;
                }
                let done = loop {
                    match (&stream).read(&mut sink) {
                        Ok(0) => break true,
                        Ok(_) => continue,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                        Err(_) => break true,
                    }
                };
                if !done {
                    keep.push((stream, until));
                }
            }
            refused.extend(keep);
            // Flush writers whose sockets drained; one still stalled comes
            // back through the inbox.
            let ready: Vec<bool> = ready_stalled.iter().map(|fd| fd.revents != 0).collect();
            let mut i = 0;
            stalled.retain(|s| {
                let go = ready[i];
                i += 1;
                if go {
                    s.flush();
                }
                !go
            });
        }
    }

    /// Writes the refusal (it fits in an empty socket's buffer), closes
    /// the writing side and hands back the stream to wait on, or `None`
    /// when it is done with already.
    fn send_refusal(&self, stream: UnixStream, why: Refusal) -> Option<UnixStream> {
        let (code, message) = match why {
            Refusal::NotAllowed { uid, pid } => {
                let user = sys::user_name(uid);
                if let Some(quiet) = self.refusals.say() {
                    tracing::warn!(%pid, %uid, %user, more = quiet, "refused a client that is not allowed");
                }
                (
                    ErrorCode::NotAllowed,
                    format!(
                        "user {user} (uid {uid}) is not allowed to use this agent: allow it with --allow-user {user}, or one of its groups with --allow-group"
                    ),
                )
            }
            Refusal::Busy(why) => {
                if let Some(quiet) = self.refusals.say() {
                    tracing::warn!(more = quiet, "refused a client: {why}");
                }
                (ErrorCode::Busy, why)
            }
        };
        let mut frame = Vec::new();
        p::encode(&mut frame, kind::ERR, 0, &[&p::error_body(code, &message)]);
        stream.set_nonblocking(true).ok()?;
        sys::send_some(&stream, &frame).ok()?;
        stream.shutdown(std::net::Shutdown::Write).ok()?;
        Some(stream)
    }
}

impl Stalls for Poller {
    fn watch(&self, writer: Stalled) {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner()).stalled.push(writer);
        self.ring();
    }
}
