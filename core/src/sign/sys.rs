//! The few system calls the key process needs that the standard library
//! does not offer: process hardening, peer credentials, privilege drop,
//! and where the code of this library was loaded from.
// libc calls: prctl, setrlimit, getsockopt, setgid/setuid, dladdr, send,
// dup2, close_range.
#![allow(unsafe_code)]

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

/// `prctl(PR_SET_DUMPABLE, 0)`: no core dumps, and a process of the same
/// user can no longer ptrace this one or read its `/proc/PID/mem`.
pub(crate) fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_DUMPABLE takes one integer argument and
    // touches no memory of ours; the trailing arguments are ignored zeros.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0 as libc::c_ulong, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the process is dumpable (for tests and the status reply).
pub(crate) fn is_dumpable() -> bool {
    // SAFETY: PR_GET_DUMPABLE reads a process attribute and writes no memory.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) != 0 }
}

/// `setrlimit(RLIMIT_CORE, 0)`, belt and braces with `PR_SET_DUMPABLE`.
pub(crate) fn disable_core_dumps() -> io::Result<()> {
    let limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid rlimit that outlives the call, which only
    // reads it.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_CORE, &limit) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Writes all of `buf` to `stream` with `send(MSG_NOSIGNAL)`: a peer that
/// has gone is an `EPIPE` error, never a `SIGPIPE`, which would end a host
/// program that keeps the default disposition (a C server, a CLI tool),
/// when the key process or agent it signs through dies.
pub(crate) fn send_all(stream: &UnixStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the
        // call, which only reads it; the descriptor is owned by `stream`,
        // which outlives the call.
        let n = unsafe { libc::send(stream.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "the socket took no bytes"));
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}

/// The credentials of the process at the other end of `stream`
/// (`SO_PEERCRED`): its pid, user and group, as the kernel recorded them
/// when it connected (or made the pair).
pub(crate) fn peer_credentials(stream: &UnixStream) -> io::Result<(u32, u32, u32)> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes and `len` holds the
    // size of `cred`, so the kernel writes within it; the descriptor is
    // owned by `stream`, which outlives the call.
    let rc = unsafe {
        libc::getsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len)
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid as u32, cred.uid, cred.gid))
}

/// Has the kernel attach the sending process's credentials to every
/// message `stream` receives (`SO_PASSCRED`), for [`recv_from_sender`].
pub(crate) fn pass_credentials(stream: &UnixStream) -> io::Result<()> {
    pass_credentials_fd(stream.as_fd())
}

/// As [`pass_credentials`], on a listening socket: the connections it
/// accepts inherit it.
pub(crate) fn pass_credentials_on(listener: &std::os::unix::net::UnixListener) -> io::Result<()> {
    pass_credentials_fd(listener.as_fd())
}

fn pass_credentials_fd(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a live c_int and the length passed is its size; the
    // descriptor is borrowed for the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads into `buf` with `recvmsg`: the bytes read and the pid and user of
/// the process that sent them. With [`pass_credentials`] on, the kernel
/// never returns the bytes of two senders in one read and names the
/// sender of these (its pid as the receiver's namespace sees it, 0 when
/// it sees none): a descriptor inherited by a child, however the child
/// was made (`fork`, `clone`, `_Fork`), is still its parent's connection,
/// but the child's bytes are the child's.
pub(crate) fn recv_from_sender(stream: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<(u32, u32)>)> {
    // Room for one SCM_CREDENTIALS message, aligned as cmsghdr needs.
    let mut control = [0u64; 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: a zeroed msghdr is a valid empty one; its fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let n = loop {
        // SAFETY: `msg` points at `iov` (over `buf`, valid for writes of
        // its length) and at `control` (valid for writes of
        // `msg_controllen` bytes), all live for the call; the descriptor
        // is owned by `stream`, which outlives it.
        let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut sender = None;
    // SAFETY: the CMSG_* walk stays within `msg_controllen`, which the
    // kernel set to what it wrote into `control`; a credentials message's
    // data is a ucred, read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                sender = Some((cred.pid as u32, cred.uid));
            } else if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                // Descriptors nobody asked for: closed, never used.
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let fds = libc::CMSG_DATA(c).cast::<libc::c_int>();
                for i in 0..len / std::mem::size_of::<libc::c_int>() {
                    libc::close(std::ptr::read_unaligned(fds.add(i)));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n, sender))
}

/// Sets glibc's allocator so that freed memory goes back to the system:
/// allocations of 64 KiB and more are mappings of their own (glibc's
/// threshold otherwise rises to each large block freed, and the next
/// large buffers stay in its heaps), and [`give_back_memory`] returns
/// the free pages of every heap. A no-op elsewhere.
pub(crate) fn return_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 * 1024);
    }
}

