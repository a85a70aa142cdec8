//! A PKCS#11 token this process uses, and the keys it uses on it. The
//! token is the [`KeyHolder`] of those keys, so the engine runs them on its
//! own executor class ([`OpClass::Token`]). Its module is loaded once per
//! process and the token opened once ([`registry`](super::registry)); its
//! sessions are one pool per token ([`session`](super::session)), with one
//! login ([`login`](super::login)).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

use cryptoki::error::{Error as CkError, RvError};
use cryptoki::object::{Attribute, ObjectClass, ObjectHandle};
use cryptoki::slot::Slot;

use super::login::Pin;
use super::mechanism::sign_on;
use super::public_key::public_key;
use super::registry::{load_module, rv, with_registry, Module};
use super::session::Sessions;
use super::settings::Pkcs11Settings;
use super::uri::{ObjectType, Pkcs11Uri};
use crate::sign::held_key::{Answer, HeldKey, KeyHolder};
use crate::sign::private_key::PrivateKey;
use crate::sign::types::{Algorithm, Hash, KeyKind, OpClass, Operation, Output, SignError, TokenFailure};

/// How the token describes itself (`CK_TOKEN_INFO`): one token, whichever
/// slot it is in now.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct TokenIdentity {
    pub(super) label: String,
    pub(super) serial: String,
    pub(super) model: String,
    pub(super) manufacturer: String,
}

/// A token this process uses, and the keys it uses on it.
pub(crate) struct Token {
    pub(super) module: Arc<Module>,
    pub(super) slot: Slot,
    /// `pkcs11:token=LABEL`, the holder's name in errors and metrics.
    pub(super) name: String,
    /// What the token says it is: with the module and the PIN, the key of
    /// the memory of refused PINs.
    pub(super) identity: TokenIdentity,
    /// Kept to log in again after the token comes back.
    pub(super) pin: Mutex<Option<Pin>>,
    pub(super) login_required: bool,
    pub(super) sessions: Mutex<Sessions>,
    pub(super) keys: RwLock<HashMap<u64, Arc<TokenKey>>>,
    next_id: AtomicU64,
}

/// One key on the token: how to find it again, and the handle signed
/// with now (of a session copy when the token makes one).
pub(super) struct TokenKey {
    template: Vec<Attribute>,
    pub(super) handle: Mutex<KeyHandle>,
    pub(super) kind: KeyKind,
    /// Cleared when the token refuses to copy the key (not
    /// `CKA_COPYABLE`), so it is not asked again.
    copyable: std::sync::atomic::AtomicBool,
}

/// The handle a key is signed with, and the session generation it belongs to.
#[derive(Clone, Copy)]
pub(super) struct KeyHandle {
    generation: u64,
    pub(super) handle: ObjectHandle,
    /// Whether `handle` is a session copy (destroyed when the key is
    /// forgotten).
    copy: bool,
}

impl Token {
    pub(super) fn fail(&self, failure: TokenFailure, reason: impl Into<String>) -> SignError {
        SignError::Token { token: self.name.clone(), failure, reason: reason.into() }
    }

    /// The initialized tokens of `module` that `uri` selects (slot,
    /// identity, whether it needs a login), and the labels of all of them.
    #[allow(clippy::type_complexity)]
    fn matching(
        module: &Module, uri: &Pkcs11Uri, unavailable: &dyn Fn(String) -> SignError,
    ) -> Result<(Vec<(Slot, TokenIdentity, bool)>, Vec<String>), SignError> {
        let slots = module.ctx.get_slots_with_token().map_err(|e| unavailable(format!("listing the slots: {}", rv(&e))))?;
        let mut found = Vec::new();
        let mut seen = Vec::new();
        for slot in slots {
            let Ok(info) = module.ctx.get_token_info(slot) else { continue };
            if !info.token_initialized() {
                continue;
            }
            let identity = TokenIdentity {
                label: info.label().trim_end().to_string(),
                serial: info.serial_number().trim_end().to_string(),
                model: info.model().trim_end().to_string(),
                manufacturer: info.manufacturer_id().trim_end().to_string(),
            };
            seen.push(identity.label.clone());
            let matches = uri.token.as_deref().is_none_or(|t| t == identity.label)
                && uri.serial.as_deref().is_none_or(|s| s == identity.serial)
                && uri.manufacturer.as_deref().is_none_or(|m| m == identity.manufacturer)
                && uri.model.as_deref().is_none_or(|m| m == identity.model)
                && uri.slot_id.is_none_or(|id| id == slot.id());
            if matches {
                found.push((slot, identity, info.login_required()));
            }
        }
        Ok((found, seen))
    }

