//! A PKCS#11 token: its module (loaded once per process), its sessions
//! (one pool per token, growing to as many as sign at once: the engine's
//! token threads, or a key process's workers), the login, and the keys
//! this process uses on it. The token is the [`KeyHolder`] of those keys,
//! so the engine runs them on its own executor class ([`OpClass::Token`]).
//!
//! A session the token no longer knows (`CKR_SESSION_HANDLE_INVALID`,
//! `CKR_DEVICE_REMOVED`, ...) is dropped with every other session of the
//! token; the token is logged into again, the key found again by its
//! attributes, and the operation retried once. A token that is still gone
//! fails with [`TokenFailure::Unavailable`]. A refused PIN is never tried
//! again by itself: every later operation and load fails at once with
//! [`TokenFailure::Login`], so keyfence cannot lock the token's PIN. The
//! refusal is remembered for the whole process, not with the token's
//! object (which goes when its last key does), until the PIN changes: see
//! [`LoginMemory`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, RwLock, Weak};
use std::time::Instant;

use cryptoki::context::{CInitializeArgs, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::mechanism::eddsa::{EddsaParams, EddsaSignatureScheme};
use cryptoki::mechanism::rsa::{PkcsMgfType, PkcsPssParams};
use cryptoki::mechanism::{Mechanism, MechanismType};
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::Slot;
use zeroize::Zeroizing;

use super::uri::{ObjectType, Pkcs11Uri};
use crate::sign::held_key::{Answer, HeldKey, KeyHolder};
use crate::sign::local_key::digest_of;
use crate::sign::private_key::PrivateKey;
use crate::sign::types::{Algorithm, Family, Hash, Input, KeyKind, OpClass, Operation, Output, SignError, TokenFailure};

/// Where the module and the PIN come from when the URI does not say, and
/// what a URI may name: see [`Pkcs11Settings::from_env`].
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pkcs11Settings {
    /// The module used when the URI names none (`KEYFENCE_PKCS11_MODULE`).
    pub module: Option<PathBuf>,
    /// The file holding the PIN when the URI names none
    /// (`KEYFENCE_PKCS11_PIN_FILE`).
    pub pin_file: Option<PathBuf>,
    /// The PIN itself, when no file is named (`KEYFENCE_PKCS11_PIN`).
    pub pin: Option<Zeroizing<String>>,
    /// Refuse a URI's `module-path`, `module-name` and `pin-source` unless
    /// they name the module and PIN file above: what an agent sets, so a
    /// client cannot make it load a library or read a file of its choice.
    /// Errors then name neither the module's path nor the PIN file's, nor
    /// the labels of tokens other than the one the URI selects: they go to
    /// clients the signer does not trust.
    pub fixed: bool,
}

impl std::fmt::Debug for Pkcs11Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pkcs11Settings")
            .field("module", &self.module)
            .field("pin_file", &self.pin_file)
            .field("pin", &self.pin.as_ref().map(|_| "<set>"))
            .field("fixed", &self.fixed)
            .finish()
    }
}

impl Pkcs11Settings {
    /// Settings from the environment: `KEYFENCE_PKCS11_MODULE` (the
    /// module's file), `KEYFENCE_PKCS11_PIN_FILE` (a file whose first line
    /// is the PIN) and `KEYFENCE_PKCS11_PIN` (the PIN itself; for a
    /// service manager's credential, never typed on a command line).
    pub fn from_env() -> Self {
        let path = |name| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        Pkcs11Settings {
            module: path("KEYFENCE_PKCS11_MODULE"),
            pin_file: path("KEYFENCE_PKCS11_PIN_FILE"),
            pin: std::env::var("KEYFENCE_PKCS11_PIN").ok().filter(|p| !p.is_empty()).map(Zeroizing::new),
            fixed: false,
        }
    }

