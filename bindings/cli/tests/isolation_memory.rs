//! Issue 33: `keyfence serve --isolated` promises that the server process
//! holds nothing that opens keys. The server used to decode the machine
//! key (its CP-ABE attribute key: secret G1 and G2 points) for its "could
//! this machine open it" check and keep it for its whole life. This test
//! reads the running server's memory (`/proc/PID/mem`, every readable
//! mapping) for the machine key's secret points in the forms they take:
//! the file's encoding (big-endian coordinates) and blst's in-memory one
//! (little-endian 64-bit limbs in Montgomery form), and finds none; the
//! same search finds them in a server that is not isolated, so it can fail.
//!
//! Linux only (`/proc`); needs to be root or the server's user (the server
//! is our child, same user), and a kernel that lets a parent read its
//! child's memory (`ptrace_scope` 0 or 1, or root).

#![cfg(target_os = "linux")]

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::process::{Child, Command, Stdio};

use common::{ok, openssl, pki, Dir};

/// The BLS12-381 base field modulus, little-endian 64-bit limbs.
const P: [u64; 6] = [
    0xb9fe_ffff_ffff_aaab,
    0x1eab_fffe_b153_ffff,
    0x6730_d2a0_f6b0_f624,
    0x6477_4b84_f385_12bf,
    0x4b1b_a7b6_434b_acd7,
    0x1a01_11ea_397f_e69a,
];

/// A field element as blst holds it: `x * 2^384 mod p` in little-endian
/// 64-bit limbs, from its 48-byte big-endian encoding.
fn montgomery(be: &[u8]) -> [u8; 48] {
    let mut v = [0u64; 6];
    for (i, limb) in v.iter_mut().enumerate() {
        let start = 48 - 8 * (i + 1);
        *limb = u64::from_be_bytes(be[start..start + 8].try_into().unwrap());
    }
    // Doubling modulo p 384 times: v < p < 2^381, so 2v fits 384 bits.
    for _ in 0..384 {
        let mut carry = 0;
        for limb in v.iter_mut() {
            let next = *limb >> 63;
            *limb = (*limb << 1) | carry;
            carry = next;
        }
        let ge = v.iter().rev().zip(P.iter().rev()).find(|(a, b)| a != b).is_none_or(|(a, b)| a > b);
        if ge {
            let mut borrow = 0u64;
            for (limb, p) in v.iter_mut().zip(P) {
                let (d1, b1) = limb.overflowing_sub(p);
                let (d2, b2) = d1.overflowing_sub(borrow);
                *limb = d2;
                borrow = u64::from(b1 || b2);
            }
        }
    }
    let mut out = [0u8; 48];
    for (i, limb) in v.iter().enumerate() {
        out[8 * i..8 * i + 8].copy_from_slice(&limb.to_le_bytes());
    }
    out
}

/// A little-endian reader over an encoding (the machine key's format, as
/// `docs/wrapping.md` gives it).
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
    fn u16(&mut self) -> usize {
        u16::from_le_bytes(self.take(2).try_into().unwrap()) as usize
    }
    fn u32(&mut self) -> usize {
        u32::from_le_bytes(self.take(4).try_into().unwrap()) as usize
    }
    fn bytes16(&mut self) -> &'a [u8] {
        let n = self.u16();
        self.take(n)
    }
}

/// The secret points' coordinates (48 bytes big-endian each) in a machine
/// key file: every attribute key's k1 (G2), k2 and k3 (G1).
fn secret_coordinates(machine_key: &[u8]) -> Vec<[u8; 48]> {
    let mut r = Cursor(machine_key);
    assert_eq!(r.take(4), b"KFM2");
    r.take(32);
    for _ in 0..r.u16() {
        r.bytes16();
        r.bytes16();
    }
    let mut out = Vec::new();
    let mut points = |matrix: &[u8], width: usize| {
        // rows u16, cols u16, then the points.
        for p in matrix[4..].chunks(width) {
            assert_eq!(p.len(), width);
            out.extend(p.chunks(48).map(|c| <[u8; 48]>::try_from(c).unwrap()));
        }
    };
    for _ in 0..r.u16() {
        r.take(4);
        let n = r.u32();
        let mut k = Cursor(r.take(n));
        k.bytes16();
        points(k.bytes16(), 192);
        points(k.bytes16(), 96);
        for _ in 0..2 {
            for _ in 0..k.u16() {
                k.bytes16();
                points(k.bytes16(), 96);
            }
        }
        assert!(k.0.is_empty(), "the attribute key was read to its end");
    }
    assert!(r.0.is_empty(), "the machine key was read to its end");
    out
}

