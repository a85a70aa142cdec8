//! Splitting independent work (point validation, Miller loops) across
//! threads for a single decryption.
//!
//! Decryption validates every ciphertext point it uses (a subgroup check
//! is ~50 µs) and runs a multi-Miller loop; both split cleanly. Scoped
//! threads keep the work borrow-only and end before `decrypt` returns, so
//! the library owns no long-lived threads.

/// `items.iter().map(f)`, in up to `threads` scoped threads, order kept.
pub(crate) fn par_map<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if threads <= 1 || items.len() < 2 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads.min(items.len()));
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = items.chunks(chunk).map(|c| s.spawn(move || c.iter().map(f).collect::<Vec<R>>())).collect();
        // Workers only run total functions (decoding returns errors as
        // values), so a panic here is a bug worth propagating.
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}
