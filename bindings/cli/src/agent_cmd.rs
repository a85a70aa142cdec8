//! `keyfence agent`: the key agent for servers whose workers are not root
//! (docs/deploy.md). It alone reads the machine key and the store, and
//! signs for the users it allows over a Unix socket.

use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use keyfence::sign::agent::{group_id, user_id, Agent, AgentConfig, Grantee, TokenGrant};
use keyfence::sign::pkcs11::Pkcs11Settings;

use crate::exit;
use crate::files::outln;

/// `keyfence agent`: runs the agent, or (`keyfence agent status`) asks a
/// running one how it is.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct AgentArgs {
    #[command(subcommand)]
    action: Option<AgentAction>,
    /// Where the socket is made (its folder must exist: the package's
    /// tmpfiles.d makes /run/keyfence). With systemd's socket
    /// activation (LISTEN_FDS), the socket systemd passes is served and
    /// this names it in messages only.
    #[arg(long, required = true)]
    socket: Option<PathBuf>,
    /// The store envelopes are opened against (a directory or
    /// etcd://...): a servers' copy (`keyfence authority export`), never
    /// a store that holds the authority's secrets. Not needed by an agent
    /// that serves token keys only (--pkcs11-module).
    #[arg(long, requires = "machine_key", required_unless_present = "pkcs11_module")]
    store: Option<String>,
    /// This machine's key file (`keyfence authority issue --out`), read
    /// once at start: only the agent holds it.
    #[arg(long, requires = "store")]
    machine_key: Option<PathBuf>,
    /// The agent's own state folder, where it keeps the newest lists it
    /// accepted (so that a store rolled back is refused after a restart).
    /// Default: systemd's STATE_DIRECTORY (StateDirectory=), else beside
    /// the machine key; the agent refuses to start if it cannot write
    /// there.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// A user (name or id) whose processes may connect. Repeatable. The
    /// agent's own user and root always may.
    #[arg(long = "allow-user")]
    allow_users: Vec<String>,
    /// A group (name or id) whose members may connect: a client's primary
    /// or supplementary group. Repeatable.
    #[arg(long = "allow-group")]
    allow_groups: Vec<String>,
    /// The socket file's mode, in octal.
    #[arg(long, default_value = "660")]
    socket_mode: String,
    /// The socket file's group (name or id); default: the agent's.
    #[arg(long)]
    socket_group: Option<String>,
    /// Signing threads per class (RSA, and EC/Ed25519); default: the
    /// number of cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Connections at once at most.
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// Connections one user may have open at once (below
    /// --max-connections, so no user can take them all).
    #[arg(long, default_value_t = 512)]
    user_connections: usize,
    /// Key loads one user may have waiting (its own queue; the loaders
    /// take the users in turn). A client told busy asks again.
    #[arg(long, default_value_t = 256)]
    user_loads: usize,
    /// Requests one connection may have in flight at most.
    #[arg(long, default_value_t = 1024)]
    connection_in_flight: u32,
    /// Requests one user may have in flight over all its connections.
    #[arg(long, default_value_t = 4096)]
    user_in_flight: usize,
    /// MiB of the agent's memory one user's connections may make it hold
    /// (frames begun, requests and loads waiting, replies unread, keys);
    /// past it the connection asking for more is refused or cut off.
    #[arg(long, default_value_t = 64)]
    user_memory_mib: usize,
    /// MiB all users together may make it hold (docs/deploy.md has the
    /// agent's worst case, which the unit's MemoryMax= fits).
    #[arg(long, default_value_t = 256)]
    max_memory_mib: usize,
    /// Seconds a request may take to arrive whole once begun; a client
    /// whose request is still partial then is cut off.
    #[arg(long, default_value_t = 5.0)]
    frame_timeout: f64,
    /// Log on standard error at this level (error, warn, info, debug):
    /// refused clients are warnings.
    #[arg(long, default_value = "warn")]
    log: String,
    /// Stop after this many seconds (for tests); default: run until
    /// SIGTERM or SIGINT.
    #[arg(long)]
    seconds: Option<f64>,
    /// On SIGTERM or SIGINT, seconds to wait for the answers to the
    /// requests already read before exiting (new connections wait for
    /// the next agent in the socket's backlog).
    #[arg(long, default_value_t = 10.0)]
    drain_timeout: f64,
    /// The PKCS#11 module whose token keys clients may name by URI
    /// (docs/pkcs11.md). Only the agent loads it; a client's URI may name
    /// no other module. Without it, token keys are refused.
    #[arg(long)]
    pkcs11_module: Option<PathBuf>,
    /// The file holding the token's PIN (first line), read by the agent
    /// at each login; a client's URI may name no other PIN file.
    /// Default: KEYFENCE_PKCS11_PIN_FILE or KEYFENCE_PKCS11_PIN.
    #[arg(long, requires = "pkcs11_module")]
    pkcs11_pin_file: Option<PathBuf>,
    /// A token key a user or group may load: USER=URI or @GROUP=URI, the
    /// URI naming the token and the key (`pkcs11:token=edge;object=tls`);
    /// a client's URI must carry each of its attributes. Repeatable. The
    /// agent's own user and root may load any; nobody else any other.
    #[arg(long = "allow-token", requires = "pkcs11_module")]
    allow_tokens: Vec<String>,
    /// Start even if the store lets the agent read the authority's secrets
    /// (a store `authority init` made, not `authority export`'s copy): for
    /// trying keyfence on one machine. Without it such an agent refuses to
    /// start: a server that can read them can open every envelope.
    #[arg(long)]
    unsafe_authority_store: bool,
    /// Whether RSA and ECDSA are signed on Intel's crypto_mb multi-buffer
    /// device (docs/offload.md): `auto` where the CPU runs it (AVX-512
    /// IFMA) and the library is installed, else software; `on` refuses to
    /// start without it; `off` never opens it.
    #[arg(long, default_value = "auto")]
    offload: keyfence::sign::offload::OffloadMode,
    /// crypto_mb's library (a path, or a name the loader finds). Default:
    /// KEYFENCE_CRYPTO_MB, else libcrypto_mb.so.13.
    #[arg(long)]
    crypto_mb: Option<String>,
}