    /// The module file `uri` names, or these settings' module.
    fn module_for(&self, uri: &Pkcs11Uri) -> Result<PathBuf, SignError> {
        let named = match (&uri.module_path, &uri.module_name) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(name)) => Some(p11_kit_module(name)?),
            (None, None) => None,
        };
        match (named, &self.module) {
            // The fixed module's path is not the client's to learn.
            (Some(p), Some(fixed)) if self.fixed && !same_file(&p, fixed) => Err(SignError::InvalidArgument(format!(
                "this signer loads only the PKCS#11 module it was started with; the URI names {}",
                p.display()
            ))),
            // The fixed file itself, never the name the client gave: a link
            // the client controls could point elsewhere by the time it is
            // opened.
            (Some(_), Some(fixed)) if self.fixed => Ok(fixed.clone()),
            (Some(_), None) if self.fixed => Err(SignError::InvalidArgument(
                "this signer was started without a PKCS#11 module, and loads none a client names".into(),
            )),
            (Some(p), _) => Ok(p),
            (None, Some(m)) => Ok(m.clone()),
            (None, None) => Err(SignError::Config(
                "no PKCS#11 module: name it in the URI (`?module-path=/usr/lib/softhsm/libsofthsm2.so`) or set KEYFENCE_PKCS11_MODULE"
                    .into(),
            )),
        }
    }

    /// The PIN for `uri`: its `pin-source`, else the PIN file, else the
    /// PIN; `None` when none is given.
    fn pin_for(&self, uri: &Pkcs11Uri) -> Result<Option<Pin>, SignError> {
        let file = match (&uri.pin_source, &self.pin_file) {
            (Some(p), Some(fixed)) if self.fixed && !same_file(p, fixed) => {
                return Err(SignError::InvalidArgument(
                    "this signer reads only the PIN file it was started with; the URI's pin-source names another".into(),
                ))
            }
            (Some(_), None) if self.fixed => {
                return Err(SignError::InvalidArgument("this signer reads no PIN file a client names".into()))
            }
            (Some(_), Some(fixed)) if self.fixed => Some(fixed),
            (Some(p), _) => Some(p),
            (None, f) => f.as_ref(),
        };
        match file {
            Some(path) => {
                // A fixed PIN file's path is not the client's to learn.
                let shown = if self.fixed { "this signer's PIN file".to_string() } else { format!("the PIN file {}", path.display()) };
                let secret = read_pin(path, &shown)?;
                let source = PinSource::File(std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()));
                Ok(Some(Pin::new(secret, source, shown)))
            }
            None => Ok(self.pin.clone().map(|secret| Pin::new(secret, PinSource::Value, "the PIN setting (KEYFENCE_PKCS11_PIN)".into()))),
        }
    }
}

/// A PIN to log in with: the secret (zeroized when dropped; kept by the
/// token's object to log in again after the token comes back), where it
/// came from, and a keyed digest of it, which is all that the memory of
/// refused PINs ([`LoginMemory`]) keeps.
#[derive(Clone)]
struct Pin {
    secret: Zeroizing<String>,
    source: PinSource,
    digest: [u8; 32],
    /// Where it came from, for messages: `the PIN file /etc/pin`, or, for
    /// a signer with fixed settings (an agent), no path.
    shown: String,
}

/// Where a PIN was read: a PIN file (its canonical path), or the settings'
/// PIN (`KEYFENCE_PKCS11_PIN`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum PinSource {
    File(PathBuf),
    Value,
}

impl Pin {
    fn new(secret: Zeroizing<String>, source: PinSource, shown: String) -> Pin {
        let digest = pin_digest(&secret);
        Pin { secret, source, digest, shown }
    }

    /// Whether `other` is the same PIN, compared in constant time (on the
    /// digests, which have the same length whatever the PINs').
    fn same_as(&self, other: &Pin) -> bool {
        use subtle::ConstantTimeEq;
        bool::from(self.digest.ct_eq(&other.digest))
    }
}

