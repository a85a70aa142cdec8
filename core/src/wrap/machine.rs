//! The machine (edge) side: a bundle of attribute keys, opening envelopes
//! through the policy-key cache, and deciding without cryptography whether
//! it can open one.

use std::fmt;
use std::sync::Arc;

use keyfence_policy::Attributes;
use zeroize::Zeroizing;

use super::authority::GENERATIONS_KEY;
use super::cache::{CacheConfig, CacheStats, PolicyKeyCache};
use super::error::{malformed, Result, WrapError};
use super::format::{hex, put16, put32, Cursor, Envelope, MACHINE_MAGIC};
use super::hpke;
use super::sealed::SealedKey;
use super::store::Store;
use crate::abe::AttributeKey;

/// A machine's keys: its attributes and one CP-ABE attribute key per live
/// master generation, newest first. Secret; `Debug` shows only the
/// attributes and generations.
#[derive(Clone)]
pub struct MachineKey {
    attrs: Attributes,
    keys: Vec<(u32, AttributeKey)>,
}

impl MachineKey {
    pub(crate) fn new(attrs: Attributes, keys: Vec<(u32, AttributeKey)>) -> Self {
        Self { attrs, keys }
    }

    /// The machine's attributes.
    pub fn attributes(&self) -> &Attributes {
        &self.attrs
    }

    /// The generations it holds keys for, newest first.
    pub fn generations(&self) -> Vec<u32> {
        self.keys.iter().map(|(g, _)| *g).collect()
    }

    /// The encoding (secret: store it owner-readable only).
    pub fn to_bytes(&self) -> Zeroizing<Vec<u8>> {
        let mut out = Zeroizing::new(Vec::new());
        out.extend_from_slice(MACHINE_MAGIC);
        out.extend_from_slice(&(self.attrs.len() as u16).to_le_bytes());
        for (l, v) in self.attrs.iter() {
            let _ = put16(&mut out, l.as_bytes());
            let _ = put16(&mut out, v.as_bytes());
        }
        out.extend_from_slice(&(self.keys.len() as u16).to_le_bytes());
        for (g, k) in &self.keys {
            out.extend_from_slice(&g.to_le_bytes());
            let _ = put32(&mut out, &k.to_bytes());
        }
        out
    }

    /// Decodes a machine key.
    ///
    /// # Errors
    /// [`WrapError::Malformed`] naming what is wrong.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        const O: &str = "machine key";
        let mut c = Cursor::new(b, O, MACHINE_MAGIC)?;
        let mut attrs = Attributes::default();
        let mut previous: Option<&str> = None;
        for _ in 0..c.u16("attribute count")? {
            let (l, v) = (c.text16("label")?, c.text16("value")?);
            // Sorted and unique, so that one key has one encoding.
            if previous.is_some_and(|p| p >= l) {
                return Err(malformed(O, format!("label {l:?} is out of order or repeated")));
            }
            previous = Some(l);
            attrs.insert(l, v);
        }
        let n = c.u16("key count")?;
        let mut keys = Vec::new();
        for _ in 0..n {
            let g = c.u32("generation")?;
            keys.push((g, AttributeKey::from_bytes(c.bytes32("attribute key")?)?));
        }
        c.finish()?;
        Ok(Self { attrs, keys })
    }
}

impl fmt::Debug for MachineKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MachineKey")
            .field("attributes", &self.attrs.to_string())
            .field("generations", &self.generations())
            .finish_non_exhaustive()
    }
}

/// A machine that opens envelopes: its key, the store holding the
/// replicated sealed policy keys, and the policy-key cache.
pub struct Machine {
    key: MachineKey,
    store: Arc<dyn Store>,
    cache: PolicyKeyCache,
}

impl fmt::Debug for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Machine").field("key", &self.key).field("cache", &self.cache.stats()).finish_non_exhaustive()
    }
}

impl Machine {
    /// A machine with `key`, reading sealed policy keys from `store`.
    pub fn new(key: MachineKey, store: Arc<dyn Store>, cache: CacheConfig) -> Self {
        Self { key, store, cache: PolicyKeyCache::new(cache) }
    }

