//! One mutual-TLS connection after its handshake, for either side: a
//! thread owns the TLS stream (AWS-LC's stream cannot be read and
//! written from two threads), reads frames and hands each to a
//! [`Handler`], and writes whatever other threads put in the [`Outbox`].
//! The socket is non-blocking and the thread sleeps in `poll` on it and on
//! a waker, so a reply written by an executor thread goes out at once and
//! a slow read never holds up a write.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use openssl::ssl::{ErrorCode as SslErrorCode, SslStream};

use super::poll;
use super::protocol::{Decoder, Frame};
use crate::sign::batch;

/// Bytes queued for a peer that does not read them before the connection
/// is closed: replies are bounded by the in-flight limits, but PINGs and
/// refusals are not, and a peer must not grow this process's memory by
/// never reading.
pub(crate) const MAX_UNWRITTEN: usize = 16 << 20;

/// Frames waiting to be written, shared with the threads that answer or
/// send; and the way to end the connection from outside.
pub(crate) struct Outbox {
    buf: Mutex<Vec<u8>>,
    waker: UnixStream,
    closed: AtomicBool,
    socket: TcpStream,
}

impl Outbox {
    fn buf(&self) -> MutexGuard<'_, Vec<u8>> {
        self.buf.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues encoded frames for writing; false once the connection is
    /// closed (nothing will be written).
    pub(crate) fn send(&self, frames: &[u8]) -> bool {
        if self.is_closed() {
            return false;
        }
        let was_empty = {
            let mut buf = self.buf();
            if buf.len() + frames.len() > MAX_UNWRITTEN {
                drop(buf);
                self.close();
                return false;
            }
            let was_empty = buf.is_empty();
            buf.extend_from_slice(frames);
            was_empty
        };
        // One wake per batch: the loop takes everything queued when it runs.
        if was_empty {
            let _ = (&self.waker).write(&[1]);
        }
        true
    }

    /// Queues encoded frames without waking the connection's thread: the
    /// caller promises a [`Outbox::wake`] soon (a submission batch that
    /// ends). False once the connection is closed.
    pub(crate) fn queue(&self, frames: &[u8]) -> bool {
        if self.is_closed() {
            return false;
        }
        let mut buf = self.buf();
        if buf.len() + frames.len() > MAX_UNWRITTEN {
            drop(buf);
            self.close();
            return false;
        }
        buf.extend_from_slice(frames);
        true
    }

    /// Wakes the connection's thread to write what is queued.
    pub(crate) fn wake(&self) {
        let _ = (&self.waker).write(&[1]);
    }

    /// Ends the connection: the loop stops at its next turn and the socket
    /// is shut down at once, so the peer sees it closed even if the loop is
    /// busy.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.socket.shutdown(Shutdown::Both);
        let _ = (&self.waker).write(&[1]);
    }

    /// Whether the connection has ended or been told to.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

impl batch::Flush for Outbox {
    fn flush(&self) {
        self.wake();
    }
}

/// Queues `frames` on a shared outbox: at once, or, inside a submission
/// batch (an executor worker with more operations waiting), with one
/// wake-up of the connection's thread when the batch ends.
pub(crate) fn send_batched(outbox: &Arc<Outbox>, frames: &[u8]) -> bool {
    if batch::defer_arc(outbox) {
        outbox.queue(frames)
    } else {
        outbox.send(frames)
    }
}

/// What a side does with each frame it reads.
pub(crate) trait Handler {
    /// Handles one frame. An error ends the connection, with its text as
    /// the reason.
    fn frame(&mut self, frame: Frame) -> Result<(), String>;

    /// Whether answers to frames already handled are still to come from
    /// other threads: a connection closing for a bad frame waits for them
    /// (up to [`LINGER`]) so everything before the bad bytes is answered.
    fn busy(&self) -> bool {
        false
    }

    /// Called on every turn: handles whatever is due at `now` (requests
    /// that timed out) and says when the next thing is, so that the
    /// connection's thread wakes then even if nothing arrives.
    fn due(&mut self, _now: Instant) -> Option<Instant> {
        None
    }
}

/// How long a connection closing for a bad frame keeps writing the answers
/// to the frames before it.
pub(crate) const LINGER: Duration = Duration::from_secs(5);

/// A connection ready for [`run`]: the stream (non-blocking from here on),
/// the outbox other threads write to, and the waker's reading end.
pub(crate) struct Link {
    stream: SslStream<TcpStream>,
    waker: UnixStream,
    decoder: Decoder,
}

impl Link {
    /// Wraps a stream whose handshake (and hello) is done. `decoder` holds
    /// whatever was read past the hello.
    ///
    /// # Errors
    /// The socket calls that prepare it.
    pub(crate) fn new(stream: SslStream<TcpStream>, decoder: Decoder) -> io::Result<(Link, Outbox)> {
        let (waker_rx, waker_tx) = UnixStream::pair()?;
        waker_rx.set_nonblocking(true)?;
        waker_tx.set_nonblocking(true)?;
        let socket = stream.get_ref().try_clone()?;
        stream.get_ref().set_nonblocking(true)?;
        let outbox = Outbox { buf: Mutex::new(Vec::new()), waker: waker_tx, closed: AtomicBool::new(false), socket };
        Ok((Link { stream, waker: waker_rx, decoder }, outbox))
    }
}

/// Serves a connection until it ends, then says why. Frames go to
/// `handler` in the order read; replies queued in `outbox` are written as
/// soon as the socket takes them.
pub(crate) fn run(link: Link, outbox: &Outbox, handler: &mut dyn Handler) -> String {
    let why = serve(link, outbox, handler);
    outbox.close();
    why
}

