//! Memory a server's clients make it hold, charged to their user and to
//! the server as a whole.
//!
//! An agent's clients are local users who do not trust each other. Bounds
//! per connection were not enough: a partial 1 MiB frame on each of 512
//! connections took an agent from 16 MB to 1,158 MB, and every user's
//! signatures with it. So every buffer a client makes the server hold (the
//! frames it has begun to send, the requests waiting for a thread, the
//! replies it has not read, the keys it loaded) is a [`Charge`] against
//! its user's [`Pool`] and the server's: a charge that would take either
//! past its bound fails, and the connection asking for it is refused or
//! cut off, never the others. A charge is given back when its buffer is
//! dropped, so a connection that closes leaves nothing counted.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes that may be held at once, and how many are.
#[derive(Debug)]
pub(crate) struct Pool {
    limit: usize,
    used: AtomicUsize,
}

impl Pool {
    /// A pool of `limit` bytes.
    pub(crate) fn new(limit: usize) -> Arc<Pool> {
        Arc::new(Pool { limit, used: AtomicUsize::new(0) })
    }

    /// Bytes held now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Adds `more` unless that passes the limit; what it then holds, or
    /// what it held.
    fn take(&self, more: usize) -> Result<(), usize> {
        let before = self.used.fetch_add(more, Ordering::AcqRel);
        if before.saturating_add(more) > self.limit {
            self.used.fetch_sub(more, Ordering::AcqRel);
            return Err(before);
        }
        Ok(())
    }

    fn give(&self, less: usize) {
        self.used.fetch_sub(less, Ordering::AcqRel);
    }
}

/// What one client's charges count against: its user's pool and the
/// server's.
#[derive(Debug, Clone)]
pub(crate) struct Account {
    user: Arc<Pool>,
    all: Arc<Pool>,
}

impl Account {
    /// Charges against `user` and `all` (the same pool, for a server with
    /// one client).
    pub(crate) fn new(user: Arc<Pool>, all: Arc<Pool>) -> Self {
        Account { user, all }
    }

    /// An account with one pool of `limit` bytes for the user and in all.
    pub(crate) fn single(limit: usize) -> Self {
        let pool = Pool::new(limit);
        Account { user: pool.clone(), all: pool }
    }

    /// Takes `bytes` without a [`Charge`] to give them back: for a record
    /// that holds its account anyway and gives them back itself
    /// ([`Account::give`]), so that a request costs no reference counts.
    pub(crate) fn take(&self, bytes: usize) -> Result<(), Over> {
        self.user.take(bytes).map_err(|used| Over::User { used, limit: self.user.limit })?;
        if !Arc::ptr_eq(&self.user, &self.all) {
            if let Err(used) = self.all.take(bytes) {
                self.user.give(bytes);
                return Err(Over::All { used, limit: self.all.limit });
            }
        }
        Ok(())
    }

    /// Gives back `bytes` that [`Account::take`] took.
    pub(crate) fn give(&self, bytes: usize) {
        self.user.give(bytes);
        if !Arc::ptr_eq(&self.user, &self.all) {
            self.all.give(bytes);
        }
    }

    /// A charge of `bytes`, or why not.
    pub(crate) fn charge(&self, bytes: usize) -> Result<Charge, Over> {
        let mut c = Charge { account: self.clone(), held: 0 };
        c.set(bytes)?;
        Ok(c)
    }
}

/// Why a charge failed: the bound it would have passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Over {
    /// The user's connections hold `used` of its `limit` bytes.
    User { used: usize, limit: usize },
    /// All users together hold `used` of the server's `limit` bytes.
    All { used: usize, limit: usize },
}

impl fmt::Display for Over {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        match *self {
            Over::User { used, limit } => write!(
                f,
                "this user's connections hold {:.1} MiB of the server's memory (requests begun or waiting, replies unread, keys), the most one user may ({:.0} MiB)",
                mib(used),
                mib(limit)
            ),
            Over::All { used, limit } => write!(
                f,
                "the server's clients hold {:.1} MiB of its memory, the most it holds for all of them ({:.0} MiB)",
                mib(used),
                mib(limit)
            ),
        }
    }
}

/// Bytes held for one buffer, counted against an [`Account`] until
/// dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    account: Account,
    held: usize,
}

impl Charge {
    /// The bytes charged.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Makes the charge `bytes`. Growing fails, changing nothing, when the
    /// user or the server would pass its bound; shrinking never fails.
    pub(crate) fn set(&mut self, bytes: usize) -> Result<(), Over> {
        match bytes.cmp(&self.held) {
            std::cmp::Ordering::Equal => Ok(()),
            std::cmp::Ordering::Less => {
                self.account.give(self.held - bytes);
                self.held = bytes;
                Ok(())
            }
            std::cmp::Ordering::Greater => {
                self.account.take(bytes - self.held)?;
                self.held = bytes;
                Ok(())
            }
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let _ = self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_count_against_the_user_and_the_whole_and_come_back_when_dropped() {
        let all = Pool::new(100);
        let (alice, bob) = (Pool::new(60), Pool::new(60));
        let a = Account::new(alice.clone(), all.clone());
        let b = Account::new(bob.clone(), all.clone());
        let mut a1 = a.charge(50).unwrap();
        assert_eq!(a.charge(20).unwrap_err(), Over::User { used: 50, limit: 60 });
        let b1 = b.charge(40).unwrap();
        // Bob is within his share, but the whole is not.
        assert_eq!(b.charge(20).unwrap_err(), Over::All { used: 90, limit: 100 });
        assert_eq!(bob.used(), 40, "a refused charge leaves nothing behind");
        a1.set(10).unwrap();
        let b2 = b.charge(20).unwrap();
        assert_eq!((alice.used(), bob.used(), all.used()), (10, 60, 70));
        drop((a1, b1, b2));
        assert_eq!((alice.used(), bob.used(), all.used()), (0, 0, 0));
        let one = Account::single(10);
        let c = one.charge(10).unwrap();
        assert!(one.charge(1).is_err());
        assert_eq!(c.held(), 10);
        assert!(Over::User { used: 3 << 20, limit: 64 << 20 }.to_string().contains("3.0 MiB"));
    }
}
