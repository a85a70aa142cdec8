//! The authority: master key generations, the policy keyring, wrapping,
//! issuing machine keys and rotation.

use std::sync::Arc;
use std::time::Duration;

use keyfence_policy::Attributes;
use rand_core::{OsRng, RngCore};
use zeroize::Zeroizing;

use super::error::{codec, limit, malformed, Result, StateError};
// Named by the intra-doc links of the `# Errors` sections.
#[allow(unused_imports)]
use super::error::WrapError;
use super::format::{check_policy, reader, writer, Envelope, STATE_MAGIC};
use super::generation::GenerationState;
use super::generation_list;
use super::signing::AuthorityKey;
use super::layout::{self, hex};
use super::machine::MachineKey;
use super::policy::CanonicalPolicy;
use super::store::{Batch, Op, Stamp, Store, StoreError};
use super::{hpke, sealed};
use crate::abe::{self, AbeError, MasterSecretKey, PublicKey};

/// Most generations the state's 16-bit count holds (retired ones stay
/// listed, so this bounds the number of master rotations).
const MAX_GENERATIONS: usize = u16::MAX as usize;

struct Generation {
    number: u32,
    state: GenerationState,
    pk: PublicKey,
    msk: Option<MasterSecretKey>,
}

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
}

/// How long a writer waits for another to release the store's lock.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// Writes a long operation (re-wrapping a store's envelopes) sends in one
/// commit once its state is committed: under etcd's default limit of 128
/// operations per transaction and, at envelope sizes, its 1.5 MiB request.
const CHUNK_OPS: usize = 64;

/// The authority of a keyfence deployment: holds the master keys.
///
/// Many processes (and handles) may open one store. Reading never writes;
/// every change (`init`, `wrap`, the rotations) takes the store's writer
/// lock, re-reads the committed state under it, gathers its writes and
/// commits them with [`Store::commit`], expecting the state it read, so no
/// writer works from a stale state and none undoes another's commit. On a
/// store without a lock (etcd) two writers racing: one commits, the other
/// gets [`StoreError::Conflict`] with nothing written. `issue` and
/// `status` read the latest committed state.
pub struct Authority {
    store: Arc<dyn Store>,
    signer: AuthorityKey,
    generations: Vec<Generation>,
    keys: Vec<PolicyKey>,
    /// Digest of the state bytes this value was decoded from, to skip
    /// decoding again when nothing changed.
    seen: [u8; 32],
    /// The store's stamp of the state this change started from: what the
    /// commit expects to find.
    stamp: Option<Stamp>,
    /// The writes of the change in progress, committed together.
    pending: std::sync::Mutex<Batch>,
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
        // Create-exclusive: two `init`s on one store cannot both succeed.
        let _lock = store.lock(LOCK_WAIT)?;
        if store.get_stamped(layout::STATE)?.is_some() {
            return Err(StateError::AuthorityExists.into());
        }
        let (pk, msk) = abe::setup()?;
        let mut a = Self {
            store,
            signer: AuthorityKey::generate(),
            generations: vec![Generation { number: 1, state: GenerationState::Active, pk, msk: Some(msk) }],
            keys: Vec::new(),
            seen: [0; 32],
            stamp: None,
            pending: Default::default(),
        };
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
        let bytes = Zeroizing::new(bytes);
        let mut a = Self::decode(store, &bytes)?;
        a.stamp = Some(stamp);
        if a.store.get(layout::GENERATIONS)?.as_deref().is_some_and(generation_list::is_unsigned_text) {
            a.change(|a| {
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
            *self = fresh;
        }
        self.stamp = Some(stamp);
        Ok(())
    }

    /// Adds a write to the change in progress.
    fn put(&self, key: &str, value: &[u8]) {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(Op::Put(key.to_owned(), value.to_vec()));
    }

    fn delete(&self, key: &str) {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).push(Op::Delete(key.to_owned()));
    }

    /// Commits the writes gathered so far, expecting the state this change
    /// started from. When they included the state, the stamp of the state
    /// just written becomes the expectation of the next flush: read back,
    /// and a conflict if it is not ours (another writer came between).
    fn flush(&mut self) -> Result<()> {
        let ops = std::mem::take(&mut self.pending.lock().unwrap_or_else(|e| e.into_inner()).ops);
        if ops.is_empty() {
            return Ok(());
        }
        let wrote_state = ops.iter().any(|o| o.key() == layout::STATE);
        let batch = Batch { expect: vec![(layout::STATE.to_owned(), self.stamp)], ops };
        self.store.commit(&batch)?;
        if wrote_state {
            let now = self.store.get_stamped(layout::STATE)?.map(|(bytes, stamp)| (state_digest(&Zeroizing::new(bytes)), stamp));
            match now {
                Some((digest, stamp)) if digest == self.seen => self.stamp = Some(stamp),
                _ => return Err(StoreError::Conflict { key: layout::STATE.to_owned() }.into()),
            }
        }
        Ok(())
    }