    /// This machine's attributes.
    pub fn attributes(&self) -> &Attributes {
        self.key.attributes()
    }

    /// Whether this machine's attributes satisfy the envelope's policy;
    /// no cryptography, so a caller can decide to forward instead.
    pub fn could_open(&self, envelope: &Envelope) -> bool {
        keyfence_policy::parse(&envelope.policy).map(|p| p.eval(&self.key.attrs)).unwrap_or(false)
    }

    /// Opens an envelope: the policy key from the cache or by CP-ABE, then
    /// the secret by HPKE.
    ///
    /// # Errors
    /// [`WrapError::NotAuthorized`] (wrong machine), [`WrapError::RetiredGeneration`],
    /// [`WrapError::UnknownPolicyKey`], [`WrapError::Tampered`], each
    /// distinct, or [`WrapError::Malformed`].
    pub fn open(&self, envelope: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
        let env = Envelope::parse(envelope)?;
        self.open_envelope(&env)
    }

    /// [`Machine::open`] on a parsed envelope.
    ///
    /// # Errors
    /// As [`Machine::open`].
    pub fn open_envelope(&self, env: &Envelope) -> Result<Zeroizing<Vec<u8>>> {
        if !self.could_open(env) {
            return Err(WrapError::NotAuthorized { policy: env.policy.clone() });
        }
        let private = self.cache.get_or_load((env.policy_id, env.key_version), || self.load(env))?;
        hpke::open(&private, &env.enc, env.aad(), &env.ciphertext)
    }

    fn live_generations(&self) -> Result<Vec<u32>> {
        let list = self.store.get(GENERATIONS_KEY)?.unwrap_or_default();
        let text = String::from_utf8(list).map_err(|_| malformed("generation list", "not UTF-8"))?;
        let mut live = Vec::new();
        for line in text.lines() {
            let (n, s) = line.split_once(' ').ok_or_else(|| malformed("generation list", format!("bad line {line:?}")))?;
            let n: u32 = n.parse().map_err(|_| malformed("generation list", format!("bad line {line:?}")))?;
            if s != "2" {
                live.push(n);
            }
        }
        Ok(live)
    }

    /// Opens the policy key of `env` with the newest usable generation.
    fn load(&self, env: &Envelope) -> Result<Zeroizing<[u8; 32]>> {
        let live = self.live_generations()?;
        let usable: Vec<&(u32, AttributeKey)> = self.key.keys.iter().filter(|(g, _)| live.contains(g)).collect();
        if usable.is_empty() {
            return Err(WrapError::RetiredGeneration { have: self.key.generations(), live });
        }
        for (g, key) in usable {
            let name = format!("sealed/{}/{}/{g}", hex(&env.policy_id), env.key_version);
            let Some(blob) = self.store.get(&name)? else { continue };
            let sealed = SealedKey::parse(&blob).map_err(|_| WrapError::Tampered { object: "sealed policy key" })?;
            if sealed.policy_id != env.policy_id || sealed.version != env.key_version || sealed.generation != *g {
                return Err(WrapError::Tampered { object: "sealed policy key" });
            }
            return sealed.open(key);
        }
        Err(WrapError::UnknownPolicyKey { policy_id: hex(&env.policy_id), version: env.key_version })
    }

    /// Cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Drops every cached policy key (wiping it).
    pub fn clear_cache(&self) {
        self.cache.clear()
    }
}

/// A machine a request could be forwarded to.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its name.
    pub name: String,
    /// Its attributes.
    pub attributes: Attributes,
    /// Its round-trip latency from here.
    pub latency: std::time::Duration,
}

/// The nearest peer whose attributes satisfy the envelope's policy.
pub fn nearest_capable<'a>(envelope: &Envelope, peers: &'a [Peer]) -> Option<&'a Peer> {
    let policy = keyfence_policy::parse(&envelope.policy).ok()?;
    peers.iter().filter(|p| policy.eval(&p.attributes)).min_by_key(|p| p.latency)
}