    /// Opens (or reuses) the token `uri` selects in `module`. With
    /// `discreet` (a signer with fixed settings: an agent, answering a
    /// client), errors name neither the module's path nor the labels of
    /// tokens other than the one the URI selects.
    pub(super) fn open(module: Arc<Module>, uri: &Pkcs11Uri, pin: Option<Pin>, discreet: bool) -> Result<Arc<Token>, SignError> {
        let name = |label: &str| format!("pkcs11:token={label}");
        let asked = || uri.token.as_deref().map_or_else(|| "pkcs11:".to_string(), name);
        let unavailable = |reason: String| SignError::Token { token: asked(), failure: TokenFailure::Unavailable, reason };
        // A token another process is writing (SoftHSM2 rewrites its files
        // at a login) can read as absent for a moment: the slots are
        // listed again, three times at most, before the token is missing.
        let mut tries = 0;
        let (found, seen) = loop {
            let (found, seen) = Self::matching(&module, uri, &unavailable)?;
            tries += 1;
            if found.len() == 1 || tries == 3 {
                break (found, seen);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let mut found = found;
        let not_found = |token: String, reason: String| SignError::Token { token, failure: TokenFailure::NotFound, reason };
        let (slot, identity, login_required) = match found.len() {
            1 => found.remove(0),
            0 if seen.is_empty() && discreet => return Err(unavailable("this signer's PKCS#11 module has no token".into())),
            0 if seen.is_empty() => return Err(unavailable(format!("the module {} has no token", module.path.display()))),
            0 if discreet => return Err(not_found(asked(), "this signer has no token that matches the URI".into())),
            0 => {
                return Err(not_found(
                    asked(),
                    format!("no token matches the URI in {} (its tokens: {})", module.path.display(), seen.join(", ")),
                ))
            }
            n if discreet => return Err(not_found("pkcs11:".into(), format!("{n} tokens match the URI; add token=, serial= or slot-id="))),
            n => {
                return Err(not_found(
                    "pkcs11:".into(),
                    format!("{n} tokens match the URI ({}); add token=, serial= or slot-id=", seen.join(", ")),
                ))
            }
        };
        let existing = with_registry(|r| {
            r.tokens.retain(|t| t.strong_count() > 0);
            r.tokens.iter().filter_map(Weak::upgrade).find(|t| Arc::ptr_eq(&t.module, &module) && t.slot == slot)
        });
        // The token's own locks are taken outside the registry's: a token
        // that hangs in a call made under them must not stop every load.
        if let Some(t) = existing {
            let sessions = t.sessions.lock().unwrap_or_else(|e| e.into_inner());
            let mut current = t.pin.lock().unwrap_or_else(|e| e.into_inner());
            let same = match (current.as_ref(), pin.as_ref()) {
                (Some(a), Some(b)) => a.same_as(b),
                (a, b) => a.is_none() && b.is_none(),
            };
            let refused = current.as_ref().and_then(|p| t.earlier_refusal(p));
            if !same && pin.is_some() && (refused.is_some() || (current.is_none() && !sessions.logged_in)) {
                // The PIN was refused (or none was given) and a new one is
                // given (the operator fixed the PIN file): that one is
                // tried, once.
                *current = pin;
            } else if !same && pin.is_some() && current.is_some() {
                // The first key's PIN logged in; a different PIN for the
                // same token in one process is a configuration mistake
                // that should not be papered over.
                drop((current, sessions));
                return Err(t.fail(TokenFailure::Login, "this process already uses the token with another PIN"));
            }
            drop((current, sessions));
            return Ok(t);
        }
        with_registry(|r| {
            // Another thread may have opened it meanwhile.
            if let Some(t) = r.tokens.iter().filter_map(Weak::upgrade).find(|t| Arc::ptr_eq(&t.module, &module) && t.slot == slot) {
                return Ok(t);
            }
            let t = Arc::new(Token {
                module,
                slot,
                name: name(&identity.label),
                identity,
                pin: Mutex::new(pin),
                login_required,
                sessions: Mutex::new(Sessions { idle: Vec::new(), generation: 0, logged_in: false, keeper: None }),
                keys: RwLock::new(HashMap::new()),
                next_id: AtomicU64::new(1),
            });
            r.tokens.push(Arc::downgrade(&t));
            Ok(t)
        })
    }

    /// Finds the one private key `uri` names, and reads its public key.
    fn find_key(self: &Arc<Self>, uri: &Pkcs11Uri) -> Result<(Vec<Attribute>, ObjectHandle, KeyKind, Vec<u8>), SignError> {
        if let Some(t) = uri.object_type.filter(|t| *t != ObjectType::Private) {
            return Err(SignError::InvalidArgument(format!(
                "the URI names a {t:?} object; keyfence signs with private keys (`type=private`, or no type)"
            )));
        }
        if uri.object.is_none() && uri.id.is_none() {
            return Err(SignError::InvalidArgument("the URI names no key: add `object=LABEL` or `id=%01...`".into()));
        }
        // Token objects only: the session copies made for signing match the
        // other attributes too.
        let mut template = vec![Attribute::Class(ObjectClass::PRIVATE_KEY), Attribute::Token(true)];
        if let Some(label) = &uri.object {
            template.push(Attribute::Label(label.as_bytes().to_vec()));
        }
        if let Some(id) = &uri.id {
            template.push(Attribute::Id(id.clone()));
        }
        let described = uri.object.clone().map_or_else(|| "the id given".to_string(), |o| format!("object={o}"));
        let this = self.clone();
        self.with_session(move |session, generation, _| {
            let handles = session.find_objects(&template)?;
            let handle = match handles.as_slice() {
                [h] => *h,
                [] => {
                    return Ok(Err(this.fail(
                        TokenFailure::NotFound,
                        format!("no private key with {described} on the token (is the PIN right, and the key a token object?)"),
                    )))
                }
                many => {
                    return Ok(Err(
                        this.fail(TokenFailure::NotFound, format!("{} private keys match {described}; add `id=` to the URI", many.len()))
                    ))
                }
            };
            Ok(public_key(session, handle).map(|(kind, der)| (template.clone(), handle, kind, der, generation)))
        })?
        .map(|(template, handle, kind, der, _)| (template, handle, kind, der))
    }

    /// Performs `op` with key `key`.
    fn run(&self, key: &TokenKey, op: &Operation) -> Result<Output, SignError> {
        self.with_session(|session, generation, _| {
            let handle = {
                let mut h = key.handle.lock().unwrap_or_else(|e| e.into_inner());
                // Sessions were dropped since the handle was found (the
                // retry after a reset comes here): find the key again, once
                // per generation, whichever thread gets here first. A handle
                // of a newer generation is never replaced by an older one.
                if h.generation < generation {
                    match session.find_objects(&key.template)?.as_slice() {
                        [one] => *h = self.usable_handle(key, *one, generation),
                        // The key is gone from a token that answers: that
                        // key's error, with no reset of the token's sessions.
                        [] => return Ok(Err(self.fail(TokenFailure::NotFound, "the key is no longer on the token"))),
                        many => return Ok(Err(self.fail(TokenFailure::NotFound, format!("{} keys now match the key's URI", many.len())))),
                    }
                }
                h.handle
            };
            sign_on(session, handle, key.kind, op)
        })?
    }

    /// The handle to sign with for the token object `object`: a copy of it
    /// as a session object when the token makes one, else `object` itself.
    /// A token that keeps its objects in files (SoftHSM2) checks the file
    /// of a token object at every `C_SignInit`, while a session object is
    /// only in the module's memory: with SoftHSM2, two file opens and a
    /// lock a signature less. The copy stays in the token with the
    /// original's attributes (sensitive, not extractable); it lives as
    /// long as the keeper session of this generation. pkcs11-provider
    /// caches keys the same way.
    fn usable_handle(&self, key: &TokenKey, object: ObjectHandle, generation: u64) -> KeyHandle {
        let plain = KeyHandle { generation, handle: object, copy: false };
        if !key.copyable.load(Ordering::Relaxed) {
            return plain;
        }
        let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if s.generation != generation {
            return plain;
        }
        if s.keeper.is_none() {
            s.keeper = self.module.ctx.open_ro_session(self.slot).ok();
        }
        let Some(keeper) = &s.keeper else { return plain };
        match keeper.copy_object(object, &[Attribute::Token(false)]) {
            Ok(copy) => KeyHandle { generation, handle: copy, copy: true },
            // The token will not copy this key: not asked again. Anything
            // else (a token busy or gone) may pass.
            Err(CkError::Pkcs11(
                RvError::ActionProhibited
                | RvError::AttributeReadOnly
                | RvError::AttributeValueInvalid
                | RvError::TemplateInconsistent
                | RvError::FunctionNotSupported,
                _,
            )) => {
                key.copyable.store(false, Ordering::Relaxed);
                plain
            }
            Err(_) => plain,
        }
    }
}

impl KeyHolder for Token {
    fn name(&self) -> &str {
        &self.name
    }

    fn class(&self, _kind: KeyKind) -> OpClass {
        OpClass::Token
    }

    fn admit(&self, _id: u64, _class: OpClass) -> Result<bool, SignError> {
        Ok(false)
    }

    fn perform(&self, id: u64, op: &Operation, _deadline: Instant) -> Result<Output, SignError> {
        let key = self.keys.read().unwrap_or_else(|e| e.into_inner()).get(&id).cloned();
        let key = key.ok_or_else(|| self.fail(TokenFailure::NotFound, "the key was unloaded"))?;
        self.run(&key, op)
    }

    fn start(&self, id: u64, op: Operation, deadline: Instant, answer: Answer) {
        answer.send(self.perform(id, &op, deadline));
    }

    fn forget(&self, id: u64) {
        let Some(key) = self.keys.write().unwrap_or_else(|e| e.into_inner()).remove(&id) else { return };
        let h = *key.handle.lock().unwrap_or_else(|e| e.into_inner());
        let s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if let (true, true, Some(keeper)) = (h.copy, h.generation == s.generation, &s.keeper) {
            let _ = keeper.destroy_object(h.handle);
        }
    }

    fn performs_in_place(&self) -> bool {
        true
    }

    fn max_input(&self) -> usize {
        usize::MAX
    }
}

/// Loads the key `uri` names: finds its token and object, reads its
/// public key, and checks with one signature that the two belong together.
pub(crate) fn load(uri: &Pkcs11Uri, settings: &Pkcs11Settings) -> Result<PrivateKey, SignError> {
    let module = load_module(&settings.module_for(uri)?, settings.fixed)?;
    let pin = settings.pin_for(uri)?;
    let token = Token::open(module, uri, pin, settings.fixed)?;
    let (template, handle, kind, public_der) = token.find_key(uri).map_err(|e| match e {
        SignError::Token { token: t, failure, reason } if t.is_empty() => SignError::Token { token: token.name.clone(), failure, reason },
        e => e,
    })?;
    let generation = token.sessions.lock().unwrap_or_else(|e| e.into_inner()).generation;
    let mut key = TokenKey {
        template,
        handle: Mutex::new(KeyHandle { generation, handle, copy: false }),
        kind,
        copyable: std::sync::atomic::AtomicBool::new(true),
    };
    let usable = token.usable_handle(&key, handle, generation);
    *key.handle.get_mut().unwrap_or_else(|e| e.into_inner()) = usable;
    let key = Arc::new(key);
    let id = token.next_id.fetch_add(1, Ordering::Relaxed);
    token.keys.write().unwrap_or_else(|e| e.into_inner()).insert(id, key);
    let holder: Arc<dyn KeyHolder> = token.clone();
    let private = PrivateKey::held(HeldKey::new(holder, id, kind, public_der));
    match self_test(&private) {
        Ok(true) => Ok(private),
        // The token failed, not the key: its own error.
        Err(e @ SignError::Token { failure: TokenFailure::Unavailable | TokenFailure::Login, .. }) => Err(e),
        Ok(false) => Err(token.fail(TokenFailure::NotFound, "the private key and the public key read beside it do not match")),
        Err(e) => Err(token.fail(TokenFailure::NotFound, format!("the key cannot sign a test message: {e}"))),
    }
}

/// Signs a fixed message with the token key and verifies it against the
/// public key read from the token: `Ok(false)` when the signature does
/// not verify. An RSA key the token allows only PSS for
/// (`CKA_ALLOWED_MECHANISMS`) is tried with PSS after PKCS#1 v1.5.
fn self_test(key: &PrivateKey) -> Result<bool, SignError> {
    use openssl::pkey::PKey;
    use openssl::sign::{RsaPssSaltlen, Verifier};
    let msg = b"keyfence: does the token's key match its public key?";
    let der = key.public_key_der()?;
    let public = PKey::public_key_from_der(&der).map_err(crate::sign::local_key::crypto(crate::sign::CryptoOp::Sign))?;
    let algs: &[Algorithm] = match key.kind() {
        KeyKind::Rsa { .. } => &[Algorithm::RsaPkcs1Sha256, Algorithm::RsaPssSha256],
        KeyKind::EcP256 => &[Algorithm::EcdsaP256Sha256],
        KeyKind::EcP384 => &[Algorithm::EcdsaP384Sha384],
        KeyKind::Ed25519 => &[Algorithm::Ed25519],
    };
    let mut last = None;
    for alg in algs {
        let sig = match key.sign(*alg, msg) {
            Ok(sig) => sig,
            Err(e @ SignError::Token { failure: TokenFailure::Refused, .. }) => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let verified = match alg.hash().and_then(Hash::message_digest) {
            Some(md) => Verifier::new(md, &public).and_then(|mut v| {
                if alg.name().starts_with("rsa-pss") {
                    v.set_rsa_padding(openssl::rsa::Padding::PKCS1_PSS)?;
                    v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH)?;
                }
                v.verify_oneshot(&sig, msg)
            }),
            None => Verifier::new_without_digest(&public).and_then(|mut v| v.verify_oneshot(&sig, msg)),
        };
        return Ok(verified.unwrap_or(false));
    }
    Err(last.unwrap_or_else(|| SignError::InvalidArgument("no algorithm to test the key with".into())))
}
