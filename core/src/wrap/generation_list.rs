//! The replicated generation list (`public/generations`): which master
//! generations are live, signed by the authority, with the time of the
//! commit that wrote it.
//!
//! Whoever can write the store cannot forge it (the signature), but could
//! put back an older list the authority did sign, to revive a
//! decrypt-only or retired generation in a machine's eyes. A list only
//! ever moves forward (generations are added, and each one's state goes
//! active, decrypt-only, retired, never back), so a machine keeps the
//! newest list it has accepted ([`Seen`]) and refuses any list that goes
//! back on it ([`WrapError::Replayed`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::error::{codec, malformed, Result};
use super::floor::{Floor, SignedList};
use super::format::{check_signed, reader, writer, GENERATIONS_MAGIC};
use super::generation::GenerationState;
use super::signing::{AuthorityKey, GENERATIONS_CONTEXT, SIGNATURE_LEN};

const O: &str = "generation list";

/// A verified generation list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GenerationList {
    /// When the authority committed it (its clock).
    pub(crate) committed_at: SystemTime,
    /// Each generation and its state, oldest first.
    pub(crate) generations: Vec<(u32, GenerationState)>,
}

/// The list's encoding, signed by `signer`, dated now.
pub(crate) fn encode(signer: &AuthorityKey, generations: impl IntoIterator<Item = (u32, GenerationState)>) -> Vec<u8> {
    let at = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_micros()).unwrap_or(u64::MAX);
    encode_at(signer, at, generations)
}

/// The list's encoding, signed by `signer`, dated `at` (microseconds
/// since the epoch).
pub(crate) fn encode_at(signer: &AuthorityKey, at: u64, generations: impl IntoIterator<Item = (u32, GenerationState)>) -> Vec<u8> {
    let generations: Vec<_> = generations.into_iter().collect();
    let mut w = writer(GENERATIONS_MAGIC);
    // The count fits: the authority refuses a 65,536th generation.
    w.raw(&signer.public()).u64(at).len16(generations.len());
    for (n, s) in generations {
        w.u32(n).u8(s.code());
    }
    let mut bytes = w.into_bytes().to_vec();
    let signature = signer.sign(GENERATIONS_CONTEXT, &bytes);
    bytes.extend_from_slice(&signature);
    bytes
}

impl GenerationList {
    /// Reads a list and checks that the authority `trusted` signed it.
    ///
    /// # Errors
    /// [`WrapError::Malformed`] (`generation list`),
    /// [`WrapError::WrongAuthority`], [`WrapError::Tampered`].
    pub(crate) fn verify(bytes: &[u8], trusted: &[u8; 32]) -> Result<Self> {
        if is_unsigned_text(bytes) {
            return Err(malformed(
                O,
                "the unsigned text list keyfence wrote before it signed the list; the authority signs it when it \
                 next opens the store (any `keyfence authority` command, or `Authority::open`)",
            ));
        }
        let mut r = reader(bytes, O, GENERATIONS_MAGIC)?;
        let authority = r.array("authority key").map_err(codec(O))?;
        let at = r.u64("commit time").map_err(codec(O))?;
        let mut generations = Vec::new();
        for i in 0..r.u16("generation count").map_err(codec(O))? {
            let n = r.u32(|| format!("generation[{i}]")).map_err(codec(O))?;
            let code = r.u8(|| format!("state[{i}]")).map_err(codec(O))?;
            let s = GenerationState::from_code(code).ok_or_else(|| malformed(O, format!("state[{i}] {code} is unknown")))?;
            if generations.last().is_some_and(|(p, _)| *p >= n) {
                return Err(malformed(O, format!("generation {n} is out of order or repeated")));
            }
            generations.push((n, s));
        }
        let signed = &bytes[..bytes.len() - r.remaining()];
        let signature: [u8; SIGNATURE_LEN] = r.array("signature").map_err(codec(O))?;
        r.finish().map_err(codec(O))?;
        check_signed(O, GENERATIONS_CONTEXT, trusted, &authority, signed, &signature)?;
        Ok(Self { committed_at: UNIX_EPOCH + Duration::from_micros(at), generations })
    }

    /// The live generations.
    pub(crate) fn live(&self) -> Vec<u32> {
        self.generations.iter().filter(|(_, s)| s.is_live()).map(|(n, _)| *n).collect()
    }

