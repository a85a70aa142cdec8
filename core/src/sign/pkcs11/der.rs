//! The DER keyfence writes and reads for a token, written by hand: the
//! `DigestInfo` header before an RSA PKCS#1 v1.5 digest, an ECDSA
//! signature's `r || s` as `ECDSA-Sig-Value`, the curve names of
//! `CKA_EC_PARAMS`, an Ed25519 `SubjectPublicKeyInfo`'s header, and the
//! OCTET STRING around a `CKA_EC_POINT`.
//!
//! The one DER writer among the crates the build compiles is AWS-LC's
//! (through `openssl`), which would make an ECDSA signature's two integers
//! `BIGNUM`s first; RustCrypto's `der` is in Cargo.lock only as an optional
//! dependency no build turns on, so it would be a new one. What is written
//! here is fixed headers and one SEQUENCE of two INTEGERs, each checked
//! against the bytes AWS-LC writes in the tests below.

use zeroize::Zeroizing;

use crate::sign::types::{Hash, Output, SignError};

/// The DER `DigestInfo` header PKCS#1 v1.5 puts before a digest (none for
/// TLS 1.0's MD5+SHA-1).
pub(super) fn digest_info_prefix(hash: Hash) -> &'static [u8] {
    match hash {
        Hash::Md5Sha1 => &[],
        Hash::Sha256 => &[0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20],
        Hash::Sha384 => &[0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x05, 0x00, 0x04, 0x30],
        Hash::Sha512 => &[0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x05, 0x00, 0x04, 0x40],
    }
}

/// PKCS#11's `r || s` as the DER `ECDSA-Sig-Value` TLS and X.509 use:
/// `SEQUENCE { INTEGER r, INTEGER s }`, each integer without leading
/// zeros but one before a high bit. Written here rather than through
/// AWS-LC's `BIGNUM`s: two allocations and a parse a signature less.
pub(crate) fn ecdsa_der(raw: &[u8]) -> Result<Output, SignError> {
    if raw.is_empty() || !raw.len().is_multiple_of(2) || raw.len() > 132 {
        return Err(SignError::Crypto {
            op: crate::sign::CryptoOp::Sign,
            reason: "the token's ECDSA signature is not r || s of equal lengths".into(),
        });
    }
    let (r, s) = raw.split_at(raw.len() / 2);
    let integer = |v: &[u8], out: &mut Vec<u8>| {
        let start = v.iter().position(|b| *b != 0).unwrap_or(v.len() - 1);
        let v = &v[start..];
        let pad = v[0] & 0x80 != 0;
        out.push(0x02);
        out.push((v.len() + usize::from(pad)) as u8);
        if pad {
            out.push(0);
        }
        out.extend_from_slice(v);
    };
    let mut body = Vec::with_capacity(raw.len() + 6);
    integer(r, &mut body);
    integer(s, &mut body);
    let mut der = Vec::with_capacity(body.len() + 3);
    der.push(0x30);
    // At most 2 * (66 + 3) = 138 bytes: the long form's one length byte.
    if body.len() >= 0x80 {
        der.push(0x81);
    }
    der.push(body.len() as u8);
    der.extend_from_slice(&body);
    Ok(Zeroizing::new(der))
}

// The curves as `CKA_EC_PARAMS` names them: the DER of the curve's OID
// (`ECParameters`' `namedCurve`), or for Ed25519, as PKCS#11 3.0 also
// allows, the PrintableString `edwards25519`, which is what keyfence writes
// when it generates an Ed25519 key. A key on the token may carry either.

/// P-256 (prime256v1), OID 1.2.840.10045.3.1.7.
pub(super) const P256_OID: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
/// P-384 (secp384r1), OID 1.3.132.0.34.
pub(super) const P384_OID: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];
/// Ed25519 by its OID, 1.3.101.112 (`id-Ed25519`, RFC 8410).
pub(super) const ED25519_OID: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];
/// Ed25519 by name: PrintableString (tag 0x13), 12 bytes, `edwards25519`.
pub(super) const ED25519_NAME: &[u8] = b"\x13\x0cedwards25519";

