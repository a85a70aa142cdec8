//! The store's parsers that are not public API, for the fuzzers (`fuzz/`;
//! the `testing` feature only): the signed generation list, the signed
//! revocation list, sealed policy keys (`KFP2`, and `KFP3` when they
//! exclude revoked machines) and, with `etcd`, what the etcd store makes
//! of its gateway's answers and watch stream. Each function is a thin
//! door to the code a machine runs, never a copy of it.
//!
//! A fuzzer's bytes never carry a valid signature, so everything a parser
//! does after the signature check would stay out of its reach: [`resign`]
//! signs bytes as a fixed authority ([`authority`]), whose objects
//! [`read`] reads.

use super::error::Result;
use super::generation_list::{self, GenerationList};
use super::revocation::{self, RevocationList};
use super::sealed::SealedKey;
use super::signing::{AuthorityKey, GENERATIONS_CONTEXT, REVOKED_CONTEXT, SEALED_CONTEXT, SIGNATURE_LEN};
use std::time::UNIX_EPOCH;

/// A signed object a machine reads from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Object {
    /// The generation list (`public/generations`, `KFG2`).
    GenerationList,
    /// The revocation list (`public/revoked`, `KFR2`).
    RevocationList,
    /// A sealed policy key (`sealed/...`, `KFP2` or `KFP3`).
    SealedKey,
}

impl Object {
    /// Where the authority's public key sits, and what its signature covers.
    fn layout(self) -> (usize, &'static [u8]) {
        match self {
            Object::GenerationList => (4, GENERATIONS_CONTEXT),
            Object::RevocationList => (4, REVOKED_CONTEXT),
            // After the magic and the HPKE suite.
            Object::SealedKey => (6, SEALED_CONTEXT),
        }
    }
}

fn signer() -> AuthorityKey {
    AuthorityKey::from_bytes(&[0x5e; 32])
}

/// The public key of the fixed authority the fuzzers sign as.
pub fn authority() -> [u8; 32] {
    signer().public()
}

/// `bytes` as the fixed authority would have signed them as `object`: its
/// public key in the authority field, and in the last 64 bytes its
/// signature of all before them. Bytes too short to hold both come back
/// unchanged.
pub fn resign(object: Object, bytes: &[u8]) -> Vec<u8> {
    let (at, context) = object.layout();
    let mut out = bytes.to_vec();
    if out.len() < at + 32 + SIGNATURE_LEN {
        return out;
    }
    let k = signer();
    out[at..at + 32].copy_from_slice(&k.public());
    let body = out.len() - SIGNATURE_LEN;
    let signature = k.sign(context, &out[..body]);
    out[body..].copy_from_slice(&signature);
    out
}

/// Reads `bytes` as a machine reads `object` (parsed, then checked to be
/// signed by the fixed authority), and writes what it read back with the
/// authority's own encoder and key: the same bytes, as every object has
/// one encoding.
///
/// # Errors
/// What the machine's reading returns.
pub fn read(object: Object, bytes: &[u8]) -> Result<Vec<u8>> {
    let trusted = authority();
    match object {
        Object::GenerationList => {
            let list = GenerationList::verify(bytes, &trusted)?;
            Ok(generation_list::encode_at(&signer(), micros(list.committed_at), list.generations))
        }
        Object::RevocationList => {
            let list = RevocationList::verify(bytes, &trusted)?;
            let ids: Vec<&str> = list.ids.iter().map(String::as_str).collect();
            Ok(revocation::encode_ids(&signer(), list.committed_at.map_or(0, micros), &ids))
        }
        Object::SealedKey => {
            let sealed = SealedKey::parse(bytes)?;
            sealed.verify(&trusted)?;
            Ok(sealed.to_bytes())
        }
    }
}

fn micros(t: std::time::SystemTime) -> u64 {
    // Read from a u64 of microseconds, so it fits.
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// What a machine remembers of the lists it has accepted, to refuse one
/// put back by whoever can write the store.
#[derive(Debug, Default)]
pub struct Seen {
    generations: generation_list::Seen,
    revocations: revocation::SeenRevocations,
}

impl Seen {
    /// Accepts `bytes` (`None`: the store holds none) as the store's
    /// newest generation list, signed by the fixed authority, as a machine
    /// does before it uses one.
    ///
    /// # Errors
    /// As [`read`]; `REPLAYED_OBJECT` for a list that goes back on one
    /// accepted before.
    pub fn accept_generations(&self, bytes: Option<&[u8]>) -> Result<()> {
        self.generations.accept(bytes, &authority()).map(|_| ())
    }

    /// The same for the revocation list.
    ///
    /// # Errors
    /// As [`Seen::accept_generations`].
    pub fn accept_revocations(&self, bytes: Option<&[u8]>) -> Result<()> {
        self.revocations.accept(bytes, &authority()).map(|_| ())
    }
}

/// What the etcd store makes of its gateway's answers
/// (`wrap::EtcdStore`), apart from the requests that fetch them.
#[cfg(feature = "etcd")]
pub mod etcd {
    pub use super::super::etcd::WatchLine;
    use super::super::etcd::{self as e, Failure};
    use super::super::store::{Stamp, StoreError};

    /// An answer the store accepted: its JSON.
    #[derive(Debug)]
    pub struct Answer(serde_json::Value);

    /// Reads an answer with HTTP `status`, or says why it failed and
    /// whether the store would try another member (`Err((true, _))`).
    ///
    /// # Errors
    /// Not JSON, an error status or an `error` field.
    pub fn answer(status: u16, body: &[u8]) -> Result<Answer, (bool, String)> {
        e::answer("http://fuzz", status, body).map(Answer).map_err(|f| match f {
            Failure::Retry(m) => (true, m),
            Failure::Final(m) => (false, m),
        })
    }

    impl Answer {
        /// The cluster revision in its header (`EtcdStore::revision`).
        pub fn revision(&self) -> i64 {
            e::revision_of(&self.0)
        }

        /// As an answer to a read of one key (`Store::get_stamped`).
        ///
        /// # Errors
        /// A value that is not base64.
        pub fn range(&self, key: &str) -> Result<Option<(Vec<u8>, Stamp)>, StoreError> {
            e::range_value(&self.0, key)
        }

        /// As one page of a listing under `prefix` of a store whose keys
        /// start with `store_prefix` (`Store::list`): the names, and
        /// whether another page follows.
        ///
        /// # Errors
        /// A key that is not base64 or UTF-8, or outside the store.
        pub fn page(&self, store_prefix: &str, prefix: &str) -> Result<(Vec<String>, bool), StoreError> {
            e::list_page(&self.0, store_prefix, prefix)
        }

        /// As the answer to reading `keys` in one transaction
        /// (`Store::get_many`).
        ///
        /// # Errors
        /// A count of reads other than `keys.len()`, a value not base64.
        pub fn values(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
            e::txn_values(&self.0, keys)
        }

        /// As the answer to a commit: whether it was made (`Store::commit`).
        pub fn succeeded(&self) -> bool {
            e::txn_succeeded(&self.0)
        }
    }

    /// Reads one line of a watch stream, as the watch thread of a store
    /// whose keys start with `store_prefix` does after revision `last`.
    pub fn watch_line(line: &str, store_prefix: &str, last: i64) -> WatchLine {
        e::watch_line(line, store_prefix, last)
    }
}