/// A keyed BLAKE2b digest of `pin`, under a key drawn at random once per
/// process: equal PINs give equal digests in this process, and a digest
/// read out of its memory cannot be checked against guessed PINs without
/// the key, nor matched with another process's.
fn pin_digest(pin: &str) -> [u8; 32] {
    static KEY: LazyLock<Zeroizing<[u8; 32]>> = LazyLock::new(|| {
        use rand_core::RngCore;
        let mut key = Zeroizing::new([0u8; 32]);
        rand_core::OsRng.fill_bytes(&mut key[..]);
        key
    });
    let hash = blake2b_simd::Params::new().hash_length(32).key(&KEY[..]).personal(b"keyfence-pin").hash(pin.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(hash.as_bytes());
    out
}

fn same_file(a: &Path, b: &Path) -> bool {
    a == b || matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
}

/// The first line of `path`, without its line end; `shown` names the
/// file in errors.
fn read_pin(path: &Path, shown: &str) -> Result<Zeroizing<String>, SignError> {
    let bytes = Zeroizing::new(std::fs::read(path).map_err(|e| SignError::InvalidArgument(format!("cannot read {shown}: {e}")))?);
    let text = std::str::from_utf8(&bytes).map_err(|_| SignError::InvalidArgument(format!("{shown} is not UTF-8")))?;
    let pin = text.split(['\n', '\r']).next().unwrap_or("");
    if pin.is_empty() {
        return Err(SignError::InvalidArgument(format!("{shown} is empty")));
    }
    Ok(Zeroizing::new(pin.to_owned()))
}

/// The file p11-kit's configuration names for module `name`
/// (`/etc/pkcs11/modules/NAME.module`, then the packaged ones), as
/// `module-name=` asks.
fn p11_kit_module(name: &str) -> Result<PathBuf, SignError> {
    let dirs = ["/etc/pkcs11/modules", "/usr/share/p11-kit/modules"];
    for dir in dirs {
        let Ok(text) = std::fs::read_to_string(Path::new(dir).join(format!("{name}.module"))) else { continue };
        for line in text.lines() {
            if let Some(v) = line.trim().strip_prefix("module:") {
                let v = v.trim();
                let p = PathBuf::from(v);
                if p.is_absolute() {
                    return Ok(p);
                }
                let multiarch = format!("/usr/lib/{}-linux-gnu/pkcs11", std::env::consts::ARCH);
                return Ok(Path::new(&multiarch).join(p));
            }
        }
    }
    Err(SignError::Config(format!("no p11-kit module named `{name}` (looked for {name}.module in {})", dirs.join(", "))))
}

/// Checks that the module `uri` and `settings` name is a file, without
/// loading it.
pub(crate) fn module_exists(uri: &Pkcs11Uri, settings: &Pkcs11Settings) -> Result<(), SignError> {
    let path = settings.module_for(uri)?;
    std::fs::metadata(&path)
        .map(|_| ())
        .map_err(|e| SignError::Config(format!("the PKCS#11 module {} cannot be opened: {e}", path.display())))
}

/// A module loaded and initialized in this process.
struct Module {
    ctx: Pkcs11,
    path: PathBuf,
}

/// The modules and tokens this process has open, so every key of a token
/// shares one session pool and one login. Entries of another process
/// (before a `fork`) are never reused: PKCS#11 needs `C_Initialize` again
/// in a child.
struct Registry {
    pid: u32,
    modules: Vec<Arc<Module>>,
    tokens: Vec<Weak<Token>>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut guard = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    if guard.as_ref().map_or(true, |r| r.pid != pid) {
        // A parent's modules: forgotten, never finalized here (the parent
        // owns them); a fresh load initializes the module for this process.
        if let Some(old) = guard.take() {
            std::mem::forget(old);
        }
        *guard = Some(Registry { pid, modules: Vec::new(), tokens: Vec::new() });
    }
    f(guard.get_or_insert_with(|| Registry { pid, modules: Vec::new(), tokens: Vec::new() }))
}

/// Loads (or reuses) the module at `path`. With `discreet` (a signer with
/// fixed settings: an agent, answering its clients), errors do not name
/// the module's path: the dynamic loader's message, which does, is left out.
fn load_module(path: &Path, discreet: bool) -> Result<Arc<Module>, SignError> {
    let shown = if discreet { "this signer's PKCS#11 module".to_string() } else { format!("the PKCS#11 module {}", path.display()) };
    let canonical = std::fs::canonicalize(path).map_err(|e| SignError::Config(format!("{shown} cannot be opened: {e}")))?;
    with_registry(|r| {
        if let Some(m) = r.modules.iter().find(|m| m.path == canonical) {
            return Ok(m.clone());
        }
        let ctx = Pkcs11::new(&canonical).map_err(|e| match discreet {
            true => SignError::Config(format!("{shown} cannot be loaded")),
            false => SignError::Config(format!("{shown} cannot be loaded: {e}")),
        })?;
        match ctx.initialize(CInitializeArgs::OsThreads) {
            Ok(()) | Err(CkError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
            Err(e) => return Err(SignError::Config(format!("{shown} failed to initialize: {}", rv(&e)))),
        }
        let m = Arc::new(Module { ctx, path: canonical });
        r.modules.push(m.clone());
        Ok(m)
    })
}

/// A short name for a PKCS#11 error: the `CKR_` code's name where there
/// is one (never a PIN or key material: the module reports codes).
fn rv(e: &CkError) -> String {
    match e {
        CkError::Pkcs11(code, function) => format!("{function:?} returned {code:?}"),
        other => other.to_string(),
    }
}

/// Errors after which the session, the login or the object handle may be
/// stale: the token was removed and put back, or its module restarted.
fn reopens(e: &CkError) -> bool {
    matches!(
        e,
        CkError::Pkcs11(
            RvError::SessionHandleInvalid
                | RvError::SessionClosed
                | RvError::DeviceRemoved
                | RvError::DeviceError
                | RvError::TokenNotPresent
                | RvError::UserNotLoggedIn
                | RvError::ObjectHandleInvalid
                | RvError::KeyHandleInvalid
                | RvError::CryptokiNotInitialized,
            _
        )
    )
}

/// The token's answers to `C_Login` that refuse the PIN itself: trying the
/// same PIN again cannot succeed, and a token that counts failed logins
/// locks its user PIN after a few. (`CKR_PIN_EXPIRED` and
/// `CKR_PIN_LOCKED` are answered for the right PIN too, but then only a new
/// PIN helps, and the attempt may still count.)
fn refuses_pin(e: &CkError) -> bool {
    matches!(
        e,
        CkError::Pkcs11(RvError::PinIncorrect | RvError::PinInvalid | RvError::PinLenRange | RvError::PinExpired | RvError::PinLocked, _)
    )
}

/// How the token describes itself (`CK_TOKEN_INFO`): one token, whichever
/// slot it is in now.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TokenIdentity {
    label: String,
    serial: String,
    model: String,
    manufacturer: String,
}

/// A login: with which module, on which token, with the PIN from where and
/// which PIN (its keyed digest, never the PIN).
#[derive(Clone, PartialEq, Eq, Hash)]
struct LoginKey {
    module: PathBuf,
    token: TokenIdentity,
    source: PinSource,
    digest: [u8; 32],
}

impl LoginKey {
    /// The same module, token and PIN source (the PIN may differ).
    fn same_place(&self, other: &LoginKey) -> bool {
        self.module == other.module && self.token == other.token && self.source == other.source
    }
}

enum LoginState {
    /// A thread of process `pid` is in `C_Login` with this PIN: the others
    /// wait for its answer rather than send the PIN too.
    Trying { pid: u32 },
    /// The token refused this PIN (the `CKR_` name).
    Refused(String),
}

/// The memory of refused PINs: process-wide, so a refusal outlives the
/// token's object (dropped with the token's last key, or at once when
/// the load that made it fails), and every later load and login with the
/// same PIN from the same source fails at once, without a `C_Login`.
///
/// Kept until the PIN changes: a login from the same source with another
/// PIN (the PIN file rewritten, `KEYFENCE_PKCS11_PIN` set again), whatever
/// the token answers, forgets the earlier refusal; so there is at most one
/// refusal per module, token and PIN source. Only a keyed digest of the
/// PIN is kept ([`pin_digest`]). A key process keeps its own (its memory
/// is the process's), so a key process started again may try a refused
/// PIN once more.
///
/// The check and the `C_Login` are one step for every thread: a thread
/// that finds another in `C_Login` with the same PIN waits for its answer
/// (not for logins elsewhere), so a refusal is seen even by a thread that
/// was already past every other check.
struct LoginMemory {
    states: Mutex<HashMap<LoginKey, LoginState>>,
    changed: Condvar,
}

static LOGINS: LazyLock<LoginMemory> = LazyLock::new(|| LoginMemory { states: Mutex::new(HashMap::new()), changed: Condvar::new() });

impl LoginMemory {
    /// The refusal of the PIN `key` names, if it was refused.
    fn refusal(&self, key: &LoginKey) -> Option<String> {
        match self.states.lock().unwrap_or_else(|e| e.into_inner()).get(key) {
            Some(LoginState::Refused(why)) => Some(why.clone()),
            _ => None,
        }
    }

    /// Leave to send the PIN `key` names to the token, or its earlier
    /// refusal; waits while another thread of this process is sending it.
    fn begin(&'static self, key: LoginKey) -> Result<LoginAttempt, String> {
        let pid = std::process::id();
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            match states.get(&key) {
                Some(LoginState::Refused(why)) => return Err(why.clone()),
                Some(LoginState::Trying { pid: p }) if *p == pid => {
                    states = self.changed.wait(states).unwrap_or_else(|e| e.into_inner());
                }
                // Nobody is trying it (or only a thread of the parent of a
                // `fork`, which is not in this process).
                _ => {
                    states.insert(key.clone(), LoginState::Trying { pid });
                    return Ok(LoginAttempt { memory: self, key: Some(key) });
                }
            }
        }
    }
}