fn serve(mut link: Link, outbox: &Outbox, handler: &mut dyn Handler) -> String {
    let mut out: Vec<u8> = Vec::new();
    let mut written = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let fd = link.stream.get_ref().as_raw_fd();
    // Whether the socket may have bytes: reading only then saves a system
    // call per wake-up by the waker (AWS-LC holds no decrypted bytes
    // between turns: each turn reads until it wants more).
    let mut readable = true;
    // Set once a bad frame arrived: why, and until when the answers to the
    // frames before it are still written. Nothing more is decoded.
    let mut closing: Option<(String, Instant)> = None;
    loop {
        if outbox.is_closed() {
            return "closed by this side".into();
        }

        // Take what other threads queued.
        {
            let mut queued = outbox.buf();
            if !queued.is_empty() {
                if written == out.len() {
                    out.clear();
                    written = 0;
                    std::mem::swap(&mut out, &mut *queued);
                } else {
                    out.extend_from_slice(&queued);
                    queued.clear();
                }
            }
        }
        if out.len() - written > MAX_UNWRITTEN {
            return "the peer does not read what it is sent".into();
        }
        let mut want_write = false;
        while written < out.len() {
            match link.stream.ssl_write(&out[written..]) {
                Ok(n) => written += n,
                Err(e) if e.code() == SslErrorCode::WANT_WRITE => {
                    want_write = true;
                    break;
                }
                Err(e) if e.code() == SslErrorCode::WANT_READ => break,
                Err(e) => return format!("writing failed: {e}"),
            }
        }
        if written == out.len() {
            // The buffer is reused; a large one left by a burst is freed.
            out.clear();
            written = 0;
            if out.capacity() > 1 << 20 {
                out = Vec::new();
            }
        }
        while readable {
            match link.stream.ssl_read(&mut buf) {
                Ok(0) => return "the peer closed the connection".into(),
                // Past a bad frame, what the peer sends is dropped unread.
                Ok(n) if closing.is_none() => link.decoder.push(&buf[..n]),
                Ok(_) => {}
                Err(e) if e.code() == SslErrorCode::WANT_READ => readable = false,
                Err(e) if e.code() == SslErrorCode::WANT_WRITE => {
                    want_write = true;
                    readable = false;
                }
                Err(e) if e.code() == SslErrorCode::ZERO_RETURN => return "the peer closed the connection".into(),
                Err(e) if e.code() == SslErrorCode::SYSCALL && e.io_error().is_none() => return "the peer closed the connection".into(),
                Err(e) => return format!("reading failed: {e}"),
            }
        }
        while closing.is_none() {
            match link.decoder.next_frame() {
                Ok(Some(frame)) => {
                    if let Err(why) = handler.frame(frame) {
                        // Let a last reply (an ERR saying why) go out.
                        flush_briefly(&mut link.stream, outbox, &mut out, written);
                        return why;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // The stream cannot be resynchronised, but every frame
                    // before the bad bytes was handled and gets its answer.
                    closing = Some((format!("a bad frame: {e}"), Instant::now() + LINGER));
                }
            }
        }
        if !outbox.buf().is_empty() {
            continue;
        }
        let want_write = want_write || written < out.len();
        if let Some((why, until)) = &closing {
            // `busy` before the outbox: an answer is queued before its
            // request stops counting as busy.
            if written == out.len() && !handler.busy() && outbox.buf().is_empty() {
                return why.clone();
            }
            if Instant::now() >= *until {
                return format!("{why} (answers still unwritten after {LINGER:?})");
            }
        }
        let now = Instant::now();
        let wake_at = match (&closing, handler.due(now)) {
            (Some((_, until)), Some(due)) => Some((*until).min(due)),
            (Some((_, until)), None) => Some(*until),
            (None, due) => due,
        };
        // Rounded up, so that a wake-up never comes before what is due.
        let timeout = match wake_at {
            Some(at) => {
                let left = at.saturating_duration_since(now);
                i32::try_from(left.as_micros().div_ceil(1000)).unwrap_or(i32::MAX).max(1)
            }
            None => -1,
        };
        match poll::wait(fd, want_write, link.waker.as_raw_fd(), timeout) {
            Ok((socket, woken)) => {
                readable = socket;
                if woken {
                    // One read takes every pending wake byte unless more
                    // than the buffer's worth piled up.
                    let mut sink = [0u8; 256];
                    while matches!((&link.waker).read(&mut sink), Ok(n) if n == sink.len()) {}
                }
            }
            Err(e) => return format!("poll failed: {e}"),
        }
    }
}

/// Writes what is queued for up to 100 ms before a connection is closed
/// for a protocol error, so the peer can read why.
fn flush_briefly(stream: &mut SslStream<TcpStream>, outbox: &Outbox, out: &mut Vec<u8>, written: usize) {
    out.drain(..written);
    out.extend_from_slice(&outbox.buf());
    let until = Instant::now() + std::time::Duration::from_millis(100);
    while !out.is_empty() && Instant::now() < until {
        match stream.ssl_write(out) {
            Ok(n) => {
                out.drain(..n);
            }
            Err(e) if matches!(e.code(), SslErrorCode::WANT_WRITE | SslErrorCode::WANT_READ) => {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(_) => return,
        }
    }
}

/// Reads one whole frame from a blocking stream (the hello), keeping
/// anything read past it in `decoder`.
///
/// # Errors
/// A read error or time-out, the peer closing, or a bad length.
pub(crate) fn read_frame(stream: &mut SslStream<TcpStream>, decoder: &mut Decoder) -> io::Result<Frame> {
    let mut buf = [0u8; 4096];
    loop {
        match decoder.next_frame() {
            Ok(Some(f)) => return Ok(f),
            Ok(None) => {}
            Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
        }
        match stream.read(&mut buf)? {
            0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection")),
            n => decoder.push(&buf[..n]),
        }
    }
}
