//! Work waiting for a pool of threads, one queue per user, taken by how
//! much of the threads' time each user has had.
//!
//! An agent's clients are local users who do not trust each other, and
//! every user's signatures run on the same few threads. With one queue
//! for all, first come first served, one user who queued 4,096 RSA-4096
//! signatures made another user's RSA-2048 signature wait 7.3 s (past
//! every client's deadline). Taking users in turn is not enough either: a
//! turn of RSA-4096 costs seven turns of RSA-2048.
//!
//! So this is start-time fair queueing on measured time: each user has a
//! virtual clock, the time the threads have spent on its work; a thread
//! that is free takes the next job of the waiting user whose clock is
//! lowest, charges it an estimate when it starts (the user's recent
//! average, so two threads do not both take the same user's next job on
//! credit) and the time it really took when it ends. A user who starts
//! waiting joins at the clock of the job last started, so time it was
//! idle is no credit to spend later: a user who signs now and then is
//! served as soon as a thread is free, and a user who keeps every thread
//! busy gets what the others leave. With several users busy, each gets
//! an equal share of the threads' time.
//!
//! Room is bounded per user and in all. When every slot is taken, a user
//! with fewer jobs waiting than the user with the most takes a slot from
//! that one: the heaviest user's newest job is handed back to be refused
//! as busy, so that one user's backlog never fills the queue for others.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Why a job was not queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Full {
    /// The user has this many jobs waiting, the most one user may.
    User(usize),
    /// Every slot is taken, and by users with no more waiting than this one.
    All(usize),
    /// The queue is closed: the server is ending.
    Closed,
}

/// One user's place in the queue.
struct Lane<T> {
    user: u32,
    jobs: VecDeque<T>,
    /// Nanoseconds of the threads' time charged to this user, on the
    /// queue's virtual clock.
    clock: u64,
    /// What one of its jobs has cost of late (an average), charged when
    /// one starts and corrected when it ends.
    cost: u64,
    /// When it last started waiting, to break ties in arrival order.
    since: u64,
}

struct State<T> {
    /// A few users at a time (a key process has one): a vector searched
    /// in order costs less than hashing.
    lanes: Vec<Lane<T>>,
    waiting: usize,
    /// The virtual time of the job last started: where a user who starts
    /// waiting joins.
    clock: u64,
    arrivals: u64,
    closed: bool,
    /// Threads asleep in [`FairQueue::next`]: a push wakes one only then.
    sleeping: usize,
}

impl<T> State<T> {
    fn lane(&mut self, user: u32) -> Option<&mut Lane<T>> {
        self.lanes.iter_mut().find(|l| l.user == user)
    }
}

/// Jobs of `T`, per user.
pub(crate) struct FairQueue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    per_user: usize,
    total: usize,
}

/// A job taken from the queue: hand it back with the time the job took
/// to [`FairQueue::next`] (which takes the next one under the same lock)
/// or [`FairQueue::charge`].
#[must_use = "charge the time the job took, or its user is served on credit"]
#[derive(Debug)]
pub(crate) struct Ticket {
    user: u32,
    estimate: u64,
}

/// A job done: its ticket and the time it took.
pub(crate) type Done = (Ticket, Duration);

/// Lanes of users with nothing waiting are kept (with their average
/// cost) up to this many, then forgotten.
const IDLE_LANES: usize = 64;

