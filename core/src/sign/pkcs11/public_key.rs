//! A token key's public half, read from the token's objects (never from
//! the private key's secret attributes) and written as the DER
//! `SubjectPublicKeyInfo` the rest of keyfence verifies with.

use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::Session;

use super::der::{unwrap_octet_string, ED25519_NAME, ED25519_OID, ED25519_SPKI_PREFIX, P256_OID, P384_OID};
use crate::sign::types::{KeyKind, SignError, TokenFailure};

/// The key's kind and its public key (DER `SubjectPublicKeyInfo`), read
/// from the token: RSA's modulus and exponent from the private key object,
/// an EC or Ed25519 point from the public key object beside it (same
/// `CKA_ID`, else same label). Nothing secret is read.
pub(super) fn public_key(session: &Session, handle: ObjectHandle) -> Result<(KeyKind, Vec<u8>), SignError> {
    use openssl::pkey::PKey;
    let unsupported = |what: String| SignError::Token { token: String::new(), failure: TokenFailure::NotFound, reason: what };
    let attr = |h, t: AttributeType| -> Option<Attribute> { session.get_attributes(h, &[t]).ok()?.into_iter().next() };
    let key_type = match attr(handle, AttributeType::KeyType) {
        Some(Attribute::KeyType(t)) => t,
        _ => return Err(unsupported("the private key object has no readable key type".into())),
    };
    let crypto = |e: openssl::error::ErrorStack| unsupported(format!("the token's public key cannot be read: {e}"));
    if key_type == KeyType::RSA {
        let (Some(Attribute::Modulus(n)), Some(Attribute::PublicExponent(e))) =
            (attr(handle, AttributeType::Modulus), attr(handle, AttributeType::PublicExponent))
        else {
            return Err(unsupported("the RSA key object shows no modulus and public exponent".into()));
        };
        let rsa = openssl::rsa::Rsa::from_public_components(
            openssl::bn::BigNum::from_slice(&n).map_err(crypto)?,
            openssl::bn::BigNum::from_slice(&e).map_err(crypto)?,
        )
        .map_err(crypto)?;
        let bits = rsa.n().num_bits() as u32;
        if !(2048..=4096).contains(&bits) {
            return Err(unsupported(format!("RSA keys must be 2048 to 4096 bits; this one has {bits} bits")));
        }
        let der = PKey::from_rsa(rsa).and_then(|p| p.public_key_to_der()).map_err(crypto)?;
        return Ok((KeyKind::Rsa { bits }, der));
    }
    if key_type != KeyType::EC && key_type != KeyType::EC_EDWARDS {
        return Err(unsupported(format!("unsupported key type {key_type}; RSA, ECDSA (P-256, P-384) and Ed25519 are supported")));
    }
    let params = match attr(handle, AttributeType::EcParams) {
        Some(Attribute::EcParams(p)) => p,
        _ => return Err(unsupported("the EC key object shows no curve (CKA_EC_PARAMS)".into())),
    };
    let expected = match params.as_slice() {
        P256_OID => 65,
        P384_OID => 97,
        _ => 32,
    };
    let point = public_point(session, handle, expected).ok_or_else(|| {
        unsupported(
            "the token holds no public key object beside the private key (same CKA_ID or label): keyfence reads the public key from it"
                .into(),
        )
    })?;
    if key_type == KeyType::EC_EDWARDS {
        if params != ED25519_OID && params != ED25519_NAME {
            return Err(unsupported("an Edwards curve other than Ed25519".into()));
        }
        if point.len() != 32 {
            return Err(unsupported("the Ed25519 public key is not 32 bytes".into()));
        }
        let mut der = ED25519_SPKI_PREFIX.to_vec();
        der.extend_from_slice(&point);
        return Ok((KeyKind::Ed25519, der));
    }
    let (kind, nid) = match params.as_slice() {
        P256_OID => (KeyKind::EcP256, openssl::nid::Nid::X9_62_PRIME256V1),
        P384_OID => (KeyKind::EcP384, openssl::nid::Nid::SECP384R1),
        _ => return Err(unsupported("an elliptic curve other than P-256 and P-384".into())),
    };
    let group = openssl::ec::EcGroup::from_curve_name(nid).map_err(crypto)?;
    let mut ctx = openssl::bn::BigNumContext::new().map_err(crypto)?;
    let p = openssl::ec::EcPoint::from_bytes(&group, &point, &mut ctx).map_err(crypto)?;
    let ec = openssl::ec::EcKey::from_public_key(&group, &p).map_err(crypto)?;
    let der = PKey::from_ec_key(ec).and_then(|p| p.public_key_to_der()).map_err(crypto)?;
    Ok((kind, der))
}

/// The public point of the key pair `private` belongs to, unwrapped from
/// the DER OCTET STRING PKCS#11 gives it in.
fn public_point(session: &Session, private: ObjectHandle, expected: usize) -> Option<Vec<u8>> {
    let attrs = session.get_attributes(private, &[AttributeType::Id, AttributeType::Label]).ok()?;
    let mut template = vec![Attribute::Class(ObjectClass::PUBLIC_KEY)];
    for a in attrs {
        match a {
            Attribute::Id(id) if !id.is_empty() => template.push(Attribute::Id(id)),
            Attribute::Label(l) if !l.is_empty() => template.push(Attribute::Label(l)),
            _ => {}
        }
    }
    let handles = session.find_objects(&template).ok()?;
    let [public] = handles.as_slice() else { return None };
    match session.get_attributes(*public, &[AttributeType::EcPoint]).ok()?.into_iter().next()? {
        // Some tokens give the point bare: a bare point of the curve's
        // length is never read as a DER wrapper.
        Attribute::EcPoint(p) if p.len() == expected => Some(p),
        Attribute::EcPoint(p) => Some(unwrap_octet_string(p)),
        _ => None,
    }
}
