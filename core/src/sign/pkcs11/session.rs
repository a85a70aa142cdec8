//! The sessions of a token: one pool per token, growing to as many as sign
//! at once (the engine's token threads, or a key process's workers), with
//! the one login PKCS#11 makes per token and application.
//!
//! A session the token no longer knows (`CKR_SESSION_HANDLE_INVALID`,
//! `CKR_DEVICE_REMOVED`, ...) is dropped with every other session of the
//! token; the token is logged into again, the key found again by its
//! attributes, and the operation retried once. A token that is still gone
//! fails with [`TokenFailure::Unavailable`].

use cryptoki::error::{Error as CkError, RvError};
use cryptoki::session::Session;

use super::registry::rv;
use super::token::Token;
use crate::sign::types::{SignError, TokenFailure};

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

/// The sessions of a token.
pub(super) struct Sessions {
    /// Open sessions not in use, with the generation they were opened in.
    pub(super) idle: Vec<(u64, Session)>,
    /// Bumped when every session is dropped after a failure: sessions and
    /// object handles of earlier generations are not used again.
    pub(super) generation: u64,
    /// Whether this process is logged in (PKCS#11 logs in per token and
    /// application, not per session). A refused PIN is remembered by the
    /// memory of refused PINs ([`login`](super::login)), not here.
    pub(super) logged_in: bool,
    /// The session that owns this generation's session copies of the keys
    /// (see [`Token::usable_handle`]); never lent out, closed (and the
    /// copies with it) when the sessions are dropped.
    pub(super) keeper: Option<Session>,
}

/// The session pool: the token's methods that lend, take back and drop
/// its sessions.
impl Token {
    /// Runs `f` on a logged-in session; after an error that may mean the
    /// token went away and came back, drops every session, logs in again
    /// and runs `f` once more (with `true`: find objects again).
    pub(super) fn with_session<T>(&self, mut f: impl FnMut(&Session, u64, bool) -> Result<T, CkError>) -> Result<T, SignError> {
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
                if let Some((pin, why)) = pin.as_ref().and_then(|p| self.earlier_refusal(p).map(|why| (p, why))) {
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
}
