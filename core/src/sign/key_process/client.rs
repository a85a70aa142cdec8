//! The client side of one connection to a key process: request ids, what
//! waits for each reply, the in-flight bound, and the reader that delivers
//! replies in whatever order they come and fails everything in flight
//! when the connection ends. Starting and restarting the process is the
//! supervisor's.

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use zeroize::Zeroizing;

use super::protocol::{self as p, kind, ErrorCode, Frame, LoadBody};
use super::server::writer::FrameWriter;
use super::KeySource;
use crate::sign::batch;
use crate::sign::held_key::Answer;
use crate::sign::types::{BackendFailure, CryptoOp, Operation, Output, SignError, TokenFailure};
use crate::sign::wire;

/// The backend name in errors and metrics.
pub(super) const NAME: &str = "key-process";

pub(super) fn backend_error(failure: BackendFailure, reason: impl Into<String>) -> SignError {
    SignError::backend(NAME, failure, reason)
}

/// `source` as its holder is sent it. To a key process, an envelope
/// becomes the envelope with the store's objects opening it reads,
/// fetched here, so that the key process never names a store (a
/// directory it would open, an etcd cluster it would connect to); other
/// sources go as they are. To an agent, only an envelope (which the agent
/// opens with its own machine key and store, whatever `source` names) and
/// a token key. Called at every load and again when a restart replays the
/// loads, so the objects are the store's of that moment.
///
/// # Errors
/// [`SignError::InvalidArgument`] for a source the holder does not take;
/// [`SignError::Backend`] (`Refused`) when the store's objects cannot be
/// read.
pub(super) fn for_the_wire(source: &KeySource, agent: bool) -> Result<LoadBody, SignError> {
    let (envelope, machine) = match (source, agent) {
        (KeySource::Envelope { envelope, .. }, true) => return Ok(LoadBody::AgentEnvelope(envelope.clone())),
        (KeySource::Pkcs11(uri), _) => return Ok(LoadBody::Pkcs11(uri.clone())),
        (_, true) => {
            return Err(SignError::InvalidArgument(
                "an engine whose keys are in an agent loads envelopes only, which the agent opens, and token keys: the agent reads no file or key bytes of its clients".into(),
            ))
        }
        (KeySource::File(path), false) => return Ok(LoadBody::File(path.clone())),
        (KeySource::Bytes(bytes), false) => return Ok(LoadBody::Bytes(bytes.clone())),
        (KeySource::Envelope { envelope, machine: Some(machine) }, false) => (envelope, machine),
        (KeySource::Envelope { machine: None, .. }, false) => {
            return Err(SignError::InvalidArgument(
                "an envelope needs the machine key and the store that open it: only an engine whose keys are in a key agent, which opens it with its own, loads one without them".into(),
            ))
        }
    };
    let (store, machine_key) = (&machine.store, &machine.machine_key);
    let refused = |e: String| backend_error(BackendFailure::Refused, e);
    let parsed = crate::wrap::Envelope::parse(envelope).map_err(|e| refused(format!("the envelope: {e}")))?;
    let dir = crate::wrap::open_store_path(store).map_err(|e| refused(format!("{}: {e}", store.display())))?;
    // The store's copy when the secret was re-wrapped since this envelope
    // was written (a rotated policy key, soon retired): the same secret.
    let (parsed, envelope) = match crate::wrap::current_envelope(&*dir, &parsed) {
        Ok(Some(current)) => {
            let bytes = current.to_bytes().to_vec();
            (current, bytes)
        }
        _ => (parsed, envelope.clone()),
    };
    let mut objects = crate::wrap::objects_for_opening(&*dir, &parsed).map_err(|e| refused(format!("{}: {e}", store.display())))?;
    // The key process may run in another directory.
    let machine_key = std::path::absolute(machine_key).unwrap_or_else(|_| machine_key.clone());
    // The floor this machine kept, for the key process to require.
    if let Some(path) = crate::wrap::newest_lists_beside(&machine_key) {
        match std::fs::read(&path) {
            Ok(bytes) => objects.push((p::FLOOR_OBJECT.to_string(), bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(refused(format!("the newest lists kept in {}: {e}", path.display()))),
        }
    }
    Ok(LoadBody::EnvelopeObjects { machine_key, envelope, objects })
}

/// After the key process opened an envelope from `wire`'s objects, keeps
/// the lists it accepted beside the machine key (`KEY.newest`), as an
/// in-process machine would: the key process writes no file, and the next
/// load (in any process of this machine) requires them.
///
/// # Errors
/// [`SignError::Backend`] (`Refused`) when the file cannot be written or
/// locked: a floor is never skipped in silence.
pub(super) fn keep_floor(wire: &LoadBody) -> Result<(), SignError> {
    let LoadBody::EnvelopeObjects { machine_key, objects, .. } = wire else { return Ok(()) };
    let Some(path) = crate::wrap::newest_lists_beside(machine_key) else { return Ok(()) };
    let refused = |e: String| backend_error(BackendFailure::Refused, e);
    let find = |name: &str| objects.iter().find(|(n, _)| n == name).map(|(_, b)| b.as_slice());
    // Only the public part: the authority that signs the lists.
    let key = zeroize::Zeroizing::new(std::fs::read(machine_key).map_err(|e| refused(format!("reading {}: {e}", machine_key.display())))?);
    let info = crate::wrap::MachineInfo::from_key_bytes(&key).map_err(|e| refused(format!("{}: {e}", machine_key.display())))?;
    crate::wrap::record_lists(&path, *info.authority(), find(crate::wrap::GENERATIONS), find(crate::wrap::REVOKED))
        .map_err(|e| refused(e.to_string()))
}

/// What waits for a reply.
pub(super) enum Pending {
    /// An engine operation.
    Op(Answer),
    /// A synchronous operation; holds a slot.
    OpCall(Sender<Result<Frame, SignError>>),
    /// A synchronous request other than an operation (load, status).
    Call(Sender<Result<Frame, SignError>>),
}

impl Pending {
    /// Answers with an error.
    pub(super) fn fail(self, e: SignError) {
        match self {
            Pending::Op(answer) => answer.send(Err(e)),
            Pending::OpCall(tx) | Pending::Call(tx) => {
                let _ = tx.send(Err(e));
            }
        }
    }
}

/// One running key process and the connection to it.
pub(super) struct Conn {
    pub(super) pid: u32,
    pub(super) flags: u32,
    /// The key process this connection started; `None` for an agent's
    /// connection (the agent is not ours to end).
    pub(super) child: Mutex<Option<Child>>,
    /// Whether the peer is an agent (not a key process of ours), for
    /// messages: a user of the agent never started a key process.
    to_agent: bool,
    pub(super) writer: FrameWriter,
    pending: Mutex<HashMap<u64, Pending>>,
    pub(super) dead: AtomicBool,
    /// Its owner ended it ([`Conn::close_by_owner`]): the engine that owns
    /// the key process (or agent connection) was closed, so what it cannot
    /// do now fails with [`SignError::ShutDown`], not as a crash.
    closed_by_owner: AtomicBool,
    free_slots: Mutex<u32>,
    slot_freed: Condvar,
    next_request: AtomicU64,
}

impl Conn {
    pub(super) fn new(pid: u32, flags: u32, child: Option<Child>, writer: FrameWriter, max_in_flight: u32) -> Self {
        Conn {
            pid,
            flags,
            to_agent: child.is_none(),
            child: Mutex::new(child),
            writer,
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            closed_by_owner: AtomicBool::new(false),
            free_slots: Mutex::new(max_in_flight),
            slot_freed: Condvar::new(),
            next_request: AtomicU64::new(1),
        }
    }

    pub(super) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Marks the connection as ended by its owner, before it is ended:
    /// the operations in flight then, and any tried on it later, fail
    /// with [`SignError::ShutDown`].
    pub(super) fn close_by_owner(&self) {
        self.closed_by_owner.store(true, Ordering::Release);
    }

    /// The error of an operation the dead connection cannot run:
    /// [`SignError::ShutDown`] when its owner ended it, else a
    /// [`BackendFailure::Died`] error saying `reason`.
    /// Why this connection can carry nothing more, naming its peer.
    fn gone(&self) -> String {
        if self.to_agent {
            format!("the connection to the agent (pid {}) ended", self.pid)
        } else {
            format!("the key process (pid {}) died", self.pid)
        }
    }

    /// Why a frame could not be written, naming the peer.
    fn unwritable(&self) -> String {
        let peer = if self.to_agent { "the agent" } else { "the key process" };
        format!("cannot write to {peer} (pid {})", self.pid)
    }

    fn dead_error(&self, reason: impl Into<String>) -> SignError {
        if self.closed_by_owner.load(Ordering::Acquire) {
            SignError::ShutDown
        } else {
            backend_error(BackendFailure::Died, reason)
        }
    }

    fn pending(&self) -> MutexGuard<'_, HashMap<u64, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// Registers `pending` under `id` unless the connection is dead.
    fn register(&self, id: u64, pending: Pending) -> Result<(), Pending> {
        let mut map = self.pending();
        if self.is_dead() {
            return Err(pending);
        }
        map.insert(id, pending);
        Ok(())
    }

    /// Whether a request slot is free now (for admission on the
    /// submitting thread).
    pub(super) fn has_room(&self) -> bool {
        *self.free_slots.lock().unwrap_or_else(|e| e.into_inner()) > 0
    }

    fn acquire_slot(&self, deadline: Instant) -> bool {
        let mut free = self.free_slots.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.is_dead() {
                return false;
            }
            if *free > 0 {
                *free -= 1;
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            free = self.slot_freed.wait_timeout(free, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn release_slot(&self) {
        *self.free_slots.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.slot_freed.notify_one();
    }

    /// Sends a request and waits for its reply frame.
    /// Sends a key load and waits for its reply, asking again while the
    /// key process or agent answers `busy` (its loaders' queue is full: a
    /// burst of loads, such as every worker of a server replaying its keys
    /// after an agent restart) until `timeout`, backing off from 10 ms to
    /// 200 ms. A load is a setup step, not a signature: it waits for room
    /// rather than failing the key for good.
    ///
    /// # Errors
    /// As [`Conn::call`]; the last `busy` when `timeout` passes.
    pub(super) fn load(&self, body: &[u8], timeout: Duration) -> Result<Frame, SignError> {
        let until = Instant::now() + timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.call(kind::LOAD, body, left.max(Duration::from_millis(1))) {
                Err(SignError::Backend { failure: BackendFailure::NoRoom, .. }) if Instant::now() + pause < until && !self.is_dead() => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                other => return other,
            }
        }
    }

    pub(super) fn call(&self, kind: u8, body: &[u8], timeout: Duration) -> Result<Frame, SignError> {
        // A frame over the limit would end the connection (and everything
        // in flight on it) at the key process's reader.
        if p::HEADER + body.len() > p::MAX_FRAME {
            let max = p::MAX_FRAME - p::HEADER;
            let what = if kind == kind::LOAD { "the key load request" } else { "the request" };
            return Err(SignError::InputTooLarge { what, len: body.len(), max, hint: "" });
        }
        let id = self.next_id();
        let (tx, rx) = crossbeam_channel::bounded(1);
        if self.register(id, Pending::Call(tx)).is_err() {
            return Err(self.dead_error(self.gone()));
        }
        let mut frame = Zeroizing::new(Vec::with_capacity(p::HEADER + 4 + body.len()));
        p::encode(&mut frame, kind, id, &[body]);
        if !self.writer.send(&frame) {
            self.pending().remove(&id);
            return Err(self.dead_error(self.unwritable()));
        }
        let reply = match rx.recv_timeout(timeout) {
            Ok(r) => r?,
            Err(_) => {
                self.pending().remove(&id);
                return Err(SignError::TimedOut { timeout });
            }
        };
        if reply.kind == kind::ERR {
            return Err(reply_error(&reply.body, timeout));
        }
        Ok(reply)
    }

    /// Sends operation `op` on key `key_id` once a slot is free (until
    /// `deadline`); `pending` hears the answer. Inside a submission batch
    /// ([`batch`]) the request is queued and leaves with the batch's other
    /// requests when it ends.
    pub(super) fn send_op(self: &Arc<Self>, key_id: u64, op: &Operation, deadline: Instant, pending: Pending) {
        let op = match wire::op::fit(op, p::MAX_OP_DATA) {
            Ok(op) => op,
            Err(e) => return pending.fail(e),
        };
        // Waiting for room while this thread holds unsent requests of its
        // own would wait for replies that cannot come.
        if !self.has_room() {
            batch::flush_now();
        }
        if !self.acquire_slot(deadline) {
            let e = if self.is_dead() {
                self.dead_error(self.gone())
            } else {
                backend_error(
                    BackendFailure::NoRoom,
                    format!(
                        "no room: {} has max_in_flight requests outstanding",
                        if self.to_agent { "the agent" } else { "the key process" }
                    ),
                )
            };
            return pending.fail(e);
        }
        let id = self.next_id();
        if let Err(pending) = self.register(id, pending) {
            self.release_slot();
            return pending.fail(self.dead_error(self.gone()));
        }
        let mut frame = Zeroizing::new(Vec::with_capacity(p::HEADER + 15 + op.input_len()));
        p::encode_op(&mut frame, id, key_id, deadline.saturating_duration_since(Instant::now()), &op);
        // If the write fails, the reader fails whatever is registered when
        // it sees the connection end.
        if batch::defer_arc(self) {
            self.writer.queue(&frame);
        } else {
            self.writer.send(&frame);
        }
    }

    /// Performs `op` and waits for the answer until `deadline`.
    pub(super) fn perform(self: &Arc<Self>, key_id: u64, op: &Operation, deadline: Instant) -> Result<Output, SignError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send_op(key_id, op, deadline, Pending::OpCall(tx));
        // Waiting here for the reply: it must not sit in a batch.
        batch::flush_now();
        let timeout = deadline.saturating_duration_since(Instant::now());
        let frame = rx.recv_timeout(timeout).map_err(|_| SignError::TimedOut { timeout })??;
        if frame.kind == kind::ERR {
            return Err(reply_error(&frame.body, timeout));
        }
        Ok(frame.body)
    }

    /// Tells the key process to forget a key. Nobody waits for the
    /// answer; the reader drops it.
    pub(super) fn unload(&self, key_id: u64) {
        let mut frame = Vec::new();
        p::encode(&mut frame, kind::UNLOAD, self.next_id(), &[&p::unload_request(key_id)]);
        self.writer.send(&frame);
    }

    /// Delivers one reply frame to whoever waits for it.
    fn deliver(&self, frame: Frame) {
        let Some(pending) = self.pending().remove(&frame.id) else {
            // A reply nobody waits for (an unload, or a call that gave up).
            return;
        };
        if matches!(pending, Pending::Op(_) | Pending::OpCall(_)) {
            self.release_slot();
        }
        match pending {
            Pending::Op(answer) => {
                if frame.kind == kind::OK {
                    answer.send(Ok(frame.body));
                } else {
                    answer.send(Err(reply_error(&frame.body, Duration::ZERO)));
                }
            }
            Pending::OpCall(tx) | Pending::Call(tx) => {
                if matches!(frame.kind, kind::OK | kind::ERR) {
                    let _ = tx.send(Ok(frame));
                } else {
                    let _ = tx.send(Err(backend_error(BackendFailure::Protocol, format!("unexpected reply kind {:#04x}", frame.kind))));
                }
            }
        }
    }

    /// The reader: delivers replies until the connection ends, then fails
    /// everything in flight at once (nothing waits for a dead process),
    /// reaps the process and says how it ended.
    pub(super) fn read_replies(
        &self, mut stream: UnixStream, mut decoder: p::Decoder, guard: Option<crate::sign::sys::ForkGuard>,
    ) -> String {
        let mut buf = Zeroizing::new(vec![0u8; 64 * 1024]);
        let end: String = 'read: loop {
            loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => self.deliver(frame),
                    Ok(None) => break,
                    Err(e) => break 'read format!("it sent a bad frame ({e})"),
                }
            }
            match stream.read(&mut buf) {
                Ok(0) => break "it closed the connection".to_string(),
                Ok(n) => decoder.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break format!("reading from it failed: {e}"),
            }
        };
        drop(buf);
        // Let go before the socket closes (a descriptor number reused later
        // must not be taken for it in a child).
        drop(guard);
        drop(stream);

        let drained: Vec<Pending> = {
            let mut map = self.pending();
            self.dead.store(true, Ordering::Release);
            map.drain().map(|(_, p)| p).collect()
        };
        self.slot_freed.notify_all();
        self.writer.shutdown();
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let message = match &*child {
            Some(_) => format!("the key process (pid {}) died: {end}", self.pid),
            None => format!("the connection to the agent (pid {}) ended: {end}", self.pid),
        };
        for pending in drained {
            pending.fail(self.dead_error(message.clone()));
        }
        let status = match child.as_mut() {
            Some(child) => {
                let _ = child.kill();
                child.wait().map(|s| s.to_string()).unwrap_or_else(|e| format!("unknown ({e})"))
            }
            None => "the agent closed the connection".to_string(),
        };
        format!("pid {} {end}; {status}", self.pid)
    }
}

