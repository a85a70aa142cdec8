//! The machine (edge) side: a bundle of attribute keys, opening envelopes
//! through the policy-key cache, and deciding without cryptography whether
//! it can open one.

use crate::spawn::QuietSpawn;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use keyfence_policy::Attributes;
use zeroize::Zeroizing;

use super::cache::{CacheConfig, CacheStats, PolicyKeyCache};
use super::error::{codec, limit, malformed, Result, WrapError};
use super::format::{reader, writer, Envelope, MACHINE_MAGIC};
use super::generation_list::{GenerationList, Seen};
use super::hpke;
use super::layout::{self, hex};
use super::newest::{self, NewestLists};
use super::revocation::{RevocationList, SeenRevocations, MACHINE_LABEL};
use super::sealed::SealedKey;
use super::signing;
use super::store::Store;
use super::watch::WatchEvent;
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

    /// The machine id the authority gave this key (its `machine`
    /// attribute); `None` for a key issued before keyfence had ids, which
    /// opens nothing sealed after a revocation (negation needs the label):
    /// issue it a new key.
    pub fn id(&self) -> Option<&str> {
        self.attrs.get(MACHINE_LABEL)
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
        let mut keys = Vec::new();
        let (authority, attrs) = read_machine_key(b, |g, key| {
            keys.push((g, AttributeKey::from_bytes(key)?));
            Ok(())
        })?;
        // Read from 16- and 32-bit fields, so within every limit.
        Ok(Self { authority, attrs, keys })
    }

    /// What this key says about itself, without its secret: what a
    /// [`PublicMachine`] needs.
    pub fn info(&self) -> MachineInfo {
        MachineInfo { authority: self.authority, attrs: self.attrs.clone(), generations: self.generations() }
    }
}

/// Reads a machine key's encoding, handing each generation and the bytes
/// of its attribute key to `key` (a slice of `b`: no copy is made here);
/// returns the authority and the attributes.
fn read_machine_key(b: &[u8], mut key: impl FnMut(u32, &[u8]) -> Result<()>) -> Result<([u8; 32], Attributes)> {
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
    for i in 0..n {
        let g = r.u32(|| format!("generation[{i}]")).map_err(codec(O))?;
        key(g, r.bytes32(|| format!("attribute key[{i}]")).map_err(codec(O))?)?;
    }
    r.finish().map_err(codec(O))?;
    Ok((authority, attrs))
}

/// The public part of a machine key: the authority it trusts, its
/// attributes and the master generations it holds keys for, without the
/// keys. It cannot decrypt anything; it answers "could this machine open
/// that envelope" for a process that must not hold the secret (a key
/// server whose keys live in the key process).
#[derive(Clone, PartialEq, Eq)]
pub struct MachineInfo {
    authority: [u8; 32],
    attrs: Attributes,
    generations: Vec<u32>,
}

impl MachineInfo {
    /// Reads the public part of a machine key's encoding (a machine key
    /// file's bytes). The attribute keys are skipped, never decoded: no
    /// secret point is built in this process. The caller holds the bytes,
    /// secret, and should wipe them (`Zeroizing`). The attribute keys
    /// themselves are checked only by whoever decodes the whole key
    /// ([`MachineKey::from_bytes`], in the key process).
    ///
    /// # Errors
    /// [`WrapError::Malformed`] naming what is wrong, as
    /// [`MachineKey::from_bytes`] for everything but the attribute keys.
    pub fn from_key_bytes(b: &[u8]) -> Result<Self> {
        let mut generations = Vec::new();
        let (authority, attrs) = read_machine_key(b, |g, _| {
            generations.push(g);
            Ok(())
        })?;
        Ok(Self { authority, attrs, generations })
    }

    /// The public key of the authority the machine trusts.
    pub fn authority(&self) -> &[u8; 32] {
        &self.authority
    }

    /// The machine's attributes.
    pub fn attributes(&self) -> &Attributes {
        &self.attrs
    }

    /// The generations the machine holds keys for, newest first.
    pub fn generations(&self) -> &[u32] {
        &self.generations
    }

    /// The machine id (as [`MachineKey::id`]).
    pub fn id(&self) -> Option<&str> {
        self.attrs.get(MACHINE_LABEL)
    }
}