/// Returns the allocator's free pages to the system (glibc's
/// `malloc_trim`): after connections close, what they held.
pub(crate) fn give_back_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The supplementary groups of the process at the other end of `stream`
/// (`SO_PEERGROUPS`, Linux 4.13 and later).
pub(crate) fn peer_groups(stream: &UnixStream) -> io::Result<Vec<u32>> {
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is valid for `len` bytes of writes and outlives
        // the call; the kernel writes at most `len` bytes and reports in
        // `len` how many it needs when that is too few (ERANGE).
        let rc =
            unsafe { libc::getsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut len) };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) || n <= groups.len() || n > 65536 {
            return Err(e);
        }
        groups.resize(n, 0);
    }
}

/// Refuses a peer that is not our parent running as our user, and
/// returns the parent's pid and user. Over the socket pair the parent
/// made, `SO_PEERCRED` reports the process that created the pair;
/// anything else on the other end is not our client.
pub(crate) fn check_peer_is_parent(stream: &UnixStream) -> io::Result<(u32, u32)> {
    let (pid, peer_uid, _) = peer_credentials(stream)?;
    // SAFETY: getppid and getuid cannot fail and touch no memory.
    let (ppid, uid) = unsafe { (libc::getppid(), libc::getuid()) };
    if pid != ppid as u32 || peer_uid != uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("peer pid {pid} uid {peer_uid} is not the parent {ppid} as uid {uid}"),
        ));
    }
    Ok((pid, uid))
}

/// The names of user `uid` and group `gid` (`getpwuid_r`, `getgrgid_r`),
/// for messages; the number when there is none.
pub(crate) fn user_name(uid: u32) -> String {
    let mut pw: libc::passwd = unsafe_zeroed_passwd();
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: `pw`, `buf` and `out` are live and writable for the call,
    // `buf.len()` is the buffer's size; on success `out` points at `pw`,
    // whose strings point into `buf`, read before `buf` is dropped.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc == 0 && !out.is_null() && !pw.pw_name.is_null() {
        // SAFETY: a NUL-terminated name inside `buf`, per getpwuid_r.
        return unsafe { CStr::from_ptr(pw.pw_name) }.to_string_lossy().into_owned();
    }
    uid.to_string()
}

/// A `passwd` of zeros (null pointers and ids 0), for getpwuid_r to fill.
fn unsafe_zeroed_passwd() -> libc::passwd {
    // SAFETY: `passwd` is a C struct of integers and pointers, for which
    // all-zero bytes are a valid value (null pointers).
    unsafe { std::mem::zeroed() }
}

/// The user and group ids `name` stands for (a number, or a name looked up
/// with `getpwnam_r` / `getgrnam_r`).
pub(crate) fn lookup_id(name: &str, group: bool) -> io::Result<u32> {
    if let Ok(n) = name.parse::<u32>() {
        return Ok(n);
    }
    let c = std::ffi::CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a name"))?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let found = if group {
        // SAFETY: `group` is a C struct of integers and pointers, for which
        // all-zero bytes are a valid value.
        let mut gr: libc::group = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::group = std::ptr::null_mut();
        // SAFETY: as in user_name: every pointer is live and writable for
        // the call, and the id is read from `gr` before `buf` is dropped.
        let rc = unsafe { libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr(), buf.len(), &mut out) };
        (rc == 0 && !out.is_null()).then_some(gr.gr_gid)
    } else {
        let mut pw: libc::passwd = unsafe_zeroed_passwd();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: as in user_name, for getpwnam_r.
        let rc = unsafe { libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
        (rc == 0 && !out.is_null()).then_some(pw.pw_uid)
    };
    found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no {} called {name}", if group { "group" } else { "user" })))
}

/// Drops to `uid`/`gid` for good: supplementary groups cleared, group then
/// user set, and a check that root cannot be regained.
pub(crate) fn drop_privileges(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setgroups with a zero count reads no memory; setgid/setuid
    // take integers. glibc applies both to every thread of the process.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::setgid(gid) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::setuid(uid) != 0 {
            return Err(io::Error::last_os_error());
        }
        if uid != 0 && libc::setuid(0) == 0 {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, "root could be regained after the drop"));
        }
    }
    Ok(())
}

/// The real user and group ids.
pub(crate) fn ids() -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    unsafe { (libc::getuid(), libc::getgid()) }
}

