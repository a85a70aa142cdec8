//! A key's kind and public key, as a reply describes a key: the key
//! process's LOAD success and a key server's PUBLIC success.
//!
//! ```text
//! key     = kind:u8 (1 RSA, 2 P-256, 3 P-384, 4 Ed25519)  bits:u16  spki:bytes32
//! ```

use super::frame::{reader, BodyError};
use crate::codec::{Order, Writer};
use crate::sign::types::KeyKind;

/// The body describing a key of `kind` whose public key is `public_der`
/// (SubjectPublicKeyInfo, DER).
pub fn encode(kind: KeyKind, public_der: &[u8]) -> Vec<u8> {
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

/// Decodes a key's description: its kind and public key.
///
/// # Errors
/// [`BodyError`] naming the field: an unknown kind, an RSA size outside
/// 2048..=4096, a short or long body.
pub fn parse(body: &[u8]) -> Result<(KeyKind, Vec<u8>), BodyError> {
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
