//! The authority: master key generations, the policy keyring, wrapping,
//! issuing machine keys and rotation.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyfence_policy::Attributes;
use rand_core::{OsRng, RngCore};
use zeroize::Zeroizing;

use super::error::{codec, limit, malformed, Result, StateError};
// Named by the intra-doc links of the `# Errors` sections.
#[allow(unused_imports)]
use super::error::WrapError;
use super::fence::{self, Fence};
use super::format::{check_policy, reader, writer, Envelope, STATE_MAGIC};
use super::generation::GenerationState;
use super::generation_list;
use super::signing::AuthorityKey;
use super::layout::{self, hex};
use super::machine::MachineKey;
use super::policy::CanonicalPolicy;
use super::revocation::{self, Revoked, MACHINE_LABEL};
use super::store::{Batch, Op, Stamp, Store, StoreError};
use super::{hpke, sealed};
use crate::abe::{self, AbeError, MasterSecretKey, PublicKey};
use crate::backoff::{Backoff, Jitter};

/// Most generations the state's 16-bit count holds (retired ones stay
/// listed, so this bounds the number of master rotations).
const MAX_GENERATIONS: usize = u16::MAX as usize;

struct Generation {
    number: u32,
    state: GenerationState,
    pk: PublicKey,
    msk: Option<MasterSecretKey>,
}

#[derive(Clone)]
struct PolicyKey {
    policy: CanonicalPolicy,
    version: u32,
    public: [u8; 32],
    private: Zeroizing<[u8; 32]>,
}

impl PolicyKey {
    fn policy_id(&self) -> &[u8; 32] {
        self.policy.id()
    }
}

/// What a master rotation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasterRotation {
    /// The new active generation.
    pub new_generation: u32,
    /// Policy keys re-sealed under it (customer envelopes are not touched).
    pub resealed: usize,
    /// The generation retired by this rotation, if any.
    pub retired: Option<u32>,
}

/// What a policy-key rotation did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyRotation {
    /// The new policy key version.
    pub version: u32,
    /// Envelopes in the store re-wrapped to it.
    pub rewrapped: usize,
    /// Envelopes of the store's `envelopes/` it did not re-wrap, and why.
    /// One bad object never stops the rotation.
    pub skipped: Vec<Skipped>,
    /// Older versions of this policy's key, kept decrypt-only so that
    /// envelopes outside the store (`authority wrap --out`, copies loaded
    /// elsewhere) still open, until [`Authority::retire_policy_keys`].
    pub decrypt_only: Vec<u32>,
}

/// What retiring a policy's old keys did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyRetirement {
    /// The policy key version that remains.
    pub version: u32,
    /// The versions deleted (with their sealed copies): envelopes sealed to
    /// them no longer open anywhere.
    pub retired: Vec<u32>,
    /// Envelopes in the store still on an old version, re-wrapped first.
    pub rewrapped: usize,
    /// Envelopes in the store it did not re-wrap, and why.
    pub skipped: Vec<Skipped>,
}

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

/// What revoking a machine did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Revocation {
    /// The machine id revoked.
    pub id: String,
    /// Whether this call finished a revocation an earlier one started and
    /// was interrupted in (the id was already recorded, its re-keying
    /// pending).
    pub resumed: bool,
    /// Whether the id was already revoked, and fully: nothing was done.
    pub already: bool,
    /// Policies given a new key version sealed so the machine cannot open it.
    pub rekeyed: usize,
    /// Envelopes in the store re-wrapped to those new versions.
    pub rewrapped: usize,
    /// Envelopes in the store it did not re-wrap, and why: sealed to a
    /// retired version now, they open nowhere.
    pub skipped: Vec<Skipped>,
    /// Older policy key versions deleted with their sealed copies (every
    /// one a revoked machine may have cached).
    pub retired: usize,
    /// Whether the store's history was compacted afterwards
    /// ([`Store::compact`]; see [`Authority::set_compact_after_revoke`]).
    pub compacted: bool,
    /// From the call to the commit of the new versions: from then on every
    /// wrap seals to a version the machine cannot open. Zero when nothing
    /// was re-keyed (`already`).
    pub rekeyed_after: Duration,
}

/// How the last operation of an [`Authority`] got past other writers on
/// a store without a writer lock (etcd): [`Authority::last_conflicts`].
/// All zero on a store whose lock keeps other writers out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Conflicts {
    /// Times it started over from the committed state after a conflict
    /// met before it had committed anything, each after a jittered pause.
    pub retried: u32,
    /// Times one of its commits met a commit of a wrap that added a policy
    /// key, took that key in and was sent again.
    pub rebased: u32,
    /// Time it waited for another long operation (a rotation, a
    /// revocation) to finish.
    pub waited: Duration,
    /// Whether it met so many wraps adding policy keys that it made them
    /// wait for it (its fence became exclusive).
    pub held_wraps: bool,
}

/// A summary of the authority's state.
#[derive(Debug, Clone)]
pub struct Status {
    /// Every generation and its state, oldest first.
    pub generations: Vec<(u32, GenerationState)>,
    /// Distinct policies with a policy key.
    pub policies: usize,
    /// Policy key versions held: more than `policies` while older versions
    /// are kept decrypt-only after a policy-key rotation, until
    /// [`Authority::retire_policy_keys`].
    pub policy_keys: usize,
    /// Envelopes in the store.
    pub envelopes: usize,
    /// Revoked machine ids, sorted.
    pub revoked: Vec<String>,
    /// Revoked ids whose re-keying an interrupted `revoke` left unfinished
    /// (run `revoke` again for each).
    pub pending_revocations: Vec<String>,
}

/// How long a writer waits for another to release the store's lock.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// Writes a long operation (re-wrapping a store's envelopes) sends in one
/// commit once its state is committed: under etcd's default limit of 128
/// operations per transaction and, at envelope sizes, its 1.5 MiB request.
const CHUNK_OPS: usize = 64;

/// Times an operation starts over after a conflict met before it
/// committed anything (as etcd's STM does), before it gives up with
/// [`StoreError::Conflict`].
const RETRIES: u32 = 8;
/// The first pause before starting over, doubled each time up to
/// [`MAX_PAUSE`]; each pause is drawn from its upper half, so writers that
/// collided once do not collide again in step.
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// Re-bases one commit makes before it gives up: each is another writer's
/// commit in the time it took to send one.
const REBASES: u32 = 256;
/// Re-bases of one commit after which a long operation makes its fence
/// exclusive: wraps commit faster than it can re-base and send.
const ESCALATE_AFTER: u32 = 4;
/// Longest a long operation waits for another's fence. A holder that dies
/// stops renewing it: its fence then holds for at most [`fence::TTL`].
const FENCE_WAIT: Duration = Duration::from_secs(600);

/// The pauses of a change starting over, or of waiting for a fence.
fn pauses() -> Backoff {
    Backoff::new(FIRST_PAUSE, MAX_PAUSE, Jitter::UpperHalf)
}

/// What a state holds that a conflicting commit is compared on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct View {
    generations: Vec<(u32, GenerationState)>,
    keys: HashSet<([u8; 32], u32)>,
    revoked: Vec<Revoked>,
}

/// The fence this authority holds, and the stamp of its record.
struct HeldFence {
    record: Fence,
    stamp: Stamp,
    renewed: Instant,
}

