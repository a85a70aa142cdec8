//! The client side of one connection to a key server: the handshake and
//! hello, request ids, what waits for each reply, the announced in-flight
//! bound, and failing everything in flight at once when the connection
//! ends. Many threads share one connection; replies come in any order.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crossbeam_channel::{bounded, RecvTimeoutError, Sender};
use openssl::ssl::SslConnector;

use super::link::{self, Handler, Link, Outbox};
use super::protocol::{self as p, kind, Frame, RemoteErrorCode};
use crate::sign::batch;
use crate::sign::threads::Joined;

/// Why one attempt on one connection did not get a reply frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// No connection could be made (refused, timed out, TLS refused).
    Connect(String),
    /// The connection ended with the request in flight.
    Lost(String),
    /// No reply by the attempt's deadline.
    TimedOut,
    /// The connection has its announced maximum in flight.
    NoRoom,
}

/// Whoever waits for a reply: a thread blocked in [`ClientConn::call`],
/// or a callback that [`ClientConn::send_async`] registered, which the
/// connection's thread runs (so it must not block).
enum Waiter {
    Thread(Sender<Result<Frame, CallError>>),
    Callback(Box<dyn FnOnce(Result<Frame, CallError>) + Send>),
}

impl Waiter {
    fn answer(self, result: Result<Frame, CallError>) {
        match self {
            Waiter::Thread(tx) => {
                let _ = tx.send(result);
            }
            Waiter::Callback(f) => f(result),
        }
    }
}

/// One live connection.
pub(crate) struct ClientConn {
    outbox: Outbox,
    pending: Mutex<HashMap<u64, Waiter>>,
    dead: AtomicBool,
    next_id: AtomicU64,
    max_in_flight: u32,
    in_flight: AtomicU32,
    /// When each callback's attempt times out, earliest first; the
    /// connection's thread answers those still waiting then. Entries of
    /// requests already answered stay until their time and are skipped.
    timers: Mutex<BinaryHeap<Reverse<(Instant, u64)>>>,
    /// The connection's thread, joined by [`ClientConn::join`].
    thread: Mutex<Joined>,
}

struct InFlight<'a>(&'a AtomicU32);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ClientConn {
    /// Connects to `addr`, checks that the server's certificate names
    /// `server_name`, exchanges hellos, and starts the connection's thread.
    /// Everything before the thread starts is bounded by `deadline`.
    pub(crate) fn connect(
        connector: &SslConnector, addr: SocketAddr, server_name: &str, deadline: Instant,
    ) -> Result<Arc<ClientConn>, CallError> {
        let left = || {
            let d = deadline.saturating_duration_since(Instant::now());
            if d.is_zero() {
                Err(CallError::Connect("timed out connecting".into()))
            } else {
                Ok(d)
            }
        };
        let fail = |what: &str, e: &dyn std::fmt::Display| CallError::Connect(format!("{what}: {e}"));
        let tcp = TcpStream::connect_timeout(&addr, left()?).map_err(|e| fail("connect", &e))?;
        let t = Some(left()?);
        tcp.set_nodelay(true)
            .and_then(|()| tcp.set_read_timeout(t))
            .and_then(|()| tcp.set_write_timeout(t))
            .map_err(|e| fail("socket", &e))?;
        let config = connector.configure().map_err(|e| fail("TLS", &e))?;
        let mut stream = config.connect(server_name, tcp).map_err(|e| fail("TLS handshake", &e))?;
        let mut hello = Vec::new();
        p::encode(&mut hello, kind::HELLO, 0, &[&p::hello_request()]);
        stream.write_all(&hello).map_err(|e| fail("hello", &e))?;
        let mut decoder = p::Decoder::new();
        let reply = link::read_frame(&mut stream, &mut decoder).map_err(|e| fail("hello", &e))?;
        let max_in_flight = match reply.kind {
            kind::HELLO => p::parse_hello_reply(&reply.body).map_err(|e| fail("hello", &e))?,
            kind::ERR => {
                let (code, msg) = p::parse_error(&reply.body);
                return Err(CallError::Connect(format!("the server refused the hello ({}): {msg}", code.name())));
            }
            k => return Err(CallError::Connect(format!("unexpected hello reply kind {k:#04x}"))),
        };
        stream.get_ref().set_read_timeout(None).and_then(|()| stream.get_ref().set_write_timeout(None)).map_err(|e| fail("socket", &e))?;
        let (link, outbox) = Link::new(stream, decoder).map_err(|e| fail("socket", &e))?;
        let conn = Arc::new(ClientConn {
            outbox,
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            next_id: AtomicU64::new(1),
            max_in_flight,
            in_flight: AtomicU32::new(0),
            timers: Mutex::new(BinaryHeap::new()),
            thread: Mutex::new(Joined::new()),
        });
        let c = conn.clone();
        conn.thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .spawn("keyfence-remote-conn".into(), move || {
                let why = link::run(link, &c.outbox, &mut Replies(&c));
                c.fail_all(why);
            })
            .map_err(|e| fail("thread", &e))?;
        Ok(conn)
    }

    fn pending(&self) -> MutexGuard<'_, HashMap<u64, Waiter>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the connection has ended.
    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Ends the connection; whatever is in flight fails.
    pub(crate) fn close(&self) {
        self.outbox.close();
    }

