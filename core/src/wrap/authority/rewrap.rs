//! Re-wrapping the store's envelopes to the current version of their
//! policy's key: what a policy-key rotation, retiring old versions and a
//! revocation do once the new versions are committed.

use std::collections::HashMap;
use std::sync::Arc;

use zeroize::Zeroizing;

use super::state::PolicyKey;
use super::txn::Txn;
use super::Authority;
use crate::wrap::error::{Result, StateError};
use crate::wrap::format::Envelope;
use crate::wrap::hpke;
use crate::wrap::layout::{self, hex};
use crate::wrap::signing::AuthorityKey;
use crate::wrap::store::StoreError;

/// An envelope in the store a policy-key rotation left as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Its name in the store (`envelopes/{secret id}`).
    pub name: String,
    /// Why.
    pub reason: SkipReason,
}

/// Why an envelope in the store was not re-wrapped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SkipReason {
    /// It does not parse (the message says why); nobody can open it.
    #[error("not an envelope: {0}")]
    Malformed(String),
    /// It names another authority, or its signature does not verify.
    #[error("not signed by this authority: {0}")]
    NotSigned(String),
    /// It is sealed to a version of the policy key this authority no
    /// longer holds (already retired).
    #[error("sealed to policy key version {0}, which was retired")]
    RetiredVersion(u32),
    /// It is signed but does not open with the policy key it names.
    #[error("does not open with policy key version {0}")]
    DoesNotOpen(u32),
    /// It is stored under a name other than its secret id's: re-wrapping
    /// it would write a second object.
    #[error("stored under a name other than its secret id's ({0})")]
    Misnamed(String),
}

/// Envelopes a re-wrap reads a page: etcd counts the whole rest of the
/// range for every range request, so pages of 128 made a 100,000-envelope
/// scan quadratic enough to bound a revocation; 1,000 (etcd's listing page
/// here too) is about 0.5 MB of envelopes.
const SCAN_PAGE: usize = 1000;

impl Authority {
    /// Re-wraps the store's envelopes of the policies `pids` sealed to an
    /// older version of their key to the current one, in one pass over
    /// the store, in the commits of `t`. Store failures stop it (a re-run
    /// continues); a bad envelope is skipped and reported.
    ///
    /// Three stages overlap, so that the slowest alone bounds it: a reader
    /// thread scans the envelopes [`SCAN_PAGE`] at a time (one etcd range
    /// each, names and values together),
    /// workers on every core open and seal them again, and this thread
    /// commits the results while the workers go on with the next ones
    /// (etcd's round trips leave its core idle).
    pub(super) fn rewrap_store(&mut self, t: &mut Txn, pids: &[[u8; 32]]) -> Result<(usize, Vec<Skipped>)> {
        let mut keys = Vec::new();
        let mut current = HashMap::new();
        for pid in pids {
            let k = self.state.current(pid).ok_or_else(|| StateError::Inconsistent("the policy key to re-wrap to is missing".into()))?;
            current.insert(*pid, k.version);
            keys.extend(self.state.keys.iter().filter(|k| k.policy_id() == pid).cloned());
        }
        // The workers' own copy of what they need: this thread keeps
        // `self` to commit with.
        let rewrapper = Rewrapper { signer: self.state.signer.clone(), keys, current };
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
        let store = self.store.clone();
        let (mut rewrapped, mut skipped) = (0, Vec::new());
        std::thread::scope(|scope| -> Result<()> {
            let (read_tx, read_rx) = std::sync::mpsc::sync_channel(2);
            // Shared by the workers alone: when they stop (this thread
            // stopped taking their results), the reader's next send fails
            // and it stops too, instead of waiting on a full channel.
            let read_rx = Arc::new(std::sync::Mutex::new(read_rx));
            let (done_tx, done_rx) = std::sync::mpsc::sync_channel(workers + 1);
            scope.spawn(move || {
                // A page's names and values in one request on etcd; a
                // closed channel (the re-wrap stopped) ends the scan.
                let scanned = store.scan(layout::ENVELOPES, SCAN_PAGE, &mut |names, values| {
                    read_tx.send(Ok((names, values))).map_err(|_| StoreError::Conflict { key: layout::ENVELOPES.into() })
                });
                if let Err(e) = scanned {
                    let _ = read_tx.send(Err(e));
                }
            });
            for _ in 0..workers {
                let (read_rx, done_tx, rewrapper) = (read_rx.clone(), done_tx.clone(), &rewrapper);
                scope.spawn(move || loop {
                    // The lock is held only to take the next chunk.
                    let next = read_rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    let Ok(read) = next else { return };
                    let done = read.map(|(chunk, values)| {
                        let outcomes: Vec<Result<Rewrap>> = chunk
                            .iter()
                            .zip(&values)
                            .map(|(name, bytes)| {
                                // A panic is this envelope's error, not the
                                // whole scope's (which would re-raise it).
                                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rewrapper.rewrap_one(name, bytes.as_deref())))
                                    .unwrap_or_else(|_| Err(StateError::Inconsistent("re-wrapping an envelope panicked".into()).into()))
                            })
                            .collect();
                        (chunk, outcomes)
                    });
                    if done_tx.send(done).is_err() {
                        return;
                    }
                });
            }
            // Only the workers hold these now: the loop below ends when
            // they do, and they end when it stops taking results.
            drop((done_tx, read_rx));
            for done in done_rx {
                let (chunk, outcomes) = done?;
                for (name, outcome) in chunk.into_iter().zip(outcomes) {
                    match outcome? {
                        Rewrap::Done(env) => {
                            t.put(&name, env.to_bytes());
                            rewrapped += 1;
                            self.commit_if_large(t)?;
                        }
                        Rewrap::Skip(reason) => skipped.push(Skipped { name, reason }),
                        Rewrap::Keep => {}
                    }
                }
            }
            Ok(())
        })?;
        Ok((rewrapped, skipped))
    }
}

