//! The connection engine both servers run on: the key process (one
//! client, its parent) and the agent (many local users). A server is a
//! [`Service`]: its [`Table`] says what its clients may ask, and it loads
//! keys and serves its own requests; everything else is here, once: the
//! hello, reading frames (in place, charged to the client's user, bounded
//! in time once begun, from the process that opened the connection only),
//! the in-flight and key bounds, the queues and threads (`workers`), the
//! replies' writer (`writer`). OpenSSH's monitor states in one table what
//! its unprivileged child may ask (`mon_dispatch_proto20[]`); here each
//! service's table is one constant in its own folder
//! (`key_process/process/service.rs`, `agent/service.rs`), and a request
//! its table leaves out is answered `NOT_ALLOWED` before any work.

pub(crate) mod budget;
pub(crate) mod fair_queue;
mod workers;
pub(crate) mod writer;

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use self::budget::{Account, Charge, Pool};
use self::fair_queue::Full;
use self::workers::{key_memory, perform, Job, LoadJob, JOB_MEMORY};
pub(crate) use self::workers::{token_code, Room, Workers, MAX_QUEUED_LOADS};
use self::writer::FrameWriter;
use super::protocol::{self as p, kind, Detail, ErrorCode, Frame, LoadBody, Source};
use crate::sign::sys;
use crate::sign::types::SignError;
use crate::sign::PrivateKey;

/// What one kind of server permits and does that the engine does not.
pub(crate) trait Service: Send + Sync + 'static {
    /// Its table of what its clients may ask.
    fn table(&self) -> &'static Table;

    /// Loads the key a LOAD names (a source its table takes) for
    /// `client` (an agent's client; `None` for a key process's parent).
    ///
    /// # Errors
    /// The ERR's code and message, which names the source and never its
    /// contents.
    fn load(&self, source: &LoadBody, client: Option<&Client>) -> Result<PrivateKey, Refusal>;

    /// Serves a request of its own: a kind its table lists that the
    /// engine does not serve itself (OP, LOAD, UNLOAD and STATUS are the
    /// engine's). The OK body, or the ERR's code and message.
    ///
    /// # Errors
    /// As above; by default every such request is refused.
    fn own_request(&self, kind: u8, _body: &[u8]) -> Result<Vec<u8>, (ErrorCode, String)> {
        Err((ErrorCode::Malformed, format!("unknown request kind {kind:#04x}")))
    }
}

/// Why a request was refused: the ERR's wire code and message, and the
/// fields a client rebuilds the error from (never from the message).
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) code: ErrorCode,
    pub(crate) message: String,
    pub(crate) detail: Detail,
}

impl Refusal {
    /// A refusal with `code` and `message` only.
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Refusal { code, message: message.into(), detail: Detail::default() }
    }

    /// A key load (a token's) that failed with `e`: the wire code of a
    /// token's failure that has one, else `LOAD`, with `e`'s detail, so
    /// the client's caller sees the error as it would in process.
    pub(crate) fn load_failed(e: &SignError) -> Self {
        let (message, detail) = Detail::of(e);
        Refusal { code: token_code(e).unwrap_or(ErrorCode::Load), message, detail }
    }
}

/// What a server permits: the requests it serves and the key sources a
/// LOAD may name. Anything else is answered `NOT_ALLOWED`, with the
/// table's reason.
pub(crate) struct Table {
    /// The frame kinds it serves after the hello.
    pub(crate) requests: &'static [u8],
    /// Why it refuses a request of another kind.
    pub(crate) other_requests: &'static str,
    /// The LOAD sources it takes.
    pub(crate) sources: &'static [Source],
    /// Why it refuses a LOAD of another source.
    pub(crate) other_sources: &'static str,
}

/// An agent's client as its connection sees it: who it is, and its
/// user's share of the agent.
pub(crate) struct Client {
    /// The process that connected (what a refusal is logged with).
    pub(crate) pid: u32,
    /// Its user.
    pub(crate) uid: u32,
    /// Its primary and supplementary groups.
    pub(crate) gids: Vec<u32>,
    /// What its user holds over all its connections.
    pub(crate) share: Arc<UserShare>,
    /// The bounds on each connection and each user.
    pub(crate) limits: Limits,
}

