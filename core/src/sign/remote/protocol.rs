//! The remote signing protocol, version 1: what a client and a key server
//! say to each other over mutual TLS.
//!
//! It speaks the frames of [`crate::sign::wire`], as the key process does,
//! and shares with it the hello's shape, the operation in an OP body, a
//! key's description and the ERR body with its codes; every frame is
//!
//! ```text
//! frame   = length:u32  kind:u8  id:u64  body        (big-endian)
//! length  = 9 + len(body), at most MAX_FRAME (1 MiB)
//! ```
//!
//! The client chooses each request's id; the reply carries the same id and
//! replies come in any order (an RSA signature never holds up an ECDSA
//! reply on the same connection). Every key request carries a head:
//!
//! ```text
//! head    = key_id:[32]  budget_us:u32  trace_id:[16]  tenant:u64
//! ```
//!
//! - `key_id`: SHA-256 of the envelope the key is wrapped in. Every machine
//!   has the replicated envelopes, so the client names a key it cannot open
//!   without opening it, and the server finds the key it opened at start.
//! - `budget_us`: the time the caller still waits, in microseconds, from
//!   when the client wrote the request. The server drops work whose budget
//!   has run out instead of signing for nobody, and never needs the two
//!   clocks to agree.
//! - `trace_id`: the client's trace id for this operation; the server's
//!   spans carry it, so one slow request can be followed across the hop.
//! - `tenant`: kept so the bytes stay the same for every client, and
//!   ignored by the server: a client's tenant is what its certificate
//!   says (see `docs/remote.md`, "Tenants"), never what its frames say.
//!
//! `docs/remote.md` has the full message table. As in the key process, a
//! length word out of range ends the connection (the stream cannot be
//! resynchronised); any other malformed frame gets an ERR reply with
//! [`RemoteErrorCode::Malformed`].
//!
//! Nothing here needs AWS-LC: with the `testing` feature this module
//! builds without `sign`, for the fuzzer. The framing items are
//! re-exported here, so that this module is all a user of the protocol
//! names.

use std::time::Duration;

use crate::codec::{Order, Reader, Writer};
use crate::sign::types::Operation;
use crate::sign::wire::frame::reader;
pub use crate::sign::wire::public_key::{encode as public_reply, parse as parse_public_reply};
/// Why a server refused a request: the codes of [`crate::sign::wire`],
/// of which a server [`sends`] all but two.
pub use crate::sign::wire::ErrorCode as RemoteErrorCode;
pub use crate::sign::wire::{encode, error_body, error_body_with, BodyError, Decoder, Detail, Frame, FramingError, HEADER, MAX_FRAME};
use crate::sign::wire::{hello, op};

/// The first bytes of both hellos (not the key process's `KFKP`: a client
/// pointed at the wrong port learns it from the first reply).
pub const MAGIC: [u8; 4] = *b"KFRS";
/// The protocol version this library speaks.
pub const VERSION: u16 = 1;
/// The bytes of a request head.
pub const HEAD: usize = 32 + 4 + 16 + 8;
/// The bytes of an OP body before its data: head, code, algorithm.
pub const OP_HEAD: usize = HEAD + op::OP_CODE_LEN;
/// The longest message, digest or ciphertext one OP frame carries; the
/// client hashes longer messages itself.
pub const MAX_OP_DATA: usize = MAX_FRAME - HEADER - OP_HEAD;
/// The most requests in flight a server may announce for one connection.
pub const MAX_IN_FLIGHT: u32 = 65_536;

/// Frame kinds: the shared ones (HELLO, OP, OK, ERR; the client's hello
/// carries nothing after the version, the server's its max in flight per
/// connection; an OP is a head, then the operation), and the remote
/// protocol's own requests.
pub mod kind {
    pub use crate::sign::wire::kind::*;
    /// Round-trip probe; answered OK with an empty body.
    pub const PING: u8 = 0x07;
    /// Asks for a key's kind and public key: head only.
    pub const PUBLIC: u8 = 0x08;
}

