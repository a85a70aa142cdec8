//! A machine's floor under a signed list of the store (the generation
//! list, the revocation list): the newest list it has accepted, with its
//! signed bytes. Whoever can write the store cannot forge a list, but can
//! put back an older one the authority did sign; both lists only ever move
//! forward, so a list that goes back on the floor is refused
//! ([`WrapError::Replayed`]). What "going back" means is each list's own
//! ([`SignedList::goes_back_on`]); keeping the floor, handing it on and
//! raising it are the same for both, here.

use std::sync::Mutex;

use super::error::{Result, WrapError};

/// A list of the store signed by the authority, with the order a floor
/// keeps it in.
pub(crate) trait SignedList: Clone + std::fmt::Debug + Sized {
    /// The object's name in errors (`generation list`).
    const OBJECT: &'static str;

    /// Reads `bytes` and checks that the authority `trusted` signed them.
    fn verify(bytes: &[u8], trusted: &[u8; 32]) -> Result<Self>;

    /// The list a store without the object has (none written yet): only a
    /// machine that has accepted none takes it.
    fn absent() -> Self;

    /// Why this list goes back on `seen`, an earlier one; `None` when it
    /// does not.
    fn goes_back_on(&self, seen: &Self) -> Option<String>;
}

/// Called with the bytes of each list that becomes the newest accepted,
/// outside any lock: what keeps the newest lists across processes
/// (`newest::Keeper`) writes them down. Its error is the caller's: a
/// floor that cannot be kept is never skipped in silence, and the list is
/// offered again with the next acceptance until it is kept.
pub(crate) type OnNewer = std::sync::Arc<dyn Fn(&[u8]) -> Result<()> + Send + Sync>;

/// The newest list of one kind a machine has accepted, with its signed
/// bytes (what it hands on: [`crate::wrap::NewestLists`]).
pub(crate) struct Floor<L> {
    newest: Mutex<Option<(L, Vec<u8>)>>,
    /// The bytes `on_newer` last kept: a list accepted but not kept (its
    /// write failed) is offered again.
    kept: Mutex<Option<Vec<u8>>>,
    on_newer: Option<OnNewer>,
}

impl<L> Default for Floor<L> {
    fn default() -> Self {
        Floor { newest: Mutex::new(None), kept: Mutex::new(None), on_newer: None }
    }
}

impl<L: SignedList> std::fmt::Debug for Floor<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Floor").field("object", &L::OBJECT).field("newest", &newest.as_ref().map(|(l, _)| l)).finish_non_exhaustive()
    }
}

impl<L: SignedList> Floor<L> {
    /// Calls `f` with each list that becomes the newest accepted.
    pub(crate) fn on_newer(&mut self, f: OnNewer) {
        self.on_newer = Some(f);
    }

    /// Verifies `bytes` (the store's object; `None` when absent) and
    /// accepts it unless it goes back on the newest list accepted so far,
    /// which it then replaces.
    ///
    /// # Errors
    /// As [`SignedList::verify`]; [`WrapError::Replayed`]; `on_newer`'s
    /// error (the list is accepted, but not kept).
    pub(crate) fn accept(&self, bytes: Option<&[u8]>, trusted: &[u8; 32]) -> Result<L> {
        let list = match bytes {
            Some(b) => L::verify(b, trusted)?,
            None => L::absent(),
        };
        let mut seen = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = seen.as_ref().and_then(|(s, _)| list.goes_back_on(s)) {
            return Err(WrapError::Replayed { object: L::OBJECT, reason: why });
        }
        let Some(bytes) = bytes else {
            // Only a machine that has seen no list gets here: nothing newer.
            return Ok(list);
        };
        *seen = Some((list.clone(), bytes.to_vec()));
        drop(seen);
        self.keep(bytes)?;
        Ok(list)
    }

    /// Hands `bytes`, now the newest, to `on_newer` unless it kept them
    /// already.
    fn keep(&self, bytes: &[u8]) -> Result<()> {
        let Some(f) = &self.on_newer else { return Ok(()) };
        if self.kept.lock().unwrap_or_else(|e| e.into_inner()).as_deref() == Some(bytes) {
            return Ok(());
        }
        f(bytes)?;
        *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes.to_vec());
        Ok(())
    }

    /// Raises the floor to `bytes`, a list signed by `trusted` that a
    /// caller requires (kept from an earlier process, or carried by a
    /// client): later lists must not go back on it. A list that goes back
    /// on the newest accepted leaves that one in place.
    ///
    /// # Errors
    /// As [`SignedList::verify`]; `on_newer`'s error.
    pub(crate) fn raise(&self, bytes: &[u8], trusted: &[u8; 32]) -> Result<()> {
        let list = L::verify(bytes, trusted)?;
        let mut seen = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        let raised = seen.as_ref().is_none_or(|(s, b)| list.goes_back_on(s).is_none() && b.as_slice() != bytes);
        if raised {
            *seen = Some((list, bytes.to_vec()));
        }
        drop(seen);
        // A floor handed over is kept as one accepted from the store is.
        if raised {
            self.keep(bytes)?;
        }
        Ok(())
    }

    /// The signed bytes of the newest list accepted, if any.
    pub(crate) fn newest_bytes(&self) -> Option<Vec<u8>> {
        self.newest.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(_, b)| b.clone())
    }
}

/// Whether the list `candidate` may replace `floor` (both signed by
/// `trusted`): it does not go back on it. A floor that does not verify is
/// no floor.
pub(crate) fn is_newer_or_same<L: SignedList>(candidate: &[u8], floor: &[u8], trusted: &[u8; 32]) -> bool {
    match (L::verify(candidate, trusted), L::verify(floor, trusted)) {
        (Ok(c), Ok(f)) => c.goes_back_on(&f).is_none(),
        (Ok(_), Err(_)) => true,
        (Err(_), _) => false,
    }
}
