//! Splitting one operation's independent work (point checks, line
//! precomputation, multi-scalar multiplications, Miller loops, per-wire
//! and per-attribute components) across scoped threads.
//!
//! Scoped threads keep the work borrow-only and end before the operation
//! returns, so the library owns no long-lived threads. The calling thread
//! takes a share itself (a spawned thread per share would leave it idle
//! and cost one more start).
//!
//! Two shapes: [`par_map`] starts threads for one step of items that are
//! each worth a thread's start (keygen's attributes, encryption's wires);
//! a [`Crew`] keeps its helpers for an operation of several short steps
//! (a decryption), where starting threads per step cost more than the
//! split saved. A crew's threads take items heaviest first by an estimate
//! of their cost, not by count: a G2 point's subgroup check and lines
//! cost a hundred times a G1 point's decoding.

/// Work below this estimate (in microseconds of one core) stays on the
/// calling thread: handing a share to a helper and taking its result back
/// costs a few microseconds when the helper is awake, but the share then
/// runs on a core whose caches hold none of the operation's data.
pub(crate) const MIN_SPLIT_US: u32 = 150;

use crate::spawn::QuietSpawn;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// `items.iter().map(f)`, in up to `threads` scoped threads, order kept,
/// every item weighing the same: for items each worth a thread's start
/// (keygen's attributes, encryption's wires, about 1 ms each).
pub(crate) fn par_map<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    run_lanes(items, &lanes(&vec![1; items.len()], threads.min(items.len())), &f)
}

/// Deals item indices to `n` lanes, heaviest first to the least loaded
/// lane; each lane's indices in increasing order. Lanes left empty are
/// dropped.
fn lanes(costs: &[u32], n: usize) -> Vec<Vec<usize>> {
    if n <= 1 {
        return vec![(0..costs.len()).collect()];
    }
    let mut order: Vec<usize> = (0..costs.len()).collect();
    // Stable: equal weights keep their order, so uniform items are dealt
    // round-robin.
    order.sort_by(|&a, &b| costs[b].cmp(&costs[a]));
    let mut load = vec![0u64; n];
    let mut lanes = vec![Vec::new(); n];
    for i in order {
        let (lane, _) = load.iter().enumerate().min_by_key(|(k, l)| (**l, *k)).unwrap_or((0, &0));
        load[lane] += u64::from(costs[i]).max(1);
        lanes[lane].push(i);
    }
    lanes.retain(|l| !l.is_empty());
    for l in &mut lanes {
        l.sort_unstable();
    }
    lanes
}

fn run_lanes<T: Sync, R: Send>(items: &[T], lanes: &[Vec<usize>], f: &(impl Fn(&T) -> R + Sync)) -> Vec<R> {
    if lanes.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let run = |lane: &[usize]| lane.iter().map(|&i| (i, f(&items[i]))).collect::<Vec<(usize, R)>>();
    let mut done: Vec<(usize, R)> = std::thread::scope(|s| {
        let spawned: Vec<_> = lanes[1..]
            .iter()
            .map(|lane| {
                let run = &run;
                std::thread::Builder::new().spawn_scoped_quiet(s, move || run(lane)).map_err(|_| lane)
            })
            .collect();
        let mut done = run(&lanes[0]);
        for h in spawned {
            match h {
                // Workers only run total functions (decoding returns
                // errors as values), so a panic is a bug worth propagating.
                Ok(h) => done.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))),
                Err(lane) => done.extend(run(lane)),
            }
        }
        done
    });
    done.sort_unstable_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// How long an idle crew thread, or the calling thread waiting for a
/// helper's share, stays awake before it sleeps. A decryption's steps
/// are separated by the serial work between them and by the uneven end
/// of a step's shares (tens to a few hundred microseconds); a thread
/// asleep there costs a futex wake and, on a VM, its vCPU's wake from
/// idle: 85-230 us from a spawn or wake to the thread's first
/// instruction, measured on the 2-vCPU benchmark machine, against 30 us
/// with the vCPU awake. Past [`SPIN_HOT`] the waiting thread yields its
/// CPU between looks, so a busy machine's other work runs.
const SPIN: Duration = Duration::from_micros(500);
const SPIN_HOT: Duration = Duration::from_micros(20);

/// The most threads a crew works with, the calling one included: a
/// decryption has no more items per step than that keeps busy (its runs
/// of wires are cut for four per thread, and there are a dozen pairs),
/// and a caller asking for a thousand would otherwise start a thousand.
const MAX_CREW: usize = 16;

type CrewJob<'env> = Box<dyn FnOnce() + Send + 'env>;

