//! The key loads waiting for a loader thread, one queue per user and
//! taken in turn.
//!
//! A load is a CP-ABE decryption (milliseconds), and two loader threads
//! serve every client of an agent. With one queue for all, one user's burst
//! (or an attacker's) filled it and every other user's load was refused;
//! with a small bound per user, a server's own burst was refused instead:
//! an agent restarted under nginx, Apache's children reconnecting at once,
//! each replaying its loads. So each user has a queue of its own, bounded,
//! and the loaders take the users in turn: a user with a thousand loads
//! waiting delays another user's load by at most one load per loader.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Why a load was not queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Full {
    /// The user has `per_user` loads waiting.
    User(usize),
    /// Every user together has `total` loads waiting.
    All(usize),
    /// The queue is closed: the server is ending.
    Closed,
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Full::User(n) => write!(f, "this user has {n} key loads waiting, the most the agent takes from one user"),
            Full::All(n) => write!(f, "too many key loads waiting ({n})"),
            Full::Closed => f.write_str("the key process is shutting down"),
        }
    }
}

struct Inner<T> {
    queues: HashMap<u32, VecDeque<T>>,
    /// Users with loads waiting, in the order the loaders take them.
    turn: VecDeque<u32>,
    total: usize,
    closed: bool,
}

/// Loads of `T`, per user.
pub(crate) struct LoadQueue<T> {
    inner: Mutex<Inner<T>>,
    ready: Condvar,
    per_user: usize,
    total: usize,
}

impl<T> LoadQueue<T> {
    /// A queue taking at most `per_user` loads from one user and `total`
    /// from all.
    pub(crate) fn new(per_user: usize, total: usize) -> Self {
        LoadQueue {
            inner: Mutex::new(Inner { queues: HashMap::new(), turn: VecDeque::new(), total: 0, closed: false }),
            ready: Condvar::new(),
            per_user: per_user.max(1),
            total: total.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `load` for `user`, or says why not (handing it back).
    pub(crate) fn push(&self, user: u32, load: T) -> Result<(), (Full, T)> {
        let mut q = self.lock();
        if q.closed {
            return Err((Full::Closed, load));
        }
        if q.total >= self.total {
            return Err((Full::All(q.total), load));
        }
        let mine = q.queues.entry(user).or_default();
        if mine.len() >= self.per_user {
            return Err((Full::User(mine.len()), load));
        }
        let first = mine.is_empty();
        mine.push_back(load);
        q.total += 1;
        if first {
            q.turn.push_back(user);
        }
        drop(q);
        self.ready.notify_one();
        Ok(())
    }

    /// The next load, taking users in turn; `None` once closed and empty.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut q = self.lock();
        loop {
            if let Some(user) = q.turn.pop_front() {
                let (load, more) = match q.queues.get_mut(&user) {
                    Some(mine) => (mine.pop_front(), !mine.is_empty()),
                    None => (None, false),
                };
                if more {
                    q.turn.push_back(user);
                } else {
                    q.queues.remove(&user);
                }
                if let Some(load) = load {
                    q.total -= 1;
                    return Some(load);
                }
                continue;
            }
            if q.closed {
                return None;
            }
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Refuses new loads; the loaders end once the waiting ones are taken.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_taken_in_turn_and_bounded_each_and_in_all() {
        let q = LoadQueue::new(3, 5);
        for i in 0..3 {
            q.push(1, (1, i)).unwrap();
        }
        assert_eq!(q.push(1, (1, 3)).unwrap_err().0, Full::User(3));
        q.push(2, (2, 0)).unwrap();
        q.push(3, (3, 0)).unwrap();
        assert_eq!(q.push(4, (4, 0)).unwrap_err().0, Full::All(5));
        // User 1 came first with three, yet 2 and 3 wait for one of its loads only.
        let order: Vec<_> = (0..5).map(|_| q.pop().unwrap()).collect();
        assert_eq!(order, [(1, 0), (2, 0), (3, 0), (1, 1), (1, 2)]);
        q.close();
        assert_eq!(q.pop(), None);
        assert_eq!(q.push(1, (1, 9)).unwrap_err().0, Full::Closed);
    }
}