/// Whether a write is one a started-over attempt would repeat: sealed
/// copies no committed state names yet are not (the attempt that follows
/// writes them again, or the next rotation deletes them), nor is a fence.
fn is_durable(op: &Op) -> bool {
    !(op.key() == layout::FENCE || matches!(op, Op::Put(k, _) if k.starts_with(layout::SEALED)))
}

/// The authority of a keyfence deployment: holds the master keys.
///
/// Many processes (and handles) may open one store. Reading never writes;
/// every change (`init`, `wrap`, the rotations) takes the store's writer
/// lock, re-reads the committed state under it, gathers its writes and
/// commits them with [`Store::commit`], expecting the state it read, so no
/// writer works from a stale state and none undoes another's commit.
///
/// On a store without a writer lock (etcd), writers race, and none is
/// starved (`docs/wrapping.md`, "Writers at once"):
/// - a long operation (the rotations, retiring, revoking) first takes the
///   store's fence, so two of them never interleave;
/// - a commit that meets a wrap's new policy key takes it in and is sent
///   again (re-based), so a stream of wraps cannot starve a rotation;
/// - an operation that meets any other conflict before it has committed
///   anything starts over, up to 8 times with jittered pauses, before it
///   gives up with [`StoreError::Conflict`].
///
/// [`Authority::last_conflicts`] says what the last operation met. `issue`
/// and `status` read the latest committed state.
pub struct Authority {
    store: Arc<dyn Store>,
    signer: AuthorityKey,
    generations: Vec<Generation>,
    keys: Vec<PolicyKey>,
    /// Revoked machines, in the order they were revoked.
    revoked: Vec<Revoked>,
    /// Digest of the state bytes this value was decoded from, to skip
    /// decoding again when nothing changed.
    seen: [u8; 32],
    /// The store's stamp of the state this change started from: what the
    /// commit expects to find.
    stamp: Option<Stamp>,
    /// The writes of the change in progress, committed together.
    pending: std::sync::Mutex<Batch>,
    /// What the committed state this change builds on holds.
    base: View,
    /// What the state last encoded (`commit`) holds: `base` once flushed.
    encoded: View,
    /// Whether this attempt committed a write it would repeat if it
    /// started over.
    committed: bool,
    /// The fence the change in progress holds.
    fence: Option<HeldFence>,
    /// For a wrap adding a policy key, on a store without a writer lock:
    /// the stamp of the fence record it found not exclusive (`None`:
    /// absent), which its commit expects.
    fence_seen: Option<Option<Stamp>>,
    /// What the last operation met.
    conflicts: Conflicts,
    /// Whether `revoke` compacts the store's history when it is done.
    compact_after_revoke: bool,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("generations", &self.generations.iter().map(|g| (g.number, g.state)).collect::<Vec<_>>())
            .field("policy_keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl Authority {
    /// Creates an authority with its first master generation in `store`.
    ///
    /// # Errors
    /// [`WrapError::State`] if the store already holds an authority.
    pub fn init(store: Arc<dyn Store>) -> Result<Self> {
        // A store owns its prefix: none inside another, none around one.
        store.check_nesting(true)?;
        // Create-exclusive: two `init`s on one store cannot both succeed.
        let _lock = store.lock(LOCK_WAIT)?;
        if store.get_stamped(layout::STATE)?.is_some() {
            return Err(StateError::AuthorityExists.into());
        }
        let (pk, msk) = abe::setup()?;
        let generations = vec![Generation { number: 1, state: GenerationState::Active, pk, msk: Some(msk) }];
        let mut a = Self::with_state(store, AuthorityKey::generate(), generations, Vec::new(), Vec::new(), [0; 32]);
        // The generation list first: it is what makes a directory a store
        // for the command line, so an `init` that dies before committing
        // leaves a store with no authority, which `init` can fill, never
        // an authority that no command recognises as a store.
        let list = generation_list::encode(&a.signer, a.generations.iter().map(|g| (g.number, g.state)));
        a.put(layout::GENERATIONS, &list);
        a.commit()?;
        // Expecting no state: of two `init`s racing on a store without a
        // lock, one commits.
        match a.flush() {
            Err(WrapError::Store(StoreError::Conflict { .. })) => Err(StateError::AuthorityExists.into()),
            r => r.map(|()| a),
        }
    }

    /// Opens the authority in `store`. Opening only reads, with one
    /// exception: a store whose generation list is still the unsigned text
    /// an earlier keyfence wrote gets it signed, from the authority's state
    /// under the writer lock, because machines refuse the unsigned list.
    /// The cleanup an interrupted operation may leave (sealed copies no
    /// committed state refers to) is done by the next rotation.
    ///
    /// # Errors
    /// [`WrapError::State`] if there is no authority; [`WrapError::Malformed`]
    /// if its state does not decode; the store's errors when signing an
    /// unsigned generation list.
    pub fn open(store: Arc<dyn Store>) -> Result<Self> {
        let (bytes, stamp) = store.get_stamped(layout::STATE)?.ok_or(StateError::NoAuthority)?;
        store.check_nesting(false)?;
        let bytes = Zeroizing::new(bytes);
        let mut a = Self::decode(store, &bytes)?;
        a.stamp = Some(stamp);
        a.base = a.view();
        if a.store.get(layout::GENERATIONS)?.as_deref().is_some_and(generation_list::is_unsigned_text) {
            a.change(None, |a| {
                let list = generation_list::encode(&a.signer, a.generations.iter().map(|g| (g.number, g.state)));
                a.put(layout::GENERATIONS, &list);
                Ok(())
            })?;
        }
        Ok(a)
    }

    /// The latest committed state and its stamp: `None` for the state when
    /// it is the one this value holds, else a fresh decoding of it.
    fn latest(&self) -> Result<(Option<Self>, Stamp)> {
        let (bytes, stamp) = self.store.get_stamped(layout::STATE)?.ok_or(StateError::NoAuthority)?;
        let bytes = Zeroizing::new(bytes);
        if state_digest(&bytes) == self.seen {
            return Ok((None, stamp));
        }
        Self::decode(self.store.clone(), &bytes).map(|a| (Some(a), stamp))
    }

    /// Brings this value up to the committed state (call under the lock).
    fn refresh(&mut self) -> Result<()> {
        let (fresh, stamp) = self.latest()?;
        if let Some(fresh) = fresh {
            self.take_state(fresh);
        }
        self.stamp = Some(stamp);
        self.base = self.view();
        Ok(())
    }

    /// Takes the state of `fresh`, keeping what belongs to the change in
    /// progress (its fence, what it met).
    fn take_state(&mut self, fresh: Self) {
        self.signer = fresh.signer;
        self.generations = fresh.generations;
        self.keys = fresh.keys;
        self.revoked = fresh.revoked;
        self.seen = fresh.seen;
    }

    fn view(&self) -> View {
        View {
            generations: self.generations.iter().map(|g| (g.number, g.state)).collect(),
            keys: self.keys.iter().map(|k| (*k.policy_id(), k.version)).collect(),
            revoked: self.revoked.clone(),
        }
    }

    /// What the last operation on this value met from other writers.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use keyfence::wrap::{Authority, MemoryStore};
    ///
    /// let mut a = Authority::init(Arc::new(MemoryStore::default()))?;
    /// a.rotate_master()?;
    /// assert_eq!(a.last_conflicts().retried, 0);
    /// # Ok::<(), keyfence::wrap::WrapError>(())
    /// ```
    pub fn last_conflicts(&self) -> Conflicts {
        self.conflicts
    }

    /// Whether [`Authority::revoke`] compacts the store's history once the
    /// envelopes are re-wrapped (on by default). On etcd, the old revisions
    /// hold every envelope and sealed copy as they were before, which the
    /// revoked machine's key still opens; compacting drops them. etcd's
    /// compaction is the whole cluster's: turn it off on a cluster shared
    /// with others, and compact on their schedule.
    pub fn set_compact_after_revoke(&mut self, compact: bool) {
        self.compact_after_revoke = compact;
    }

    /// Adds a write to the change in progress.
    fn put(&self, key: &str, value: &[u8]) {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(Op::Put(key.to_owned(), value.to_vec()));
    }

    fn delete(&self, key: &str) {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(Op::Delete(key.to_owned()));
    }

    /// Commits the writes gathered so far, expecting the state this change
    /// started from (and the fence it holds). When they included the
    /// state, the stamp of the state just written becomes the expectation
    /// of the next flush: read back, and a conflict if it is not ours
    /// (another writer came between). A conflict with a wrap that added a
    /// policy key is re-based on it ([`Authority::rebase`]) and sent again.
    fn flush(&mut self) -> Result<()> {
        let mut rebases = 0;
        loop {
            let mut ops = std::mem::take(&mut self.pending.lock().unwrap_or_else(|e| e.into_inner()).ops);
            let renew = self.fence.as_ref().is_some_and(|f| f.renewed.elapsed() >= fence::TTL / 3);
            if ops.is_empty() && !renew {
                return Ok(());
            }
            // Over a chunk (a re-base sealed many keys it took in): sealed
            // copies go ahead in commits of their own, as a rotation's do.
            let mut rest = Vec::new();
            if ops.len() > CHUNK_OPS {
                let (mut head, mut others): (Vec<Op>, Vec<Op>) =
                    ops.into_iter().partition(|o| matches!(o, Op::Put(k, _) if k.starts_with(layout::SEALED)));
                if head.len() > CHUNK_OPS {
                    others.splice(0..0, head.drain(CHUNK_OPS..));
                    ops = head;
                    rest = others;
                } else {
                    head.extend(others);
                    ops = head;
                }
            }
            let mut expect = vec![(layout::STATE.to_owned(), self.stamp)];
            let mut renewed = None;
            if let (None, Some(seen)) = (&self.fence, self.fence_seen) {
                expect.push((layout::FENCE.to_owned(), seen));
            }
            if let Some(f) = &self.fence {
                expect.push((layout::FENCE.to_owned(), Some(f.stamp)));
                if renew {
                    let r = f.record.renewed();
                    ops.push(Op::Put(layout::FENCE.to_owned(), r.encode()));
                    renewed = Some(r);
                }
            }
            let batch = Batch { expect, ops };
            match self.store.commit(&batch) {
                Ok(()) => {
                    self.committed_batch(&batch, renewed)?;
                    if rest.is_empty() {
                        return Ok(());
                    }
                    let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                    rest.append(&mut pending.ops);
                    pending.ops = rest;
                }
                Err(StoreError::Conflict { .. }) if rebases < REBASES => {
                    let ops = batch.ops.into_iter().filter(|o| o.key() != layout::FENCE).chain(rest).collect();
                    if !self.rebase(ops)? {
                        return Err(StoreError::Conflict { key: layout::STATE.to_owned() }.into());
                    }
                    rebases += 1;
                    self.conflicts.rebased += 1;
                    if rebases >= ESCALATE_AFTER && self.fence.as_ref().is_some_and(|f| !f.record.exclusive) {
                        self.make_fence_exclusive()?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Commits what is gathered once it is a chunk's worth.
    fn flush_if_large(&mut self) -> Result<()> {
        if self.pending.lock().unwrap_or_else(|e| e.into_inner()).ops.len() >= CHUNK_OPS {
            self.flush()?;
        }
        Ok(())
    }

    /// After `batch` committed: the stamps the next commit expects.
    fn committed_batch(&mut self, batch: &Batch, renewed: Option<Fence>) -> Result<()> {
        if batch.ops.iter().any(|o| o.key() == layout::STATE) {
            let now = self.store.get_stamped(layout::STATE)?.map(|(bytes, stamp)| (state_digest(&Zeroizing::new(bytes)), stamp));
            match now {
                Some((digest, stamp)) if digest == self.seen => self.stamp = Some(stamp),
                _ => return Err(StoreError::Conflict { key: layout::STATE.to_owned() }.into()),
            }
            self.base = self.encoded.clone();
        }
        if batch.ops.iter().any(is_durable) {
            self.committed = true;
        }
        if let Some(record) = renewed {
            let bytes = record.encode();
            match self.store.get_stamped(layout::FENCE)? {
                Some((now, stamp)) if now == bytes => {
                    self.fence = Some(HeldFence { record, stamp, renewed: Instant::now() });
                }
                _ => return Err(StoreError::Conflict { key: layout::FENCE.to_owned() }.into()),
            }
        }
        Ok(())
    }

    /// After a conflict: takes in what another writer committed, when that
    /// cannot touch the change in progress, and gathers `ops` (the writes
    /// that were refused) again on top of it. Whether it could.
    ///
    /// It can when the committed state differs from the one this change
    /// read only by first versions of policies this change does not know:
    /// what a wrap under a new policy commits. Those keys join this value;
    /// a generation this change is adding gets their sealed copies; a
    /// revocation not yet committed gives each a second version, since the
    /// first was sealed without the revoked machine's negation. Any other
    /// difference (another rotation or revocation, a fence lost) is a
    /// conflict.
    fn rebase(&mut self, ops: Vec<Op>) -> Result<bool> {
        if let Some(held) = &self.fence {
            if self.store.get_stamped(layout::FENCE)?.map(|(_, s)| s) != Some(held.stamp) {
                return Ok(false);
            }
        } else if self.fence_seen.is_some() {
            // A wrap adding a key: a fence renewed is still no reason to
            // wait; one made exclusive is (starting over, it waits).
            match self.store.get_stamped(layout::FENCE)? {
                None => self.fence_seen = Some(None),
                Some((bytes, stamp)) => match Fence::parse(&bytes) {
                    Some(f) if f.is_live() && f.exclusive => return Ok(false),
                    _ => self.fence_seen = Some(Some(stamp)),
                },
            }
        }
        let Some((bytes, stamp)) = self.store.get_stamped(layout::STATE)? else { return Ok(false) };
        let bytes = Zeroizing::new(bytes);
        let fresh = Self::decode(self.store.clone(), &bytes)?;
        let theirs = fresh.view();
        if theirs.generations != self.base.generations
            || theirs.revoked != self.base.revoked
            || fresh.signer.public() != self.signer.public()
            || !self.base.keys.is_subset(&theirs.keys)
        {
            return Ok(false);
        }
        let ours: HashSet<[u8; 32]> = self.keys.iter().map(|k| *k.policy_id()).chain(self.base.keys.iter().map(|(p, _)| *p)).collect();
        let added: Vec<PolicyKey> = fresh.keys.into_iter().filter(|k| !self.base.keys.contains(&(*k.policy_id(), k.version))).collect();
        if added.iter().any(|k| k.version != 1 || ours.contains(k.policy_id())) {
            return Ok(false);
        }
        let adopted: HashSet<([u8; 32], u32)> = added.iter().map(|k| (*k.policy_id(), k.version)).collect();
        let had_state = ops.iter().any(|o| o.key() == layout::STATE);
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            *pending = Batch::default();
            for op in ops {
                let keep = match &op {
                    // Encoded again below, from the merged state.
                    Op::Put(k, _) => ![layout::STATE, layout::GENERATIONS, layout::REVOKED].contains(&k.as_str()),
                    // A clean-up that listed the new keys' copies before
                    // it knew them.
                    Op::Delete(k) => !layout::parse_sealed(k).is_some_and(|n| adopted.contains(&(n.policy_id, n.version))),
                };
                if keep {
                    pending.push(op);
                }
            }
        }
        let adding: Vec<u32> = self
            .live()
            .map(|g| g.number)
            .filter(|n| !self.base.generations.iter().any(|(b, st)| b == n && st.is_live()))
            .collect();
        let revoking = self.revoked.iter().any(|r| !self.base.revoked.iter().any(|b| b.id == r.id));
        for k in added {
            for g in self.generations.iter().filter(|g| adding.contains(&g.number)) {
                let excluded = revocation::excluded_for(&self.revoked, g.number);
                let blob = sealed::seal(&self.signer, &g.pk, g.number, &k.policy, k.version, &k.public, &k.private, &excluded)?;
                self.put(&layout::sealed(k.policy_id(), k.version, g.number), &blob);
            }
            let policy = k.policy.clone();
            self.keys.push(k);
            if revoking {
                let (private, public) = hpke::keypair(&mut OsRng);
                let next = PolicyKey { policy, version: 2, public, private };
                self.seal_everywhere(&next)?;
                self.keys.push(next);
            }
        }
        self.stamp = Some(stamp);
        self.base = theirs;
        if had_state {
            self.commit()?;
        } else {
            // This value no longer is the state it was decoded from.
            self.seen = [0; 32];
        }
        Ok(true)
    }

    /// Runs a change under the store's writer lock, from the committed
    /// state: `long` names a long operation, which takes the store's fence
    /// where the lock keeps no one out. A conflict met before anything was
    /// committed starts it over from the state committed then (so `f` may
    /// run more than once). If it fails midway, this value may hold changes
    /// that were never committed; forgetting which state it was read from
    /// makes the next operation read the committed one again instead of
    /// building on them.
    fn change<T>(&mut self, long: Option<&'static str>, mut f: impl FnMut(&mut Self) -> Result<T>) -> Result<T> {
        let _lock = self.store.lock(LOCK_WAIT)?;
        self.conflicts = Conflicts::default();
        let mut backoff = pauses();
        loop {
            let result = self.attempt(long, &mut f);
            if let Some(held) = self.fence.take() {
                self.release_fence(held);
            }
            match result {
                Ok(t) => return Ok(t),
                Err(e) => {
                    *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Batch::default();
                    self.seen = [0; 32];
                    let conflict = matches!(e, WrapError::Store(StoreError::Conflict { .. }));
                    if !conflict || self.committed || self.conflicts.retried >= RETRIES {
                        return Err(e);
                    }
                    self.conflicts.retried += 1;
                    std::thread::sleep(backoff.pause());
                }
            }
        }
    }

    fn attempt<T>(&mut self, long: Option<&'static str>, f: &mut impl FnMut(&mut Self) -> Result<T>) -> Result<T> {
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Batch::default();
        self.committed = false;
        self.fence_seen = None;
        if let Some(operation) = long {
            if !self.store.lock_is_exclusive() {
                self.take_fence(operation)?;
            }
        }
        self.refresh()?;
        let t = f(self)?;
        self.flush()?;
        Ok(t)
    }

    /// Takes the store's fence for `operation`, waiting while another long
    /// operation holds it (up to [`FENCE_WAIT`]).
    fn take_fence(&mut self, operation: &'static str) -> Result<()> {
        let start = Instant::now();
        loop {
            // Any live record keeps another long operation out; an expired
            // one, or one that is not a record, holds nothing.
            let expect = self.wait_for_fence(start, Fence::is_live)?;
            let mine = Fence::new(operation);
            let bytes = mine.encode();
            let take = Batch { expect: vec![(layout::FENCE.to_owned(), expect)], ops: vec![Op::Put(layout::FENCE.to_owned(), bytes.clone())] };
            match self.store.commit(&take) {
                Ok(()) => {}
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
            if let Some((now, stamp)) = self.store.get_stamped(layout::FENCE)? {
                if now == bytes {
                    self.fence = Some(HeldFence { record: mine, stamp, renewed: Instant::now() });
                    self.conflicts.waited += start.elapsed();
                    return Ok(());
                }
            }
        }
    }

    /// Waits while the fence record `holds` (with jittered pauses, up to
    /// [`FENCE_WAIT`] since `start`), then gives the stamp of what is
    /// there (`None`: nothing), for a commit to expect.
    fn wait_for_fence(&self, start: Instant, holds: impl Fn(&Fence) -> bool) -> Result<Option<Stamp>> {
        let mut backoff = pauses();
        loop {
            let Some((bytes, stamp)) = self.store.get_stamped(layout::FENCE)? else { return Ok(None) };
            match Fence::parse(&bytes) {
                Some(f) if holds(&f) => {
                    if start.elapsed() >= FENCE_WAIT {
                        return Err(StoreError::Fenced { operation: f.operation, process: f.process, waited: start.elapsed() }.into());
                    }
                    std::thread::sleep(backoff.pause());
                }
                _ => return Ok(Some(stamp)),
            }
        }
    }

    /// Makes the fence this change holds exclusive: wraps that would add a
    /// policy key wait until it is let go.
    fn make_fence_exclusive(&mut self) -> Result<()> {
        let Some(held) = &self.fence else { return Ok(()) };
        let record = held.record.exclusive();
        let bytes = record.encode();
        let batch = Batch { expect: vec![(layout::FENCE.to_owned(), Some(held.stamp))], ops: vec![Op::Put(layout::FENCE.to_owned(), bytes.clone())] };
        self.store.commit(&batch)?;
        match self.store.get_stamped(layout::FENCE)? {
            Some((now, stamp)) if now == bytes => {
                self.fence = Some(HeldFence { record, stamp, renewed: Instant::now() });
                self.conflicts.held_wraps = true;
                Ok(())
            }
            _ => Err(StoreError::Conflict { key: layout::FENCE.to_owned() }.into()),
        }
    }

    /// For a wrap about to add a policy key, on a store without a writer
    /// lock: waits while a long operation holds the fence exclusively (up
    /// to [`FENCE_WAIT`]), then notes the fence's stamp for the commit to
    /// expect, so that a fence made exclusive meanwhile stops the commit.
    fn respect_fence(&mut self) -> Result<()> {
        if self.store.lock_is_exclusive() || self.fence.is_some() {
            return Ok(());
        }
        let start = Instant::now();
        self.fence_seen = Some(self.wait_for_fence(start, |f| f.is_live() && f.exclusive)?);
        self.conflicts.waited += start.elapsed();
        Ok(())
    }

    /// Lets the fence go; if that fails (the store is down), it expires
    /// within [`fence::TTL`].
    fn release_fence(&self, held: HeldFence) {
        let release = Batch { expect: vec![(layout::FENCE.to_owned(), Some(held.stamp))], ops: vec![Op::Delete(layout::FENCE.to_owned())] };
        let _ = self.store.commit(&release);
    }

    /// The authority's public (Ed25519 verification) key: every envelope
    /// and sealed policy key it makes is signed with the private half, and
    /// every machine key it issues carries this one.
    pub fn public_key(&self) -> [u8; 32] {
        self.signer.public()
    }

    fn decode(store: Arc<dyn Store>, b: &[u8]) -> Result<Self> {
        const O: &str = "authority state";
        let mut r = reader(b, O, STATE_MAGIC)?;
        let signer = AuthorityKey::from_bytes(&Zeroizing::new(r.array("signing key").map_err(codec(O))?));
        let n = r.u16("generation count").map_err(codec(O))?;
        let mut generations = Vec::new();
        for _ in 0..n {
            let number = r.u32("generation").map_err(codec(O))?;
            let code = r.u8("state").map_err(codec(O))?;
            let state = GenerationState::from_code(code)
                .ok_or_else(|| malformed(O, format!("unknown generation state {code}")))?;
            let pk = PublicKey::from_bytes(r.bytes32("public key").map_err(codec(O))?)?;
            let msk_bytes = r.bytes32("master secret key").map_err(codec(O))?;
            let msk = if msk_bytes.is_empty() { None } else { Some(MasterSecretKey::from_bytes(msk_bytes)?) };
            if state.is_live() != msk.is_some() {
                return Err(malformed(
                    O,
                    format!(
                        "generation {number} is {state:?} but its master key is {}",
                        if msk.is_some() { "present" } else { "missing" }
                    ),
                ));
            }
            generations.push(Generation { number, state, pk, msk });
        }
        let n = r.u32("policy key count").map_err(codec(O))?;
        let mut keys = Vec::new();
        for _ in 0..n {
            let policy_id = r.array("policy id").map_err(codec(O))?;
            let version = r.u32("version").map_err(codec(O))?;
            let policy = CanonicalPolicy::decode(r.text16("policy").map_err(codec(O))?, &policy_id, O)?;
            let public = r.array("public key").map_err(codec(O))?;
            let private = Zeroizing::new(r.array("private key").map_err(codec(O))?);
            keys.push(PolicyKey { policy, version, public, private });
        }
        // Revocations follow, when there are any: a state without them is
        // byte for byte what a keyfence before revocation wrote.
        let mut revoked: Vec<Revoked> = Vec::new();
        if r.remaining() > 0 {
            let n = r.u32("revoked count").map_err(codec(O))?;
            if n == 0 {
                return Err(malformed(O, "an empty revocation section (a state without revocations has none)"));
            }
            for i in 0..n {
                let id = r.text16(|| format!("revoked id[{i}]")).map_err(codec(O))?.to_owned();
                revocation::check_machine_id(&id).map_err(|e| malformed(O, e.to_string()))?;
                let through = r.u32(|| format!("revoked through[{i}]")).map_err(codec(O))?;
                let pending = match r.u8(|| format!("revoked pending[{i}]")).map_err(codec(O))? {
                    0 => false,
                    1 => true,
                    b => return Err(malformed(O, format!("revoked pending[{i}] is {b}, not 0 or 1"))),
                };
                if revoked.iter().any(|x| x.id == id) {
                    return Err(malformed(O, format!("machine {id} is revoked twice")));
                }
                revoked.push(Revoked { id, through, pending });
            }
        }
        r.finish().map_err(codec(O))?;
        if generations.iter().filter(|g| g.state == GenerationState::Active).count() != 1 {
            return Err(malformed(O, "exactly one generation must be active"));
        }
        Ok(Self::with_state(store, signer, generations, keys, revoked, state_digest(b)))
    }

    /// An authority holding this state, with no change in progress.
    fn with_state(
        store: Arc<dyn Store>,
        signer: AuthorityKey,
        generations: Vec<Generation>,
        keys: Vec<PolicyKey>,
        revoked: Vec<Revoked>,
        seen: [u8; 32],
    ) -> Self {
        Self {
            store,
            signer,
            generations,
            keys,
            revoked,
            seen,
            stamp: None,
            pending: Default::default(),
            base: View::default(),
            encoded: View::default(),
            committed: false,
            fence: None,
            fence_seen: None,
            conflicts: Conflicts::default(),
            compact_after_revoke: true,
        }
    }

    /// The state's encoding. Every count and length was checked when the
    /// generation or policy key was added (`rotate_master`, `wrap`), so
    /// nothing here can overflow its field.
    fn encode(&self) -> Zeroizing<Vec<u8>> {
        let mut w = writer(STATE_MAGIC);
        w.raw(&self.signer.to_bytes()[..]).len16(self.generations.len());
        for g in &self.generations {
            w.u32(g.number).u8(g.state.code()).bytes32(&g.pk.to_bytes());
            match &g.msk {
                Some(m) => w.bytes32(&m.to_bytes()),
                None => w.bytes32(&[]),
            };
        }
        w.len32(self.keys.len());
        for k in &self.keys {
            w.raw(k.policy_id()).u32(k.version).bytes16(k.policy.as_bytes()).raw(&k.public).raw(&k.private[..]);
        }
        if !self.revoked.is_empty() {
            // Ids were checked (at most 64 bytes) when revoked; the count
            // is below u32::MAX as every revocation is a commit.
            w.len32(self.revoked.len());
            for r in &self.revoked {
                w.bytes16(r.id.as_bytes()).u32(r.through).u8(u8::from(r.pending));
            }
        }
        w.into_bytes()
    }

    /// Gathers the state (the commit point of every operation on a store
    /// without transactions) and the replicated generation list.
    fn commit(&mut self) -> Result<()> {
        let state = self.encode();
        self.put(layout::STATE, &state);
        self.seen = state_digest(&state);
        self.encoded = self.view();
        let list = generation_list::encode(&self.signer, self.generations.iter().map(|g| (g.number, g.state)));
        self.put(layout::GENERATIONS, &list);
        if !self.revoked.is_empty() {
            self.put(layout::REVOKED, &revocation::encode_list(&self.signer, &self.revoked));
        }
        Ok(())
    }

    fn live(&self) -> impl Iterator<Item = &Generation> {
        self.generations.iter().filter(|g| g.state.is_live())
    }

    /// Deletes sealed copies that no committed state refers to: left by an
    /// interrupted wrap or rotation, or belonging to retired generations.
    /// Only names that are sealed copies' (`sealed/{policy id}/{version}/
    /// {generation}`): a name this authority cannot account for (another
    /// store's, someone's file) is never deleted.
    fn collect_garbage(&mut self) -> Result<usize> {
        let wanted = |name: &str| match layout::parse_sealed(name) {
            Some(s) => {
                self.keys.iter().any(|k| *k.policy_id() == s.policy_id && k.version == s.version)
                    && self.live().any(|g| g.number == s.generation)
            }
            None => true,
        };
        let unwanted: Vec<String> = self.store.list(layout::SEALED)?.into_iter().filter(|n| !wanted(n)).collect();
        let removed = unwanted.len();
        for name in unwanted {
            self.delete(&name);
            self.flush_if_large()?;
        }
        // Re-publish in case an interruption came between the two writes.
        self.commit()?;
        Ok(removed)
    }

    /// A summary of generations, policy keys and envelopes.
    ///
    /// # Errors
    /// [`WrapError::Store`] if the store cannot be listed.
    pub fn status(&self) -> Result<Status> {
        let (fresh, _) = self.latest()?;
        let this = fresh.as_ref().unwrap_or(self);
        let mut policies: Vec<&[u8; 32]> = this.keys.iter().map(|k| k.policy_id()).collect();
        policies.sort();
        policies.dedup();
        Ok(Status {
            generations: this.generations.iter().map(|g| (g.number, g.state)).collect(),
            policies: policies.len(),
            policy_keys: this.keys.len(),
            envelopes: this.store.list(layout::ENVELOPES)?.len(),
            revoked: {
                let mut ids: Vec<String> = this.revoked.iter().map(|r| r.id.clone()).collect();
                ids.sort();
                ids
            },
            pending_revocations: this.revoked.iter().filter(|r| r.pending).map(|r| r.id.clone()).collect(),
        })
    }

    /// Issues a machine key: one CP-ABE attribute key per live generation,
    /// for `attrs` and the machine's id, attribute `machine`
    /// ([`MACHINE_LABEL`]). Without a `machine` attribute the authority
    /// makes a fresh id (128 random bits in hex: unique without a registry,
    /// so issuing still writes nothing); with one (a machine given a new
    /// key keeps its id) the id is checked and must not be revoked.
    ///
    /// # Errors
    /// [`WrapError::Revoked`] for a revoked id; [`WrapError::InvalidMachineId`]
    /// for an id a policy cannot name; [`WrapError::LimitExceeded`] for
    /// attributes the machine key format cannot hold (more than 65,535 with
    /// the id, or a label or value longer than 65,535 bytes);
    /// [`WrapError::Abe`] for attributes CP-ABE refuses (reserved label, a
    /// key too large for its format).
    pub fn issue(&self, attrs: &Attributes) -> Result<MachineKey> {
        // Checked before the CP-ABE work, which is per attribute: as given,
        // then with the id.
        MachineKey::check_attributes(attrs)?;
        let mut attrs = attrs.clone();
        if attrs.get(MACHINE_LABEL).is_none() {
            attrs.insert(MACHINE_LABEL, revocation::new_machine_id());
        }
        let attrs = &attrs;
        MachineKey::check_attributes(attrs)?;
        let id = attrs.get(MACHINE_LABEL).unwrap_or_default();
        revocation::check_new_machine_id(id)?;
        // Keys for the generations live now, not when this value was read.
        let (fresh, _) = self.latest()?;
        let this = fresh.as_ref().unwrap_or(self);
        if this.revoked.iter().any(|r| r.id == id) {
            return Err(WrapError::Revoked { id: id.to_owned() });
        }
        let mut keys = Vec::new();
        for g in this.live() {
            let msk = g.msk.as_ref().ok_or_else(|| {
                StateError::Inconsistent(format!("live generation {} has lost its master key", g.number))
            })?;
            keys.push((g.number, abe::keygen(msk, attrs)?));
        }
        keys.sort_by(|a, b| b.0.cmp(&a.0));
        MachineKey::new(this.signer.public(), attrs.clone(), keys)
    }

    /// Seals `k` under every live generation, each copy excluding the
    /// revoked machines that may hold a key of that generation.
    fn seal_everywhere(&self, k: &PolicyKey) -> Result<()> {
        for g in self.live() {
            let excluded = revocation::excluded_for(&self.revoked, g.number);
            let blob = sealed::seal(&self.signer, &g.pk, g.number, &k.policy, k.version, &k.public, &k.private, &excluded)?;
            self.put(&layout::sealed(k.policy_id(), k.version, g.number), &blob);
        }
        Ok(())
    }

    fn current(&self, pid: &[u8; 32]) -> Option<&PolicyKey> {
        self.keys.iter().filter(|k| k.policy_id() == pid).max_by_key(|k| k.version)
    }

    /// Wraps `secret` under `policy`: seals it to the policy's key (made
    /// and sealed under every live generation on first use), stores the
    /// envelope in the store and returns it.
    ///
    /// # Errors
    /// [`WrapError::Abe`] with the parse error for a malformed policy;
    /// [`WrapError::LimitExceeded`] for a policy whose canonical text is
    /// longer than 65,535 bytes or a secret of 4 GiB or more.
    pub fn wrap(&mut self, policy: &str, secret: &[u8]) -> Result<Envelope> {
        let policy = CanonicalPolicy::parse(policy).map_err(AbeError::from)?;
        check_policy(&policy)?;
        limit("secret length", secret.len(), super::format::MAX_SECRET)?;
        // Under the lock, from the committed state: a policy key another
        // process made is reused, and one it rotated away is never used.
        self.change(None, |a| {
            let pid = *policy.id();
            a.ensure_policy_key(policy.clone())?;
            a.seal_new_envelope(&pid, secret)
        })
    }

    /// Wraps each of `secrets` under `policy`, as [`Authority::wrap`] does
    /// one, in commits of at most 64 envelopes (a bulk load: one commit per
    /// envelope is an `fsync`, or an etcd round trip, each). The policy key
    /// is made and committed first if it is new; an interruption keeps the
    /// envelopes committed so far (they open) and loses the rest.
    ///
    /// # Errors
    /// As [`Authority::wrap`].
    pub fn wrap_many(&mut self, policy: &str, secrets: &[&[u8]]) -> Result<Vec<Envelope>> {
        let policy = CanonicalPolicy::parse(policy).map_err(AbeError::from)?;
        check_policy(&policy)?;
        for s in secrets {
            limit("secret length", s.len(), super::format::MAX_SECRET)?;
        }
        self.change(None, |a| {
            let pid = *policy.id();
            if a.ensure_policy_key(policy.clone())? {
                // The new key in a commit of its own, before the chunks.
                a.flush()?;
            }
            let mut out = Vec::with_capacity(secrets.len());
            for s in secrets {
                out.push(a.seal_new_envelope(&pid, s)?);
                a.flush_if_large()?;
            }
            Ok(out)
        })
    }

    /// Makes the first key of `policy`, in the change in progress, unless
    /// it has one; whether it made one.
    fn ensure_policy_key(&mut self, policy: CanonicalPolicy) -> Result<bool> {
        if self.current(policy.id()).is_some() {
            return Ok(false);
        }
        limit("policy key count", self.keys.len() + 1, u32::MAX as usize)?;
        self.respect_fence()?;
        let (private, public) = hpke::keypair(&mut OsRng);
        let k = PolicyKey { policy, version: 1, public, private };
        // Sealed copies first, then the commit: an interruption leaves
        // only unreferenced copies, which the next rotation deletes.
        self.seal_everywhere(&k)?;
        self.keys.push(k);
        self.commit()?;
        Ok(true)
    }

    /// Seals `secret` under the current key of `pid` as a new envelope,
    /// with a fresh random id, in the change in progress.
    fn seal_new_envelope(&self, pid: &[u8; 32], secret: &[u8]) -> Result<Envelope> {
        let mut secret_id = [0u8; 16];
        OsRng.fill_bytes(&mut secret_id);
        self.seal_envelope(&secret_id, pid, secret)
    }

    fn seal_envelope(&self, secret_id: &[u8; 16], pid: &[u8; 32], secret: &[u8]) -> Result<Envelope> {
        let k = self
            .current(pid)
            .ok_or_else(|| StateError::Inconsistent("the policy key to seal under is missing".into()))?;
        let env = Envelope::seal(&self.signer, secret_id, &k.policy, k.version, &k.public, secret)?;
        self.put(&layout::envelope(secret_id), env.to_bytes());
        Ok(env)
    }

    /// Rotates the master key: a new generation becomes active, the active
    /// one becomes decrypt-only, the decrypt-only one is retired (its
    /// master key and sealed copies deleted). Only policy keys are
    /// re-sealed; customer envelopes are not touched.
    ///
    /// # Errors
    /// [`WrapError::Store`] if the store fails. Whatever was committed
    /// stays; this value re-reads the committed state on its next call,
    /// and running the rotation again completes (or repeats) it.
    pub fn rotate_master(&mut self) -> Result<MasterRotation> {
        self.change(Some("rotate master"), Self::rotate_master_locked)
    }

    fn rotate_master_locked(&mut self) -> Result<MasterRotation> {
        limit("master generation count", self.generations.len() + 1, MAX_GENERATIONS)?;
        let number = self.generations.iter().map(|g| g.number).max().unwrap_or(0) + 1;
        let (pk, msk) = abe::setup()?;
        let mut retired = None;
        for g in &mut self.generations {
            match g.state {
                GenerationState::Active => g.state = GenerationState::DecryptOnly,
                GenerationState::DecryptOnly => {
                    g.state = GenerationState::Retired;
                    g.msk = None;
                    retired = Some(g.number);
                }
                GenerationState::Retired => {}
            }
        }
        // Named in this value before its copies are made: a wrap's new
        // policy key taken in by a re-base gets its copy too.
        self.generations.push(Generation { number, state: GenerationState::Active, pk, msk: Some(msk) });
        // Empty: every revoked machine was revoked before this generation
        // existed and is refused a key of it. This is where the negations
        // compact.
        let excluded = revocation::excluded_for(&self.revoked, number);
        // The new generation's copies go first, in commits of their own
        // (each comparing the state): until the state names the generation
        // no machine holds a key for it, so a rotation interrupted here
        // leaves only copies the next rotation overwrites or deletes. One
        // commit for them all would bound the policy keys a store can hold
        // by etcd's 128 operations per transaction. Keys a re-base adds
        // past `n` are sealed by it.
        let n = self.keys.len();
        for i in 0..n {
            let g = self.generations.last().ok_or_else(|| StateError::Inconsistent("no generation".into()))?;
            let k = &self.keys[i];
            let blob = sealed::seal(&self.signer, &g.pk, number, &k.policy, k.version, &k.public, &k.private, &excluded)?;
            self.put(&layout::sealed(k.policy_id(), k.version, number), &blob);
            self.flush_if_large()?;
        }
        self.commit()?;
        // The new generation (with the copies not yet committed); the
        // retired copies are deleted after it, in commits of their own.
        self.flush()?;
        self.collect_garbage()?;
        Ok(MasterRotation { new_generation: number, resealed: self.keys.len(), retired })
    }

    /// Replaces the policy key of `policy` (after a suspected exposure) and
    /// re-wraps every envelope under it in the store. The new key is
    /// committed before any envelope changes; the old versions are kept
    /// decrypt-only (envelopes outside the store, such as those written with
    /// `authority wrap --out`, still open) until
    /// [`Authority::retire_policy_keys`]. An envelope that cannot be
    /// re-wrapped is reported in [`PolicyRotation::skipped`] and does not
    /// stop the others. An interruption loses nothing; running the rotation
    /// again makes one more version and re-wraps what is left.
    ///
    /// # Errors
    /// [`WrapError::State`] ([`StateError::NoPolicyKey`]) if the policy has
    /// no key; [`WrapError::Abe`] for a policy that does not parse; store
    /// failures.
    pub fn rotate_policy_key(&mut self, policy: &str) -> Result<PolicyRotation> {
        let policy = CanonicalPolicy::parse(policy).map_err(AbeError::from)?;
        self.change(Some("rotate policy key"), |a| {
            let pid = *policy.id();
            let old = a.current(&pid).ok_or_else(|| StateError::NoPolicyKey(policy.to_string()))?;
            limit("policy key version", old.version as usize, u32::MAX as usize - 1)?;
            limit("policy key count", a.keys.len() + 1, u32::MAX as usize)?;
            let version = old.version + 1;
            let (private, public) = hpke::keypair(&mut OsRng);
            let k = PolicyKey { policy: policy.clone(), version, public, private };
            a.seal_everywhere(&k)?;
            a.keys.push(k);
            a.commit()?;
            // The new key is committed before any envelope moves to it:
            // the re-wrapping goes in chunks, each expecting this state.
            a.flush()?;
            let (rewrapped, skipped) = a.rewrap_store(&[pid])?;
            let decrypt_only = a.keys.iter().filter(|k| *k.policy_id() == pid && k.version != version).map(|k| k.version).collect();
            a.collect_garbage()?;
            Ok(PolicyRotation { version, rewrapped, skipped, decrypt_only })
        })
    }

    /// Deletes every version of `policy`'s key but the current one, with
    /// their sealed copies, after re-wrapping the store's envelopes still
    /// sealed to them. Envelopes outside the store sealed to a retired
    /// version can no longer be opened: run it once every copy handed out
    /// has been replaced.
    ///
    /// # Errors
    /// [`WrapError::State`] ([`StateError::NoPolicyKey`]) if the policy has
    /// no key; [`WrapError::Abe`] for a policy that does not parse; store
    /// failures (nothing is retired before the envelopes are re-wrapped).
    pub fn retire_policy_keys(&mut self, policy: &str) -> Result<PolicyRetirement> {
        let policy = CanonicalPolicy::parse(policy).map_err(AbeError::from)?;
        self.change(Some("retire policy keys"), |a| {
            let pid = *policy.id();
            let version = a.current(&pid).ok_or_else(|| StateError::NoPolicyKey(policy.to_string()))?.version;
            let (rewrapped, skipped) = a.rewrap_store(&[pid])?;
            let retired: Vec<u32> =
                a.keys.iter().filter(|k| *k.policy_id() == pid && k.version != version).map(|k| k.version).collect();
            a.keys.retain(|k| *k.policy_id() != pid || k.version == version);
            a.commit()?;
            a.collect_garbage()?;
            Ok(PolicyRetirement { version, retired, rewrapped, skipped })
        })
    }

    /// Revokes machine `id`: records it (authority-signed, in
    /// `public/revoked`), gives every policy a new key version sealed under
    /// each live generation as `policy and not machine: ID` (with the other
    /// machines revoked since that generation), commits, re-wraps the
    /// store's envelopes to the new versions, then retires every older
    /// version with its sealed copies, so a policy key the machine cached
    /// opens nothing the store serves. Every policy, because issuing
    /// records no machine's attributes (it writes nothing): the authority
    /// cannot know which policies the machine satisfies. From its first
    /// commit (after re-keying, before any envelope moves) every wrap seals
    /// to a version the machine cannot open. Then the store's history is
    /// compacted ([`Authority::set_compact_after_revoke`]), so the old
    /// envelopes are not still readable by revision.
    ///
    /// What the machine may still know: every secret stored under a policy
    /// it satisfied before, whether or not it opened it, if it kept the
    /// policy keys it cached (revocation replaces keys for what comes
    /// next; it cannot take back what was readable).
    ///
    /// An interruption leaves the id recorded as pending (its old versions
    /// still live); running `revoke` again for it makes one more version
    /// and finishes. For an id already fully revoked it does nothing and
    /// says so ([`Revocation::already`]). `issue` refuses the id from the
    /// first commit on.
    ///
    /// # Errors
    /// [`WrapError::InvalidMachineId`] for an id a policy cannot name;
    /// [`WrapError::Abe`] (`POLICY_TOO_LARGE`) when a policy with its
    /// negations no longer fits the CP-ABE format (rotate the master key
    /// twice, which compacts them); store failures (a re-run continues),
    /// the compaction's included (a re-run compacts).
    pub fn revoke(&mut self, id: &str) -> Result<Revocation> {
        revocation::check_machine_id(id)?;
        let started = Instant::now();
        let mut report = self.change(Some("revoke"), |a| {
            let mut report = Revocation {
                id: id.to_owned(),
                resumed: false,
                already: false,
                rekeyed: 0,
                rewrapped: 0,
                skipped: Vec::new(),
                retired: 0,
                compacted: false,
                rekeyed_after: Duration::ZERO,
            };
            match a.revoked.iter().find(|r| r.id == id) {
                Some(r) if !r.pending => {
                    // Done, but an interruption may have left the retired
                    // versions' copies behind.
                    report.already = true;
                    a.collect_garbage()?;
                    return Ok(report);
                }
                Some(_) => report.resumed = true,
                None => {
                    let through = a.live().map(|g| g.number).max().unwrap_or(0);
                    a.revoked.push(Revoked { id: id.to_owned(), through, pending: true });
                }
            }
            let mut pids: Vec<[u8; 32]> = a.keys.iter().map(|k| *k.policy_id()).collect();
            pids.sort();
            pids.dedup();
            for pid in &pids {
                let old = a.current(pid).ok_or_else(|| StateError::Inconsistent("a policy key is missing".into()))?;
                limit("policy key version", old.version as usize, u32::MAX as usize - 1)?;
                limit("policy key count", a.keys.len() + 1, u32::MAX as usize)?;
                let (private, public) = hpke::keypair(&mut OsRng);
                let k = PolicyKey { policy: old.policy.clone(), version: old.version + 1, public, private };
                a.seal_everywhere(&k)?;
                a.keys.push(k);
                // Copies no state refers to yet: an interruption leaves
                // garbage the next rotation deletes, never a gap.
                a.flush_if_large()?;
            }
            report.rekeyed = pids.len();
            // The id and the new versions, committed before any envelope
            // moves: from here `issue` refuses the id, and wraps seal to
            // versions the machine cannot open.
            a.commit()?;
            a.flush()?;
            report.rekeyed_after = started.elapsed();
            // Every policy now: a re-base may have taken in (and re-keyed)
            // policies a wrap added meanwhile.
            let mut pids: Vec<[u8; 32]> = a.keys.iter().map(|k| *k.policy_id()).collect();
            pids.sort();
            pids.dedup();
            let (rewrapped, skipped) = a.rewrap_store(&pids)?;
            report.rewrapped += rewrapped;
            report.skipped.extend(skipped);
            a.flush()?;
            let before = a.keys.len();
            // Older versions of the policies re-keyed go; a policy a wrap
            // added since (sealed with the negation) keeps its key.
            let current: std::collections::HashMap<[u8; 32], u32> =
                pids.iter().filter_map(|p| a.current(p).map(|k| (*p, k.version))).collect();
            a.keys.retain(|k| current.get(k.policy_id()).is_none_or(|v| *v == k.version));
            report.retired = before - a.keys.len();
            if let Some(r) = a.revoked.iter_mut().find(|r| r.id == id) {
                r.pending = false;
            }
            a.commit()?;
            a.flush()?;
            a.collect_garbage()?;
            Ok(report)
        })?;
        // Also when it was already done: a re-run after a failed
        // compaction compacts.
        if self.compact_after_revoke {
            report.compacted = self.store.compact()?;
        }
        Ok(report)
    }

    /// Re-wraps the store's envelopes of the policies `pids` sealed to an
    /// older version of their key to the current one, in one pass over
    /// the store. Store failures stop it (a re-run continues); a bad
    /// envelope is skipped and reported.
    ///
    /// Three stages overlap, so that the slowest alone bounds it: a reader
    /// thread scans the envelopes [`SCAN_PAGE`] at a time (one etcd range
    /// each, names and values together),
    /// workers on every core open and seal them again, and this thread
    /// commits the results while the workers go on with the next ones
    /// (etcd's round trips leave its core idle).
    fn rewrap_store(&mut self, pids: &[[u8; 32]]) -> Result<(usize, Vec<Skipped>)> {
        let mut keys = Vec::new();
        let mut current = std::collections::HashMap::new();
        for pid in pids {
            let k = self.current(pid).ok_or_else(|| StateError::Inconsistent("the policy key to re-wrap to is missing".into()))?;
            current.insert(*pid, k.version);
            keys.extend(self.keys.iter().filter(|k| k.policy_id() == pid).cloned());
        }
        // The workers' own copy of what they need: this thread keeps
        // `self` to commit with.
        let rewrapper = Rewrapper { signer: self.signer.clone(), keys, current };
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
                            self.put(&name, env.to_bytes());
                            rewrapped += 1;
                            self.flush_if_large()?;
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

/// Envelopes a re-wrap reads a page: etcd counts the whole rest of the
/// range for every range request, so pages of 128 made a 100,000-envelope
/// scan quadratic enough to bound a revocation; 1,000 (etcd's listing page
/// here too) is about 0.5 MB of envelopes.
const SCAN_PAGE: usize = 1000;

/// What re-wrapping envelopes needs, apart from the store: the signing
/// key, every key of the policies being re-wrapped, and the version each
/// is re-wrapped to.
struct Rewrapper {
    signer: AuthorityKey,
    keys: Vec<PolicyKey>,
    current: std::collections::HashMap<[u8; 32], u32>,
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
        Ok(Rewrap::Done(Envelope::seal(&self.signer, &env.secret_id, &k.policy, k.version, &k.public, &secret)?))
    }
}

/// What re-wrapping decided for one object of `envelopes/`.
enum Rewrap {
    /// Sealed to the current version: the new envelope to write.
    Done(Envelope),
    /// Left as it is, and why.
    Skip(SkipReason),
    /// Not one to re-wrap (another policy, already current, gone).
    Keep,
}

/// A digest of the state's bytes (which hold secrets, so they are not
/// kept): BLAKE2b-256, domain-separated.
fn state_digest(state: &[u8]) -> [u8; 32] {
    let h = blake2b_simd::Params::new().hash_length(32).personal(b"keyfence-state").hash(state);
    let mut out = [0u8; 32];
    out.copy_from_slice(h.as_bytes());
    out
}