    /// Waits for the connection's thread to end (after [`ClientConn::close`])
    /// and joins it, unless this is that thread.
    pub(crate) fn join(&self) {
        let mut thread = std::mem::take(&mut *self.thread.lock().unwrap_or_else(|e| e.into_inner()));
        thread.join();
    }

    fn fail_all(&self, why: String) {
        let waiters: Vec<Waiter> = {
            let mut map = self.pending();
            self.dead.store(true, Ordering::Release);
            map.drain().map(|(_, w)| w).collect()
        };
        for w in waiters {
            w.answer(Err(CallError::Lost(why.clone())));
        }
    }

    /// Claims a request slot, or says there is none (the announced
    /// maximum is in flight).
    fn claim(&self) -> Result<(), CallError> {
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(CallError::NoRoom);
        }
        Ok(())
    }

    /// Whether a request slot is free now.
    pub(crate) fn has_room(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) < self.max_in_flight
    }

    /// A request id for [`ClientConn::send_async`].
    pub(crate) fn next_request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends `frame` (encoded with request id `id`) without waiting:
    /// `done` is called once, on the connection's thread (or on this one
    /// if the connection has no room or has ended), with the reply, or
    /// with [`CallError::TimedOut`] at `until`, or with
    /// [`CallError::Lost`] when the connection ends first. `done` must
    /// not block: it runs where replies are read.
    pub(crate) fn send_async(
        self: &Arc<Self>, id: u64, frame: &[u8], until: Instant, done: impl FnOnce(Result<Frame, CallError>) + Send + 'static,
    ) {
        if let Err(e) = self.claim() {
            return done(Err(e));
        }
        // The slot is given back however the request ends. The closure
        // holds the connection until then; a connection that ends answers
        // every waiter, which drops it.
        let conn = self.clone();
        let waiter = Waiter::Callback(Box::new(move |result| {
            conn.in_flight.fetch_sub(1, Ordering::AcqRel);
            done(result);
        }));
        {
            let mut map = self.pending();
            if self.is_dead() {
                drop(map);
                return waiter.answer(Err(CallError::Lost("the connection had ended".into())));
            }
            map.insert(id, waiter);
        }
        self.timers.lock().unwrap_or_else(|e| e.into_inner()).push(Reverse((until, id)));
        // In a submission batch the frame waits for the batch's end: one
        // wake-up of the connection's thread and one TLS record for all.
        if batch::defer_arc(self) {
            self.outbox.queue(frame);
        } else {
            self.outbox.send(frame);
        }
    }

    /// Answers the callbacks whose time is up with [`CallError::TimedOut`];
    /// returns when the next one is due.
    fn expire(&self, now: Instant) -> Option<Instant> {
        let mut expired = Vec::new();
        let next = {
            let mut timers = self.timers.lock().unwrap_or_else(|e| e.into_inner());
            while let Some(&Reverse((at, id))) = timers.peek() {
                if at > now {
                    break;
                }
                timers.pop();
                expired.push(id);
            }
            timers.peek().map(|Reverse((at, _))| *at)
        };
        for id in expired {
            let waiter = self.pending().remove(&id);
            if let Some(w) = waiter {
                w.answer(Err(CallError::TimedOut));
            }
        }
        next
    }

    /// Sends the frame `encode` writes for a request id, and waits for its
    /// reply until `deadline`.
    pub(crate) fn call(&self, encode: impl FnOnce(&mut Vec<u8>, u64), deadline: Instant) -> Result<Frame, CallError> {
        self.claim()?;
        let _slot = InFlight(&self.in_flight);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        {
            let mut map = self.pending();
            if self.is_dead() {
                return Err(CallError::Lost("the connection had ended".into()));
            }
            map.insert(id, Waiter::Thread(tx));
        }
        let mut frame = Vec::new();
        encode(&mut frame, id);
        // A closed outbox means the reader is failing everything: the
        // waiter hears it below.
        self.outbox.send(&frame);
        match rx.recv_deadline(deadline) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => {
                self.pending().remove(&id);
                Err(CallError::TimedOut)
            }
            Err(RecvTimeoutError::Disconnected) => Err(CallError::Lost("the connection ended".into())),
        }
    }
}

impl batch::Flush for ClientConn {
    fn flush(&self) {
        self.outbox.wake();
    }
}

/// The connection thread's handler: each reply to whoever waits for it.
struct Replies<'a>(&'a ClientConn);

impl Handler for Replies<'_> {
    fn frame(&mut self, frame: Frame) -> Result<(), String> {
        if !matches!(frame.kind, kind::OK | kind::ERR) {
            return Err(format!("the server sent a frame of kind {:#04x}", frame.kind));
        }
        // A reply nobody waits for (the caller timed out) is dropped.
        let waiter = self.0.pending().remove(&frame.id);
        if let Some(w) = waiter {
            w.answer(Ok(frame));
        }
        Ok(())
    }

    fn due(&mut self, now: Instant) -> Option<Instant> {
        self.0.expire(now)
    }
}

/// An ERR frame's code, message and detail.
pub(crate) fn error_of(frame: &Frame) -> Option<(RemoteErrorCode, String, p::Detail)> {
    (frame.kind == kind::ERR).then(|| p::parse_error_with(&frame.body))
}
