//! The key-process protocol, version 1: framing and message encoding.
//!
//! Both directions carry frames:
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
//! ([`crate::codec`], big-endian). Nothing here needs BoringSSL: with the
//! `testing` feature this module builds without `sign`, for the fuzzer.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use zeroize::Zeroizing;

use crate::codec::{CodecError, Order, Reader, Writer};
use crate::sign::types::{Algorithm, Input, KeyKind, Operation};

/// The first bytes of both hellos.
pub const MAGIC: [u8; 4] = *b"KFKP";
/// The protocol version this library speaks.
pub const VERSION: u16 = 1;
/// Bytes of `kind` and `id` after the length.
pub const HEADER: usize = 9;
/// The largest frame (after the length word). Large enough for a key
/// file or a message to sign, small enough that a hostile length cannot
/// make the reader allocate much.
pub const MAX_FRAME: usize = 1 << 20;
/// The largest `max_in_flight` a client may ask for in its hello: each
/// request in flight holds up to a frame of memory in the key process,
/// and a peer must not be able to make that unbounded.
pub const MAX_IN_FLIGHT: u32 = 4096;
/// The bytes of an OP body before its data: key id, timeout, code,
/// algorithm.
pub const OP_HEAD: usize = 8 + 4 + 1 + 2;
/// The longest message, digest or ciphertext one OP frame carries. The
/// client hashes longer messages itself (for algorithms with a hash) and
/// refuses the rest at submission: a frame over [`MAX_FRAME`] would end
/// the connection and every operation in flight on it.
pub const MAX_OP_DATA: usize = MAX_FRAME - HEADER - OP_HEAD;

/// Frame kinds.
pub mod kind {
    /// Client hello: magic, version, max in flight. Server hello: magic,
    /// version, pid, hardening flags.
    pub const HELLO: u8 = 0x01;
    /// Load a key under a client-chosen id.
    pub const LOAD: u8 = 0x02;
    /// Forget a key.
    pub const UNLOAD: u8 = 0x03;
    /// A private-key operation.
    pub const OP: u8 = 0x04;
    /// Drop privileges to a user and group.
    pub const DROP_PRIVILEGES: u8 = 0x05;
    /// Ask for the process's status.
    pub const STATUS: u8 = 0x06;
    /// Success; the body depends on the request.
    pub const OK: u8 = 0x80;
    /// Failure: code and message.
    pub const ERR: u8 = 0x81;
}

/// Hardening the key process confirms in its hello.
pub mod flags {
    /// `PR_SET_DUMPABLE` is 0: no core dumps, no ptrace by same-uid peers.
    pub const NOT_DUMPABLE: u32 = 1;
    /// `RLIMIT_CORE` is 0.
    pub const NO_CORE: u32 = 2;
    /// The peer's credentials were checked: it is the parent, same user.
    pub const PEER_CHECKED: u32 = 4;
}

/// Why the key process refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ErrorCode {
    /// The frame's body could not be decoded.
    Malformed = 1,
    /// No key under that id.
    UnknownKey = 2,
    /// The key could not be loaded (file, envelope or bytes).
    Load = 3,
    /// BoringSSL refused the operation.
    Crypto = 4,
    /// The deadline passed before the operation started.
    TimedOut = 5,
    /// More requests in flight than agreed in the hello.
    Busy = 6,
    /// The request is not valid for the key (algorithm, lengths).
    Invalid = 7,
    /// Dropping privileges failed.
    Privileges = 8,
    /// Anything else.
    Internal = 9,
}

impl ErrorCode {
    /// The code for a byte, `Internal` for unknown ones.
    pub fn from_u8(b: u8) -> Self {
        match b {
            1 => ErrorCode::Malformed,
            2 => ErrorCode::UnknownKey,
            3 => ErrorCode::Load,
            4 => ErrorCode::Crypto,
            5 => ErrorCode::TimedOut,
            6 => ErrorCode::Busy,
            7 => ErrorCode::Invalid,
            8 => ErrorCode::Privileges,
            _ => ErrorCode::Internal,
        }
    }
}