impl fmt::Debug for MachineInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MachineInfo")
            .field("attributes", &self.attrs.to_string())
            .field("generations", &self.generations)
            .finish_non_exhaustive()
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

/// A machine key's standing by its store's signed lists
/// ([`Machine::health`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineHealth {
    /// The machine's id (`None` for a key issued before machines had ids).
    pub id: Option<String>,
    /// The master-key generations its key holds, newest first.
    pub held: Vec<u32>,
    /// The generations the store's generation list says are live.
    pub live: Vec<u32>,
    /// Whether the store's revocation list names this machine.
    pub revoked: bool,
    /// How many machines the store's revocation list names (a change is a
    /// store update the agent's log reports).
    pub revoked_machines: usize,
}

impl MachineHealth {
    /// Whether the key can open anything: not revoked, and holding a live
    /// generation.
    pub fn usable(&self) -> bool {
        self.problem().is_none()
    }

    /// Why the key opens nothing, in words an operator acts on; `None`
    /// when it is usable.
    pub fn problem(&self) -> Option<String> {
        let id = self.id.as_deref().unwrap_or("(no id)");
        if self.revoked {
            return Some(format!(
                "this machine ({id}) is revoked: the store's revocation list names it; its keys are dropped and no envelope is opened (issue it a new machine key: docs/deploy.md, \"Replacing a machine key\")"
            ));
        }
        if !self.held.iter().any(|g| self.live.contains(g)) {
            let list = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
            return Some(format!(
                "this machine's key ({id}) holds no live generation: it holds {} and the store's live generations are {}; no envelope can be opened until the authority issues it a new key (`keyfence authority issue`, docs/deploy.md)",
                list(&self.held),
                if self.live.is_empty() { "none".to_string() } else { list(&self.live) }
            ));
        }
        None
    }
}

/// A machine that opens envelopes: its key, the store holding the
/// replicated sealed policy keys, and the policy-key cache.
pub struct Machine {
    key: MachineKey,
    store: Arc<dyn Store>,
    cache: PolicyKeyCache,
    /// The newest generation list accepted: an older one is refused.
    seen: Seen,
    /// The newest revocation list accepted: an older one is refused.
    revocations: SeenRevocations,
}

impl fmt::Debug for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Machine").field("key", &self.key).field("cache", &self.cache.stats()).finish_non_exhaustive()
    }
}

impl Machine {
    /// A machine with `key`, reading sealed policy keys from `store`.
    pub fn new(key: MachineKey, store: Arc<dyn Store>, cache: CacheConfig) -> Self {
        Self { key, store, cache: PolicyKeyCache::new(cache), seen: Seen::default(), revocations: SeenRevocations::default() }
    }

    /// A machine that reads nothing but `objects` (names and values, as
    /// [`objects_for_opening`] gathers them from a store): for a process
    /// that must not reach the store itself, such as the key process. The
    /// objects are as untrusted as a store's: each is verified as the
    /// machine key's authority's when it is used.
    ///
    /// # Errors
    /// [`WrapError::Malformed`] for more than 64 objects, or a name that is
    /// not the generation list, the revocation list or a sealed copy.
    pub fn with_objects(key: MachineKey, objects: &[(String, Vec<u8>)]) -> Result<Self> {
        const O: &str = "objects for opening";
        limit("objects for opening", objects.len(), MAX_OPENING_OBJECTS)?;
        let store = super::store::MemoryStore::default();
        for (name, value) in objects {
            if name != layout::GENERATIONS && name != layout::REVOKED && layout::parse_sealed(name).is_none() {
                return Err(malformed(O, format!("{name:?} is not an object opening reads")));
            }
            store.put(name, value).map_err(|e| malformed(O, e.to_string()))?;
        }
        Ok(Self::new(key, Arc::new(store), CacheConfig::default()))
    }

