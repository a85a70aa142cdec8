//! Golden bytes of both protocols' frames, the key process's
//! (`docs/isolation.md`) and the key server's (`docs/remote.md`): every
//! message either side writes, pinned byte for byte, so that moving the
//! codec between modules (issue 31) is proven not to change the wire.
//! Written against the public paths the protocols have always had.

use std::time::Duration;

use keyfence::sign::key_process::protocol as kp;
use keyfence::sign::remote::protocol as rp;
use keyfence::sign::{Algorithm, Input, KeyKind, Operation};
use zeroize::Zeroizing;

fn ops() -> [Operation; 3] {
    [
        Operation::Sign { alg: Algorithm::RsaPssSha256, input: Input::Message(b"hi".to_vec()) },
        Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: Input::Digest(vec![0xCC; 4]) },
        Operation::DecryptRaw { ciphertext: vec![0xDD; 3] },
    ]
}

fn frame(kind: u8, id: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    kp::encode(&mut out, kind, id, &[body]);
    out
}

/// Every key-process message, named.
fn key_process_messages() -> Vec<(String, Vec<u8>)> {
    let mut m: Vec<(String, Vec<u8>)> = vec![
        ("hello request".into(), frame(kp::kind::HELLO, 0, &kp::hello_request(64))),
        ("hello reply".into(), frame(kp::kind::HELLO, 0, &kp::hello_reply(0x0102_0304, 7))),
        ("load file".into(), frame(kp::kind::LOAD, 3, &kp::load_request(77, &kp::LoadBody::File("/k".into())))),
        ("load bytes".into(), frame(kp::kind::LOAD, 3, &kp::load_request(77, &kp::LoadBody::Bytes(Zeroizing::new(b"PEM".to_vec()))))),
        ("load agent envelope".into(), frame(kp::kind::LOAD, 3, &kp::load_request(77, &kp::LoadBody::AgentEnvelope(b"KFE2".to_vec())))),
        ("unload".into(), frame(kp::kind::UNLOAD, 4, &kp::unload_request(77))),
        ("drop privileges".into(), frame(kp::kind::DROP_PRIVILEGES, 5, &kp::drop_privileges_request(1000, 1001))),
        ("status request".into(), frame(kp::kind::STATUS, 6, &[])),
        ("status reply".into(), frame(kp::kind::OK, 6, &kp::Status { pid: 1, uid: 2, gid: 3, flags: 7, keys: 4, in_flight: 5 }.encode())),
    ];
    for (i, op) in ops().iter().enumerate() {
        let mut out = Vec::new();
        kp::encode_op(&mut out, 10 + i as u64, 77, Duration::from_micros(1500), op);
        m.push((format!("op {i}"), out));
    }
    for (i, kind) in [KeyKind::Rsa { bits: 3072 }, KeyKind::EcP256, KeyKind::EcP384, KeyKind::Ed25519].into_iter().enumerate() {
        m.push((format!("loaded {i}"), frame(kp::kind::OK, 3, &kp::loaded_reply(kind, b"der"))));
    }
    m.push(("error".into(), frame(kp::kind::ERR, 9, &kp::error_body(kp::parse_error(&[6]).0, "no"))));
    m
}

/// Every key-server message, named.
fn key_server_messages() -> Vec<(String, Vec<u8>)> {
    let head = rp::Head { key_id: [0xAA; 32], budget: Duration::from_micros(0x0102_0304), trace_id: [0xBB; 16], tenant: 5 };
    let mut m: Vec<(String, Vec<u8>)> = vec![
        ("hello request".into(), frame(rp::kind::HELLO, 0, &rp::hello_request())),
        ("hello reply".into(), frame(rp::kind::HELLO, 0, &rp::hello_reply(256))),
        ("public reply".into(), frame(rp::kind::OK, 2, &rp::public_reply(KeyKind::EcP384, b"der"))),
    ];
    let mut out = Vec::new();
    rp::encode_ping(&mut out, 1);
    m.push(("ping".into(), out));
    let mut out = Vec::new();
    rp::encode_public(&mut out, 2, &head);
    m.push(("public".into(), out));
    for (i, op) in ops().iter().enumerate() {
        let mut out = Vec::new();
        rp::encode_op(&mut out, 10 + i as u64, &head, op);
        m.push((format!("op {i}"), out));
    }
    m.push(("error".into(), frame(rp::kind::ERR, 9, &rp::error_body(rp::parse_error(&[13]).0, "no"))));
    m
}

