//! A handle on a key held outside this process (a key process;
//! later, a remote key server): the holder, the key's id there, and the
//! public key. The secret never enters this process.
//!
//! [`KeyHolder`] is what the holder offers, stated with the plain types
//! only, so that the key handle sits below the engine and its backends.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use super::threads::Origin;
use super::types::{Input, KeyKind, OpClass, Operation, Output, SignError};

/// Where the answer to an operation on a held key goes: called once.
/// Dropped unanswered, it answers whatever waits with an error (the
/// engine's side sees to that), so an operation can never hang.
pub(crate) struct Answer(Box<dyn FnOnce(Result<Output, SignError>) + Send>);

impl Answer {
    pub(crate) fn new(f: impl FnOnce(Result<Output, SignError>) + Send + 'static) -> Self {
        Answer(Box::new(f))
    }

    pub(crate) fn send(self, result: Result<Output, SignError>) {
        (self.0)(result)
    }
}

/// What holds keys on this process's behalf.
pub(crate) trait KeyHolder: Send + Sync + 'static {
    /// A short name for errors and metrics.
    fn name(&self) -> &str;

    /// The executor class for operations with a key of `kind`.
    fn class(&self, kind: KeyKind) -> OpClass;

    /// As [`Backend::admit`](super::Backend::admit), for key `id`:
    /// `Ok(true)` to start on the submitting thread, `Ok(false)` to queue,
    /// an error to refuse.
    fn admit(&self, id: u64, class: OpClass) -> Result<bool, SignError>;

    /// Performs `op` with key `id`, waiting until `deadline` at most.
    fn perform(&self, id: u64, op: &Operation, deadline: Instant) -> Result<Output, SignError>;

    /// Starts `op` with key `id` and answers through `answer`, now or later.
    fn start(&self, id: u64, op: Operation, deadline: Instant, answer: Answer);

    /// The last handle on key `id` is gone.
    fn forget(&self, id: u64);

    /// Whether a caller that waits for the result anyway
    /// ([`Engine::perform`](super::Engine::perform)) may call
    /// [`KeyHolder::perform`] on its own thread: a holder whose every call
    /// blocks its thread in this process anyway (a PKCS#11 token). The
    /// default is no.
    fn performs_in_place(&self) -> bool {
        false
    }

    /// The largest input (message, digest, ciphertext) the holder takes in
    /// one request. Larger messages for algorithms with a hash are hashed
    /// on this side before they are sent; anything else larger is refused
    /// at submission.
    fn max_input(&self) -> usize;
}

/// A key held elsewhere. Dropping it tells the holder to forget the key.
pub(crate) struct HeldKey {
    holder: Arc<dyn KeyHolder>,
    id: u64,
    kind: KeyKind,
    public_der: Vec<u8>,
    origin: Origin,
}

impl HeldKey {
    pub(crate) fn new(holder: Arc<dyn KeyHolder>, id: u64, kind: KeyKind, public_der: Vec<u8>) -> Self {
        HeldKey { holder, id, kind, public_der, origin: Origin::here() }
    }

    /// Refuses a key loaded before this process forked: its holder (the
    /// parent's key process connection, agent connection or key servers'
    /// client) is the parent's, whose socket and locks this process shares
    /// or cannot take. It fails at once, never waits.
    pub(crate) fn usable_here(&self) -> Result<(), SignError> {
        if self.origin.forked() {
            return Err(SignError::forked(
                "this key",
                self.origin.pid(),
                "its holder (key process, agent or key servers) is that process's; load the key again in this process",
            ));
        }
        Ok(())
    }

    pub(crate) fn holder(&self) -> &Arc<dyn KeyHolder> {
        &self.holder
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn kind(&self) -> KeyKind {
        self.kind
    }

    pub(crate) fn public_key_der(&self) -> &[u8] {
        &self.public_der
    }

    /// Refuses at submission what the holder cannot take in one request:
    /// a message too long to send and impossible to hash first (Ed25519
    /// signs whole messages).
    pub(crate) fn check_size(&self, op: &Operation) -> Result<(), SignError> {
        let max = self.holder.max_input();
        let len = op.input_len();
        if len <= max {
            return Ok(());
        }
        match op {
            Operation::Sign { alg, input: Input::Message(_) } if alg.hash().is_some() => Ok(()),
            Operation::Sign { .. } => Err(SignError::InputTooLarge {
                what: "the message",
                len,
                max,
                hint: "; Ed25519 signs whole messages, so it cannot be hashed first: use an ECDSA or RSA key for larger messages",
            }),
            Operation::DecryptRaw { .. } => Err(SignError::InputTooLarge { what: "the ciphertext", len, max, hint: "" }),
        }
    }
}

impl fmt::Debug for HeldKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldKey").field("held_by", &self.holder.name()).field("id", &self.id).finish()
    }
}

impl Drop for HeldKey {
    fn drop(&mut self) {
        if self.origin.forked() {
            // The parent's holder: telling it anything, or dropping the
            // last handle on it (which ends its key process), is the
            // parent's business. One count more, never given back, keeps
            // it from being dropped here.
            std::mem::forget(self.holder.clone());
            return;
        }
        self.holder.forget(self.id);
    }
}
