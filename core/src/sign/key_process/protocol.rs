//! The key-process protocol, version 1: its messages.
//!
//! Both directions carry the frames of [`crate::sign::wire`], which also
//! holds what this protocol shares with the key server's (the hello's
//! shape, the operation in an OP body, a key's description, the ERR body
//! and its codes):
//!
//! ```text
//! frame   = length:u32  kind:u8  id:u64  body        (big-endian)
//! length  = 9 + len(body), at most MAX_FRAME
//! ```
//!
//! Requests carry an id the client chooses; the reply to a request carries
//! the same id, and replies come in any order (the key process answers each
//! operation as soon as it is done). `docs/isolation.md` has the full
//! message table. A frame whose length is out of range cannot be skipped
//! safely, so the reader closes the connection; any other malformed frame
//! gets an [`ErrorCode::Malformed`] reply.
//!
//! Every field is read and written with the crate's one checked codec
//! ([`crate::codec`], big-endian). Nothing here needs AWS-LC: with the
//! `testing` feature this module builds without `sign`, for the fuzzer.
//! The framing items are re-exported here, so that this module is all a
//! user of the protocol names.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use zeroize::Zeroizing;

use crate::codec::{Order, Writer};
use crate::sign::types::Operation;
use crate::sign::wire::frame::reader;
pub use crate::sign::wire::public_key::{encode as loaded_reply, parse as parse_loaded_reply};
pub use crate::sign::wire::{encode, error_body, error_body_with, BodyError, Decoder, Detail, ErrorCode, Frame, HEADER, MAX_FRAME};
use crate::sign::wire::{hello, op};

/// The first bytes of both hellos.
pub const MAGIC: [u8; 4] = *b"KFKP";
/// The protocol version this library speaks.
pub const VERSION: u16 = 1;
/// The largest `max_in_flight` a client may ask for in its hello: each
/// request in flight holds up to a frame of memory in the key process,
/// and a peer must not be able to make that unbounded.
pub const MAX_IN_FLIGHT: u32 = 4096;
/// The bytes of an OP body before its data: key id, timeout, code,
/// algorithm.
pub const OP_HEAD: usize = 8 + 4 + op::OP_CODE_LEN;
/// The longest message, digest or ciphertext one OP frame carries. The
/// client hashes longer messages itself (for algorithms with a hash) and
/// refuses the rest at submission: a frame over [`MAX_FRAME`] would end
/// the connection and every operation in flight on it.
pub const MAX_OP_DATA: usize = MAX_FRAME - HEADER - OP_HEAD;

/// Frame kinds: the shared ones (HELLO, OP, OK, ERR; the client's hello
/// carries max in flight, the key process's its pid and hardening flags),
/// and the key process's own requests.
pub mod kind {
    pub use crate::sign::wire::kind::*;
    /// Load a key under a client-chosen id.
    pub const LOAD: u8 = 0x02;
    /// Forget a key.
    pub const UNLOAD: u8 = 0x03;
    /// Drop privileges to a user and group.
    pub const DROP_PRIVILEGES: u8 = 0x05;
    /// Ask for the process's status.
    pub const STATUS: u8 = 0x06;
    /// Ask an agent for its own status as JSON (`keyfence agent status`):
    /// its machine key's standing, its store, keys and connections.
    pub const AGENT_STATUS: u8 = 0x07;
    /// Make a call the sandbox forbids (test builds only): the sandbox
    /// kills the key process.
    #[cfg(feature = "testing")]
    pub const TEST_FORBIDDEN_CALL: u8 = 0x7e;
    /// Try to create the file the body names (test builds only): the
    /// reply's one byte says whether it was created.
    #[cfg(feature = "testing")]
    pub const TEST_CREATE_FILE: u8 = 0x7d;

    /// Every request this protocol defines, whichever service takes it: a
    /// service refuses one its table leaves out as not allowed, and any
    /// other kind as malformed.
    #[cfg(not(feature = "testing"))]
    pub const REQUESTS: &[u8] = &[OP, LOAD, UNLOAD, DROP_PRIVILEGES, STATUS, AGENT_STATUS];
    /// Every request this protocol defines, whichever service takes it,
    /// with the test builds' own.
    #[cfg(feature = "testing")]
    pub const REQUESTS: &[u8] = &[OP, LOAD, UNLOAD, DROP_PRIVILEGES, STATUS, AGENT_STATUS, TEST_FORBIDDEN_CALL, TEST_CREATE_FILE];
}

