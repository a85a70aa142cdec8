//! The threads that sign and load keys for a server's connections, and
//! the queues to them.
//!
//! Each operation goes to the pool of its class (RSA, or EC/Ed25519), so a
//! queue of RSA signatures never delays an ECDSA reply, and each key load
//! to a small pool of loaders. Every queue is fair between users
//! ([`FairQueue`]) and bounded (count, and memory through the client's
//! account): past a bound the peer is told `busy`. Workers write their
//! replies through the connection's combining writer: at low load a reply
//! goes out at once from the worker, under load replies that finish while
//! one write is under way leave in the next single write, and an EC worker
//! that already has its next job queued holds its reply back (400 µs, 32
//! replies at most) to send it with the next. Measured with `keyfence bench
//! sign --case ecdsa-p256-sha256`, holding back took the key process's CPU
//! per P-256 signature from 1.38x to 1.18x the in-process engine's (at
//! 100 µs and 16); 400 µs and 32 took the isolated path from about 0.77x
//! to 0.81x raw BoringSSL per CPU-second (1 ms and 64 was worse again: the
//! client then waits on held replies).

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use super::fair_queue::{Done, FairQueue, Ticket};
use super::{Conn, ErrorCode, Refusal};
use crate::sign::key_process::protocol::{self as p, kind, Detail, LoadBody};
use crate::sign::offload::{Callback, OffloadBackend, Route};
use crate::sign::threads::Joined;
use crate::sign::types::{Operation, Output, SignError, TokenFailure};
use crate::sign::PrivateKey;

/// An operation waiting for a signing thread.
pub(super) struct Job {
    pub(super) conn: Arc<Conn>,
    pub(super) id: u64,
    pub(super) key: Arc<PrivateKey>,
    pub(super) op: Operation,
    pub(super) deadline: Instant,
    /// The request's memory, its user's until the job is dropped
    /// (replied to).
    pub(super) charged: usize,
}