/// What to look for: each coordinate as encoded and as blst holds it.
fn needles(machine_key: &[u8]) -> Vec<(String, Vec<u8>)> {
    let coordinates = secret_coordinates(machine_key);
    assert!(coordinates.len() >= 3 * 4 + 4 * 2, "k1 and k2 at least");
    let mut out = Vec::new();
    for (i, c) in coordinates.iter().enumerate() {
        assert!(c.iter().any(|&b| b != 0));
        out.push((format!("coordinate {i}, encoded"), c.to_vec()));
        out.push((format!("coordinate {i}, blst limbs"), montgomery(c).to_vec()));
    }
    out
}

/// The needles found in process `pid`'s readable memory.
fn search_memory(pid: u32, needles: &[(String, Vec<u8>)]) -> Vec<String> {
    // Every occurrence of a needle covers one 8-aligned word of the
    // haystack at some offset 0..8 into the needle: index those words.
    let mut index: HashMap<[u8; 8], Vec<(usize, usize)>> = HashMap::new();
    for (n, (_, bytes)) in needles.iter().enumerate() {
        for i in 0..8 {
            index.entry(bytes[i..i + 8].try_into().unwrap()).or_default().push((n, i));
        }
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("reading the server's memory needs root or its user");
    let mut found = vec![false; needles.len()];
    let mut read_any = 0usize;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else { continue };
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let (start, end) = range.split_once('-').unwrap();
        let (start, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
        let mut region = vec![0u8; (end - start) as usize];
        if mem.seek(SeekFrom::Start(start)).is_err() || mem.read_exact(&mut region).is_err() {
            continue;
        }
        read_any += region.len();
        for (w, word) in region.chunks_exact(8).enumerate() {
            let Some(hits) = index.get(word) else { continue };
            for &(n, i) in hits {
                let at = (w * 8).checked_sub(i);
                let bytes = &needles[n].1;
                if at.is_some_and(|at| region.get(at..at + bytes.len()) == Some(&bytes[..])) {
                    found[n] = true;
                }
            }
        }
    }
    assert!(read_any > 1 << 20, "read only {read_any} bytes of the server's memory");
    needles.iter().zip(found).filter(|(_, f)| *f).map(|((name, _), _)| name.clone()).collect()
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `keyfence serve` (with `extra` arguments), waits until it holds
/// its key and listens, and returns it.
fn serve(d: &Dir, extra: &[&str], log: &str) -> Server {
    let log_file = std::fs::File::create(d.0.join(log)).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyfence"))
        .args(["serve", "--listen", "127.0.0.1:0", "--name", "sfo1", "--seconds", "60", "--threads", "1"])
        .args(["--cert", &d.p("sfo1.pem"), "--key", &d.p("sfo1.key"), "--ca", &d.p("ca.pem")])
        .args(["--store", &d.p("store"), "--machine-key", &d.p("sfo1.machine"), "--envelopes", &d.p("key.env")])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening "), "the server said {line:?}");
    let log = std::fs::read_to_string(d.0.join(log)).unwrap();
    assert!(log.contains("holding"), "the server does not hold the key: {log}");
    server
}

#[test]
fn an_isolated_server_holds_none_of_the_machine_keys_secret() {
    let d = Dir::new("isolation-memory");
    pki(&d, &["sfo1"]);
    let store = d.p("store");
    ok(&["authority", "init", "--store", &store]);
    ok(&["authority", "issue", "--store", &store, "--attrs", "country=US,region=NA", "--out", &d.p("sfo1.machine")]);
    openssl(&d, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "key.pem"]);
    ok(&["authority", "wrap", "--store", &store, "--policy", "country: US", "--in", &d.p("key.pem"), "--out", &d.p("key.env")]);
    let needles = needles(&std::fs::read(d.0.join("sfo1.machine")).unwrap());

    // The control: a server that opens its keys itself holds the machine
    // key, and the search sees it.
    let plain = serve(&d, &[], "plain.log");
    let found = search_memory(plain.0.id(), &needles);
    eprintln!("not isolated: {} of {} needles found", found.len(), needles.len());
    assert!(found.iter().any(|n| n.ends_with("blst limbs")), "the search found nothing in a server that holds the key");
    drop(plain);

    let isolated = serve(&d, &["--isolated"], "isolated.log");
    let found = search_memory(isolated.0.id(), &needles);
    assert!(found.is_empty(), "the isolated server's memory holds the machine key's secret: {found:?}");
}