/// What one local user holds of an agent, over all its connections: what
/// a bound per user counts, so that no user can take what the others
/// need (signing slots, key loads, memory, connections).
pub(crate) struct UserShare {
    /// Operations in flight.
    pub(crate) in_flight: AtomicUsize,
    /// Keys loaded.
    pub(crate) keys: AtomicUsize,
    /// Connections open.
    pub(crate) connections: AtomicUsize,
    /// The memory its connections make the agent hold (`budget`).
    pub(crate) memory: Arc<Pool>,
}

impl UserShare {
    /// A user's share with `memory` bytes to hold at most.
    pub(crate) fn new(memory: usize) -> Self {
        UserShare { in_flight: AtomicUsize::new(0), keys: AtomicUsize::new(0), connections: AtomicUsize::new(0), memory: Pool::new(memory) }
    }
}

/// An agent's bounds per connection and per user.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) user_in_flight: usize,
    pub(crate) connection_keys: usize,
    pub(crate) user_keys: usize,
}

/// A key a connection holds, with the memory charged for it.
struct Held {
    key: Arc<PrivateKey>,
    _charge: Option<Charge>,
}

/// One client's connection: its keys (under the ids it chose), its writer
/// and its counts.
struct Conn {
    keys: RwLock<HashMap<u64, Held>>,
    writer: FrameWriter,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    flags: u32,
    service: Arc<dyn Service>,
    workers: Arc<Workers>,
    /// An agent's client: who it is, and its user's share and bounds.
    client: Option<Arc<Client>>,
    /// What its memory is charged to.
    account: Account,
}

impl Drop for Conn {
    /// The keys a connection held are its user's no longer.
    fn drop(&mut self) {
        if let Some(c) = &self.client {
            let held = self.keys.get_mut().unwrap_or_else(|e| e.into_inner()).len();
            c.share.keys.fetch_sub(held, Ordering::AcqRel);
        }
    }
}

impl Conn {
    pub(super) fn ok(&self, id: u64, body: &[u8]) {
        let mut frame = Zeroizing::new(Vec::with_capacity(p::HEADER + 4 + body.len()));
        p::encode(&mut frame, kind::OK, id, &[body]);
        self.writer.send(&frame);
    }

    pub(super) fn err(&self, id: u64, code: ErrorCode, message: &str) {
        self.refuse(id, &Refusal::new(code, message));
    }

    /// Answers request `id` with `refusal`, its detail included.
    pub(super) fn refuse(&self, id: u64, refusal: &Refusal) {
        let mut frame = Vec::new();
        p::encode(&mut frame, kind::ERR, id, &[&p::error_body_with(refusal.code, &refusal.message, &refusal.detail)]);
        self.writer.send(&frame);
    }

    /// The user whose queue its work waits in (the key process's one
    /// client is 0).
    fn user(&self) -> u32 {
        self.client.as_ref().map_or(0, |c| c.uid)
    }

