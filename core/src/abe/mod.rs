//! Ciphertext-policy attribute-based encryption: TKN20 with negation and
//! repeated attributes, made CCA-secure by the Boneh-Katz transform, over
//! BLS12-381, byte-compatible with Cloudflare CIRCL's `abe/cpabe/tkn20`
//! v1.6.5 (keys and `v1.3.8` ciphertexts, both ways).
//!
//! ```
//! use keyfence::abe;
//! use keyfence::policy::Attributes;
//!
//! let (pk, msk) = abe::setup()?;
//! let key = abe::keygen(&msk, &"country=FR,region=EU".parse::<Attributes>()?)?;
//! let ct = abe::encrypt(&pk, "country: US or region: EU", b"secret")?;
//! assert_eq!(&abe::decrypt(&key, &ct)?[..], b"secret");
//!
//! let us_key = abe::keygen(&msk, &"country=DE,region=NA".parse::<Attributes>()?)?;
//! assert!(matches!(abe::decrypt(&us_key, &ct), Err(abe::AbeError::NotSatisfied)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See `docs/abe.md` for the scheme, the format and its security
//! properties.

// Direction, bottom to top (each module uses only those before it): error,
// blake2x, group, lines, matrix, oracle, policy, fixed_base, key_cache
// (precomputed tables, built from points), keys (the key types, which hold
// those tables), parallel, tkn, bk; this file's operations on top of them,
// and floor (a benchmark's measure of them, exported as `crate::bench`)
// above all.

mod bk;
mod blake2x;
mod error;
mod fixed_base;
#[cfg(any(test, feature = "bench"))]
pub(crate) mod floor;
mod group;
mod key_cache;
mod keys;
mod lines;
mod matrix;
mod oracle;
mod parallel;
mod policy;
mod tkn;

use std::collections::BTreeMap;

use keyfence_policy::{Attributes, Policy};
use rand_core::{CryptoRng, OsRng, RngCore};
use zeroize::Zeroizing;

pub use bk::VERSION;
pub use error::{AbeError, Result};
pub use keys::{AttributeKey, MasterSecretKey, PublicKey};

use policy::{AbePolicy, BK_LABEL};

/// Generates an authority's public key and master secret key from the
/// operating system's random source.
///
/// # Errors
/// [`AbeError::Rng`] only if the random source is broken.
pub fn setup() -> Result<(PublicKey, MasterSecretKey)> {
    tkn::setup(&mut OsRng)
}

/// [`setup`] with an explicit random source (for known-answer tests: the
/// same bytes CIRCL reads give the same keys). Behind the `testing`
/// feature: production keys come from the operating system.
///
/// # Errors
/// As [`setup`].
#[cfg(any(test, feature = "testing"))]
pub fn setup_with_rng<R: RngCore + CryptoRng + ?Sized>(rng: &mut R) -> Result<(PublicKey, MasterSecretKey)> {
    tkn::setup(rng)
}

/// Issues an attribute key for `attrs`.
///
/// ```
/// # let (_, msk) = keyfence::abe::setup()?;
/// // The key format's attribute field is 16-bit: about 1,800 one-letter
/// // labels fit, 2,000 do not, and keygen says so instead of writing a
/// // key that could not be read back.
/// let many = keyfence::policy::Attributes::from_pairs((0..2000).map(|i| (format!("{i}"), "x")));
/// let err = keyfence::abe::keygen(&msk, &many).unwrap_err();
/// assert_eq!(err.code(), keyfence::ErrorCode::LimitExceeded);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`AbeError::Attributes`] for an empty label or value or one not in
/// Unicode NFC (no policy text could name it),
/// [`AbeError::ReservedLabel`] if an attribute uses the Boneh-Katz label,
/// [`AbeError::AttributeTooLong`] for a label over 65,535 bytes,
/// [`AbeError::TooLarge`] if the attributes together would not fit the key
/// format's 16-bit attribute field.
///
/// Runs on the calling thread; [`keygen_with_threads`] spreads the
/// attributes over more cores.
pub fn keygen(msk: &MasterSecretKey, attrs: &Attributes) -> Result<AttributeKey> {
    keygen_rng(&mut OsRng, msk, attrs, 1)
}