/// A `C_Login` under way (see [`LoginMemory::begin`]). Dropped without an
/// answer (the token did not answer, or the call panicked), it leaves
/// nothing behind: the next thread tries.
struct LoginAttempt {
    memory: &'static LoginMemory,
    key: Option<LoginKey>,
}

impl LoginAttempt {
    /// The token answered: `refused` is its refusal, `None` a login.
    fn answered(mut self, refused: Option<String>) {
        let Some(key) = self.key.take() else { return };
        let mut states = self.memory.states.lock().unwrap_or_else(|e| e.into_inner());
        // The PIN from this source has changed since any other refusal of
        // it: that one is forgotten.
        states.retain(|k, s| !(matches!(s, LoginState::Refused(_)) && k.same_place(&key) && k.digest != key.digest));
        match refused {
            Some(why) => {
                states.insert(key, LoginState::Refused(why));
            }
            None => {
                states.remove(&key);
            }
        }
        drop(states);
        self.memory.changed.notify_all();
    }
}

impl Drop for LoginAttempt {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let mut states = self.memory.states.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(states.get(&key), Some(LoginState::Trying { .. })) {
            states.remove(&key);
        }
        drop(states);
        self.memory.changed.notify_all();
    }
}

/// The sessions of a token.
struct Sessions {
    /// Open sessions not in use, with the generation they were opened in.
    idle: Vec<(u64, Session)>,
    /// Bumped when every session is dropped after a failure: sessions and
    /// object handles of earlier generations are not used again.
    generation: u64,
    /// Whether this process is logged in (PKCS#11 logs in per token and
    /// application, not per session). A refused PIN is remembered in
    /// [`LOGINS`], not here.
    logged_in: bool,
    /// The session that owns this generation's session copies of the keys
    /// (see [`Token::usable_handle`]); never lent out, closed (and the
    /// copies with it) when the sessions are dropped.
    keeper: Option<Session>,
}

