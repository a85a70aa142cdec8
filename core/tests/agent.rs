//! The key agent (`keyfence agent`'s core): envelopes opened with its own
//! machine key for many clients, who may connect by socket mode and
//! credentials, and local users who attack it (as the users they need)
//! while another user signs.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use keyfence::sign::key_process::protocol::{self as p, flags, kind, ErrorCode};
use keyfence::sign::key_process::KeySource;
use keyfence::sign::Algorithm;

mod common;
mod key_process_support;
use key_process_support::{agent_config, agent_engine, agent_world, attacker, managed_sign, verifies, Dir};

#[test]
fn an_agent_opens_envelopes_with_its_own_machine_key_and_signs_for_its_clients() {
    use keyfence::sign::agent::Agent;
    let dir = Dir::new("agent");
    let world = agent_world(&dir.0);
    let mut agent = Agent::start(agent_config(&dir.0, &world)).unwrap();
    let socket = agent.socket().to_path_buf();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions()) & 0o777;
    assert_eq!(mode, 0o660);

    // The client names no machine key and no store: it has neither.
    let engine = agent_engine(&socket).unwrap();
    let ec = engine.load(KeySource::agent_envelope(world.eu_ec.1.clone())).unwrap();
    let rsa = engine.load(KeySource::agent_envelope(world.eu_rsa.1.clone())).unwrap();
    assert!(!ec.is_local() && !rsa.is_local());
    for (key, alg) in [(&ec, Algorithm::EcdsaP256Sha256), (&rsa, Algorithm::RsaPssSha256)] {
        let sig = managed_sign(&engine, key, alg).unwrap();
        assert!(verifies(key, alg, b"through the agent", &sig), "{alg:?}");
    }
    // A key the agent's machine may not open: the reason, from the agent.
    // Its code is the one the same load has in process: a "no".
    let err = engine.load(KeySource::agent_envelope(world.us_ec.clone())).unwrap_err();
    assert_eq!(err.code(), keyfence::ErrorCode::PolicyNotSatisfied, "{err}");
    assert!(err.to_string().contains("do not satisfy the policy"), "{err}");
    // Nothing but envelopes: no file, no key bytes, no paths of the client's.
    let err = engine.load(KeySource::File(world.eu_ec.0.clone())).unwrap_err().to_string();
    assert!(err.contains("loads envelopes only"), "{err}");

    // A client speaking the protocol itself cannot ask for more.
    let mut s = UnixStream::connect(&socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    p::encode(&mut out, kind::HELLO, 0, &[&p::hello_request(16)]);
    p::encode(&mut out, kind::LOAD, 1, &[&p::load_request(1, &p::LoadBody::File("/etc/shadow".into()))]);
    p::encode(
        &mut out,
        kind::LOAD,
        2,
        &[&p::load_request(
            2,
            &p::LoadBody::EnvelopeObjects { machine_key: world.machine_key.clone(), envelope: world.eu_ec.1.clone(), objects: Vec::new() },
        )],
    );
    p::encode(&mut out, kind::DROP_PRIVILEGES, 3, &[&p::drop_privileges_request(0, 0)]);
    s.write_all(&out).unwrap();
    let mut decoder = p::Decoder::new();
    let mut replies = Vec::new();
    let mut buf = [0u8; 4096];
    while replies.len() < 4 {
        while let Some(f) = decoder.next_frame().unwrap() {
            replies.push(f);
        }
        if replies.len() >= 4 {
            break;
        }
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the agent closed the connection");
        decoder.push(&buf[..n]);
    }
    let (pid, hello_flags) = p::parse_hello_reply(&replies[0].body).unwrap();
    assert_eq!(pid, std::process::id());
    assert_eq!(hello_flags & (flags::AGENT | flags::PEER_CHECKED), flags::AGENT | flags::PEER_CHECKED);
    for r in &replies[1..] {
        assert_eq!((r.kind, p::parse_error(&r.body).0), (kind::ERR, ErrorCode::NotAllowed), "{:?}", p::parse_error(&r.body));
    }
    drop(s);

    // The agent goes away: signatures fail, saying so; a new agent on the
    // same socket: the engine connects again and loads its keys again.
    agent.stop();
    assert!(!socket.exists(), "the socket outlived its agent");
    let err = managed_sign(&engine, &ec, Algorithm::EcdsaP256Sha256).unwrap_err().to_string();
    assert!(err.contains("agent"), "{err}");
    let _agent = Agent::start(agent_config(&dir.0, &world)).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let sig = loop {
        match managed_sign(&engine, &ec, Algorithm::EcdsaP256Sha256) {
            Ok(sig) => break sig,
            Err(e) => assert!(Instant::now() < until, "no signature 10 s after the agent came back: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(verifies(&ec, Algorithm::EcdsaP256Sha256, b"through the agent", &sig));
    // A second agent on a live one's socket is refused.
    let err = Agent::start(agent_config(&dir.0, &world)).unwrap_err().to_string();
    assert!(err.contains("already listens"), "{err}");
}

#[test]
fn an_agent_admits_clients_by_socket_mode_and_credentials() {
    use keyfence::sign::agent::Agent;
    if !running_as_root() {
        return;
    }
    let dir = Dir::new("agent-users");
    let world = agent_world(&dir.0);
    let probe = |socket: &Path| {
        use std::os::unix::process::CommandExt;
        let o = Command::new(key_process_support::program("agent-client"))
            .env("KEYFENCE_PROBE_SOCKET", socket)
            .env("KEYFENCE_PROBE_ENVELOPE", &world.eu_ec.0)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.lines().find_map(|l| l.strip_prefix("PROBE: ").map(str::to_string)).unwrap_or_else(|| panic!("no probe line: {out}"))
    };
    // The socket's mode (root's, 0660) keeps nobody out before the agent
    // hears of it.
    let agent = Agent::start(agent_config(&dir.0, &world)).unwrap();
    let seen = probe(agent.socket());
    assert!(seen.contains("Permission denied"), "{seen}");
    assert_eq!(agent.stats().refused, 0);
    drop(agent);
    // Open to all by its mode, the agent refuses nobody by its credentials.
    let mut config = agent_config(&dir.0, &world);
    config.socket_mode = 0o666;
    let agent = Agent::start(config.clone()).unwrap();
    let seen = probe(agent.socket());
    assert!(seen.contains("user nobody (uid 65534) is not allowed"), "{seen}");
    assert_eq!(agent.stats().refused, 1);
    drop(agent);
    // Allowed by name, it signs.
    config.allow_users = vec![keyfence::sign::agent::user_id("nobody").unwrap()];
    let agent = Agent::start(config.clone()).unwrap();
    assert_eq!(probe(agent.socket()), "SIGNED");
    drop(agent);
    // Or by its group.
    config.allow_users.clear();
    config.allow_groups = vec![keyfence::sign::agent::group_id("65534").unwrap()];
    let agent = Agent::start(config).unwrap();
    assert_eq!(probe(agent.socket()), "SIGNED");
}

/// Runs `attack` as `nobody` with `count` connections for `seconds`
/// against the agent on `socket`, and meanwhile has root (this process)
/// sign with a key it holds every 50 ms and, every 300 ms, connect anew,
/// load and sign (what a server's reload does). Returns the slowest of
/// each, and the attacker's last line.
fn under_attack(socket: &Path, envelope: &Path, attack: &str, count: usize, seconds: f64) -> (Duration, Duration, String) {
    let engine = agent_engine(socket).unwrap();
    let key = engine.load(KeySource::agent_envelope(std::fs::read(envelope).unwrap())).unwrap();
    let attacker = attacker(&[
        ("KEYFENCE_ATTACK", attack.to_string()),
        ("KEYFENCE_ATTACK_SOCKET", socket.display().to_string()),
        ("KEYFENCE_ATTACK_ENVELOPE", envelope.display().to_string()),
        ("KEYFENCE_ATTACK_COUNT", count.to_string()),
        ("KEYFENCE_ATTACK_SECONDS", seconds.to_string()),
    ]);
    let ready = format!("ready {}", attacker.said("ATTACK: ready", Duration::from_secs(30)));
    let (mut sign, mut reload) = (Duration::ZERO, Duration::ZERO);
    let until = Instant::now() + Duration::from_secs_f64(seconds - 0.5);
    let mut last_reload = Instant::now();
    while Instant::now() < until {
        let t = Instant::now();
        let sig = managed_sign(&engine, &key, Algorithm::EcdsaP256Sha256).expect("root's signature during the attack");
        assert!(verifies(&key, Algorithm::EcdsaP256Sha256, b"through the agent", &sig));
        sign = sign.max(t.elapsed());
        if last_reload.elapsed() > Duration::from_millis(300) {
            let t = Instant::now();
            let fresh = agent_engine(socket).expect("a new connection during the attack");
            let k = fresh.load(KeySource::agent_envelope(std::fs::read(envelope).unwrap())).expect("a load during the attack");
            managed_sign(&fresh, &k, Algorithm::EcdsaP256Sha256).expect("a new connection's signature during the attack");
            reload = reload.max(t.elapsed());
            last_reload = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let done = attacker.said("ATTACK: done", Duration::from_secs(30));
    (sign, reload, format!("{ready}; {done}"))
}

/// Whether this test can run another user's program (it needs root),
/// skipping loudly through the one helper where it cannot.
fn running_as_root() -> bool {
    !common::skip_unless(common::is_root(), "running a program as another user needs root", common::REQUIRE_ROOT)
}

/// Issue 52.3: a user the agent does not allow, who can reach its socket
/// (mode 666 here; its group, on a server), dribbling 16 bytes every
/// 20 ms on 300 connections, then holding 300 connections open: root's
/// signatures and new connections are each answered within a second
/// (before, refusals were read on the accept thread, 50 ms each, and a
/// new connection waited 10 s and failed).
#[test]
fn a_user_it_refuses_cannot_stall_the_others() {
    if !running_as_root() {
        return;
    }
    let dir = Dir::new("agent-refused-attack");
    let world = agent_world(&dir.0);
    let mut config = agent_config(&dir.0, &world);
    config.socket_mode = 0o666;
    let agent = keyfence::sign::agent::Agent::start(config).unwrap();
    for attack in ["dribble", "hold"] {
        let (sign, reload, said) = under_attack(agent.socket(), &world.eu_ec.0, attack, 300, 4.0);
        assert!(said.contains("ready 300"), "{attack}: {said}");
        assert!(
            sign < Duration::from_secs(1) && reload < Duration::from_secs(1),
            "{attack}: root waited {sign:?} to sign, {reload:?} for a new connection ({said})"
        );
    }
    assert!(agent.stats().refused >= 300, "{:?}", agent.stats());
}

/// Issue 52.3: a user the agent allows, who sends requests within its
/// in-flight bound on 8 connections and never reads the replies: root
/// still signs and loads within a second (before, every signing thread
/// blocked writing to it and another user's signature timed out at 10 s),
/// and the attacker's connections are cut off. Then the same user holding
/// more idle connections than one user may: root still gets in (before,
/// the agent's whole table was the attacker's).
#[test]
fn a_user_it_allows_cannot_stall_the_others() {
    if !running_as_root() {
        return;
    }
    let dir = Dir::new("agent-allowed-attack");
    let world = agent_world(&dir.0);
    let mut config = agent_config(&dir.0, &world);
    config.socket_mode = 0o666;
    config.allow_users = vec![65534];
    config.max_connections = 160;
    config.user_connections = 64;
    let agent = keyfence::sign::agent::Agent::start(config).unwrap();
    let (sign, reload, said) = under_attack(agent.socket(), &world.eu_ec.0, "unread", 8, 9.0);
    assert!(
        sign < Duration::from_secs(1) && reload < Duration::from_secs(1),
        "unread: root waited {sign:?} to sign, {reload:?} for a new connection ({said})"
    );
    assert!(said.contains("cut=") && !said.contains("cut=0"), "the attacker was never cut off: {said}");
    let (sign, reload, said) = under_attack(agent.socket(), &world.eu_ec.0, "idle", 100, 3.0);
    assert!(said.contains("ready 100"), "{said}");
    assert!(
        sign < Duration::from_secs(1) && reload < Duration::from_secs(1),
        "idle: root waited {sign:?} to sign, {reload:?} for a new connection ({said})"
    );
}

/// Issues 55.8 and 52.3: keys are bounded per connection and per user,
/// with a clear refusal, and given back when unloaded; a hello that does
/// not come whole in time ends the connection however it dribbles.
#[test]
fn keys_are_bounded_per_connection_and_per_user_and_a_hello_has_one_deadline() {
    use keyfence::sign::agent::Agent;
    let dir = Dir::new("agent-bounds");
    let world = agent_world(&dir.0);
    let mut config = agent_config(&dir.0, &world);
    config.connection_keys = 3;
    config.user_keys = 5;
    config.hello_timeout = Duration::from_millis(800);
    let agent = Agent::start(config).unwrap();
    let envelope = std::fs::read(&world.eu_ec.0).unwrap();
    let first = agent_engine(agent.socket()).unwrap();
    let mut held: Vec<_> = (0..3).map(|_| first.load(KeySource::agent_envelope(envelope.clone())).unwrap()).collect();
    let err = first.load(KeySource::agent_envelope(envelope.clone())).unwrap_err().to_string();
    assert!(err.contains("this connection holds 3 keys"), "{err}");
    let second = agent_engine(agent.socket()).unwrap();
    held.extend((0..2).map(|_| second.load(KeySource::agent_envelope(envelope.clone())).unwrap()));
    let err = second.load(KeySource::agent_envelope(envelope.clone())).unwrap_err().to_string();
    assert!(err.contains("this user holds 5 keys"), "{err}");
    // A key let go is the user's to load again.
    held.pop();
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match second.load(KeySource::agent_envelope(envelope.clone())) {
            Ok(k) => break held.push(k),
            Err(e) => assert!(Instant::now() < until, "the unloaded key was not given back: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    // A hello dribbled a byte at a time: closed at the deadline, not kept.
    let mut s = UnixStream::connect(agent.socket()).unwrap();
    let mut hello = Vec::new();
    p::encode(&mut hello, kind::HELLO, 0, &[&p::hello_request(8)]);
    let t = Instant::now();
    let mut closed = false;
    for b in hello.iter().take(hello.len() - 1).cycle() {
        if s.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        if t.elapsed() > Duration::from_secs(5) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(closed, "a dribbled hello kept its connection for {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

/// Issue 52.2: an agent refuses to start on a store whose authority state
/// it can read (a server that can read the master secret keys is its own
/// authority), says what to do instead, and starts on the servers' copy
/// (`export_for_servers`) or when told it is a one-machine trial.
#[test]
fn an_agent_refuses_a_store_that_holds_the_authoritys_secrets() {
    use keyfence::sign::agent::Agent;
    let dir = Dir::new("agent-authority-store");
    let world = agent_world(&dir.0);
    let mut config = agent_config(&dir.0, &world);
    config.store = Some(world.store.to_str().unwrap().to_string());
    let err = Agent::start(config.clone()).unwrap_err().to_string();
    assert!(err.contains("holds the authority's secrets") && err.contains("keyfence authority export"), "{err}");
    assert!(!dir.0.join("agent.sock").exists(), "a refused agent made no socket");
    config.unsafe_authority_store = true;
    drop(Agent::start(config).unwrap());
    let served = Agent::start(agent_config(&dir.0, &world)).unwrap();
    let engine = agent_engine(served.socket()).unwrap();
    let key = engine.load(KeySource::agent_envelope(world.eu_ec.1.clone())).unwrap();
    assert!(managed_sign(&engine, &key, Algorithm::EcdsaP256Sha256).is_ok());
    assert!(std::fs::read_dir(world.served.join("authority")).map_or(true, |mut d| d.next().is_none()), "the copy holds authority/");
}

/// Issue 55.7: a server that loads a key through the agent and then
/// forks (nginx's master, root, and its workers, `www-data`) leaves its
/// children no copy of the connection the agent admitted it on: in the
/// child each of the client's descriptors is another socket (one whose
/// peer is gone), not the parent's connection. The agent's own end, in
/// this process too, is not the client's and is kept: the control.
#[test]
fn a_forked_child_keeps_none_of_the_parents_agent_connections() {
    use std::os::unix::fs::MetadataExt;
    let dir = Dir::new("agent-fork");
    let world = agent_world(&dir.0);
    let agent = keyfence::sign::agent::Agent::start(agent_config(&dir.0, &world)).unwrap();
    let engine = agent_engine(agent.socket()).unwrap();
    let key = engine.load(KeySource::agent_envelope(world.eu_ec.1.clone())).unwrap();
    assert!(managed_sign(&engine, &key, Algorithm::EcdsaP256Sha256).is_ok());
    // The client's ends: sockets whose peer is the agent's socket path;
    // the agent's ends: sockets named by it.
    let (mut client, mut server) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(meta) = std::fs::metadata(entry.path()) else { continue };
        // SAFETY: sockaddr_un is plain data; the calls write at most `len`
        // bytes into it and the descriptor is only looked at.
        let name = |peer: bool| unsafe {
            let mut a: libc::sockaddr_un = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            let rc = if peer {
                libc::getpeername(fd, (&mut a as *mut libc::sockaddr_un).cast(), &mut len)
            } else {
                libc::getsockname(fd, (&mut a as *mut libc::sockaddr_un).cast(), &mut len)
            };
            let path: Vec<u8> = a.sun_path.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
            (rc == 0 && a.sun_family as i32 == libc::AF_UNIX).then_some(path)
        };
        // The agent binds a private name in its folder and renames it into
        // place: this test's agent's names are in this test's folder (other
        // tests in this process connect to agents of their own).
        let folder = dir.0.as_os_str().as_encoded_bytes();
        let agents = |n: &Option<Vec<u8>>| n.as_ref().is_some_and(|n| n.starts_with(folder) && n.windows(10).any(|w| w == b"agent.sock"));
        let (own, peer) = (name(false), name(true));
        if agents(&peer) && !agents(&own) {
            client.push((fd, meta.ino()));
        } else if agents(&own) && peer.is_some() {
            server.push((fd, meta.ino()));
        }
    }
    assert!(client.len() >= 2, "the client's connection (writer and reader): {client:?}");
    assert!(!server.is_empty(), "the agent's end of it");
    // SAFETY: the child makes only async-signal-safe calls (fstat, _exit)
    // before it exits: this process has other threads.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let same = |(fd, ino): &(i32, u64)| unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstat(*fd, &mut st) == 0 && st.st_ino == *ino
        };
        let code = if client.iter().any(same) {
            1
        } else if !server.iter().all(same) {
            2
        } else {
            0
        };
        // SAFETY: ends the child at once, running nothing of the parent's.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked; `status` is a live local.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "the child did not exit: {status}");
    match libc::WEXITSTATUS(status) {
        0 => {}
        1 => panic!("the child still holds the parent's connection to the agent"),
        2 => panic!("the child lost a descriptor that was not the client's (the control)"),
        c => panic!("child exit {c}"),
    }
    // The parent's connection is untouched.
    assert!(managed_sign(&engine, &key, Algorithm::EcdsaP256Sha256).is_ok());
}

/// A restart of the agent under a busy server: every client reconnects
/// and replays its loads at once, more than one user's queue takes.
/// The loads answered `busy` are asked again until there is room, so no
/// client loses its key (before, a replay answered `busy` lost the key for
/// good: Apache's children failed until the server was restarted).
#[test]
fn an_agent_restarted_under_a_burst_of_replays_loses_no_clients_key() {
    use keyfence::sign::agent::Agent;
    use keyfence::sign::key_process::{KeyProcess, KeyProcessConfig};
    let dir = Dir::new("agent-replay");
    let world = agent_world(&dir.0);
    // Two loads waiting per user at most, so that the burst meets the
    // bound (the default, 256, meets it with more clients).
    let config = || {
        let mut c = agent_config(&dir.0, &world);
        c.user_loads = 2;
        c
    };
    let mut agent = Agent::start(config()).unwrap();
    let socket = agent.socket().to_path_buf();
    const CLIENTS: usize = 300;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let mut config = KeyProcessConfig::with_agent(&socket);
            config.max_in_flight = 4;
            let keys = KeyProcess::start(config).unwrap();
            let key = keys.load(KeySource::agent_envelope(world.eu_ec.1.clone())).unwrap();
            (keys, key)
        })
        .collect();
    agent.stop();
    let _agent = Agent::start(config()).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    for (i, (keys, key)) in clients.iter().enumerate() {
        loop {
            match key.sign(Algorithm::EcdsaP256Sha256, b"after the restart") {
                Ok(sig) => {
                    assert!(verifies(key, Algorithm::EcdsaP256Sha256, b"after the restart", &sig));
                    break;
                }
                Err(e) => {
                    let lost = e.to_string().contains("could not be loaded again");
                    assert!(!lost, "client {i} lost its key in the replay: {e}");
                    assert!(Instant::now() < until, "client {i} never signed again: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        assert!(keys.restarts() >= 1, "client {i} reconnected");
    }
}

/// Latencies' `q` quantile (0 to 1), in milliseconds.
fn quantile_ms(samples: &mut [Duration], q: f64) -> f64 {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples.get(i).map_or(f64::INFINITY, |d| d.as_secs_f64() * 1e3)
}

/// Issue 59.1: one allowed user keeps the agent saturated, 4 connections
/// of 1,024 RSA-4096 signatures in flight and 2 of 1,024 P-384 (both
/// signing classes), while another user (root, here) signs RSA-2048 and
/// P-256 one at a time. The other user is served within its normal
/// latency: the queues take users by the time their work has taken. The
/// control is the attacking user's own probe, which shares its user's
/// place in the queues: it waits behind the backlog (seconds, or past its
/// 2 s deadline), which is what every user waited with one queue for all
/// (7.3 s for another user's RSA-2048, issue 59).
#[test]
fn one_user_saturating_the_agent_does_not_delay_another_users_signatures() {
    if !running_as_root() {
        return;
    }
    use key_process_support::{wrap_more, Attacker};
    use keyfence::sign::KeyKind;
    let dir = Dir::new("agent-fair");
    let world = agent_world(&dir.0);
    let rsa4096 = wrap_more(&dir.0, &world, "eu-rsa4096", KeyKind::Rsa { bits: 4096 }, "region: EU");
    let p384 = wrap_more(&dir.0, &world, "eu-p384", KeyKind::EcP384, "region: EU");
    let mut config = agent_config(&dir.0, &world);
    config.socket_mode = 0o666;
    config.allow_users = vec![65534];
    config.rsa_threads = 2;
    let agent = keyfence::sign::agent::Agent::start(config).unwrap();
    let socket = agent.socket().display().to_string();
    let flood = |count: usize, envelope: &Path, alg: &str, probe: Option<&Path>| {
        let mut env = vec![
            ("KEYFENCE_ATTACK", "flood".to_string()),
            ("KEYFENCE_ATTACK_SOCKET", socket.clone()),
            ("KEYFENCE_ATTACK_COUNT", count.to_string()),
            ("KEYFENCE_ATTACK_IN_FLIGHT", "1024".to_string()),
            ("KEYFENCE_ATTACK_SECONDS", "12".to_string()),
            ("KEYFENCE_ATTACK_ENVELOPE", envelope.display().to_string()),
            ("KEYFENCE_ATTACK_ALG", alg.to_string()),
        ];
        if let Some(probe) = probe {
            env.push(("KEYFENCE_ATTACK_PROBE_ENVELOPE", probe.display().to_string()));
            env.push(("KEYFENCE_ATTACK_PROBE_ALG", "rsa-pss-sha256".to_string()));
        }
        attacker(&env)
    };
    let rsa = flood(4, &rsa4096.0, "rsa-pkcs1-sha256", Some(&world.eu_rsa.0));
    let ec = flood(2, &p384.0, "ecdsa-p384-sha384", None);
    rsa.said("ATTACK: ready", Duration::from_secs(60));
    ec.said("ATTACK: ready", Duration::from_secs(60));

    let engine = agent_engine(agent.socket()).unwrap();
    let keys = [
        (engine.load(KeySource::agent_envelope(world.eu_rsa.1.clone())).unwrap(), Algorithm::RsaPssSha256),
        (engine.load(KeySource::agent_envelope(world.eu_ec.1.clone())).unwrap(), Algorithm::EcdsaP256Sha256),
    ];
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    let until = Instant::now() + Duration::from_secs(7);
    while Instant::now() < until {
        for (i, (key, alg)) in keys.iter().enumerate() {
            let t = Instant::now();
            let sig = managed_sign(&engine, key, *alg).unwrap_or_else(|e| panic!("another user's {alg:?} during the flood: {e}"));
            times[i].push(t.elapsed());
            assert!(verifies(key, *alg, b"through the agent", &sig));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let done = rsa.said("ATTACK: done", Duration::from_secs(60));
    let ec_done = ec.said("ATTACK: done", Duration::from_secs(60));
    let [rsa_times, ec_times] = &mut times;
    let (rsa_p50, rsa_p99) = (quantile_ms(rsa_times, 0.5), quantile_ms(rsa_times, 0.99));
    let (ec_p50, ec_p99) = (quantile_ms(ec_times, 0.5), quantile_ms(ec_times, 0.99));
    println!(
        "{{\"test\": \"agent_fairness\", \"other_user_rsa2048_p50_ms\": {rsa_p50:.1}, \"other_user_rsa2048_p99_ms\": {rsa_p99:.1}, \"other_user_p256_p50_ms\": {ec_p50:.1}, \"other_user_p256_p99_ms\": {ec_p99:.1}, \"samples\": {}, \"attacker\": \"{done}\", \"attacker_ec\": \"{ec_done}\"}}",
        rsa_times.len()
    );
    // The flood was real: both classes signed for the attacker (how many
    // depends on the machine), and its own probe waited behind its backlog
    // or gave up at its deadline.
    assert!(Attacker::field(&done, "signed") > 0.0 && Attacker::field(&ec_done, "signed") > 0.0, "{done}; {ec_done}");
    let probe = Attacker::field(&done, "probe_median_ms");
    assert!(probe > 500.0 || Attacker::field(&done, "probe_failed") > 0.0, "the attacker's own probe was not delayed: {done}");
    // Another user: a signature's normal latency, not the backlog's. The
    // bound is loose for a loaded 2-core machine (the figure to meet, p99
    // under 50 ms, is measured on its own: docs/benchmarks.md); with one
    // queue for all it was seconds.
    assert!(rsa_p99 < 400.0 && ec_p99 < 400.0, "another user waited: RSA-2048 p99 {rsa_p99:.1} ms, P-256 p99 {ec_p99:.1} ms ({done})");
    assert!(probe.is_infinite() || rsa_p99 * 5.0 < probe, "another user's p99 {rsa_p99:.1} ms against the attacker's own {probe:.1} ms");
}

/// Issue 59.5: a child that inherits its parent's agent connection, made
/// without running the fork handlers (`clone(SIGCHLD)`, as glibc's
/// `_Fork` does), cannot use it: the agent reads each message's sender
/// from the kernel (`SO_PASSCRED`) and ends a connection written by any
/// process but the one that opened it. The control: the same request
/// from the parent signs.
#[test]
fn a_child_that_inherits_an_agent_connection_cannot_use_it() {
    use std::os::fd::AsRawFd;
    let dir = Dir::new("agent-clone");
    let world = agent_world(&dir.0);
    let agent = keyfence::sign::agent::Agent::start(agent_config(&dir.0, &world)).unwrap();
    let mut s = UnixStream::connect(agent.socket()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut f = Vec::new();
    p::encode(&mut f, kind::HELLO, 0, &[&p::hello_request(16)]);
    p::encode(&mut f, kind::LOAD, 1, &[&p::load_request(1, &p::LoadBody::AgentEnvelope(world.eu_ec.1.clone()))]);
    s.write_all(&f).unwrap();
    let mut decoder = p::Decoder::new();
    let mut next = |s: &mut UnixStream| -> Option<p::Frame> {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(f) = decoder.next_frame().unwrap() {
                return Some(f);
            }
            let n = s.read(&mut buf).ok()?;
            if n == 0 {
                return None;
            }
            decoder.push(&buf[..n]);
        }
    };
    assert_eq!(next(&mut s).unwrap().kind, kind::HELLO);
    assert_eq!(next(&mut s).unwrap().kind, kind::OK, "the key loads");
    let op =
        keyfence::sign::Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: keyfence::sign::Input::Message(b"inherited".to_vec()) };
    let mut request = Vec::new();
    p::encode_op(&mut request, 7, 1, Duration::from_secs(5), &op);
    // The control: the parent's request signs.
    s.write_all(&request).unwrap();
    assert_eq!(next(&mut s).unwrap().kind, kind::OK, "the parent signs on its own connection");

    let fd = s.as_raw_fd();
    // SAFETY: clone with SIGCHLD and no other flag is fork without the
    // atfork handlers (what _Fork does); the child makes only
    // async-signal-safe calls (write, read, _exit) on memory prepared
    // before, then exits.
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0usize, 0usize, 0usize, 0usize) };
    assert!(pid >= 0, "clone");
    if pid == 0 {
        // SAFETY: as above: the request's bytes, a stack buffer, exit.
        unsafe {
            let sent = libc::write(fd, request.as_ptr().cast(), request.len());
            let mut buf = [0u8; 4096];
            let mut got = 0usize;
            // The reply's header (length, kind): OK (0x80) or ERR (0x81).
            while got < 5 {
                let n = libc::read(fd, buf.as_mut_ptr().add(got).cast(), buf.len() - got);
                if n <= 0 {
                    break;
                }
                got += n as usize;
            }
            let code = match (sent == request.len() as isize, got >= 5, buf[4]) {
                (false, _, _) => 3,
                (true, false, _) => 4,
                (true, true, 0x80) => 1,
                (true, true, _) => 0,
            };
            libc::_exit(code);
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child just made; `status` is a live local.
    unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "{status}");
    match libc::WEXITSTATUS(status) {
        0 => {}
        1 => panic!("the child signed on its parent's connection"),
        c => panic!("the child could not write or read at all ({c})"),
    }
    // The agent said why and ended the connection: the parent makes a new one.
    let said = next(&mut s);
    if let Some(f) = said {
        let (code, why) = p::parse_error(&f.body);
        assert_eq!(code, ErrorCode::NotAllowed, "{why}");
    }
    assert!(next(&mut s).is_none(), "the connection is ended");
}
