//! The agent's service: the one table of what its clients, local users
//! who do not trust each other, may ask, and how it loads their keys.
//!
//! A client may have an envelope opened with the agent's own machine key
//! and store, or a token key loaded that its user is granted, sign with
//! them, unload them and ask the status; nothing else. It names no file,
//! path, store or key bytes of its own, and cannot change the agent's
//! privileges. The key process is the other service over the same engine
//! (`key_process/process/service.rs`).

use std::sync::Arc;

use super::grants::TokenGrant;
use crate::sign::key_process::protocol::{kind, Detail, ErrorCode, LoadBody, Source};
use crate::sign::key_process::server::{Client, Refusal, Service, Table};
use crate::sign::pkcs11::{self, Pkcs11Settings, Pkcs11Uri};
use crate::sign::sys;
use crate::sign::types::SignError;
use crate::sign::PrivateKey;
use crate::wrap::{Follower, Machine};

/// What the agent permits.
pub(crate) static TABLE: Table = Table {
    requests: &[kind::OP, kind::LOAD, kind::UNLOAD, kind::STATUS],
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
}

impl Service for AgentService {
    fn table(&self) -> &'static Table {
        &TABLE
    }

    fn load(&self, source: &LoadBody, client: Option<&Client>) -> Result<PrivateKey, Refusal> {
        match (source, client) {
            (LoadBody::AgentEnvelope(envelope), _) => self.open(envelope),
            // With its detail: the client reports the load as it would in
            // process.
            (LoadBody::Pkcs11(uri), Some(client)) => self.load_pkcs11(uri, client).map_err(|e| Refusal::load_failed(&e)),
            _ => Err(Refusal::new(ErrorCode::NotAllowed, TABLE.other_sources)),
        }
    }
}

impl AgentService {
    /// The private key in `envelope`, opened with the agent's machine key
    /// from the store's current copy, or why not (naming no secret).
    fn open(&self, envelope: &[u8]) -> Result<PrivateKey, Refusal> {
        let Some((machine, _)) = &self.machine else {
            return Err(Refusal::new(ErrorCode::Load, "this agent serves token keys only: it was started without a store and a machine key"));
        };
        let secret = machine.open_current(envelope).map_err(|e| {
            // The floor could not be kept (its folder or lock): the
            // operator's to fix, so it is said here too, not only to the
            // client.
            if e.code() == crate::ErrorCode::StoreIo {
                tracing::warn!(error = %e, "an envelope was not opened: the store or the newest lists' file failed");
            }
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
