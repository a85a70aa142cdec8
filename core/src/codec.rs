//! The one byte codec every keyfence format is read and written with.
//!
//! Three formats share it: CIRCL's tkn20 objects (`abe`, little-endian),
//! the wrapping objects and store state (`wrap`, little-endian) and the
//! key-process protocol (`sign::key_process`, big-endian). Each used to carry
//! its own reader and writer, and some writers ignored their own length
//! errors (a field longer than its 16-bit prefix was silently dropped,
//! writing an object that could not be read back). Here:
//!
//! - [`Reader`] checks every length before slicing and names the field at
//!   fault in its [`CodecError`]; callers map that to their own error type
//!   with the object's name.
//! - [`Writer`] never truncates: a length-prefixed field longer than its
//!   prefix can say poisons the writer, and [`Writer::finish`] reports it.
//!   Objects whose limits are enforced when they are built (attribute keys
//!   at `keygen`, machine keys at `issue`, envelopes at `wrap`) use
//!   [`Writer::into_bytes`], which is infallible for them by construction.
//!
//! This module imports nothing else from the crate and needs no AWS-LC,
//! so the fuzzers can build every parser that uses it.

use std::borrow::Cow;
use std::fmt;

use zeroize::Zeroizing;

/// Byte order of a format's integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Little-endian (CIRCL's formats, keyfence's wrapping objects).
    Little,
    /// Big-endian, network order (the key-process protocol).
    Big,
}

/// The name of a field, built only when an error needs it: a `&'static str`
/// or a closure such as `|| format!("k3[{i}]")`.
pub trait Field {
    /// The field's name.
    fn name(&self) -> Cow<'static, str>;
}

impl Field for &'static str {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self)
    }
}

impl<F: Fn() -> String> Field for F {
    fn name(&self) -> Cow<'static, str> {
        Cow::Owned(self())
    }
}

/// What is wrong with a field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The input ended inside the field.
    Truncated {
        /// Bytes the field needs.
        needed: usize,
        /// Bytes that were left.
        left: usize,
    },
    /// Bytes were left after the last field: one object has one encoding.
    Trailing(usize),
    /// Text that is not UTF-8.
    NotUtf8,
    /// A field longer than its length prefix can describe.
    TooLong {
        /// The field's length.
        len: usize,
        /// The largest length the prefix can carry.
        max: usize,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Truncated { needed, left } => write!(f, "truncated: needs {needed} bytes, {left} left"),
            Problem::Trailing(n) => write!(f, "{n} unexpected trailing byte(s)"),
            Problem::NotUtf8 => f.write_str("not UTF-8"),
            Problem::TooLong { len, max } => write!(f, "{len} bytes do not fit a length prefix of at most {max}"),
        }
    }
}

/// A field that could not be read or written. It carries no bytes of the
/// input, only the field's name and the problem, so it may be logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError {
    /// The field at fault (`k3[4]`, `policy`, `body.key_id`).
    pub field: Cow<'static, str>,
    /// What is wrong with it.
    pub problem: Problem,
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "field {}: {}", self.field, self.problem)
    }
}

impl std::error::Error for CodecError {}

fn fail(field: impl Field, problem: Problem) -> CodecError {
    CodecError { field: field.name(), problem }
}

/// Reads fields off a byte string, front to back.
///
/// ```
/// use keyfence::codec::{Order, Reader};
/// let mut r = Reader::new(&[2, 0, b'h', b'i'], Order::Little);
/// assert_eq!(r.bytes16("greeting").unwrap(), b"hi");
/// r.finish().unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    order: Order,
}

