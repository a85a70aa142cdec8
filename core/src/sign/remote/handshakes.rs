//! The key server's unauthenticated connections: those accepted and not
//! yet past their TLS handshake and hello. Each has a deadline for the
//! whole of it, enforced by one reaper thread that shuts its socket down
//! (a blocked read then returns at once), so a peer trickling bytes cannot
//! stretch it the way a per-read time-out lets it. Their number is bounded
//! in all and per source address, apart from certified connections, and a
//! newcomer finding the table full takes the place of the oldest handshake
//! of the address holding the most: strangers cannot fill the server, and
//! a certified client's single handshake is never the one pushed out while
//! any address holds two. A handshake pushed out or past its deadline
//! still has a thread until that thread sees its socket shut down; those
//! threads are bounded too (twice the limit in all), so the threads of
//! handshakes never exceed `2 * max` however fast strangers connect.

use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One handshake under way.
struct Entry {
    addr: IpAddr,
    /// For choosing whom to push out: the oldest of an address.
    seq: u64,
    deadline: Instant,
    /// A clone of the connection's socket, to shut it down from here.
    socket: TcpStream,
}

#[derive(Default)]
struct Table {
    entries: HashMap<u64, Entry>,
    per_addr: HashMap<IpAddr, usize>,
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        if let Some(n) = self.per_addr.get_mut(&e.addr) {
            *n -= 1;
            if *n == 0 {
                self.per_addr.remove(&e.addr);
            }
        }
        Some(e)
    }
}

/// Why a connection was not admitted to its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Its address has its maximum of handshakes under way.
    PerAddress,
    /// Twice the maximum of handshake threads are still running (those
    /// closed have not ended yet).
    Threads,
}

/// The handshakes under way, their limits and their counters.
pub(crate) struct Handshakes {
    table: Mutex<Table>,
    max: usize,
    per_address: usize,
    timeout: Duration,
    next: AtomicU64,
    /// Threads of admitted connections not yet past their handshake
    /// (including those closed and not yet ended).
    threads: AtomicUsize,
    pub(crate) timed_out: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) evicted: AtomicU64,
}

