//! The RSA encoding an offload device needs: the CRT components it
//! takes, the padded integer it raises to the private exponent, and the
//! check of its answer. Devices like QAT compute `m^d mod n` and nothing
//! else, so padding stays in AWS-LC, on this side.
// The digest-input padding calls are `openssl-sys` only (AWS-LC's C API).
#![allow(unsafe_code)]

use foreign_types::ForeignTypeRef;
use openssl::error::ErrorStack;
use openssl::rsa::Padding;
use zeroize::Zeroizing;

use crate::sign::local_key::{crypto, digest_of, pss_digest, LocalKey};
use crate::sign::types::{CryptoOp, Family, Hash, Input, Operation, SignError};
use crate::sign::PrivateKey;

/// An RSA key split the way an offload device takes it: the CRT
/// quintuple (PKCS #1 "representation 2"), big-endian, each padded to half
/// the modulus length, which is what QAT expects.
#[cfg_attr(not(any(feature = "qat", feature = "multibuffer")), allow(dead_code))]
pub(crate) struct RsaCrt {
    /// The modulus length in bytes.
    pub(crate) modulus_len: usize,
    pub(crate) p: Zeroizing<Vec<u8>>,
    pub(crate) q: Zeroizing<Vec<u8>>,
    pub(crate) dp: Zeroizing<Vec<u8>>,
    pub(crate) dq: Zeroizing<Vec<u8>>,
    pub(crate) qinv: Zeroizing<Vec<u8>>,
}

/// The CRT components, or `None` for a key that is not a local RSA key
/// or lacks them, or whose primes are not both half the modulus long.
#[cfg_attr(not(any(feature = "qat", feature = "multibuffer")), allow(dead_code))]
pub(crate) fn rsa_crt(key: &PrivateKey) -> Option<RsaCrt> {
    let rsa = key.as_local()?.rsa()?;
    let modulus_len = rsa.size() as usize;
    let half = modulus_len / 2;
    let pad = |b: Option<&openssl::bn::BigNumRef>| -> Option<Zeroizing<Vec<u8>>> {
        let b = b?;
        if b.num_bytes() as usize > half {
            return None;
        }
        b.to_vec_padded(i32::try_from(half).ok()?).ok().map(Zeroizing::new)
    };
    let (p, q) = (pad(rsa.p())?, pad(rsa.q())?);
    // Unbalanced primes (one shorter than half) would make the device
    // compute with a zero-padded prime of the wrong length.
    if p[0] == 0 || q[0] == 0 {
        return None;
    }
    Some(RsaCrt { modulus_len, p, q, dp: pad(rsa.dmp1())?, dq: pad(rsa.dmq1())?, qinv: pad(rsa.iqmp())? })
}

/// The integer the private exponent is applied to for `op`, as many
/// bytes as the modulus: the EMSA-PKCS1-v1_5 or EMSA-PSS encoding of
/// the digest for a signature, the ciphertext for a raw decryption.
/// The caller has run [`PrivateKey::check`].
///
/// # Errors
/// [`SignError::DecryptNeedsRsa`] for a key that is not a local RSA
/// key, [`SignError::KeyMismatch`] for a non-RSA algorithm,
/// [`SignError::Crypto`] for a ciphertext not below the modulus or a
/// AWS-LC failure.
pub(crate) fn rsa_encode(key: &PrivateKey, op: &Operation) -> Result<Zeroizing<Vec<u8>>, SignError> {
    let Some(rsa) = key.as_local().and_then(LocalKey::rsa) else {
        return Err(SignError::DecryptNeedsRsa(key.kind()));
    };
    let k = rsa.size() as usize;
    let (alg, input, prehashed) = match op {
        Operation::DecryptRaw { ciphertext } => {
            let n = rsa.n().to_vec_padded(k as i32).map_err(crypto(CryptoOp::Encode))?;
            // Big-endian, equal lengths: lexicographic order is numeric.
            if ciphertext.len() != k || ciphertext.as_slice() >= n.as_slice() {
                return Err(SignError::Crypto { op: CryptoOp::Encode, reason: "the ciphertext is not smaller than the modulus".into() });
            }
            return Ok(Zeroizing::new(ciphertext.clone()));
        }
        Operation::Sign { alg, input: Input::Message(m) } => (*alg, m, false),
        Operation::Sign { alg, input: Input::Digest(d) } => (*alg, d, true),
    };
    let Some(hash) = alg.hash() else { return Err(SignError::KeyMismatch { alg, key: key.kind() }) };
    let digest = digest_of(hash, input, prehashed)?;
    let digest = &digest[..];
    let mut em = Zeroizing::new(vec![0u8; k]);
    match alg.family() {
        Family::RsaPkcs1 => {
            let t = pkcs1_digest_info(hash, digest)?;
            // EM = 00 01 FF..FF 00 T, with at least 8 bytes of FF.
            if t.len() + 11 > k {
                return Err(SignError::Crypto { op: CryptoOp::Encode, reason: "the modulus is too short for this digest".into() });
            }
            em[1] = 1;
            em[2..k - t.len() - 1].fill(0xff);
            em[k - t.len()..].copy_from_slice(&t);
        }
        Family::RsaPss => {
            let md = pss_digest(hash)?;
            // SAFETY: `rsa.as_ptr()` is a valid RSA* for the borrow;
            // `em` has RSA_size bytes, the most the call writes;
            // `digest` holds exactly the digest length of `md`, which
            // the call reads; a null MGF1 digest means `md`; salt
            // length -1 is RSA_PSS_SALTLEN_DIGEST, as in `rsa_sign_pss`.
            let ok = unsafe {
                openssl_sys::RSA_padding_add_PKCS1_PSS_mgf1(
                    rsa.as_ptr(),
                    em.as_mut_ptr(),
                    digest.as_ptr(),
                    md.as_ptr(),
                    std::ptr::null(),
                    -1,
                )
            };
            if ok != 1 {
                return Err(crypto(CryptoOp::Encode)(ErrorStack::get()));
            }
        }
        _ => return Err(SignError::KeyMismatch { alg, key: key.kind() }),
    }
    Ok(em)
}

