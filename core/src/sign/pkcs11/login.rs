//! Logging into a token, and the memory of refused PINs. A refused PIN is
//! never tried again by itself: every later operation and load fails at
//! once with [`TokenFailure::Login`], so keyfence cannot lock the token's
//! PIN. The refusal is remembered for the whole process, not with the
//! token's object (which goes when its last key does), until the PIN
//! changes: see [`LoginMemory`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Condvar, LazyLock, Mutex};

use cryptoki::error::{Error as CkError, RvError};
use cryptoki::session::{Session, UserType};
use zeroize::Zeroizing;

use super::registry::rv;
use super::token::{Token, TokenIdentity};
use crate::sign::types::{SignError, TokenFailure};

/// A PIN to log in with: the secret (zeroized when dropped; kept by the
/// token's object to log in again after the token comes back), where it
/// came from, and a keyed digest of it, which is all that the memory of
/// refused PINs ([`LoginMemory`]) keeps.
#[derive(Clone)]
pub(super) struct Pin {
    pub(super) secret: Zeroizing<String>,
    pub(super) source: PinSource,
    pub(super) digest: [u8; 32],
    /// Where it came from, for messages: `the PIN file /etc/pin`, or, for
    /// a signer with fixed settings (an agent), no path.
    pub(super) shown: String,
}

/// Where a PIN was read: a PIN file (its canonical path), or the settings'
/// PIN (`KEYFENCE_PKCS11_PIN`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum PinSource {
    File(PathBuf),
    Value,
}

impl Pin {
    pub(super) fn new(secret: Zeroizing<String>, source: PinSource, shown: String) -> Pin {
        let digest = pin_digest(&secret);
        Pin { secret, source, digest, shown }
    }

    /// Whether `other` is the same PIN, compared in constant time (on the
    /// digests, which have the same length whatever the PINs').
    pub(super) fn same_as(&self, other: &Pin) -> bool {
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

/// Logging in: the token's methods that send the PIN, or refuse to.
impl Token {
    /// The token's refusal of `pin` (its `CKR_` name), if this process had
    /// it refused before and it has not changed since.
    pub(super) fn earlier_refusal(&self, pin: &Pin) -> Option<String> {
        LOGINS.refusal(&self.login_key(pin))
    }

    /// The key of the memory of refused PINs for logging into this token
    /// with `pin`.
    fn login_key(&self, pin: &Pin) -> LoginKey {
        LoginKey { module: self.module.path.clone(), token: self.identity.clone(), source: pin.source.clone(), digest: pin.digest }
    }

    /// The error for a PIN refused before (`why`: the token's answer then).
    pub(super) fn refused_before(&self, pin: &Pin, why: &str) -> SignError {
        self.fail(
            TokenFailure::Login,
            format!("the token refused the PIN from {} before ({why}); keyfence does not try it again until the PIN changes", pin.shown),
        )
    }

    /// Logs this process into the token (once per token, under its
    /// sessions' lock), unless the PIN was refused before ([`LOGINS`]).
    pub(super) fn login(&self, session: &Session) -> Result<(), SignError> {
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
                    format!(
                        "the token refused the PIN from {} ({}); keyfence does not try it again until the PIN changes",
                        pin.shown,
                        rv(&e)
                    ),
                ))
            }
            Err(e) => Err(self.fail(TokenFailure::Unavailable, format!("logging in: {}", rv(&e)))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
