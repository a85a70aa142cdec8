//! The machine (edge) side: a bundle of attribute keys, opening envelopes
//! through the policy-key cache, and deciding without cryptography whether
//! it can open one.

use std::fmt;
use std::sync::Arc;

use keyfence_policy::Attributes;
use zeroize::Zeroizing;

use super::cache::{CacheConfig, CacheStats, PolicyKeyCache};
use super::error::{codec, limit, malformed, Result, WrapError};
use super::format::{reader, writer, Envelope, MACHINE_MAGIC};
use super::hpke;
use super::layout::{self, hex};
use super::sealed::SealedKey;
use super::signing;
use super::store::Store;
use crate::abe::AttributeKey;

/// A machine's keys: its attributes, one CP-ABE attribute key per live
/// master generation, newest first, and the public key of the authority
/// that issued it (the only one whose objects the machine accepts).
/// Secret; `Debug` shows only the attributes and generations.
#[derive(Clone)]
pub struct MachineKey {
    authority: [u8; 32],
    attrs: Attributes,
    keys: Vec<(u32, AttributeKey)>,
}

/// Most attributes, and most generations' keys, a machine key's 16-bit
/// counts hold; also the longest label or value its 16-bit prefixes hold.
const MAX_U16: usize = u16::MAX as usize;
/// Largest attribute key its 32-bit prefix holds.
const MAX_ATTRIBUTE_KEY: usize = u32::MAX as usize;

impl MachineKey {
    /// A machine key, refusing what its format cannot hold, so that every
    /// machine key can be written and read back.
    pub(crate) fn new(authority: [u8; 32], attrs: Attributes, keys: Vec<(u32, AttributeKey)>) -> Result<Self> {
        Self::check_attributes(&attrs)?;
        limit("machine key generation count", keys.len(), MAX_U16)?;
        for (_, k) in &keys {
            limit("attribute key length", k.to_bytes().len(), MAX_ATTRIBUTE_KEY)?;
        }
        Ok(Self { authority, attrs, keys })
    }

    /// The public key of the authority that issued this key: the machine
    /// accepts envelopes and sealed policy keys signed by it only.
    pub fn authority(&self) -> &[u8; 32] {
        &self.authority
    }

    /// Refuses attributes the format cannot hold.
    pub(crate) fn check_attributes(attrs: &Attributes) -> Result<()> {
        limit("attribute count", attrs.len(), MAX_U16)?;
        for (l, v) in attrs.iter() {
            limit("attribute label length", l.len(), MAX_U16)?;
            limit("attribute value length", v.len(), MAX_U16)?;
        }
        Ok(())
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
        let mut w = writer(MACHINE_MAGIC);
        w.raw(&self.authority).len16(self.attrs.len());
        for (l, v) in self.attrs.iter() {
            w.bytes16(l.as_bytes()).bytes16(v.as_bytes());
        }
        w.len16(self.keys.len());
        for (g, k) in &self.keys {
            w.u32(*g).bytes32(&k.to_bytes());
        }
        // Every count and length was checked when the key was built.
        w.into_bytes()
    }

