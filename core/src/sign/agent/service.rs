//! The agent's service: the one table of what its clients, local users
//! who do not trust each other, may ask, and how it loads their keys.
//!
//! A client may have an envelope opened with the agent's own machine key
//! and store, or a token key loaded that its user is granted, sign with
//! them, unload them and ask the status; nothing else. It names no file,
//! path, store or key bytes of its own, and cannot change the agent's
//! privileges. The key process is the other service over the same engine
//! (`key_process/process/service.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::grants::TokenGrant;
use super::hush::Hush;
use crate::sign::key_process::protocol::{kind, Detail, ErrorCode, LoadBody, Source};
use crate::sign::key_process::server::{Client, Refusal, Service, Table};
use crate::sign::pkcs11::{self, Pkcs11Settings, Pkcs11Uri};
use crate::sign::sys;
use crate::sign::types::SignError;
use crate::sign::PrivateKey;
use crate::wrap::{Follower, Machine};

/// What the agent permits.
pub(crate) static TABLE: Table = Table {
    requests: &[kind::OP, kind::LOAD, kind::UNLOAD, kind::STATUS, kind::AGENT_STATUS],
    other_requests: "an agent's clients may load envelopes and granted token keys, sign, unload and ask its status; its privileges and everything else are its own",
    sources: &[Source::AgentEnvelope, Source::Pkcs11],
    other_sources: "an agent loads only envelopes, which it opens with its own machine key and store, and keys on the PKCS#11 token it was started with; it reads no file, path or key bytes a client names",
};

/// The agent as a [`Service`]: its machine (following its store) opens
/// envelopes, and its PKCS#11 settings load token keys for the clients
/// its grants allow.
pub(crate) struct AgentService {
    pub(crate) machine: Option<(Arc<Machine>, Follower)>,
    pub(crate) pkcs11: Option<Pkcs11Settings>,
    pub(crate) grants: Vec<TokenGrant>,
    /// The agent's own user: granted every token key, as root is.
    pub(crate) uid: u32,
    /// Set once the store's revocation list names this machine (the
    /// agent's watch): no envelope is opened any more.
    pub(crate) revoked: Arc<AtomicBool>,
    /// One rate limit per refusal code, so that a client asking again
    /// and again is one line every few seconds, not thousands.
    pub(crate) refusals: Mutex<HashMap<crate::ErrorCode, Hush>>,
    /// The agent, for its status (set once it is built).
    pub(crate) agent: OnceLock<Weak<super::Inner>>,
}

impl Service for AgentService {
    fn table(&self) -> &'static Table {
        &TABLE
    }

    fn load(&self, source: &LoadBody, client: Option<&Client>) -> Result<PrivateKey, Refusal> {
        match (source, client) {
            (LoadBody::AgentEnvelope(envelope), _) => self.open(envelope).inspect_err(|r| self.log_refusal(r, client)),
            // With its detail: the client reports the load as it would in
            // process.
            (LoadBody::Pkcs11(uri), Some(client)) => self.load_pkcs11(uri, client).map_err(|e| Refusal::load_failed(&e)),
            _ => Err(Refusal::new(ErrorCode::NotAllowed, TABLE.other_sources)),
        }
    }

    fn own_request(&self, kind: u8, _body: &[u8]) -> Result<Vec<u8>, (ErrorCode, String)> {
        match (kind, self.agent.get().and_then(Weak::upgrade)) {
            (kind::AGENT_STATUS, Some(inner)) => Ok(inner.status_json().to_string().into_bytes()),
            (kind::AGENT_STATUS, None) => Err((ErrorCode::Internal, "the agent is stopping".into())),
            _ => Err((ErrorCode::Malformed, format!("unknown request kind {kind:#04x}"))),
        }
    }
}

/// The refusals an operator must act on, logged as errors: the machine or
/// its store is wrong, not the client's request.
fn operators_to_fix(code: crate::ErrorCode) -> bool {
    use crate::ErrorCode as C;
    matches!(
        code,
        C::MachineRevoked
            | C::RetiredGeneration
            | C::StoreIo
            | C::ReplayedObject
            | C::WrongAuthority
            | C::UnknownPolicyKey
            | C::InconsistentState
    )
}

impl AgentService {
    /// Says in the agent's log why a client's envelope was refused (its
    /// user, its pid, the code and the reason, never the envelope), at
    /// most once per code every few seconds: the journal is where an
    /// operator looks first, and a refused client otherwise tells only
    /// its own log.
    fn log_refusal(&self, refusal: &Refusal, client: Option<&Client>) {
        let code = refusal.detail.code.unwrap_or(crate::ErrorCode::Internal);
        let quiet = {
            let mut hushes = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
            match hushes.entry(code).or_insert_with(Hush::new).say() {
                Some(quiet) => quiet,
                None => return,
            }
        };
        let (uid, pid) = client.map_or((0, 0), |c| (c.uid, c.pid));
        let user = sys::user_name(uid);
        let code = code.name();
        let reason = &refusal.message;
        if operators_to_fix(refusal.detail.code.unwrap_or(crate::ErrorCode::Internal)) {
            tracing::error!(%user, uid, pid, code, more = quiet, "an envelope was refused: {reason}");
        } else {
            tracing::warn!(%user, uid, pid, code, more = quiet, "an envelope was refused: {reason}");
        }
    }

    /// The private key in `envelope`, opened with the agent's machine key
    /// from the store's current copy, or why not (naming no secret).
    fn open(&self, envelope: &[u8]) -> Result<PrivateKey, Refusal> {
        let Some((machine, _)) = &self.machine else {
            return Err(Refusal::new(
                ErrorCode::Load,
                "this agent serves token keys only: it was started without a store and a machine key",
            ));
        };
        if self.revoked.load(Ordering::Acquire) {
            let code = crate::ErrorCode::MachineRevoked;
            let id = machine.id().unwrap_or("(no id)");
            return Err(Refusal {
                code: ErrorCode::Load,
                message: format!("{}: this machine ({id}) is revoked: the agent opens no envelope", code.name()),
                detail: Detail { code: Some(code), token: None },
            });
        }
        let secret = machine.open_current(envelope).map_err(|e| {
            // The code in words too, for the client's reader; in the
            // detail for its program.
            let detail = Detail { code: Some(e.code()), token: None };
            Refusal { code: ErrorCode::Load, message: format!("{}: {e}", e.code().name()), detail }
        })?;
        PrivateKey::from_bytes(&secret).map_err(|e| Refusal::new(ErrorCode::Load, format!("the key in the envelope: {e}")))
    }

    /// The key `client` names by PKCS#11 URI, on the module and with the
    /// PIN the agent was started with, if its grants allow that client the
    /// key.
    fn load_pkcs11(&self, uri: &str, client: &Client) -> Result<PrivateKey, SignError> {
        let Some(settings) = &self.pkcs11 else {
            return Err(SignError::InvalidArgument(
                "this agent was started without a PKCS#11 module (`keyfence agent --pkcs11-module`): it loads no token keys".into(),
            ));
        };
        let asked = Pkcs11Uri::parse(uri).map_err(|e| SignError::InvalidArgument(e.to_string()))?;
        let trusted = client.uid == 0 || client.uid == self.uid;
        if !trusted && !self.grants.iter().any(|g| g.allows(client.uid, &client.gids, &asked)) {
            let user = sys::user_name(client.uid);
            return Err(SignError::InvalidArgument(format!(
                "user {user} may not load this token key from this agent: grant it with --allow-token {user}=URI (a URI naming the token and the key)"
            )));
        }
        pkcs11::load(uri, settings)
    }
}
