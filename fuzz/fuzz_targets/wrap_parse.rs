//! Any bytes as an envelope or a machine key: parsing never panics, an
//! accepted envelope keeps its bytes, and an accepted machine key
//! re-encodes to exactly the input.
#![no_main]

use keyfence::wrap::{Envelope, MachineKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(env) = Envelope::parse(data) {
        assert_eq!(env.to_bytes(), data);
        assert_eq!(env.policy_id, keyfence::wrap::policy_id(&env.policy));
    }
    if let Ok(key) = MachineKey::from_bytes(data) {
        assert_eq!(&key.to_bytes()[..], data);
    }
});