/// Where the key process gets a key. Every source is loaded again after a
/// restart.
#[derive(Clone)]
pub enum KeySource {
    /// A PEM or DER key file, read by the key process.
    File(PathBuf),
    /// A keyfence envelope, opened by the key process with a machine key
    /// against a file store: the secret exists only in the key process.
    Envelope {
        /// The store directory (`keyfence authority init --store`).
        store: PathBuf,
        /// The machine key file (`keyfence authority issue --out`).
        machine_key: PathBuf,
        /// The envelope file (`keyfence authority wrap --out`).
        envelope: PathBuf,
    },
    /// Key bytes (PEM or DER). The client keeps them, zeroized, to load
    /// the key again after a restart: unlike a file or an envelope, such a
    /// key is also in the client's memory.
    Bytes(Zeroizing<Vec<u8>>),
    /// A keyfence envelope given by its bytes, opened by the key process
    /// with a machine key file against a file store. The client keeps the
    /// bytes (an envelope is public) and sends the same ones again after a
    /// restart, so the key loaded is always the one these bytes name
    /// (its [`KeyId`](crate::sign::remote::KeyId), for a key server),
    /// whatever happens to the file they came from.
    EnvelopeBytes {
        /// The store directory (`keyfence authority init --store`).
        store: PathBuf,
        /// The machine key file (`keyfence authority issue --out`).
        machine_key: PathBuf,
        /// The envelope (`keyfence authority wrap --out`).
        envelope: Vec<u8>,
    },
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::File(p) => f.debug_tuple("File").field(p).finish(),
            KeySource::Envelope { store, machine_key, envelope } => f
                .debug_struct("Envelope")
                .field("store", store)
                .field("machine_key", machine_key)
                .field("envelope", envelope)
                .finish(),
            KeySource::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            KeySource::EnvelopeBytes { store, machine_key, envelope } => f
                .debug_struct("EnvelopeBytes")
                .field("store", store)
                .field("machine_key", machine_key)
                .field("envelope", &format_args!("{} bytes", envelope.len()))
                .finish(),
        }
    }
}

/// A decoded frame. Its body can be key material (key bytes in a LOAD, a
/// raw RSA decryption in an OK), so it is wiped when dropped and `Debug`
/// shows its length only.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    /// One of [`kind`].
    pub kind: u8,
    /// The request id (0 for hellos).
    pub id: u64,
    /// The kind-specific body.
    pub body: Zeroizing<Vec<u8>>,
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame")
            .field("kind", &format_args!("{:#04x}", self.kind))
            .field("id", &self.id)
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// A frame the reader cannot get past.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    /// The length word is below the header size or above [`MAX_FRAME`].
    #[error("frame length {0} is outside 9..={MAX_FRAME}")]
    Length(u32),
}

/// Appends a frame to `out`.
pub fn encode(out: &mut Vec<u8>, kind: u8, id: u64, body: &[&[u8]]) {
    let len = HEADER + body.iter().map(|b| b.len()).sum::<usize>();
    let mut w = Writer::new(Order::Big);
    // A frame over MAX_FRAME is refused by the reader; the length word
    // itself always fits (bodies are far below 4 GiB).
    w.len32(len).u8(kind).u64(id);
    for part in body {
        w.raw(part);
    }
    crate::wipe::extend(out, &w.into_bytes());
}

/// Accumulates bytes from a stream and yields whole frames.
///
/// The bytes that pass through can be key material, so the buffer never
/// leaves a copy behind: it is fully initialised (`buf[start..end]` holds
/// the pending bytes, everything else is zero), each frame's bytes are
/// zeroed as soon as the frame is yielded, compaction zeroes what it moves
/// away from, growth wipes the old allocation, and the buffer is wiped
/// when the decoder is dropped.
#[derive(Default)]
pub struct Decoder {
    buf: Zeroizing<Vec<u8>>,
    start: usize,
    end: usize,
}