/// Helper threads kept for the length of one operation, fed one share per
/// parallel step: an operation of several steps pays one thread start per
/// helper instead of one per step, and the helpers stay awake (spinning
/// briefly, see [`SPIN`]) between steps. Created by [`with_crew`]; the
/// helpers end with it, so the library still owns no long-lived thread
/// (a forking server that loads keys in its parent stays safe).
///
/// A share given to a helper may borrow only what outlives the crew
/// (`'env`): what the operation computes between steps, it stores where
/// the shares can see it (a `OnceLock` declared before [`with_crew`]).
pub(crate) struct Crew<'env> {
    helpers: Vec<mpsc::Sender<CrewJob<'env>>>,
}

/// Runs `body` with a crew of `threads - 1` helper threads (none for one
/// thread, or where the system refuses to start one: their shares then
/// run on the calling thread, slower, never an error). `body` owns the
/// crew: dropping it once the parallel steps are done lets the helpers
/// leave while the calling thread finishes alone, so that waiting for
/// them at the end costs nothing.
pub(crate) fn with_crew<'env, R>(threads: usize, body: impl FnOnce(Crew<'env>) -> R) -> R {
    let threads = threads.min(MAX_CREW);
    if threads <= 1 {
        return body(Crew { helpers: Vec::new() });
    }
    std::thread::scope(|s| {
        let mut helpers = Vec::new();
        for _ in 1..threads {
            let (tx, rx) = mpsc::channel::<CrewJob<'env>>();
            let started = std::thread::Builder::new().spawn_scoped_quiet(s, move || {
                while let Some(job) = receive(&rx) {
                    job();
                }
            });
            if started.is_ok() {
                helpers.push(tx);
            }
        }
        // Dropping the crew closes the channels: the helpers leave their
        // loops and the scope joins them.
        body(Crew { helpers })
    })
}

/// The next message on `rx`, awake for up to [`SPIN`] before sleeping;
/// `None` once the sender is gone.
fn receive<T>(rx: &mpsc::Receiver<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(v) => return Some(v),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) => match start.elapsed() {
                t if t < SPIN_HOT => std::hint::spin_loop(),
                t if t < SPIN => std::thread::yield_now(),
                _ => return rx.recv().ok(),
            },
        }
    }
}

impl<'env> Crew<'env> {
    /// The threads this crew works with, the calling one included.
    pub(crate) fn threads(&self) -> usize {
        1 + self.helpers.len()
    }

    /// Hands `job` to helper `k` (modulo their number; the caller makes
    /// sure there is one).
    fn give<B: Send + 'env>(&self, k: usize, job: impl FnOnce() -> B + Send + 'env) -> Pending<B> {
        let helper = &self.helpers[k % self.helpers.len()];
        let (tx, rx) = mpsc::sync_channel(1);
        let job: CrewJob<'env> = Box::new(move || {
            // The receiver is gone only if the calling thread unwound.
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)));
        });
        // A helper runs every job it receives until its channel closes,
        // so a send fails only if it is gone; its share then runs here
        // (the result channel has room for it).
        if let Err(mpsc::SendError(job)) = helper.send(job) {
            job();
        }
        Pending(rx)
    }

    /// `items.into_iter().map(f)` on the crew, order kept: every thread
    /// takes the next item, heaviest first by `cost` (an estimate in
    /// microseconds of one core), until none is left, so the shares even
    /// out whatever the estimates' errors and however late a helper
    /// wakes. Work estimated below [`MIN_SPLIT_US`] stays on the calling
    /// thread. A panic in `f` is resumed on the calling thread.
    pub(crate) fn map<T, R, F>(&self, items: Vec<T>, cost: impl Fn(&T) -> u32, f: F) -> Vec<R>
    where
        T: Send + Sync + 'env,
        R: Send + 'env,
        F: Fn(&T) -> R + Send + Sync + 'env,
    {
        let costs: Vec<u32> = items.iter().map(&cost).collect();
        let total: u64 = costs.iter().map(|&c| u64::from(c)).sum();
        if self.helpers.is_empty() || items.len() < 2 || total < u64::from(MIN_SPLIT_US) {
            return items.iter().map(f).collect();
        }
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_by(|&a, &b| costs[b].cmp(&costs[a]));
        let helpers = self.helpers.len().min(items.len() - 1);
        let shared = Arc::new(Share { items, order, next: AtomicUsize::new(0), f });
        let pending: Vec<_> = (0..helpers)
            .map(|k| {
                let shared = Arc::clone(&shared);
                self.give(k, move || shared.take())
            })
            .collect();
        let mut done = shared.take();
        for p in pending {
            done.extend(p.wait());
        }
        done.sort_unstable_by_key(|(i, _)| *i);
        done.into_iter().map(|(_, r)| r).collect()
    }
}