/// [`keygen`] on up to `threads` scoped threads (0 and 1 both mean the
/// caller's; none outlives the call).
///
/// A key's cost is one component per attribute (about 1.5 ms each), each
/// computed from the master key and its label alone, so the attributes
/// are dealt to the threads and the key comes out the same as from
/// [`keygen`]; a 50-attribute key takes about half as long on two idle
/// cores (`docs/benchmarks.md`). Worth it only with idle cores, which is
/// why it is not the default.
///
/// ```
/// # let (pk, msk) = keyfence::abe::setup()?;
/// let attrs = keyfence::policy::Attributes::from_pairs((0..8).map(|i| (format!("a{i}"), "v")));
/// let key = keyfence::abe::keygen_with_threads(&msk, &attrs, 2)?;
/// let ct = keyfence::abe::encrypt(&pk, "a0: v and a7: v", b"x")?;
/// assert_eq!(&keyfence::abe::decrypt(&key, &ct)?[..], b"x");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`keygen`].
pub fn keygen_with_threads(msk: &MasterSecretKey, attrs: &Attributes, threads: usize) -> Result<AttributeKey> {
    keygen_rng(&mut OsRng, msk, attrs, threads)
}

/// [`keygen`] with an explicit random source (known-answer tests; behind
/// the `testing` feature).
///
/// # Errors
/// As [`keygen`].
#[cfg(any(test, feature = "testing"))]
pub fn keygen_with_rng<R: RngCore + CryptoRng + ?Sized>(rng: &mut R, msk: &MasterSecretKey, attrs: &Attributes) -> Result<AttributeKey> {
    keygen_rng(rng, msk, attrs, 1)
}

fn keygen_rng<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R, msk: &MasterSecretKey, attrs: &Attributes, threads: usize,
) -> Result<AttributeKey> {
    // Sets built with `from_pairs` reach here unchecked; this is the one
    // door every key passes, whichever binding built the set.
    attrs.validate()?;
    let block = AttributeKey::attribute_block_len(attrs.iter().map(|(l, _)| l).chain([BK_LABEL]));
    if block > usize::from(u16::MAX) {
        return Err(AbeError::TooLarge {
            object: "attribute key",
            reason: format!(
                "{} attributes encode to {block} bytes, and the key format's attribute field holds at most {}",
                attrs.len(),
                u16::MAX
            ),
        });
    }
    let mut hashed = BTreeMap::new();
    for (label, value) in attrs.iter() {
        if label == BK_LABEL {
            return Err(AbeError::ReservedLabel(label.into()));
        }
        if label.len() > usize::from(u16::MAX) {
            return Err(AbeError::AttributeTooLong(label.into()));
        }
        hashed.insert(label.to_owned(), oracle::hash_value(value));
    }
    tkn::keygen(rng, msk, &hashed, threads.max(1))
}

/// Encrypts `msg` so that only keys whose attributes satisfy `policy` can
/// decrypt it.
///
/// # Errors
/// [`AbeError::Policy`] if the policy does not parse (with the position),
/// including policies too large for the format; [`AbeError::ReservedLabel`]
/// for the Boneh-Katz label.
pub fn encrypt(pk: &PublicKey, policy: &str, msg: &[u8]) -> Result<Vec<u8>> {
    encrypt_policy(pk, &keyfence_policy::parse(policy)?, msg)
}

/// Encrypts under an already parsed policy, so that a caller who encrypts
/// many messages under one policy (the wrapping authority) parses it once.
///
/// ```
/// # let (pk, _) = keyfence::abe::setup()?;
/// let policy = keyfence::policy::parse("region: EU")?;
/// let ct = keyfence::abe::encrypt_policy(&pk, &policy, b"one")?;
/// assert_eq!(keyfence::abe::policy_of(&ct)?, policy);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`AbeError::ReservedLabel`] for the Boneh-Katz label;
/// [`AbeError::TooLarge`] for a message too long for the format's 32-bit
/// fields (about 4 GiB).
///
/// Runs on the calling thread; [`encrypt_policy_with_threads`] spreads the
/// policy's terms over more cores.
pub fn encrypt_policy(pk: &PublicKey, policy: &Policy, msg: &[u8]) -> Result<Vec<u8>> {
    encrypt_rng(&mut OsRng, pk, policy, msg, 1)
}