    /// A request is answered: it is in flight no more.
    pub(super) fn done(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        if let Some(c) = &self.client {
            c.share.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Why this connection may not load one more key, if it may not: an
    /// agent bounds keys per connection and per user (each is memory, and
    /// an RSA-4096 key is kilobytes).
    fn key_room(&self, key_id: u64) -> Option<String> {
        let c = self.client.as_ref()?;
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        if keys.contains_key(&key_id) {
            return None;
        }
        if keys.len() >= c.limits.connection_keys {
            return Some(format!("this connection holds {} keys, the most the agent allows one connection", keys.len()));
        }
        let held = c.share.keys.load(Ordering::Acquire);
        (held >= c.limits.user_keys)
            .then(|| format!("this user holds {held} keys over its connections, the most the agent allows one user"))
    }

    /// Keeps `key` under `key_id`, counted against its user (an agent's
    /// client pays for its keys' memory too; a key process's parent, which
    /// may load a key server's every key, only for its requests).
    pub(super) fn keep(&self, key_id: u64, key: PrivateKey) -> Result<(), String> {
        let charge = match &self.client {
            Some(_) => Some(self.account.charge(key_memory(key.kind())).map_err(|over| over.to_string())?),
            None => None,
        };
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = &self.client {
            if !keys.contains_key(&key_id) {
                // Checked again here: two loads run at a time.
                let bound = "the agent's bound on keys was reached while this key loaded";
                if keys.len() >= c.limits.connection_keys {
                    return Err(bound.into());
                }
                if c.share.keys.fetch_add(1, Ordering::AcqRel) >= c.limits.user_keys {
                    c.share.keys.fetch_sub(1, Ordering::AcqRel);
                    return Err(bound.into());
                }
            }
        }
        keys.insert(key_id, Held { key: Arc::new(key), _charge: charge });
        Ok(())
    }

    /// Forgets the key `key_id`; whether it was there.
    fn forget(&self, key_id: u64) -> bool {
        let removed = self.keys.write().unwrap_or_else(|e| e.into_inner()).remove(&key_id).is_some();
        if let (true, Some(c)) = (removed, &self.client) {
            c.share.keys.fetch_sub(1, Ordering::AcqRel);
        }
        removed
    }
}

/// How one connection is served.
pub(crate) struct ConnOptions {
    /// The hardening flags its hello reply confirms.
    pub(crate) flags: u32,
    /// The server it speaks to: what it may ask.
    pub(crate) service: Arc<dyn Service>,
    /// An agent's client: who it is, with its user's share.
    pub(crate) client: Option<Arc<Client>>,
    /// The most requests in flight its hello may ask for.
    pub(crate) cap: u32,
    /// How long its whole hello may take to come.
    pub(crate) hello_timeout: Duration,
    /// How long a frame may take to come whole once begun (an agent's
    /// clients; checked whenever a read waits, so a frame is cut off
    /// between one and two of these after it began); `None` for a key
    /// process's parent.
    pub(crate) frame_timeout: Option<Duration>,
    /// What its memory is charged to.
    pub(crate) account: Account,
    /// Bytes read at a time (the read buffer, which grows for a frame
    /// that is longer).
    pub(crate) read_chunk: usize,
    /// The process (pid, uid) every byte must come from: the one that
    /// opened the connection, not a child that inherited it.
    pub(crate) owner: Option<(u32, u32)>,
}

/// Reads from a connection that only its owner may write to.
struct FromOwner<'a> {
    stream: &'a UnixStream,
    owner: Option<(u32, u32)>,
    /// Bytes with their sender's credentials have come: from then on,
    /// bytes without are refused.
    credited: bool,
}

impl Read for FromOwner<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(owner) = self.owner else { return (&*self.stream).read(buf) };
        let (n, sender) = sys::recv_from_sender(self.stream, buf)?;
        let why = match sender {
            _ if n == 0 => return Ok(0),
            Some(from) if from == owner => {
                self.credited = true;
                return Ok(n);
            }
            // Bytes queued before the server's end had SO_PASSCRED (an
            // agent's socket that systemd made without PassCredentials=
            // and a client that wrote before the agent accepted it) carry
            // none: they can only come first, and are the connecting
            // process's. Once credentials have come, every later byte has
            // them.
            Some((0, _)) | None if !self.credited => return Ok(n),
            Some((0, _)) | None => "a request came without its sender's credentials (SO_PASSCRED)".to_string(),
            Some(from) => format!(
                "this connection was opened by process {} (uid {}); process {} (uid {}) may not use it: a child process connects anew",
                owner.0, owner.1, from.0, from.1
            ),
        };
        Err(io::Error::new(io::ErrorKind::PermissionDenied, NotOwner(why)))
    }
}

/// A connection used by a process other than the one that opened it.
#[derive(Debug)]
struct NotOwner(String);

impl std::fmt::Display for NotOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotOwner {}