/// Whether `result` is the private-key operation's answer for `em`:
/// `result^e mod n == em`. A device's result is checked this way
/// before it is used, as AWS-LC checks its own CRT results: a
/// faulty CRT signature reveals the key's factors (Boneh, DeMillo and
/// Lipton; Lenstra).
pub(crate) fn rsa_result_matches(key: &PrivateKey, em: &[u8], result: &[u8]) -> bool {
    let Some(rsa) = key.as_local().and_then(LocalKey::rsa) else { return false };
    let k = rsa.size() as usize;
    if result.len() != k || em.len() != k {
        return false;
    }
    let mut back = Zeroizing::new(vec![0u8; k]);
    match rsa.public_encrypt(result, &mut back, Padding::NONE) {
        Ok(n) if n == k => openssl::memcmp::eq(&back, em),
        _ => false,
    }
}

/// Whether a device's `output` for `op` is right, checked with the
/// public key only: `None` when `key` is not a local RSA key (nothing to
/// check here), else `Some(true)` when `output^e mod n` is the ciphertext
/// (raw decryption), the EMSA-PKCS1-v1_5 encoding of the digest, or a
/// valid EMSA-PSS encoding of it. A wrong RSA-CRT result must never leave:
/// with one faulty signature and the public key, anyone factors the
/// modulus (Boneh, DeMillo and Lipton; Lenstra). AWS-LC checks its own
/// CRT results the same way.
pub(crate) fn rsa_output_valid(key: &PrivateKey, op: &Operation, output: &[u8]) -> Option<bool> {
    let rsa = key.as_local().and_then(LocalKey::rsa)?;
    let (alg, input, prehashed) = match op {
        Operation::DecryptRaw { ciphertext } => return Some(rsa_result_matches(key, ciphertext, output)),
        Operation::Sign { alg, input: Input::Message(m) } => (*alg, m, false),
        Operation::Sign { alg, input: Input::Digest(d) } => (*alg, d, true),
    };
    Some(match alg.family() {
        Family::RsaPkcs1 => rsa_encode(key, op).is_ok_and(|em| rsa_result_matches(key, &em, output)),
        Family::RsaPss => {
            let k = rsa.size() as usize;
            let (Some(hash), true) = (alg.hash(), output.len() == k) else { return Some(false) };
            let (Ok(digest), Ok(md)) = (digest_of(hash, input, prehashed), pss_digest(hash)) else {
                return Some(false);
            };
            if digest.len() != md.size() {
                return Some(false);
            }
            let mut em = Zeroizing::new(vec![0u8; k]);
            if !matches!(rsa.public_encrypt(output, &mut em, Padding::NONE), Ok(n) if n == k) {
                return Some(false);
            }
            // SAFETY: `rsa.as_ptr()` is a valid RSA* for the borrow; `digest`
            // holds exactly the digest length of `md` (checked above), which
            // the call reads; `em` holds RSA_size bytes, the encoded message
            // length the call reads; a null MGF1 digest means `md`; salt
            // length -1 is the digest's length, as the signing side uses.
            let ok = unsafe {
                openssl_sys::RSA_verify_PKCS1_PSS_mgf1(rsa.as_ptr(), digest.as_ptr(), md.as_ptr(), std::ptr::null(), em.as_ptr(), -1)
            };
            // A failed check leaves an error on the thread's queue.
            let _ = ErrorStack::get();
            ok == 1
        }
        // Not an RSA algorithm: the key check refuses it before a device
        // sees it; an answer to it is not one to pass on.
        _ => false,
    })
}

/// The DigestInfo-prefixed digest RSASSA-PKCS1-v1_5 signs (the bare 36
/// bytes for MD5+SHA-1).
fn pkcs1_digest_info(hash: Hash, digest: &[u8]) -> Result<Zeroizing<Vec<u8>>, SignError> {
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut out_len: usize = 0;
    let mut alloced: std::os::raw::c_int = 0;
    // SAFETY: the out-pointers point at live locals; `digest` is passed
    // with its length. On success `out` points at `out_len` bytes, which
    // AWS-LC allocated when `alloced` is set (freed below) and which
    // otherwise alias `digest`.
    let ok = unsafe {
        openssl_sys::RSA_add_pkcs1_prefix(&mut out, &mut out_len, &mut alloced, hash.nid().as_raw(), digest.as_ptr(), digest.len())
    };
    if ok != 1 {
        return Err(crypto(CryptoOp::Encode)(ErrorStack::get()));
    }
    // SAFETY: see above: `out` is valid for `out_len` bytes until freed.
    let t = Zeroizing::new(unsafe { std::slice::from_raw_parts(out, out_len) }.to_vec());
    if alloced != 0 {
        // SAFETY: AWS-LC allocated `out` with OPENSSL_malloc and hands
        // it to us; it is freed once, after the copy above.
        unsafe { openssl_sys::OPENSSL_free(out.cast()) };
    }
    Ok(t)
}