impl Decoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.end + bytes.len() > self.buf.len() {
            // Move the pending bytes to the front and zero where they were.
            let pending = self.end - self.start;
            self.buf.copy_within(self.start..self.end, 0);
            self.buf[pending..self.end].fill(0);
            self.start = 0;
            self.end = pending;
        }
        let need = self.end + bytes.len();
        if need > self.buf.len() {
            let (len, size) = (self.buf.len(), need.max(self.buf.len() * 2));
            crate::wipe::reserve(&mut self.buf, size - len);
            self.buf.resize(size, 0);
        }
        self.buf[self.end..need].copy_from_slice(bytes);
        self.end = need;
    }

    /// The next whole frame, `None` if more bytes are needed.
    ///
    /// # Errors
    /// [`FramingError`] when the length word is out of range; the stream
    /// cannot be resynchronised after that.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FramingError> {
        let mut r = Reader::new(&self.buf[self.start..self.end], Order::Big);
        let Ok(len) = r.u32("frame length") else {
            return Ok(None);
        };
        if (len as usize) < HEADER || len as usize > MAX_FRAME {
            return Err(FramingError::Length(len));
        }
        let Ok(frame) = r.take(len as usize, "frame") else {
            return Ok(None);
        };
        let mut frame = Reader::new(frame, Order::Big);
        let (Ok(kind), Ok(id)) = (frame.u8("kind"), frame.u64("id")) else {
            // `len` >= HEADER was checked above.
            return Err(FramingError::Length(len));
        };
        let body = Zeroizing::new(frame.rest().to_vec());
        let consumed = self.start..self.start + 4 + len as usize;
        self.buf[consumed.clone()].fill(0);
        self.start = consumed.end;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        Ok(Some(Frame { kind, id, body }))
    }
}

/// A body that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// A field ended early, or bytes were left over.
    #[error("malformed {0}")]
    Codec(#[from] CodecError),
    /// A field held a value this version does not accept; names the field.
    #[error("malformed {0}")]
    Value(&'static str),
}

fn reader(body: &[u8]) -> Reader<'_> {
    Reader::new(body, Order::Big)
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
    let mut w = Writer::new(Order::Big);
    w.raw(&MAGIC).u16(VERSION).u32(max_in_flight);
    w.into_bytes().to_vec()
}

/// Decodes a client hello: the agreed in-flight bound.
///
/// # Errors
/// [`BodyError`] for a wrong magic, version or length.
pub fn parse_hello_request(body: &[u8]) -> Result<u32, BodyError> {
    let mut r = reader(body);
    if r.take(4, "hello magic")? != MAGIC {
        return Err(BodyError::Value("hello magic"));
    }
    if r.u16("hello version")? != VERSION {
        return Err(BodyError::Value("hello version (this key process speaks version 1)"));
    }
    let max = r.u32("hello max_in_flight")?;
    r.finish_as("hello (trailing bytes)")?;
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
    let mut w = Writer::new(Order::Big);
    w.raw(&MAGIC).u16(VERSION).u32(pid).u32(flags);
    w.into_bytes().to_vec()
}

/// Decodes the key process's hello: its pid and hardening flags.
///
/// # Errors
/// [`BodyError`] for a wrong magic, version or length.
pub fn parse_hello_reply(body: &[u8]) -> Result<(u32, u32), BodyError> {
    let mut r = reader(body);
    if r.take(4, "hello magic")? != MAGIC {
        return Err(BodyError::Value("hello magic"));
    }
    if r.u16("hello version")? != VERSION {
        return Err(BodyError::Value("hello version"));
    }
    let pid = r.u32("hello pid")?;
    let flags = r.u32("hello flags")?;
    r.finish_as("hello (trailing bytes)")?;
    Ok((pid, flags))
}