    /// Commits what is gathered once it is a chunk's worth.
    fn flush_if_large(&mut self) -> Result<()> {
        if self.pending.lock().unwrap_or_else(|e| e.into_inner()).ops.len() >= CHUNK_OPS {
            self.flush()?;
        }
        Ok(())
    }

    /// Runs a change under the store's writer lock, from the committed
    /// state. If it fails midway, this value may hold changes that were
    /// never committed; forgetting which state it was read from makes the
    /// next operation read the committed one again instead of building on
    /// them.
    fn change<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let _lock = self.store.lock(LOCK_WAIT)?;
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Batch::default();
        self.refresh()?;
        let result = f(self).and_then(|t| self.flush().map(|()| t));
        if result.is_err() {
            *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Batch::default();
            self.seen = [0; 32];
        }
        result
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
        r.finish().map_err(codec(O))?;
        if generations.iter().filter(|g| g.state == GenerationState::Active).count() != 1 {
            return Err(malformed(O, "exactly one generation must be active"));
        }
        Ok(Self { store, signer, generations, keys, seen: state_digest(b), stamp: None, pending: Default::default() })
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
        w.into_bytes()
    }

    /// Gathers the state (the commit point of every operation on a store
    /// without transactions) and the replicated generation list.
    fn commit(&mut self) -> Result<()> {
        let state = self.encode();
        self.put(layout::STATE, &state);
        self.seen = state_digest(&state);
        let list = generation_list::encode(&self.signer, self.generations.iter().map(|g| (g.number, g.state)));
        self.put(layout::GENERATIONS, &list);
        Ok(())
    }

    fn live(&self) -> impl Iterator<Item = &Generation> {
        self.generations.iter().filter(|g| g.state.is_live())
    }

    /// Deletes sealed copies that no committed state refers to: left by an
    /// interrupted wrap or rotation, or belonging to retired generations.
    fn collect_garbage(&mut self) -> Result<usize> {
        let wanted = |name: &str| {
            layout::parse_sealed(name).is_some_and(|s| {
                self.keys.iter().any(|k| *k.policy_id() == s.policy_id && k.version == s.version)
                    && self.live().any(|g| g.number == s.generation)
            })
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
        })
    }

    /// Issues a machine key: one CP-ABE attribute key per live generation.
    ///
    /// # Errors
    /// [`WrapError::LimitExceeded`] for attributes the machine key format
    /// cannot hold (more than 65,535, or a label or value longer than
    /// 65,535 bytes); [`WrapError::Abe`] for attributes CP-ABE refuses
    /// (reserved label, a key too large for its format).
    pub fn issue(&self, attrs: &Attributes) -> Result<MachineKey> {
        // Checked before the CP-ABE work, which is per attribute.
        MachineKey::check_attributes(attrs)?;
        // Keys for the generations live now, not when this value was read.
        let (fresh, _) = self.latest()?;
        let this = fresh.as_ref().unwrap_or(self);
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

    fn seal_everywhere(&self, k: &PolicyKey) -> Result<()> {
        for g in self.live() {
            let blob = sealed::seal(&self.signer, &g.pk, g.number, &k.policy, k.version, &k.public, &k.private)?;
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
        self.change(|a| {
            let pid = *policy.id();
            if a.current(&pid).is_none() {
                limit("policy key count", a.keys.len() + 1, u32::MAX as usize)?;
                let (private, public) = hpke::keypair(&mut OsRng);
                let k = PolicyKey { policy, version: 1, public, private };
                // Sealed copies first, then the commit: an interruption leaves
                // only unreferenced copies, which the next rotation deletes.
                a.seal_everywhere(&k)?;
                a.keys.push(k);
                a.commit()?;
            }
            let mut secret_id = [0u8; 16];
            OsRng.fill_bytes(&mut secret_id);
            a.seal_envelope(&secret_id, &pid, secret)
        })
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
        self.change(Self::rotate_master_locked)
    }

    fn rotate_master_locked(&mut self) -> Result<MasterRotation> {
        limit("master generation count", self.generations.len() + 1, MAX_GENERATIONS)?;
        let number = self.generations.iter().map(|g| g.number).max().unwrap_or(0) + 1;
        let (pk, msk) = abe::setup()?;
        let new = Generation { number, state: GenerationState::Active, pk, msk: Some(msk) };
        for k in &self.keys {
            let blob = sealed::seal(&self.signer, &new.pk, number, &k.policy, k.version, &k.public, &k.private)?;
            self.put(&layout::sealed(k.policy_id(), k.version, number), &blob);
        }
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
        self.generations.push(new);
        self.commit()?;
        // The new generation and its copies in one commit; the retired
        // copies are deleted after it, in commits of their own.
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
        self.change(|a| {
            let pid = *policy.id();
            let old = a.current(&pid).ok_or_else(|| StateError::NoPolicyKey(policy.to_string()))?;
            limit("policy key version", old.version as usize, u32::MAX as usize - 1)?;
            limit("policy key count", a.keys.len() + 1, u32::MAX as usize)?;
            let version = old.version + 1;
            let (private, public) = hpke::keypair(&mut OsRng);
            let k = PolicyKey { policy, version, public, private };
            a.seal_everywhere(&k)?;
            a.keys.push(k);
            a.commit()?;
            // The new key is committed before any envelope moves to it:
            // the re-wrapping goes in chunks, each expecting this state.
            a.flush()?;
            let (rewrapped, skipped) = a.rewrap_store(&pid)?;
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
        self.change(|a| {
            let pid = *policy.id();
            let version = a.current(&pid).ok_or_else(|| StateError::NoPolicyKey(policy.to_string()))?.version;
            let (rewrapped, skipped) = a.rewrap_store(&pid)?;
            let retired: Vec<u32> =
                a.keys.iter().filter(|k| *k.policy_id() == pid && k.version != version).map(|k| k.version).collect();
            a.keys.retain(|k| *k.policy_id() != pid || k.version == version);
            a.commit()?;
            a.collect_garbage()?;
            Ok(PolicyRetirement { version, retired, rewrapped, skipped })
        })
    }

    /// Re-wraps the store's envelopes of policy `pid` sealed to an older
    /// version of its key to the current one. Store failures stop it (a
    /// re-run continues); a bad envelope is skipped and reported.
    fn rewrap_store(&mut self, pid: &[u8; 32]) -> Result<(usize, Vec<Skipped>)> {
        let current = self.current(pid).ok_or_else(|| StateError::Inconsistent("the policy key to re-wrap to is missing".into()))?.version;
        let mut rewrapped = 0;
        let mut skipped = Vec::new();
        // Read in batches: one request per 128 envelopes on etcd, not one each.
        let names = self.store.list(layout::ENVELOPES)?;
        for chunk in names.chunks(128) {
            let values = self.store.get_many(chunk)?;
            for (name, bytes) in chunk.iter().zip(values) {
                let Some(bytes) = bytes else { continue };
                let skip = |reason| Skipped { name: name.clone(), reason };
                let env = match Envelope::parse(&bytes) {
                    Ok(env) => env,
                    Err(e) => {
                        skipped.push(skip(SkipReason::Malformed(e.to_string())));
                        continue;
                    }
                };
                if env.policy_id != *pid || env.key_version == current {
                    continue;
                }
                if let Err(e) = env.verify(&self.signer.public()) {
                    skipped.push(skip(SkipReason::NotSigned(e.to_string())));
                    continue;
                }
                if *name != layout::envelope(&env.secret_id) {
                    skipped.push(skip(SkipReason::Misnamed(hex(&env.secret_id))));
                    continue;
                }
                let Some(old) = self.keys.iter().find(|k| k.policy_id() == pid && k.version == env.key_version) else {
                    skipped.push(skip(SkipReason::RetiredVersion(env.key_version)));
                    continue;
                };
                let Ok(secret) = hpke::open(&old.private, &env.enc, env.aad(), &env.ciphertext) else {
                    skipped.push(skip(SkipReason::DoesNotOpen(env.key_version)));
                    continue;
                };
                self.seal_envelope(&env.secret_id, pid, &secret)?;
                rewrapped += 1;
                self.flush_if_large()?;
            }
        }
        Ok((rewrapped, skipped))
    }
}

/// A digest of the state's bytes (which hold secrets, so they are not
/// kept): BLAKE2b-256, domain-separated.
fn state_digest(state: &[u8]) -> [u8; 32] {
    let h = blake2b_simd::Params::new().hash_length(32).personal(b"keyfence-state").hash(state);
    let mut out = [0u8; 32];
    out.copy_from_slice(h.as_bytes());
    out
}