/// Hardening the key process confirms in its hello.
pub mod flags {
    /// `PR_SET_DUMPABLE` is 0: no core dumps, no ptrace by same-uid peers.
    pub const NOT_DUMPABLE: u32 = 1;
    /// `RLIMIT_CORE` is 0.
    pub const NO_CORE: u32 = 2;
    /// The peer's credentials were checked: it is the parent, same user
    /// (a key process), or a user the agent admits (an agent).
    pub const PEER_CHECKED: u32 = 4;
    /// The server is a key agent (`keyfence agent`): it opens envelopes
    /// with its own machine key and serves many clients.
    pub const AGENT: u32 = 8;
    /// The system call allow-list is installed: no sockets, connections,
    /// programs, io_uring or other processes' memory (`sandbox/syscalls.rs`).
    pub const SANDBOXED: u32 = 16;
    /// Landlock confines the files: nothing written outside a token
    /// module's folder, no other process's `/proc` (`sandbox/files.rs`).
    /// Without it the allow-list refuses every opening for writing.
    pub const FILES_CONFINED: u32 = 32;
    /// Every descriptor inherited from the parent but the socket pair was
    /// closed at start.
    pub const INHERITED_CLOSED: u32 = 64;
    /// Another thread was running when the sandbox was set up (a preloaded
    /// library can start one), so Landlock was not applied: why
    /// `FILES_CONFINED` is off on a kernel that has Landlock.
    pub const OTHER_THREAD: u32 = 128;
    /// The key process signs on crypto_mb's multi-buffer device what it
    /// can (RSA, ECDSA P-256 and P-384, as the library runs them here).
    pub const MULTIBUFFER: u32 = 256;
}

/// The name under which a client sends, among an envelope's objects
/// ([`LoadBody::EnvelopeObjects`]), the newest lists its machine kept
/// ([`NewestLists`](crate::wrap::NewestLists) bytes): the key process
/// requires them as a floor and writes no file itself, so the client keeps
/// the file. No store object has this name (`#` is not a store character).
pub const FLOOR_OBJECT: &str = "#floor";

/// Whether a key process or an agent sends `code` in an ERR reply (1 to
/// 9, and `NOT_ALLOWED` from an agent: `docs/isolation.md`); its client
/// reads any other as [`ErrorCode::Internal`].
pub fn sends(code: ErrorCode) -> bool {
    !matches!(code, ErrorCode::TenantLimit | ErrorCode::Version | ErrorCode::ShuttingDown)
}

/// What a LOAD request names: the key sources on the wire
/// (`docs/isolation.md`). A client makes one from the
/// [`KeySource`](super::KeySource) its caller gave; each server's table
/// says which it takes (`process/service.rs`, `agent/service.rs`). Codes 2
/// and 4, which named a store, are no longer sent: a server that is sent
/// one answers that it opens no store.
#[derive(Clone)]
pub enum LoadBody {
    /// A PEM or DER key file, read by the key process (source 1).
    File(PathBuf),
    /// Key bytes, PEM or DER (source 3).
    Bytes(Zeroizing<Vec<u8>>),
    /// An envelope, opened by an agent with its own machine key and store
    /// (source 5).
    AgentEnvelope(Vec<u8>),
    /// An envelope with the store's objects opening it reads
    /// ([`objects_for_opening`](crate::wrap::objects_for_opening): the
    /// generation list and the sealed copies of its policy key, and the
    /// machine's floor as [`FLOOR_OBJECT`]), opened with the machine key
    /// file: the key process never names a store, connects to one or reads
    /// its files, and verifies every object as the machine key's
    /// authority's (source 6).
    EnvelopeObjects {
        /// The machine key file.
        machine_key: PathBuf,
        /// The envelope.
        envelope: Vec<u8>,
        /// The store's objects, by name.
        objects: Vec<(String, Vec<u8>)>,
    },
    /// A key in a PKCS#11 token, by its RFC 7512 URI, which holds no PIN
    /// (source 7).
    Pkcs11(String),
}