/// The body of a LOAD request. Paths and key bytes are far below the
/// 4 GiB a length prefix can carry (a frame is at most [`MAX_FRAME`]).
pub fn load_request(key_id: u64, source: &KeySource) -> Zeroizing<Vec<u8>> {
    let mut w = Writer::new(Order::Big);
    w.u64(key_id);
    match source {
        KeySource::File(p) => {
            w.u8(1).bytes32(path_bytes(p));
        }
        KeySource::Envelope { store, machine_key, envelope } => {
            w.u8(2).bytes32(path_bytes(store)).bytes32(path_bytes(machine_key)).bytes32(path_bytes(envelope));
        }
        KeySource::Bytes(bytes) => {
            w.u8(3).bytes32(bytes);
        }
        KeySource::EnvelopeBytes { store, machine_key, envelope } => {
            w.u8(4).bytes32(path_bytes(store)).bytes32(path_bytes(machine_key)).bytes32(envelope);
        }
    }
    w.into_bytes()
}

/// Decodes a LOAD request.
///
/// # Errors
/// [`BodyError`] naming the field.
pub fn parse_load_request(body: &[u8]) -> Result<(u64, KeySource), BodyError> {
    let mut r = reader(body);
    let key_id = r.u64("load key id")?;
    let source = match r.u8("load source")? {
        1 => KeySource::File(path_from(r.bytes32("load file path")?)),
        2 => KeySource::Envelope {
            store: path_from(r.bytes32("load store path")?),
            machine_key: path_from(r.bytes32("load machine key path")?),
            envelope: path_from(r.bytes32("load envelope path")?),
        },
        3 => KeySource::Bytes(Zeroizing::new(r.bytes32("load key bytes")?.to_vec())),
        4 => KeySource::EnvelopeBytes {
            store: path_from(r.bytes32("load store path")?),
            machine_key: path_from(r.bytes32("load machine key path")?),
            envelope: r.bytes32("load envelope bytes")?.to_vec(),
        },
        _ => return Err(BodyError::Value("load source (1 file, 2 envelope, 3 bytes, 4 envelope bytes)")),
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

/// The body of a LOAD success: the key's kind and public key.
pub fn loaded_reply(kind: KeyKind, public_der: &[u8]) -> Vec<u8> {
    let (tag, bits) = match kind {
        // 2048..=4096 bits: a u16 holds it.
        KeyKind::Rsa { bits } => (1u8, u16::try_from(bits).unwrap_or(u16::MAX)),
        KeyKind::EcP256 => (2, 256),
        KeyKind::EcP384 => (3, 384),
        KeyKind::Ed25519 => (4, 255),
    };
    let mut w = Writer::new(Order::Big);
    w.u8(tag).u16(bits).bytes32(public_der);
    w.into_bytes().to_vec()
}

/// Decodes a LOAD success.
///
/// # Errors
/// [`BodyError`] naming the field.
pub fn parse_loaded_reply(body: &[u8]) -> Result<(KeyKind, Vec<u8>), BodyError> {
    let mut r = reader(body);
    let tag = r.u8("key kind")?;
    let bits = r.u16("key bits")?;
    let kind = match tag {
        1 if (2048..=4096).contains(&bits) => KeyKind::Rsa { bits: u32::from(bits) },
        2 => KeyKind::EcP256,
        3 => KeyKind::EcP384,
        4 => KeyKind::Ed25519,
        _ => return Err(BodyError::Value("key kind")),
    };
    let der = r.bytes32("public key")?.to_vec();
    r.finish_as("loaded (trailing bytes)")?;
    Ok((kind, der))
}

/// What an OP request asks for.
const OP_SIGN_MESSAGE: u8 = 1;
const OP_SIGN_DIGEST: u8 = 2;
const OP_DECRYPT_RAW: u8 = 3;

/// Appends an OP frame for `op` with key `key_id` to `out`: the work must
/// start within `timeout` (rounded up to a microsecond, at most about 71
/// minutes).
pub fn encode_op(out: &mut Vec<u8>, id: u64, key_id: u64, timeout: Duration, op: &Operation) {
    let us = u32::try_from(timeout.as_micros().max(1)).unwrap_or(u32::MAX);
    let (code, alg, data): (u8, u16, &[u8]) = match op {
        Operation::Sign { alg, input: Input::Message(m) } => (OP_SIGN_MESSAGE, alg.tls_code(), m),
        Operation::Sign { alg, input: Input::Digest(d) } => (OP_SIGN_DIGEST, alg.tls_code(), d),
        Operation::DecryptRaw { ciphertext } => (OP_DECRYPT_RAW, 0, ciphertext),
    };
    let mut head = Writer::new(Order::Big);
    head.u64(key_id).u32(us).u8(code).u16(alg);
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
    let code = r.u8("op code")?;
    let alg = r.u16("op algorithm")?;
    let data = r.rest().to_vec();
    let sign_alg = || Algorithm::from_tls_code(alg).map_err(|_| BodyError::Value("op algorithm"));
    let op = match code {
        OP_SIGN_MESSAGE => Operation::Sign { alg: sign_alg()?, input: Input::Message(data) },
        OP_SIGN_DIGEST => Operation::Sign { alg: sign_alg()?, input: Input::Digest(data) },
        OP_DECRYPT_RAW if alg == 0 => Operation::DecryptRaw { ciphertext: data },
        _ => return Err(BodyError::Value("op code (1 sign message, 2 sign digest, 3 raw RSA decrypt)")),
    };
    Ok((key_id, timeout, op))
}

/// The body of an ERR reply.
pub fn error_body(code: ErrorCode, message: &str) -> Vec<u8> {
    // Messages are for logs; keep them short whatever produced them.
    let mut end = message.len().min(1024);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let mut w = Writer::new(Order::Big);
    w.u8(code as u8).raw(&message.as_bytes()[..end]);
    w.into_bytes().to_vec()
}

/// Decodes an ERR reply.
pub fn parse_error(body: &[u8]) -> (ErrorCode, String) {
    let mut r = reader(body);
    match r.u8("error code") {
        Ok(code) => (ErrorCode::from_u8(code), String::from_utf8_lossy(r.rest()).into_owned()),
        Err(_) => (ErrorCode::Internal, "an empty error reply".into()),
    }
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
    fn the_decoder_keeps_no_copy_of_what_it_has_handed_out() {
        let secret = vec![0xA5; 3000];
        let mut wire = Vec::new();
        encode(&mut wire, kind::OK, 1, &[&secret]);
        encode(&mut wire, kind::OK, 2, &[&secret]);
        let mut d = Decoder::new();
        // In pieces, so that the buffer compacts and grows on the way.
        for chunk in wire.chunks(700) {
            d.push(chunk);
            while let Some(f) = d.next_frame().unwrap() {
                assert_eq!(&f.body[..], &secret[..]);
            }
        }
        assert!(d.buf.len() >= 3000);
        assert!(d.buf.iter().all(|&b| b == 0), "every byte handed out is zeroed in the buffer");
        // A partial frame stays, and only it.
        d.push(&wire[..100]);
        assert_eq!(d.buf.iter().filter(|&&b| b != 0).count(), wire[..100].iter().filter(|&&b| b != 0).count());
    }

    #[test]
    fn debug_of_a_frame_shows_the_body_length_not_the_body() {
        let f = Frame { kind: kind::OK, id: 7, body: Zeroizing::new(vec![0xA5; 48]) };
        let shown = format!("{f:?}");
        assert_eq!(shown, "Frame { kind: 0x80, id: 7, body_len: 48 }");
        let load = Frame { kind: kind::LOAD, id: 1, body: load_request(1, &KeySource::Bytes(Zeroizing::new(b"SECRETKEY".to_vec()))) };
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
        let load = load_request(77, &KeySource::File("/k".into()));
        assert_eq!(&load[..], &[0, 0, 0, 0, 0, 0, 0, 77, 1, 0, 0, 0, 2, b'/', b'k']);
        let load = load_request(77, &KeySource::Envelope { store: "/s".into(), machine_key: "/m".into(), envelope: "/e".into() });
        assert_eq!(&load[..], &[&[0, 0, 0, 0, 0, 0, 0, 77, 2][..], &[0, 0, 0, 2, b'/', b's'], &[0, 0, 0, 2, b'/', b'm'], &[0, 0, 0, 2, b'/', b'e']].concat()[..]);
        let source = KeySource::EnvelopeBytes { store: "/s".into(), machine_key: "/m".into(), envelope: b"KFE2".to_vec() };
        let load = load_request(77, &source);
        assert_eq!(&load[..], &[&[0, 0, 0, 0, 0, 0, 0, 77, 4][..], &[0, 0, 0, 2, b'/', b's'], &[0, 0, 0, 2, b'/', b'm'], &[0, 0, 0, 4], b"KFE2"].concat()[..]);
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
            KeySource::File("/etc/k.pem".into()),
            KeySource::Envelope { store: "/s".into(), machine_key: "/m".into(), envelope: "/e".into() },
            KeySource::Bytes(Zeroizing::new(vec![1, 2, 3])),
            KeySource::EnvelopeBytes { store: "/s".into(), machine_key: "/m".into(), envelope: b"KFE2...".to_vec() },
        ] {
            let (id, parsed) = parse_load_request(&load_request(77, &source)).unwrap();
            assert_eq!(id, 77);
            match (&parsed, &source) {
                (KeySource::Bytes(a), KeySource::Bytes(b)) => assert_eq!(a[..], b[..]),
                (
                    KeySource::EnvelopeBytes { store: s1, machine_key: m1, envelope: e1 },
                    KeySource::EnvelopeBytes { store: s2, machine_key: m2, envelope: e2 },
                ) => assert_eq!((s1, m1, e1), (s2, m2, e2)),
                _ => assert_eq!(format!("{parsed:?}"), format!("{source:?}")),
            }
        }
        assert_eq!(format!("{:?}", KeySource::Bytes(Zeroizing::new(vec![1; 5]))), "Bytes(5 bytes)");
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
            let mut wire = if from_valid {
                let mut w = Vec::new();
                encode(&mut w, kind::HELLO, 0, &[&hello_request(64)]);
                let op = Operation::Sign { alg: Algorithm::RsaPssSha256, input: Input::Message(noise.clone()) };
                encode_op(&mut w, 5, 9, Duration::from_millis(3), &op);
                encode(&mut w, kind::LOAD, 3, &[&load_request(3, &KeySource::File("/k".into()))]);
                encode(&mut w, kind::OK, 7, &[&loaded_reply(KeyKind::EcP256, &noise)]);
                w
            } else {
                noise.clone()
            };
            for (at, b) in edits {
                if !wire.is_empty() {
                    let i = at % wire.len();
                    wire[i] = b;
                }
            }
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(wire.len())).collect();
            cuts.sort_unstable();
            let mut d = Decoder::new();
            let mut last = 0;
            'feed: for end in cuts.into_iter().chain([wire.len()]) {
                d.push(&wire[last..end]);
                last = end;
                loop {
                    match d.next_frame() {
                        Ok(Some(f)) => {
                            let _ = parse_hello_request(&f.body);
                            let _ = parse_hello_reply(&f.body);
                            let _ = parse_load_request(&f.body);
                            let _ = parse_loaded_reply(&f.body);
                            let _ = parse_op(&f.body);
                            let _ = parse_unload_request(&f.body);
                            let _ = parse_drop_privileges_request(&f.body);
                            let _ = parse_error(&f.body);
                            let _ = Status::parse(&f.body);
                        }
                        Ok(None) => break,
                        // The stream cannot be resynchronised after this.
                        Err(_) => break 'feed,
                    }
                }
            }
        }
    }
}