impl<'a> Reader<'a> {
    /// A reader over `buf` whose integers are in `order`.
    pub fn new(buf: &'a [u8], order: Order) -> Self {
        Reader { buf, order }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn take_raw(&mut self, n: usize) -> Result<&'a [u8], Problem> {
        if self.buf.len() < n {
            return Err(Problem::Truncated { needed: n, left: self.buf.len() });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array_raw<const N: usize>(&mut self) -> Result<[u8; N], Problem> {
        match self.buf.split_first_chunk::<N>() {
            Some((head, tail)) => {
                self.buf = tail;
                Ok(*head)
            }
            None => Err(Problem::Truncated { needed: N, left: self.buf.len() }),
        }
    }

    fn u16_raw(&mut self) -> Result<u16, Problem> {
        let b = self.array_raw()?;
        Ok(match self.order {
            Order::Little => u16::from_le_bytes(b),
            Order::Big => u16::from_be_bytes(b),
        })
    }

    fn u32_raw(&mut self) -> Result<u32, Problem> {
        let b = self.array_raw()?;
        Ok(match self.order {
            Order::Little => u32::from_le_bytes(b),
            Order::Big => u32::from_be_bytes(b),
        })
    }

    fn bytes16_raw(&mut self) -> Result<&'a [u8], Problem> {
        let n = self.u16_raw()?;
        self.take_raw(usize::from(n))
    }

    /// The next `n` bytes.
    ///
    /// # Errors
    /// [`Problem::Truncated`] if fewer are left.
    pub fn take(&mut self, n: usize, field: impl Field) -> Result<&'a [u8], CodecError> {
        self.take_raw(n).map_err(|p| fail(field, p))
    }

    /// The next `N` bytes as an array.
    ///
    /// # Errors
    /// [`Problem::Truncated`] if fewer are left.
    pub fn array<const N: usize>(&mut self, field: impl Field) -> Result<[u8; N], CodecError> {
        self.array_raw().map_err(|p| fail(field, p))
    }

    /// One byte.
    ///
    /// # Errors
    /// [`Problem::Truncated`] at the end of the input.
    pub fn u8(&mut self, field: impl Field) -> Result<u8, CodecError> {
        Ok(self.array::<1>(field)?[0])
    }

    /// A 16-bit integer.
    ///
    /// # Errors
    /// [`Problem::Truncated`] if fewer than 2 bytes are left.
    pub fn u16(&mut self, field: impl Field) -> Result<u16, CodecError> {
        self.u16_raw().map_err(|p| fail(field, p))
    }

    /// A 32-bit integer.
    ///
    /// # Errors
    /// [`Problem::Truncated`] if fewer than 4 bytes are left.
    pub fn u32(&mut self, field: impl Field) -> Result<u32, CodecError> {
        self.u32_raw().map_err(|p| fail(field, p))
    }

    /// A 64-bit integer.
    ///
    /// # Errors
    /// [`Problem::Truncated`] if fewer than 8 bytes are left.
    pub fn u64(&mut self, field: impl Field) -> Result<u64, CodecError> {
        let b = self.array_raw().map_err(|p| fail(field, p))?;
        Ok(match self.order {
            Order::Little => u64::from_le_bytes(b),
            Order::Big => u64::from_be_bytes(b),
        })
    }

