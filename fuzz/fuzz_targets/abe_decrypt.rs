//! Decryption with a fixed key of a valid ciphertext mutated by the input:
//! the result is an error or, only if nothing changed, the original
//! plaintext. Never a panic, never another plaintext (CCA).
#![no_main]

use std::sync::OnceLock;

use keyfence::abe::{self, AttributeKey};
use libfuzzer_sys::fuzz_target;
use rand_chacha::rand_core::SeedableRng;

const MSG: &[u8] = b"the customer's private key";

fn fixture() -> &'static (AttributeKey, Vec<u8>) {
    static F: OnceLock<(AttributeKey, Vec<u8>)> = OnceLock::new();
    F.get_or_init(|| {
        let mut rng = rand_chacha::ChaCha20Rng::from_seed([7; 32]);
        let (pk, msk) = abe::setup_with_rng(&mut rng).expect("setup");
        let key = abe::keygen_with_rng(&mut rng, &msk, &"region=EU,country=FR".parse().expect("attrs")).expect("keygen");
        let policy = keyfence::policy::parse("region: EU and (not country: DE or tier: 1)").expect("policy");
        let ct = abe::encrypt_policy_with_rng(&mut rng, &pk, &policy, MSG).expect("encrypt");
        (key, ct)
    })
}

fuzz_target!(|data: &[u8]| {
    let (key, valid) = fixture();
    let mut ct = valid.clone();
    // Three bytes per edit: a 16-bit position and a byte to XOR in; a
    // leftover byte truncates the ciphertext (or, if odd, extends it).
    let mut chunks = data.chunks_exact(3);
    for c in &mut chunks {
        let pos = usize::from(u16::from_le_bytes([c[0], c[1]])) % ct.len();
        ct[pos] ^= c[2];
    }
    match chunks.remainder() {
        [n] if n % 2 == 0 => ct.truncate(usize::from(*n) * ct.len() / 256),
        [n] => ct.push(*n),
        _ => {}
    }
    match abe::decrypt_with_threads(key, &ct, 1) {
        Ok(pt) => {
            assert_eq!(ct, *valid, "a modified ciphertext decrypted");
            assert_eq!(&pt[..], MSG);
        }
        Err(_) => assert_ne!(ct, *valid, "the valid ciphertext failed to decrypt"),
    }
});
