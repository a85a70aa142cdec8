//! The policy language: checking attributes against a policy without
//! cryptography.

use std::collections::HashMap;

use keyfence::policy::{self, Attributes};
use napi::Env;
use napi_derive::napi;

use crate::error::{js, KfError, KfResult};

/// Attributes from a JavaScript object (`{ country: 'FR' }`), built
/// directly rather than formatted and re-parsed, so labels and values need
/// no quoting; checked by the core as text is (no empty label or value,
/// Unicode NFC).
pub(crate) fn attributes(attrs: HashMap<String, String>) -> KfResult<Attributes> {
    // In label order, so an error names the same index every time.
    let mut pairs: Vec<_> = attrs.into_iter().collect();
    pairs.sort();
    Ok(Attributes::try_from_pairs(pairs)?)
}

/// Parses policy text; a syntax error carries its byte `position` and a
/// message that points at it.
pub(crate) fn parse(text: &str) -> KfResult<policy::Policy> {
    policy::parse(text).map_err(|e| {
        let mut err = KfError::from(e.clone());
        err.message = e.render(text);
        err
    })
}

/// Whether `attrs` satisfy `policy`, from the policy alone (no keys, no
/// cryptography). `attrs` is an object of labels to values (its own
/// enumerable properties) or a `Map`.
///
/// ```js
/// kf.policy.check('region: EU and not country: DE', { region: 'EU', country: 'FR' }) // true
/// ```
///
/// Throws `KeyfenceError` with code `POLICY_SYNTAX` (and `position`, the
/// byte offset of the fault) or `POLICY_TOO_LARGE` for a policy that does
/// not parse, `INVALID_ATTRIBUTES` for an empty label or value or one with
/// a lone surrogate.
#[napi(namespace = "policy")]
pub fn check(env: Env, policy: String, #[napi(ts_arg_type = "Attributes")] attrs: HashMap<String, String>) -> napi::Result<bool> {
    js(&env, parse(&policy).and_then(|p| Ok(p.eval(&attributes(attrs)?))))
}

/// The canonical text of a policy: what keyfence writes into ciphertexts
/// and envelopes.
///
/// Throws as `check`.
#[napi(namespace = "policy")]
pub fn canonical(env: Env, policy: String) -> napi::Result<String> {
    js(&env, parse(&policy).map(|p| p.to_string()))
}