const KEY_PROCESS: &[(&str, &str)] = &[
    ("hello request", "000000130100000000000000004b464b50000100000040"),
    ("hello reply", "000000170100000000000000004b464b5000010102030400000007"),
    ("load file", "00000018020000000000000003000000000000004d01000000022f6b"),
    ("load bytes", "00000019020000000000000003000000000000004d030000000350454d"),
    ("load agent envelope", "0000001a020000000000000003000000000000004d05000000044b464532"),
    ("unload", "00000011030000000000000004000000000000004d"),
    ("drop privileges", "00000011050000000000000005000003e8000003e9"),
    ("status request", "00000009060000000000000006"),
    ("status reply", "00000021800000000000000006000000010000000200000003000000070000000400000005"),
    ("op 0", "0000001a04000000000000000a000000000000004d000005dc0108046869"),
    ("op 1", "0000001c04000000000000000b000000000000004d000005dc020403cccccccc"),
    ("op 2", "0000001b04000000000000000c000000000000004d000005dc030000dddddd"),
    ("loaded 0", "00000013800000000000000003010c0000000003646572"),
    ("loaded 1", "0000001380000000000000000302010000000003646572"),
    ("loaded 2", "0000001380000000000000000303018000000003646572"),
    ("loaded 3", "000000138000000000000000030400ff00000003646572"),
    ("error", "0000000c810000000000000009066e6f"),
];

const KEY_SERVER: &[(&str, &str)] = &[
    ("hello request", "0000000f0100000000000000004b4652530001"),
    ("hello reply", "000000130100000000000000004b465253000100000100"),
    ("public reply", "0000001380000000000000000203018000000003646572"),
    ("ping", "00000009070000000000000001"),
    ("public", "00000045080000000000000002aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa01020304bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb0000000000000005"),
    ("op 0", "0000004a04000000000000000aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa01020304bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb00000000000000050108046869"),
    ("op 1", "0000004c04000000000000000baaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa01020304bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb0000000000000005020403cccccccc"),
    ("op 2", "0000004b04000000000000000caaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa01020304bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb0000000000000005030000dddddd"),
    ("error", "0000000c8100000000000000090d6e6f"),
];

fn check(got: Vec<(String, Vec<u8>)>, want: &[(&str, &str)]) {
    let got: Vec<(String, String)> = got.into_iter().map(|(n, b)| (n, hex::encode(b))).collect();
    let want: Vec<(String, String)> = want.iter().map(|(n, h)| (n.to_string(), h.to_string())).collect();
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w, "the {} message changed on the wire", w.0);
    }
    assert_eq!(got.len(), want.len());
}

#[test]
fn key_process_messages_are_byte_for_byte_the_same() {
    check(key_process_messages(), KEY_PROCESS);
    // The LOAD sources that named a store (2, an envelope file; 4, an
    // envelope's bytes), which older clients sent: refused, saying why.
    for old in ["000000000000004d02000000022f73000000022f6d000000022f65", "000000000000004d04000000022f73000000022f6d000000044b464532"] {
        let err = kp::parse_load_request(&hex::decode(old).unwrap()).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("name a store"), "{err}");
    }
}

#[test]
fn key_server_messages_are_byte_for_byte_the_same() {
    check(key_server_messages(), KEY_SERVER);
}

/// The first byte of an ERR body, as each side reads it: a key process's
/// client knows codes 1 to 9, 13 (`NOT_ALLOWED`, which a key agent
/// sends to a user it does not admit; an older client reads it as
/// `internal`) and 14 and 15 (a PKCS#11 token's `TOKEN_UNAVAILABLE` and
/// `TOKEN_LOGIN`), a key server's 1, 2, 4 to 7 and 9 to 15, and each
/// reads any other byte as `internal` (9).
#[test]
fn error_codes_read_as_they_always_have() {
    let key_process: Vec<u8> = (0..=17).map(|b| kp::parse_error(&[b]).0 as u8).collect();
    assert_eq!(key_process, [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9, 13, 14, 15, 9, 9]);
    let key_server: Vec<(u8, &str)> = (0..=17)
        .map(|b| {
            let c = rp::parse_error(&[b]).0;
            (c as u8, c.name())
        })
        .collect();
    assert_eq!(
        key_server,
        [
            (9, "internal"),
            (1, "malformed"),
            (2, "unknown_key"),
            (9, "internal"),
            (4, "crypto"),
            (5, "timed_out"),
            (6, "overloaded"),
            (7, "invalid"),
            (9, "internal"),
            (9, "internal"),
            (10, "tenant_limit"),
            (11, "version"),
            (12, "shutting_down"),
            (13, "not_allowed"),
            (14, "token_unavailable"),
            (15, "token_login"),
            (9, "internal"),
            (9, "internal"),
        ]
    );
    assert_eq!(kp::parse_error(&[]), (kp::parse_error(&[9]).0, "an empty error reply".into()));
    assert_eq!(rp::parse_error(b"\x07why"), (rp::parse_error(&[7]).0, "why".into()));
}
