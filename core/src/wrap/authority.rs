//! The authority: master key generations, the policy keyring, wrapping,
//! issuing machine keys and rotation.

use std::sync::Arc;
use std::time::Duration;

use keyfence_policy::Attributes;
use rand_core::{OsRng, RngCore};
use zeroize::Zeroizing;

use super::error::{codec, limit, malformed, Result, StateError, WrapError};
use super::format::{check_policy, reader, writer, Envelope, STATE_MAGIC};
use super::layout::{self, hex};
use super::machine::MachineKey;
use super::policy::CanonicalPolicy;
use super::store::Store;
use super::{hpke, sealed};
use crate::abe::{self, AbeError, MasterSecretKey, PublicKey};

/// Most generations the state's 16-bit count holds (retired ones stay
/// listed, so this bounds the number of master rotations).
const MAX_GENERATIONS: usize = u16::MAX as usize;

/// The life cycle of a master key generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationState {
    /// The newest generation: seals policy keys, decrypts.
    Active,
    /// The previous generation: still decrypts, seals nothing new.
    DecryptOnly,
    /// Retired: its master secret key and sealed copies are deleted.
    Retired,
}

impl GenerationState {
    /// The state's byte in the authority state and the generation list.
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Active => 0,
            Self::DecryptOnly => 1,
            Self::Retired => 2,
        }
    }

    pub(crate) fn from_code(c: u8) -> Option<Self> {
        match c {
            0 => Some(Self::Active),
            1 => Some(Self::DecryptOnly),
            2 => Some(Self::Retired),
            _ => None,
        }
    }

    /// Whether keys of this generation still decrypt.
    pub fn is_live(self) -> bool {
        self != Self::Retired
    }
}

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
pub struct PolicyRotation {
    /// The new policy key version.
    pub version: u32,
    /// Envelopes re-wrapped to it.
    pub rewrapped: usize,
}

/// A summary of the authority's state.
#[derive(Debug, Clone)]
pub struct Status {
    /// Every generation and its state, oldest first.
    pub generations: Vec<(u32, GenerationState)>,
    /// Distinct policies with a policy key.
    pub policies: usize,
    /// Policy key versions held (more than `policies` while a policy-key
    /// rotation is incomplete).
    pub policy_keys: usize,
    /// Envelopes in the store.
    pub envelopes: usize,
}

