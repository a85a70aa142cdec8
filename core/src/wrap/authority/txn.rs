//! The authority's transactions: every change reads the committed state
//! with its stamp (on etcd, its revision), gathers its writes in a [`Txn`]
//! and commits them expecting that stamp (and the fence it holds), so that
//! no writer works from a stale state and none undoes another's commit.
//!
//! A commit refused because a wrap added a policy key meanwhile is
//! re-based on it and sent again; any other conflict met before anything
//! was committed starts the change over, a bounded number of times with
//! growing, jittered pauses. A long operation (a rotation, retiring, a
//! revocation) holds the store's fence where the store's lock keeps no one
//! out (`docs/wrapping.md`, "Writers at once").

use std::collections::HashSet;
use std::time::{Duration, Instant};

use zeroize::Zeroizing;

use super::state::{self, Digest, PolicyKey, State};
use super::Authority;
use crate::backoff::{Backoff, Jitter};
use crate::wrap::error::{Result, StateError, WrapError};
use crate::wrap::fence::{self, Fence};
use crate::wrap::generation::GenerationState;
use crate::wrap::layout;
use crate::wrap::revocation::{self, Revoked};
use crate::wrap::store::{Batch, Op, Stamp, StoreError};

/// How long a writer waits for another to release the store's lock.
pub(super) const LOCK_WAIT: Duration = Duration::from_secs(30);

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

/// What a state holds that a conflicting commit is compared on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct View {
    generations: Vec<(u32, GenerationState)>,
    keys: HashSet<([u8; 32], u32)>,
    revoked: Vec<Revoked>,
}

impl View {
    fn of(state: &State) -> Self {
        View {
            generations: state.generation_states().collect(),
            keys: state.keys.iter().map(|k| (*k.policy_id(), k.version)).collect(),
            revoked: state.revoked.clone(),
        }
    }
}

/// The fence a long operation holds, and the stamp of its record.
struct HeldFence {
    record: Fence,
    stamp: Stamp,
    renewed: Instant,
}

/// Where a change stands with the store's fence.
enum FenceUse {
    /// Neither held nor expected: a store whose lock keeps other writers
    /// out, or a change that adds no policy key and is not long.
    Unused,
    /// Held by this change (a long operation): every commit expects it.
    Held(HeldFence),
    /// A wrap adding a policy key, on a store without a writer lock: the
    /// stamp of the fence record it found not exclusive (`None`: absent),
    /// which its commits expect, so that a fence made exclusive meanwhile
    /// stops them.
    Seen(Option<Stamp>),
}

/// One attempt at a change: what it read and at which stamp, the writes it
/// gathers for its next commit, and the fence it holds. Made for each
/// attempt ([`Authority::change`]) and dropped after it.
pub(super) struct Txn {
    /// The stamp of the committed state this change read, or last
    /// committed: what its next commit expects (`None`: no state, as for
    /// `init`).
    read: Option<Stamp>,
    /// What that committed state holds.
    base: View,
    /// The state gathered for the next commit ([`Authority::stage_state`]):
    /// the digest of its bytes and what it holds.
    staged: Option<(Digest, View)>,
    /// The writes gathered for the next commit.
    writes: Batch,
    /// Whether it committed a write it would repeat if it started over.
    durable: bool,
    fence: FenceUse,
}

impl Txn {
    /// A change that has read nothing yet: its commits expect no state
    /// until it has read one ([`Authority::refresh`]).
    pub(super) fn new() -> Self {
        Txn { read: None, base: View::default(), staged: None, writes: Batch::default(), durable: false, fence: FenceUse::Unused }
    }

    /// Adds a write to the next commit (in place of an earlier write of
    /// the same object).
    pub(super) fn put(&mut self, key: &str, value: &[u8]) {
        self.writes.push(Op::Put(key.to_owned(), value.to_vec()));
    }

    pub(super) fn delete(&mut self, key: &str) {
        self.writes.push(Op::Delete(key.to_owned()));
    }
}

/// Whether a write is one a started-over attempt would repeat: sealed
/// copies no committed state names yet are not (the attempt that follows
/// writes them again, or the next rotation deletes them), nor is a fence.
fn is_durable(op: &Op) -> bool {
    !(op.key() == layout::FENCE || matches!(op, Op::Put(k, _) if k.starts_with(layout::SEALED)))
}