    /// The first way this list goes back on `seen`: a generation it lacks,
    /// or one whose state is earlier in the life cycle.
    fn goes_back_on(&self, seen: &GenerationList) -> Option<String> {
        seen.generations.iter().find_map(|(n, s)| match self.generations.iter().find(|(m, _)| m == n) {
            None => Some(format!("it lacks generation {n}")),
            Some((_, t)) if t.code() < s.code() => Some(format!("it says generation {n} is {t:?}, already seen {s:?}")),
            Some(_) => None,
        })
    }
}

/// Whether `bytes` is the list as keyfence wrote it before signing it:
/// "{generation} {state}\n" lines, no magic. Only the authority may turn
/// it into a signed list ([`crate::wrap::Authority::open`] does, from its
/// own state); a machine refuses it, since anyone who can write the store
/// could have written it.
pub(crate) fn is_unsigned_text(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| b.is_ascii_digit() || *b == b' ' || *b == b'\n')
}

/// The newest generation list a machine has accepted ([`Floor`]).
pub(crate) type Seen = Floor<GenerationList>;

impl SignedList for GenerationList {
    const OBJECT: &'static str = O;

    fn verify(bytes: &[u8], trusted: &[u8; 32]) -> Result<Self> {
        GenerationList::verify(bytes, trusted)
    }

    fn absent() -> Self {
        GenerationList { committed_at: UNIX_EPOCH, generations: Vec::new() }
    }

    fn goes_back_on(&self, seen: &Self) -> Option<String> {
        GenerationList::goes_back_on(self, seen)
    }
}

#[cfg(test)]
mod tests {
    use super::super::error::WrapError;
    use super::*;
    use GenerationState::*;

    #[test]
    fn a_list_reads_back_only_with_its_authority_and_unmodified() {
        let k = AuthorityKey::generate();
        let bytes = encode(&k, [(1, Retired), (2, DecryptOnly), (3, Active)]);
        let list = GenerationList::verify(&bytes, &k.public()).unwrap();
        assert_eq!(list.generations, vec![(1, Retired), (2, DecryptOnly), (3, Active)]);
        assert_eq!(list.live(), vec![2, 3]);
        let age = SystemTime::now().duration_since(list.committed_at).unwrap();
        assert!(age < Duration::from_secs(60), "{age:?}");
        let other = AuthorityKey::generate();
        assert!(matches!(GenerationList::verify(&bytes, &other.public()), Err(WrapError::WrongAuthority { .. })));
        let mut flipped = bytes.clone();
        // The state of generation 1: retired made active.
        let at = 4 + 32 + 8 + 2 + 4;
        flipped[at] = 0;
        assert!(matches!(GenerationList::verify(&flipped, &k.public()), Err(WrapError::Tampered { .. })));
        assert!(GenerationList::verify(b"1 0\n", &k.public()).is_err(), "the unsigned text list is refused");
        let e = GenerationList::verify(&bytes[..bytes.len() - 1], &k.public()).unwrap_err();
        assert_eq!(e.code(), crate::ErrorCode::InconsistentState, "{e}");
    }

    #[test]
    fn a_list_that_goes_back_is_refused_once_a_newer_one_was_seen() {
        let k = AuthorityKey::generate();
        let v1 = encode(&k, [(1, Active)]);
        let v2 = encode(&k, [(1, DecryptOnly), (2, Active)]);
        let v3 = encode(&k, [(1, Retired), (2, DecryptOnly), (3, Active)]);
        let seen = Seen::default();
        seen.accept(Some(&v1), &k.public()).unwrap();
        seen.accept(Some(&v3), &k.public()).unwrap();
        for (old, why) in [(&v2, "generation 1 is DecryptOnly"), (&v1, "generation 1 is Active")] {
            let e = seen.accept(Some(old), &k.public()).unwrap_err();
            assert_eq!(e.code(), crate::ErrorCode::ReplayedObject, "{e}");
            assert!(e.to_string().contains(why), "{e}");
        }
        assert!(seen.accept(None, &k.public()).is_err(), "a withheld list is refused too");
        // The same list again, and the next one, are fine.
        seen.accept(Some(&v3), &k.public()).unwrap();
        let v4 = encode(&k, [(1, Retired), (2, Retired), (3, DecryptOnly), (4, Active)]);
        assert_eq!(seen.accept(Some(&v4), &k.public()).unwrap().live(), vec![3, 4]);
    }
}
