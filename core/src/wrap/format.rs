//! The envelope, and what every wrapping object shares: small, versioned
//! and self-describing, like age's, read and written with the crate's one
//! codec. All integers little-endian (`docs/wrapping.md`, "Formats").
//!
//! ```text
//! envelope      = "KFE2" | suite u16 | authority key [32] | secret id [16] | policy id [32] | key version u32
//!                 | policy (u16-prefixed canonical text) | enc (u16-prefixed) | ciphertext (u32-prefixed)
//!                 | signature [64]
//! sealed key    = "KFP2" | suite u16 | authority key [32] | policy id [32] | key version u32 | master generation u32
//!                 | policy (u16-prefixed) | public key (u16-prefixed) | CP-ABE ciphertext (u32-prefixed)
//!                 | signature [64]
//! machine key   = "KFM2" | authority key [32] | u16 n | n x (label, value: u16-prefixed) | count u16
//!                 | count x (generation u32 | CP-ABE attribute key (u32-prefixed))
//! authority     = "KFA2" | signing key [32] | u16 n | n x generation | u32 m | m x policy key
//! ```
//!
//! An envelope's HPKE associated data is its whole header (everything
//! before the ciphertext), so its authority, secret id, policy, key version
//! and suite are bound to the ciphertext. A sealed key's CP-ABE plaintext
//! repeats its header fields in front of the private key, and opening
//! checks them. Envelopes and sealed keys end with the authority's Ed25519
//! signature of everything before it; machines check it against the
//! authority key their machine key carries. Version 1 objects (`KF?1`,
//! unsigned) are refused with a message saying so.

use rand_core::OsRng;

use super::error::{codec, limit, malformed, wrong_authority, Result, WrapError};
use super::hpke;
use super::policy::CanonicalPolicy;
use super::signing::{self, AuthorityKey, ENVELOPE_CONTEXT, SIGNATURE_LEN};
use crate::codec::{Order, Reader, Writer};

/// HPKE suite 1: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
/// ChaCha20-Poly1305 (RFC 9180 ids 0x0020, 0x0001, 0x0003).
pub const SUITE_X25519_CHACHA: u16 = 1;

pub(crate) const ENVELOPE_MAGIC: &[u8; 4] = b"KFE2";
pub(crate) const SEALED_MAGIC: &[u8; 4] = b"KFP2";
/// A sealed policy key that names the revoked machines its CP-ABE policy
/// excludes (written only when it excludes some, so stores without
/// revocations hold exactly what earlier versions wrote).
pub(crate) const SEALED_EXCLUDING_MAGIC: &[u8; 4] = b"KFP3";
/// The signed list of revoked machine ids (`public/revoked`).
pub(crate) const REVOKED_MAGIC: &[u8; 4] = b"KFR2";
pub(crate) const MACHINE_MAGIC: &[u8; 4] = b"KFM2";
pub(crate) const STATE_MAGIC: &[u8; 4] = b"KFA2";
/// The signed generation list (`2` as the other objects of this version;
/// the list before it was unsigned text, with no magic).
pub(crate) const GENERATIONS_MAGIC: &[u8; 4] = b"KFG2";
/// The newest lists a machine accepted, kept beside its key (`newest`).
pub(crate) const NEWEST_MAGIC: &[u8; 4] = b"KFN2";

/// Longest canonical policy text the objects' 16-bit policy fields hold.
pub(crate) const MAX_POLICY_TEXT: usize = u16::MAX as usize;
/// Largest secret an envelope holds: its ciphertext (the secret and a
/// 16-byte tag) behind a 32-bit length.
pub(crate) const MAX_SECRET: usize = u32::MAX as usize - 16;