/// What the threads of one [`Crew::map`] share: the items, the order
/// they are taken in, and the index of the next one to take.
struct Share<T, F> {
    items: Vec<T>,
    order: Vec<usize>,
    next: AtomicUsize,
    f: F,
}

impl<T, F> Share<T, F> {
    /// Takes items until none is left: their indices and results.
    fn take<R>(&self) -> Vec<(usize, R)>
    where
        F: Fn(&T) -> R,
    {
        let mut out = Vec::new();
        while let Some(&i) = self.order.get(self.next.fetch_add(1, Ordering::Relaxed)) {
            if let Some(item) = self.items.get(i) {
                out.push((i, (self.f)(item)));
            }
        }
        out
    }
}

/// A share given to a helper ([`Crew::map`]).
struct Pending<B>(mpsc::Receiver<std::thread::Result<B>>);

impl<B> Pending<B> {
    /// The share's result, waiting for it (spinning first, see [`SPIN`]);
    /// a panic in the share is resumed here.
    fn wait(self) -> B {
        match receive(&self.0) {
            Some(Ok(b)) => b,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            // Every job sends before it is dropped (`give`), and a helper
            // drops none unrun: its loop ends only when its channel closes.
            None => panic!("a crew helper dropped a share unrun"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Holds each of the first `n` callers until all `n` have come (or 10
    /// seconds have passed, so a broken crew fails an assertion instead
    /// of hanging): items that only finish once `n` threads run them.
    fn meet(met: &AtomicU32, n: u32) {
        met.fetch_add(1, Ordering::SeqCst);
        let until = Instant::now() + Duration::from_secs(10);
        while met.load(Ordering::SeqCst) < n && Instant::now() < until {
            std::thread::yield_now();
        }
    }

    #[test]
    fn heavy_items_are_spread_and_order_is_kept() {
        // Two heavy items first, as a contiguous split would put them
        // both in the first lane.
        let costs = [500, 500, 1, 1, 1, 1];
        let l = lanes(&costs, 2);
        assert_eq!(l, vec![vec![0, 2, 4], vec![1, 3, 5]]);
        let items: Vec<u32> = (0..100).collect();
        for threads in [1, 2, 3] {
            let out = with_crew(threads, |c| c.map(items.clone(), |&i| if i % 7 == 0 { 900 } else { 10 }, |&i| i * 2));
            assert_eq!(out, items.iter().map(|i| i * 2).collect::<Vec<_>>(), "{threads} threads");
        }
    }

    #[test]
    fn light_work_stays_on_the_calling_thread_and_heavy_work_is_shared() {
        let me = std::thread::current().id();
        let met = AtomicU32::new(0);
        with_crew(2, |c| {
            let ids = c.map(vec![10u32; 4], |&c| c, |_| std::thread::current().id());
            assert!(ids.iter().all(|&id| id == me));
            // Two items that each wait for the other: both threads must
            // take one, and the same crew serves a second step.
            for step in 1..=2 {
                let met = &met;
                let ids = c.map(
                    vec![0u32; 2],
                    |_| MIN_SPLIT_US,
                    move |_| {
                        meet(met, 2 * step);
                        std::thread::current().id()
                    },
                );
                assert!(ids.contains(&me) && ids.iter().any(|&id| id != me), "step {step}: {ids:?}");
            }
        });
    }

    #[test]
    fn a_panic_in_a_helpers_share_reaches_the_caller_and_the_crew_ends() {
        let me = std::thread::current().id();
        let met = AtomicU32::new(0);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_crew(2, |c| {
                c.map(
                    vec![0u32; 2],
                    |_| MIN_SPLIT_US,
                    |_| {
                        meet(&met, 2);
                        assert_eq!(std::thread::current().id(), me, "a helper's share");
                    },
                )
            })
        }));
        let panic = r.expect_err("the helper's panic");
        let text = panic.downcast_ref::<String>().map(String::as_str).unwrap_or_default();
        assert!(text.contains("a helper's share"), "{text}");
    }

    #[test]
    fn more_threads_than_items_is_fine() {
        assert_eq!(par_map(&[1, 2, 3], 64, |x| x + 1), vec![2, 3, 4]);
        assert_eq!(par_map(&[] as &[u8], 4, |x| *x), Vec::<u8>::new());
        assert_eq!(with_crew(64, |c| c.map(vec![1, 2, 3], |_| MIN_SPLIT_US, |x| x + 1)), vec![2, 3, 4]);
        assert_eq!(with_crew(1000, |c| c.threads()), MAX_CREW);
        assert_eq!(with_crew(4, |c| c.map(Vec::<u8>::new(), |_| MIN_SPLIT_US, |x| *x)), Vec::<u8>::new());
    }
}
