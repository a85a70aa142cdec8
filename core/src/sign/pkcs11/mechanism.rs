//! Which PKCS#11 mechanism performs each operation, with which
//! parameters, and what is done on this side of the call (the digest, the
//! `DigestInfo`, the ECDSA signature's DER).

use cryptoki::error::Error as CkError;
use cryptoki::mechanism::eddsa::{EddsaParams, EddsaSignatureScheme};
use cryptoki::mechanism::rsa::{PkcsMgfType, PkcsPssParams};
use cryptoki::mechanism::{Mechanism, MechanismType};
use cryptoki::object::ObjectHandle;
use cryptoki::session::Session;
use zeroize::Zeroizing;

use super::der::{digest_info_prefix, ecdsa_der};
use crate::sign::local_key::digest_of;
use crate::sign::types::{Family, Hash, Input, KeyKind, Operation, Output, SignError};

/// `op` on the token: the mechanism for each algorithm, with the digest
/// computed here (so `CKM_ECDSA`, `CKM_RSA_PKCS` and `CKM_RSA_PKCS_PSS`,
/// which every token offers, rather than the hash-and-sign mechanisms
/// fewer do).
pub(super) fn sign_on(
    session: &Session, handle: ObjectHandle, kind: KeyKind, op: &Operation,
) -> Result<Result<Output, SignError>, CkError> {
    let (alg, input) = match op {
        Operation::DecryptRaw { ciphertext } => {
            return Ok(Ok(Zeroizing::new(session.decrypt(&Mechanism::RsaX509, handle, ciphertext)?)));
        }
        Operation::Sign { alg, input } => (*alg, input),
    };
    let Some(hash) = alg.hash() else {
        // Ed25519 signs the whole message.
        let Input::Message(m) = input else {
            return Ok(Err(SignError::DigestNotSupported(alg)));
        };
        let mech = Mechanism::Eddsa(EddsaParams::new(EddsaSignatureScheme::Pure));
        return Ok(Ok(Zeroizing::new(session.sign(&mech, handle, m)?)));
    };
    let (bytes, prehashed) = match input {
        Input::Message(m) => (m, false),
        Input::Digest(d) => (d, true),
    };
    let digest = match digest_of(hash, bytes, prehashed) {
        Ok(d) => d,
        Err(e) => return Ok(Err(e)),
    };
    match alg.family() {
        Family::RsaPkcs1 => {
            let mut data = digest_info_prefix(hash).to_vec();
            data.extend_from_slice(&digest);
            Ok(Ok(Zeroizing::new(session.sign(&Mechanism::RsaPkcs, handle, &data)?)))
        }
        Family::RsaPss => {
            let (hash_alg, mgf) = match hash {
                Hash::Sha256 => (MechanismType::SHA256, PkcsMgfType::MGF1_SHA256),
                Hash::Sha384 => (MechanismType::SHA384, PkcsMgfType::MGF1_SHA384),
                Hash::Sha512 => (MechanismType::SHA512, PkcsMgfType::MGF1_SHA512),
                Hash::Md5Sha1 => return Ok(Err(SignError::KeyMismatch { alg, key: kind })),
            };
            let params = PkcsPssParams { hash_alg, mgf, s_len: (hash.len() as u64).into() };
            Ok(Ok(Zeroizing::new(session.sign(&Mechanism::RsaPkcsPss(params), handle, &digest)?)))
        }
        Family::EcdsaP256 | Family::EcdsaP384 => {
            let raw = session.sign(&Mechanism::Ecdsa, handle, &digest)?;
            Ok(ecdsa_der(&raw))
        }
        _ => Ok(Err(SignError::KeyMismatch { alg, key: kind })),
    }
}