/// [`encrypt_policy`] on up to `threads` scoped threads (0 and 1 both
/// mean the caller's; none outlives the call).
///
/// A ciphertext's cost is one component per term of the policy (about
/// 1 ms each); every random value is drawn first, then the terms are
/// dealt to the threads, so the ciphertext is what [`encrypt_policy`]
/// would have made from the same random bytes. A 50-term policy takes
/// about half as long on two idle cores (`docs/benchmarks.md`). Worth it
/// only with idle cores, which is why it is not the default.
///
/// ```
/// # let (pk, msk) = keyfence::abe::setup()?;
/// # let key = keyfence::abe::keygen(&msk, &"region=EU".parse()?)?;
/// let policy = keyfence::policy::parse("region: EU or region: UK")?;
/// let ct = keyfence::abe::encrypt_policy_with_threads(&pk, &policy, b"x", 2)?;
/// assert_eq!(&keyfence::abe::decrypt(&key, &ct)?[..], b"x");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`encrypt_policy`].
pub fn encrypt_policy_with_threads(pk: &PublicKey, policy: &Policy, msg: &[u8], threads: usize) -> Result<Vec<u8>> {
    encrypt_rng(&mut OsRng, pk, policy, msg, threads)
}

/// [`encrypt_policy`] with an explicit random source (known-answer tests;
/// behind the `testing` feature).
///
/// # Errors
/// As [`encrypt_policy`].
#[cfg(any(test, feature = "testing"))]
pub fn encrypt_policy_with_rng<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R, pk: &PublicKey, policy: &Policy, msg: &[u8],
) -> Result<Vec<u8>> {
    encrypt_rng(rng, pk, policy, msg, 1)
}

fn encrypt_rng<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R, pk: &PublicKey, policy: &Policy, msg: &[u8], threads: usize,
) -> Result<Vec<u8>> {
    let p = AbePolicy::from_policy(policy)?;
    bk::encrypt(rng, pk, &p, msg, threads.max(1))
}

/// Decrypts `ciphertext` with `key`.
///
/// The plaintext comes back in a buffer that is wiped when dropped.
///
/// # Errors
/// [`AbeError::Malformed`] naming the field for bytes that are not a
/// ciphertext (truncated, extended, invalid point); [`AbeError::NotSatisfied`]
/// if the key's attributes do not satisfy the policy;
/// [`AbeError::IntegrityCheckFailed`] if the ciphertext was modified or
/// made for another authority. Never a wrong plaintext.
///
/// Runs on the calling thread; see [`decrypt_with_threads`] to spread the
/// work over more cores. The ciphertext's G1 points are checked to lie on
/// the curve; their subgroup checks run only if the integrity check fails
/// (to name the field at fault), because a point's component outside the
/// prime-order subgroup cannot change what it decrypts to (`docs/abe.md`,
/// "Subgroup checks"). [`decrypt_strict`] checks every point first.
pub fn decrypt(key: &AttributeKey, ciphertext: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
    decrypt_with(key, ciphertext, &DecryptOptions::new())
}

/// [`decrypt`] on up to `threads` scoped threads (at most 16; none
/// outlives the call). The threads start once and serve every step of the
/// decryption.
///
/// Decryption validates the ciphertext's G2 points (about 40 us each) and
/// runs a multi-Miller loop; both split across threads. On a machine with
/// idle cores this lowers the latency of large policies; on a busy or
/// shared machine it buys nothing, which is why it is not the default.
///
/// # Errors
/// As [`decrypt`].
pub fn decrypt_with_threads(key: &AttributeKey, ciphertext: &[u8], threads: usize) -> Result<Zeroizing<Vec<u8>>> {
    decrypt_with(key, ciphertext, &DecryptOptions::new().threads(threads))
}

/// [`decrypt`] that first checks every group element of the ciphertext,
/// used by this key or not, for membership of its prime-order subgroup,
/// as CIRCL does: it rejects exactly the ciphertexts CIRCL rejects, at the
/// cost of a subgroup check per point (about 30 us per G1 point, 40 us
/// per G2 point; 3x slower on a 50-attribute policy).
///
/// ```
/// # let (pk, msk) = keyfence::abe::setup()?;
/// # let key = keyfence::abe::keygen(&msk, &"region=EU".parse()?)?;
/// let ct = keyfence::abe::encrypt(&pk, "region: EU", b"x")?;
/// assert_eq!(&keyfence::abe::decrypt_strict(&key, &ct)?[..], b"x");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// As [`decrypt`]; a point outside its subgroup is always reported as
/// [`AbeError::Malformed`] naming its field, even when a non-strict
/// decryption would have succeeded.
pub fn decrypt_strict(key: &AttributeKey, ciphertext: &[u8]) -> Result<Zeroizing<Vec<u8>>> {
    decrypt_with(key, ciphertext, &DecryptOptions::new().strict(true))
}