/// What re-wrapping envelopes needs, apart from the store: the signing
/// key, every key of the policies being re-wrapped, and the version each
/// is re-wrapped to.
struct Rewrapper {
    signer: AuthorityKey,
    keys: Vec<PolicyKey>,
    current: HashMap<[u8; 32], u32>,
}

impl Rewrapper {
    fn rewrap_one(&self, name: &str, bytes: Option<&[u8]>) -> Result<Rewrap> {
        let Some(bytes) = bytes else { return Ok(Rewrap::Keep) };
        let env = match Envelope::parse(bytes) {
            Ok(env) => env,
            Err(e) => return Ok(Rewrap::Skip(SkipReason::Malformed(e.to_string()))),
        };
        let Some(&version) = self.current.get(&env.policy_id) else { return Ok(Rewrap::Keep) };
        if env.key_version == version {
            return Ok(Rewrap::Keep);
        }
        if let Err(e) = env.verify(&self.signer.public()) {
            return Ok(Rewrap::Skip(SkipReason::NotSigned(e.to_string())));
        }
        if name != layout::envelope(&env.secret_id) {
            return Ok(Rewrap::Skip(SkipReason::Misnamed(hex(&env.secret_id))));
        }
        let pid = &env.policy_id;
        let Some(old) = self.keys.iter().find(|k| k.policy_id() == pid && k.version == env.key_version) else {
            return Ok(Rewrap::Skip(SkipReason::RetiredVersion(env.key_version)));
        };
        let Ok(secret) = hpke::open(&old.private, &env.enc, env.aad(), &env.ciphertext) else {
            return Ok(Rewrap::Skip(SkipReason::DoesNotOpen(env.key_version)));
        };
        let secret = Zeroizing::new(secret);
        let k = self
            .keys
            .iter()
            .find(|k| k.policy_id() == pid && k.version == version)
            .ok_or_else(|| StateError::Inconsistent("the policy key to seal under is missing".into()))?;
        Ok(Rewrap::Done(Box::new(Envelope::seal(&self.signer, &env.secret_id, &k.policy, k.version, &k.public, &secret)?)))
    }
}

/// What re-wrapping decided for one object of `envelopes/`.
enum Rewrap {
    /// Sealed to the current version: the new envelope to write (boxed:
    /// the other answers are a word or two).
    Done(Box<Envelope>),
    /// Left as it is, and why.
    Skip(SkipReason),
    /// Not one to re-wrap (another policy, already current, gone).
    Keep,
}
