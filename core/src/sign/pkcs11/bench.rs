//! The floor `keyfence bench pkcs11` compares the engine with (`bench`
//! feature): the token called directly, with no engine in between.

use std::sync::Weak;
use std::time::Instant;

use super::mechanism::sign_on;
use super::registry::{rv, with_registry};
use super::settings::Pkcs11Settings;
use super::token::load;
use super::uri::Pkcs11Uri;
use crate::sign::types::{Algorithm, Input, Operation, SignError, TokenFailure};

/// The floor a benchmark compares the engine with: `threads` threads, each
/// with a session of its own, signing `alg` with the key `uri` names in a
/// loop of `C_Sign` calls (the message hashed, an ECDSA signature
/// DER-encoded, as any direct caller does) until `duration` has passed.
/// No queue, no hand-off: what an OpenSSL provider calling the token on
/// the handshake's thread does. Returns the signatures made; `keyfence
/// bench pkcs11` sets the engine's beside them.
///
/// # Errors
/// As [`load`](super::load), or the token's refusal of a signature.
pub fn direct_sign_loop(
    uri: &str, settings: &Pkcs11Settings, alg: Algorithm, threads: usize, duration: std::time::Duration,
) -> Result<u64, SignError> {
    let uri = &Pkcs11Uri::parse(uri).map_err(|e| SignError::InvalidArgument(e.to_string()))?;
    // Loading the key opens the module and the token and logs in (per
    // application, so every session below is logged in).
    let key = load(uri, settings)?;
    let held = key.as_held().ok_or_else(|| SignError::InvalidArgument("not a token key".into()))?;
    let token = with_registry(|r| r.tokens.iter().filter_map(Weak::upgrade).find(|t| t.name == held.holder().name()))
        .ok_or_else(|| SignError::InvalidArgument("the token went away".into()))?;
    let tkey = token
        .keys
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&held.id())
        .cloned()
        .ok_or_else(|| SignError::InvalidArgument("the key was unloaded".into()))?;
    let kind = tkey.kind;
    let until = Instant::now() + duration;
    let counts: Vec<Result<u64, SignError>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|t| {
                let (token, tkey) = (&token, &tkey);
                s.spawn(move || -> Result<u64, SignError> {
                    let session =
                        token.module.ctx.open_ro_session(token.slot).map_err(|e| token.fail(TokenFailure::Unavailable, rv(&e)))?;
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