/// The file this library's code was loaded from: the shared library when
/// keyfence is one (a binding's native module), else the executable. The
/// key process is looked for beside it.
pub(crate) fn library_path() -> Option<PathBuf> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let here = library_path as *const () as *const libc::c_void;
    // SAFETY: `here` is the address of a function in this object; dladdr
    // only reads it and fills `info`, a live local. It returns 0 when it
    // finds nothing, and the name is then not read.
    let found = unsafe { libc::dladdr(here, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: on success `dli_fname` is a NUL-terminated string owned by
    // the dynamic loader, valid while the object stays loaded (it does:
    // this code is in it); it is copied at once.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    let path = PathBuf::from(OsStr::from_bytes(name.to_bytes()));
    // A relative name (the executable as started) is relative to the
    // working directory at start, which may have changed: not trusted.
    path.is_absolute().then_some(path)
}

/// Closes every descriptor above standard error and points standard
/// output and error at `/dev/null`: a listening socket, a connection or a
/// log the parent held is not the key process's. Its diagnostics reach
/// the client through the protocol (the hello's flags) instead.
///
/// # Errors
/// `/dev/null` cannot be opened, or a descriptor cannot be replaced.
pub(crate) fn close_inherited() -> io::Result<()> {
    let null = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    for fd in [1, 2] {
        // SAFETY: dup2 takes two descriptor numbers and touches no memory;
        // `null` is open for the call, and 1 and 2 are this process's
        // standard streams, which nothing in it holds as an owned object.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    drop(null);
    // SAFETY: close_range takes integers only. Descriptors from 3 up are
    // not owned by any object of this process yet: this runs before the
    // key process opens anything (std's own, if any, are 0 to 2).
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if rc == 0 {
        return Ok(());
    }
    // Before Linux 5.9: close what /proc/self/fd lists.
    let open: Vec<i32> =
        std::fs::read_dir("/proc/self/fd")?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).filter(|fd| *fd > 2).collect();
    for fd in open {
        // SAFETY: as above; a number that was the listing's own descriptor
        // (closed already when read_dir's iterator dropped) fails harmlessly.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// Sends what it can of `buf` without waiting (`MSG_DONTWAIT`, and
/// `MSG_NOSIGNAL` as [`send_all`]): the bytes sent, 0 when the peer's
/// buffer is full (`EAGAIN`), an error when the connection failed.
pub(crate) fn send_some(stream: &UnixStream, buf: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for reads of `buf.len()` bytes for the
        // call, which only reads it; the descriptor is owned by `stream`,
        // which outlives the call.
        let n = unsafe { libc::send(stream.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(e),
        }
    }
}

/// `poll(2)` on `fds` for at most `timeout`: how many have events.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: std::time::Duration) -> io::Result<usize> {
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a live, writable slice of `fds.len()` pollfd
    // structures for the call, which reads their descriptors and events
    // and writes only their `revents`.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
    }
    Ok(n as usize)
}

/// Raises the soft limit on open descriptors to the hard limit (a
/// daemon that serves many clients must not stop at the soft 1,024 its
/// shell or a unit without `LimitNOFILE=` gives it): the limit now.
pub(crate) fn raise_descriptor_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a live rlimit the call writes.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: `raised` is a valid rlimit that outlives the call, which
        // only reads it.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is 32 bits on 32-bit targets
        return Ok(raised.rlim_cur as u64);
    }
    #[allow(clippy::unnecessary_cast)]
    Ok(limit.rlim_cur as u64)
}

/// The groups of user `uid` as its processes would have them: its primary
/// group (from the user database) and its supplementary groups
/// (`getgrouplist`). Empty when the user is unknown.
pub(crate) fn user_groups(uid: u32) -> Vec<u32> {
    let mut pw: libc::passwd = unsafe_zeroed_passwd();
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: as in user_name: every pointer is live and writable for the
    // call; the name and group are read from `pw` before `buf` is dropped.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() || pw.pw_name.is_null() {
        return Vec::new();
    }
    let primary = pw.pw_gid;
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `pw.pw_name` is a NUL-terminated name inside `buf`, which
        // is alive; `groups` is writable for `n` entries, and the call
        // writes at most `n` and sets `n` to the count it has (or needs).
        let rc = unsafe { libc::getgrouplist(pw.pw_name, primary, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            return groups;
        }
        if n as usize <= groups.len() || n > 65536 {
            return vec![primary];
        }
        groups.resize(n as usize, 0);
    }
}

