//! The key process: holds the private keys and answers operations over one
//! connection.
//!
//! One reader thread decodes requests and hands each operation to the pool
//! of its class (RSA, or EC/Ed25519), so a queue of RSA signatures never
//! delays an ECDSA reply, and each key load to a small pool of loaders.
//! Every queue is bounded (count, and bytes for operations): past a bound
//! the peer is told `busy`. Workers write their replies through a combining
//! writer: at low load a reply goes out at once from the worker, under load
//! replies that finish while one write is under way leave in the next
//! single write, and an EC worker that already has its next job queued
//! holds its reply back (400 µs, 32 replies at most) to send it with the
//! next. Measured with `keyfence bench sign --case ecdsa-p256-sha256`,
//! holding back took the key process's CPU per P-256 signature from 1.38x
//! to 1.18x the in-process engine's (at 100 µs and 16); 400 µs and 32 took
//! the isolated path from about 0.77x to 0.81x raw BoringSSL per CPU-second
//! (1 ms and 64 was worse again: the client then waits on held replies).

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use super::budget::{Account, Charge, Pool};
use super::fair_queue::{FairQueue, Full};
use super::protocol::{self as p, kind, ErrorCode, Frame, KeySource};
use super::sys;
use super::writer::FrameWriter;
use crate::sign::threads::Joined;
use crate::sign::types::{Operation, SignError, TokenFailure};
use crate::sign::PrivateKey;

/// How the key process runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeOptions {
    /// Threads signing with RSA keys.
    pub rsa_threads: usize,
    /// Threads signing with EC and Ed25519 keys.
    pub ec_threads: usize,
    /// Refuse a peer that is not the parent process running as the same
    /// user (always on in `keyfence-key-process`; tests that serve in-process turn
    /// it off).
    pub check_peer: bool,
    /// Install the sandbox (the key process's `main` does; a test serving
    /// in its own process must not, as it covers every thread).
    pub sandbox: bool,
    /// The key process's `main` closed what it inherited
    /// (`flags::INHERITED_CLOSED`).
    pub inherited_closed: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        ServeOptions { rsa_threads: cores, ec_threads: cores, check_peer: true, sandbox: false, inherited_closed: false }
    }
}

/// Opens the envelopes an agent's clients name, with the agent's own
/// machine key and store (the agent's side of [`KeySource::AgentEnvelope`]).
pub(crate) trait EnvelopeOpener: Send + Sync {
    /// The private key in `envelope`, or why not (naming no secret).
    fn open(&self, envelope: &[u8]) -> Result<PrivateKey, String>;

    /// The key `client` names by PKCS#11 URI, on the module and with the
    /// PIN this server was started with, if its grants allow that client
    /// the key; refused when it was started with none.
    fn load_pkcs11(&self, uri: &str, client: &Client) -> Result<PrivateKey, SignError>;
}

/// An agent's client as its connection sees it: who it is, and its
/// user's share of the agent.
pub(crate) struct Client {
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
        UserShare {
            in_flight: AtomicUsize::new(0),
            keys: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            memory: Pool::new(memory),
        }
    }
}

/// An agent's bounds per connection and per user.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) user_in_flight: usize,
    pub(crate) connection_keys: usize,
    pub(crate) user_keys: usize,
}

/// What a connection may ask of the server it speaks to.
#[derive(Clone)]
pub(crate) enum Role {
    /// The key process: one client, its parent, which names the sources of
    /// its keys and may have it drop privileges.
    KeyProcess,
    /// An agent: many clients, each of which may only have envelopes
    /// opened with the agent's own machine key, and signs with them.
    Agent(Arc<dyn EnvelopeOpener>),
}

struct Job {
    conn: Arc<Conn>,
    id: u64,
    key: Arc<PrivateKey>,
    op: Operation,
    deadline: Instant,
    /// The request's memory, its user's until the job is dropped
    /// (replied to).
    charged: usize,
}

struct LoadJob {
    conn: Arc<Conn>,
    id: u64,
    key_id: u64,
    source: KeySource,
    charged: usize,
}