    /// Bytes prefixed by a 16-bit length.
    ///
    /// # Errors
    /// [`Problem::Truncated`] if the prefix or the bytes are cut short.
    pub fn bytes16(&mut self, field: impl Field) -> Result<&'a [u8], CodecError> {
        self.bytes16_raw().map_err(|p| fail(field, p))
    }

    /// Bytes prefixed by a 32-bit length.
    ///
    /// # Errors
    /// [`Problem::Truncated`] if the prefix or the bytes are cut short.
    pub fn bytes32(&mut self, field: impl Field) -> Result<&'a [u8], CodecError> {
        let r = self.u32_raw().and_then(|n| {
            // A length past the address space is as truncated as any other.
            self.take_raw(usize::try_from(n).unwrap_or(usize::MAX))
        });
        r.map_err(|p| fail(field, p))
    }

    /// UTF-8 text prefixed by a 16-bit length.
    ///
    /// # Errors
    /// [`Problem::Truncated`] or [`Problem::NotUtf8`].
    pub fn text16(&mut self, field: impl Field) -> Result<&'a str, CodecError> {
        let r = self.bytes16_raw().and_then(|b| std::str::from_utf8(b).map_err(|_| Problem::NotUtf8));
        r.map_err(|p| fail(field, p))
    }

    /// Whatever is left, leaving the reader empty.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }

    /// Fails unless every byte was read: one object has one encoding.
    ///
    /// # Errors
    /// [`Problem::Trailing`] with the field name `end`.
    pub fn finish(self) -> Result<(), CodecError> {
        self.finish_as("end")
    }

    /// [`Reader::finish`], naming the enclosing field in the error.
    ///
    /// # Errors
    /// [`Problem::Trailing`].
    pub fn finish_as(self, field: impl Field) -> Result<(), CodecError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(CodecError { field: field.name(), problem: Problem::Trailing(self.buf.len()) })
        }
    }
}

/// Writes fields into a buffer that is wiped when dropped (encodings of
/// keys pass through it).
///
/// Length-prefixed fields never truncate: one too long for its prefix
/// poisons the writer, and [`Writer::finish`] reports the first such field.
///
/// ```
/// use keyfence::codec::{Order, Reader, Writer};
/// let mut w = Writer::new(Order::Big);
/// w.u32(7).bytes16(b"hi");
/// let bytes = w.finish().unwrap();
/// let mut r = Reader::new(&bytes, Order::Big);
/// assert_eq!(r.u32("n").unwrap(), 7);
/// assert_eq!(r.bytes16("s").unwrap(), b"hi");
///
/// let mut w = Writer::new(Order::Little);
/// w.bytes16(&vec![0; 70_000]);
/// assert!(w.finish().is_err());
/// ```
pub struct Writer {
    buf: Zeroizing<Vec<u8>>,
    order: Order,
    overflow: Option<Problem>,
}

impl fmt::Debug for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The buffer may hold key material: its length only.
        f.debug_struct("Writer").field("len", &self.buf.len()).field("order", &self.order).finish_non_exhaustive()
    }
}

impl Writer {
    /// An empty writer whose integers are in `order`.
    pub fn new(order: Order) -> Self {
        Writer { buf: Zeroizing::new(Vec::new()), order, overflow: None }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Raw bytes, no prefix.
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        // The buffer may hold key material: growing it must not leave
        // copies behind.
        crate::wipe::extend(&mut self.buf, b);
        self
    }

