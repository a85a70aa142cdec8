//! The authority: master key generations, the policy keyring, wrapping,
//! issuing machine keys and rotation.
//!
//! Inside, by job: `state` (the persisted state and its codec), `txn`
//! (reading it with its stamp, committing against it, re-basing and
//! starting over, the fence), `rewrap` (re-wrapping the store's
//! envelopes); here, the operations themselves.

mod inventory;
mod json;
mod placement;
mod rewrap;
mod state;
mod txn;

use std::sync::Arc;
use std::time::{Duration, Instant};

use keyfence_policy::Attributes;
use rand_core::{OsRng, RngCore};
use zeroize::Zeroizing;

use super::error::{limit, Result, StateError};
// Named by the intra-doc links of the `# Errors` sections.
#[allow(unused_imports)]
use super::error::WrapError;
use super::format::{check_policy, Envelope};
use super::generation::GenerationState;
use super::generation_list;
use super::layout;
use super::machine::MachineKey;
use super::policy::CanonicalPolicy;
use super::revocation::{self, Revoked, MACHINE_LABEL};
use super::signing::AuthorityKey;
use super::store::{Store, StoreError};
use super::{hpke, sealed};
use crate::abe::{self, AbeError};

pub use inventory::{parse_inventory, Imported, InventoryMachine, Stranding};
pub use placement::{Latencies, Traffic, WhereGroup, WhereQuery, WhereReport};
pub use rewrap::{SkipReason, Skipped};
use state::{Digest, Generation, PolicyKey, State, MAX_GENERATIONS};
pub use txn::Conflicts;
use txn::{Txn, LOCK_WAIT};

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
    /// The state as committed when this value last read or wrote it (or,
    /// after an operation that failed midway, with changes no commit
    /// carried).
    state: State,
    /// The digest of the committed state's bytes that `state` is, to skip
    /// decoding them again when nothing changed; `None` when `state` holds
    /// changes no commit carried.
    digest: Option<Digest>,
    /// What the last operation met.
    conflicts: Conflicts,
    /// Whether `revoke` compacts the store's history when it is done.
    compact_after_revoke: bool,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("generations", &self.state.generation_states().collect::<Vec<_>>())
            .field("policy_keys", &self.state.keys.len())
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
        let state = State { signer: AuthorityKey::generate(), generations, keys: Vec::new(), revoked: Vec::new() };
        let mut a = Self::with_state(store, state, None);
        // Having read no state, its commit expects none: of two `init`s
        // racing on a store without a lock, one commits.
        let mut t = Txn::new();
        // The generation list first: it is what makes a directory a store
        // for the command line, so an `init` that dies before committing
        // leaves a store with no authority, which `init` can fill, never
        // an authority that no command recognises as a store.
        t.put(layout::GENERATIONS, &a.state.generation_list());
        a.stage_state(&mut t);
        match a.commit(&mut t) {
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
        let (bytes, _) = store.get_stamped(layout::STATE)?.ok_or(StateError::NoAuthority)?;
        store.check_nesting(false)?;
        let bytes = Zeroizing::new(bytes);
        let mut a = Self::with_state(store, State::decode(&bytes)?, Some(state::digest(&bytes)));
        if a.store.get(layout::GENERATIONS)?.as_deref().is_some_and(generation_list::is_unsigned_text) {
            a.change(None, |a, t| {
                t.put(layout::GENERATIONS, &a.state.generation_list());
                Ok(())
            })?;
        }
        Ok(a)
    }

    /// An authority holding `state` (whose bytes have `digest`, if it was
    /// read from the store).
    fn with_state(store: Arc<dyn Store>, state: State, digest: Option<Digest>) -> Self {
        Self { store, state, digest, conflicts: Conflicts::default(), compact_after_revoke: true }
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

    /// The authority's public (Ed25519 verification) key: every envelope
    /// and sealed policy key it makes is signed with the private half, and
    /// every machine key it issues carries this one.
    pub fn public_key(&self) -> [u8; 32] {
        self.state.signer.public()
    }

    /// Deletes sealed copies that no committed state refers to: left by an
    /// interrupted wrap or rotation, or belonging to retired generations.
    /// Only names that are sealed copies' (`sealed/{policy id}/{version}/
    /// {generation}`): a name this authority cannot account for (another
    /// store's, someone's file) is never deleted.
    fn collect_garbage(&mut self, t: &mut Txn) -> Result<usize> {
        let wanted = |name: &str| match layout::parse_sealed(name) {
            Some(s) => {
                self.state.keys.iter().any(|k| *k.policy_id() == s.policy_id && k.version == s.version)
                    && self.state.live().any(|g| g.number == s.generation)
            }
            None => true,
        };
        let unwanted: Vec<String> = self.store.list(layout::SEALED)?.into_iter().filter(|n| !wanted(n)).collect();
        let removed = unwanted.len();
        for name in unwanted {
            t.delete(&name);
            self.commit_if_large(t)?;
        }
        // Re-publish in case an interruption came between the two writes.
        self.stage_state(t);
        Ok(removed)
    }

    /// A summary of generations, policy keys and envelopes.
    ///
    /// # Errors
    /// [`WrapError::Store`] if the store cannot be listed.
    pub fn status(&self) -> Result<Status> {
        let (fresh, _) = self.latest()?;
        let this = fresh.as_ref().map_or(&self.state, |(state, _)| state);
        let mut policies: Vec<&[u8; 32]> = this.keys.iter().map(|k| k.policy_id()).collect();
        policies.sort();
        policies.dedup();
        Ok(Status {
            generations: this.generation_states().collect(),
            policies: policies.len(),
            policy_keys: this.keys.len(),
            envelopes: self.store.list(layout::ENVELOPES)?.len(),
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
    /// ([`MACHINE_LABEL`]), and records the machine in the inventory
    /// ([`Authority::inventory`]: id, attributes, generations, time), which
    /// is what lets the authority say where a policy can be used
    /// ([`Authority::where_usable`]) and refuse a rotation that would
    /// strand machines. Without a `machine` attribute the authority makes
    /// a fresh id (128 random bits in hex: unique without a registry); with
    /// one (a machine given a new key keeps its id) the id is checked, must
    /// not be revoked, and its inventory record is replaced.
    ///
    /// The record is committed expecting the authority's state as read: a
    /// rotation or revocation committed meanwhile makes `issue` start over
    /// (up to 8 times), so no key is handed out for a generation the
    /// inventory does not know it holds.
    ///
    /// # Errors
    /// [`WrapError::Revoked`] for a revoked id; [`WrapError::InvalidMachineId`]
    /// for an id a policy cannot name; [`WrapError::LimitExceeded`] for
    /// attributes the machine key format cannot hold (more than 65,535 with
    /// the id, or a label or value longer than 65,535 bytes);
    /// [`WrapError::Abe`] for attributes CP-ABE refuses (reserved label, a
    /// key too large for its format); [`WrapError::Store`] when the record
    /// cannot be written (no key is returned then).
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
        self.retrying(|a| {
            // Keys for the generations live now, not when this value was
            // read; the CP-ABE work outside the lock, so that issuing on
            // many threads runs on many cores.
            let (fresh, stamp) = a.latest()?;
            let this = fresh.as_ref().map_or(&a.state, |(state, _)| state);
            if this.revoked.iter().any(|r| r.id == id) {
                return Err(WrapError::Revoked { id: id.to_owned() });
            }
            let mut keys = Vec::new();
            for g in this.live() {
                let msk = g
                    .msk
                    .as_ref()
                    .ok_or_else(|| StateError::Inconsistent(format!("live generation {} has lost its master key", g.number)))?;
                keys.push((g.number, abe::keygen(msk, attrs)?));
            }
            keys.sort_by_key(|k| std::cmp::Reverse(k.0));
            let key = MachineKey::new(this.signer.public(), attrs.clone(), keys)?;
            // One writer of the shard at a time where the store's lock
            // keeps others out; on etcd the commit's expectations do. The
            // commit expects the state read above: a rotation meanwhile
            // starts this over.
            let _lock = a.store.lock(LOCK_WAIT)?;
            a.record_issued(stamp, id, attrs, &key.generations())?;
            Ok(key)
        })
    }

    /// Seals `k` under every live generation, each copy excluding the
    /// revoked machines that may hold a key of that generation.
    fn seal_everywhere(&self, t: &mut Txn, k: &PolicyKey) -> Result<()> {
        for g in self.state.live() {
            self.seal_under(t, g, k)?;
        }
        Ok(())
    }

    /// Seals `k` under generation `g`, excluding the revoked machines that
    /// may hold a key of it.
    fn seal_under(&self, t: &mut Txn, g: &Generation, k: &PolicyKey) -> Result<()> {
        let excluded = revocation::excluded_for(&self.state.revoked, g.number);
        let blob = sealed::seal(&self.state.signer, &g.pk, g.number, &k.policy, k.version, &k.public, &k.private, &excluded)?;
        t.put(&layout::sealed(k.policy_id(), k.version, g.number), &blob);
        Ok(())
    }

    /// For a re-base ([`Txn`]'s commit met a wrap's commit): takes in the
    /// policy keys `added` that wrap made (first versions). The live
    /// generations this change is `adding` get their sealed copies; if it
    /// is `revoking` a machine, each gets a second version at once, since
    /// the first was sealed without the revoked machine's negation.
    fn adopt(&mut self, t: &mut Txn, added: Vec<PolicyKey>, adding: &[u32], revoking: bool) -> Result<()> {
        for k in added {
            for g in self.state.generations.iter().filter(|g| adding.contains(&g.number)) {
                self.seal_under(t, g, &k)?;
            }
            let policy = k.policy.clone();
            self.state.keys.push(k);
            if revoking {
                let (private, public) = hpke::keypair(&mut OsRng);
                let next = PolicyKey { policy, version: 2, public, private };
                self.seal_everywhere(t, &next)?;
                self.state.keys.push(next);
            }
        }
        Ok(())
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
        self.change(None, |a, t| {
            let pid = *policy.id();
            a.ensure_policy_key(t, policy.clone())?;
            a.seal_new_envelope(t, &pid, secret)
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
        self.change(None, |a, t| {
            let pid = *policy.id();
            if a.ensure_policy_key(t, policy.clone())? {
                // The new key in a commit of its own, before the chunks.
                a.commit(t)?;
            }
            let mut out = Vec::with_capacity(secrets.len());
            for s in secrets {
                out.push(a.seal_new_envelope(t, &pid, s)?);
                a.commit_if_large(t)?;
            }
            Ok(out)
        })
    }

    /// Makes the first key of `policy`, in the change in progress, unless
    /// it has one; whether it made one.
    fn ensure_policy_key(&mut self, t: &mut Txn, policy: CanonicalPolicy) -> Result<bool> {
        if self.state.current(policy.id()).is_some() {
            return Ok(false);
        }
        limit("policy key count", self.state.keys.len() + 1, u32::MAX as usize)?;
        self.respect_fence(t)?;
        let (private, public) = hpke::keypair(&mut OsRng);
        let k = PolicyKey { policy, version: 1, public, private };
        // Sealed copies first, then the commit: an interruption leaves
        // only unreferenced copies, which the next rotation deletes.
        self.seal_everywhere(t, &k)?;
        self.state.keys.push(k);
        self.stage_state(t);
        Ok(true)
    }

    /// Seals `secret` under the current key of `pid` as a new envelope,
    /// with a fresh random id, in the change in progress.
    fn seal_new_envelope(&self, t: &mut Txn, pid: &[u8; 32], secret: &[u8]) -> Result<Envelope> {
        let mut secret_id = [0u8; 16];
        OsRng.fill_bytes(&mut secret_id);
        self.seal_envelope(t, &secret_id, pid, secret)
    }

    fn seal_envelope(&self, t: &mut Txn, secret_id: &[u8; 16], pid: &[u8; 32], secret: &[u8]) -> Result<Envelope> {
        let k = self.state.current(pid).ok_or_else(|| StateError::Inconsistent("the policy key to seal under is missing".into()))?;
        let env = Envelope::seal(&self.state.signer, secret_id, &k.policy, k.version, &k.public, secret)?;
        t.put(&layout::envelope(secret_id), env.to_bytes());
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

    /// As [`Authority::rotate_master`], but refused when the rotation
    /// would retire the newest generation of machines in the inventory
    /// (not revoked): they would open nothing afterwards
    /// ([`Authority::stranding`] says which). Checked under the fence,
    /// from the committed state, so no rotation racing this one changes
    /// the answer. What `keyfence authority rotate` does without `--force`.
    ///
    /// # Errors
    /// [`WrapError::WouldStrand`] with the machines it would strand;
    /// otherwise as [`Authority::rotate_master`].
    pub fn rotate_master_unless_stranding(&mut self) -> Result<MasterRotation> {
        self.change(Some("rotate master"), |a, t| {
            let retiring = a.state.generations.iter().find(|g| g.state == GenerationState::DecryptOnly).map(|g| g.number);
            let stranded = a.stranded_by(retiring)?;
            if let (Some(generation), false) = (retiring, stranded.is_empty()) {
                return Err(WrapError::WouldStrand { generation, count: stranded.len(), examples: stranded.into_iter().take(3).collect() });
            }
            a.rotate_master_locked(t)
        })
    }

    fn rotate_master_locked(&mut self, t: &mut Txn) -> Result<MasterRotation> {
        limit("master generation count", self.state.generations.len() + 1, MAX_GENERATIONS)?;
        let number = self.state.generations.iter().map(|g| g.number).max().unwrap_or(0) + 1;
        let (pk, msk) = abe::setup()?;
        let mut retired = None;
        for g in &mut self.state.generations {
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
        self.state.generations.push(Generation { number, state: GenerationState::Active, pk, msk: Some(msk) });
        // Empty: every revoked machine was revoked before this generation
        // existed and is refused a key of it. This is where the negations
        // compact.
        let excluded = revocation::excluded_for(&self.state.revoked, number);
        // The new generation's copies go first, in commits of their own
        // (each comparing the state): until the state names the generation
        // no machine holds a key for it, so a rotation interrupted here
        // leaves only copies the next rotation overwrites or deletes. One
        // commit for them all would bound the policy keys a store can hold
        // by etcd's 128 operations per transaction. Keys a re-base adds
        // past `n` are sealed by it.
        let n = self.state.keys.len();
        for i in 0..n {
            let g = self.state.generations.last().ok_or_else(|| StateError::Inconsistent("no generation".into()))?;
            let k = &self.state.keys[i];
            let blob = sealed::seal(&self.state.signer, &g.pk, number, &k.policy, k.version, &k.public, &k.private, &excluded)?;
            t.put(&layout::sealed(k.policy_id(), k.version, number), &blob);
            self.commit_if_large(t)?;
        }
        self.stage_state(t);
        // The new generation (with the copies not yet committed); the
        // retired copies are deleted after it, in commits of their own.
        self.commit(t)?;
        self.collect_garbage(t)?;
        Ok(MasterRotation { new_generation: number, resealed: self.state.keys.len(), retired })
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
        self.change(Some("rotate policy key"), |a, t| {
            let pid = *policy.id();
            let old = a.state.current(&pid).ok_or_else(|| StateError::NoPolicyKey(policy.to_string()))?;
            limit("policy key version", old.version as usize, u32::MAX as usize - 1)?;
            limit("policy key count", a.state.keys.len() + 1, u32::MAX as usize)?;
            let version = old.version + 1;
            let (private, public) = hpke::keypair(&mut OsRng);
            let k = PolicyKey { policy: policy.clone(), version, public, private };
            a.seal_everywhere(t, &k)?;
            a.state.keys.push(k);
            a.stage_state(t);
            // The new key is committed before any envelope moves to it:
            // the re-wrapping goes in chunks, each expecting this state.
            a.commit(t)?;
            let (rewrapped, skipped) = a.rewrap_store(t, &[pid])?;
            let decrypt_only = a.state.keys.iter().filter(|k| *k.policy_id() == pid && k.version != version).map(|k| k.version).collect();
            a.collect_garbage(t)?;
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
        self.change(Some("retire policy keys"), |a, t| {
            let pid = *policy.id();
            let version = a.state.current(&pid).ok_or_else(|| StateError::NoPolicyKey(policy.to_string()))?.version;
            let (rewrapped, skipped) = a.rewrap_store(t, &[pid])?;
            let retired: Vec<u32> =
                a.state.keys.iter().filter(|k| *k.policy_id() == pid && k.version != version).map(|k| k.version).collect();
            a.state.keys.retain(|k| *k.policy_id() != pid || k.version == version);
            a.stage_state(t);
            a.collect_garbage(t)?;
            Ok(PolicyRetirement { version, retired, rewrapped, skipped })
        })
    }

    /// Revokes machine `id`: records it (authority-signed, in
    /// `public/revoked`, and marked in the inventory), gives every policy a new key version sealed under
    /// each live generation as `policy and not machine: ID` (with the other
    /// machines revoked since that generation), commits, re-wraps the
    /// store's envelopes to the new versions, then retires every older
    /// version with its sealed copies, so a policy key the machine cached
    /// opens nothing the store serves. Every policy, because the inventory
    /// need not hold every machine (keys issued before it existed, or
    /// attributes imported by hand): the authority cannot be sure which
    /// policies the machine satisfies. From its first
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
        let mut report = self.change(Some("revoke"), |a, t| {
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
            match a.state.revoked.iter().find(|r| r.id == id) {
                Some(r) if !r.pending => {
                    // Done, but an interruption may have left the retired
                    // versions' copies behind.
                    report.already = true;
                    a.collect_garbage(t)?;
                    return Ok(report);
                }
                Some(_) => report.resumed = true,
                None => {
                    let through = a.state.live().map(|g| g.number).max().unwrap_or(0);
                    a.state.revoked.push(Revoked { id: id.to_owned(), through, pending: true });
                }
            }
            let mut pids: Vec<[u8; 32]> = a.state.keys.iter().map(|k| *k.policy_id()).collect();
            pids.sort();
            pids.dedup();
            for pid in &pids {
                let old = a.state.current(pid).ok_or_else(|| StateError::Inconsistent("a policy key is missing".into()))?;
                limit("policy key version", old.version as usize, u32::MAX as usize - 1)?;
                limit("policy key count", a.state.keys.len() + 1, u32::MAX as usize)?;
                let (private, public) = hpke::keypair(&mut OsRng);
                let k = PolicyKey { policy: old.policy.clone(), version: old.version + 1, public, private };
                a.seal_everywhere(t, &k)?;
                a.state.keys.push(k);
                // Copies no state refers to yet: an interruption leaves
                // garbage the next rotation deletes, never a gap.
                a.commit_if_large(t)?;
            }
            report.rekeyed = pids.len();
            // The id and the new versions, committed before any envelope
            // moves: from here `issue` refuses the id, and wraps seal to
            // versions the machine cannot open.
            a.stage_state(t);
            a.commit(t)?;
            report.rekeyed_after = started.elapsed();
            // Every policy now: a re-base may have taken in (and re-keyed)
            // policies a wrap added meanwhile.
            let mut pids: Vec<[u8; 32]> = a.state.keys.iter().map(|k| *k.policy_id()).collect();
            pids.sort();
            pids.dedup();
            let (rewrapped, skipped) = a.rewrap_store(t, &pids)?;
            report.rewrapped += rewrapped;
            report.skipped.extend(skipped);
            a.commit(t)?;
            let before = a.state.keys.len();
            // Older versions of the policies re-keyed go; a policy a wrap
            // added since (sealed with the negation) keeps its key.
            let current: std::collections::HashMap<[u8; 32], u32> =
                pids.iter().filter_map(|p| a.state.current(p).map(|k| (*p, k.version))).collect();
            a.state.keys.retain(|k| current.get(k.policy_id()).is_none_or(|v| *v == k.version));
            report.retired = before - a.state.keys.len();
            if let Some(r) = a.state.revoked.iter_mut().find(|r| r.id == id) {
                r.pending = false;
            }
            a.stage_state(t);
            a.commit(t)?;
            a.collect_garbage(t)?;
            Ok(report)
        })?;
        // The inventory, after the revocation committed (the revocation
        // list decides meanwhile): also when it was already done, for a
        // re-run after an interruption here.
        self.mark_revoked(id)?;
        // Also when it was already done: a re-run after a failed
        // compaction compacts.
        if self.compact_after_revoke {
            report.compacted = self.store.compact()?;
        }
        Ok(report)
    }
}