    /// Keeps the newest generation and revocation lists this machine
    /// accepts in the file `path` (see [`newest_lists_beside`] for the
    /// usual place), and starts from the lists it holds: a store that
    /// serves an older list, one from before a retirement or a revocation,
    /// is refused ([`WrapError::Replayed`]) by every process of this
    /// machine, not only by the one that saw the newer list. Processes of
    /// one machine may share the file.
    ///
    /// Lists in the file that another authority signed (the machine was
    /// issued a key by a new authority) are ignored and replaced. A floor
    /// that cannot be kept is an error, never skipped: here when the file's
    /// folder cannot take its lock file, and from [`Machine::open`] (and
    /// every call that reads the lists) when an update cannot be written
    /// or its lock is held for more than a second. The lock file is mode
    /// 600, so only processes of this machine's user can hold it.
    ///
    /// # Errors
    /// [`WrapError::Store`] (`STORE_IO`) if the file exists but cannot be
    /// read, or its folder cannot take the lock file;
    /// [`WrapError::Malformed`] (`newest lists`, naming the file) if
    /// it does not decode or a list in it fails its authority's signature
    /// (delete the file to start again from the store).
    ///
    /// [`newest_lists_beside`]: super::newest_lists_beside
    pub fn keep_newest_in(mut self, path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        if let Some(kept) = newest::read(&path)? {
            self.require_kept(&kept).map_err(|e| in_file(e, &path))?;
        }
        let keeper = Arc::new(newest::Keeper::new(path, self.key.authority)?);
        let k = keeper.clone();
        self.seen.on_newer(Arc::new(move |b: &[u8]| k.record(newest::Kind::Generations, b)));
        self.revocations.on_newer(Arc::new(move |b: &[u8]| keeper.record(newest::Kind::Revoked, b)));
        Ok(self)
    }

