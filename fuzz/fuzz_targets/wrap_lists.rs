//! Any bytes as the store's generation list (`KFG2`) and revocation list
//! (`KFR2`), as a machine reads them: never a panic. The bytes are read as
//! they are (the seeds' authority is not one the machine trusts), then as
//! a stream of lists the store served in turn (cut before each magic),
//! each signed by the fuzzers' authority so the fuzzer gets past the
//! signature: a list that reads writes back to exactly its bytes, a list
//! that does not read is never accepted, and a list accepted once is
//! accepted again (the same list is not a replay).
#![no_main]

use keyfence::wrap::fuzzing::{self as f, Object, Seen};
use libfuzzer_sys::fuzz_target;

/// `data` cut before every occurrence of `magic` after its start.
fn lists<'a>(data: &'a [u8], magic: &[u8]) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = (1..data.len()).filter(|&i| data[i..].starts_with(magic)).collect();
    cuts.insert(0, 0);
    cuts.push(data.len());
    cuts.windows(2).map(|w| &data[w[0]..w[1]]).collect()
}

fuzz_target!(|data: &[u8]| {
    for (object, magic) in [(Object::GenerationList, b"KFG2"), (Object::RevocationList, b"KFR2")] {
        let accept = |seen: &Seen, bytes: Option<&[u8]>| match object {
            Object::GenerationList => seen.accept_generations(bytes),
            _ => seen.accept_revocations(bytes),
        };
        let _ = f::read(object, data);
        let seen = Seen::default();
        for list in lists(data, magic) {
            let signed = f::resign(object, list);
            let read = f::read(object, &signed);
            if let Ok(again) = &read {
                assert_eq!(again, &signed, "{object:?}: one list, two encodings");
            }
            let accepted = accept(&seen, Some(&signed));
            if read.is_err() {
                assert!(accepted.is_err(), "{object:?}: accepted a list that does not read");
            }
            if accepted.is_ok() {
                accept(&seen, Some(&signed)).expect("the same list again is no replay");
            }
        }
        // The store withholding the list after all that.
        let _ = accept(&seen, None);
    }
});
