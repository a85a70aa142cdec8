//! Machine ids and their revocation: the `machine` attribute the
//! authority sets, the policies sealed so that revoked machines cannot
//! open them (`policy and not machine: ID`, TKN20's negation), and the
//! signed list of revoked ids (`public/revoked`) a machine or a forwarder
//! reads.
//!
//! A revoked id stays excluded from the sealed copies of every generation
//! the machine holds a key for (the generations live when it was revoked,
//! and older ones); the next generations are made after its revocation,
//! and `issue` refuses the id, so it never holds a key for them and their
//! copies need no negation. Two master rotations after a revocation the
//! negation has left every live copy: the policies stop growing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand_core::{OsRng, RngCore};

use super::error::{codec, Result, WrapError};
use super::floor::{Floor, SignedList};
use super::format::{check_signed, reader, writer, REVOKED_MAGIC};
use super::policy::CanonicalPolicy;
use super::signing::{AuthorityKey, REVOKED_CONTEXT, SIGNATURE_LEN};

/// The attribute label that carries a machine's id. The authority sets
/// it on every key it issues, so a policy can name one machine
/// (`not machine: 3f…`).
pub const MACHINE_LABEL: &str = "machine";

/// Longest machine id `issue` accepts (the ids it makes are 32 hex digits).
pub const MAX_MACHINE_ID: usize = 64;

const O: &str = "revocation list";

/// A fresh machine id: 128 random bits in lowercase hex, so two ids the
/// authority makes are distinct without a registry to draw them from (the
/// inventory records ids; it does not hand them out).
pub(crate) fn new_machine_id() -> String {
    let mut b = [0u8; 16];
    OsRng.fill_bytes(&mut b);
    super::layout::hex(&b)
}

/// Refuses an id `issue` must not give a machine: one [`check_machine_id`]
/// refuses, or a keyword of the policy language (`and`, `or`, `not`),
/// which a policy an operator writes (`not machine: not`) cannot name
/// without quotes. Revoking such an id, which an earlier keyfence issued,
/// works: the negations quote it.
///
/// # Errors
/// [`WrapError::InvalidMachineId`].
pub(crate) fn check_new_machine_id(id: &str) -> Result<()> {
    check_machine_id(id)?;
    if matches!(id, "and" | "or" | "not") {
        return Err(WrapError::InvalidMachineId { id: id.to_owned(), reason: "it is a keyword of the policy language".into() });
    }
    Ok(())
}

/// Refuses an id a policy could not name: empty, longer than
/// [`MAX_MACHINE_ID`], or with a character outside `[A-Za-z0-9_]`.
///
/// # Errors
/// [`WrapError::InvalidMachineId`].
pub(crate) fn check_machine_id(id: &str) -> Result<()> {
    let bad = |reason: &str| Err(WrapError::InvalidMachineId { id: id.chars().take(80).collect(), reason: reason.into() });
    if id.is_empty() {
        return bad("it is empty");
    }
    if id.len() > MAX_MACHINE_ID {
        return bad("it is longer than 64 characters");
    }
    if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return bad("a policy names only [A-Za-z0-9_]");
    }
    Ok(())
}

/// The policy a policy key is sealed under when `excluded` machines must
/// not open it: `(policy) and not machine: a and not machine: b ...`,
/// canonical; `policy` itself when none is excluded.
///
/// # Errors
/// [`WrapError::Abe`] (`POLICY_TOO_LARGE`) when the negations make the
/// policy larger than the CP-ABE format holds: rotate the master key,
/// which compacts them.
pub(crate) fn restricted(policy: &CanonicalPolicy, excluded: &[String]) -> Result<CanonicalPolicy> {
    if excluded.is_empty() {
        return Ok(policy.clone());
    }
    let mut text = format!("({policy})");
    for id in excluded {
        // Quoted: an id that is a keyword (`not`) is still a value. Ids
        // hold no quote or backslash; the canonical text drops the quotes
        // where they are not needed.
        text.push_str(&format!(" and not {MACHINE_LABEL}: \"{id}\""));
    }
    CanonicalPolicy::parse(&text).map_err(|e| WrapError::Abe(e.into()))
}