/// A reader over `bytes` past its magic.
pub(crate) fn reader<'a>(bytes: &'a [u8], object: &'static str, magic: &[u8; 4]) -> Result<Reader<'a>> {
    let mut r = Reader::new(bytes, Order::Little);
    let found = r.array::<4>("magic").map_err(codec(object))?;
    if &found != magic {
        // Same kind, older version: say so, rather than "not an envelope".
        if found[..3] == magic[..3] && found[3] == b'1' {
            return Err(malformed(
                object,
                format!(
                    "format version 1 ({:?}), written before keyfence signed its objects; this version refuses it \
                     (docs/wrapping.md, \"Format versions\")",
                    String::from_utf8_lossy(&found)
                ),
            ));
        }
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

/// Checks that an object naming authority key `found`, whose signed bytes
/// are `body` and signature `signature`, was made by `trusted`.
pub(crate) fn check_signed(
    object: &'static str, context: &[u8], trusted: &[u8; 32], found: &[u8; 32], body: &[u8], signature: &[u8; SIGNATURE_LEN],
) -> Result<()> {
    if found != trusted {
        return Err(wrong_authority(object, found, trusted));
    }
    if !signing::verify(trusted, context, body, signature) {
        return Err(WrapError::Tampered { object });
    }
    Ok(())
}

/// A parsed envelope: a customer secret sealed to a policy key, signed by
/// the authority that made it.
#[derive(Clone, Debug)]
pub struct Envelope {
    /// Stable id of the wrapped secret (kept across re-wraps).
    pub secret_id: [u8; 16],
    /// The public key of the authority that made (and signed) it.
    pub authority: [u8; 32],
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
        let authority = r.array("authority key").map_err(codec(O))?;
        let secret_id = r.array("secret id").map_err(codec(O))?;
        let policy_id = r.array("policy id").map_err(codec(O))?;
        let key_version = r.u32("key version").map_err(codec(O))?;
        let policy = r.text16("policy").map_err(codec(O))?;
        let enc = r.bytes16("enc").map_err(codec(O))?.to_vec();
        let header_len = bytes.len() - r.remaining();
        let ciphertext = r.bytes32("ciphertext").map_err(codec(O))?.to_vec();
        r.array::<SIGNATURE_LEN>("signature").map_err(codec(O))?;
        r.finish().map_err(codec(O))?;
        let policy = CanonicalPolicy::decode(policy, &policy_id, O)?;
        Ok(Self { secret_id, authority, policy_id, key_version, policy, enc, ciphertext, header_len, bytes: bytes.to_vec() })
    }

    /// Checks that the authority whose public key is `trusted` made this
    /// envelope and that nobody changed it since: its authority field and
    /// its signature. No decryption.
    ///
    /// # Errors
    /// [`WrapError::WrongAuthority`] if it names another authority;
    /// [`WrapError::Tampered`] if the signature does not verify.
    pub fn verify(&self, trusted: &[u8; 32]) -> Result<()> {
        let (body, signature) = self.bytes.split_at(self.bytes.len() - SIGNATURE_LEN);
        // Parsing checked the length, so the split is exactly 64 bytes.
        let signature: &[u8; SIGNATURE_LEN] = signature.try_into().map_err(|_| WrapError::Tampered { object: "envelope" })?;
        check_signed("envelope", ENVELOPE_CONTEXT, trusted, &self.authority, body, signature)
    }

    /// Seals `secret` to policy key `version` of `policy`, whose public
    /// key is `public`, and signs it with `signer`.
    pub(crate) fn seal(
        signer: &AuthorityKey, secret_id: &[u8; 16], policy: &CanonicalPolicy, version: u32, public: &[u8; 32], secret: &[u8],
    ) -> Result<Self> {
        check_policy(policy)?;
        limit("secret length", secret.len(), MAX_SECRET)?;
        let authority = signer.public();
        let header = |enc: &[u8]| {
            let mut w = writer(ENVELOPE_MAGIC);
            w.u16(SUITE_X25519_CHACHA).raw(&authority).raw(secret_id).raw(policy.id()).u32(version);
            w.bytes16(policy.as_bytes()).bytes16(enc);
            // The policy was checked above and enc is 32 bytes.
            w.into_bytes().to_vec()
        };
        let (enc, aad, ciphertext) = hpke::seal(public, &header, secret, &mut OsRng)?;
        let mut w = Writer::new(Order::Little);
        w.raw(&aad).bytes32(&ciphertext);
        // The secret was checked above, so its ciphertext fits.
        let mut bytes = w.into_bytes().to_vec();
        let signature = signer.sign(ENVELOPE_CONTEXT, &bytes);
        bytes.extend_from_slice(&signature);
        Ok(Self {
            secret_id: *secret_id,
            authority,
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
