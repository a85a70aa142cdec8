//! The key server's listening socket, with an accept queue deep enough
//! that a flood of connections does not drop a certified client's SYN.
//!
//! The standard library listens with a backlog of 128. A flood of
//! strangers fills that queue faster than the accept loop drains it on a
//! busy machine, and the kernel then drops new SYNs: a certified client's
//! connect waits for its SYN to be sent again (one second) and, with a
//! one-second connect timeout, fails (`core/tests/remote_handshake.rs`
//! saw it, with `TcpExtListenOverflows` growing meanwhile). Asking for
//! more is the fix nginx and HAProxy make too; the kernel caps it at
//! `net.core.somaxconn`.
// listen(2) on a socket this process owns.
#![allow(unsafe_code)]

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;

/// The accept queue asked for (the kernel caps it at `somaxconn`).
pub(crate) const BACKLOG: i32 = 4096;

/// Binds `addr` and listens with [`BACKLOG`].
///
/// # Errors
/// What binding or listening returns (address in use, no permission).
pub(crate) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let listener = TcpListener::bind(addr)?;
    // Linux lets listen(2) be called again on a listening socket to change
    // its backlog.
    // SAFETY: the descriptor belongs to `listener`, which is alive for the
    // call; listen(2) reads nothing else from this process.
    let rc = unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use std::net::TcpStream;
    use std::time::Duration;

    /// More connections than std's backlog of 128 complete their handshake
    /// while nothing accepts them: the queue is deeper than std's.
    #[test]
    fn more_than_std_backlog_connect_before_any_accept() {
        let cap: i32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn").unwrap().trim().parse().unwrap();
        assert!(cap >= 300, "net.core.somaxconn is {cap}: this kernel caps every backlog below what the test needs");
        let l = super::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let mut held = Vec::new();
        for i in 0..300 {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                Ok(s) => held.push(s),
                Err(e) => panic!("connection {i} of 300 not taken while nothing accepts: {e}"),
            }
        }
        assert_eq!(held.len(), 300);
    }
}
