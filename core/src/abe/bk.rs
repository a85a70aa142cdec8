//! The Boneh-Katz transform (Boneh, Katz, CT-RSA 2005; applied to ABE as in
//! Yamada et al., PKC 2011) that makes the CPA-secure TKN20 KEM a CCA-secure
//! encryption scheme, as CIRCL's tkn20 does it.
//!
//! Encrypt: draw a 72-byte seed; `id = BLAKE2b-256("id computation hash" ||
//! seed)`, `mac_key = BLAKE2b-256("key computation hash" || seed)`. Encrypt
//! under `policy AND internal-bk-attribute: id` (every key holds that
//! attribute as a wildcard). Encrypt `seed || message` with the BLAKE2Xb
//! keystream keyed by `BLAKE2b-256(encoded Gt element)`. MAC the header and
//! the encrypted envelope with `BLAKE2b-256` keyed by `mac_key`.
//!
//! Decrypt: recover the Gt element, decrypt the envelope, re-derive `id`
//! and `mac_key` from the seed inside, and accept only if both the id and
//! the MAC match (compared in constant time, without saying which failed).
//!
//! Layout (`v1.3.8`): `"v1.3.8" | u16 len | id | u32 len | macData | u16 len
//! | tag`, with `macData = u32 len | header | u32 len | envelope`. Without
//! the version prefix, the older layout uses u16 lengths throughout.

use rand_core::{CryptoRng, RngCore};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::blake2x::{blake2b_256, Xof};
use super::error::{codec, malformed, too_large, AbeError, Result};
use super::group::{gt_to_bytes, scalar_reduce_be};
use super::keys::{AttributeKey, PublicKey};
use super::policy::AbePolicy;
use super::tkn::{decapsulate, encapsulate, Decap, Header, LazyHeader};
use crate::codec::{Order, Reader, Writer};

/// The version prefix of the current ciphertext format.
pub const VERSION: &[u8] = b"v1.3.8";
const SEED_LEN: usize = 72;
const CT: &str = "ciphertext";

fn expand_seed(seed: &[u8]) -> ([u8; 32], Zeroizing<[u8; 32]>) {
    let id = blake2b_256(&[], &[b"id computation hash", seed]);
    let mac_key = Zeroizing::new(blake2b_256(&[], &[b"key computation hash", seed]));
    (id, mac_key)
}

fn keystream_xor(key: &[u8; 32], data: &mut [u8]) {
    let mut ks = Zeroizing::new(vec![0u8; data.len()]);
    Xof::new(key).finish().fill(&mut ks);
    for (d, k) in data.iter_mut().zip(ks.iter()) {
        *d ^= k;
    }
}

/// Encrypts `msg` to `policy`, the header's wires on up to `threads`
/// threads.
pub(crate) fn encrypt<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R, pk: &PublicKey, policy: &AbePolicy, msg: &[u8], threads: usize,
) -> Result<Vec<u8>> {
    encrypt_header_with(rng, pk, policy, msg, threads, |_| {})
}

/// [`encrypt`], letting `edit` change the header's group elements before
/// it is encoded and MACed: tests use it to build ciphertexts a malicious
/// encryptor could make, with a valid MAC.
pub(crate) fn encrypt_header_with<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R, pk: &PublicKey, policy: &AbePolicy, msg: &[u8], threads: usize, edit: impl FnOnce(&mut Header),
) -> Result<Vec<u8>> {
    let mut seed = Zeroizing::new([0u8; SEED_LEN]);
    rng.fill_bytes(&mut seed[..]);
    let (id, mac_key) = expand_seed(&seed[..]);
    let bk_policy = policy.with_bk(scalar_reduce_be(&id));
    let (mut header, key) = encapsulate(rng, pk, &bk_policy, threads);
    edit(&mut header);
    let c1 = header.encode(policy)?;

    let mut env = Zeroizing::new(Vec::with_capacity(SEED_LEN + msg.len()));
    env.extend_from_slice(&seed[..]);
    env.extend_from_slice(msg);
    let sym = Zeroizing::new(blake2b_256(&[], &[&gt_to_bytes(&key)]));
    keystream_xor(&sym, &mut env);

    // A message near 4 GiB would overflow the u32 fields: refused, not cut.
    let mut w = Writer::new(Order::Little);
    w.bytes32(&c1).bytes32(&env);
    let mac_data = w.finish().map_err(|e| too_large(CT, e))?;
    let tag = blake2b_256(&mac_key[..], &[&mac_data]);

    let mut w = Writer::new(Order::Little);
    w.raw(VERSION).bytes16(&id).bytes32(&mac_data).bytes16(&tag);
    Ok(w.finish().map_err(|e| too_large(CT, e))?.to_vec())
}

