//! What runs in the key process: its `main`, its [`service`] (the one
//! table of what its parent may ask) and its [`sandbox`], set up before
//! the first request. Everything here runs under the sandbox's system
//! call filter, with the connection engine it serves on
//! (`key_process/server/`, which the agent runs on too). The client side
//! (starting it, restarting it, talking to it) is `key_process/`'s.

pub(crate) mod sandbox;
mod service;

use std::ffi::OsString;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::sync::Arc;

use self::service::KeyProcessService;
use super::protocol as p;
use super::server::budget::Account;
use super::server::writer::FrameWriter;
use super::server::{serve_conn, ConnOptions, Room, Workers, HELLO_TIMEOUT, MAX_QUEUED_LOADS};
use crate::sign::offload::{OffloadMode, ServerOffload};
use crate::sign::sys;

/// The memory a key process holds for its one client's requests at most
/// (`budget`): `max_in_flight` bounds their count, this their bytes
/// (4096 requests of 1 MiB each would be 4 GiB).
pub(crate) const KEY_PROCESS_MEMORY: usize = 64 << 20;

/// How the key process runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeOptions {
    /// Threads signing with RSA keys.
    pub rsa_threads: usize,
    /// Threads signing with EC and Ed25519 keys.
    pub ec_threads: usize,
    /// Refuse a peer that is not the parent process running as the same
    /// user (always on in `keyfence-key-process`; tests that serve in-process turn
    /// it off).
    pub check_peer: bool,
    /// Install the sandbox (the key process's `main` does; a test serving
    /// in its own process must not, as it covers every thread).
    pub sandbox: bool,
    /// The key process's `main` closed what it inherited
    /// (`flags::INHERITED_CLOSED`).
    pub inherited_closed: bool,
    /// Whether to sign on crypto_mb's multi-buffer device
    /// (`--offload`): `auto` where it runs, `on` or refuse the hello,
    /// `off`. Default `off` (the key process's `main` takes `auto`, or what
    /// its client says).
    pub offload: OffloadMode,
    /// crypto_mb's library (`--crypto-mb`); `None`: `KEYFENCE_CRYPTO_MB`,
    /// else `libcrypto_mb.so.13` on the library path.
    pub crypto_mb: Option<String>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        ServeOptions {
            rsa_threads: cores,
            ec_threads: cores,
            check_peer: true,
            sandbox: false,
            inherited_closed: false,
            offload: OffloadMode::Off,
            crypto_mb: None,
        }
    }
}

/// Hardens the process and serves `stream` until the peer closes it.
///
/// Hardening: `PR_SET_DUMPABLE` 0 and `RLIMIT_CORE` 0 so that neither a
/// core dump nor a same-user debugger can read the keys; with
/// [`ServeOptions::check_peer`], the peer must be the parent process and
/// the same user (`SO_PEERCRED`).
///
/// # Errors
/// The I/O error that ended the connection, or a refused peer or hello.
pub fn serve(stream: UnixStream, options: &ServeOptions) -> io::Result<()> {
    let mut flags = 0;
    let mut owner = None;
    if options.check_peer {
        // Every request must come from the parent itself, not from a child
        // that inherited its end of the pair.
        owner = Some(sys::check_peer_is_parent(&stream)?);
        flags |= p::flags::PEER_CHECKED;
        sys::pass_credentials(&stream)?;
    }
    if sys::set_not_dumpable().is_ok() {
        flags |= p::flags::NOT_DUMPABLE;
    }
    if sys::disable_core_dumps().is_ok() {
        flags |= p::flags::NO_CORE;
    }
    if options.inherited_closed {
        flags |= p::flags::INHERITED_CLOSED;
    }
    // crypto_mb is opened before the sandbox (no thread yet: its device's
    // threads start once the hello has come), from KEYFENCE_CRYPTO_MB or
    // the library path.
    let offload = ServerOffload::prepare(options.offload, options.crypto_mb.as_deref());
    // Before the first request, so no key is loaded outside it. A layer
    // the kernel lacks leaves its flag off: the client says so.
    if options.sandbox {
        let installed = sandbox::install();
        if installed.syscalls {
            flags |= p::flags::SANDBOXED;
        }
        if installed.files_abi.is_some() {
            flags |= p::flags::FILES_CONFINED;
        }
        if installed.other_thread {
            flags |= p::flags::OTHER_THREAD;
        }
    }
    // The queues are sized by the hello (no queue can hold more than the
    // in-flight bound the reader enforces; bounded anyway, so that a
    // mistake there shows as `busy`, not memory): the workers start when
    // it has come.
    let stream = Arc::new(stream);
    let writer = FrameWriter::new(stream.try_clone()?)?;
    let conn = ConnOptions {
        flags,
        service: Arc::new(KeyProcessService),
        client: None,
        cap: p::MAX_IN_FLIGHT,
        hello_timeout: HELLO_TIMEOUT,
        frame_timeout: None,
        account: Account::single(KEY_PROCESS_MEMORY),
        read_chunk: 64 * 1024,
        owner,
    };
    // Mode `on` without a device: the hello is refused, saying why.
    let offload = offload.map_err(|e| io::Error::other(e.to_string()));
    let device = offload.as_ref().is_ok_and(|o| o.software_reason().is_none());
    let conn = ConnOptions { flags: if device { conn.flags | p::flags::MULTIBUFFER } else { conn.flags }, ..conn };
    serve_conn(&stream, writer, conn, |max| {
        let ops = Room { per_user: max as usize, total: max as usize };
        let offload = offload?.start().map_err(|e| io::Error::other(e.to_string()))?;
        Workers::start(
            (options.rsa_threads, options.ec_threads),
            ops,
            Room { per_user: MAX_QUEUED_LOADS.0, total: MAX_QUEUED_LOADS.1 },
            offload,
        )
    })
}

