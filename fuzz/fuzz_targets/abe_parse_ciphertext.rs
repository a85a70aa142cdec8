//! Any bytes as a ciphertext: extracting the policy and answering
//! could_decrypt never panic and agree with each other.
#![no_main]

use keyfence::abe;
use keyfence::policy::Attributes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let policy = abe::policy_of(data);
    let attrs: Attributes = "region=EU,country=FR,a=x".parse().expect("attributes");
    let could = abe::could_decrypt(&attrs, data);
    match (policy, could) {
        (Ok(p), Ok(c)) => assert_eq!(p.eval(&attrs), c),
        (Err(_), Err(_)) => {}
        (p, c) => panic!("policy_of and could_decrypt disagree: {:?} vs {:?}", p.map(|p| p.to_string()), c),
    }
});