/// Serves one connection: its hello, then its requests until the peer
/// closes it. `writer` writes to `stream`; `workers` gives the threads its
/// work goes to, once the hello has said how many requests the client
/// keeps in flight (at most `opts.cap`). The hello must come whole within
/// `opts.hello_timeout` (one deadline, not one per read: a client that
/// dribbles a byte at a time does not hold the connection longer). The
/// writer is closed before this returns, so that the last frame (an error
/// saying why the connection ends) leaves first.
pub(crate) fn serve_conn(
    stream: &UnixStream, writer: FrameWriter, opts: ConnOptions, workers: impl FnOnce(u32) -> io::Result<Arc<Workers>>,
) -> io::Result<()> {
    let mut reader = FromOwner { stream, owner: opts.owner, credited: false };
    let mut decoder = p::Decoder::new();
    // The read buffer's memory, charged to the client's user.
    let mut charge = match opts.account.charge(0) {
        Ok(c) => c,
        Err(_) => unreachable!("a charge of nothing fits"),
    };
    let say = |id: u64, code: ErrorCode, message: &str| {
        let mut frame = Vec::new();
        p::encode(&mut frame, kind::ERR, id, &[&p::error_body(code, message)]);
        writer.send(&frame);
    };
    // The hello comes first and fixes the in-flight bound; a peer that
    // never sends one is not kept waiting on forever.
    let hello_by = Instant::now() + opts.hello_timeout;
    let hello = (|| loop {
        if let Some(frame) = decoder.next_frame().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))? {
            return Ok(Some(frame));
        }
        let left = hello_by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no hello in time"));
        }
        stream.set_read_timeout(Some(left))?;
        charge_for_read(&mut charge, &decoder, opts.read_chunk).inspect_err(|e| {
            say(0, ErrorCode::Busy, &e.to_string());
        })?;
        if decoder.read_from(&mut reader, opts.read_chunk)? == 0 {
            return Ok(None);
        }
    })();
    let hello = match hello {
        Ok(Some(h)) => h,
        Ok(None) => {
            writer.close();
            return Ok(());
        }
        Err(e) => {
            if let Some(not) = e.get_ref().and_then(|e| e.downcast_ref::<NotOwner>()) {
                say(0, ErrorCode::NotAllowed, &not.0);
            }
            writer.close();
            return Err(e);
        }
    };
    let result = (|| {
        if hello.kind != kind::HELLO {
            say(hello.id, ErrorCode::Malformed, "expected a hello first");
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the peer did not start with a hello"));
        }
        let max = match p::parse_hello_request(&hello.body) {
            Ok(max) => max.min(opts.cap),
            Err(e) => {
                say(hello.id, ErrorCode::Malformed, &e.to_string());
                return Err(io::Error::new(io::ErrorKind::InvalidData, e));
            }
        };
        // An agent's client: a read that waits wakes at the frame
        // deadline, to cut off a frame that never ends (see read_loop).
        stream.set_read_timeout(opts.frame_timeout)?;
        let workers = workers(max).inspect_err(|e| say(hello.id, ErrorCode::Internal, &e.to_string()))?;
        Ok((max, workers))
    })();
    let (max, workers) = match result {
        Ok(v) => v,
        Err(e) => {
            writer.close();
            return Err(e);
        }
    };
    let conn = Arc::new(Conn {
        keys: RwLock::new(HashMap::new()),
        writer,
        in_flight: AtomicUsize::new(0),
        max_in_flight: AtomicUsize::new(max as usize),
        flags: opts.flags,
        service: opts.service,
        workers,
        client: opts.client,
        account: opts.account,
    });
    let mut hello_frame = Vec::new();
    p::encode(&mut hello_frame, kind::HELLO, 0, &[&p::hello_reply(std::process::id(), opts.flags)]);
    conn.writer.send(&hello_frame);
    let reading = Reading { chunk: opts.read_chunk, frame_timeout: opts.frame_timeout };
    let result = read_loop(&mut reader, &mut decoder, &mut charge, &reading, &conn);
    if let Err(e) = &result {
        if let Some(not) = e.get_ref().and_then(|e| e.downcast_ref::<NotOwner>()) {
            conn.err(0, ErrorCode::NotAllowed, &not.0);
        }
    }
    // The requests already read are answered before the writer closes:
    // an agent that drains (SIGTERM) stops reading and ends no request
    // it took. Bounded: every operation has a deadline.
    if result.is_ok() {
        let since = std::time::Instant::now();
        while conn.in_flight.load(Ordering::Acquire) > 0 && since.elapsed() < ANSWER_AFTER_EOF {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    conn.writer.close();
    result
}

/// Charges the read buffer's size for the next read to the client's user,
/// before it grows: a client whose frames would take its user (or the
/// server) past its memory bound is cut off, with the bound's name.
fn charge_for_read(charge: &mut Charge, decoder: &p::Decoder, chunk: usize) -> io::Result<()> {
    let need = decoder.size_for_next_read(chunk);
    charge.set(need).map_err(|over| io::Error::new(io::ErrorKind::OutOfMemory, over.to_string()))
}

/// How a connection's requests are read.
struct Reading {
    chunk: usize,
    frame_timeout: Option<Duration>,
}

fn read_loop(reader: &mut FromOwner<'_>, decoder: &mut p::Decoder, charge: &mut Charge, how: &Reading, conn: &Arc<Conn>) -> io::Result<()> {
    let mut frames = Vec::new();
    // When the frame still coming began to come.
    let mut began: Option<Instant> = None;
    loop {
        let bad = loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        if !frames.is_empty() || !decoder.partial() {
            began = decoder.partial().then(Instant::now);
        } else if began.is_none() {
            began = Some(Instant::now());
        }
        // A request that came alone may be answered on this thread; those
        // that came together go to the workers, which make them at once.
        let alone = frames.len() == 1 && bad.is_none();
        for frame in frames.drain(..) {
            dispatch(frame, conn, alone);
        }
        if let Some(e) = bad {
            // The stream cannot be resynchronised: say why, then close.
            conn.err(0, ErrorCode::Malformed, &e.to_string());
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        // After a large frame, the memory goes back.
        if !decoder.partial() && decoder.held() > 4 * how.chunk {
            decoder.shrink(how.chunk);
        }
        if let Err(e) = charge_for_read(charge, decoder, how.chunk) {
            conn.err(0, ErrorCode::Busy, &e.to_string());
            return Err(e);
        }
        match decoder.read_from(&mut *reader, how.chunk) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                // The frame deadline's wake-up (an agent's client only).
                if let (Some(limit), Some(since)) = (how.frame_timeout, began) {
                    if since.elapsed() >= limit {
                        let why = format!("a request began {} s ago and has not come whole", limit.as_secs_f64());
                        conn.err(0, ErrorCode::TimedOut, &why);
                        return Err(io::Error::new(io::ErrorKind::TimedOut, why));
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Serves one frame; `alone`: it was the only one of its read, so a short
/// operation may be made on this thread.
fn dispatch(frame: Frame, conn: &Arc<Conn>, alone: bool) {
    let id = frame.id;
    let workers = &conn.workers;
    // The service's table first: what it leaves out is refused before any
    // work (a kind no protocol defines is malformed).
    if !conn.service.table().requests.contains(&frame.kind) {
        return if kind::REQUESTS.contains(&frame.kind) {
            conn.err(id, ErrorCode::NotAllowed, conn.service.table().other_requests)
        } else {
            conn.err(id, ErrorCode::Malformed, &format!("unknown request kind {:#04x}", frame.kind))
        };
    }
    match frame.kind {
        kind::OP => {
            let (key_id, timeout, op) = match p::parse_op(&frame.body) {
                Ok(v) => v,
                Err(e) => return conn.err(id, ErrorCode::Malformed, &e.to_string()),
            };
            let in_flight = conn.in_flight.fetch_add(1, Ordering::AcqRel);
            let user_in_flight = conn.client.as_ref().map(|c| (c.share.in_flight.fetch_add(1, Ordering::AcqRel), c.limits.user_in_flight));
            if in_flight >= conn.max_in_flight.load(Ordering::Relaxed) {
                conn.done();
                return conn.err(id, ErrorCode::Busy, "more requests in flight than agreed in the hello");
            }
            if let Some((n, max)) = user_in_flight.filter(|(n, max)| n >= max) {
                conn.done();
                return conn.err(
                    id,
                    ErrorCode::Busy,
                    &format!("this user has {n} requests in flight over its connections, the most the agent takes ({max})"),
                );
            }
            let charged = JOB_MEMORY + op.input_len();
            if let Err(over) = conn.account.take(charged) {
                conn.done();
                return conn.err(id, ErrorCode::Busy, &over.to_string());
            }
            let key = conn.keys.read().unwrap_or_else(|e| e.into_inner()).get(&key_id).map(|h| h.key.clone());
            let Some(key) = key else {
                conn.account.give(charged);
                conn.done();
                return conn.err(id, ErrorCode::UnknownKey, &format!("no key with id {key_id}"));
            };
            if let Err(e) = key.check(&op) {
                conn.account.give(charged);
                conn.done();
                return conn.err(id, ErrorCode::Invalid, &e.to_string());
            }
            // A PKCS#11 token's key (held, not in this process's memory)
            // blocks for as long as its token takes: like RSA, it goes to
            // the RSA workers, never onto this reader and never ahead of the
            // EC signatures.
            let rsa = key.kind().is_rsa() || !key.is_local();
            let queue = if rsa { &workers.rsa } else { &workers.ec };
            let job = Job { conn: conn.clone(), id, key, op, deadline: Instant::now() + timeout, charged };
            // An EC or Ed25519 signature (13-50 µs) that came alone is made
            // here, on the connection's reader, when no EC job waits for the
            // workers:
            // handing it to a worker and its reply back costs as much again
            // on a busy machine (a tenth of a TLS handshake through the
            // agent). Under load (a queue, or several requests in one read)
            // the workers take them, in parallel; RSA (0.4 ms and more)
            // always goes to its own workers, so it never holds up the EC
            // requests behind it. An agent's client signs here only with
            // nothing else of its user's in flight: a user's many
            // connections would otherwise be as many signing threads, past
            // its share of the workers.
            let mine_alone = user_in_flight.is_none_or(|(n, _)| n == 0);
            // What the offload device signs goes to the workers, which hand
            // it over, so that it joins the device's batches.
            let offloaded = || workers.offload.as_ref().is_some_and(|o| o.route(&job.key, &job.op) == crate::sign::offload::Route::Device);
            if alone && !rsa && mine_alone && queue.is_empty() && !offloaded() {
                let reply = perform(&job);
                job.conn.writer.send(&reply);
                return;
            }
            match queue.push(conn.user(), job) {
                Ok(None) => {}
                Ok(Some(evicted)) => evicted.refuse_busy(),
                Err((full, job)) => {
                    let code = if full == Full::Closed { ErrorCode::Internal } else { ErrorCode::Busy };
                    job.conn.done();
                    job.conn.err(id, code, &format!("the signing queue: {full}"));
                }
            }
        }
        kind::LOAD => {
            let (key_id, source) = match p::parse_load_request(&frame.body) {
                Ok(v) => v,
                Err(e) => return conn.err(id, ErrorCode::Malformed, &e.to_string()),
            };
            let table = conn.service.table();
            if !table.sources.contains(&source.source()) {
                return conn.err(id, ErrorCode::NotAllowed, table.other_sources);
            }
            if let Some(why) = conn.key_room(key_id) {
                return conn.err(id, ErrorCode::Busy, &why);
            }
            let charged = JOB_MEMORY + source.held_bytes();
            if let Err(over) = conn.account.take(charged) {
                return conn.err(id, ErrorCode::Busy, &over.to_string());
            }
            // Each user's loads wait in a queue of its own, taken by the
            // time each user's loads have taken (fair_queue.rs): one user's
            // burst delays another's load by a load per loader at most,
            // and fills only its own share.
            let job = LoadJob { conn: conn.clone(), id, key_id, source, charged };
            match workers.load.push(conn.user(), job) {
                Ok(None) => {}
                Ok(Some(evicted)) => {
                    evicted.conn.err(evicted.id, ErrorCode::Busy, "key loads: another user needed the room in the queue");
                }
                Err((full, job)) => {
                    let code = if full == Full::Closed { ErrorCode::Internal } else { ErrorCode::Busy };
                    job.conn.err(id, code, &format!("key loads: {full}"));
                }
            }
        }
        kind::UNLOAD => match p::parse_unload_request(&frame.body) {
            Ok(key_id) => match conn.forget(key_id) {
                true => conn.ok(id, &[]),
                false => conn.err(id, ErrorCode::UnknownKey, &format!("no key with id {key_id}")),
            },
            Err(e) => conn.err(id, ErrorCode::Malformed, &e.to_string()),
        },
        kind::STATUS => {
            let (uid, gid) = sys::ids();
            let status = p::Status {
                pid: std::process::id(),
                uid,
                gid,
                // Read again: a privilege drop may have changed it.
                flags: if sys::is_dumpable() { conn.flags & !p::flags::NOT_DUMPABLE } else { conn.flags | p::flags::NOT_DUMPABLE },
                keys: conn.keys.read().unwrap_or_else(|e| e.into_inner()).len() as u32,
                in_flight: conn.in_flight.load(Ordering::Relaxed) as u32,
            };
            conn.ok(id, &status.encode());
        }
        other => match conn.service.own_request(other, &frame.body) {
            Ok(body) => conn.ok(id, &body),
            Err((code, message)) => conn.err(id, code, &message),
        },
    }
}

/// How long a connection whose peer stopped sending waits for the
/// answers to what it had already read.
const ANSWER_AFTER_EOF: Duration = Duration::from_secs(5);

/// How long the reader waits for a hello before giving up on a peer that
/// never speaks.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
