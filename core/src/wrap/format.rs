//! The binary objects of policy-key wrapping: small, versioned and
//! self-describing, like age's. All integers little-endian.
//!
//! ```text
//! envelope      = "KFE1" | suite u16 | secret id [16] | policy id [32] | key version u32
//!                 | policy (u16-prefixed canonical text) | enc (u16-prefixed) | ciphertext (u32-prefixed)
//! sealed key    = "KFP1" | suite u16 | policy id [32] | key version u32 | master generation u32
//!                 | policy (u16-prefixed) | public key (u16-prefixed) | CP-ABE ciphertext (u32-prefixed)
//! machine key   = "KFM1" | u16 n | n x (label, value: u16-prefixed) | count u16
//!                 | count x (generation u32 | CP-ABE attribute key (u32-prefixed))
//! ```
//!
//! An envelope's HPKE associated data is its whole header (everything
//! before the ciphertext), so its secret id, policy, key version and suite
//! are bound to the ciphertext. A sealed key's CP-ABE plaintext repeats
//! its header fields in front of the private key, and opening checks them.

use super::error::{malformed, Result, WrapError};

/// HPKE suite 1: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
/// ChaCha20-Poly1305 (RFC 9180 ids 0x0020, 0x0001, 0x0003).
pub const SUITE_X25519_CHACHA: u16 = 1;

pub(crate) const ENVELOPE_MAGIC: &[u8; 4] = b"KFE1";
pub(crate) const SEALED_MAGIC: &[u8; 4] = b"KFP1";
pub(crate) const MACHINE_MAGIC: &[u8; 4] = b"KFM1";

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    object: &'static str,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8], object: &'static str, magic: &[u8; 4]) -> Result<Self> {
        let mut c = Self { buf, object };
        if c.take(4, "magic")? != magic {
            return Err(malformed(object, format!("does not start with {:?}", String::from_utf8_lossy(magic))));
        }
        Ok(c)
    }

    pub(crate) fn take(&mut self, n: usize, field: &str) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(malformed(self.object, format!("truncated in field {field}")));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    pub(crate) fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N]> {
        match self.buf.split_first_chunk::<N>() {
            Some((a, rest)) => {
                self.buf = rest;
                Ok(*a)
            }
            None => Err(malformed(self.object, format!("truncated in field {field}"))),
        }
    }

    pub(crate) fn u16(&mut self, field: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    pub(crate) fn bytes16(&mut self, field: &str) -> Result<&'a [u8]> {
        let n = self.u16(field)? as usize;
        self.take(n, field)
    }

    pub(crate) fn bytes32(&mut self, field: &str) -> Result<&'a [u8]> {
        let n = self.u32(field)? as usize;
        self.take(n, field)
    }

    pub(crate) fn text16(&mut self, field: &str) -> Result<&'a str> {
        let b = self.bytes16(field)?;
        std::str::from_utf8(b).map_err(|_| malformed(self.object, format!("field {field} is not UTF-8")))
    }

    pub(crate) fn suite(&mut self) -> Result<u16> {
        match self.u16("suite")? {
            SUITE_X25519_CHACHA => Ok(SUITE_X25519_CHACHA),
            id => Err(WrapError::UnknownAlgorithm { what: "HPKE suite", id }),
        }
    }

    /// Bytes consumed so far, as an offset into the original buffer.
    pub(crate) fn offset(&self, start: &[u8]) -> usize {
        start.len() - self.buf.len()
    }

    pub(crate) fn finish(self) -> Result<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(malformed(self.object, format!("{} trailing byte(s)", self.buf.len())))
        }
    }
}

pub(crate) fn put16(out: &mut Vec<u8>, b: &[u8]) -> Result<()> {
    let n = u16::try_from(b.len()).map_err(|_| malformed("object", "field longer than 65535 bytes"))?;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(b);
    Ok(())
}

pub(crate) fn put32(out: &mut Vec<u8>, b: &[u8]) -> Result<()> {
    let n = u32::try_from(b.len()).map_err(|_| malformed("object", "field longer than 4 GiB"))?;
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(b);
    Ok(())
}

/// A policy's id: BLAKE2b-256 of its canonical text, domain-separated.
pub fn policy_id(canonical: &str) -> [u8; 32] {
    let h = blake2b_simd::Params::new().hash_length(32).personal(b"keyfence.pol.v1").hash(canonical.as_bytes());
    // The hash was asked for 32 bytes, so this fills the whole array.
    let mut id = [0u8; 32];
    id.iter_mut().zip(h.as_bytes()).for_each(|(o, b)| *o = *b);
    id
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A parsed envelope: a customer secret sealed to a policy key.
#[derive(Clone, Debug)]
pub struct Envelope {
    /// Stable id of the wrapped secret (kept across re-wraps).
    pub secret_id: [u8; 16],
    /// Id of the policy (hash of its canonical text).
    pub policy_id: [u8; 32],
    /// Version of the policy key it is sealed to.
    pub key_version: u32,
    /// The policy, canonical text.
    pub policy: String,
    pub(crate) enc: Vec<u8>,
    pub(crate) ciphertext: Vec<u8>,
    pub(crate) header_len: usize,
    pub(crate) bytes: Vec<u8>,
}

impl Envelope {
    /// Parses an envelope without opening it.
    ///
    /// # Errors
    /// [`WrapError::Malformed`] or [`WrapError::UnknownAlgorithm`].
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        const O: &str = "envelope";
        let mut c = Cursor::new(bytes, O, ENVELOPE_MAGIC)?;
        c.suite()?;
        let secret_id = c.array("secret id")?;
        let policy_id = c.array("policy id")?;
        let key_version = c.u32("key version")?;
        let policy = c.text16("policy")?.to_owned();
        let enc = c.bytes16("enc")?.to_vec();
        let header_len = c.offset(bytes);
        let ciphertext = c.bytes32("ciphertext")?.to_vec();
        c.finish()?;
        if policy_id != self::policy_id(&policy) {
            return Err(malformed(O, "policy id does not match the policy"));
        }
        Ok(Self { secret_id, policy_id, key_version, policy, enc, ciphertext, header_len, bytes: bytes.to_vec() })
    }

    /// The header bytes: HPKE associated data.
    pub(crate) fn aad(&self) -> &[u8] {
        &self.bytes[..self.header_len]
    }

    /// The encoded envelope.
    pub fn to_bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub(crate) fn header(
        secret_id: &[u8; 16],
        policy_id: &[u8; 32],
        version: u32,
        policy: &str,
        enc: &[u8],
    ) -> Result<Vec<u8>> {
        let mut h = Vec::with_capacity(100 + policy.len());
        h.extend_from_slice(ENVELOPE_MAGIC);
        h.extend_from_slice(&SUITE_X25519_CHACHA.to_le_bytes());
        h.extend_from_slice(secret_id);
        h.extend_from_slice(policy_id);
        h.extend_from_slice(&version.to_le_bytes());
        put16(&mut h, policy.as_bytes())?;
        put16(&mut h, enc)?;
        Ok(h)
    }
}