    /// One byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        crate::wipe::extend(&mut self.buf, &[v]);
        self
    }

    /// A 16-bit integer.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        match self.order {
            Order::Little => self.raw(&v.to_le_bytes()),
            Order::Big => self.raw(&v.to_be_bytes()),
        }
    }

    /// A 32-bit integer.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        match self.order {
            Order::Little => self.raw(&v.to_le_bytes()),
            Order::Big => self.raw(&v.to_be_bytes()),
        }
    }

    /// A 64-bit integer.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        match self.order {
            Order::Little => self.raw(&v.to_le_bytes()),
            Order::Big => self.raw(&v.to_be_bytes()),
        }
    }

    /// A count or length as a 16-bit integer; one that does not fit
    /// poisons the writer.
    pub fn len16(&mut self, n: usize) -> &mut Self {
        match u16::try_from(n) {
            Ok(v) => self.u16(v),
            Err(_) => self.poison(n, u16::MAX as usize),
        }
    }

    /// A count or length as a 32-bit integer; one that does not fit
    /// poisons the writer.
    pub fn len32(&mut self, n: usize) -> &mut Self {
        match u32::try_from(n) {
            Ok(v) => self.u32(v),
            Err(_) => self.poison(n, u32::MAX as usize),
        }
    }

    /// Bytes prefixed by their 16-bit length.
    pub fn bytes16(&mut self, b: &[u8]) -> &mut Self {
        self.len16(b.len()).raw(b)
    }

    /// Bytes prefixed by their 32-bit length.
    pub fn bytes32(&mut self, b: &[u8]) -> &mut Self {
        self.len32(b.len()).raw(b)
    }

    fn poison(&mut self, len: usize, max: usize) -> &mut Self {
        self.overflow.get_or_insert(Problem::TooLong { len, max });
        self
    }

    /// The bytes written.
    ///
    /// # Errors
    /// The first field that was too long for its length prefix (the field
    /// is named `length prefix`; callers know which object they wrote).
    pub fn finish(self) -> Result<Zeroizing<Vec<u8>>, CodecError> {
        match self.overflow {
            None => Ok(self.buf),
            Some(problem) => Err(CodecError { field: Cow::Borrowed("length prefix"), problem }),
        }
    }

    /// The bytes written, for objects whose constructors already enforce
    /// every length limit of their format, so that no field can overflow.
    /// Debug builds (the tests) assert it; the property tests at the limits
    /// check that such objects always read back.
    pub fn into_bytes(self) -> Zeroizing<Vec<u8>> {
        debug_assert!(self.overflow.is_none(), "an object was built past its format's limits: {:?}", self.overflow);
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn errors_name_the_field_and_never_slice_past_the_end() {
        let mut r = Reader::new(&[5, 0, 1, 2], Order::Little);
        let e = r.bytes16(|| format!("k3[{}]", 4)).unwrap_err();
        assert_eq!(e.to_string(), "field k3[4]: truncated: needs 5 bytes, 2 left");
        let r = Reader::new(&[1], Order::Big);
        assert_eq!(r.finish_as("body").unwrap_err().problem, Problem::Trailing(1));
        let mut r = Reader::new(&[0xff; 4], Order::Big);
        assert!(matches!(r.bytes32("big").unwrap_err().problem, Problem::Truncated { .. }));
        let mut r = Reader::new(&[1, 0, 0xff], Order::Little);
        assert_eq!(r.text16("label").unwrap_err().problem, Problem::NotUtf8);
    }

    #[test]
    fn the_writer_refuses_to_truncate_at_the_exact_limit() {
        let mut w = Writer::new(Order::Little);
        w.bytes16(&vec![7; 65_535]);
        let ok = w.finish().unwrap();
        assert_eq!(Reader::new(&ok, Order::Little).bytes16("f").unwrap().len(), 65_535);
        let mut w = Writer::new(Order::Little);
        w.bytes16(&vec![7; 65_536]).u8(1);
        assert_eq!(w.finish().unwrap_err().problem, Problem::TooLong { len: 65_536, max: 65_535 });
    }

    proptest! {
        #[test]
        fn what_is_written_reads_back(a: u8, b: u16, c: u32, d: u64, x in proptest::collection::vec(any::<u8>(), 0..300), big: bool) {
            let order = if big { Order::Big } else { Order::Little };
            let mut w = Writer::new(order);
            w.u8(a).u16(b).u32(c).u64(d).bytes16(&x).bytes32(&x);
            let bytes = w.finish().unwrap();
            let mut r = Reader::new(&bytes, order);
            prop_assert_eq!(r.u8("a").unwrap(), a);
            prop_assert_eq!(r.u16("b").unwrap(), b);
            prop_assert_eq!(r.u32("c").unwrap(), c);
            prop_assert_eq!(r.u64("d").unwrap(), d);
            prop_assert_eq!(r.bytes16("x").unwrap(), &x[..]);
            prop_assert_eq!(r.bytes32("x").unwrap(), &x[..]);
            r.finish().unwrap();
        }

        #[test]
        fn any_bytes_read_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut r = Reader::new(&bytes, Order::Big);
            let _ = r.u16("a").and_then(|_| r.bytes32("b")).and_then(|_| r.text16("c"));
            let _ = r.finish();
        }
    }
}