/// Whether a key server sends `code` in an ERR reply (all but the key
/// process's own 3 and 8, `docs/remote.md`); a client reads any other as
/// [`RemoteErrorCode::Internal`].
pub fn sends(code: RemoteErrorCode) -> bool {
    !matches!(code, RemoteErrorCode::Load | RemoteErrorCode::Privileges)
}

/// The body of a client hello.
pub fn hello_request() -> Vec<u8> {
    hello::hello(MAGIC, VERSION, &[])
}

/// Decodes a client hello.
///
/// # Errors
/// [`BodyError`] for a wrong magic or length; a version other than
/// [`VERSION`] is `Err(BodyError::Value("hello version"))`, which the
/// server answers with [`RemoteErrorCode::Version`].
pub fn parse_hello_request(body: &[u8]) -> Result<(), BodyError> {
    hello::parse_hello(body, MAGIC, VERSION, []).map(|[]| ())
}

/// The body of the server's hello: how many requests a connection may
/// have in flight.
pub fn hello_reply(max_in_flight: u32) -> Vec<u8> {
    hello::hello(MAGIC, VERSION, &[max_in_flight])
}

/// Decodes the server's hello: its per-connection in-flight bound.
///
/// # Errors
/// [`BodyError`] for a wrong magic, version, length, or a bound of zero or
/// above [`MAX_IN_FLIGHT`].
pub fn parse_hello_reply(body: &[u8]) -> Result<u32, BodyError> {
    let [max] = hello::parse_hello(body, MAGIC, VERSION, ["hello max_in_flight"])?;
    if max == 0 || max > MAX_IN_FLIGHT {
        return Err(BodyError::Value("hello max_in_flight (1 to 65536)"));
    }
    Ok(max)
}

/// The head every key request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// SHA-256 of the key's envelope.
    pub key_id: [u8; 32],
    /// What is left of the caller's deadline when the request was written
    /// (whole microseconds, at most about 71 minutes).
    pub budget: Duration,
    /// The operation's trace id.
    pub trace_id: [u8; 16],
    /// A tenant id the client may send; servers ignore it and take the
    /// tenant from the client's certificate.
    pub tenant: u64,
}

