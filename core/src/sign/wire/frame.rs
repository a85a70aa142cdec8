//! Framing: how both protocols cut a byte stream into messages.
//!
//! ```text
//! frame   = length:u32  kind:u8  id:u64  body        (big-endian)
//! length  = 9 + len(body), at most MAX_FRAME
//! ```
//!
//! A frame whose length is out of range cannot be skipped safely, so a
//! reader closes the connection ([`FramingError`]); a frame whose body is
//! malformed can be answered ([`BodyError`]) and the connection goes on.

use std::fmt;

use zeroize::Zeroizing;

use crate::codec::{CodecError, Order, Reader, Writer};

/// Bytes of `kind` and `id` after the length.
pub const HEADER: usize = 9;
/// The largest frame (after the length word). Large enough for a key
/// file or a message to sign, small enough that a hostile length cannot
/// make the reader allocate much.
pub const MAX_FRAME: usize = 1 << 20;

/// The frame kinds both protocols use, with the same numbers; each
/// protocol's `kind` module adds its own requests.
pub mod kind {
    /// The first frame each way: a hello ([`super::super::hello`]).
    pub const HELLO: u8 = 0x01;
    /// A private-key operation: the protocol's head, then
    /// [`super::super::op`].
    pub const OP: u8 = 0x04;
    /// Success; the body depends on the request.
    pub const OK: u8 = 0x80;
    /// Failure: [`super::super::error`]'s code and message.
    pub const ERR: u8 = 0x81;
}

/// A decoded frame. Its body can be key material (key bytes in a LOAD, a
/// raw RSA decryption in an OK), so it is wiped when dropped and `Debug`
/// shows its length only.
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    /// The frame kind: one of [`kind`], or one of a protocol's own.
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
            self.compact();
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

    /// Bytes of memory the buffer holds (what a server charges to the
    /// client that makes it hold them).
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// Whether part of a frame has come and the rest not yet.
    pub fn partial(&self) -> bool {
        self.end > self.start
    }

    /// The buffer's size once it has room for the next read
    /// ([`Decoder::read_from`]): at least `chunk` bytes, and all of the
    /// frame begun once its length has come (never past one whole frame
    /// of [`MAX_FRAME`]); it only grows for a frame larger than it.
    pub fn size_for_next_read(&self, chunk: usize) -> usize {
        let pending = self.end - self.start;
        (pending + self.frame_rest().unwrap_or(0)).max(chunk).max(self.buf.len())
    }

    /// Bytes still to come of the frame begun, once its length has come.
    fn frame_rest(&self) -> Option<usize> {
        let pending = &self.buf[self.start..self.end];
        let len = u32::from_be_bytes(pending.get(..4)?.try_into().ok()?) as usize;
        (HEADER..=MAX_FRAME).contains(&len).then(|| (4 + len).saturating_sub(pending.len()))
    }

    /// Reads once from `r` straight into the buffer, into whatever room it
    /// has after the bytes pending (moved to the front when that makes
    /// room), grown first to [`Decoder::size_for_next_read`]`(chunk)`: no
    /// second buffer per connection, a frame's bytes copied once, and no
    /// new allocation but for a frame larger than the buffer. Returns what
    /// `read` returned (0 at the end of the stream).
    ///
    /// # Errors
    /// The reader's.
    pub fn read_from(&mut self, mut r: impl std::io::Read, chunk: usize) -> std::io::Result<usize> {
        let size = self.size_for_next_read(chunk);
        if size > self.buf.len() {
            self.compact();
            let len = self.buf.len();
            crate::wipe::reserve(&mut self.buf, size - len);
            self.buf.resize(size, 0);
        } else if self.end == self.buf.len() {
            // No room after the pending bytes: they move to the front.
            self.compact();
        }
        if self.end == self.buf.len() {
            // Still none (a frame whose length has not come, as long as the
            // buffer): room for a chunk more, so that a read of nothing is
            // never taken for the end of the stream.
            let len = self.buf.len();
            crate::wipe::reserve(&mut self.buf, chunk.max(1));
            self.buf.resize(len + chunk.max(1), 0);
        }
        let n = r.read(&mut self.buf[self.end..])?;
        self.end += n;
        Ok(n)
    }

    /// Gives memory back after a large frame: with nothing pending past
    /// `to` bytes, the buffer becomes `to` bytes (the old one wiped).
    pub fn shrink(&mut self, to: usize) {
        let pending = self.end - self.start;
        if self.buf.len() <= to || pending > to {
            return;
        }
        let mut small = Zeroizing::new(vec![0u8; to]);
        small[..pending].copy_from_slice(&self.buf[self.start..self.end]);
        self.buf = small;
        (self.start, self.end) = (0, pending);
    }

    /// Moves the pending bytes to the front and zeroes where they were.
    fn compact(&mut self) {
        let pending = self.end - self.start;
        self.buf.copy_within(self.start..self.end, 0);
        self.buf[pending..self.end].fill(0);
        self.start = 0;
        self.end = pending;
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

/// A big-endian reader over a body, as every body parser starts.
pub fn reader(body: &[u8]) -> Reader<'_> {
    Reader::new(body, Order::Big)
}