/// A key load waiting for a loader.
pub(super) struct LoadJob {
    pub(super) conn: Arc<Conn>,
    pub(super) id: u64,
    pub(super) key_id: u64,
    pub(super) source: LoadBody,
    pub(super) charged: usize,
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

impl Job {
    /// Answers a job that lost its place in the queue to another user's.
    pub(super) fn refuse_busy(self) {
        self.conn.done();
        self.conn.err(self.id, ErrorCode::Busy, "the signing queue: another user needed the room (this user has the most waiting)");
    }
}

/// What a queued request costs beside its input (the job, its place in
/// the queue), in the memory its user is charged.
pub(super) const JOB_MEMORY: usize = 256;

/// What a key held for a client costs (AWS-LC's key with its Montgomery
/// contexts, the handle and its entry), charged to the client's user:
/// 10,000 RSA-2048 keys took 4.5 KiB each in resident memory, charged 6.
pub(super) fn key_memory(kind: crate::sign::KeyKind) -> usize {
    match kind {
        crate::sign::KeyKind::Rsa { bits } => 2048 + 2 * bits as usize,
        _ => 2048,
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
    pub(super) rsa: Arc<FairQueue<Job>>,
    pub(super) ec: Arc<FairQueue<Job>>,
    pub(super) load: Arc<FairQueue<LoadJob>>,
    /// The offload device (crypto_mb, where it runs here), which the
    /// signing threads hand what it signs to without waiting for it:
    /// across a server's clients the requests form its batches.
    pub(super) offload: Option<OffloadBackend>,
    threads: Joined,
}

impl Workers {
    /// Starts `rsa` RSA and `ec` EC/Ed25519 signing threads and the
    /// loaders, with `ops` room in each signing queue and `loads` for key
    /// loads waiting.
    pub(crate) fn start(
        (rsa_threads, ec_threads): (usize, usize), ops: Room, loads: Room, offload: Option<OffloadBackend>,
    ) -> io::Result<Arc<Workers>> {
        let rsa = Arc::new(FairQueue::new(ops.per_user, ops.total));
        let ec = Arc::new(FairQueue::new(ops.per_user, ops.total));
        let load = Arc::new(FairQueue::new(loads.per_user, loads.total));
        let mut threads = Joined::new();
        for (queue, n, name) in [(&rsa, rsa_threads, "rsa"), (&ec, ec_threads, "ec")] {
            for i in 0..n.max(1) {
                let queue = queue.clone();
                let defer = name == "ec";
                let offload = offload.clone();
                threads.spawn(format!("key-process-{name}-{i}"), move || work(&queue, defer, offload.as_ref()))?;
            }
        }
        for i in 0..LOADERS {
            let queue = load.clone();
            threads.spawn(format!("key-process-load-{i}"), move || load_keys(&queue))?;
        }
        Ok(Arc::new(Workers { rsa, ec, load, offload, threads }))
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

/// The wire code of a PKCS#11 token's failure that has one, so the
/// client's caller sees `TOKEN_UNAVAILABLE` or `TOKEN_LOGIN` as it would
/// without the key process.
pub(crate) fn token_code(e: &SignError) -> Option<ErrorCode> {
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
        let conn = &job.conn;
        // A loader that panics (a module's bug, a parser's) answers this
        // request and stays: two loader threads serve every client.
        let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| conn.service.load(&job.source, conn.client.as_deref())))
            .unwrap_or_else(|_| Err(Refusal::new(ErrorCode::Internal, "loading the key panicked")));
        match loaded {
            Ok(key) => match key.public_key_der().map(|der| p::loaded_reply(key.kind(), &der)) {
                Ok(body) => match conn.keep(job.key_id, key) {
                    Ok(()) => conn.ok(job.id, &body),
                    Err(why) => conn.err(job.id, ErrorCode::Busy, &why),
                },
                Err(e) => conn.err(job.id, ErrorCode::Load, &e.to_string()),
            },
            Err(refusal) => conn.refuse(job.id, &refusal),
        }
        drop(job);
        done = Some((ticket, started.elapsed()));
    }
}

/// Hands `job` to the offload device when it signs it (the reply is
/// written from the device's completion, or from the software fallback
/// when the device fails it); gives the job back when it does not.
fn offered(offload: Option<&OffloadBackend>, mut job: Job) -> Option<Job> {
    let Some(offload) = offload else { return Some(job) };
    if Instant::now() >= job.deadline || offload.route(&job.key, &job.op) != Route::Device {
        return Some(job);
    }
    let (key, deadline) = (job.key.clone(), job.deadline);
    let op = std::mem::replace(&mut job.op, Operation::DecryptRaw { ciphertext: Vec::new() });
    let done = Callback(Box::new(move |result: Result<Output, SignError>| {
        let frame = reply_frame(&job, result);
        job.conn.done();
        job.conn.writer.send(&frame);
    }));
    if let Err((key, op, done)) = offload.offer(key, op, deadline, done) {
        // The routing said device and the device said no: software, here.
        let result = key.perform(&op);
        (done.0)(result);
    }
    None
}

fn work(queue: &FairQueue<Job>, defer: bool, offload: Option<&OffloadBackend>) {
    let mut next: Option<(Job, Ticket)> = None;
    // The job last made, to charge to its user when the next is taken.
    let mut done: Option<Done> = None;
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
        let Some(job) = offered(offload, job) else {
            // The device has it; this thread goes on to the next.
            done = Some((ticket, started.elapsed()));
            held = None;
            continue;
        };
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

/// Runs one job; returns its reply frame.
pub(super) fn perform(job: &Job) -> Zeroizing<Vec<u8>> {
    let result =
        if Instant::now() >= job.deadline { Err(SignError::TimedOut { timeout: Duration::ZERO }) } else { job.key.perform(&job.op) };
    job.conn.done();
    reply_frame(job, result)
}

/// The reply frame for `job`'s `result`.
fn reply_frame(job: &Job, result: Result<Output, SignError>) -> Zeroizing<Vec<u8>> {
    let result = if matches!(result, Err(SignError::TimedOut { .. })) {
        Err(Refusal::new(ErrorCode::TimedOut, "the deadline passed before the operation started"))
    } else {
        match result {
            Ok(out) => Ok(out),
            Err(SignError::Crypto { reason, .. }) => Err(Refusal::new(ErrorCode::Crypto, reason)),
            // A token's failure goes with its detail: the client rebuilds it.
            Err(e) => match token_code(&e) {
                Some(code) => {
                    let (message, detail) = Detail::of(&e);
                    Err(Refusal { code, message, detail })
                }
                None => Err(Refusal::new(ErrorCode::Invalid, e.to_string())),
            },
        }
    };
    let mut frame = Zeroizing::new(Vec::new());
    match result {
        Ok(out) => {
            frame.reserve(p::HEADER + 4 + out.len());
            p::encode(&mut frame, kind::OK, job.id, &[&out]);
        }
        Err(r) => p::encode(&mut frame, kind::ERR, job.id, &[&p::error_body_with(r.code, &r.message, &r.detail)]),
    }
    frame
}