impl<T> FairQueue<T> {
    /// A queue taking at most `per_user` jobs from one user and `total`
    /// in all.
    pub(crate) fn new(per_user: usize, total: usize) -> Self {
        FairQueue {
            state: Mutex::new(State { lanes: Vec::new(), waiting: 0, clock: 0, arrivals: 0, closed: false, sleeping: 0 }),
            ready: Condvar::new(),
            per_user: per_user.max(1),
            total: total.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job` for `user`. `Ok(Some(other))`: the queue was full and
    /// `other`, the newest job of the user with the most waiting, made
    /// room (the caller refuses it as busy). `Err`: why not, handing the
    /// job back.
    pub(crate) fn push(&self, user: u32, job: T) -> Result<Option<T>, (Full, T)> {
        let mut s = self.lock();
        if s.closed {
            return Err((Full::Closed, job));
        }
        let mine = s.lane(user).map_or(0, |l| l.jobs.len());
        if mine >= self.per_user {
            return Err((Full::User(mine), job));
        }
        let mut evicted = None;
        if s.waiting >= self.total {
            let heaviest = s.lanes.iter_mut().filter(|l| l.user != user).max_by_key(|l| l.jobs.len());
            match heaviest {
                Some(l) if l.jobs.len() > mine + 1 => evicted = l.jobs.pop_back(),
                _ => return Err((Full::All(s.waiting), job)),
            }
            s.waiting -= 1;
        }
        let (clock, arrival) = (s.clock, s.arrivals);
        let lane = match s.lanes.iter().position(|l| l.user == user) {
            Some(at) => &mut s.lanes[at],
            None => {
                s.lanes.push(Lane { user, jobs: VecDeque::new(), clock, cost: 0, since: arrival });
                s.lanes.last_mut().expect("just pushed")
            }
        };
        if lane.jobs.is_empty() {
            // Time spent idle is no credit.
            lane.clock = lane.clock.max(clock);
            lane.since = arrival;
        }
        lane.jobs.push_back(job);
        s.arrivals += 1;
        s.waiting += 1;
        let wake = s.sleeping > 0;
        drop(s);
        if wake {
            self.ready.notify_one();
        }
        Ok(evicted)
    }

    /// Charges the job `done` was (if any) with the time it took, then
    /// takes the next job, of the waiting user with the lowest clock:
    /// waiting for one with `wait`, else `None` when none waits. `None`
    /// too once closed and empty. One lock for both, as a worker does
    /// both after each job.
    pub(crate) fn next(&self, done: Option<Done>, wait: bool) -> Option<(T, Ticket)> {
        let mut s = self.lock();
        if let Some((ticket, took)) = done {
            Self::charge_locked(&mut s, ticket, took);
        }
        loop {
            if let Some(taken) = Self::take(&mut s) {
                return Some(taken);
            }
            if s.closed || !wait {
                return None;
            }
            s.sleeping += 1;
            s = self.ready.wait(s).unwrap_or_else(|e| e.into_inner());
            s.sleeping -= 1;
        }
    }

    fn take(s: &mut State<T>) -> Option<(T, Ticket)> {
        let at =
            s.lanes.iter().enumerate().filter(|(_, l)| !l.jobs.is_empty()).min_by_key(|(_, l)| (l.clock, l.since)).map(|(at, _)| at)?;
        let lane = &mut s.lanes[at];
        let job = lane.jobs.pop_front()?;
        let start = lane.clock;
        let estimate = lane.cost.max(1);
        lane.clock = start.saturating_add(estimate);
        let user = lane.user;
        s.clock = s.clock.max(start);
        s.waiting -= 1;
        if s.lanes.len() > IDLE_LANES {
            s.lanes.retain(|l| !l.jobs.is_empty());
        }
        Some((job, Ticket { user, estimate }))
    }

    /// Charges the job `ticket` was for with the time it took, in place of
    /// the estimate charged when it started.
    #[cfg(test)]
    pub(crate) fn charge(&self, ticket: Ticket, took: Duration) {
        Self::charge_locked(&mut self.lock(), ticket, took);
    }

    fn charge_locked(s: &mut State<T>, ticket: Ticket, took: Duration) {
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
        if let Some(lane) = s.lane(ticket.user) {
            lane.clock = lane.clock.saturating_sub(ticket.estimate).saturating_add(took);
            lane.cost = if lane.cost == 0 { took } else { (lane.cost.saturating_mul(7) + took) / 8 };
        }
    }

    /// Whether no job is waiting.
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().waiting == 0
    }

    /// Refuses new jobs; [`FairQueue::next`] returns `None` once the
    /// waiting ones are taken.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Full::User(n) => write!(f, "this user has {n} requests of this kind waiting, the most one user may"),
            Full::All(n) => write!(f, "the queue is full ({n} requests waiting)"),
            Full::Closed => f.write_str("the server is shutting down"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn take(q: &FairQueue<(u32, u32)>, took: Duration) -> (u32, u32) {
        let (job, ticket) = q.next(None, false).expect("a job");
        q.charge(ticket, took);
        job
    }

    #[test]
    fn a_user_with_a_backlog_does_not_delay_another_users_next_job() {
        let q = FairQueue::new(100, 1000);
        for i in 0..50 {
            q.push(1, (1, i)).unwrap();
        }
        // User 1's jobs cost 7 ms each; two run.
        assert_eq!(take(&q, Duration::from_millis(7)), (1, 0));
        assert_eq!(take(&q, Duration::from_millis(7)), (1, 1));
        // User 2 arrives with a 1 ms job: it is next, not 48 jobs later.
        q.push(2, (2, 0)).unwrap();
        assert_eq!(take(&q, Duration::from_millis(1)), (2, 0));
        // And user 1's next job comes after it, not before.
        assert_eq!(take(&q, Duration::from_millis(7)), (1, 2));
    }

    #[test]
    fn busy_users_share_the_threads_time_equally() {
        let q = FairQueue::new(10_000, 100_000);
        for i in 0..2000 {
            q.push(1, (1, i)).unwrap();
            q.push(2, (2, i)).unwrap();
        }
        let (mut t1, mut t2) = (0u64, 0u64);
        for _ in 0..1000 {
            let (job, ticket) = q.next(None, false).unwrap();
            let took = if job.0 == 1 { 7 } else { 1 };
            q.charge(ticket, Duration::from_millis(took));
            if job.0 == 1 {
                t1 += took;
            } else {
                t2 += took;
            }
        }
        let ratio = t1 as f64 / t2 as f64;
        assert!((0.9..1.1).contains(&ratio), "user 1 had {t1} ms, user 2 {t2} ms");
    }

    #[test]
    fn idle_time_is_no_credit() {
        let q = FairQueue::new(100, 1000);
        // User 2 ran a lot long ago, then user 1 ran for a long time alone.
        q.push(2, (2, 0)).unwrap();
        take(&q, Duration::from_millis(5));
        for i in 0..20 {
            q.push(1, (1, i)).unwrap();
        }
        for _ in 0..10 {
            take(&q, Duration::from_millis(10));
        }
        // User 3 arrives: it is served next, but does not get the next ten
        // jobs in a row on the time user 1 spent.
        for i in 0..10 {
            q.push(3, (3, i)).unwrap();
        }
        let order: Vec<u32> = (0..6).map(|_| take(&q, Duration::from_millis(10)).0).collect();
        assert_eq!(order[0], 3);
        assert!(order.iter().filter(|u| **u == 1).count() >= 2, "{order:?}");
    }

    #[test]
    fn bounds_per_user_and_in_all_and_the_heaviest_user_makes_room() {
        let q = FairQueue::new(3, 4);
        for i in 0..3 {
            q.push(1, (1, i)).unwrap();
        }
        assert_eq!(q.push(1, (1, 3)).unwrap_err().0, Full::User(3));
        q.push(2, (2, 0)).unwrap();
        // Full: user 3 (none waiting) takes user 1's newest slot.
        assert_eq!(q.push(3, (3, 0)).unwrap(), Some((1, 2)));
        // User 2 (one waiting) against users with at most two: no room.
        assert_eq!(q.push(2, (2, 1)).unwrap_err().0, Full::All(4));
        let mut got: Vec<_> = std::iter::from_fn(|| {
            q.next(None, false).map(|(j, t)| {
                q.charge(t, Duration::from_micros(10));
                j
            })
        })
        .collect();
        got.sort_unstable();
        assert_eq!(got, [(1, 0), (1, 1), (2, 0), (3, 0)]);
        assert!(q.is_empty());
        q.push(4, (4, 0)).unwrap();
        q.close();
        assert_eq!(
            q.next(None, true).map(|(j, t)| {
                q.charge(t, Duration::ZERO);
                j
            }),
            Some((4, 0))
        );
        assert!(q.next(None, true).is_none());
        assert_eq!(q.push(1, (1, 9)).unwrap_err().0, Full::Closed);
    }

    #[test]
    fn a_sleeping_thread_is_woken_by_a_push() {
        let q = std::sync::Arc::new(FairQueue::new(10, 10));
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.next(None, true).map(|(j, _)| j));
        std::thread::sleep(Duration::from_millis(50));
        q.push(7, (7, 7)).unwrap();
        assert_eq!(t.join().unwrap(), Some((7, 7)));
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.next(None, true).map(|(j, _)| j));
        std::thread::sleep(Duration::from_millis(50));
        q.close();
        assert_eq!(t.join().unwrap(), None);
    }
}