/// A token this process uses, and the keys it uses on it.
pub(crate) struct Token {
    module: Arc<Module>,
    slot: Slot,
    /// `pkcs11:token=LABEL`, the holder's name in errors and metrics.
    name: String,
    /// What the token says it is: with the module and the PIN, the key of
    /// the memory of refused PINs.
    identity: TokenIdentity,
    /// Kept to log in again after the token comes back.
    pin: Mutex<Option<Pin>>,
    login_required: bool,
    sessions: Mutex<Sessions>,
    keys: RwLock<HashMap<u64, Arc<TokenKey>>>,
    next_id: AtomicU64,
}

/// One key on the token: how to find it again, and the handle signed
/// with now (of a session copy when the token makes one).
struct TokenKey {
    template: Vec<Attribute>,
    handle: Mutex<KeyHandle>,
    kind: KeyKind,
    /// Cleared when the token refuses to copy the key (not
    /// `CKA_COPYABLE`), so it is not asked again.
    copyable: std::sync::atomic::AtomicBool,
}

/// The handle a key is signed with, and the session generation it belongs to.
#[derive(Clone, Copy)]
struct KeyHandle {
    generation: u64,
    handle: ObjectHandle,
    /// Whether `handle` is a session copy (destroyed when the key is
    /// forgotten).
    copy: bool,
}

impl Token {
    fn fail(&self, failure: TokenFailure, reason: impl Into<String>) -> SignError {
        SignError::Token { token: self.name.clone(), failure, reason: reason.into() }
    }

