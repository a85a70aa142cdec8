//! Any bytes as each key type: decoding never panics, and whatever decodes
//! re-encodes to exactly the same bytes (one key, one encoding).
#![no_main]

use keyfence::abe::{AttributeKey, MasterSecretKey, PublicKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(pk) = PublicKey::from_bytes(data) {
        assert_eq!(pk.to_bytes(), data);
    }
    if let Ok(msk) = MasterSecretKey::from_bytes(data) {
        assert_eq!(&msk.to_bytes()[..], data);
    }
    if let Ok(key) = AttributeKey::from_bytes(data) {
        assert_eq!(&key.to_bytes()[..], data);
    }
});
