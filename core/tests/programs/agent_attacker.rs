//! A local user attacking a key agent, run by the agent's tests as the
//! user they need (`nobody`): not a test itself, a program
//! (`cargo build -p keyfence --example agent-attacker`; `cargo test`
//! builds it).
//!
//! `KEYFENCE_ATTACK` names the attack, against the agent on
//! `KEYFENCE_ATTACK_SOCKET`, with `KEYFENCE_ATTACK_COUNT` connections, for
//! `KEYFENCE_ATTACK_SECONDS`:
//!
//! - `idle`: hellos, then nothing; `hold`: connections, not even a hello;
//!   `dribble`: 16 bytes of a hello that never ends on each, every 20 ms;
//! - `unread`: requests within the in-flight bound, replies never read;
//! - `flood`: each connection keeps `KEYFENCE_ATTACK_IN_FLIGHT` signatures
//!   with the key in `KEYFENCE_ATTACK_ENVELOPE` (`KEYFENCE_ATTACK_ALG`) in
//!   flight, and one more connection of the same user, the probe, signs
//!   with `KEYFENCE_ATTACK_PROBE_ENVELOPE` now and then and times it: the
//!   attacking user's own latency, what every user would see with one
//!   queue for all;
//! - `partial`: each connection sends a hello and then all but the last
//!   byte of a frame of the largest size, and holds it.
//!
//! It prints `ATTACK: ready N` once its connections are up and
//! `ATTACK: done key=value ...` at the end.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use keyfence::sign::key_process::protocol::{self as p, kind};
use keyfence::sign::{Algorithm, Input, Operation};

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn hello(s: &mut UnixStream, in_flight: u32) -> bool {
    let mut f = Vec::new();
    p::encode(&mut f, kind::HELLO, 0, &[&p::hello_request(in_flight)]);
    s.write_all(&f).is_ok()
}

/// Reads frames until one with `id` (or any, with `None`) comes, or the
/// deadline passes.
fn read_frame(s: &mut UnixStream, d: &mut p::Decoder, until: Instant) -> Option<p::Frame> {
    loop {
        if let Ok(Some(f)) = d.next_frame() {
            return Some(f);
        }
        let left = until.checked_duration_since(Instant::now())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1)))).ok()?;
        let mut buf = [0u8; 16 * 1024];
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => d.push(&buf[..n]),
        }
    }
}

/// A connection with the key in `envelope` loaded as key 1.
fn loaded(socket: &str, envelope: &[u8], in_flight: u32) -> Option<(UnixStream, p::Decoder)> {
    let mut s = UnixStream::connect(socket).ok()?;
    let mut d = p::Decoder::new();
    let mut f = Vec::new();
    p::encode(&mut f, kind::HELLO, 0, &[&p::hello_request(in_flight)]);
    p::encode(&mut f, kind::LOAD, 1, &[&p::load_request(1, &p::LoadBody::AgentEnvelope(envelope.to_vec()))]);
    s.write_all(&f).ok()?;
    let until = Instant::now() + Duration::from_secs(20);
    let h = read_frame(&mut s, &mut d, until)?;
    let l = read_frame(&mut s, &mut d, until)?;
    (h.kind == kind::HELLO && l.kind == kind::OK).then_some((s, d))
}

fn op(alg: Algorithm) -> Operation {
    Operation::Sign { alg, input: Input::Message(vec![7u8; 32]) }
}

fn main() {
    let what = env("KEYFENCE_ATTACK").expect("KEYFENCE_ATTACK");
    let socket = env("KEYFENCE_ATTACK_SOCKET").expect("KEYFENCE_ATTACK_SOCKET");
    let count: usize = env("KEYFENCE_ATTACK_COUNT").and_then(|v| v.parse().ok()).unwrap_or(300);
    let seconds: f64 = env("KEYFENCE_ATTACK_SECONDS").and_then(|v| v.parse().ok()).unwrap_or(5.0);
    let envelope = env("KEYFENCE_ATTACK_ENVELOPE").map(|e| std::fs::read(e).expect("the attack's envelope"));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    match what.as_str() {
        "flood" => flood(&socket, count, until, &envelope.expect("KEYFENCE_ATTACK_ENVELOPE")),
        "partial" => partial(&socket, count, until),
        _ => simple(&what, &socket, count, until, envelope),
    }
}