/// The key process's `main`: serves the protocol on standard input (the
/// socket the engine passed) until the engine closes it. `keyfence-key-process`
/// and `keyfence key-process` are this function. Arguments:
/// `--rsa-threads N`, `--ec-threads N`, `--offload off|on|auto` (default
/// `auto`: crypto_mb's multi-buffer device where it runs), `--crypto-mb
/// LIBRARY` (default `KEYFENCE_CRYPTO_MB`, else the library path's
/// `libcrypto_mb.so.13`). It keeps nothing it inherited but
/// standard input (standard output and error become `/dev/null`) and
/// sandboxes itself before its first request (`docs/security.md`).
pub fn key_process_main<I: IntoIterator<Item = OsString>>(args: I) -> ExitCode {
    let mut options = ServeOptions { sandbox: true, offload: OffloadMode::Auto, ..ServeOptions::default() };
    let mut args = args.into_iter().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().and_then(|v| v.into_string().ok());
        let threads = value.as_deref().and_then(|v| v.parse::<usize>().ok());
        match (arg.to_str(), threads) {
            (Some("--rsa-threads"), Some(n)) if (1..=1024).contains(&n) => options.rsa_threads = n,
            (Some("--ec-threads"), Some(n)) if (1..=1024).contains(&n) => options.ec_threads = n,
            (Some("--offload"), _) if value.as_deref().is_some_and(|v| v.parse::<OffloadMode>().is_ok()) => {
                options.offload = value.as_deref().and_then(|v| v.parse().ok()).unwrap_or_default();
            }
            (Some("--crypto-mb"), _) if value.as_deref().is_some_and(|v| !v.is_empty()) => options.crypto_mb = value,
            _ => {
                eprintln!("keyfence key process: usage: --rsa-threads N --ec-threads N (1 to 1024) [--offload off|on|auto] [--crypto-mb LIBRARY], socket on stdin");
                return ExitCode::from(2);
            }
        }
    }
    // Before anything else is opened or loaded: what the parent held (a
    // server's sockets, its logs) is not the key process's to use. Its
    // messages from here on reach nobody: the hello's flags say how it is
    // confined, and its exit status how it ended.
    options.inherited_closed = sys::close_inherited().is_ok();
    let stdin = match io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("keyfence key process: standard input: {e}");
            return ExitCode::from(2);
        }
    };
    match serve(UnixStream::from(stdin), &options) {
        Ok(()) => ExitCode::SUCCESS,
        // Its owner went away. A program that exits without dropping its
        // engine (a C server returning from `main`) closes the socket with
        // replies still unread, which the kernel reports here as a reset:
        // that is how a key process ends then, not a fault, and printing it
        // would put a line on the terminal after the owner has exited.
        Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("keyfence key process: {e}");
            ExitCode::FAILURE
        }
    }
}