    /// Requires lists kept by an earlier process of this machine (its
    /// floor file, or what a key process's client read from it): each list
    /// on its own, and one of another authority (kept from before the key
    /// was issued again) is skipped while the other still counts.
    ///
    /// # Errors
    /// As [`Machine::require`], but never [`WrapError::WrongAuthority`].
    pub(crate) fn require_kept(&self, kept: &NewestLists) -> Result<()> {
        let authority = self.key.authority;
        let raised =
            [kept.generations().map(|g| self.seen.raise(g, &authority)), kept.revoked().map(|r| self.revocations.raise(r, &authority))];
        for r in raised.into_iter().flatten() {
            match r {
                Ok(()) | Err(WrapError::WrongAuthority { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// [`Machine::keep_newest_in`] the usual place, beside the machine key
    /// file `machine_key` ([`newest_lists_beside`]); this machine as it is
    /// when the key is not a regular file (standard input).
    ///
    /// # Errors
    /// As [`Machine::keep_newest_in`].
    ///
    /// [`newest_lists_beside`]: super::newest_lists_beside
    pub fn keep_newest_beside(self, machine_key: &Path) -> Result<Self> {
        match newest::newest_lists_beside(machine_key) {
            Some(path) => self.keep_newest_in(path),
            None => Ok(self),
        }
    }

    /// Requires `lists` as a floor: from now on this machine refuses a
    /// generation list that goes back on them, or a revocation list that
    /// lacks one of their ids. Lists older than those it already accepted
    /// change nothing.
    ///
    /// # Errors
    /// [`WrapError::Malformed`], [`WrapError::WrongAuthority`] or
    /// [`WrapError::Tampered`] for a list this machine's authority did not
    /// sign; nothing is required then.
    pub fn require(&self, lists: &NewestLists) -> Result<()> {
        let authority = &self.key.authority;
        // Both checked before either is taken.
        if let Some(g) = lists.generations() {
            super::generation_list::GenerationList::verify(g, authority)?;
        }
        if let Some(r) = lists.revoked() {
            RevocationList::verify(r, authority)?;
        }
        if let Some(g) = lists.generations() {
            self.seen.raise(g, authority)?;
        }
        if let Some(r) = lists.revoked() {
            self.revocations.raise(r, authority)?;
        }
        Ok(())
    }

    /// The newest generation and revocation lists this machine has
    /// accepted (or was required to), as the authority signed them: what
    /// to hand to the next process ([`Machine::require`]).
    pub fn newest_lists(&self) -> NewestLists {
        NewestLists::new(self.seen.newest_bytes(), self.revocations.newest_bytes())
    }

    /// This machine's attributes.
    pub fn attributes(&self) -> &Attributes {
        self.key.attributes()
    }

    /// This machine's id (see [`MachineKey::id`]).
    pub fn id(&self) -> Option<&str> {
        self.key.id()
    }

    /// The store's list of revoked machine ids, verified as the
    /// authority's and refused if it goes back on the newest this machine
    /// has accepted (an id dropped from it): what a forwarder checks
    /// before handing a request to a peer. An absent list is empty.
    ///
    /// # Errors
    /// [`WrapError::Store`]; [`WrapError::Malformed`],
    /// [`WrapError::WrongAuthority`] or [`WrapError::Tampered`] for a list
    /// its authority did not sign; [`WrapError::Replayed`].
    pub fn revocations(&self) -> Result<RevocationList> {
        self.revocations.accept(self.store.get(layout::REVOKED)?.as_deref(), &self.key.authority)
    }

    /// What this machine's key is good for now, by the store's signed
    /// lists: the generations it holds and those live, and whether the
    /// revocation list names it. An agent watches this, so that a machine
    /// stranded by a master-key rotation or revoked says so itself rather
    /// than through each client's failed load.
    ///
    /// # Errors
    /// As [`Machine::revocations`], for either list.
    pub fn health(&self) -> Result<MachineHealth> {
        let live = self.seen.accept(self.store.get(layout::GENERATIONS)?.as_deref(), &self.key.authority)?.live();
        let revocations = self.revocations()?;
        let revoked = self.id().is_some_and(|id| revocations.contains(id));
        Ok(MachineHealth {
            id: self.id().map(str::to_owned),
            held: self.key.generations(),
            live,
            revoked,
            revoked_machines: revocations.ids.len(),
        })
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

    /// Opens the secret `envelope` wraps from the store's copy of it when
    /// the authority re-wrapped it since ([`current_envelope`]), else from
    /// `envelope`: a key file or a client that holds an envelope from
    /// before a policy key's rotation keeps working after the old version
    /// is retired. The store's copy is the authority's latest word on the
    /// secret: a machine revoked from it (a re-wrap that excludes it) is
    /// refused at once, not when the old version is retired.
    ///
    /// # Errors
    /// As [`Machine::open`], for the envelope opened.
    pub fn open_current(&self, envelope: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
        let env = Envelope::parse(envelope)?;
        match current_envelope(&*self.store, &env)? {
            Some(current) => self.open_envelope(&current),
            None => self.open_envelope(&env),
        }
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
        precheck(&self.key.authority, &self.key.attrs, env)
    }

    /// The sealed copy of the policy key of `env` for the newest usable
    /// generation, checked (header, authority, signature) but not opened,
    /// with this machine's key for that generation.
    fn sealed_copy(&self, env: &Envelope) -> Result<(SealedKey, &AttributeKey)> {
        let (sealed, g) = sealed_copy(&*self.store, &self.seen, &self.key.authority, self.key.id(), &self.key.generations(), env)?;
        // `g` is one of this key's generations.
        let key = self.key.keys.iter().find(|(k, _)| *k == g).map(|(_, k)| k);
        key.map(|k| (sealed, k)).ok_or(WrapError::UnknownPolicyKey { policy_id: hex(&env.policy_id), version: env.key_version })
    }

    /// The same machine without its key: decides as this one does, cannot
    /// open anything.
    pub fn public(&self) -> PublicMachine {
        PublicMachine::new(self.key.info(), self.store.clone())
    }

    /// Cache counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Drops every cached policy key (wiping it).
    pub fn clear_cache(&self) {
        self.cache.clear()
    }

    /// The store no longer holds the object `name`: forgets the policy key
    /// the cache opened, if it came from such an object (a sealed copy,
    /// deleted when its policy-key version or its master generation is
    /// retired), so the next open reads the store again and fails if
    /// nothing live is left. Whether the cache held it.
    pub fn forget(&self, name: &str) -> bool {
        layout::parse_sealed(name).is_some_and(|s| self.cache.forget(&(s.policy_id, s.version)))
    }

    /// Follows the store's changes with two watches ([`Store::watch`]:
    /// etcd's stream, or polling for a directory), one on `sealed/` and one
    /// on `public/`, and [`apply`](Machine::apply)s each as it arrives:
    /// a retirement reaches the cache without waiting for its time to
    /// live, a new or rotated policy key this machine may open is opened
    /// ahead of the first envelope that needs it, and a new generation list
    /// is verified (and a replayed one refused) as soon as it is written.
    /// Stops when the returned [`Follower`] is dropped (or this machine is).
    ///
    /// # Errors
    /// [`WrapError::Store`] if a watch cannot start.
    pub fn follow(self: &Arc<Self>) -> Result<Follower> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for prefix in [layout::SEALED, layout::PUBLIC] {
            let watch = self.store.clone().watch(prefix, 0)?;
            let (machine, flag) = (Arc::downgrade(self), stop.clone());
            let thread = std::thread::Builder::new()
                .name("keyfence-machine-follow".into())
                .spawn_quiet(move || {
                    while !flag.load(Ordering::SeqCst) {
                        let Some(event) = watch.next_timeout(std::time::Duration::from_millis(100)) else { continue };
                        let Some(m) = machine.upgrade() else { return };
                        m.apply(&event);
                    }
                })
                .map_err(|e| super::store::StoreError::Io { key: prefix.into(), source: e })?;
            threads.push(thread);
        }
        Ok(Follower { stop, threads })
    }

    /// Brings the cache up to one change of the store (what
    /// [`Machine::follow`] does with each event; a caller running its own
    /// watch can do it instead): a deleted sealed copy is forgotten, a new
    /// one opened ahead if this machine may open it, a new generation list
    /// verified and its propagation delay counted, and after a compaction
    /// the cache is cleared (a full resync, counted). Best effort: a change
    /// that cannot be applied (a store that fails, a replayed list) is
    /// left to the next [`Machine::open`], which reads and checks the store
    /// itself and reports the error.
    pub fn apply(&self, event: &WatchEvent) {
        self.cache.count_event();
        match event {
            WatchEvent::Delete { key, .. } => {
                self.forget(key);
            }
            WatchEvent::Put { key, value, .. } if key == layout::GENERATIONS => {
                // The list the feed carried, or (a polled store) the store's.
                let list = match value {
                    Some(v) => self.seen.accept(Some(v), &self.key.authority),
                    None => self.generations(),
                };
                if let Ok(list) = list {
                    self.cache.count_propagation(list.committed_at);
                }
            }
            WatchEvent::Put { key, value, .. } => self.warm(key, value.as_deref()),
            WatchEvent::Compacted { .. } => {
                self.cache.count_resync();
                self.clear_cache();
                let _ = self.generations();
            }
        }
    }

    /// The store's generation list, verified and checked against the
    /// newest one this machine has seen.
    fn generations(&self) -> Result<GenerationList> {
        self.seen.accept(self.store.get(layout::GENERATIONS)?.as_deref(), &self.key.authority)
    }

    /// Opens the policy key of the sealed copy `name` into the cache, if it
    /// is for a generation this machine holds a key for, signed by its
    /// authority, under a policy its attributes satisfy, and not cached;
    /// `value` is the copy if the watch carried it, else it is read.
    fn warm(&self, name: &str, value: Option<&[u8]>) {
        let Some(s) = layout::parse_sealed(name) else { return };
        let Some(key) = self.key.keys.iter().find(|(g, _)| *g == s.generation).map(|(_, k)| k) else { return };
        if self.cache.holds(&(s.policy_id, s.version)) {
            return;
        }
        // Only a generation the store's list says is live, that list
        // accepted (and kept as the floor) as an open accepts it: a policy
        // key in the cache is opened later without reading the list again,
        // so a copy put back for a retired generation, or one read while
        // the floor cannot be kept, must not get there.
        match self.generations() {
            Ok(list) if list.live().contains(&s.generation) => {}
            _ => return,
        }
        let read;
        let blob = match value {
            Some(v) => v,
            None => match self.store.get(name) {
                Ok(Some(b)) => {
                    read = b;
                    &read[..]
                }
                _ => return,
            },
        };
        let Ok(sealed) = SealedKey::parse(blob) else { return };
        let named = sealed.policy_id == s.policy_id && sealed.version == s.version && sealed.generation == s.generation;
        let excluded = self.key.id().is_some_and(|id| sealed.excluded.iter().any(|x| x == id));
        if !named || excluded || sealed.verify(&self.key.authority).is_err() {
            return;
        }
        let Ok(policy) = super::policy::CanonicalPolicy::parse(&sealed.policy) else { return };
        if !policy.eval(&self.key.attrs) {
            return;
        }
        let _ = self.cache.get_or_load((s.policy_id, s.version), || sealed.open(key));
    }
}

/// A machine following its store's changes ([`Machine::follow`]); stops
/// (within a tenth of a second) when dropped.
pub struct Follower {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl fmt::Debug for Follower {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Follower")
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The envelope's authority and signature, then the attributes: the
/// checks that need neither the store nor CP-ABE.
fn precheck(authority: &[u8; 32], attrs: &Attributes, env: &Envelope) -> Result<()> {
    env.verify(authority)?;
    if !env.policy.eval(attrs) {
        return Err(WrapError::NotAuthorized { policy: env.policy.to_string() });
    }
    Ok(())
}

/// The sealed copy of the policy key of `env` for the newest of `have`
/// (a machine key's generations, newest first) that is live by the
/// store's generation list (verified, and refused if it goes back on the
/// newest list `seen`), checked (header, authority, signature) but not
/// opened, and that generation. A copy that excludes machine `id` is
/// [`WrapError::Revoked`], without CP-ABE work.
fn sealed_copy(
    store: &dyn Store, seen: &Seen, authority: &[u8; 32], id: Option<&str>, have: &[u32], env: &Envelope,
) -> Result<(SealedKey, u32)> {
    let live = seen.accept(store.get(layout::GENERATIONS)?.as_deref(), authority)?.live();
    let usable: Vec<u32> = have.iter().copied().filter(|g| live.contains(g)).collect();
    if usable.is_empty() {
        return Err(WrapError::RetiredGeneration { have: have.to_vec(), live });
    }
    for g in usable {
        let name = layout::sealed(&env.policy_id, env.key_version, g);
        let Some(blob) = store.get(&name)? else { continue };
        let sealed = SealedKey::parse(&blob)?;
        sealed.verify(authority)?;
        if sealed.policy_id != env.policy_id || sealed.version != env.key_version || sealed.generation != g {
            return Err(WrapError::Tampered { object: "sealed policy key" });
        }
        if let Some(id) = id.filter(|id| sealed.excluded.iter().any(|x| x == id)) {
            return Err(WrapError::Revoked { id: id.to_owned() });
        }
        return Ok((sealed, g));
    }
    Err(WrapError::UnknownPolicyKey { policy_id: hex(&env.policy_id), version: env.key_version })
}

/// A machine seen from outside its key: its [`MachineInfo`] and the store
/// of sealed policy keys. It decides what [`Machine::can_open`] decides,
/// reading the same store, but holds nothing that decrypts: a process
/// that keeps its keys in the key process checks with this which
/// envelopes to hand over.
pub struct PublicMachine {
    info: MachineInfo,
    store: Arc<dyn Store>,
    seen: Seen,
}

impl fmt::Debug for PublicMachine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublicMachine").field("info", &self.info).finish_non_exhaustive()
    }
}

impl PublicMachine {
    /// The machine described by `info`, reading sealed policy keys from
    /// `store`.
    pub fn new(info: MachineInfo, store: Arc<dyn Store>) -> Self {
        Self { info, store, seen: Seen::default() }
    }

    /// What the machine key says about itself.
    pub fn info(&self) -> &MachineInfo {
        &self.info
    }

    /// The machine's attributes.
    pub fn attributes(&self) -> &Attributes {
        &self.info.attrs
    }

    /// As [`Machine::could_open`]: whether the attributes satisfy the
    /// envelope's policy.
    pub fn could_open(&self, envelope: &Envelope) -> bool {
        envelope.policy.eval(&self.info.attrs)
    }

    /// As [`Machine::can_open`]: every check [`Machine::open`] makes short
    /// of decrypting (authority and signature, attributes, a live
    /// generation the machine holds a key for, a sealed copy of the policy
    /// key for it signed by the machine's authority). Reads the store.
    ///
    /// # Errors
    /// The error [`Machine::open`] would return for the same reason.
    pub fn can_open(&self, envelope: &Envelope) -> Result<()> {
        precheck(&self.info.authority, &self.info.attrs, envelope)?;
        sealed_copy(&*self.store, &self.seen, &self.info.authority, self.info.id(), &self.info.generations, envelope).map(drop)
    }
}

/// Most objects [`Machine::with_objects`] takes: the generation list, the
/// revocation list and a sealed copy per generation a store keeps.
const MAX_OPENING_OBJECTS: usize = 64;

/// The objects of `store` that opening `envelope` reads, by name: the
/// generation list and every sealed copy of the envelope's policy key
/// version. A process that holds the machine key but must not reach the
/// store (the key process) opens with them alone
/// ([`Machine::with_objects`]); the one that fetches them needs no key.
///
/// # Errors
/// [`WrapError::Store`].
pub fn objects_for_opening(store: &dyn Store, envelope: &Envelope) -> Result<Vec<(String, Vec<u8>)>> {
    let mut names = vec![layout::GENERATIONS.to_owned()];
    let copies = format!("{}{}/{}/", layout::SEALED, hex(&envelope.policy_id), envelope.key_version);
    names.extend(store.list(&copies)?.into_iter().filter(|n| layout::parse_sealed(n).is_some()).take(MAX_OPENING_OBJECTS - 1));
    let values = store.get_many(&names)?;
    Ok(names.into_iter().zip(values).filter_map(|(n, v)| v.map(|v| (n, v))).collect())
}

/// The store's copy of the secret `envelope` wraps, when it is another
/// envelope (the authority re-wrapped the secret since, for a rotated or
/// retired policy key or a revocation) of the same secret and authority:
/// what a key file written before the re-wrap should be opened from, so
/// that it keeps working after the old policy key is retired. `None` when
/// the store holds the same bytes, none, or something that does not parse
/// as an envelope of that secret (the opener's signature check decides
/// the rest).
///
/// # Errors
/// [`WrapError::Store`].
pub fn current_envelope(store: &dyn Store, envelope: &Envelope) -> Result<Option<Envelope>> {
    let Some(bytes) = store.get(&format!("{}{}", layout::ENVELOPES, hex(&envelope.secret_id)))? else {
        return Ok(None);
    };
    if bytes == envelope.bytes {
        return Ok(None);
    }
    Ok(Envelope::parse(&bytes).ok().filter(|c| c.secret_id == envelope.secret_id && c.authority == envelope.authority))
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
    nearest(peers.iter().filter(|p| envelope.policy.eval(&p.attributes)).map(|p| (p, p.latency)))
}

/// Where a request for a key goes, among the candidates that can open it
/// (each with its latency from the sender): the one with the smallest
/// latency, and among equal latencies the first given. One rule, written
/// once, so that the key server's forwarding (`sign::remote`, which gives
/// its peers in configuration order, unmeasured ones as [`Duration::MAX`])
/// and the authority's projection of a policy's load
/// ([`Authority::where_usable`](super::Authority::where_usable), which
/// gives its groups in sorted order) send the same request to the same
/// place.
///
/// ```
/// use std::time::Duration;
/// let ms = Duration::from_millis;
/// assert_eq!(keyfence::wrap::nearest([("ams", ms(9)), ("fra", ms(4)), ("lhr", ms(4))]), Some("fra"));
/// assert_eq!(keyfence::wrap::nearest(Vec::<(&str, Duration)>::new()), None);
/// ```
pub fn nearest<T>(candidates: impl IntoIterator<Item = (T, std::time::Duration)>) -> Option<T> {
    let mut best: Option<(T, std::time::Duration)> = None;
    for (c, latency) in candidates {
        if best.as_ref().is_none_or(|(_, b)| latency < *b) {
            best = Some((c, latency));
        }
    }
    best.map(|(c, _)| c)
}

/// `e`, a list kept in `path` that fails its checks, said with the file's
/// name and what to do.
fn in_file(e: WrapError, path: &Path) -> WrapError {
    malformed("newest lists", format!("{}: {e} (delete the file to start again from the store)", path.display()))
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
