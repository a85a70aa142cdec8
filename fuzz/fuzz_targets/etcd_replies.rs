//! Any bytes as an answer of etcd's JSON gateway and as lines of its
//! watch stream, through what the etcd store makes of them
//! (`wrap::EtcdStore`, behind the `etcd` feature): errors, never a panic,
//! and what the store relies on holds: an error status is never an
//! answer, a read answers one value per key read, a page that says more
//! follow is not empty, and a watch never delivers a change at or before
//! the revision it has seen (so none twice).
#![no_main]

use keyfence::wrap::fuzzing::etcd::{self as e, WatchLine};
use keyfence::wrap::WatchEvent;
use libfuzzer_sys::fuzz_target;

/// The store's prefix, as the seeds' answers carry it.
const STORE: &str = "kf/";

fuzz_target!(|data: &[u8]| {
    for status in [500, 503] {
        assert!(e::answer(status, data).is_err(), "an HTTP error read as an answer");
    }
    if let Ok(a) = e::answer(200, data) {
        let _ = (a.revision(), a.succeeded());
        if let Ok(Some((_, stamp))) = a.range("envelopes/aa") {
            assert!(stamp.as_revision().is_some());
        }
        if let Ok((names, more)) = a.page(STORE, "envelopes/") {
            assert!(!more || !names.is_empty(), "a page that says more follow is empty");
        }
        let keys: Vec<String> = (0..3).map(|i| format!("k{i}")).collect();
        for n in 0..=keys.len() {
            if let Ok(values) = a.values(&keys[..n]) {
                assert_eq!(values.len(), n);
            }
        }
    }
    // The watch thread's loop over a stream, from revision 1.
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut last = 1;
    for line in text.split_inclusive('\n') {
        match e::watch_line(line, STORE, last) {
            WatchLine::End | WatchLine::Compacted => break,
            WatchLine::Events(events) => {
                for ev in &events {
                    assert!(ev.revision() > last, "{ev:?} is not after revision {last}");
                    assert!(!matches!(ev, WatchEvent::Compacted { .. }));
                }
                last = events.iter().map(WatchEvent::revision).max().unwrap_or(last).max(last);
            }
        }
    }
});