impl Head {
    fn write(&self, w: &mut Writer) {
        let us = u32::try_from(self.budget.as_micros()).unwrap_or(u32::MAX);
        w.raw(&self.key_id).u32(us).raw(&self.trace_id).u64(self.tenant);
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, BodyError> {
        Ok(Head {
            key_id: r.array("key id")?,
            budget: Duration::from_micros(u64::from(r.u32("budget")?)),
            trace_id: r.array("trace id")?,
            tenant: r.u64("tenant")?,
        })
    }

    /// The trace id in hexadecimal, as spans show it.
    pub fn trace_hex(&self) -> String {
        self.trace_id.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A request as the server decodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// A round-trip probe.
    Ping,
    /// The kind and public key of a key.
    Public(Head),
    /// A private-key operation.
    Op(Head, Operation),
}

/// Appends a PING frame to `out`.
pub fn encode_ping(out: &mut Vec<u8>, id: u64) {
    encode(out, kind::PING, id, &[]);
}

/// Appends a PUBLIC frame to `out`.
pub fn encode_public(out: &mut Vec<u8>, id: u64, head: &Head) {
    let mut w = Writer::new(Order::Big);
    head.write(&mut w);
    encode(out, kind::PUBLIC, id, &[&w.into_bytes()]);
}

/// Appends an OP frame to `out`. The caller keeps `op`'s data within
/// [`MAX_OP_DATA`] (longer messages are hashed first).
pub fn encode_op(out: &mut Vec<u8>, id: u64, head: &Head, op: &Operation) {
    let mut w = Writer::new(Order::Big);
    head.write(&mut w);
    let data = op::write(&mut w, op);
    encode(out, kind::OP, id, &[&w.into_bytes(), data]);
}

/// Decodes a request frame: the server's one entry point for what a peer
/// sends after the hello.
///
/// # Errors
/// [`BodyError`] naming the field, or `Value("frame kind")` for a kind that
/// is not a request.
pub fn parse_request(frame: &Frame) -> Result<Request, BodyError> {
    let mut r = reader(&frame.body);
    match frame.kind {
        kind::PING => {
            r.finish_as("ping (trailing bytes)")?;
            Ok(Request::Ping)
        }
        kind::PUBLIC => {
            let head = Head::read(&mut r)?;
            r.finish_as("public (trailing bytes)")?;
            Ok(Request::Public(head))
        }
        kind::OP => {
            let head = Head::read(&mut r)?;
            Ok(Request::Op(head, op::read(&mut r)?))
        }
        _ => Err(BodyError::Value("frame kind (not a request)")),
    }
}

/// Decodes an ERR reply: a code a server does not send reads as
/// [`RemoteErrorCode::Internal`].
pub fn parse_error(body: &[u8]) -> (RemoteErrorCode, String) {
    crate::sign::wire::parse_error(body, sends)
}

/// [`parse_error`] with the reply's [`Detail`].
pub fn parse_error_with(body: &[u8]) -> (RemoteErrorCode, String, Detail) {
    crate::sign::wire::parse_error_with(body, sends)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::types::{Algorithm, Input};
    use zeroize::Zeroizing;

    fn head() -> Head {
        Head { key_id: [7; 32], budget: Duration::from_micros(1500), trace_id: [9; 16], tenant: 42 }
    }

    fn frames(wire: &[u8]) -> Vec<Frame> {
        let mut d = Decoder::new();
        d.push(wire);
        std::iter::from_fn(|| d.next_frame().unwrap()).collect()
    }

    #[test]
    fn requests_round_trip() {
        let mut wire = Vec::new();
        encode_ping(&mut wire, 1);
        encode_public(&mut wire, 2, &head());
        let op = Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: Input::Message(b"hi".to_vec()) };
        encode_op(&mut wire, 3, &head(), &op);
        let raw = Operation::DecryptRaw { ciphertext: vec![1; 256] };
        encode_op(&mut wire, 4, &head(), &raw);
        let f = frames(&wire);
        assert_eq!(f.iter().map(|f| f.id).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(parse_request(&f[0]), Ok(Request::Ping));
        assert_eq!(parse_request(&f[1]), Ok(Request::Public(head())));
        assert_eq!(parse_request(&f[2]), Ok(Request::Op(head(), op)));
        assert_eq!(parse_request(&f[3]), Ok(Request::Op(head(), raw)));
    }

    #[test]
    fn the_wire_format_is_the_documented_one() {
        // docs/remote.md: big-endian; head = key id, budget, trace id, tenant.
        let mut wire = Vec::new();
        let h = Head { key_id: [0xAA; 32], budget: Duration::from_millis(2), trace_id: [0xBB; 16], tenant: 3 };
        let op = Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: Input::Digest(vec![0xCC; 32]) };
        encode_op(&mut wire, 5, &h, &op);
        let mut want = vec![0, 0, 0, (9 + OP_HEAD + 32) as u8, kind::OP, 0, 0, 0, 0, 0, 0, 0, 5];
        want.extend([0xAA; 32]);
        want.extend(2000u32.to_be_bytes());
        want.extend([0xBB; 16]);
        want.extend(3u64.to_be_bytes());
        want.extend([2, 0x04, 0x03]);
        want.extend([0xCC; 32]);
        assert_eq!(wire, want);
        assert_eq!(hello_request(), b"KFRS\x00\x01");
        assert_eq!(hello_reply(256), b"KFRS\x00\x01\x00\x00\x01\x00");
    }

    #[test]
    fn bad_hellos_and_bodies_are_errors() {
        assert!(parse_hello_request(b"KFRS\x00\x02").is_err(), "version 2");
        assert!(parse_hello_request(b"KFKP\x00\x01").is_err(), "the key process's magic");
        assert!(parse_hello_request(b"KFRS\x00\x01\x00").is_err(), "trailing");
        assert_eq!(parse_hello_request(&hello_request()), Ok(()));
        assert!(parse_hello_reply(&hello_reply(0)).is_err());
        assert!(parse_hello_reply(&hello_reply(MAX_IN_FLIGHT + 1)).is_err());
        assert_eq!(parse_hello_reply(&hello_reply(9)), Ok(9));
        let frame = |kind, body: &[u8]| Frame { kind, id: 1, body: Zeroizing::new(body.to_vec()) };
        assert!(parse_request(&frame(kind::PING, &[0])).is_err());
        assert!(parse_request(&frame(kind::PUBLIC, &[0; HEAD - 1])).is_err());
        assert!(parse_request(&frame(kind::PUBLIC, &[0; HEAD + 1])).is_err());
        assert!(parse_request(&frame(kind::OP, &[0; HEAD + 2])).is_err(), "short op");
        let mut op = vec![0; HEAD];
        op.extend([9, 0, 0]);
        assert!(parse_request(&frame(kind::OP, &op)).is_err(), "unknown op code");
        let mut op = vec![0; HEAD];
        op.extend([1, 0x12, 0x34]);
        assert!(parse_request(&frame(kind::OP, &op)).is_err(), "unknown algorithm");
        let mut op = vec![0; HEAD];
        op.extend([3, 0x04, 0x03]);
        assert!(parse_request(&frame(kind::OP, &op)).is_err(), "decrypt with an algorithm");
        assert!(parse_request(&frame(kind::OK, &[])).is_err(), "a reply is not a request");
        assert!(parse_request(&frame(kind::HELLO, &hello_request())).is_err(), "a second hello");
        assert_eq!(parse_error(&error_body(RemoteErrorCode::TenantLimit, "full")), (RemoteErrorCode::TenantLimit, "full".into()));
        assert_eq!(parse_error(&[]).0, RemoteErrorCode::Internal);
        assert_eq!(parse_error(&[200]).0, RemoteErrorCode::Internal);
        for c in RemoteErrorCode::ALL {
            assert_eq!(RemoteErrorCode::from_u8(c as u8), c);
        }
    }

    #[test]
    fn budgets_saturate_instead_of_wrapping() {
        let mut wire = Vec::new();
        let h = Head { budget: Duration::from_secs(1 << 40), ..head() };
        encode_public(&mut wire, 1, &h);
        let Request::Public(back) = parse_request(&frames(&wire)[0]).unwrap() else { panic!() };
        assert_eq!(back.budget, Duration::from_micros(u64::from(u32::MAX)));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Whatever a peer sends, in whatever pieces, the decoder and the
        /// request parser answer with frames or errors, never a panic.
        #[test]
        fn any_bytes_never_panic(
            noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            edits in proptest::collection::vec((0usize..400, proptest::prelude::any::<u8>()), 0..8),
            cuts in proptest::collection::vec(0usize..400, 0..6),
            from_valid in proptest::prelude::any::<bool>(),
        ) {
            let wire = if from_valid {
                let mut w = Vec::new();
                encode(&mut w, kind::HELLO, 0, &[&hello_request()]);
                let op = Operation::Sign { alg: Algorithm::RsaPssSha256, input: Input::Message(noise.clone()) };
                encode_op(&mut w, 5, &head(), &op);
                encode_public(&mut w, 6, &head());
                encode_ping(&mut w, 7);
                w
            } else {
                noise.clone()
            };
            crate::sign::wire::frame::feed_edited(wire, &edits, &cuts, |f| {
                let _ = parse_request(f);
                let _ = parse_hello_request(&f.body);
                let _ = parse_hello_reply(&f.body);
                let _ = parse_public_reply(&f.body);
                let _ = parse_error(&f.body);
            });
        }
    }
}