impl Drop for Job {
    fn drop(&mut self) {
        self.conn.account.give(self.charged);
    }
}

impl Drop for LoadJob {
    fn drop(&mut self) {
        self.conn.account.give(self.charged);
    }
}

/// What a queued request costs beside its input (the job, its place in
/// the queue), in the memory its user is charged.
const JOB_MEMORY: usize = 256;

/// What a key held for a client costs (AWS-LC's key with its Montgomery
/// contexts, the handle and its entry), charged to the client's user;
/// measured with RSS over 10,000 keys of each kind and rounded up.
fn key_memory(kind: crate::sign::KeyKind) -> usize {
    match kind {
        crate::sign::KeyKind::Rsa { bits } => 2048 + 2 * bits as usize,
        _ => 2048,
    }
}

/// The bytes a key source holds (an envelope, a URI, key bytes).
fn source_len(source: &KeySource) -> usize {
    match source {
        KeySource::AgentEnvelope(b) | KeySource::EnvelopeBytes { envelope: b, .. } => b.len(),
        KeySource::Bytes(b) => b.len(),
        KeySource::Pkcs11(uri) => uri.len(),
        KeySource::EnvelopeObjects { envelope, objects, .. } => {
            envelope.len() + objects.iter().map(|(n, o)| n.len() + o.len()).sum::<usize>()
        }
        KeySource::File(_) | KeySource::Envelope { .. } => 0,
    }
}

/// Threads that load keys: an envelope costs a CP-ABE decryption, so
/// loads run off the reader, but on a fixed pool, never a thread per
/// request.
const LOADERS: usize = 2;
/// Loads waiting for a loader at most, for one client (a key process's
/// parent, or one user of an agent) and in all; more are refused as
/// busy, and the client waits and asks again (`Supervisor`).
pub(crate) const MAX_QUEUED_LOADS: (usize, usize) = (256, 4096);
/// The memory a key process holds for its one client's requests at most
/// (`budget`): `max_in_flight` bounds their count, this their bytes
/// (4096 requests of 1 MiB each would be 4 GiB).
pub(crate) const KEY_PROCESS_MEMORY: usize = 64 << 20;

/// Room in each queue: requests per user, and in all.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Room {
    pub(crate) per_user: usize,
    pub(crate) total: usize,
}

/// The signing and loading threads, and the queues to them: one set per
/// key process, or one for all of an agent's connections. Each queue
/// takes its users in turn by the time their work has taken
/// (`fair_queue`), so one user's backlog of slow signatures never delays
/// another user's.
pub(crate) struct Workers {
    rsa: Arc<FairQueue<Job>>,
    ec: Arc<FairQueue<Job>>,
    load: Arc<FairQueue<LoadJob>>,
    threads: Joined,
}

impl Workers {
    /// Starts `options`' signing threads and the loaders, with `ops` room
    /// in each signing queue and `loads` for key loads waiting.
    pub(crate) fn start(options: &ServeOptions, ops: Room, loads: Room) -> io::Result<Arc<Workers>> {
        let rsa = Arc::new(FairQueue::new(ops.per_user, ops.total));
        let ec = Arc::new(FairQueue::new(ops.per_user, ops.total));
        let load = Arc::new(FairQueue::new(loads.per_user, loads.total));
        let mut threads = Joined::new();
        for (queue, n, name) in [(&rsa, options.rsa_threads, "rsa"), (&ec, options.ec_threads, "ec")] {
            for i in 0..n.max(1) {
                let queue = queue.clone();
                let defer = name == "ec";
                threads.spawn(format!("key-process-{name}-{i}"), move || work(&queue, defer))?;
            }
        }
        for i in 0..LOADERS {
            let queue = load.clone();
            threads.spawn(format!("key-process-load-{i}"), move || load_keys(&queue))?;
        }
        Ok(Arc::new(Workers { rsa, ec, load, threads }))
    }
}