/// For each protocol's proptest: `wire` with the bytes at `edits`
/// overwritten (positions taken modulo its length), fed to a [`Decoder`]
/// in pieces cut at `cuts`, every frame handed to `parse` until the stream
/// cannot be resynchronised. A peer's bytes arrive so, in any pieces.
#[cfg(test)]
pub(crate) fn feed_edited(mut wire: Vec<u8>, edits: &[(usize, u8)], cuts: &[usize], mut parse: impl FnMut(&Frame)) {
    for &(at, b) in edits {
        if !wire.is_empty() {
            let i = at % wire.len();
            wire[i] = b;
        }
    }
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(wire.len())).collect();
    cuts.sort_unstable();
    let mut d = Decoder::new();
    let mut last = 0;
    for end in cuts.into_iter().chain([wire.len()]) {
        d.push(&wire[last..end]);
        last = end;
        loop {
            match d.next_frame() {
                Ok(Some(f)) => parse(&f),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frame_is_the_documented_one() {
        let mut frame = Vec::new();
        encode(&mut frame, 0x03, 5, &[&[0xAB, 0xCD], &[0xEF]]);
        assert_eq!(frame, [&[0, 0, 0, 12, 0x03][..], &[0, 0, 0, 0, 0, 0, 0, 5], &[0xAB, 0xCD, 0xEF]].concat());
    }

    #[test]
    fn the_decoder_keeps_no_copy_of_what_it_has_handed_out() {
        let secret = vec![0xA5; 3000];
        let mut wire = Vec::new();
        encode(&mut wire, 0x80, 1, &[&secret]);
        encode(&mut wire, 0x80, 2, &[&secret]);
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
    fn reading_in_place_grows_for_the_frame_begun_and_shrinks_after_it() {
        let big = vec![0x5A; 100_000];
        let mut wire = Vec::new();
        encode(&mut wire, 0x04, 1, &[b"small"]);
        encode(&mut wire, 0x04, 2, &[&big]);
        let mut d = Decoder::new();
        assert_eq!(d.size_for_next_read(4096), 4096);
        let mut src = &wire[..];
        let mut got = Vec::new();
        while d.read_from(&mut src, 4096).unwrap() > 0 {
            // Once the big frame's length has come, the next read makes room
            // for all of it, and no more.
            assert!(d.held() <= 4 + HEADER + big.len() + 4096, "{}", d.held());
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(&got[1].body[..], &big[..]);
        assert!(!d.partial());
        assert!(d.held() > 100_000);
        d.shrink(4096);
        assert_eq!(d.held(), 4096);
        assert!(d.buf.iter().all(|&b| b == 0));
        // A partial frame is kept through a shrink.
        d.push(&wire[..7]);
        d.shrink(16);
        assert!(d.partial());
        d.push(&wire[7..wire.len() - big.len() - HEADER - 4]);
        assert_eq!(&d.next_frame().unwrap().unwrap().body[..], b"small");
    }

    #[test]
    fn debug_of_a_frame_shows_the_body_length_not_the_body() {
        let f = Frame { kind: 0x80, id: 7, body: Zeroizing::new(b"SECRETKEY".to_vec()) };
        assert_eq!(format!("{f:?}"), "Frame { kind: 0x80, id: 7, body_len: 9 }");
        assert!(!format!("{f:#?}").contains("SECRET") && !format!("{f:?}").contains("83, 69, 67"));
    }

    #[test]
    fn bad_lengths_are_errors_not_panics() {
        for len in [0u32, 8, MAX_FRAME as u32 + 1, u32::MAX] {
            let mut d = Decoder::new();
            d.push(&len.to_be_bytes());
            assert_eq!(d.next_frame(), Err(FramingError::Length(len)));
        }
        let mut d = Decoder::new();
        d.push(&9u32.to_be_bytes());
        assert_eq!(d.next_frame(), Ok(None), "a header still to come");
    }
}