/// How [`decrypt_with`] validates a ciphertext and how many threads it
/// uses. The default is [`decrypt`]'s behaviour: one thread, G1 subgroup
/// checks deferred.
///
/// ```
/// use keyfence::abe::DecryptOptions;
/// let opts = DecryptOptions::new().threads(2).strict(true);
/// assert!(opts.is_strict());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecryptOptions {
    threads: usize,
    strict: bool,
}

impl DecryptOptions {
    /// One thread, not strict.
    pub fn new() -> Self {
        Self::default()
    }

    /// Up to `threads` scoped threads (0 and 1 both mean the caller's).
    #[must_use]
    pub fn threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// Whether to subgroup-check every point of the ciphertext before
    /// decrypting ([`decrypt_strict`]).
    #[must_use]
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// Whether these options are strict.
    pub fn is_strict(&self) -> bool {
        self.strict
    }
}

/// [`decrypt`] with explicit [`DecryptOptions`].
///
/// # Errors
/// As [`decrypt`] (and [`decrypt_strict`] when strict).
pub fn decrypt_with(key: &AttributeKey, ciphertext: &[u8], opts: &DecryptOptions) -> Result<Zeroizing<Vec<u8>>> {
    bk::decrypt(key, ciphertext, tkn::Decap { threads: opts.threads.max(1), strict: opts.strict })
}

/// Whether a key with `attrs` could decrypt `ciphertext`, answered from the
/// policy alone, without cryptography (so a caller can forward the
/// ciphertext to a machine that can).
///
/// # Errors
/// [`AbeError::Malformed`] if the bytes are not a ciphertext.
pub fn could_decrypt(attrs: &Attributes, ciphertext: &[u8]) -> Result<bool> {
    let p = bk::parse(ciphertext)?;
    let pol = p.header.policy.to_policy()?;
    Ok(pol.eval(attrs))
}

/// The policy a ciphertext was encrypted under.
///
/// ```
/// # let (pk, _) = keyfence::abe::setup()?;
/// let ct = keyfence::abe::encrypt(&pk, "region: EU and not country: FR", b"x")?;
/// let p = keyfence::abe::policy_of(&ct)?;
/// assert_eq!(p.to_string(), "region: EU and not country: FR");
/// assert_eq!(p.attribute_pairs(), vec![("region", "EU"), ("country", "FR")]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`AbeError::Malformed`] if the bytes are not a ciphertext.
pub fn policy_of(ciphertext: &[u8]) -> Result<Policy> {
    bk::parse(ciphertext)?.header.policy.to_policy()
}

/// CIRCL's CP-ABE benchmark shapes (`keyfence::bench::abe_cases` documents
/// them); here, outside the `bench` feature, so that the unit tests run
/// the same shapes in every build.
#[cfg(any(test, feature = "bench"))]
pub(crate) fn circl_benchmark_shapes() -> Vec<(&'static str, String, keyfence_policy::Attributes)> {
    use keyfence_policy::Attributes;
    let clauses = |neg: bool, op: &str| {
        (0..50).map(|i| if neg && i % 2 == 1 { format!("not a{i}: x{i}") } else { format!("a{i}: v{i}") }).collect::<Vec<_>>().join(op)
    };
    let all: Attributes = (0..50).map(|i| (format!("a{i}"), format!("v{i}"))).collect();
    vec![
        ("small", "country: US or region: EU".into(), Attributes::from_pairs([("country", "FR"), ("region", "EU")])),
        ("and50", clauses(false, " and "), all.clone()),
        ("or50", clauses(false, " or "), all.clone()),
        ("and50neg25", clauses(true, " and "), all),
    ]
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod thread_tests;
#[cfg(test)]
mod torsion_tests;