/// The DER `SubjectPublicKeyInfo` of an Ed25519 key up to its 32-byte
/// point: `SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING (no unused
/// bits) }` (RFC 8410).
pub(super) const ED25519_SPKI_PREFIX: &[u8] = &[0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

/// The content of the DER OCTET STRING `p` (a short or one-byte length),
/// or `p` itself when it is not one.
pub(super) fn unwrap_octet_string(p: Vec<u8>) -> Vec<u8> {
    let inner = match p.as_slice() {
        [0x04, n, rest @ ..] if *n < 0x80 && rest.len() == *n as usize => rest,
        [0x04, 0x81, n, rest @ ..] if rest.len() == *n as usize => rest,
        _ => return p,
    };
    inner.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DER this module writes is what AWS-LC writes for the same
    /// r and s, across lengths, zeros and high bits.
    #[test]
    fn ecdsa_der_is_boringssls() {
        use openssl::bn::BigNum;
        use openssl::ecdsa::EcdsaSig;
        let mut cases: Vec<Vec<u8>> = vec![vec![0; 64], vec![0xff; 64], vec![0x7f; 96], vec![0x80; 132]];
        let mut x = 1u8;
        for n in [32usize, 48, 66] {
            for z in 0..3 {
                let mut v: Vec<u8> = (0..2 * n)
                    .map(|_| {
                        x = x.wrapping_mul(167).wrapping_add(13);
                        x
                    })
                    .collect();
                for i in 0..z {
                    v[i] = 0;
                    v[n + i] = 0;
                }
                cases.push(v);
            }
        }
        for raw in cases {
            let (r, s) = raw.split_at(raw.len() / 2);
            let want = EcdsaSig::from_private_components(BigNum::from_slice(r).unwrap(), BigNum::from_slice(s).unwrap())
                .unwrap()
                .to_der()
                .unwrap();
            assert_eq!(&super::ecdsa_der(&raw).unwrap()[..], &want[..], "{raw:02x?}");
        }
        assert!(super::ecdsa_der(&[1, 2, 3]).is_err());
    }

    /// The `DigestInfo` before a digest is what AWS-LC puts there when it
    /// signs with PKCS#1 v1.5: its signature, opened with the public key,
    /// is the header and the digest.
    #[test]
    fn digest_info_is_aws_lcs() {
        use openssl::pkey::PKey;
        use openssl::rsa::{Padding, Rsa};
        use openssl::sign::Signer;
        let rsa = Rsa::generate(2048).unwrap();
        let key = PKey::from_rsa(rsa.clone()).unwrap();
        for hash in [Hash::Sha256, Hash::Sha384, Hash::Sha512] {
            let md = hash.message_digest().unwrap();
            let signature = Signer::new(md, &key).unwrap().sign_oneshot_to_vec(b"keyfence").unwrap();
            let mut opened = vec![0; rsa.size() as usize];
            let n = rsa.public_decrypt(&signature, &mut opened, Padding::PKCS1).unwrap();
            let digest = openssl::hash::hash(md, b"keyfence").unwrap();
            assert_eq!(&opened[..n], &[digest_info_prefix(hash), &digest[..]].concat()[..], "{hash:?}");
        }
        assert!(digest_info_prefix(Hash::Md5Sha1).is_empty(), "TLS 1.0 signs MD5 || SHA-1 bare");
    }

    /// The curves' OIDs are those in the `SubjectPublicKeyInfo` AWS-LC
    /// writes for a key on them, and an Ed25519 key's starts as ours does.
    #[test]
    fn curve_oids_and_the_ed25519_header_are_aws_lcs() {
        use openssl::ec::{EcGroup, EcKey};
        use openssl::nid::Nid;
        use openssl::pkey::PKey;
        // SEQUENCE { SEQUENCE { OID id-ecPublicKey, OID the curve }, BIT STRING },
        // every length in one byte: the algorithm is bytes 4.. of its length.
        let algorithm = |spki: &[u8]| spki[4..4 + usize::from(spki[3])].to_vec();
        for (oid, nid) in [(P256_OID, Nid::X9_62_PRIME256V1), (P384_OID, Nid::SECP384R1)] {
            let key = EcKey::generate(&EcGroup::from_curve_name(nid).unwrap()).unwrap();
            let spki = PKey::from_ec_key(key).unwrap().public_key_to_der().unwrap();
            assert!(algorithm(&spki).ends_with(oid), "{nid:?}: {spki:02x?}");
        }
        let key = PKey::generate_ed25519().unwrap();
        let spki = key.public_key_to_der().unwrap();
        assert_eq!(algorithm(&spki), ED25519_OID);
        assert_eq!(spki[..ED25519_SPKI_PREFIX.len()], *ED25519_SPKI_PREFIX);
        assert_eq!(spki[ED25519_SPKI_PREFIX.len()..], key.raw_public_key().unwrap()[..]);
    }

    /// A point in its OCTET STRING, with a short length (P-256's and
    /// P-384's) or a one-byte long one, is unwrapped; anything else is
    /// left as it is.
    #[test]
    fn an_octet_string_is_unwrapped_and_nothing_else() {
        let (p384, long) = (vec![4u8; 97], vec![4u8; 133]);
        assert_eq!(unwrap_octet_string([&[0x04, 97][..], &p384].concat()), p384);
        assert_eq!(unwrap_octet_string([&[0x04, 0x81, 133][..], &long].concat()), long);
        for other in [vec![0x04, 3, 1, 2], vec![0x04, 0x81, 3, 1], vec![0x03, 2, 1, 2], vec![0x04], vec![]] {
            assert_eq!(unwrap_octet_string(other.clone()), other);
        }
    }
}
