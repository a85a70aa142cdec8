//! Per-tenant admission on the server: each tenant (zone) may have at most
//! a fixed number of requests in flight, so one zone's flood is refused
//! while every other zone is served (the first Geo Key Manager outage was
//! one new zone filling every queue). A lookup is one hash-map access
//! under a short lock, and the count itself is an atomic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use super::metrics::{RequestStats, StatsCell};

/// Tenants tracked one by one; beyond this many, further tenants share one
/// entry (and its limit), so a peer inventing tenant ids cannot grow the
/// server's memory without bound.
pub(crate) const MAX_TRACKED: usize = 10_000;

/// The tenant id the overflow entry reports.
pub(crate) const OVERFLOW: u64 = u64::MAX;

pub(crate) struct Tenant {
    pub(crate) id: u64,
    in_flight: AtomicU32,
    pub(crate) stats: StatsCell,
}

/// One admitted request of a tenant; its slot is released when dropped.
pub(crate) struct Admitted(Arc<Tenant>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admitted {
    pub(crate) fn tenant(&self) -> &Tenant {
        &self.0
    }
}

pub(crate) struct Tenants {
    limit: u32,
    map: Mutex<HashMap<u64, Arc<Tenant>>>,
    overflow: Arc<Tenant>,
}

impl Tenants {
    pub(crate) fn new(limit: u32) -> Self {
        Tenants { limit, map: Mutex::new(HashMap::new()), overflow: Arc::new(Tenant::new(OVERFLOW)) }
    }

    pub(crate) fn get(&self, id: u64) -> Arc<Tenant> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = map.get(&id) {
            return t.clone();
        }
        if map.len() >= MAX_TRACKED {
            return self.overflow.clone();
        }
        map.entry(id).or_insert_with(|| Arc::new(Tenant::new(id))).clone()
    }

    /// Takes a slot for `tenant`, or `None` when it has `limit` in flight.
    pub(crate) fn admit(&self, tenant: Arc<Tenant>) -> Option<Admitted> {
        let limit = self.limit;
        tenant.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1)).ok()?;
        Some(Admitted(tenant))
    }

    /// Every tenant's id, requests in flight and counters.
    pub(crate) fn snapshot(&self) -> Vec<(u64, u32, RequestStats)> {
        let tenants: Vec<Arc<Tenant>> = {
            let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            map.values().cloned().chain(std::iter::once(self.overflow.clone())).collect()
        };
        let mut out: Vec<_> = tenants
            .iter()
            .map(|t| (t.id, t.in_flight.load(Ordering::Relaxed), t.stats.snapshot()))
            .filter(|(id, _, s)| *id != OVERFLOW || s.counts.requests > 0)
            .collect();
        out.sort_by_key(|t| t.0);
        out
    }
}

impl Tenant {
    fn new(id: u64) -> Self {
        Tenant { id, in_flight: AtomicU32::new(0), stats: StatsCell::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_at_its_limit_is_refused_and_others_are_not() {
        let t = Tenants::new(2);
        let a1 = t.admit(t.get(1)).unwrap();
        let _a2 = t.admit(t.get(1)).unwrap();
        assert!(t.admit(t.get(1)).is_none());
        assert!(t.admit(t.get(2)).is_some());
        drop(a1);
        assert!(t.admit(t.get(1)).is_some());
    }

    #[test]
    fn invented_tenants_share_one_entry_past_the_cap() {
        let t = Tenants::new(1);
        for id in 0..MAX_TRACKED as u64 + 50 {
            t.get(id);
        }
        assert_eq!(t.map.lock().unwrap().len(), MAX_TRACKED);
        assert_eq!(t.get(u64::MAX - 1).id, OVERFLOW);
    }
}