/// One revoked machine, as the authority's state records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Revoked {
    /// Its id.
    pub(crate) id: String,
    /// The newest generation that was live when it was revoked: the
    /// machine may hold keys of it and of older ones, never of newer ones.
    pub(crate) through: u32,
    /// Its policy keys are not all replaced and retired yet (an
    /// interrupted `revoke`; running it again finishes).
    pub(crate) pending: bool,
}

/// The ids whose negation the sealed copies of generation `generation`
/// carry: the machines that may hold a key of it.
pub(crate) fn excluded_for(revoked: &[Revoked], generation: u32) -> Vec<String> {
    let mut ids: Vec<String> = revoked.iter().filter(|r| r.through >= generation).map(|r| r.id.clone()).collect();
    ids.sort();
    ids
}

/// The signed list of revoked ids, sorted, dated now.
pub(crate) fn encode_list(signer: &AuthorityKey, revoked: &[Revoked]) -> Vec<u8> {
    let at = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_micros()).unwrap_or(u64::MAX);
    let mut ids: Vec<&str> = revoked.iter().map(|r| r.id.as_str()).collect();
    ids.sort_unstable();
    encode_ids(signer, at, &ids)
}

/// The signed list of `ids` (sorted), dated `at` (microseconds since the
/// epoch).
pub(crate) fn encode_ids(signer: &AuthorityKey, at: u64, ids: &[&str]) -> Vec<u8> {
    let mut w = writer(REVOKED_MAGIC);
    // Ids are at most 64 bytes; the count is bounded by the state's u32.
    w.raw(&signer.public()).u64(at).len32(ids.len());
    for id in ids {
        w.bytes16(id.as_bytes());
    }
    let mut bytes = w.into_bytes().to_vec();
    let signature = signer.sign(REVOKED_CONTEXT, &bytes);
    bytes.extend_from_slice(&signature);
    bytes
}

/// A verified revocation list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RevocationList {
    /// When the authority committed it (its clock).
    pub committed_at: Option<SystemTime>,
    /// The revoked machine ids, sorted.
    pub ids: Vec<String>,
}

impl RevocationList {
    /// Reads a list and checks that the authority `trusted` signed it.
    ///
    /// # Errors
    /// [`WrapError::Malformed`] (`revocation list`),
    /// [`WrapError::WrongAuthority`], [`WrapError::Tampered`].
    pub(crate) fn verify(bytes: &[u8], trusted: &[u8; 32]) -> Result<Self> {
        let mut r = reader(bytes, O, REVOKED_MAGIC)?;
        let authority = r.array("authority key").map_err(codec(O))?;
        let at = r.u64("commit time").map_err(codec(O))?;
        let n = r.u32("id count").map_err(codec(O))?;
        let mut ids: Vec<String> = Vec::new();
        for i in 0..n {
            let id = r.text16(|| format!("id[{i}]")).map_err(codec(O))?;
            if ids.last().is_some_and(|p| p.as_str() >= id) {
                return Err(super::error::malformed(O, format!("id {id:?} is out of order or repeated")));
            }
            ids.push(id.to_owned());
        }
        let signed = &bytes[..bytes.len() - r.remaining()];
        let signature: [u8; SIGNATURE_LEN] = r.array("signature").map_err(codec(O))?;
        r.finish().map_err(codec(O))?;
        check_signed(O, REVOKED_CONTEXT, trusted, &authority, signed, &signature)?;
        Ok(Self { committed_at: Some(UNIX_EPOCH + Duration::from_micros(at)), ids })
    }

    /// Whether `id` is revoked.
    pub fn contains(&self, id: &str) -> bool {
        self.ids.binary_search_by(|p| p.as_str().cmp(id)).is_ok()
    }
}

/// The newest revocation list a machine has accepted ([`Floor`]). Ids are
/// never taken off the list, so a list that lacks one already seen was
/// put back by whoever can write the store, and is refused.
pub(crate) type SeenRevocations = Floor<RevocationList>;

impl SignedList for RevocationList {
    const OBJECT: &'static str = O;

    fn verify(bytes: &[u8], trusted: &[u8; 32]) -> Result<Self> {
        RevocationList::verify(bytes, trusted)
    }

    fn absent() -> Self {
        RevocationList::default()
    }

