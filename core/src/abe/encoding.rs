//! The length-prefixed framing of CIRCL's tkn20 formats: little-endian u16
//! prefixes everywhere except the three outer ciphertext fields (u32).

use super::error::{malformed, AbeError, Result};

/// Reads fields off a byte string, naming the field in every error.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    object: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], object: &'static str) -> Self {
        Self { buf, object }
    }

    pub(crate) fn err(&self, field: impl Into<String>, reason: impl Into<String>) -> AbeError {
        malformed(self.object, field, reason)
    }

    pub(crate) fn take(&mut self, n: usize, field: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(self.err(field(), format!("truncated: needs {n} bytes, {} left", self.buf.len())));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self, field: &dyn Fn() -> String) -> Result<u8> {
        Ok(self.take(1, field)?[0])
    }

    pub(crate) fn u16(&mut self, field: &dyn Fn() -> String) -> Result<usize> {
        let b = self.take(2, field)?;
        Ok(u16::from_le_bytes([b[0], b[1]]) as usize)
    }

    pub(crate) fn u32(&mut self, field: &dyn Fn() -> String) -> Result<usize> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    /// A u16-length-prefixed byte string.
    pub(crate) fn bytes16(&mut self, field: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let n = self.u16(field)?;
        self.take(n, field)
    }

    /// A u32-length-prefixed byte string.
    pub(crate) fn bytes32(&mut self, field: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let n = self.u32(field)?;
        self.take(n, field)
    }

    /// Fails unless every byte was consumed: one object has one encoding.
    pub(crate) fn finish(self, field: &str) -> Result<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.err(field, format!("{} unexpected trailing byte(s)", self.buf.len())))
        }
    }
}

pub(crate) fn put_u16(out: &mut Vec<u8>, v: usize, what: &str) -> Result<()> {
    let v = u16::try_from(v).map_err(|_| malformed("encoding", what, format!("{v} does not fit a 16-bit length")))?;
    out.extend_from_slice(&v.to_le_bytes());
    Ok(())
}

pub(crate) fn put_bytes16(out: &mut Vec<u8>, b: &[u8], what: &str) -> Result<()> {
    put_u16(out, b.len(), what)?;
    out.extend_from_slice(b);
    Ok(())
}

pub(crate) fn put_bytes32(out: &mut Vec<u8>, b: &[u8], what: &str) -> Result<()> {
    let v = u32::try_from(b.len())
        .map_err(|_| malformed("encoding", what, "longer than 4 GiB".to_string()))?;
    out.extend_from_slice(&v.to_le_bytes());
    out.extend_from_slice(b);
    Ok(())
}
