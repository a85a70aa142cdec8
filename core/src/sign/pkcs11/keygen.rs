//! Generating a key pair on a token: what `keyfence pkcs11 keygen` runs.

use cryptoki::error::Error as CkError;
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, ObjectClass};

use super::der::{ED25519_NAME, P256_OID, P384_OID};
use super::registry::{load_module, rv};
use super::settings::Pkcs11Settings;
use super::token::Token;
use super::uri::Pkcs11Uri;
use crate::sign::types::{KeyKind, SignError, TokenFailure};

/// Generates a key pair of `kind` on the token `uri` names (see
/// [`super::generate`]).
pub(crate) fn generate(uri: &Pkcs11Uri, kind: KeyKind, settings: &Pkcs11Settings) -> Result<(), SignError> {
    let Some(label) = uri.object.clone() else {
        return Err(SignError::InvalidArgument("name the new key with `object=LABEL` in the URI".into()));
    };
    let module = load_module(&settings.module_for(uri)?, settings.fixed)?;
    let token = Token::open(module, uri, settings.pin_for(uri)?, settings.fixed)?;
    let fail = |e: CkError| token.fail(TokenFailure::Refused, rv(&e));
    let session = token.module.ctx.open_rw_session(token.slot).map_err(|e| token.fail(TokenFailure::Unavailable, rv(&e)))?;
    token.login(&session)?;
    let mut label_and_id = vec![Attribute::Label(label.as_bytes().to_vec())];
    if let Some(id) = &uri.id {
        label_and_id.push(Attribute::Id(id.clone()));
    }
    for attr in &label_and_id {
        let existing = session.find_objects(&[Attribute::Class(ObjectClass::PRIVATE_KEY), attr.clone()]).map_err(fail)?;
        if !existing.is_empty() {
            return Err(SignError::InvalidArgument(format!(
                "{}: a private key with this {} exists already",
                token.name,
                match attr {
                    Attribute::Label(_) => "label",
                    _ => "id",
                }
            )));
        }
    }
    let mut public = vec![Attribute::Token(true), Attribute::Verify(true)];
    let mut private = vec![
        Attribute::Token(true),
        Attribute::Private(true),
        Attribute::Sensitive(true),
        Attribute::Extractable(false),
        Attribute::Sign(true),
    ];
    public.extend(label_and_id.iter().cloned());
    private.extend(label_and_id);
    let mechanism = match kind {
        KeyKind::Rsa { bits } => {
            public.push(Attribute::ModulusBits(u64::from(bits).into()));
            public.push(Attribute::PublicExponent(vec![0x01, 0x00, 0x01]));
            public.push(Attribute::Encrypt(true));
            private.push(Attribute::Decrypt(true));
            Mechanism::RsaPkcsKeyPairGen
        }
        KeyKind::EcP256 | KeyKind::EcP384 => {
            public.push(Attribute::EcParams(if kind == KeyKind::EcP256 { P256_OID } else { P384_OID }.to_vec()));
            Mechanism::EccKeyPairGen
        }
        KeyKind::Ed25519 => {
            public.push(Attribute::EcParams(ED25519_NAME.to_vec()));
            Mechanism::EccEdwardsKeyPairGen
        }
    };
    session.generate_key_pair(&mechanism, &public, &private).map_err(fail)?;
    Ok(())
}
