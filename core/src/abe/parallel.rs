//! Splitting one operation's independent work (point checks, line
//! precomputation, multi-scalar multiplications, Miller loops, per-wire
//! and per-attribute components) across scoped threads.
//!
//! Scoped threads keep the work borrow-only and end before the operation
//! returns, so the library owns no long-lived threads. The calling thread
//! takes a share itself (a spawned thread per share would leave it idle
//! and cost one more start), and shares are balanced by an estimate of
//! their cost, not their count: a G2 point's subgroup check and lines
//! cost a hundred times a G1 point's decoding, and one lane holding all
//! the expensive items waits while the other sleeps.

/// Work below this estimate (in microseconds of one core) stays on the
/// calling thread: starting and joining a scoped thread costs about 30 us
/// on the 2-core machine the benchmarks run on, and the share it takes
/// must be worth more than that.
pub(crate) const MIN_SPLIT_US: u32 = 150;

/// `items.iter().map(f)`, in up to `threads` scoped threads, order kept,
/// every item weighing the same: for items each worth a thread's start
/// (keygen's attributes, encryption's wires, about 1 ms each).
pub(crate) fn par_map<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    run_lanes(items, &lanes(&vec![1; items.len()], threads.min(items.len())), &f)
}

/// `items.iter().map(f)`, in up to `threads` scoped threads, order kept.
/// `cost(item)` estimates an item's time in microseconds: items are
/// dealt heaviest first to the least loaded lane (longest processing
/// time first, within 4/3 of the best split), and the whole runs on the
/// calling thread alone if it is estimated below [`MIN_SPLIT_US`].
///
/// A thread the system refuses to start leaves its share to the calling
/// thread: slower, never an error.
pub(crate) fn par_map_weighted<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    cost: impl Fn(&T) -> u32,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let costs: Vec<u32> = items.iter().map(&cost).collect();
    let total: u64 = costs.iter().map(|&c| u64::from(c)).sum();
    if total < u64::from(MIN_SPLIT_US) {
        return items.iter().map(f).collect();
    }
    run_lanes(items, &lanes(&costs, threads.min(items.len())), &f)
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
                std::thread::Builder::new().spawn_scoped(s, move || run(lane)).map_err(|_| lane)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_items_are_spread_and_order_is_kept() {
        // Two heavy items first, as a contiguous split would put them
        // both in the first lane.
        let costs = [500, 500, 1, 1, 1, 1];
        let l = lanes(&costs, 2);
        assert_eq!(l, vec![vec![0, 2, 4], vec![1, 3, 5]]);
        let items: Vec<u32> = (0..100).collect();
        let out = par_map_weighted(&items, 3, |&i| if i % 7 == 0 { 900 } else { 10 }, |&i| i * 2);
        assert_eq!(out, items.iter().map(|i| i * 2).collect::<Vec<_>>());
    }

    #[test]
    fn light_work_stays_on_the_calling_thread() {
        let me = std::thread::current().id();
        let items = [10u32; 4];
        let ids = par_map_weighted(&items, 2, |&c| c, |_| std::thread::current().id());
        assert!(ids.iter().all(|&id| id == me));
        let ids = par_map_weighted(&items, 2, |_| MIN_SPLIT_US, |_| std::thread::current().id());
        assert!(ids.iter().any(|&id| id != me) && ids.iter().any(|&id| id == me));
    }

    #[test]
    fn more_threads_than_items_is_fine() {
        assert_eq!(par_map(&[1, 2, 3], 64, |x| x + 1), vec![2, 3, 4]);
        assert_eq!(par_map(&[] as &[u8], 4, |x| *x), Vec::<u8>::new());
    }
}