    /// Decodes a machine key.
    ///
    /// # Errors
    /// [`WrapError::Malformed`] naming what is wrong.
    pub fn from_bytes(b: &[u8]) -> Result<Self> {
        const O: &str = "machine key";
        let mut r = reader(b, O, MACHINE_MAGIC)?;
        let authority = r.array("authority key").map_err(codec(O))?;
        if !signing::is_valid_public(&authority) {
            return Err(malformed(O, "field authority key: not a usable Ed25519 public key"));
        }
        let mut attrs = Attributes::default();
        let mut previous: Option<&str> = None;
        for i in 0..r.u16("attribute count").map_err(codec(O))? {
            let l = r.text16(|| format!("label[{i}]")).map_err(codec(O))?;
            let v = r.text16(|| format!("value[{i}]")).map_err(codec(O))?;
            // Sorted and unique, so that one key has one encoding.
            if previous.is_some_and(|p| p >= l) {
                return Err(malformed(O, format!("label {l:?} is out of order or repeated")));
            }
            previous = Some(l);
            attrs.insert(l, v);
        }
        let n = r.u16("key count").map_err(codec(O))?;
        let mut keys = Vec::new();
        for i in 0..n {
            let g = r.u32(|| format!("generation[{i}]")).map_err(codec(O))?;
            keys.push((g, AttributeKey::from_bytes(r.bytes32(|| format!("attribute key[{i}]")).map_err(codec(O))?)?));
        }
        r.finish().map_err(codec(O))?;
        // Read from 16- and 32-bit fields, so within every limit.
        Ok(Self { authority, attrs, keys })
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
    /// no cryptography, so a caller can decide to forward instead. It does
    /// not look at the store or the envelope's signature: to know whether
    /// [`Machine::open`] would succeed short of decrypting, use
    /// [`Machine::can_open`].
    pub fn could_open(&self, envelope: &Envelope) -> bool {
        envelope.policy.eval(&self.key.attrs)
    }

    /// Every check [`Machine::open`] makes short of decrypting: the
    /// envelope's authority and signature, the attributes, a live
    /// generation this machine holds a key for, and a sealed copy of the
    /// policy key for it in the store, made by this machine's authority.
    /// `Ok` means `open` can fail only on a corrupted CP-ABE ciphertext or
    /// a store that changes in between. Reads the store; no CP-ABE work.
    ///
    /// # Errors
    /// The error [`Machine::open`] would return for the same reason.
    pub fn can_open(&self, envelope: &Envelope) -> Result<()> {
        self.precheck(envelope)?;
        self.sealed_copy(envelope).map(drop)
    }

    /// Opens an envelope: the policy key from the cache or by CP-ABE, then
    /// the secret by HPKE.
    ///
    /// # Errors
    /// [`WrapError::NotAuthorized`] (wrong machine), [`WrapError::RetiredGeneration`],
    /// [`WrapError::UnknownPolicyKey`], [`WrapError::WrongAuthority`] (an
    /// envelope or sealed key another authority signed),
    /// [`WrapError::Tampered`], each distinct, or [`WrapError::Malformed`].
    pub fn open(&self, envelope: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
        let env = Envelope::parse(envelope)?;
        self.open_envelope(&env)
    }

    /// [`Machine::open`] on a parsed envelope.
    ///
    /// # Errors
    /// As [`Machine::open`].
    pub fn open_envelope(&self, env: &Envelope) -> Result<Zeroizing<Vec<u8>>> {
        self.precheck(env)?;
        let private = self.cache.get_or_load((env.policy_id, env.key_version), || {
            let (sealed, key) = self.sealed_copy(env)?;
            sealed.open(key)
        })?;
        hpke::open(&private, &env.enc, env.aad(), &env.ciphertext)
    }

    /// The checks that need neither the store nor CP-ABE.
    fn precheck(&self, env: &Envelope) -> Result<()> {
        env.verify(&self.key.authority)?;
        if !self.could_open(env) {
            return Err(WrapError::NotAuthorized { policy: env.policy.to_string() });
        }
        Ok(())
    }

    fn live_generations(&self) -> Result<Vec<u32>> {
        let list = self.store.get(layout::GENERATIONS)?.unwrap_or_default();
        Ok(layout::decode_generations(&list)?.into_iter().filter(|(_, s)| s.is_live()).map(|(n, _)| n).collect())
    }

    /// The sealed copy of the policy key of `env` for the newest usable
    /// generation, checked (header, authority, signature) but not opened,
    /// with this machine's key for that generation.
    fn sealed_copy(&self, env: &Envelope) -> Result<(SealedKey, &AttributeKey)> {
        let live = self.live_generations()?;
        let usable: Vec<&(u32, AttributeKey)> = self.key.keys.iter().filter(|(g, _)| live.contains(g)).collect();
        if usable.is_empty() {
            return Err(WrapError::RetiredGeneration { have: self.key.generations(), live });
        }
        for (g, key) in usable {
            let name = layout::sealed(&env.policy_id, env.key_version, *g);
            let Some(blob) = self.store.get(&name)? else { continue };
            let sealed = SealedKey::parse(&blob)?;
            sealed.verify(&self.key.authority)?;
            if sealed.policy_id != env.policy_id || sealed.version != env.key_version || sealed.generation != *g {
                return Err(WrapError::Tampered { object: "sealed policy key" });
            }
            return Ok((sealed, key));
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
    peers.iter().filter(|p| envelope.policy.eval(&p.attributes)).min_by_key(|p| p.latency)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    fn small_key() -> &'static AttributeKey {
        static K: OnceLock<AttributeKey> = OnceLock::new();
        K.get_or_init(|| {
            let (_, msk) = crate::abe::setup().unwrap();
            crate::abe::keygen(&msk, &"region=EU".parse().unwrap()).unwrap()
        })
    }

    fn authority() -> [u8; 32] {
        crate::wrap::signing::AuthorityKey::generate().public()
    }

    /// `count` attributes, the first with a label of `label_len` bytes and
    /// a value of `value_len` bytes.
    fn attrs(count: usize, label_len: usize, value_len: usize) -> Attributes {
        let mut a: Attributes = (1..count).map(|i| (format!("{i:x}"), "v")).collect();
        a.insert("z".repeat(label_len), "w".repeat(value_len));
        a
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(6))]
        #[test]
        fn machine_keys_at_the_limits_read_back(
            count in (u16::MAX as usize - 3)..=(u16::MAX as usize),
            label_len in (u16::MAX as usize - 3)..=(u16::MAX as usize),
            value_len in (u16::MAX as usize - 3)..=(u16::MAX as usize),
            generations in 1usize..3,
        ) {
            let keys = (0..generations).map(|g| (g as u32 + 1, small_key().clone())).collect();
            let key = MachineKey::new(authority(), attrs(count, label_len, value_len), keys).unwrap();
            let bytes = key.to_bytes();
            let back = MachineKey::from_bytes(&bytes).unwrap();
            prop_assert_eq!(back.attributes(), key.attributes());
            prop_assert_eq!(back.generations(), key.generations());
            prop_assert_eq!(&back.to_bytes()[..], &bytes[..]);
        }
    }

    #[test]
    fn one_past_each_limit_is_refused_when_built() {
        let max = u16::MAX as usize;
        let keys = || vec![(1, small_key().clone())];
        for (a, what) in [
            (attrs(max + 1, 1, 1), "attribute count"),
            (attrs(1, max + 1, 1), "attribute label length"),
            (attrs(1, 1, max + 1), "attribute value length"),
        ] {
            match MachineKey::new(authority(), a, keys()) {
                Err(e @ WrapError::LimitExceeded { .. }) => {
                    assert_eq!(e.code(), crate::ErrorCode::LimitExceeded);
                    assert!(e.to_string().starts_with(what), "{e}");
                }
                other => panic!("expected {what} to be refused, got {other:?}"),
            }
        }
    }
}