impl Authority {
    /// The latest committed state and its stamp: `None` for the state when
    /// it is the one this value holds, else a fresh decoding of it (with
    /// its digest).
    pub(super) fn latest(&self) -> Result<(Option<(State, Digest)>, Stamp)> {
        let (bytes, stamp) = self.store.get_stamped(layout::STATE)?.ok_or(StateError::NoAuthority)?;
        let bytes = Zeroizing::new(bytes);
        let digest = state::digest(&bytes);
        if self.digest == Some(digest) {
            return Ok((None, stamp));
        }
        Ok((Some((State::decode(&bytes)?, digest)), stamp))
    }

    /// Brings this value up to the committed state (call under the lock),
    /// and `t` to expect it.
    fn refresh(&mut self, t: &mut Txn) -> Result<()> {
        let (fresh, stamp) = self.latest()?;
        if let Some((state, digest)) = fresh {
            self.state = state;
            self.digest = Some(digest);
        }
        t.read = Some(stamp);
        t.base = View::of(&self.state);
        Ok(())
    }

    /// Gathers the state (the commit point of every operation on a store
    /// without transactions) and the replicated generation list, for the
    /// next commit.
    pub(super) fn stage_state(&self, t: &mut Txn) {
        let state = self.state.encode();
        t.put(layout::STATE, &state);
        t.staged = Some((state::digest(&state), View::of(&self.state)));
        t.put(layout::GENERATIONS, &self.state.generation_list());
        if !self.state.revoked.is_empty() {
            t.put(layout::REVOKED, &revocation::encode_list(&self.state.signer, &self.state.revoked));
        }
    }

