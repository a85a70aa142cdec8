//! `poll(2)` on a connection's socket and its waker: the one system call
//! the connection loop needs that the standard library does not offer.
// libc::poll on descriptors this process owns.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

/// Waits until `socket` is readable (or writable, if `want_write`) or
/// `waker` is readable; `timeout_ms` < 0 waits forever. Says whether the
/// socket and the waker are readable (an error or hang-up counts: the
/// read that follows says what it is).
pub(crate) fn wait(socket: RawFd, want_write: bool, waker: RawFd, timeout_ms: i32) -> io::Result<(bool, bool)> {
    let mut fds = [
        libc::pollfd { fd: socket, events: libc::POLLIN | if want_write { libc::POLLOUT } else { 0 }, revents: 0 },
        libc::pollfd { fd: waker, events: libc::POLLIN, revents: 0 },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd structures that
        // outlives the call, and its length is passed with it; the
        // descriptors belong to streams the caller keeps open.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if rc >= 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let ready = |revents: i16| revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0;
    // A socket that became writable may also carry a TLS record the
    // write was waiting for: try reading then too.
    Ok((ready(fds[0].revents) || fds[0].revents & libc::POLLOUT != 0, ready(fds[1].revents)))
}