/// A LOAD source by its wire code, for a server's table of what it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Source {
    /// [`LoadBody::File`].
    File = 1,
    /// [`LoadBody::Bytes`].
    Bytes = 3,
    /// [`LoadBody::AgentEnvelope`].
    AgentEnvelope = 5,
    /// [`LoadBody::EnvelopeObjects`].
    EnvelopeObjects = 6,
    /// [`LoadBody::Pkcs11`].
    Pkcs11 = 7,
}

impl LoadBody {
    /// Its source code.
    pub fn source(&self) -> Source {
        match self {
            LoadBody::File(_) => Source::File,
            LoadBody::Bytes(_) => Source::Bytes,
            LoadBody::AgentEnvelope(_) => Source::AgentEnvelope,
            LoadBody::EnvelopeObjects { .. } => Source::EnvelopeObjects,
            LoadBody::Pkcs11(_) => Source::Pkcs11,
        }
    }

    /// The bytes it holds (an envelope, its objects, a URI, key bytes),
    /// for the memory a server charges for it waiting.
    pub fn held_bytes(&self) -> usize {
        match self {
            LoadBody::AgentEnvelope(b) => b.len(),
            LoadBody::Bytes(b) => b.len(),
            LoadBody::Pkcs11(uri) => uri.len(),
            LoadBody::EnvelopeObjects { envelope, objects, .. } => {
                envelope.len() + objects.iter().map(|(n, o)| n.len() + o.len()).sum::<usize>()
            }
            LoadBody::File(p) => p.as_os_str().len(),
        }
    }
}

impl fmt::Debug for LoadBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadBody::File(p) => f.debug_tuple("File").field(p).finish(),
            LoadBody::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            LoadBody::AgentEnvelope(envelope) => write!(f, "AgentEnvelope({} bytes)", envelope.len()),
            LoadBody::Pkcs11(uri) => f.debug_tuple("Pkcs11").field(uri).finish(),
            LoadBody::EnvelopeObjects { machine_key, envelope, objects } => f
                .debug_struct("EnvelopeObjects")
                .field("machine_key", machine_key)
                .field("envelope", &format_args!("{} bytes", envelope.len()))
                .field("objects", &objects.iter().map(|(n, _)| n).collect::<Vec<_>>())
                .finish(),
        }
    }
}

#[cfg(unix)]
fn path_bytes(p: &std::path::Path) -> &[u8] {
    use std::os::unix::ffi::OsStrExt;
    p.as_os_str().as_bytes()
}

#[cfg(unix)]
fn path_from(b: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(b))
}

/// The body of a client hello.
pub fn hello_request(max_in_flight: u32) -> Vec<u8> {
    hello::hello(MAGIC, VERSION, &[max_in_flight])
}

/// Decodes a client hello: the agreed in-flight bound.
///
/// # Errors
/// [`BodyError`] for a wrong magic, version or length.
pub fn parse_hello_request(body: &[u8]) -> Result<u32, BodyError> {
    let [max] = hello::parse_hello(body, MAGIC, VERSION, ["hello max_in_flight"]).map_err(|e| match e {
        hello::WRONG_VERSION => BodyError::Value("hello version (this key process speaks version 1)"),
        e => e,
    })?;
    if max == 0 {
        return Err(BodyError::Value("hello max_in_flight (zero)"));
    }
    if max > MAX_IN_FLIGHT {
        return Err(BodyError::Value("hello max_in_flight (above 4096)"));
    }
    Ok(max)
}

/// The body of the key process's hello.
pub fn hello_reply(pid: u32, flags: u32) -> Vec<u8> {
    hello::hello(MAGIC, VERSION, &[pid, flags])
}

/// Decodes the key process's hello: its pid and hardening flags.
///
/// # Errors
/// [`BodyError`] for a wrong magic, version or length.
pub fn parse_hello_reply(body: &[u8]) -> Result<(u32, u32), BodyError> {
    let [pid, flags] = hello::parse_hello(body, MAGIC, VERSION, ["hello pid", "hello flags"])?;
    Ok((pid, flags))
}