    /// Commits the writes gathered so far, expecting the state this change
    /// read (and the fence it holds). When they included the state, the
    /// stamp of the state just written becomes the expectation of the next
    /// commit: read back, and a conflict if it is not ours (another writer
    /// came between). A conflict with a wrap that added a policy key is
    /// re-based on it ([`Authority::rebase`]) and sent again.
    pub(super) fn commit(&mut self, t: &mut Txn) -> Result<()> {
        let mut rebases = 0;
        loop {
            let mut ops = std::mem::take(&mut t.writes.ops);
            let renew = matches!(&t.fence, FenceUse::Held(f) if f.renewed.elapsed() >= fence::TTL / 3);
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
            let mut expect = vec![(layout::STATE.to_owned(), t.read)];
            let mut renewed = None;
            match &t.fence {
                FenceUse::Unused => {}
                FenceUse::Seen(seen) => expect.push((layout::FENCE.to_owned(), *seen)),
                FenceUse::Held(f) => {
                    expect.push((layout::FENCE.to_owned(), Some(f.stamp)));
                    if renew {
                        let r = f.record.renewed();
                        ops.push(Op::Put(layout::FENCE.to_owned(), r.encode()));
                        renewed = Some(r);
                    }
                }
            }
            let batch = Batch { expect, ops };
            match self.store.commit(&batch) {
                Ok(()) => {
                    self.committed(t, &batch, renewed)?;
                    if rest.is_empty() {
                        return Ok(());
                    }
                    rest.append(&mut t.writes.ops);
                    t.writes.ops = rest;
                }
                Err(StoreError::Conflict { .. }) if rebases < REBASES => {
                    let ops = batch.ops.into_iter().filter(|o| o.key() != layout::FENCE).chain(rest).collect();
                    if !self.rebase(t, ops)? {
                        return Err(StoreError::Conflict { key: layout::STATE.to_owned() }.into());
                    }
                    rebases += 1;
                    self.conflicts.rebased += 1;
                    if rebases >= ESCALATE_AFTER && matches!(&t.fence, FenceUse::Held(f) if !f.record.exclusive) {
                        self.make_fence_exclusive(t)?;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Commits what is gathered once it is a chunk's worth.
    pub(super) fn commit_if_large(&mut self, t: &mut Txn) -> Result<()> {
        if t.writes.ops.len() >= CHUNK_OPS {
            self.commit(t)?;
        }
        Ok(())
    }

    /// After `batch` committed: the stamps the next commit expects.
    fn committed(&mut self, t: &mut Txn, batch: &Batch, renewed: Option<Fence>) -> Result<()> {
        if batch.ops.iter().any(|o| o.key() == layout::STATE) {
            let now = self.store.get_stamped(layout::STATE)?.map(|(bytes, stamp)| (state::digest(&Zeroizing::new(bytes)), stamp));
            match (now, &t.staged) {
                (Some((digest, stamp)), Some((ours, view))) if digest == *ours => {
                    t.read = Some(stamp);
                    t.base = view.clone();
                    self.digest = Some(digest);
                }
                _ => return Err(StoreError::Conflict { key: layout::STATE.to_owned() }.into()),
            }
        }
        if batch.ops.iter().any(is_durable) {
            t.durable = true;
        }
        if let Some(record) = renewed {
            let bytes = record.encode();
            match self.store.get_stamped(layout::FENCE)? {
                Some((now, stamp)) if now == bytes => {
                    t.fence = FenceUse::Held(HeldFence { record, stamp, renewed: Instant::now() });
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
    /// what a wrap under a new policy commits. Those keys join this value
    /// ([`Authority::adopt`]). Any other difference (another rotation or
    /// revocation, a fence lost) is a conflict.
    fn rebase(&mut self, t: &mut Txn, ops: Vec<Op>) -> Result<bool> {
        match &mut t.fence {
            FenceUse::Held(held) => {
                if self.store.get_stamped(layout::FENCE)?.map(|(_, s)| s) != Some(held.stamp) {
                    return Ok(false);
                }
            }
            // A wrap adding a key: a fence renewed is still no reason to
            // wait; one made exclusive is (starting over, it waits).
            FenceUse::Seen(seen) => match self.store.get_stamped(layout::FENCE)? {
                None => *seen = None,
                Some((bytes, stamp)) => match Fence::parse(&bytes) {
                    Some(f) if f.is_live() && f.exclusive => return Ok(false),
                    _ => *seen = Some(stamp),
                },
            },
            FenceUse::Unused => {}
        }
        let Some((bytes, stamp)) = self.store.get_stamped(layout::STATE)? else { return Ok(false) };
        let bytes = Zeroizing::new(bytes);
        let fresh = State::decode(&bytes)?;
        let theirs = View::of(&fresh);
        if theirs.generations != t.base.generations
            || theirs.revoked != t.base.revoked
            || fresh.signer.public() != self.state.signer.public()
            || !t.base.keys.is_subset(&theirs.keys)
        {
            return Ok(false);
        }
        let ours: HashSet<[u8; 32]> = self.state.keys.iter().map(|k| *k.policy_id()).chain(t.base.keys.iter().map(|(p, _)| *p)).collect();
        let added: Vec<PolicyKey> = fresh.keys.into_iter().filter(|k| !t.base.keys.contains(&(*k.policy_id(), k.version))).collect();
        if added.iter().any(|k| k.version != 1 || ours.contains(k.policy_id())) {
            return Ok(false);
        }
        let adopted: HashSet<([u8; 32], u32)> = added.iter().map(|k| (*k.policy_id(), k.version)).collect();
        let had_state = ops.iter().any(|o| o.key() == layout::STATE);
        t.writes = Batch::default();
        for op in ops {
            let keep = match &op {
                // Encoded again below, from the merged state.
                Op::Put(k, _) => ![layout::STATE, layout::GENERATIONS, layout::REVOKED].contains(&k.as_str()),
                // A clean-up that listed the new keys' copies before
                // it knew them.
                Op::Delete(k) => !layout::parse_sealed(k).is_some_and(|n| adopted.contains(&(n.policy_id, n.version))),
            };
            if keep {
                t.writes.push(op);
            }
        }
        // What this change adds over the state it read: generations made
        // live, machines revoked.
        let adding: Vec<u32> =
            self.state.live().map(|g| g.number).filter(|n| !t.base.generations.iter().any(|(b, st)| b == n && st.is_live())).collect();
        let revoking = self.state.revoked.iter().any(|r| !t.base.revoked.iter().any(|b| b.id == r.id));
        self.adopt(t, added, &adding, revoking)?;
        // This value no longer is the state it was decoded from.
        self.digest = None;
        t.read = Some(stamp);
        t.base = theirs;
        if had_state {
            self.stage_state(t);
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
    pub(super) fn change<T>(&mut self, long: Option<&'static str>, mut f: impl FnMut(&mut Self, &mut Txn) -> Result<T>) -> Result<T> {
        let _lock = self.store.lock(LOCK_WAIT)?;
        self.conflicts = Conflicts::default();
        let mut backoff = pauses();
        loop {
            let mut t = Txn::new();
            let result = self.attempt(&mut t, long, &mut f);
            if let FenceUse::Held(held) = t.fence {
                self.release_fence(held);
            }
            match result {
                Ok(v) => return Ok(v),
                Err(e) => {
                    self.digest = None;
                    let conflict = matches!(e, WrapError::Store(StoreError::Conflict { .. }));
                    if !conflict || t.durable || self.conflicts.retried >= RETRIES {
                        return Err(e);
                    }
                    self.conflicts.retried += 1;
                    std::thread::sleep(backoff.pause());
                }
            }
        }
    }

    fn attempt<T>(&mut self, t: &mut Txn, long: Option<&'static str>, f: &mut impl FnMut(&mut Self, &mut Txn) -> Result<T>) -> Result<T> {
        if let Some(operation) = long {
            if !self.store.lock_is_exclusive() {
                self.take_fence(t, operation)?;
            }
        }
        self.refresh(t)?;
        let v = f(self, t)?;
        self.commit(t)?;
        Ok(v)
    }

    /// Takes the store's fence for `operation`, waiting while another long
    /// operation holds it (up to [`FENCE_WAIT`]).
    fn take_fence(&mut self, t: &mut Txn, operation: &'static str) -> Result<()> {
        let start = Instant::now();
        loop {
            // Any live record keeps another long operation out; an expired
            // one, or one that is not a record, holds nothing.
            let expect = self.wait_for_fence(start, Fence::is_live)?;
            let mine = Fence::new(operation);
            let bytes = mine.encode();
            let take =
                Batch { expect: vec![(layout::FENCE.to_owned(), expect)], ops: vec![Op::Put(layout::FENCE.to_owned(), bytes.clone())] };
            match self.store.commit(&take) {
                Ok(()) => {}
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
            if let Some((now, stamp)) = self.store.get_stamped(layout::FENCE)? {
                if now == bytes {
                    t.fence = FenceUse::Held(HeldFence { record: mine, stamp, renewed: Instant::now() });
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
    fn make_fence_exclusive(&mut self, t: &mut Txn) -> Result<()> {
        let FenceUse::Held(held) = &t.fence else { return Ok(()) };
        let record = held.record.exclusive();
        let bytes = record.encode();
        let batch = Batch {
            expect: vec![(layout::FENCE.to_owned(), Some(held.stamp))],
            ops: vec![Op::Put(layout::FENCE.to_owned(), bytes.clone())],
        };
        self.store.commit(&batch)?;
        match self.store.get_stamped(layout::FENCE)? {
            Some((now, stamp)) if now == bytes => {
                t.fence = FenceUse::Held(HeldFence { record, stamp, renewed: Instant::now() });
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
    pub(super) fn respect_fence(&mut self, t: &mut Txn) -> Result<()> {
        if self.store.lock_is_exclusive() || matches!(t.fence, FenceUse::Held(_)) {
            return Ok(());
        }
        let start = Instant::now();
        t.fence = FenceUse::Seen(self.wait_for_fence(start, |f| f.is_live() && f.exclusive)?);
        self.conflicts.waited += start.elapsed();
        Ok(())
    }

    /// Lets the fence go; if that fails (the store is down), it expires
    /// within [`fence::TTL`].
    fn release_fence(&self, held: HeldFence) {
        let release = Batch { expect: vec![(layout::FENCE.to_owned(), Some(held.stamp))], ops: vec![Op::Delete(layout::FENCE.to_owned())] };
        let _ = self.store.commit(&release);
    }
}