    fn goes_back_on(&self, seen: &Self) -> Option<String> {
        seen.ids.iter().find(|id| !self.contains(id)).map(|missing| format!("it lacks revoked machine {missing}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_a_policy_can_name_only() {
        let id = new_machine_id();
        assert_eq!(id.len(), 32);
        check_machine_id(&id).unwrap();
        assert_ne!(id, new_machine_id());
        for bad in ["", "a-b", "a b", "é", &"a".repeat(65)] {
            assert_eq!(check_machine_id(bad).unwrap_err().code(), crate::ErrorCode::InvalidAttributes, "{bad:?}");
        }
        // Keywords: never issued, still revocable.
        for keyword in ["not", "and", "or"] {
            assert!(check_new_machine_id(keyword).unwrap_err().to_string().contains("keyword"));
            check_machine_id(keyword).unwrap();
        }
        check_new_machine_id("nothing").unwrap();
    }

    #[test]
    fn a_keyword_id_is_excluded_as_a_value() {
        let p = CanonicalPolicy::parse("region: EU").unwrap();
        let r = restricted(&p, &["not".into(), "m1".into()]).unwrap();
        let at = |s: &str| s.parse().unwrap();
        assert!(!r.eval(&at("region=EU,machine=not")));
        assert!(r.eval(&at("region=EU,machine=m3")));
        assert_eq!(r.to_string(), r#"region: EU and not machine: "not" and not machine: m1"#);
    }

    #[test]
    fn a_restricted_policy_excludes_exactly_the_named_machines() {
        let p = CanonicalPolicy::parse("region: EU or country: US").unwrap();
        assert_eq!(restricted(&p, &[]).unwrap(), p);
        let r = restricted(&p, &["m1".into(), "m2".into()]).unwrap();
        let at = |s: &str| s.parse().unwrap();
        assert!(r.eval(&at("region=EU,machine=m3")));
        assert!(!r.eval(&at("region=EU,machine=m1")));
        assert!(!r.eval(&at("country=US,machine=m2")));
        assert!(!r.eval(&at("region=NA,machine=m3")));
        // Negation needs the label: a key without an id opens nothing restricted.
        assert!(!r.eval(&at("region=EU")));
        // One canonical text, whatever built it.
        assert_eq!(CanonicalPolicy::parse(r.as_str()).unwrap(), r);
    }

    #[test]
    fn generations_exclude_the_machines_that_may_hold_their_keys() {
        let revoked = |id: &str, through| Revoked { id: id.into(), through, pending: false };
        let list = [revoked("b", 3), revoked("a", 5)];
        assert_eq!(excluded_for(&list, 3), vec!["a".to_owned(), "b".into()]);
        assert_eq!(excluded_for(&list, 4), vec!["a".to_owned()]);
        assert!(excluded_for(&list, 6).is_empty());
    }

    #[test]
    fn the_list_is_signed_and_never_goes_back() {
        let k = AuthorityKey::generate();
        let one = encode_list(&k, &[Revoked { id: "m1".into(), through: 1, pending: false }]);
        let two = encode_list(
            &k,
            &[Revoked { id: "m2".into(), through: 1, pending: true }, Revoked { id: "m1".into(), through: 1, pending: false }],
        );
        let l = RevocationList::verify(&two, &k.public()).unwrap();
        assert_eq!(l.ids, vec!["m1".to_owned(), "m2".into()]);
        assert!(l.contains("m2") && !l.contains("m3"));
        let mut bad = two.clone();
        let n = bad.len();
        bad[n - 70] ^= 1;
        assert_eq!(RevocationList::verify(&bad, &k.public()).unwrap_err().code(), crate::ErrorCode::InvalidEnvelope);
        let other = AuthorityKey::generate();
        assert_eq!(RevocationList::verify(&two, &other.public()).unwrap_err().code(), crate::ErrorCode::WrongAuthority);
        let seen = SeenRevocations::default();
        seen.accept(Some(&one), &k.public()).unwrap();
        seen.accept(Some(&two), &k.public()).unwrap();
        assert_eq!(seen.accept(Some(&one), &k.public()).unwrap_err().code(), crate::ErrorCode::ReplayedObject);
        assert_eq!(seen.accept(None, &k.public()).unwrap_err().code(), crate::ErrorCode::ReplayedObject);
    }
}
