//! The Prometheus endpoint: a minimal HTTP/1.1 server that answers every
//! request with the current text exposition. It never touches the signing
//! path.
//!
//! Each connection gets its own thread and one deadline for the whole
//! exchange ([`REQUEST_DEADLINE`]: reading the request head and writing the
//! answer), and at most [`MAX_CONNECTIONS`] are served at once, more being
//! closed at once: a client sending its request a byte at a time holds one
//! thread for at most the deadline and never delays another scrape.
//! (`tiny_http` was considered: it sets no time-out on the sockets it
//! accepts and starts a thread for every waiting connection without bound,
//! which trades the stall for unbounded threads; the few lines here give
//! both bounds.)

use crate::spawn::QuietSpawn;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sign::types::{Resource, SignError};

/// The time one connection gets to send its request head and read the
/// answer, all told.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);

/// Connections served at once; more are closed without an answer.
pub const MAX_CONNECTIONS: usize = 16;

/// The longest request head read; the rest is ignored.
const MAX_HEAD: usize = 8192;

/// A running metrics endpoint; dropping it stops it.
#[derive(Debug)]
pub struct MetricsEndpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl MetricsEndpoint {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

/// Serves `render()` as `text/plain; version=0.0.4` on `addr` (any path).
/// Bind it to loopback, or put it behind a TLS proxy that asks for a
/// client certificate: it answers anyone who can reach it.
///
/// # Errors
/// [`SignError::Io`] when the address cannot be bound or the thread cannot
/// start.
pub fn serve_metrics<F>(addr: SocketAddr, render: F) -> Result<MetricsEndpoint, SignError>
where
    F: Fn() -> String + Send + 'static,
{
    let listener =
        TcpListener::bind(addr).map_err(|e| SignError::io(Resource::Socket, format!("cannot listen on {addr} for metrics: {e}")))?;
    let addr = listener.local_addr().map_err(|e| SignError::io(Resource::Socket, e.to_string()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    // Rendering is quick; only the slow part, the peer, runs in parallel.
    let render = Arc::new(Mutex::new(render));
    let open = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("keyfence-metrics".into())
        .spawn_quiet(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Acquire) {
                    return;
                }
                let Ok(conn) = conn else {
                    // Out of descriptors, say: do not spin.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                if open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                    open.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
                let (render, o) = (render.clone(), open.clone());
                let spawned = std::thread::Builder::new().name("keyfence-metrics-conn".into()).spawn_quiet(move || {
                    answer(conn, &|| (*render.lock().unwrap_or_else(|e| e.into_inner()))());
                    o.fetch_sub(1, Ordering::AcqRel);
                });
                if spawned.is_err() {
                    open.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })
        .map_err(|e| SignError::io(Resource::Thread, format!("cannot start the metrics thread: {e}")))?;
    Ok(MetricsEndpoint { addr, stop })
}

/// Sets the socket's time-outs to what is left before `deadline`; false
/// once it has passed.
fn until(conn: &TcpStream, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    !left.is_zero() && conn.set_read_timeout(Some(left)).and_then(|()| conn.set_write_timeout(Some(left))).is_ok()
}

fn answer(mut conn: TcpStream, render: &dyn Fn() -> String) {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    // Read the request head; its content does not matter.
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        if !until(&conn, deadline) {
            return;
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let body = render();
    let reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut rest = reply.as_bytes();
    while !rest.is_empty() && until(&conn, deadline) {
        match conn.write(rest) {
            Ok(0) | Err(_) => return,
            Ok(n) => rest = &rest[n..],
        }
    }
}
