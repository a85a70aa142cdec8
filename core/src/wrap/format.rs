//! The envelope, and what every wrapping object shares: small, versioned
//! and self-describing, like age's, read and written with the crate's one
//! codec. All integers little-endian (`docs/wrapping.md`, "Formats").
//!
//! ```text
//! envelope      = "KFE1" | suite u16 | secret id [16] | policy id [32] | key version u32
//!                 | policy (u16-prefixed canonical text) | enc (u16-prefixed) | ciphertext (u32-prefixed)
//! sealed key    = "KFP1" | suite u16 | policy id [32] | key version u32 | master generation u32
//!                 | policy (u16-prefixed) | public key (u16-prefixed) | CP-ABE ciphertext (u32-prefixed)
//! machine key   = "KFM1" | u16 n | n x (label, value: u16-prefixed) | count u16
//!                 | count x (generation u32 | CP-ABE attribute key (u32-prefixed))
//! authority     = "KFA1" | u16 n | n x generation | u32 m | m x policy key
//! ```
//!
//! An envelope's HPKE associated data is its whole header (everything
//! before the ciphertext), so its secret id, policy, key version and suite
//! are bound to the ciphertext. A sealed key's CP-ABE plaintext repeats
//! its header fields in front of the private key, and opening checks them.

use rand_core::OsRng;

use super::error::{codec, limit, malformed, Result, WrapError};
use super::hpke;
use super::policy::CanonicalPolicy;
use crate::codec::{Order, Reader, Writer};

/// HPKE suite 1: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
/// ChaCha20-Poly1305 (RFC 9180 ids 0x0020, 0x0001, 0x0003).
pub const SUITE_X25519_CHACHA: u16 = 1;

pub(crate) const ENVELOPE_MAGIC: &[u8; 4] = b"KFE1";
pub(crate) const SEALED_MAGIC: &[u8; 4] = b"KFP1";
pub(crate) const MACHINE_MAGIC: &[u8; 4] = b"KFM1";
pub(crate) const STATE_MAGIC: &[u8; 4] = b"KFA1";

/// Longest canonical policy text the objects' 16-bit policy fields hold.
pub(crate) const MAX_POLICY_TEXT: usize = u16::MAX as usize;
/// Largest secret an envelope holds: its ciphertext (the secret and a
/// 16-byte tag) behind a 32-bit length.
pub(crate) const MAX_SECRET: usize = u32::MAX as usize - 16;

/// A reader over `bytes` past its magic.
pub(crate) fn reader<'a>(bytes: &'a [u8], object: &'static str, magic: &[u8; 4]) -> Result<Reader<'a>> {
    let mut r = Reader::new(bytes, Order::Little);
    if &r.array::<4>("magic").map_err(codec(object))? != magic {
        return Err(malformed(object, format!("does not start with {:?}", String::from_utf8_lossy(magic))));
    }
    Ok(r)
}

/// A writer that has written `magic`.
pub(crate) fn writer(magic: &[u8; 4]) -> Writer {
    let mut w = Writer::new(Order::Little);
    w.raw(magic);
    w
}

/// Reads the HPKE suite, refusing any this version does not know.
pub(crate) fn suite(r: &mut Reader<'_>, object: &'static str) -> Result<u16> {
    match r.u16("suite").map_err(codec(object))? {
        SUITE_X25519_CHACHA => Ok(SUITE_X25519_CHACHA),
        id => Err(WrapError::UnknownAlgorithm { what: "HPKE suite", id }),
    }
}

/// Refuses a policy whose canonical text the wrapping objects cannot hold.
pub(crate) fn check_policy(policy: &CanonicalPolicy) -> Result<()> {
    limit("policy text length", policy.len(), MAX_POLICY_TEXT)
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
    /// The policy, parsed once: reads as its canonical text.
    pub policy: CanonicalPolicy,
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
        let mut r = reader(bytes, O, ENVELOPE_MAGIC)?;
        suite(&mut r, O)?;
        let secret_id = r.array("secret id").map_err(codec(O))?;
        let policy_id = r.array("policy id").map_err(codec(O))?;
        let key_version = r.u32("key version").map_err(codec(O))?;
        let policy = r.text16("policy").map_err(codec(O))?;
        let enc = r.bytes16("enc").map_err(codec(O))?.to_vec();
        let header_len = bytes.len() - r.remaining();
        let ciphertext = r.bytes32("ciphertext").map_err(codec(O))?.to_vec();
        r.finish().map_err(codec(O))?;
        let policy = CanonicalPolicy::decode(policy, &policy_id, O)?;
        Ok(Self { secret_id, policy_id, key_version, policy, enc, ciphertext, header_len, bytes: bytes.to_vec() })
    }

    /// Seals `secret` to policy key `version` of `policy`, whose public
    /// key is `public`.
    pub(crate) fn seal(
        secret_id: &[u8; 16],
        policy: &CanonicalPolicy,
        version: u32,
        public: &[u8; 32],
        secret: &[u8],
    ) -> Result<Self> {
        check_policy(policy)?;
        limit("secret length", secret.len(), MAX_SECRET)?;
        let header = |enc: &[u8]| {
            let mut w = writer(ENVELOPE_MAGIC);
            w.u16(SUITE_X25519_CHACHA).raw(secret_id).raw(policy.id()).u32(version);
            w.bytes16(policy.as_bytes()).bytes16(enc);
            // The policy was checked above and enc is 32 bytes.
            w.into_bytes().to_vec()
        };
        let (enc, aad, ciphertext) = hpke::seal(public, &header, secret, &mut OsRng)?;
        let mut w = Writer::new(Order::Little);
        w.raw(&aad).bytes32(&ciphertext);
        // The secret was checked above, so its ciphertext fits.
        let bytes = w.into_bytes().to_vec();
        Ok(Self {
            secret_id: *secret_id,
            policy_id: *policy.id(),
            key_version: version,
            policy: policy.clone(),
            enc,
            ciphertext,
            header_len: aad.len(),
            bytes,
        })
    }

    /// The header bytes: HPKE associated data.
    pub(crate) fn aad(&self) -> &[u8] {
        &self.bytes[..self.header_len]
    }

    /// The encoded envelope.
    pub fn to_bytes(&self) -> &[u8] {
        &self.bytes
    }
}