impl Drop for Workers {
    /// Closes the queues, so the threads end once they are empty, and
    /// joins them.
    fn drop(&mut self) {
        self.rsa.close();
        self.ec.close();
        self.load.close();
        self.threads.join();
    }
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
    role: Role,
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
    fn ok(&self, id: u64, body: &[u8]) {
        let mut frame = Zeroizing::new(Vec::with_capacity(p::HEADER + 4 + body.len()));
        p::encode(&mut frame, kind::OK, id, &[body]);
        self.writer.send(&frame);
    }

    fn err(&self, id: u64, code: ErrorCode, message: &str) {
        let mut frame = Vec::new();
        p::encode(&mut frame, kind::ERR, id, &[&p::error_body(code, message)]);
        self.writer.send(&frame);
    }

    /// The user whose queue its work waits in (the key process's one
    /// client is 0).
    fn user(&self) -> u32 {
        self.client.as_ref().map_or(0, |c| c.uid)
    }

    /// A request is answered: it is in flight no more.
    fn done(&self) {
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
    fn keep(&self, key_id: u64, key: PrivateKey) -> Result<(), String> {
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

/// Hardens the process and serves `stream` until the peer closes it.
///
/// Hardening: `PR_SET_DUMPABLE` 0 and `RLIMIT_CORE` 0 so that neither a
/// core dump nor a same-user debugger can read the keys; with
/// [`ServeOptions::check_peer`], the peer must be the parent process and
/// the same user (`SO_PEERCRED`).
///
/// # Errors
/// The I/O error that ended the connection, or a refused peer or hello.
pub fn serve(stream: UnixStream, options: &ServeOptions) -> io::Result<()> {
    let mut flags = 0;
    let mut owner = None;
    if options.check_peer {
        // Every request must come from the parent itself, not from a child
        // that inherited its end of the pair.
        owner = Some(sys::check_peer_is_parent(&stream)?);
        flags |= p::flags::PEER_CHECKED;
        sys::pass_credentials(&stream)?;
    }
    if sys::set_not_dumpable().is_ok() {
        flags |= p::flags::NOT_DUMPABLE;
    }
    if sys::disable_core_dumps().is_ok() {
        flags |= p::flags::NO_CORE;
    }
    if options.inherited_closed {
        flags |= p::flags::INHERITED_CLOSED;
    }
    // Before the first request, so no key is loaded outside it. A layer
    // the kernel lacks leaves its flag off: the client says so.
    if options.sandbox {
        let installed = super::sandbox::install();
        if installed.syscalls {
            flags |= p::flags::SANDBOXED;
        }
        if installed.files_abi.is_some() {
            flags |= p::flags::FILES_CONFINED;
        }
        if installed.other_thread {
            flags |= p::flags::OTHER_THREAD;
        }
    }
    // The queues are sized by the hello (no queue can hold more than the
    // in-flight bound the reader enforces; bounded anyway, so that a
    // mistake there shows as `busy`, not memory): the workers start when
    // it has come.
    let stream = Arc::new(stream);
    let writer = FrameWriter::new(stream.try_clone()?)?;
    let conn = ConnOptions {
        flags,
        role: Role::KeyProcess,
        client: None,
        cap: p::MAX_IN_FLIGHT,
        hello_timeout: HELLO_TIMEOUT,
        frame_timeout: None,
        account: Account::single(KEY_PROCESS_MEMORY),
        read_chunk: 64 * 1024,
        owner,
    };
    serve_conn(&stream, writer, conn, |max| {
        let ops = Room { per_user: max as usize, total: max as usize };
        Workers::start(options, ops, Room { per_user: MAX_QUEUED_LOADS.0, total: MAX_QUEUED_LOADS.1 })
    })
}

/// How one connection is served.
pub(crate) struct ConnOptions {
    /// The hardening flags its hello reply confirms.
    pub(crate) flags: u32,
    /// What it may ask.
    pub(crate) role: Role,
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
    stream: &UnixStream,
    writer: FrameWriter,
    opts: ConnOptions,
    workers: impl FnOnce(u32) -> io::Result<Arc<Workers>>,
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
        charge_for_read(&mut charge, &decoder, opts.read_chunk).map_err(|e| {
            say(0, ErrorCode::Busy, &e.to_string());
            e
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
        let workers = workers(max)?;
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
        role: opts.role,
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

fn read_loop(
    reader: &mut FromOwner<'_>,
    decoder: &mut p::Decoder,
    charge: &mut Charge,
    how: &Reading,
    conn: &Arc<Conn>,
) -> io::Result<()> {
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
    match frame.kind {
        kind::OP => {
            let (key_id, timeout, op) = match p::parse_op(&frame.body) {
                Ok(v) => v,
                Err(e) => return conn.err(id, ErrorCode::Malformed, &e.to_string()),
            };
            let in_flight = conn.in_flight.fetch_add(1, Ordering::AcqRel);
            let user_in_flight =
                conn.client.as_ref().map(|c| (c.share.in_flight.fetch_add(1, Ordering::AcqRel), c.limits.user_in_flight));
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
            if alone && !rsa && mine_alone && queue.is_empty() {
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
            if matches!(conn.role, Role::Agent(_)) && !matches!(source, KeySource::AgentEnvelope(_) | KeySource::Pkcs11(_)) {
                return conn.err(
                    id,
                    ErrorCode::NotAllowed,
                    "an agent loads only envelopes, which it opens with its own machine key and store, and keys on the PKCS#11 token it was started with; it reads no file, path or key bytes a client names",
                );
            }
            if let Some(why) = conn.key_room(key_id) {
                return conn.err(id, ErrorCode::Busy, &why);
            }
            let charged = JOB_MEMORY + source_len(&source);
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
        kind::DROP_PRIVILEGES if matches!(conn.role, Role::Agent(_)) => {
            conn.err(id, ErrorCode::NotAllowed, "an agent's privileges are its own: its clients cannot change them")
        }
        kind::DROP_PRIVILEGES => {
            match p::parse_drop_privileges_request(&frame.body) {
                // Changing credentials can reset the dumpable flag: set it
                // again before answering.
                Ok((uid, gid)) => match sys::drop_privileges(uid, gid).and_then(|()| sys::set_not_dumpable()) {
                    Ok(()) => conn.ok(id, &[]),
                    Err(e) => conn.err(id, ErrorCode::Privileges, &e.to_string()),
                },
                Err(e) => conn.err(id, ErrorCode::Malformed, &e.to_string()),
            }
        }
        #[cfg(feature = "testing")]
        kind::TEST_CREATE_FILE => {
            use std::os::unix::ffi::OsStrExt;
            let path = Path::new(std::ffi::OsStr::from_bytes(&frame.body));
            let created = std::fs::OpenOptions::new().write(true).create_new(true).open(path).is_ok();
            conn.ok(id, &[u8::from(created)]);
        }
        #[cfg(feature = "testing")]
        kind::TEST_FORBIDDEN_CALL => {
            // `socket`: the sandbox kills the process here.
            let survived = std::net::UdpSocket::bind("127.0.0.1:0").is_ok();
            conn.ok(id, &[u8::from(survived)]);
        }
        kind::STATUS => {
            let (uid, gid) = sys::ids();
            let status = p::Status {
                pid: std::process::id(),
                uid,
                gid,
                // Read again: a privilege drop may have changed it.
                flags: if sys::is_dumpable() {
                    conn.flags & !p::flags::NOT_DUMPABLE
                } else {
                    conn.flags | p::flags::NOT_DUMPABLE
                },
                keys: conn.keys.read().unwrap_or_else(|e| e.into_inner()).len() as u32,
                in_flight: conn.in_flight.load(Ordering::Relaxed) as u32,
            };
            conn.ok(id, &status.encode());
        }
        other => conn.err(id, ErrorCode::Malformed, &format!("unknown request kind {other:#04x}")),
    }
}

/// The wire code of a PKCS#11 token's failure that has one, so the
/// client's caller sees `TOKEN_UNAVAILABLE` or `TOKEN_LOGIN` as it would
/// without the key process.
fn token_code(e: &SignError) -> Option<ErrorCode> {
    match e {
        SignError::Token { failure: TokenFailure::Unavailable, .. } => Some(ErrorCode::TokenUnavailable),
        SignError::Token { failure: TokenFailure::Login, .. } => Some(ErrorCode::TokenLogin),
        _ => None,
    }
}

/// A loader thread: loads keys until the queue closes.
fn load_keys(queue: &FairQueue<LoadJob>) {
    let mut done = None;
    while let Some((job, ticket)) = queue.next(done.take(), true) {
        let started = Instant::now();
        let LoadJob { conn, id, key_id, source, .. } = &job;
        let (conn, id, key_id) = (conn.clone(), *id, *key_id);
        // A loader that panics (a module's bug, a parser's) answers this
        // request and stays: two loader threads serve every client.
        let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &source {
            // The code goes first in the message (`INVALID_ARGUMENT: ...`),
            // so the client reports the load as it would in process.
            KeySource::Pkcs11(uri) => match (&conn.role, &conn.client) {
                (Role::KeyProcess, _) => crate::sign::pkcs11::load(uri, &crate::sign::pkcs11::Pkcs11Settings::from_env()),
                (Role::Agent(opener), Some(client)) => opener.load_pkcs11(uri, client),
                (Role::Agent(_), None) => Err(SignError::InvalidArgument("an agent's connection without a client".into())),
            }
            .map_err(|e| (token_code(&e).unwrap_or(ErrorCode::Load), format!("{}: {e}", e.code().name()))),
            _ => load(&source, &conn.role).map_err(|msg| (ErrorCode::Load, msg)),
        }))
        .unwrap_or_else(|_| Err((ErrorCode::Internal, "loading the key panicked".to_string())));
        match loaded {
            Ok(key) => match key.public_key_der().map(|der| p::loaded_reply(key.kind(), &der)) {
                Ok(body) => match conn.keep(key_id, key) {
                    Ok(()) => conn.ok(id, &body),
                    Err(why) => conn.err(id, ErrorCode::Busy, &why),
                },
                Err(e) => conn.err(id, ErrorCode::Load, &e.to_string()),
            },
            Err((code, msg)) => conn.err(id, code, &msg),
        }
        drop(job);
        done = Some((ticket, started.elapsed()));
    }
}

/// Loads a key from its source; the message names the source, never its
/// contents.
fn load(source: &KeySource, role: &Role) -> Result<PrivateKey, String> {
    match source {
        KeySource::AgentEnvelope(envelope) => match role {
            Role::Agent(opener) => opener.open(envelope),
            Role::KeyProcess => Err("a key process opens an envelope only with the machine key and store its client names".into()),
        },
        KeySource::File(path) => {
            let bytes = Zeroizing::new(std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?);
            PrivateKey::from_bytes(&bytes).map_err(|e| format!("{}: {e}", path.display()))
        }
        // The client reads the store and sends what opening needs: a key
        // process names no store, connects to none, reads none of its files.
        KeySource::Envelope { .. } | KeySource::EnvelopeBytes { .. } => {
            Err("a key process opens no store: its client sends the envelope with the store's objects (a client older than this key process)".into())
        }
        KeySource::EnvelopeObjects { machine_key, envelope, objects } => open_envelope(machine_key, envelope, objects),
        KeySource::Bytes(bytes) => PrivateKey::from_bytes(bytes).map_err(|e| e.to_string()),
        KeySource::Pkcs11(_) => Err("a PKCS#11 key is loaded by the loader's token path".into()),
    }
}

/// Opens `envelope` with the machine key file and the store's objects the
/// client sent, each verified as the machine key's authority's. This is
/// the one place the secret machine key is decoded on the isolated path:
/// the key process's loader, never its client.
fn open_envelope(machine_key: &Path, envelope: &[u8], objects: &[(String, Vec<u8>)]) -> Result<PrivateKey, String> {
    use crate::wrap::{Machine, MachineKey, NewestLists};
    let mk = Zeroizing::new(std::fs::read(machine_key).map_err(|e| format!("reading {}: {e}", machine_key.display()))?);
    let mk = MachineKey::from_bytes(&mk).map_err(|e| format!("{}: {e}", machine_key.display()))?;
    let (floor, objects): (Vec<_>, Vec<_>) = objects.iter().cloned().partition(|(name, _)| name == p::FLOOR_OBJECT);
    let machine = Machine::with_objects(mk, &objects).map_err(|e| e.to_string())?;
    // The newest lists this machine accepted before, which its client
    // keeps (the key process writes no file): the store's objects must not
    // go back on them.
    if let Some((_, bytes)) = floor.first() {
        let kept = NewestLists::from_bytes(bytes).map_err(|e| e.to_string())?;
        machine.require_kept(&kept).map_err(|e| e.to_string())?;
    }
    let secret = machine.open(envelope).map_err(|e| format!("opening the envelope: {e}"))?;
    PrivateKey::from_bytes(&secret).map_err(|e| format!("the key in the envelope: {e}"))
}

fn work(queue: &FairQueue<Job>, defer: bool) {
    let mut next: Option<(Job, super::fair_queue::Ticket)> = None;
    // The job last made, to charge to its user when the next is taken.
    let mut done: Option<super::fair_queue::Done> = None;
    // When the oldest reply held back was queued, and how many are held.
    let mut held: Option<(Instant, usize)> = None;
    loop {
        let (job, ticket) = match next.take() {
            Some(taken) => taken,
            None => match queue.next(done.take(), true) {
                Some(taken) => taken,
                None => break,
            },
        };
        let started = Instant::now();
        let reply = perform(&job);
        done = Some((ticket, started.elapsed()));
        // With another job already queued for the same connection, this
        // reply can wait for the next one and both leave in one write:
        // fewer system calls here and fewer wake-ups of the peer's reader
        // under load. The wait is bounded in time and count. Never for
        // RSA: its operations are long enough that even one wait would
        // show.
        let hold = defer && held.is_none_or(|(since, n)| n < MAX_HELD && since.elapsed() < MAX_HOLD);
        if hold {
            if let Some(following) = queue.next(done.take(), false) {
                if Arc::ptr_eq(&following.0.conn, &job.conn) {
                    job.conn.writer.queue(&reply);
                    held = Some(held.map_or((Instant::now(), 1), |(since, n)| (since, n + 1)));
                } else {
                    // Another client's: this one's replies leave now.
                    job.conn.writer.send(&reply);
                    held = None;
                }
                next = Some(following);
                continue;
            }
        }
        job.conn.writer.send(&reply);
        held = None;
    }
}

/// Replies one worker holds back at most before writing them. The hold
/// never delays a reply when nothing else is queued, so one request at a
/// time is answered at once; under load it adds at most this to a reply's
/// wait, next to a queue already that long or longer...
const MAX_HELD: usize = 32;
/// ...and the longest the first of them waits for company (checked before
/// each job, so it can wait this plus one operation: a P-384 signature,
/// which shares the EC pool, is about 0.8 ms).
const MAX_HOLD: Duration = Duration::from_micros(400);

impl Job {
    /// Answers a job that lost its place in the queue to another user's.
    fn refuse_busy(self) {
        self.conn.done();
        self.conn.err(self.id, ErrorCode::Busy, "the signing queue: another user needed the room (this user has the most waiting)");
    }
}

/// Runs one job; returns its reply frame.
fn perform(job: &Job) -> Zeroizing<Vec<u8>> {
    let result = if Instant::now() >= job.deadline {
        Err((ErrorCode::TimedOut, "the deadline passed before the operation started".to_string()))
    } else {
        match job.key.perform(&job.op) {
            Ok(out) => Ok(out),
            Err(SignError::Crypto { reason, .. }) => Err((ErrorCode::Crypto, reason)),
            Err(e) => Err((token_code(&e).unwrap_or(ErrorCode::Invalid), e.to_string())),
        }
    };
    job.conn.done();
    let mut frame = Zeroizing::new(Vec::new());
    match result {
        Ok(out) => {
            frame.reserve(p::HEADER + 4 + out.len());
            p::encode(&mut frame, kind::OK, job.id, &[&out]);
        }
        Err((code, msg)) => p::encode(&mut frame, kind::ERR, job.id, &[&p::error_body(code, &msg)]),
    }
    frame
}

/// How long the reader waits for a hello before giving up on a peer that
/// never speaks.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