/// What `keyfence agent` does besides running the agent.
#[derive(Subcommand)]
enum AgentAction {
    /// Ask a running agent how it is, over its socket as a client would:
    /// reachable, its machine key's id, generations held and live,
    /// whether it is revoked, keys loaded, connections. Exit status 0
    /// when it can open envelopes, 1 when its machine key is revoked or
    /// holds no live generation, 3 when it cannot be reached.
    Status(StatusArgs),
}

/// `keyfence agent status`.
#[derive(Args)]
struct StatusArgs {
    /// The agent's socket.
    #[arg(long, default_value = "/run/keyfence/agent.sock")]
    socket: PathBuf,
    /// Ask as this user (name or id; root only): whether the servers'
    /// workers (`www-data`) may connect, before any traffic.
    #[arg(long)]
    as_user: Option<String>,
    /// Print the agent's whole answer as JSON.
    #[arg(long)]
    json: bool,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 5.0)]
    timeout: f64,
}

/// Takes on `user`'s ids for good (root only): its groups, group and user.
fn become_user(user: &str) -> Result<()> {
    let uid = user_id(user).map_err(|e| exit::input(format!("--as-user: {e}")))?;
    // SAFETY: getpwuid returns a pointer into static storage or null
    // (checked); its fields are read before any other passwd call.
    let (gid, name) = unsafe {
        let pw = libc::getpwuid(uid);
        if pw.is_null() {
            return Err(exit::input(format!("--as-user {user}: no such user")));
        }
        ((*pw).pw_gid, std::ffi::CStr::from_ptr((*pw).pw_name).to_owned())
    };
    // SAFETY: plain system calls on ids; each result is checked.
    let ok = unsafe { libc::initgroups(name.as_ptr(), gid) == 0 && libc::setgid(gid) == 0 && libc::setuid(uid) == 0 };
    if !ok {
        return Err(anyhow::anyhow!("--as-user {user}: cannot take on its ids: {} (only root can)", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Runs `keyfence agent status`.
fn status(args: StatusArgs) -> Result<ExitCode> {
    if !(args.timeout > 0.0 && args.timeout <= 3600.0) {
        return Err(exit::input("--timeout must be more than 0 and at most 3600 seconds"));
    }
    if let Some(user) = &args.as_user {
        become_user(user)?;
    }
    let status = keyfence::sign::agent::status(&args.socket, Duration::from_secs_f64(args.timeout))
        .with_context(|| format!("the agent on {} did not answer", args.socket.display()))?;
    if args.json {
        outln!("{}", status.json);
    } else {
        let j = &status.json;
        outln!("agent: pid {} on {}", status.pid, args.socket.display());
        if let Some(m) = j.get("machine").filter(|m| !m.is_null()) {
            let list =
                |k: &str| m.get(k).and_then(|v| v.as_array()).map(|a| a.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(", "));
            outln!("machine: {}", m.get("id").and_then(|v| v.as_str()).unwrap_or("(no id)"));
            outln!("generations held: {}", list("generations_held").unwrap_or_default());
            outln!("generations live: {}", list("generations_live").unwrap_or_default());
            outln!("revoked: {}", if m.get("revoked").and_then(|v| v.as_bool()).unwrap_or(false) { "yes" } else { "no" });
            outln!("machines on the revocation list: {}", m.get("machines_revoked").and_then(|v| v.as_u64()).unwrap_or(0));
        }
        for (k, label) in [("keys_loaded", "keys loaded"), ("connections", "connections"), ("in_flight", "in flight")] {
            outln!("{label}: {}", j.get(k).and_then(|v| v.as_u64()).unwrap_or(0));
        }
        if let Some(s) = j.get("signing").and_then(|v| v.as_str()) {
            outln!("signing: {s}");
        }
    }
    Ok(match status.problem() {
        Some(problem) => {
            eprintln!("keyfence: {problem}");
            ExitCode::from(exit::NO)
        }
        None => ExitCode::SUCCESS,
    })
}

/// SIGTERM, SIGINT and SIGHUP, blocked in every thread (the agent's
/// threads inherit the mask) and taken by the main thread's wait.
fn agent_signals() -> libc::sigset_t {
    // SAFETY: a sigset_t is plain data that sigemptyset initialises; the
    // mask change applies to this thread, before any other starts.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// The next of `set` to arrive, or `None` after `timeout`.
fn wait_signal(set: &libc::sigset_t, timeout: Option<Duration>) -> Option<i32> {
    let ts = timeout.map(|t| libc::timespec { tv_sec: t.as_secs() as libc::time_t, tv_nsec: t.subsec_nanos() as _ });
    loop {
        // SAFETY: `set` is an initialised signal set, the info pointer may
        // be null, and `ts` lives across the call.
        let s = unsafe {
            match &ts {
                Some(ts) => libc::sigtimedwait(set, std::ptr::null_mut(), ts),
                None => libc::sigwaitinfo(set, std::ptr::null_mut()),
            }
        };
        if s >= 0 {
            return Some(s);
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

/// The socket systemd passed (socket activation: `LISTEN_PID` is this
/// process and `LISTEN_FDS` at least 1, the first at descriptor 3).
fn listen_fd() -> Option<std::os::unix::net::UnixListener> {
    let pid: u32 = std::env::var("LISTEN_PID").ok()?.parse().ok()?;
    let fds: u32 = std::env::var("LISTEN_FDS").ok()?.parse().ok()?;
    if pid != std::process::id() || fds < 1 {
        return None;
    }
    // SAFETY: systemd's protocol: with LISTEN_PID naming this process,
    // descriptor 3 is an open listening socket handed to it, which nothing
    // else in this process owns; it is taken once (the variables are
    // removed just below).
    let listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(3) };
    // Not passed on to anything this process starts.
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    Some(listener)
}

/// Runs `keyfence agent` (or `keyfence agent status`).
pub fn agent(args: AgentArgs) -> Result<ExitCode> {
    if let Some(AgentAction::Status(s)) = args.action {
        return status(s);
    }
    let socket = args.socket.clone().ok_or_else(|| exit::input("give --socket"))?;
    let level: tracing::Level = args.log.parse().map_err(|_| exit::input(format!("unknown log level {}", args.log)))?;
    crate::journal::init(level);
    if !(args.drain_timeout >= 0.0 && args.drain_timeout <= 3600.0) {
        return Err(exit::input("--drain-timeout must be 0 to 3600 seconds"));
    }
    let mut config = match (&args.store, &args.machine_key, &args.pkcs11_module) {
        (Some(store), Some(key), _) => AgentConfig::new(&socket, store, key),
        (None, None, Some(_)) => AgentConfig::tokens_only(&socket, Pkcs11Settings::from_env()),
        _ => return Err(exit::input("give --store and --machine-key, or --pkcs11-module, or all three")),
    };
    // systemd names the unit's StateDirectory= folders here, `:`-separated.
    config.state_dir = args
        .state_dir
        .clone()
        .or_else(|| std::env::var_os("STATE_DIRECTORY").and_then(|v| std::env::split_paths(&v).next()).filter(|p| p.is_absolute()));
    let id = |name: &str, group: bool| {
        (if group { group_id(name) } else { user_id(name) })
            .map_err(|e| exit::input(format!("--allow-{}: {e}", if group { "group" } else { "user" })))
    };
    config.allow_users = args.allow_users.iter().map(|u| id(u, false)).collect::<Result<_>>()?;
    config.allow_groups = args.allow_groups.iter().map(|g| id(g, true)).collect::<Result<_>>()?;
    config.socket_mode = u32::from_str_radix(&args.socket_mode, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| exit::input(format!("--socket-mode {} is not an octal mode such as 660", args.socket_mode)))?;
    config.socket_group = args.socket_group.as_deref().map(|g| id(g, true)).transpose()?;
    if let Some(t) = args.threads {
        if !(1..=1024).contains(&t) {
            return Err(exit::input("--threads must be 1 to 1024"));
        }
        config.rsa_threads = t;
        config.ec_threads = t;
    }
    if let Some(module) = args.pkcs11_module {
        let mut settings = Pkcs11Settings::from_env();
        settings.module = Some(module);
        if let Some(pin_file) = args.pkcs11_pin_file {
            settings.pin_file = Some(pin_file);
        }
        config.pkcs11 = Some(settings);
    }
    config.max_connections = args.max_connections;
    config.user_connections = args.user_connections;
    config.user_loads = args.user_loads;
    config.unsafe_authority_store = args.unsafe_authority_store;
    for grant in &args.allow_tokens {
        let (who, uri) =
            grant.split_once('=').ok_or_else(|| exit::input(format!("--allow-token {grant}: expected USER=URI or @GROUP=URI")))?;
        let who = match who.strip_prefix('@') {
            Some(group) => Grantee::Group(id(group, true)?),
            None => Grantee::User(id(who, false)?),
        };
        config.token_grants.push(TokenGrant::new(who, uri).map_err(|e| exit::input(format!("--allow-token {grant}: {e}")))?);
    }
    config.connection_in_flight = args.connection_in_flight;
    config.user_in_flight = args.user_in_flight;
    if !(1..=1 << 20).contains(&args.user_memory_mib) || !(1..=1 << 20).contains(&args.max_memory_mib) {
        return Err(exit::input("--user-memory-mib and --max-memory-mib must be 1 to 1048576"));
    }
    config.user_memory = args.user_memory_mib << 20;
    config.max_memory = args.max_memory_mib << 20;
    if !(args.frame_timeout > 0.0 && args.frame_timeout <= 3600.0) {
        return Err(exit::input("--frame-timeout must be more than 0 and at most 3600 seconds"));
    }
    config.frame_timeout = Duration::from_secs_f64(args.frame_timeout);
    config.offload = args.offload;
    config.crypto_mb = args.crypto_mb;
    // Before any thread starts, so that every one inherits the mask.
    let signals = agent_signals();
    let mut agent = match listen_fd() {
        Some(listener) => Agent::with_listener(config, listener),
        None => Agent::start(config),
    }
    .with_context(|| format!("cannot start the agent on {}", socket.display()))?;
    outln!("listening {}", agent.socket().display());
    // On standard output, which the journal keeps, whatever the log level:
    // an operator who installed crypto_mb reads here whether it is used.
    match agent.software_reason() {
        Some(why) => outln!("signing in software: {why}"),
        None => outln!("signing RSA and ECDSA on crypto_mb's multi-buffer device"),
    }
    if let Some(problem) = agent.machine_health().and_then(|h| h.problem()) {
        outln!("cannot open envelopes: {problem}");
    }
    let until = match args.seconds {
        Some(s) if s > 0.0 && s.is_finite() => Some(std::time::Instant::now() + Duration::from_secs_f64(s)),
        Some(_) => return Err(exit::input("--seconds must be positive")),
        None => None,
    };
    loop {
        let left = until.map(|u| u.saturating_duration_since(std::time::Instant::now()));
        if left.is_some_and(|l| l.is_zero()) {
            break;
        }
        match wait_signal(&signals, left) {
            // systemctl reload: the agent follows its store by itself and
            // its settings are its command line's, so there is nothing to
            // read again; said, so that a reload is seen to be harmless.
            Some(libc::SIGHUP) => {
                tracing::info!("SIGHUP: nothing to reload (the agent follows its store by itself; restart it to change its settings)")
            }
            Some(sig) => {
                let within = Duration::from_secs_f64(args.drain_timeout);
                tracing::info!(signal = sig, in_flight = agent.in_flight(), "stopping: answering the requests already read");
                if agent.drain(within) {
                    tracing::info!("stopped: every request read was answered");
                } else {
                    tracing::warn!(?within, "stopped with requests unanswered after --drain-timeout");
                }
                return Ok(ExitCode::SUCCESS);
            }
            None => {}
        }
    }
    agent.stop();
    Ok(ExitCode::SUCCESS)
}
