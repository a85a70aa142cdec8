//! The agent's watch on its own machine key: every few seconds it reads
//! the store's signed lists ([`Machine::health`]) and says in its log what
//! changed. A master-key rotation that retired the last generation its
//! key holds, or a revocation that names it, was seen before only by the
//! clients whose loads then failed, one by one, while keys already loaded
//! kept signing. A revoked agent now also drops every key it holds (it
//! ends every connection) and opens no envelope again.
//!
//! [`Machine::health`]: crate::wrap::Machine::health

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Inner;
use crate::wrap::MachineHealth;

/// How often the store's lists are read.
pub(super) const EVERY: Duration = Duration::from_secs(2);

/// What the last look found: the machine's standing, or why the lists
/// could not be read.
pub(super) type Standing = Result<MachineHealth, String>;

/// Reads the machine's standing and logs it where it differs from `last`
/// (at start, `None`: logged only when something is wrong).
pub(super) fn look(inner: &Inner, last: Option<&Standing>) -> Standing {
    let Some((machine, _)) = &inner.agent_service.machine else { return Err("no machine".into()) };
    let now = machine.health().map_err(|e| e.to_string());
    if last == Some(&now) {
        return now;
    }
    match (&now, last) {
        (Ok(h), _) if h.revoked => {
            // Lists only grow: once revoked, always. Loads are refused from
            // here on, and every key opened through this machine goes.
            if !inner.agent_service.revoked.swap(true, Ordering::AcqRel) {
                let conns: Vec<_> = inner.conns().values().cloned().collect();
                for s in &conns {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                }
                tracing::error!(
                    connections = conns.len(),
                    "{}; every connection was ended, dropping the keys it held",
                    h.problem().unwrap_or_default()
                );
            }
        }
        (Ok(h), _) if !h.usable() => tracing::error!("{}", h.problem().unwrap_or_default()),
        (Ok(h), Some(Ok(before))) if before.live != h.live => {
            tracing::info!(live = ?h.live, held = ?h.held, was = ?before.live, "the store's live generations changed")
        }
        (Ok(_), Some(Ok(_))) => {}
        (Ok(h), Some(Err(_))) => {
            tracing::info!(live = ?h.live, "the store's lists can be read again; this machine's key is usable")
        }
        (Ok(_), None) => {}
        (Err(e), _) => tracing::error!("the agent cannot read its store's generation and revocation lists: {e}"),
    }
    if let (Ok(h), Some(Ok(before))) = (&now, last) {
        // Another machine revoked: a store update an operator looks for.
        if h.revoked_machines != before.revoked_machines && !h.revoked {
            tracing::info!(
                machines = h.revoked_machines,
                was = before.revoked_machines,
                "the store's revocation list changed; this machine is not on it"
            );
        }
        // From unusable to usable again (a new generation issued to it).
        if h.usable() && !before.usable() {
            tracing::info!(live = ?h.live, "this machine's key holds a live generation again");
        }
    }
    now
}

/// Looks every [`EVERY`] until the agent stops.
pub(super) fn run(inner: &Arc<Inner>, last: &mut Standing) {
    let mut next = Instant::now() + EVERY;
    while !inner.stop.load(Ordering::Acquire) {
        if Instant::now() >= next {
            *last = look(inner, Some(last));
            next = Instant::now() + EVERY;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