/// How long a writer waits for another to release the store's lock.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// The authority of a keyfence deployment: holds the master keys.
///
/// Many processes (and handles) may open one store. Reading never writes;
/// every change (`init`, `wrap`, the rotations) takes the store's writer
/// lock, re-reads the committed state under it, and commits before
/// releasing it, so no writer works from a stale state and none undoes
/// another's commit. `issue` and `status` read the latest committed state.
pub struct Authority {
    store: Arc<dyn Store>,
    generations: Vec<Generation>,
    keys: Vec<PolicyKey>,
    /// Digest of the state bytes this value was decoded from, to skip
    /// decoding again when nothing changed.
    seen: [u8; 32],
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
        if store.get(layout::STATE)?.is_some() {
            return Err(StateError::AuthorityExists.into());
        }
        let (pk, msk) = abe::setup()?;
        let mut a = Self {
            store,
            generations: vec![Generation { number: 1, state: GenerationState::Active, pk, msk: Some(msk) }],
            keys: Vec::new(),
            seen: [0; 32],
        };
        a.commit()?;
        Ok(a)
    }

    /// Opens the authority in `store`. Opening only reads: the cleanup an
    /// interrupted operation may leave (sealed copies no committed state
    /// refers to) is done by the next rotation, under the writer lock.
    ///
    /// # Errors
    /// [`WrapError::State`] if there is no authority; [`WrapError::Malformed`]
    /// if its state does not decode.
    pub fn open(store: Arc<dyn Store>) -> Result<Self> {
        let bytes = Zeroizing::new(store.get(layout::STATE)?.ok_or(StateError::NoAuthority)?);
        Self::decode(store, &bytes)
    }

    /// The latest committed state: `None` when it is the one this value
    /// holds, else a fresh decoding of it.
    fn latest(&self) -> Result<Option<Self>> {
        let bytes = Zeroizing::new(self.store.get(layout::STATE)?.ok_or(StateError::NoAuthority)?);
        if state_digest(&bytes) == self.seen {
            return Ok(None);
        }
        Self::decode(self.store.clone(), &bytes).map(Some)
    }

    /// Brings this value up to the committed state (call under the lock).
    fn refresh(&mut self) -> Result<()> {
        if let Some(fresh) = self.latest()? {
            *self = fresh;
        }
        Ok(())
    }

    fn decode(store: Arc<dyn Store>, b: &[u8]) -> Result<Self> {
        const O: &str = "authority state";
        let mut r = reader(b, O, STATE_MAGIC)?;
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
        Ok(Self { store, generations, keys, seen: state_digest(b) })
    }

    /// The state's encoding. Every count and length was checked when the
    /// generation or policy key was added (`rotate_master`, `wrap`), so
    /// nothing here can overflow its field.
    fn encode(&self) -> Zeroizing<Vec<u8>> {
        let mut w = writer(STATE_MAGIC);
        w.len16(self.generations.len());
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

    /// Writes the state (the commit point of every operation) and the
    /// replicated generation list.
    fn commit(&mut self) -> Result<()> {
        let state = self.encode();
        self.store.put(layout::STATE, &state)?;
        self.seen = state_digest(&state);
        let list = layout::encode_generations(self.generations.iter().map(|g| (g.number, g.state)));
        self.store.put(layout::GENERATIONS, list.as_bytes())?;
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
        let mut removed = 0;
        for name in self.store.list(layout::SEALED)? {
            if !wanted(&name) {
                self.store.delete(&name)?;
                removed += 1;
            }
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
        let fresh = self.latest()?;
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
        let fresh = self.latest()?;
        let this = fresh.as_ref().unwrap_or(self);
        let mut keys = Vec::new();
        for g in this.live() {
            let msk = g.msk.as_ref().ok_or_else(|| {
                StateError::Inconsistent(format!("live generation {} has lost its master key", g.number))
            })?;
            keys.push((g.number, abe::keygen(msk, attrs)?));
        }
        keys.sort_by(|a, b| b.0.cmp(&a.0));
        MachineKey::new(attrs.clone(), keys)
    }

    fn seal_everywhere(&self, k: &PolicyKey) -> Result<()> {
        for g in self.live() {
            let blob = sealed::seal(&g.pk, g.number, &k.policy, k.version, &k.public, &k.private)?;
            self.store.put(&layout::sealed(k.policy_id(), k.version, g.number), &blob)?;
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
        let _lock = self.store.lock(LOCK_WAIT)?;
        self.refresh()?;
        let pid = *policy.id();
        if self.current(&pid).is_none() {
            limit("policy key count", self.keys.len() + 1, u32::MAX as usize)?;
            let (private, public) = hpke::keypair(&mut OsRng);
            let k = PolicyKey { policy, version: 1, public, private };
            // Sealed copies first, then the commit: an interruption leaves
            // only unreferenced copies, which the next rotation deletes.
            self.seal_everywhere(&k)?;
            self.keys.push(k);
            self.commit()?;
        }
        let mut secret_id = [0u8; 16];
        OsRng.fill_bytes(&mut secret_id);
        self.seal_envelope(&secret_id, &pid, secret)
    }

    fn seal_envelope(&self, secret_id: &[u8; 16], pid: &[u8; 32], secret: &[u8]) -> Result<Envelope> {
        let k = self
            .current(pid)
            .ok_or_else(|| StateError::Inconsistent("the policy key to seal under is missing".into()))?;
        let env = Envelope::seal(secret_id, &k.policy, k.version, &k.public, secret)?;
        self.store.put(&layout::envelope(secret_id), env.to_bytes())?;
        Ok(env)
    }

    /// Rotates the master key: a new generation becomes active, the active
    /// one becomes decrypt-only, the decrypt-only one is retired (its
    /// master key and sealed copies deleted). Only policy keys are
    /// re-sealed; customer envelopes are not touched.
    ///
    /// # Errors
    /// [`WrapError::Store`] if the store fails; the authority is then
    /// unchanged (reopen it to clean up).
    pub fn rotate_master(&mut self) -> Result<MasterRotation> {
        let _lock = self.store.lock(LOCK_WAIT)?;
        self.refresh()?;
        limit("master generation count", self.generations.len() + 1, MAX_GENERATIONS)?;
        let number = self.generations.iter().map(|g| g.number).max().unwrap_or(0) + 1;
        let (pk, msk) = abe::setup()?;
        let new = Generation { number, state: GenerationState::Active, pk, msk: Some(msk) };
        for k in &self.keys {
            let blob = sealed::seal(&new.pk, number, &k.policy, k.version, &k.public, &k.private)?;
            self.store.put(&layout::sealed(k.policy_id(), k.version, number), &blob)?;
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
        self.collect_garbage()?;
        Ok(MasterRotation { new_generation: number, resealed: self.keys.len(), retired })
    }

    /// Replaces the policy key of `policy` (after a suspected exposure) and
    /// re-wraps every envelope under it. The new key is committed before
    /// any envelope changes and the old one is dropped only after all have,
    /// so an interruption loses nothing; running it again finishes the job.
    ///
    /// # Errors
    /// [`WrapError::State`] ([`StateError::NoPolicyKey`]) if the policy has
    /// no key; store failures.
    pub fn rotate_policy_key(&mut self, policy: &str) -> Result<PolicyRotation> {
        let policy = CanonicalPolicy::parse(policy).map_err(AbeError::from)?;
        let _lock = self.store.lock(LOCK_WAIT)?;
        self.refresh()?;
        let pid = *policy.id();
        let old = self.current(&pid).ok_or_else(|| StateError::NoPolicyKey(policy.to_string()))?;
        limit("policy key version", old.version as usize, u32::MAX as usize - 1)?;
        let version = old.version + 1;
        let (private, public) = hpke::keypair(&mut OsRng);
        let k = PolicyKey { policy, version, public, private };
        self.seal_everywhere(&k)?;
        self.keys.push(k);
        self.commit()?;
        let mut rewrapped = 0;
        for name in self.store.list(layout::ENVELOPES)? {
            let Some(bytes) = self.store.get(&name)? else { continue };
            let env = Envelope::parse(&bytes)?;
            if env.policy_id != pid || env.key_version == version {
                continue;
            }
            let old = self
                .keys
                .iter()
                .find(|k| *k.policy_id() == pid && k.version == env.key_version)
                .ok_or(WrapError::UnknownPolicyKey { policy_id: hex(&pid), version: env.key_version })?;
            let secret = hpke::open(&old.private, &env.enc, env.aad(), &env.ciphertext)?;
            self.seal_envelope(&env.secret_id, &pid, &secret)?;
            rewrapped += 1;
        }
        self.keys.retain(|k| *k.policy_id() != pid || k.version == version);
        self.commit()?;
        self.collect_garbage()?;
        Ok(PolicyRotation { version, rewrapped })
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
