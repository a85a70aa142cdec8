//! The machine's cache of opened policy keys.
//!
//! Opening a policy key is a CP-ABE decryption (milliseconds); opening a
//! customer secret with it is one HPKE open (tens of microseconds). The
//! cache keeps CP-ABE off the request path: bounded, with a time to live,
//! keys wiped when evicted, and concurrent misses on the same policy key
//! coalesced so the CP-ABE work happens once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use zeroize::Zeroizing;

use super::error::Result;

/// Cache limits.
#[derive(Debug, Clone, Copy)]
pub struct CacheConfig {
    /// Most policy keys held at once.
    pub capacity: usize,
    /// How long an opened policy key may be used before it is opened again.
    pub ttl: Duration,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self { capacity: 1024, ttl: Duration::from_secs(300) }
    }
}

/// Counters of the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Opens served from the cache.
    pub hits: u64,
    /// Opens that had to open the policy key.
    pub misses: u64,
    /// Keys dropped for capacity or age.
    pub evictions: u64,
    /// Keys currently held.
    pub entries: usize,
    /// Store changes applied from a watch ([`Machine::apply`](super::Machine::apply)).
    pub watch_events: u64,
    /// Full resyncs: the cache cleared because a watch lost changes (an
    /// etcd compaction, a polled store resumed).
    pub resyncs: u64,
    /// Generation lists accepted from a watch: how many propagation delays
    /// were measured.
    pub propagations: u64,
    /// The last propagation delay: from the authority's commit (the time it
    /// signs into the generation list, by its clock) to this machine having
    /// verified the new list (by this one's). Clocks apart skew it.
    pub propagation_last: Duration,
    /// The longest propagation delay measured.
    pub propagation_max: Duration,
    /// The sum of the delays measured (divide by `propagations`).
    pub propagation_total: Duration,
}

pub(crate) type KeyId = ([u8; 32], u32);

struct Entry {
    key: Zeroizing<[u8; 32]>,
    at: Instant,
}

pub(crate) struct PolicyKeyCache {
    cfg: CacheConfig,
    map: Mutex<HashMap<KeyId, Entry>>,
    inflight: Mutex<HashMap<KeyId, Arc<Mutex<()>>>>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    /// Bumped by every `forget` and `clear`: a load that began before one
    /// does not insert what it loaded, which may be what was forgotten.
    epoch: AtomicU64,
    watch_events: AtomicU64,
    resyncs: AtomicU64,
    /// Count, last, max and total of the propagation delays.
    propagation: Mutex<(u64, Duration, Duration, Duration)>,
}

impl PolicyKeyCache {
    pub(crate) fn new(cfg: CacheConfig) -> Self {
        Self {
            cfg,
            map: Mutex::new(HashMap::new()),
            inflight: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            watch_events: AtomicU64::new(0),
            resyncs: AtomicU64::new(0),
            propagation: Mutex::new(Default::default()),
        }
    }

    fn lookup(&self, id: &KeyId) -> Option<Zeroizing<[u8; 32]>> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(id) {
            Some(e) if e.at.elapsed() < self.cfg.ttl => Some(e.key.clone()),
            Some(_) => {
                map.remove(id);
                self.evictions.fetch_add(1, Ordering::Relaxed);
                None
            }
            None => None,
        }
    }

    /// The key for `id`, from the cache or from `load` (run once however
    /// many callers miss at the same time).
    pub(crate) fn get_or_load(&self, id: KeyId, load: impl FnOnce() -> Result<Zeroizing<[u8; 32]>>) -> Result<Zeroizing<[u8; 32]>> {
        if let Some(k) = self.lookup(&id) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(k);
        }
        let gate = self.inflight.lock().unwrap_or_else(|e| e.into_inner()).entry(id).or_default().clone();
        let _turn = gate.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = self.lookup(&id) {
            // Another caller loaded it while this one waited.
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(k);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let epoch = self.epoch.load(Ordering::SeqCst);
        let loaded = load();
        if let Ok(k) = &loaded {
            if self.epoch.load(Ordering::SeqCst) == epoch {
                self.insert(id, k.clone());
            }
        }
        self.inflight.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        loaded
    }

    fn insert(&self, id: KeyId, key: Zeroizing<[u8; 32]>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let before = map.len();
        map.retain(|_, e| e.at.elapsed() < self.cfg.ttl);
        let mut evicted = before - map.len();
        while map.len() >= self.cfg.capacity.max(1) {
            let Some(oldest) = map.iter().min_by_key(|(_, e)| e.at).map(|(k, _)| *k) else { break };
            map.remove(&oldest);
            evicted += 1;
        }
        self.evictions.fetch_add(evicted as u64, Ordering::Relaxed);
        map.insert(id, Entry { key, at: Instant::now() });
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let p = *self.propagation.lock().unwrap_or_else(|e| e.into_inner());
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            entries: self.map.lock().unwrap_or_else(|e| e.into_inner()).len(),
            watch_events: self.watch_events.load(Ordering::Relaxed),
            resyncs: self.resyncs.load(Ordering::Relaxed),
            propagations: p.0,
            propagation_last: p.1,
            propagation_max: p.2,
            propagation_total: p.3,
        }
    }

    /// Whether `id` is held (and not expired), without counting a hit.
    pub(crate) fn holds(&self, id: &KeyId) -> bool {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(id).is_some_and(|e| e.at.elapsed() < self.cfg.ttl)
    }

    pub(crate) fn count_event(&self) {
        self.watch_events.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_resync(&self) {
        self.resyncs.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the delay from `committed` to now (zero if this clock is
    /// behind the committer's).
    pub(crate) fn count_propagation(&self, committed: SystemTime) {
        let d = SystemTime::now().duration_since(committed).unwrap_or_default();
        let mut p = self.propagation.lock().unwrap_or_else(|e| e.into_inner());
        *p = (p.0 + 1, d, p.2.max(d), p.3 + d);
    }

    pub(crate) fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.map.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Drops (wiping) the key `id`; whether it was held.
    pub(crate) fn forget(&self, id: &KeyId) -> bool {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(id).is_some()
    }
}