/// `idle`, `hold`, `dribble` and `unread`.
fn simple(what: &str, socket: &str, count: usize, until: Instant, envelope: Option<Vec<u8>>) {
    let connect = || UnixStream::connect(socket).ok();
    let mut conns: Vec<Option<UnixStream>> = (0..count).map(|_| connect()).collect();
    let mut cut = 0usize;
    match what {
        "idle" => {
            for s in conns.iter_mut().flatten() {
                hello(s, 64);
            }
        }
        "unread" => {
            let envelope = envelope.expect("an envelope");
            for s in conns.iter_mut().flatten() {
                let mut f = Vec::new();
                p::encode(&mut f, kind::HELLO, 0, &[&p::hello_request(64)]);
                p::encode(&mut f, kind::LOAD, 1, &[&p::load_request(1, &p::LoadBody::AgentEnvelope(envelope.clone()))]);
                let _ = s.write_all(&f);
            }
        }
        _ => {}
    }
    println!("ATTACK: ready {}", conns.iter().flatten().count());
    let mut id = 2u64;
    let op = op(Algorithm::EcdsaP256Sha256);
    while Instant::now() < until {
        for slot in conns.iter_mut() {
            match what {
                // 16 bytes of a hello that never ends, every round; a
                // connection the agent closed is made again.
                "dribble" => {
                    let ok = slot.as_mut().is_some_and(|s| s.write_all(&[0u8; 16]).is_ok());
                    if !ok {
                        *slot = connect();
                    }
                }
                // Requests within the in-flight bound, replies never read.
                "unread" => {
                    if let Some(s) = slot.as_mut() {
                        let mut f = Vec::new();
                        p::encode_op(&mut f, id, 1, Duration::from_secs(10), &op);
                        id += 1;
                        s.set_write_timeout(Some(Duration::from_millis(50))).unwrap();
                        // A full socket times out; one the agent cut off
                        // is a broken pipe.
                        if let Err(e) = s.write_all(&f) {
                            if matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset) {
                                cut += 1;
                                *slot = None;
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(if what == "unread" { 2 } else { 20 }));
    }
    println!("ATTACK: done cut={cut}");
}

/// Keeps every connection's in-flight bound full of signatures, and
/// times the same user's probe.
fn flood(socket: &str, count: usize, until: Instant, envelope: &[u8]) {
    let in_flight: usize = env("KEYFENCE_ATTACK_IN_FLIGHT").and_then(|v| v.parse().ok()).unwrap_or(1024);
    let alg: Algorithm = env("KEYFENCE_ATTACK_ALG").and_then(|a| a.parse().ok()).unwrap_or(Algorithm::RsaPkcs1Sha256);
    let probe_alg: Algorithm = env("KEYFENCE_ATTACK_PROBE_ALG").and_then(|a| a.parse().ok()).unwrap_or(Algorithm::RsaPkcs1Sha256);
    let probe_envelope = env("KEYFENCE_ATTACK_PROBE_ENVELOPE").map(|e| std::fs::read(e).expect("the probe's envelope"));
    let threads: Vec<_> = (0..count)
        .map(|_| {
            let (socket, envelope) = (socket.to_string(), envelope.to_vec());
            std::thread::spawn(move || -> (u64, u64) {
                let Some((mut s, mut d)) = loaded(&socket, &envelope, in_flight as u32) else { return (0, 0) };
                let op = op(alg);
                let (mut signed, mut refused, mut id) = (0u64, 0u64, 10u64);
                let mut out = Vec::new();
                for _ in 0..in_flight {
                    p::encode_op(&mut out, id, 1, Duration::from_secs(60), &op);
                    id += 1;
                }
                if s.write_all(&out).is_err() {
                    return (0, 0);
                }
                while Instant::now() < until {
                    let Some(f) = read_frame(&mut s, &mut d, until) else { break };
                    if f.kind == kind::OK {
                        signed += 1;
                    } else {
                        refused += 1;
                    }
                    out.clear();
                    p::encode_op(&mut out, id, 1, Duration::from_secs(60), &op);
                    id += 1;
                    if s.write_all(&out).is_err() {
                        break;
                    }
                }
                (signed, refused)
            })
        })
        .collect();
    // Let the queues fill before the probe and the victim start.
    std::thread::sleep(Duration::from_millis(500));
    println!("ATTACK: ready {count}");
    let mut probes = Vec::new();
    let mut probe_failed = 0;
    if let Some(env) = probe_envelope {
        if let Some((mut s, mut d)) = loaded(socket, &env, 4) {
            let mut id = 100u64;
            while Instant::now() + Duration::from_secs(3) < until {
                let mut f = Vec::new();
                p::encode_op(&mut f, id, 1, Duration::from_secs(2), &op(probe_alg));
                id += 1;
                let t = Instant::now();
                if s.write_all(&f).is_err() {
                    break;
                }
                match read_frame(&mut s, &mut d, t + Duration::from_secs(3)) {
                    Some(f) if f.kind == kind::OK => probes.push(t.elapsed().as_secs_f64() * 1e3),
                    _ => probe_failed += 1,
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let (mut signed, mut refused) = (0, 0);
    for t in threads {
        let (s, r) = t.join().unwrap_or((0, 0));
        signed += s;
        refused += r;
    }
    probes.sort_by(f64::total_cmp);
    let median = probes.get(probes.len() / 2).copied().unwrap_or(f64::INFINITY);
    println!(
        "ATTACK: done signed={signed} refused={refused} probe_ok={} probe_failed={probe_failed} probe_median_ms={median:.1}",
        probes.len()
    );
}

/// Holds all but the last byte of a largest frame on every connection.
fn partial(socket: &str, count: usize, until: Instant) {
    let mut held = Vec::new();
    let mut cut = 0usize;
    let mut frame = Vec::with_capacity(p::MAX_FRAME + 4);
    frame.extend_from_slice(&(p::MAX_FRAME as u32).to_be_bytes());
    frame.push(kind::LOAD);
    frame.extend_from_slice(&7u64.to_be_bytes());
    frame.resize(4 + p::MAX_FRAME - 1, 0x41);
    for _ in 0..count {
        let Ok(mut s) = UnixStream::connect(socket) else {
            cut += 1;
            continue;
        };
        s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        if !hello(&mut s, 8) || s.write_all(&frame).is_err() {
            cut += 1;
            continue;
        }
        held.push(s);
    }
    println!("ATTACK: ready {}", held.len());
    // Connections the agent ends: a read sees the end (after the reason).
    let mut ended = 0;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    for s in &mut held {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => {
                    ended += 1;
                    break;
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    ended += 1;
                    break;
                }
            }
        }
    }
    println!("ATTACK: done sent={} cut={cut} ended={ended}", held.len());
}
