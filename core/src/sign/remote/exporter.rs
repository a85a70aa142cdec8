//! The Prometheus endpoint: a minimal HTTP/1.1 server that answers every
//! request with the current text exposition. One short-lived connection at
//! a time is all a scraper needs; it never touches the signing path.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::sign::types::{Resource, SignError};

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
///
/// # Errors
/// [`SignError::Io`] when the address cannot be bound or the thread cannot
/// start.
pub fn serve_metrics<F>(addr: SocketAddr, render: F) -> Result<MetricsEndpoint, SignError>
where
    F: Fn() -> String + Send + 'static,
{
    let listener = TcpListener::bind(addr)
        .map_err(|e| SignError::io(Resource::Socket, format!("cannot listen on {addr} for metrics: {e}")))?;
    let addr = listener.local_addr().map_err(|e| SignError::io(Resource::Socket, e.to_string()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    std::thread::Builder::new()
        .name("keyfence-metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Acquire) {
                    return;
                }
                if let Ok(conn) = conn {
                    answer(conn, &render);
                }
            }
        })
        .map_err(|e| SignError::io(Resource::Thread, format!("cannot start the metrics thread: {e}")))?;
    Ok(MetricsEndpoint { addr, stop })
}

fn answer(mut conn: TcpStream, render: &dyn Fn() -> String) {
    let t = Some(Duration::from_secs(2));
    if conn.set_read_timeout(t).and_then(|()| conn.set_write_timeout(t)).is_err() {
        return;
    }
    // Read the request head (up to 8 KiB); its content does not matter.
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let body = render();
    let _ = write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
