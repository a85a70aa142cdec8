//! The authority's persisted state (`authority/state`: the signing key,
//! the master generations, the policy keyring and the revoked machines)
//! and its codec. Nothing here reads or writes the store.

use zeroize::Zeroizing;

use crate::abe::{MasterSecretKey, PublicKey};
use crate::wrap::error::{codec, malformed, Result};
use crate::wrap::format::{reader, writer, STATE_MAGIC};
use crate::wrap::generation::GenerationState;
use crate::wrap::generation_list;
use crate::wrap::policy::CanonicalPolicy;
use crate::wrap::revocation::{self, Revoked};
use crate::wrap::signing::AuthorityKey;

/// Most generations the state's 16-bit count holds (retired ones stay
/// listed, so this bounds the number of master rotations).
pub(super) const MAX_GENERATIONS: usize = u16::MAX as usize;

pub(super) struct Generation {
    pub(super) number: u32,
    pub(super) state: GenerationState,
    pub(super) pk: PublicKey,
    pub(super) msk: Option<MasterSecretKey>,
}

#[derive(Clone)]
pub(super) struct PolicyKey {
    pub(super) policy: CanonicalPolicy,
    pub(super) version: u32,
    pub(super) public: [u8; 32],
    pub(super) private: Zeroizing<[u8; 32]>,
}

impl PolicyKey {
    pub(super) fn policy_id(&self) -> &[u8; 32] {
        self.policy.id()
    }
}

/// What the store's `authority/state` holds.
pub(super) struct State {
    pub(super) signer: AuthorityKey,
    /// Every generation, oldest first.
    pub(super) generations: Vec<Generation>,
    /// Every policy key version held.
    pub(super) keys: Vec<PolicyKey>,
    /// Revoked machines, in the order they were revoked.
    pub(super) revoked: Vec<Revoked>,
}

/// A digest of the state's bytes (which hold secrets, so they are not
/// kept): tells whether the committed state is the one already decoded.
pub(super) type Digest = [u8; 32];

/// The digest of a state's bytes: BLAKE2b-256, domain-separated.
pub(super) fn digest(state: &[u8]) -> Digest {
    let h = blake2b_simd::Params::new().hash_length(32).personal(b"keyfence-state").hash(state);
    let mut out = [0u8; 32];
    out.copy_from_slice(h.as_bytes());
    out
}

impl State {
    pub(super) fn decode(b: &[u8]) -> Result<Self> {
        const O: &str = "authority state";
        let mut r = reader(b, O, STATE_MAGIC)?;
        let signer = AuthorityKey::from_bytes(&Zeroizing::new(r.array("signing key").map_err(codec(O))?));
        let n = r.u16("generation count").map_err(codec(O))?;
        let mut generations = Vec::new();
        for _ in 0..n {
            let number = r.u32("generation").map_err(codec(O))?;
            let code = r.u8("state").map_err(codec(O))?;
            let state = GenerationState::from_code(code).ok_or_else(|| malformed(O, format!("unknown generation state {code}")))?;
            let pk = PublicKey::from_bytes(r.bytes32("public key").map_err(codec(O))?)?;
            let msk_bytes = r.bytes32("master secret key").map_err(codec(O))?;
            let msk = if msk_bytes.is_empty() { None } else { Some(MasterSecretKey::from_bytes(msk_bytes)?) };
            if state.is_live() != msk.is_some() {
                return Err(malformed(
                    O,
                    format!("generation {number} is {state:?} but its master key is {}", if msk.is_some() { "present" } else { "missing" }),
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
        Ok(State { signer, generations, keys, revoked })
    }

    /// The state's encoding. Every count and length was checked when the
    /// generation or policy key was added (`rotate_master`, `wrap`), so
    /// nothing here can overflow its field.
    pub(super) fn encode(&self) -> Zeroizing<Vec<u8>> {
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

    /// Every generation and its state, oldest first.
    pub(super) fn generation_states(&self) -> impl Iterator<Item = (u32, GenerationState)> + '_ {
        self.generations.iter().map(|g| (g.number, g.state))
    }

    /// The replicated generation list (`public/generations`), signed.
    pub(super) fn generation_list(&self) -> Vec<u8> {
        generation_list::encode(&self.signer, self.generation_states())
    }

    pub(super) fn live(&self) -> impl Iterator<Item = &Generation> {
        self.generations.iter().filter(|g| g.state.is_live())
    }

    /// The newest key of policy `pid`.
    pub(super) fn current(&self, pid: &[u8; 32]) -> Option<&PolicyKey> {
        self.keys.iter().filter(|k| k.policy_id() == pid).max_by_key(|k| k.version)
    }
}