    /// The initialized tokens of `module` that `uri` selects (slot,
    /// identity, whether it needs a login), and the labels of all of them.
    #[allow(clippy::type_complexity)]
    fn matching(
        module: &Module,
        uri: &Pkcs11Uri,
        unavailable: &dyn Fn(String) -> SignError,
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
            let matches = uri.token.as_deref().map_or(true, |t| t == identity.label)
                && uri.serial.as_deref().map_or(true, |s| s == identity.serial)
                && uri.manufacturer.as_deref().map_or(true, |m| m == identity.manufacturer)
                && uri.model.as_deref().map_or(true, |m| m == identity.model)
                && uri.slot_id.map_or(true, |id| id == slot.id());
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
    fn open(module: Arc<Module>, uri: &Pkcs11Uri, pin: Option<Pin>, discreet: bool) -> Result<Arc<Token>, SignError> {
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
            let refused = current.as_ref().and_then(|p| LOGINS.refusal(&t.login_key(p)));
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

    /// The key of the memory of refused PINs for logging into this token
    /// with `pin`.
    fn login_key(&self, pin: &Pin) -> LoginKey {
        LoginKey { module: self.module.path.clone(), token: self.identity.clone(), source: pin.source.clone(), digest: pin.digest }
    }

    /// The error for a PIN refused before (`why`: the token's answer then).
    fn refused_before(&self, pin: &Pin, why: &str) -> SignError {
        self.fail(
            TokenFailure::Login,
            format!("the token refused the PIN from {} before ({why}); keyfence does not try it again until the PIN changes", pin.shown),
        )
    }

    /// Runs `f` on a logged-in session; after an error that may mean the
    /// token went away and came back, drops every session, logs in again
    /// and runs `f` once more (with `true`: find objects again).
    fn with_session<T>(&self, mut f: impl FnMut(&Session, u64, bool) -> Result<T, CkError>) -> Result<T, SignError> {
        let mut last = None;
        for retry in [false, true] {
            let (generation, session) = match self.checkout() {
                Ok(s) => s,
                Err(e) if retry => return Err(e),
                Err(e @ SignError::Token { failure: TokenFailure::Login, .. }) => return Err(e),
                Err(e) => {
                    last = Some(e);
                    self.reset(None);
                    continue;
                }
            };
            match f(&session, generation, retry) {
                Ok(v) => {
                    self.checkin(generation, session);
                    return Ok(v);
                }
                Err(e) if reopens(&e) && !retry => {
                    drop(session);
                    self.reset(Some(generation));
                    last = Some(self.fail(TokenFailure::Unavailable, rv(&e)));
                }
                Err(e) if reopens(&e) => {
                    drop(session);
                    self.reset(Some(generation));
                    return Err(self.fail(TokenFailure::Unavailable, format!("{} (after opening the session again)", rv(&e))));
                }
                Err(e) => {
                    // The session itself is fine (a refused mechanism, a
                    // bad input): it goes back to the pool.
                    self.checkin(generation, session);
                    return Err(self.fail(TokenFailure::Refused, rv(&e)));
                }
            }
        }
        Err(last.unwrap_or_else(|| self.fail(TokenFailure::Unavailable, "the token did not answer")))
    }

    fn checkout(&self) -> Result<(u64, Session), SignError> {
        let (generation, login) = {
            let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            if !s.logged_in {
                // A PIN refused before fails at once, without a session.
                let pin = self.pin.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((pin, why)) = pin.as_ref().and_then(|p| LOGINS.refusal(&self.login_key(p)).map(|why| (p, why))) {
                    return Err(self.refused_before(pin, &why));
                }
            }
            let generation = s.generation;
            while let Some((g, session)) = s.idle.pop() {
                if g == generation && s.logged_in {
                    return Ok((g, session));
                }
            }
            (generation, !s.logged_in)
        };
        let session = self
            .module
            .ctx
            .open_ro_session(self.slot)
            .map_err(|e| self.fail(TokenFailure::Unavailable, format!("opening a session: {}", rv(&e))))?;
        if login {
            self.login(&session)?;
        }
        Ok((generation, session))
    }

    /// Logs this process into the token (once per token, under its
    /// sessions' lock), unless the PIN was refused before ([`LOGINS`]).
    fn login(&self, session: &Session) -> Result<(), SignError> {
        let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if s.logged_in {
            return Ok(());
        }
        let pin = self.pin.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(pin) = &pin else {
            if self.login_required {
                return Err(self.fail(
                    TokenFailure::Login,
                    "the token needs a PIN: name a file holding it with `pin-source=file:/path` in the URI, or set KEYFENCE_PKCS11_PIN_FILE or KEYFENCE_PKCS11_PIN",
                ));
            }
            s.logged_in = true;
            return Ok(());
        };
        // The check and the login are one step: a PIN another thread (of
        // this token's object or another's) had refused since this one
        // looked is not sent again, and one being sent now is waited for.
        let attempt = LOGINS.begin(self.login_key(pin)).map_err(|why| self.refused_before(pin, &why))?;
        let secret = cryptoki::types::AuthPin::new(pin.secret.as_str().to_owned());
        match session.login(UserType::User, Some(&secret)) {
            Ok(()) | Err(CkError::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => {
                attempt.answered(None);
                s.logged_in = true;
                Ok(())
            }
            Err(e) if refuses_pin(&e) => {
                attempt.answered(Some(rv(&e)));
                Err(self.fail(
                    TokenFailure::Login,
                    format!("the token refused the PIN from {} ({}); keyfence does not try it again until the PIN changes", pin.shown, rv(&e)),
                ))
            }
            Err(e) => Err(self.fail(TokenFailure::Unavailable, format!("logging in: {}", rv(&e)))),
        }
    }

    fn checkin(&self, generation: u64, session: Session) {
        let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        if s.generation == generation {
            s.idle.push((generation, session));
        }
    }

    /// Drops every session (of `generation`, unless a later one already
    /// did) and the login.
    fn reset(&self, generation: Option<u64>) {
        let idle = {
            let mut s = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            if generation.is_some_and(|g| g != s.generation) {
                return;
            }
            s.generation += 1;
            s.logged_in = false;
            (std::mem::take(&mut s.idle), s.keeper.take())
        };
        drop(idle);
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
                [] => return Ok(Err(this.fail(TokenFailure::NotFound, format!("no private key with {described} on the token (is the PIN right, and the key a token object?)")))),
                many => {
                    return Ok(Err(this.fail(
                        TokenFailure::NotFound,
                        format!("{} private keys match {described}; add `id=` to the URI", many.len()),
                    )))
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
                        many => {
                            return Ok(Err(self.fail(TokenFailure::NotFound, format!("{} keys now match the key's URI", many.len()))))
                        }
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

/// `op` on the token: the mechanism for each algorithm, with the digest
/// computed here (so `CKM_ECDSA`, `CKM_RSA_PKCS` and `CKM_RSA_PKCS_PSS`,
/// which every token offers, rather than the hash-and-sign mechanisms
/// fewer do).
fn sign_on(session: &Session, handle: ObjectHandle, kind: KeyKind, op: &Operation) -> Result<Result<Output, SignError>, CkError> {
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

/// The DER `DigestInfo` header PKCS#1 v1.5 puts before a digest (none for
/// TLS 1.0's MD5+SHA-1).
fn digest_info_prefix(hash: Hash) -> &'static [u8] {
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
fn ecdsa_der(raw: &[u8]) -> Result<Output, SignError> {
    if raw.is_empty() || raw.len() % 2 != 0 || raw.len() > 132 {
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

const P256_OID: &[u8] = &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const P384_OID: &[u8] = &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22];
const ED25519_OID: &[u8] = &[0x06, 0x03, 0x2b, 0x65, 0x70];
const ED25519_NAME: &[u8] = b"\x13\x0cedwards25519";

/// The key's kind and its public key (DER `SubjectPublicKeyInfo`), read
/// from the token: RSA's modulus and exponent from the private key object,
/// an EC or Ed25519 point from the public key object beside it (same
/// `CKA_ID`, else same label). Nothing secret is read.
fn public_key(session: &Session, handle: ObjectHandle) -> Result<(KeyKind, Vec<u8>), SignError> {
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
        unsupported("the token holds no public key object beside the private key (same CKA_ID or label): keyfence reads the public key from it".into())
    })?;
    if key_type == KeyType::EC_EDWARDS {
        if params != ED25519_OID && params != ED25519_NAME {
            return Err(unsupported("an Edwards curve other than Ed25519".into()));
        }
        if point.len() != 32 {
            return Err(unsupported("the Ed25519 public key is not 32 bytes".into()));
        }
        let mut der = vec![0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];
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

fn unwrap_octet_string(p: Vec<u8>) -> Vec<u8> {
    let inner = match p.as_slice() {
        [0x04, n, rest @ ..] if *n < 0x80 && rest.len() == *n as usize => rest,
        [0x04, 0x81, n, rest @ ..] if rest.len() == *n as usize => rest,
        _ => return p,
    };
    inner.to_vec()
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
            return Err(SignError::InvalidArgument(format!("{}: a private key with this {} exists already", token.name, match attr {
                Attribute::Label(_) => "label",
                _ => "id",
            })));
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

/// The floor a benchmark compares the engine with: `threads` threads, each
/// with a session of its own, signing `alg` with the key `uri` names in a
/// loop of `C_Sign` calls (the message hashed, an ECDSA signature
/// DER-encoded, as any direct caller does) until `duration` has passed.
/// No queue, no hand-off: what an OpenSSL provider calling the token on
/// the handshake's thread does. Returns the signatures made.
#[cfg(feature = "bench")]
pub(crate) fn direct_sign_loop(
    uri: &Pkcs11Uri,
    settings: &Pkcs11Settings,
    alg: Algorithm,
    threads: usize,
    duration: std::time::Duration,
) -> Result<u64, SignError> {
    // Loading the key opens the module and the token and logs in (per
    // application, so every session below is logged in).
    let key = load(uri, settings)?;
    let held = key.as_held().ok_or_else(|| SignError::InvalidArgument("not a token key".into()))?;
    let token = with_registry(|r| {
        r.tokens.iter().filter_map(Weak::upgrade).find(|t| t.name == held.holder().name())
    })
    .ok_or_else(|| SignError::InvalidArgument("the token went away".into()))?;
    let tkey = token.keys.read().unwrap_or_else(|e| e.into_inner()).get(&held.id()).cloned().ok_or_else(|| SignError::InvalidArgument("the key was unloaded".into()))?;
    let kind = tkey.kind;
    let until = Instant::now() + duration;
    let counts: Vec<Result<u64, SignError>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|t| {
                let (token, tkey) = (&token, &tkey);
                s.spawn(move || -> Result<u64, SignError> {
                    let session = token.module.ctx.open_ro_session(token.slot).map_err(|e| token.fail(TokenFailure::Unavailable, rv(&e)))?;
                    // The handle keyfence signs with (a session copy where the
                    // token makes one): the floor gets the same help.
                    let handle = tkey.handle.lock().unwrap_or_else(|e| e.into_inner()).handle;
                    let mut n = 0u64;
                    while Instant::now() < until {
                        let msg = [t.to_be_bytes(), n.to_be_bytes()].concat();
                        let op = Operation::Sign { alg, input: Input::Message(msg) };
                        sign_on(&session, handle, kind, &op).map_err(|e| token.fail(TokenFailure::Refused, rv(&e)))??;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err(SignError::InvalidArgument("a thread panicked".into())))).collect()
    });
    counts.into_iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signer with a fixed module and PIN file (an agent) uses those
    /// files themselves, never the name a client gave, even when that name
    /// leads to them now: a link the client controls could lead elsewhere
    /// by the time the file is opened.
    #[test]
    fn fixed_settings_use_their_own_files_never_the_clients_names() {
        let dir = tempfile::tempdir().unwrap();
        let (module, pin) = (dir.path().join("module.so"), dir.path().join("pin"));
        std::fs::write(&module, b"").unwrap();
        std::fs::write(&pin, b"1234\n").unwrap();
        let (module_link, pin_link) = (dir.path().join("m-link"), dir.path().join("p-link"));
        std::os::unix::fs::symlink(&module, &module_link).unwrap();
        std::os::unix::fs::symlink(&pin, &pin_link).unwrap();
        let settings = Pkcs11Settings { module: Some(module.clone()), pin_file: Some(pin.clone()), pin: None, fixed: true };
        let uri = Pkcs11Uri::parse(&format!(
            "pkcs11:token=t;object=k?module-path={}&pin-source=file:{}",
            module_link.display(),
            pin_link.display()
        ))
        .unwrap();
        assert_eq!(settings.module_for(&uri).unwrap(), module);
        assert_eq!(settings.pin_for(&uri).unwrap().map(|p| p.secret.as_str().to_owned()).as_deref(), Some("1234"));
        // Now the links lead elsewhere: refused, and never followed.
        std::fs::remove_file(&module_link).unwrap();
        std::os::unix::fs::symlink("/bin/sh", &module_link).unwrap();
        assert!(settings.module_for(&uri).is_err());
        let unfixed = Pkcs11Settings { fixed: false, ..settings.clone() };
        assert_eq!(unfixed.module_for(&uri).unwrap(), module_link);
    }

    /// The memory of refused PINs: a refusal is kept (and given to the
    /// next caller, who sends nothing), a caller that comes while another
    /// is in `C_Login` with the same PIN waits for its answer, an attempt
    /// that ends without an answer leaves nothing, and any answer to
    /// another PIN from the same source forgets the refusal.
    #[test]
    fn a_refusal_is_kept_until_the_pin_from_its_source_changes() {
        let key = |pin: &str| LoginKey {
            module: PathBuf::from("/unit-test/module.so"),
            token: TokenIdentity { label: "t".into(), serial: "unit".into(), model: "m".into(), manufacturer: "k".into() },
            source: PinSource::File(PathBuf::from("/unit-test/pin")),
            digest: pin_digest(pin),
        };
        assert_eq!(pin_digest("1111"), pin_digest("1111"));
        assert_ne!(pin_digest("1111"), pin_digest("1112"));
        assert!(LOGINS.refusal(&key("1111")).is_none());
        LOGINS.begin(key("1111")).unwrap().answered(Some("Login returned PinIncorrect".into()));
        assert_eq!(LOGINS.begin(key("1111")).err().as_deref(), Some("Login returned PinIncorrect"));
        let other_source = LoginKey { source: PinSource::Value, ..key("1111") };
        assert!(LOGINS.refusal(&other_source).is_none(), "another source is another login");

        let first = LOGINS.begin(key("2222")).unwrap();
        let waiter = std::thread::spawn(move || LOGINS.begin(key("2222")).map(drop));
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!waiter.is_finished(), "the second caller sent the PIN while the first was");
        first.answered(Some("Login returned PinIncorrect".into()));
        assert_eq!(waiter.join().unwrap().err().as_deref(), Some("Login returned PinIncorrect"));
        assert!(LOGINS.refusal(&key("1111")).is_none(), "the PIN changed: its earlier refusal is forgotten");

        drop(LOGINS.begin(key("3333")).unwrap());
        LOGINS.begin(key("3333")).unwrap().answered(None);
        assert!(LOGINS.refusal(&key("2222")).is_none());
        assert!(LOGINS.states.lock().unwrap().keys().all(|k| k.token.serial != "unit"), "nothing is left of the test's logins");
    }

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
                let mut v: Vec<u8> = (0..2 * n).map(|_| {
                    x = x.wrapping_mul(167).wrapping_add(13);
                    x
                }).collect();
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
}
