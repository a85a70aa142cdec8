//! The authority: master key generations, the policy keyring, wrapping,
//! issuing machine keys and rotation.

use std::sync::Arc;

use keyfence_policy::Attributes;
use rand_core::{OsRng, RngCore};
use zeroize::Zeroizing;

use super::error::{malformed, Result, WrapError};
use super::format::{hex, policy_id, put16, put32, Cursor, Envelope};
use super::machine::MachineKey;
use super::store::Store;
use super::{hpke, sealed};
use crate::abe::{self, AbeError, MasterSecretKey, PublicKey};

const STATE_KEY: &str = "authority/state";
const STATE_MAGIC: &[u8; 4] = b"KFA1";
/// Replicated list of generations and their states, for machines.
pub(crate) const GENERATIONS_KEY: &str = "public/generations";

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
    fn code(self) -> u8 {
        match self {
            Self::Active => 0,
            Self::DecryptOnly => 1,
            Self::Retired => 2,
        }
    }

    fn from_code(c: u8) -> Result<Self> {
        Ok(match c {
            0 => Self::Active,
            1 => Self::DecryptOnly,
            2 => Self::Retired,
            _ => return Err(malformed("authority state", format!("unknown generation state {c}"))),
        })
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
    policy_id: [u8; 32],
    version: u32,
    policy: String,
    public: [u8; 32],
    private: Zeroizing<[u8; 32]>,
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

/// The authority of a keyfence deployment. Holds the master keys; one
/// process at a time should open a given store for writing.
pub struct Authority {
    store: Arc<dyn Store>,
    generations: Vec<Generation>,
    keys: Vec<PolicyKey>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("generations", &self.generations.iter().map(|g| (g.number, g.state)).collect::<Vec<_>>())
            .field("policy_keys", &self.keys.len())
            .finish_non_exhaustive()
    }
}

fn sealed_key(pid: &[u8; 32], version: u32, generation: u32) -> String {
    format!("sealed/{}/{version}/{generation}", hex(pid))
}

fn envelope_key(secret_id: &[u8; 16]) -> String {
    format!("envelopes/{}", hex(secret_id))
}

impl Authority {
    /// Creates an authority with its first master generation in `store`.
    ///
    /// # Errors
    /// [`WrapError::State`] if the store already holds an authority.
    pub fn init(store: Arc<dyn Store>) -> Result<Self> {
        if store.get(STATE_KEY)?.is_some() {
            return Err(WrapError::State("the store already holds an authority".into()));
        }
        let (pk, msk) = abe::setup()?;
        let a = Self {
            store,
            generations: vec![Generation { number: 1, state: GenerationState::Active, pk, msk: Some(msk) }],
            keys: Vec::new(),
        };
        a.commit()?;
        Ok(a)
    }

    /// Opens the authority in `store`, finishing the cleanup an interrupted
    /// operation may have left (sealed copies no committed state refers to).
    ///
    /// # Errors
    /// [`WrapError::State`] if there is no authority; [`WrapError::Malformed`]
    /// if its state does not decode.
    pub fn open(store: Arc<dyn Store>) -> Result<Self> {
        let bytes = store
            .get(STATE_KEY)?
            .ok_or_else(|| WrapError::State("no authority in this store (run `keyfence authority init`)".into()))?;
        let bytes = Zeroizing::new(bytes);
        let mut a = Self::decode(store, &bytes)?;
        a.collect_garbage()?;
        Ok(a)
    }