impl Handshakes {
    /// At most `max` handshakes, `per_address` from one address, each
    /// given `timeout` in all.
    pub(crate) fn new(max: usize, per_address: usize, timeout: Duration) -> Self {
        Handshakes {
            table: Mutex::new(Table::default()),
            max,
            per_address,
            timeout,
            next: AtomicU64::new(1),
            threads: AtomicUsize::new(0),
            timed_out: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Handshakes under way now.
    pub(crate) fn len(&self) -> usize {
        self.table().entries.len()
    }

    /// Admits a connection from `addr` whose socket `socket` is a clone
    /// of: its id, for [`Handshakes::finish`]. The caller runs its
    /// handshake on a thread and calls [`Handshakes::thread_done`] when
    /// that thread is past it (or was never started).
    ///
    /// # Errors
    /// [`Refused::PerAddress`] when its address has its maximum under way,
    /// [`Refused::Threads`] when too many handshake threads still run.
    pub(crate) fn admit(&self, addr: IpAddr, socket: TcpStream) -> Result<u64, Refused> {
        let mut t = self.table();
        if t.per_addr.get(&addr).copied().unwrap_or(0) >= self.per_address {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::PerAddress);
        }
        if self.threads.load(Ordering::Acquire) >= 2 * self.max {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Refused::Threads);
        }
        if t.entries.len() >= self.max {
            // The oldest handshake of the address holding the most: a
            // table at most `max` long is scanned, under a lock held for
            // microseconds.
            let victim = t
                .entries
                .iter()
                .max_by_key(|(_, e)| (t.per_addr.get(&e.addr).copied().unwrap_or(0), std::cmp::Reverse(e.seq)))
                .map(|(id, _)| *id);
            if let Some(e) = victim.and_then(|id| t.remove(id)) {
                let _ = e.socket.shutdown(Shutdown::Both);
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        *t.per_addr.entry(addr).or_insert(0) += 1;
        t.entries.insert(id, Entry { addr, seq: id, deadline: Instant::now() + self.timeout, socket });
        self.threads.fetch_add(1, Ordering::AcqRel);
        Ok(id)
    }

    /// The thread of an admitted connection is past its handshake.
    pub(crate) fn thread_done(&self) {
        self.threads.fetch_sub(1, Ordering::AcqRel);
    }

    /// Ends handshake `id`: true if it was still under way, false if it
    /// was closed meanwhile (deadline passed, or pushed out), in which
    /// case its socket is already shut down.
    pub(crate) fn finish(&self, id: u64) -> bool {
        self.table().remove(id).is_some()
    }

    /// Shuts down every handshake past its deadline; returns how long
    /// until the next deadline (at most `cap`).
    pub(crate) fn reap(&self, cap: Duration) -> Duration {
        let now = Instant::now();
        let mut t = self.table();
        let late: Vec<u64> = t.entries.iter().filter(|(_, e)| e.deadline <= now).map(|(id, _)| *id).collect();
        for id in late {
            if let Some(e) = t.remove(id) {
                let _ = e.socket.shutdown(Shutdown::Both);
                self.timed_out.fetch_add(1, Ordering::Relaxed);
            }
        }
        // New entries have later deadlines than every one here, so
        // sleeping until the earliest of these misses none.
        t.entries.values().map(|e| e.deadline.saturating_duration_since(now)).min().unwrap_or(cap).min(cap)
    }

    /// Shuts down every handshake under way (the server is stopping).
    pub(crate) fn close_all(&self) {
        let mut t = self.table();
        for (_, e) in t.entries.drain() {
            let _ = e.socket.shutdown(Shutdown::Both);
        }
        t.per_addr.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{Ipv4Addr, TcpListener};

    /// A connected pair: (the server's end, the client's end).
    fn pair(l: &TcpListener) -> (TcpStream, TcpStream) {
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (s, c)
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
    }

    /// Whether the server's end was shut down, as the client sees it.
    fn shut(client: &mut TcpStream) -> bool {
        client.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        matches!(client.read(&mut [0u8; 1]), Ok(0) | Err(_))
    }

    #[test]
    fn a_full_table_pushes_out_the_oldest_of_the_busiest_address() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let h = Handshakes::new(4, 3, Duration::from_secs(60));
        let mut clients = Vec::new();
        // One certified client's handshake first (the oldest), then three
        // from a stranger's address.
        for a in [1, 2, 2, 2] {
            let (s, c) = pair(&l);
            h.admit(ip(a), s).unwrap();
            clients.push(c);
        }
        // A fourth from the stranger: its address is at its limit.
        let (s, _c) = pair(&l);
        assert_eq!(h.admit(ip(2), s), Err(Refused::PerAddress));
        // Someone else: the stranger's oldest goes, not the older one of
        // the address holding one.
        let (s, _c) = pair(&l);
        h.admit(ip(3), s).unwrap();
        assert_eq!(h.evicted.load(Ordering::Relaxed), 1);
        assert!(shut(&mut clients[1]), "the stranger's oldest was shut down");
        assert!(h.finish(1), "the lone handshake is still under way");
        assert!(!h.finish(2), "the pushed-out one is gone");
    }

    #[test]
    fn handshakes_past_their_deadline_are_shut_down_and_threads_are_capped() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let h = Handshakes::new(1, 1, Duration::from_millis(50));
        let (s, mut c) = pair(&l);
        let id = h.admit(ip(1), s).unwrap();
        assert!(h.reap(Duration::from_secs(1)) <= Duration::from_millis(50));
        std::thread::sleep(Duration::from_millis(60));
        h.reap(Duration::from_secs(1));
        assert_eq!(h.timed_out.load(Ordering::Relaxed), 1);
        assert!(shut(&mut c));
        assert!(!h.finish(id));
        // Its thread has not said it is done, nor has the next one's: at
        // twice the limit, newcomers are closed at once.
        let (s, _c) = pair(&l);
        h.admit(ip(2), s).unwrap();
        let (s, _c) = pair(&l);
        assert_eq!(h.admit(ip(3), s), Err(Refused::Threads));
        h.thread_done();
        let (s, _c) = pair(&l);
        assert!(h.admit(ip(3), s).is_ok());
    }
}