/// The framing of a ciphertext, split but not yet decrypted.
pub(crate) struct Parsed<'a> {
    pub(crate) id: &'a [u8; 32],
    pub(crate) mac_data: &'a [u8],
    pub(crate) tag: &'a [u8],
    pub(crate) header: LazyHeader<'a>,
    pub(crate) env: &'a [u8],
}

pub(crate) fn parse(ct: &[u8]) -> Result<Parsed<'_>> {
    let (body, wide) = match ct.strip_prefix(VERSION) {
        Some(rest) => (rest, true),
        None => (ct, false),
    };
    let e = codec(CT);
    let mut r = Reader::new(body, Order::Little);
    let id = r.bytes16("id").map_err(&e)?;
    let id: &[u8; 32] = id.try_into().map_err(|_| malformed(CT, "id", format!("must be 32 bytes, found {}", id.len())))?;
    let mac_data = if wide { r.bytes32("macData") } else { r.bytes16("macData") }.map_err(&e)?;
    let tag = r.bytes16("tag").map_err(&e)?;
    if tag.len() != 32 {
        return Err(malformed(CT, "tag", format!("must be 32 bytes, found {}", tag.len())));
    }
    r.finish().map_err(&e)?;
    let mut m = Reader::new(mac_data, Order::Little);
    let (c1, env) = if wide {
        (m.bytes32("header").map_err(&e)?, m.bytes32("envelope").map_err(&e)?)
    } else {
        (m.bytes16("header").map_err(&e)?, m.bytes16("envelope").map_err(&e)?)
    };
    m.finish_as("macData").map_err(&e)?;
    if env.len() < SEED_LEN {
        return Err(malformed(CT, "envelope", format!("shorter than the {SEED_LEN}-byte seed")));
    }
    let header = LazyHeader::parse(c1)?;
    Ok(Parsed { id, mac_data, tag, header, env })
}

pub(crate) fn bk_policy(p: &Parsed<'_>) -> AbePolicy {
    p.header.policy.with_bk(scalar_reduce_be(p.id))
}

pub(crate) fn decrypt(key: &AttributeKey, ct: &[u8], opts: Decap) -> Result<Zeroizing<Vec<u8>>> {
    let p = parse(ct)?;
    let policy = bk_policy(&p);
    let (elem, deferred) = decapsulate(&p.header, &policy, key, opts)?;
    let sym = Zeroizing::new(blake2b_256(&[], &[&gt_to_bytes(&elem)]));
    let mut env = Zeroizing::new(p.env.to_vec());
    keystream_xor(&sym, &mut env);
    let (id, mac_key) = expand_seed(&env[..SEED_LEN]);
    let tag = blake2b_256(&mac_key[..], &[p.mac_data]);
    let ok = id.ct_eq(&p.id[..]) & tag.ct_eq(p.tag);
    if !bool::from(ok) {
        // Only now are the G1 subgroup checks worth their cost: a point
        // outside the subgroup is named, as a strict decoding would.
        return Err(deferred.first_error().unwrap_or(AbeError::IntegrityCheckFailed));
    }
    Ok(Zeroizing::new(env[SEED_LEN..].to_vec()))
}
