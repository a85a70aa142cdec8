//! Which token keys each user of an agent may load (`--allow-token`).
//!
//! An agent with a PKCS#11 module would otherwise load, for any user it
//! admits, whatever object a URI names on its token: `object=billing-key`
//! as readily as `object=tls-p256`. A grant names a user or a group and a
//! URI; a client's URI is granted when every attribute the grant's URI
//! gives (token, manufacturer, serial, model, slot, object, id, type) is
//! in the client's URI with the same value. A client's URI can only be
//! narrower than a grant, never wider: `pkcs11:object=tls-p256` is not
//! granted by `pkcs11:token=edge;object=tls-p256`, since it could match
//! another token's object. The agent's own user and root are granted
//! every key (they can read what the agent reads).

use std::str::FromStr;

use crate::sign::pkcs11::Pkcs11Uri;

/// Who a grant is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grantee {
    /// A user id.
    User(u32),
    /// A group id: the client's primary group or any supplementary one.
    Group(u32),
}

/// A user or group allowed the token keys a URI names
/// ([`AgentConfig::token_grants`](super::AgentConfig::token_grants)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenGrant {
    /// Who may load the keys.
    pub who: Grantee,
    /// The keys: a PKCS#11 URI whose attributes a client's URI must all
    /// carry, with the same values.
    pub uri: Pkcs11Uri,
}

impl TokenGrant {
    /// A grant of the keys `uri` names to `who`.
    ///
    /// # Errors
    /// The URI's parse error, or a URI that names no attribute of a key
    /// (it would grant every key: say so with one grant per key instead),
    /// or one that names a module or PIN (those are the agent's own).
    pub fn new(who: Grantee, uri: &str) -> Result<Self, String> {
        let uri = Pkcs11Uri::from_str(uri).map_err(|e| e.to_string())?;
        if uri.module_path.is_some() || uri.module_name.is_some() || uri.pin_source.is_some() {
            return Err("a grant names keys, not a module or a PIN: the agent's own are used".into());
        }
        let names_a_key = uri.object.is_some() || uri.id.is_some();
        if !names_a_key {
            return Err("a grant names keys by object= or id=, so that it cannot grant every key on a token".into());
        }
        Ok(TokenGrant { who, uri })
    }

    /// Whether this grant allows a client of user `uid`, in groups `gids`,
    /// to load the key `asked` names.
    pub(crate) fn allows(&self, uid: u32, gids: &[u32], asked: &Pkcs11Uri) -> bool {
        let who = match self.who {
            Grantee::User(u) => u == uid,
            Grantee::Group(g) => gids.contains(&g),
        };
        who && covers(&self.uri, asked)
    }
}

/// Whether every attribute `grant` gives is in `asked`, equal.
fn covers(grant: &Pkcs11Uri, asked: &Pkcs11Uri) -> bool {
    fn same<T: PartialEq>(g: &Option<T>, a: &Option<T>) -> bool {
        g.as_ref().is_none_or(|g| a.as_ref() == Some(g))
    }
    same(&grant.token, &asked.token)
        && same(&grant.manufacturer, &asked.manufacturer)
        && same(&grant.serial, &asked.serial)
        && same(&grant.model, &asked.model)
        && same(&grant.slot_id, &asked.slot_id)
        && same(&grant.object, &asked.object)
        && same(&grant.id, &asked.id)
        && same(&grant.object_type, &asked.object_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Pkcs11Uri {
        Pkcs11Uri::from_str(s).unwrap()
    }

    #[test]
    fn a_grant_covers_only_uris_at_least_as_narrow() {
        let g = TokenGrant::new(Grantee::User(33), "pkcs11:token=edge;object=tls-p256").unwrap();
        assert!(g.allows(33, &[], &uri("pkcs11:token=edge;object=tls-p256")));
        assert!(g.allows(33, &[], &uri("pkcs11:token=edge;object=tls-p256;type=private")));
        assert!(!g.allows(34, &[], &uri("pkcs11:token=edge;object=tls-p256")), "another user");
        assert!(!g.allows(33, &[], &uri("pkcs11:token=edge;object=billing-key")), "another object");
        assert!(!g.allows(33, &[], &uri("pkcs11:object=tls-p256")), "no token: could be another token's");
        assert!(!g.allows(33, &[], &uri("pkcs11:token=other;object=tls-p256")));
        let g = TokenGrant::new(Grantee::Group(50), "pkcs11:token=edge;id=%01").unwrap();
        assert!(g.allows(1000, &[7, 50], &uri("pkcs11:token=edge;id=%01")));
        assert!(!g.allows(1000, &[7], &uri("pkcs11:token=edge;id=%01")));
    }

    #[test]
    fn a_grant_must_name_keys_and_no_module_or_pin() {
        assert!(TokenGrant::new(Grantee::User(1), "pkcs11:token=edge").is_err());
        assert!(TokenGrant::new(Grantee::User(1), "pkcs11:object=k?module-path=/x.so").is_err());
        assert!(TokenGrant::new(Grantee::User(1), "pkcs11:object=k?pin-source=/x").is_err());
        assert!(TokenGrant::new(Grantee::User(1), "not a uri").is_err());
    }
}
