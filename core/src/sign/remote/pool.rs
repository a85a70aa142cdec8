//! A bounded pool of multiplexed connections to one peer: a fixed number
//! of slots, each holding at most one connection that many requests share
//! (never one connection per request, which is how a fixed connection
//! budget ran out in the seed). A slot whose connection died is
//! reconnected by the first caller that needs it; others wait for that
//! attempt (never past their own deadline) instead of piling on; and right
//! after a failed connect, callers fail at once for a short while rather
//! than each paying the connect timeout to a dead host.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use openssl::ssl::SslConnector;

use super::conn::{CallError, ClientConn};

#[derive(Default)]
struct SlotState {
    conn: Option<Arc<ClientConn>>,
    connecting: bool,
    failed: Option<(Instant, String)>,
}

#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    ready: Condvar,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(crate) struct Pool {
    addr: SocketAddr,
    server_name: String,
    connector: SslConnector,
    connect_timeout: Duration,
    /// How long a failed connect is reported without trying again.
    hold_down: Duration,
    slots: Vec<Slot>,
    next: AtomicUsize,
}

impl Pool {
    pub(crate) fn new(addr: SocketAddr, server_name: String, connector: SslConnector, size: usize, connect_timeout: Duration) -> Self {
        Pool {
            addr,
            server_name,
            connector,
            connect_timeout,
            hold_down: connect_timeout.min(Duration::from_millis(100)),
            slots: (0..size.max(1)).map(|_| Slot::default()).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// A live connection from the next slot, connecting it if needed.
    pub(crate) fn get(&self, deadline: Instant) -> Result<Arc<ClientConn>, CallError> {
        let slot = &self.slots[self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len()];
        let mut st = slot.lock();
        loop {
            if let Some(c) = st.conn.as_ref().filter(|c| !c.is_dead()) {
                return Ok(c.clone());
            }
            if st.connecting {
                let now = Instant::now();
                if now >= deadline {
                    return Err(CallError::Connect("timed out waiting for a connection".into()));
                }
                st = slot.ready.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
                continue;
            }
            if let Some((at, why)) = &st.failed {
                if at.elapsed() < self.hold_down {
                    return Err(CallError::Connect(why.clone()));
                }
            }
            st.connecting = true;
            st.conn = None;
            drop(st);
            let until = deadline.min(Instant::now() + self.connect_timeout);
            let result = ClientConn::connect(&self.connector, self.addr, &self.server_name, until);
            st = slot.lock();
            st.connecting = false;
            slot.ready.notify_all();
            return match result {
                Ok(c) => {
                    st.conn = Some(c.clone());
                    st.failed = None;
                    Ok(c)
                }
                Err(e) => {
                    if let CallError::Connect(why) = &e {
                        st.failed = Some((Instant::now(), why.clone()));
                    }
                    Err(e)
                }
            };
        }
    }

    /// A live connection with a free request slot, without waiting: the
    /// next slot's, else any other's; `None` when none is (then
    /// [`Pool::get`], which may connect and wait, is the way).
    pub(crate) fn ready(&self) -> Option<Arc<ClientConn>> {
        let n = self.slots.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n).find_map(|k| self.slots[(first + k) % n].lock().conn.clone().filter(|c| !c.is_dead() && c.has_room()))
    }

    /// Live connections now.
    pub(crate) fn live(&self) -> usize {
        self.slots.iter().filter(|s| s.lock().conn.as_ref().is_some_and(|c| !c.is_dead())).count()
    }

    /// Closes every connection (in-flight requests on them fail).
    pub(crate) fn close_all(&self) {
        for s in &self.slots {
            if let Some(c) = s.lock().conn.take() {
                c.close();
            }
        }
    }
}

impl Drop for Pool {
    /// Each connection's thread holds its connection: without this, the
    /// threads and sockets of a dropped client would live on. Every
    /// connection is closed first, then each thread joined, so they end
    /// side by side.
    fn drop(&mut self) {
        let conns: Vec<Arc<ClientConn>> = self.slots.iter().filter_map(|s| s.lock().conn.take()).collect();
        for c in &conns {
            c.close();
        }
        for c in &conns {
            c.join();
        }
    }
}