impl batch::Flush for Conn {
    fn flush(&self) {
        self.writer.flush();
    }
}

/// Maps an ERR reply (its body) to the engine's errors: from its detail
/// where it carries one a client rebuilds (a token's failure, a refused
/// argument or configuration), else by its code.
fn reply_error(body: &[u8], timeout: Duration) -> SignError {
    let (code, msg, detail) = p::parse_error_with(body);
    if let Some(e) = detail.rebuild(&msg) {
        return e;
    }
    match code {
        // The key process ran the operation; which one is not in the reply,
        // signing being by far the most common.
        ErrorCode::Crypto => SignError::Crypto { op: CryptoOp::Sign, reason: msg },
        ErrorCode::TimedOut => SignError::TimedOut { timeout },
        ErrorCode::Busy => backend_error(BackendFailure::NoRoom, msg),
        ErrorCode::Malformed => backend_error(BackendFailure::Protocol, msg),
        // A token's failure from a server that sent no detail.
        ErrorCode::TokenUnavailable | ErrorCode::TokenLogin => {
            let failure = if code == ErrorCode::TokenLogin { TokenFailure::Login } else { TokenFailure::Unavailable };
            SignError::Token { token: "pkcs11".into(), failure, reason: msg }
        }
        _ => backend_error(BackendFailure::Refused, msg),
    }
}