/// The body of a LOAD request. Paths and key bytes are far below the
/// 4 GiB a length prefix can carry (a frame is at most [`MAX_FRAME`]).
pub fn load_request(key_id: u64, source: &LoadBody) -> Zeroizing<Vec<u8>> {
    let mut w = Writer::new(Order::Big);
    w.u64(key_id).u8(source.source() as u8);
    match source {
        LoadBody::File(p) => {
            w.bytes32(path_bytes(p));
        }
        LoadBody::Bytes(bytes) => {
            w.bytes32(bytes);
        }
        LoadBody::AgentEnvelope(envelope) => {
            w.bytes32(envelope);
        }
        LoadBody::Pkcs11(uri) => {
            w.bytes32(uri.as_bytes());
        }
        LoadBody::EnvelopeObjects { machine_key, envelope, objects } => {
            // At most 64 objects (`objects_for_opening`), names of a few
            // dozen bytes.
            w.bytes32(path_bytes(machine_key)).bytes32(envelope).u16(objects.len().min(u16::MAX as usize) as u16);
            for (name, value) in objects.iter().take(u16::MAX as usize) {
                w.bytes16(name.as_bytes()).bytes32(value);
            }
        }
    }
    w.into_bytes()
}

/// Decodes a LOAD request.
///
/// # Errors
/// [`BodyError`] naming the field; sources 2 and 4 (a store by its name,
/// which a client older than this one sent) are refused as such.
pub fn parse_load_request(body: &[u8]) -> Result<(u64, LoadBody), BodyError> {
    let mut r = reader(body);
    let key_id = r.u64("load key id")?;
    let source = match r.u8("load source")? {
        1 => LoadBody::File(path_from(r.bytes32("load file path")?)),
        2 | 4 => return Err(BodyError::Value(
            "load source (2 and 4 name a store, which no server opens: the client sends the envelope with the store's objects, source 6)",
        )),
        3 => LoadBody::Bytes(Zeroizing::new(r.bytes32("load key bytes")?.to_vec())),
        5 => LoadBody::AgentEnvelope(r.bytes32("load envelope bytes")?.to_vec()),
        6 => {
            let machine_key = path_from(r.bytes32("load machine key path")?);
            let envelope = r.bytes32("load envelope bytes")?.to_vec();
            let n = r.u16("load object count")?;
            let mut objects = Vec::with_capacity(usize::from(n).min(64));
            for _ in 0..n {
                let name =
                    std::str::from_utf8(r.bytes16("load object name")?).map_err(|_| BodyError::Value("load object name (not UTF-8)"))?;
                objects.push((name.to_owned(), r.bytes32("load object value")?.to_vec()));
            }
            LoadBody::EnvelopeObjects { machine_key, envelope, objects }
        }
        7 => LoadBody::Pkcs11(
            std::str::from_utf8(r.bytes32("load PKCS#11 URI")?).map_err(|_| BodyError::Value("load PKCS#11 URI (not UTF-8)"))?.to_owned(),
        ),
        _ => return Err(BodyError::Value("load source (1 file, 3 bytes, 5 agent envelope, 6 envelope with objects, 7 PKCS#11 URI)")),
    };
    r.finish_as("load (trailing bytes)")?;
    Ok((key_id, source))
}

/// The body of an UNLOAD request.
pub fn unload_request(key_id: u64) -> Vec<u8> {
    key_id.to_be_bytes().to_vec()
}

/// Decodes an UNLOAD request: the key id.
///
/// # Errors
/// [`BodyError`] unless the body is one `u64`.
pub fn parse_unload_request(body: &[u8]) -> Result<u64, BodyError> {
    let mut r = reader(body);
    let key_id = r.u64("unload key id")?;
    r.finish_as("unload (trailing bytes)")?;
    Ok(key_id)
}

/// The body of a DROP_PRIVILEGES request.
pub fn drop_privileges_request(uid: u32, gid: u32) -> Vec<u8> {
    let mut w = Writer::new(Order::Big);
    w.u32(uid).u32(gid);
    w.into_bytes().to_vec()
}

