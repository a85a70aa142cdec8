//! Peers and the order they are tried in: each peer is described by its
//! attributes and a round-trip time the client measures itself (not a
//! hard-coded table). A key goes to the nearest peer whose attributes
//! satisfy its policy, as [`nearest_capable`](crate::wrap::nearest_capable)
//! chooses, then to the next nearest, skipping peers whose breaker is
//! open.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use keyfence_policy::Attributes;

use super::breaker::{Breaker, BreakerConfig};
use super::metrics::StatsCell;
use super::pool::Pool;
use crate::sign::SignError;
use crate::wrap::{CanonicalPolicy, Peer};

/// A key server a client may forward to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerConfig {
    /// Its name in metrics and errors (a data-center name, say).
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The name its TLS certificate must carry (DNS subject alternative
    /// name). Default: `name`.
    pub server_name: String,
    /// Its attributes: what it may open.
    pub attributes: Attributes,
}

impl PeerConfig {
    /// A peer called `name` at `addr` with `attributes`, whose certificate
    /// names it `name`.
    pub fn new(name: impl Into<String>, addr: SocketAddr, attributes: Attributes) -> Self {
        let name = name.into();
        PeerConfig { server_name: name.clone(), name, addr, attributes }
    }

    /// A peer as bindings and configuration files give it: `address` is
    /// `host:port`, an IP address or a name resolved now (to its first
    /// address: a client connects to one place per peer).
    ///
    /// ```
    /// use keyfence::sign::remote::PeerConfig;
    /// let p = PeerConfig::resolve("sfo1", "127.0.0.1:7543", "country=US".parse()?)?;
    /// assert_eq!(p.addr.port(), 7543);
    /// assert!(PeerConfig::resolve("", "127.0.0.1:7543", "a=b".parse()?).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`SignError::Config`] for an empty name, or an address that is not
    /// `host:port` or does not resolve.
    pub fn resolve(name: &str, address: &str, attributes: Attributes) -> Result<Self, SignError> {
        if name.is_empty() {
            return Err(SignError::Config("a peer's name must not be empty".into()));
        }
        let addr = match address.parse() {
            Ok(a) => a,
            Err(_) => address
                .to_socket_addrs()
                .map_err(|e| SignError::Config(format!("peer {name}: address {address:?} is not host:port or does not resolve: {e}")))?
                .next()
                .ok_or_else(|| SignError::Config(format!("peer {name}: address {address:?} resolves to nothing")))?,
        };
        Ok(PeerConfig::new(name, addr, attributes))
    }
}

/// No measurement yet.
const UNKNOWN: u64 = u64::MAX;

pub(crate) struct PeerState {
    pub(crate) config: PeerConfig,
    pub(crate) pool: Pool,
    pub(crate) breaker: Breaker,
    /// Smoothed round-trip time in nanoseconds, [`UNKNOWN`] before the
    /// first measurement.
    rtt_ns: AtomicU64,
    pub(crate) stats: StatsCell,
    pub(crate) failovers: AtomicU64,
}

impl PeerState {
    pub(crate) fn new(config: PeerConfig, pool: Pool, breaker: BreakerConfig) -> Self {
        PeerState {
            config,
            pool,
            breaker: Breaker::new(breaker),
            rtt_ns: AtomicU64::new(UNKNOWN),
            stats: StatsCell::new(),
            failovers: AtomicU64::new(0),
        }
    }

    /// The smoothed round-trip time, if measured.
    pub(crate) fn rtt(&self) -> Option<Duration> {
        match self.rtt_ns.load(Ordering::Relaxed) {
            UNKNOWN => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// Folds in a measurement: an exponentially weighted average (one
    /// quarter new), so one slow probe does not reorder the peers.
    pub(crate) fn measured(&self, rtt: Duration) {
        let new = u64::try_from(rtt.as_nanos()).unwrap_or(UNKNOWN - 1).min(UNKNOWN - 1);
        let _ = self
            .rtt_ns
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| Some(if old == UNKNOWN { new } else { (old / 4) * 3 + new / 4 }));
    }

    /// This peer as the wrap layer's chooser sees it (unmeasured peers as
    /// infinitely far).
    pub(crate) fn as_peer(&self) -> Peer {
        Peer { name: self.config.name.clone(), attributes: self.config.attributes.clone(), latency: self.rtt().unwrap_or(Duration::MAX) }
    }
}

/// The peers (by index) whose attributes satisfy `policy`.
pub(crate) fn capable(policy: &CanonicalPolicy, peers: &[PeerState]) -> Vec<usize> {
    (0..peers.len()).filter(|&i| policy.eval(&peers[i].config.attributes)).collect()
}

/// `capable` peers nearest first (measured round-trip time; unmeasured
/// last, in configuration order), without those whose breaker is open.
pub(crate) fn order(capable: &[usize], peers: &[PeerState], now: Instant) -> Vec<usize> {
    let mut v: Vec<usize> = usable(capable, peers, now).collect();
    v.sort_by_key(|&i| nearness(peers, i));
    v
}

/// The first of [`order`], without building the order: what admission
/// asks for every operation.
pub(crate) fn nearest(capable: &[usize], peers: &[PeerState], now: Instant) -> Option<usize> {
    // The one rule (`wrap::nearest`): `capable` is in configuration order,
    // so a tie goes to the peer configured first, as `nearness` orders.
    crate::wrap::nearest(usable(capable, peers, now).map(|i| (i, nearness(peers, i).0)))
}

fn usable<'a>(capable: &'a [usize], peers: &'a [PeerState], now: Instant) -> impl Iterator<Item = usize> + 'a {
    capable.iter().copied().filter(move |&i| peers[i].breaker.state(now) != super::breaker::BreakerState::Open)
}

/// Measured round-trip time first, unmeasured last, then configuration order.
fn nearness(peers: &[PeerState], i: usize) -> (Duration, usize) {
    (peers[i].rtt().unwrap_or(Duration::MAX), i)
}
