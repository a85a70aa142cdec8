//! Any bytes as a sealed policy key, `KFP2` or a `KFP3` copy that names
//! the revoked machines it excludes, as a machine reads it (parsed, then
//! its signature checked): never a panic. Read as it is, then signed by
//! the fuzzers' authority so the fuzzer gets past the signature: a copy
//! that reads writes back to exactly its bytes (one copy, one encoding:
//! a `KFP3` that excludes nobody, or names a machine twice or out of
//! order, must not read).
#![no_main]

use keyfence::wrap::fuzzing::{self as f, Object};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = f::read(Object::SealedKey, data);
    let signed = f::resign(Object::SealedKey, data);
    if let Ok(again) = f::read(Object::SealedKey, &signed) {
        assert_eq!(again, signed);
    }
});