/// Decodes a DROP_PRIVILEGES request: user and group ids.
///
/// # Errors
/// [`BodyError`] unless the body is two `u32`s.
pub fn parse_drop_privileges_request(body: &[u8]) -> Result<(u32, u32), BodyError> {
    let mut r = reader(body);
    let ids = (r.u32("uid")?, r.u32("gid")?);
    r.finish_as("drop (trailing bytes)")?;
    Ok(ids)
}

/// Appends an OP frame for `op` with key `key_id` to `out`: the work must
/// start within `timeout` (rounded up to a microsecond, at most about 71
/// minutes).
pub fn encode_op(out: &mut Vec<u8>, id: u64, key_id: u64, timeout: Duration, op: &Operation) {
    let us = u32::try_from(timeout.as_micros().max(1)).unwrap_or(u32::MAX);
    let mut head = Writer::new(Order::Big);
    head.u64(key_id).u32(us);
    let data = op::write(&mut head, op);
    encode(out, kind::OP, id, &[&head.into_bytes(), data]);
}

/// Decodes an OP request: key id, time allowed, operation.
///
/// # Errors
/// [`BodyError`] naming the field.
pub fn parse_op(body: &[u8]) -> Result<(u64, Duration, Operation), BodyError> {
    let mut r = reader(body);
    let key_id = r.u64("op key id")?;
    let timeout = Duration::from_micros(u64::from(r.u32("op timeout")?));
    Ok((key_id, timeout, op::read(&mut r)?))
}

/// Decodes an ERR reply: a code the key process does not send reads as
/// [`ErrorCode::Internal`].
pub fn parse_error(body: &[u8]) -> (ErrorCode, String) {
    crate::sign::wire::parse_error(body, sends)
}

/// [`parse_error`] with the reply's [`Detail`].
pub fn parse_error_with(body: &[u8]) -> (ErrorCode, String, Detail) {
    crate::sign::wire::parse_error_with(body, sends)
}

/// The body of a STATUS reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// The key process's pid.
    pub pid: u32,
    /// Its real user id.
    pub uid: u32,
    /// Its real group id.
    pub gid: u32,
    /// The hardening flags it confirms.
    pub flags: u32,
    /// Keys loaded.
    pub keys: u32,
    /// Operations in flight on this connection.
    pub in_flight: u32,
}