/// The name of group `gid` (`getgrgid_r`), for messages; the number when
/// there is none.
pub(crate) fn group_name(gid: u32) -> String {
    // SAFETY: `group` is a C struct of integers and pointers, for which
    // all-zero bytes are a valid value.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: `gr`, `buf` and `out` are live and writable for the call,
    // `buf.len()` is the buffer's size; on success `out` points at `gr`,
    // whose name points into `buf`, read before `buf` is dropped.
    let rc = unsafe { libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc == 0 && !out.is_null() && !gr.gr_name.is_null() {
        // SAFETY: a NUL-terminated name inside `buf`, per getgrgid_r.
        return unsafe { CStr::from_ptr(gr.gr_name) }.to_string_lossy().into_owned();
    }
    gid.to_string()
}

/// Descriptors a forked child must not keep: the connections of this
/// process's engines to their key process or agent. A server that loads
/// keys as root and forks its workers (nginx's master) would otherwise
/// leave each worker, `www-data`, holding a connection the agent admitted
/// as root, or one to a key process run as root. After a fork, the child
/// finds each still open (same descriptor, same socket inode) and puts a
/// socket whose peer is gone in its place: the child's copy of the
/// connection is closed, the descriptor number stays taken (nothing of
/// the parent's that still names it can reach another file), reads see the
/// end, writes fail.
mod fork_guard {
    use std::os::fd::RawFd;
    use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
    use std::sync::Once;

    /// Connections guarded at once; past this, the rest are not (logged
    /// by the caller): 256 engines' connections is far more than a server
    /// holds.
    const SLOTS: usize = 512;
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: (AtomicI32, AtomicU64) = (AtomicI32::new(-1), AtomicU64::new(0));
    static GUARDED: [(AtomicI32, AtomicU64); SLOTS] = [EMPTY; SLOTS];
    /// One end of a socket pair whose other end is closed.
    static DEAD: AtomicI32 = AtomicI32::new(-1);
    static INSTALL: Once = Once::new();

    extern "C" fn in_child() {
        let dead = DEAD.load(Ordering::Relaxed);
        if dead < 0 {
            return;
        }
        for (fd, ino) in &GUARDED {
            let fd = fd.load(Ordering::Relaxed);
            if fd < 0 {
                continue;
            }
            // SAFETY: async-signal-safe calls only (fstat, dup2), as the
            // child of a fork may make; `st` is a live local the call
            // writes.
            unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                if libc::fstat(fd, &mut st) == 0 && st.st_ino == ino.load(Ordering::Relaxed) {
                    libc::dup2(dead, fd);
                }
            }
        }
    }

    fn install() {
        INSTALL.call_once(|| {
            let mut pair = [-1; 2];
            // SAFETY: `pair` is a live array of two ints the call writes.
            if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, pair.as_mut_ptr()) } != 0 {
                return;
            }
            // SAFETY: pair[1] was just made here and is owned by nothing
            // else; pthread_atfork takes a function with C linkage that
            // lives for the program.
            unsafe {
                libc::close(pair[1]);
                DEAD.store(pair[0], Ordering::Relaxed);
                libc::pthread_atfork(None, None, Some(in_child));
            }
        });
    }

    /// Guards `fd` (whose socket has inode `ino`); false when every slot
    /// is taken.
    pub(crate) fn guard(fd: RawFd, ino: u64) -> bool {
        install();
        for (slot, i) in &GUARDED {
            // The inode first: a child forked between the two stores sees
            // an inode of 0 on a descriptor, and leaves it.
            if slot.load(Ordering::Relaxed) == -1 {
                i.store(0, Ordering::Relaxed);
                if slot.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    i.store(ino, Ordering::Release);
                    return true;
                }
            }
        }
        false
    }

    /// Stops guarding `fd`, before it is closed.
    pub(crate) fn release(fd: RawFd, ino: u64) {
        for (slot, i) in &GUARDED {
            if slot.load(Ordering::Acquire) == fd && i.load(Ordering::Acquire) == ino {
                let _ = slot.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }
}

/// Guards a connection's socket so that a forked child of this process
/// does not keep it (see `fork_guard`), until dropped: drop it before the
/// socket is closed.
pub(crate) struct ForkGuard {
    fd: std::os::fd::RawFd,
    ino: u64,
}

impl ForkGuard {
    /// Guards `stream`; `None` when it cannot be (every slot taken, or
    /// its inode unreadable): it works, and a child keeps it.
    pub(crate) fn new(stream: &UnixStream) -> Option<Self> {
        // SAFETY: `st` is a live local the call writes; the descriptor is
        // owned by `stream`, alive for the call.
        let ino = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(stream.as_raw_fd(), &mut st) != 0 {
                return None;
            }
            st.st_ino
        };
        fork_guard::guard(stream.as_raw_fd(), ino).then_some(ForkGuard { fd: stream.as_raw_fd(), ino })
    }
}

impl Drop for ForkGuard {
    fn drop(&mut self) {
        fork_guard::release(self.fd, self.ino);
    }
}
