//! Any bytes as an envelope or a machine key: parsing never panics, an
//! accepted envelope keeps its bytes and carries its policy parsed, in
//! canonical form, with its id, and an accepted machine key re-encodes to
//! exactly the input.
#![no_main]

use keyfence::wrap::{Envelope, MachineKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(env) = Envelope::parse(data) {
        assert_eq!(env.to_bytes(), data);
        assert_eq!(env.policy_id, keyfence::wrap::policy_id(&env.policy));
        assert_eq!(&env.policy_id, env.policy.id());
        assert_eq!(env.policy.circuit().to_string(), env.policy.as_str());
    }
    if let Ok(key) = MachineKey::from_bytes(data) {
        assert_eq!(&key.to_bytes()[..], data);
    }
});