impl Status {
    /// Encodes the status.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new(Order::Big);
        for v in [self.pid, self.uid, self.gid, self.flags, self.keys, self.in_flight] {
            w.u32(v);
        }
        w.into_bytes().to_vec()
    }

    /// Decodes a status.
    ///
    /// # Errors
    /// A `BodyError` unless the body is six `u32`s.
    pub fn parse(body: &[u8]) -> Result<Self, BodyError> {
        let mut r = reader(body);
        let s = Status {
            pid: r.u32("status pid")?,
            uid: r.u32("status uid")?,
            gid: r.u32("status gid")?,
            flags: r.u32("status flags")?,
            keys: r.u32("status keys")?,
            in_flight: r.u32("status in_flight")?,
        };
        r.finish_as("status (trailing bytes)")?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::types::{Algorithm, Input, KeyKind};
    use crate::sign::wire::FramingError;

    #[test]
    fn frames_round_trip_through_any_split() {
        let mut wire = Vec::new();
        encode(&mut wire, kind::HELLO, 0, &[&hello_request(64)]);
        let op = Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: Input::Digest(vec![7; 32]) };
        encode_op(&mut wire, 5, 9, Duration::from_millis(3), &op);
        encode(&mut wire, kind::ERR, 6, &[&error_body(ErrorCode::Busy, "busy")]);
        for split in 0..wire.len() {
            let mut d = Decoder::new();
            let mut frames = Vec::new();
            for chunk in [&wire[..split], &wire[split..]] {
                d.push(chunk);
                while let Some(f) = d.next_frame().unwrap() {
                    frames.push(f);
                }
            }
            assert_eq!(frames.len(), 3, "split at {split}");
            assert_eq!(parse_hello_request(&frames[0].body).unwrap(), 64);
            assert_eq!(frames[1].id, 5);
            assert_eq!(parse_op(&frames[1].body).unwrap(), (9, Duration::from_millis(3), op.clone()));
            assert_eq!(parse_error(&frames[2].body), (ErrorCode::Busy, "busy".into()));
        }
    }

    #[test]
    fn debug_of_a_frame_shows_the_body_length_not_the_body() {
        let f = Frame { kind: kind::OK, id: 7, body: Zeroizing::new(vec![0xA5; 48]) };
        let shown = format!("{f:?}");
        assert_eq!(shown, "Frame { kind: 0x80, id: 7, body_len: 48 }");
        let load = Frame { kind: kind::LOAD, id: 1, body: load_request(1, &LoadBody::Bytes(Zeroizing::new(b"SECRETKEY".to_vec()))) };
        assert!(!format!("{load:?}").contains("83, 69, 67") && !format!("{load:#?}").contains("SECRET"));
    }

    #[test]
    fn bad_lengths_and_bodies_are_errors_not_panics() {
        for len in [0u32, 8, MAX_FRAME as u32 + 1, u32::MAX] {
            let mut d = Decoder::new();
            d.push(&len.to_be_bytes());
            assert_eq!(d.next_frame(), Err(FramingError::Length(len)));
        }
        assert!(parse_hello_request(b"KFKP\x00\x02\x00\x00\x00\x01").is_err(), "version 2");
        assert!(parse_hello_request(b"XXXX\x00\x01\x00\x00\x00\x01").is_err(), "magic");
        assert!(parse_hello_request(b"KFKP\x00\x01\x00\x00\x00\x00").is_err(), "zero in flight");
        assert!(parse_hello_request(&hello_request(MAX_IN_FLIGHT + 1)).is_err(), "too many in flight");
        assert!(parse_hello_request(&hello_request(u32::MAX)).is_err(), "u32::MAX in flight");
        assert_eq!(parse_hello_request(&hello_request(MAX_IN_FLIGHT)), Ok(MAX_IN_FLIGHT));
        assert!(parse_load_request(&[0; 8]).is_err());
        assert!(parse_load_request(&[0, 0, 0, 0, 0, 0, 0, 1, 9]).is_err(), "unknown source");
        assert!(parse_load_request(&[0, 0, 0, 0, 0, 0, 0, 1, 1, 0xff, 0xff, 0xff, 0xff]).is_err(), "long path");
        assert!(parse_op(&[0; 14]).is_err(), "short");
        let mut bad_alg = vec![0; 12];
        bad_alg.extend_from_slice(&[1, 0x12, 0x34]);
        assert!(parse_op(&bad_alg).is_err(), "unknown algorithm");
        assert!(parse_loaded_reply(&[1, 0x04, 0x00]).is_err(), "RSA-1024");
        assert_eq!(parse_error(&[]).0, ErrorCode::Internal);
    }

    #[test]
    fn the_wire_format_is_the_documented_one() {
        // docs/isolation.md: big-endian, u32 length prefixes.
        let load = load_request(77, &LoadBody::File("/k".into()));
        assert_eq!(&load[..], &[0, 0, 0, 0, 0, 0, 0, 77, 1, 0, 0, 0, 2, b'/', b'k']);
        let load = load_request(77, &LoadBody::AgentEnvelope(b"KFE2".to_vec()));
        assert_eq!(&load[..], &[&[0, 0, 0, 0, 0, 0, 0, 77, 5][..], &[0, 0, 0, 4], b"KFE2"].concat()[..]);
        // The sources that named a store, from older clients: refused,
        // saying so.
        for old in [2u8, 4] {
            let body = [&[0, 0, 0, 0, 0, 0, 0, 77, old][..], &[0, 0, 0, 2, b'/', b's']].concat();
            assert!(parse_load_request(&body).is_err_and(|e| e.to_string().contains("name a store")), "source {old}");
        }
        let mut frame = Vec::new();
        encode(&mut frame, kind::UNLOAD, 5, &[&unload_request(77)]);
        assert_eq!(frame, [&[0, 0, 0, 17, kind::UNLOAD][..], &[0, 0, 0, 0, 0, 0, 0, 5], &[0, 0, 0, 0, 0, 0, 0, 77]].concat());
        assert_eq!(parse_unload_request(&unload_request(77)).unwrap(), 77);
        assert_eq!(drop_privileges_request(1, 2), [0, 0, 0, 1, 0, 0, 0, 2]);
        assert_eq!(parse_drop_privileges_request(&drop_privileges_request(1, 2)).unwrap(), (1, 2));
        assert!(parse_drop_privileges_request(&[0; 9]).is_err(), "trailing");
        assert_eq!(hello_reply(7, 3), b"KFKP\x00\x01\x00\x00\x00\x07\x00\x00\x00\x03");
    }

    #[test]
    fn every_source_round_trips() {
        for source in [
            LoadBody::File("/etc/k.pem".into()),
            LoadBody::Bytes(Zeroizing::new(vec![1, 2, 3])),
            LoadBody::AgentEnvelope(b"KFE2...".to_vec()),
            LoadBody::EnvelopeObjects {
                machine_key: "/m".into(),
                envelope: b"KFE2...".to_vec(),
                objects: vec![("public/generations".into(), b"KFG2".to_vec()), ("sealed/aa/1/2".into(), vec![0; 300])],
            },
            LoadBody::Pkcs11("pkcs11:token=edge;object=k?module-path=/m.so".into()),
        ] {
            let (id, parsed) = parse_load_request(&load_request(77, &source)).unwrap();
            assert_eq!(id, 77);
            match (&parsed, &source) {
                (LoadBody::Bytes(a), LoadBody::Bytes(b)) => assert_eq!(a[..], b[..]),
                (LoadBody::AgentEnvelope(a), LoadBody::AgentEnvelope(b)) => assert_eq!(a, b),
                (
                    LoadBody::EnvelopeObjects { machine_key: m1, envelope: e1, objects: o1 },
                    LoadBody::EnvelopeObjects { machine_key: m2, envelope: e2, objects: o2 },
                ) => assert_eq!((m1, e1, o1), (m2, e2, o2)),
                _ => assert_eq!(format!("{parsed:?}"), format!("{source:?}")),
            }
            assert_eq!(parsed.source(), source.source());
        }
        assert_eq!(format!("{:?}", LoadBody::Bytes(Zeroizing::new(vec![1; 5]))), "Bytes(5 bytes)");
        for kind in [KeyKind::Rsa { bits: 3072 }, KeyKind::EcP256, KeyKind::EcP384, KeyKind::Ed25519] {
            assert_eq!(parse_loaded_reply(&loaded_reply(kind, b"der")).unwrap(), (kind, b"der".to_vec()));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Whatever a peer sends, in whatever pieces: the decoder and every
        /// body parser answer with frames or errors, never a panic. Half the
        /// inputs start from a valid stream with bytes overwritten, so the
        /// parsers see plausible lengths and kinds, not only noise.
        #[test]
        fn any_bytes_in_any_pieces_never_panic(
            noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            edits in proptest::collection::vec((0usize..600, proptest::prelude::any::<u8>()), 0..8),
            cuts in proptest::collection::vec(0usize..600, 0..6),
            from_valid in proptest::prelude::any::<bool>(),
        ) {
            let wire = if from_valid {
                let mut w = Vec::new();
                encode(&mut w, kind::HELLO, 0, &[&hello_request(64)]);
                let op = Operation::Sign { alg: Algorithm::RsaPssSha256, input: Input::Message(noise.clone()) };
                encode_op(&mut w, 5, 9, Duration::from_millis(3), &op);
                encode(&mut w, kind::LOAD, 3, &[&load_request(3, &LoadBody::File("/k".into()))]);
                encode(&mut w, kind::OK, 7, &[&loaded_reply(KeyKind::EcP256, &noise)]);
                w
            } else {
                noise.clone()
            };
            crate::sign::wire::frame::feed_edited(wire, &edits, &cuts, |f| {
                let _ = parse_hello_request(&f.body);
                let _ = parse_hello_reply(&f.body);
                let _ = parse_load_request(&f.body);
                let _ = parse_loaded_reply(&f.body);
                let _ = parse_op(&f.body);
                let _ = parse_unload_request(&f.body);
                let _ = parse_drop_privileges_request(&f.body);
                let _ = parse_error(&f.body);
                let _ = Status::parse(&f.body);
            });
        }
    }
}