    fn decode(store: Arc<dyn Store>, b: &[u8]) -> Result<Self> {
        const O: &str = "authority state";
        let mut c = Cursor::new(b, O, STATE_MAGIC)?;
        let n = c.u16("generation count")?;
        let mut generations = Vec::new();
        for _ in 0..n {
            let number = c.u32("generation")?;
            let state = GenerationState::from_code(c.u8("state")?)?;
            let pk = PublicKey::from_bytes(c.bytes32("public key")?)?;
            let msk_bytes = c.bytes32("master secret key")?;
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
        let n = c.u32("policy key count")?;
        let mut keys = Vec::new();
        for _ in 0..n {
            let policy_id = c.array("policy id")?;
            let version = c.u32("version")?;
            let policy = c.text16("policy")?.to_owned();
            let public = c.array("public key")?;
            let private = Zeroizing::new(c.array("private key")?);
            keys.push(PolicyKey { policy_id, version, policy, public, private });
        }
        c.finish()?;
        if generations.iter().filter(|g| g.state == GenerationState::Active).count() != 1 {
            return Err(malformed(O, "exactly one generation must be active"));
        }
        Ok(Self { store, generations, keys })
    }

    fn encode(&self) -> Result<Zeroizing<Vec<u8>>> {
        let mut out = Zeroizing::new(Vec::new());
        out.extend_from_slice(STATE_MAGIC);
        out.extend_from_slice(&(self.generations.len() as u16).to_le_bytes());
        for g in &self.generations {
            out.extend_from_slice(&g.number.to_le_bytes());
            out.push(g.state.code());
            put32(&mut out, &g.pk.to_bytes())?;
            match &g.msk {
                Some(m) => put32(&mut out, &m.to_bytes())?,
                None => put32(&mut out, &[])?,
            }
        }
        out.extend_from_slice(&(self.keys.len() as u32).to_le_bytes());
        for k in &self.keys {
            out.extend_from_slice(&k.policy_id);
            out.extend_from_slice(&k.version.to_le_bytes());
            put16(&mut out, k.policy.as_bytes())?;
            out.extend_from_slice(&k.public);
            out.extend_from_slice(&k.private[..]);
        }
        Ok(out)
    }

    /// Writes the state (the commit point of every operation) and the
    /// replicated generation list.
    fn commit(&self) -> Result<()> {
        self.store.put(STATE_KEY, &self.encode()?)?;
        let list: String = self.generations.iter().map(|g| format!("{} {}\n", g.number, g.state.code())).collect();
        self.store.put(GENERATIONS_KEY, list.as_bytes())?;
        Ok(())
    }

    fn live(&self) -> impl Iterator<Item = &Generation> {
        self.generations.iter().filter(|g| g.state.is_live())
    }

    /// Deletes sealed copies that no committed state refers to: left by an
    /// interrupted wrap or rotation, or belonging to retired generations.
    fn collect_garbage(&mut self) -> Result<usize> {
        let mut wanted = std::collections::HashSet::new();
        for k in &self.keys {
            for g in self.live() {
                wanted.insert(sealed_key(&k.policy_id, k.version, g.number));
            }
        }
        let mut removed = 0;
        for name in self.store.list("sealed/")? {
            if !wanted.contains(&name) {
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
        let mut policies: Vec<&[u8; 32]> = self.keys.iter().map(|k| &k.policy_id).collect();
        policies.sort();
        policies.dedup();
        Ok(Status {
            generations: self.generations.iter().map(|g| (g.number, g.state)).collect(),
            policies: policies.len(),
            policy_keys: self.keys.len(),
            envelopes: self.store.list("envelopes/")?.len(),
        })
    }

    /// Issues a machine key: one CP-ABE attribute key per live generation.
    ///
    /// # Errors
    /// [`WrapError::Abe`] for attributes CP-ABE refuses (reserved label).
    pub fn issue(&self, attrs: &Attributes) -> Result<MachineKey> {
        let mut keys = Vec::new();
        for g in self.live() {
            let msk = g
                .msk
                .as_ref()
                .ok_or_else(|| WrapError::State(format!("live generation {} has lost its master key", g.number)))?;
            keys.push((g.number, abe::keygen(msk, attrs)?));
        }
        keys.sort_by(|a, b| b.0.cmp(&a.0));
        Ok(MachineKey::new(attrs.clone(), keys))
    }

    fn seal_everywhere(&self, k: &PolicyKey) -> Result<()> {
        for g in self.live() {
            let blob = sealed::seal(&g.pk, g.number, &k.policy_id, k.version, &k.policy, &k.public, &k.private)?;
            self.store.put(&sealed_key(&k.policy_id, k.version, g.number), &blob)?;
        }
        Ok(())
    }

    fn current(&self, pid: &[u8; 32]) -> Option<&PolicyKey> {
        self.keys.iter().filter(|k| &k.policy_id == pid).max_by_key(|k| k.version)
    }

    /// Wraps `secret` under `policy`: seals it to the policy's key (made
    /// and sealed under every live generation on first use), stores the
    /// envelope in the store and returns it.
    ///
    /// # Errors
    /// [`WrapError::Abe`] with the parse error for a malformed policy.
    pub fn wrap(&mut self, policy: &str, secret: &[u8]) -> Result<Envelope> {
        let canonical = keyfence_policy::parse(policy).map_err(AbeError::from)?.to_string();
        let pid = policy_id(&canonical);
        if self.current(&pid).is_none() {
            let (private, public) = hpke::keypair(&mut OsRng);
            let k = PolicyKey { policy_id: pid, version: 1, policy: canonical.clone(), public, private };
            // Sealed copies first, then the commit: an interruption leaves
            // only unreferenced copies, which `open` deletes.
            self.seal_everywhere(&k)?;
            self.keys.push(k);
            self.commit()?;
        }
        let mut secret_id = [0u8; 16];
        OsRng.fill_bytes(&mut secret_id);
        self.seal_envelope(&secret_id, &pid, secret)
    }

    fn seal_envelope(&self, secret_id: &[u8; 16], pid: &[u8; 32], secret: &[u8]) -> Result<Envelope> {
        let k = self.current(pid).ok_or_else(|| WrapError::State("the policy key to seal under is missing".into()))?;
        let header = |enc: &[u8]| Envelope::header(secret_id, pid, k.version, &k.policy, enc);
        let (_, mut bytes, ct) = hpke::seal(&k.public, &header, secret, &mut OsRng)?;
        put32(&mut bytes, &ct)?;
        let env = Envelope::parse(&bytes)?;
        self.store.put(&envelope_key(secret_id), &bytes)?;
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
        let number = self.generations.iter().map(|g| g.number).max().unwrap_or(0) + 1;
        let (pk, msk) = abe::setup()?;
        let new = Generation { number, state: GenerationState::Active, pk, msk: Some(msk) };
        for k in &self.keys {
            let blob = sealed::seal(&new.pk, number, &k.policy_id, k.version, &k.policy, &k.public, &k.private)?;
            self.store.put(&sealed_key(&k.policy_id, k.version, number), &blob)?;
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
    /// [`WrapError::State`] if the policy has no key; store failures.
    pub fn rotate_policy_key(&mut self, policy: &str) -> Result<PolicyRotation> {
        let canonical = keyfence_policy::parse(policy).map_err(AbeError::from)?.to_string();
        let pid = policy_id(&canonical);
        let old = self.current(&pid).ok_or_else(|| WrapError::State(format!("no policy key for `{canonical}`")))?;
        let (private, public) = hpke::keypair(&mut OsRng);
        let k = PolicyKey { policy_id: pid, version: old.version + 1, policy: canonical, public, private };
        let version = k.version;
        self.seal_everywhere(&k)?;
        self.keys.push(k);
        self.commit()?;
        let mut rewrapped = 0;
        for name in self.store.list("envelopes/")? {
            let Some(bytes) = self.store.get(&name)? else { continue };
            let env = Envelope::parse(&bytes)?;
            if env.policy_id != pid || env.key_version == version {
                continue;
            }
            let old = self
                .keys
                .iter()
                .find(|k| k.policy_id == pid && k.version == env.key_version)
                .ok_or(WrapError::UnknownPolicyKey { policy_id: hex(&pid), version: env.key_version })?;
            let secret = hpke::open(&old.private, &env.enc, env.aad(), &env.ciphertext)?;
            self.seal_envelope(&env.secret_id, &pid, &secret)?;
            rewrapped += 1;
        }
        self.keys.retain(|k| k.policy_id != pid || k.version == version);
        self.commit()?;
        self.collect_garbage()?;
        Ok(PolicyRotation { version, rewrapped })
    }
}

impl Cursor<'_> {
    pub(crate) fn u8(&mut self, field: &str) -> Result<u8> {
        Ok(self.take(1, field)?[0])
    }
}
