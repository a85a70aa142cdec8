//! A key in this process's AWS-LC memory: loading (PEM, DER, seeds,
//! generation) and the synchronous operations the executors run. Also the
//! AWS-LC side of the plain types below: hashing ([`Hash::digest`]) and
//! turning AWS-LC's error stack into a [`SignError`].
// The `openssl` crate's safe wrapper lacks the digest-input RSA calls; they
// go through `openssl-sys` (AWS-LC's C API).
#![allow(unsafe_code)]

use std::fmt;

use foreign_types::ForeignTypeRef;
use openssl::ec::{EcGroup, EcKey};
use openssl::ecdsa::EcdsaSig;
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{Id, PKey, Private};
use openssl::rsa::{Padding, Rsa, RsaRef};
use openssl::sign::Signer;
use zeroize::Zeroizing;

use super::types::{Algorithm, CryptoOp, Family, Hash, Input, KeyError, KeyKind, Operation, Output, SignError};

/// A AWS-LC error stack as an error. AWS-LC's reason strings name
/// the failing function and reason, never key material.
pub(crate) fn crypto(op: CryptoOp) -> impl Fn(ErrorStack) -> SignError {
    move |e| SignError::Crypto { op, reason: e.to_string() }
}

impl Hash {
    pub(crate) fn nid(self) -> Nid {
        match self {
            Hash::Md5Sha1 => Nid::MD5_SHA1,
            Hash::Sha256 => Nid::SHA256,
            Hash::Sha384 => Nid::SHA384,
            Hash::Sha512 => Nid::SHA512,
        }
    }

    /// AWS-LC's digest for the single hashes (MD5+SHA-1 is two, see
    /// [`Hash::digest`]).
    pub(crate) fn message_digest(self) -> Option<MessageDigest> {
        match self {
            Hash::Md5Sha1 => None,
            Hash::Sha256 => Some(MessageDigest::sha256()),
            Hash::Sha384 => Some(MessageDigest::sha384()),
            Hash::Sha512 => Some(MessageDigest::sha512()),
        }
    }

    /// Hashes `msg`.
    ///
    /// # Errors
    /// [`SignError::Crypto`] if AWS-LC fails (it does not for these
    /// digests short of memory exhaustion).
    pub fn digest(self, msg: &[u8]) -> Result<Vec<u8>, SignError> {
        use openssl::hash::hash;
        let err = crypto(CryptoOp::Digest);
        match self.message_digest() {
            Some(md) => Ok(hash(md, msg).map_err(&err)?.to_vec()),
            None => {
                let mut out = hash(MessageDigest::md5(), msg).map_err(&err)?.to_vec();
                out.extend_from_slice(&hash(MessageDigest::sha1(), msg).map_err(&err)?);
                Ok(out)
            }
        }
    }
}

/// The typed view of the key AWS-LC's low-level calls need, extracted
/// once at load time rather than per operation.
enum Typed {
    Rsa(Rsa<Private>),
    Ec(EcKey<Private>),
    Ed25519,
}

/// A private key held in AWS-LC memory. AWS-LC frees key memory with
/// `OPENSSL_free`, which overwrites it first, so the secret is zeroized on
/// drop; buffers built here from secrets are [`Zeroizing`].
pub(crate) struct LocalKey {
    pkey: PKey<Private>,
    typed: Typed,
    kind: KeyKind,
}

impl fmt::Debug for LocalKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalKey").field("kind", &self.kind).finish_non_exhaustive()
    }
}

/// The PKCS#8 prefix of an Ed25519 private key (RFC 8410): a 32-byte seed
/// follows.
const ED25519_PKCS8_PREFIX: [u8; 16] = [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

/// An RSA key restricted to PSS, by its PKCS#8 identifier or by OpenSSL's
/// PEM label for it.
const RSA_PSS_ONLY: KeyError = KeyError::Unsupported {
    what: "an RSA-PSS-only key (id-RSASSA-PSS)",
    why: "keyfence reads RSA private keys only as rsaEncryption; the same key as PKCS#1 DER (`openssl rsa -in KEY -traditional -outform DER -out KEY.der`) loads, and signs rsa-pss-* as well",
};

/// Object identifiers (their DER encoding, tag and length included) of
/// keys keyfence does not sign with, with what to tell the person holding
/// one.
/// "not a private key" would send them looking for a corrupt file.
const REFUSED_OIDS: [(&[u8], KeyError); 7] = [
    (
        // PBES2 (an encrypted PKCS#8 key, what `openssl pkcs8 -topk8`
        // writes): checked first, as the key type inside is hidden.
        &[0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x05, 0x0d],
        KeyError::Encrypted,
    ),
    (
        &[0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x0a],
        KeyError::Unsupported {
            what: "a secp256k1 EC key",
            why: "no TLS signature scheme uses secp256k1; keyfence signs ECDSA on P-256 and P-384",
        },
    ),
    (&[0x06, 0x03, 0x2b, 0x65, 0x71], KeyError::Unsupported { what: "an Ed448 key", why: "keyfence signs EdDSA with Ed25519, not Ed448" }),
    (&[0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a], RSA_PSS_ONLY),
    (&[0x06, 0x03, 0x2b, 0x65, 0x6e], KeyError::Unsupported { what: "an X25519 key", why: "it is for key agreement, not signatures" }),
    (&[0x06, 0x03, 0x2b, 0x65, 0x6f], KeyError::Unsupported { what: "an X448 key", why: "it is for key agreement, not signatures" }),
    (
        &[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01],
        KeyError::Unsupported {
            what: "a DSA key",
            why: "TLS 1.3 has no DSA signatures and keyfence does not sign with DSA; use RSA, ECDSA (P-256, P-384) or Ed25519",
        },
    ),
];

/// Why AWS-LC could not read `der`: a key type it does not implement,
/// an encrypted key, or else not a key at all. Runs only after a failed
/// parse, so it costs nothing on the normal path.
fn diagnose_der(der: &[u8]) -> KeyError {
    // The algorithm identifier sits near the start in PKCS#8 and SEC1 (a
    // SEC1 key's curve follows its scalar): a window keeps a chance match
    // in a long RSA-looking blob out.
    let head = &der[..der.len().min(96)];
    REFUSED_OIDS.iter().find(|(oid, _)| head.windows(oid.len()).any(|w| w == *oid)).map_or(KeyError::Parse, |(_, e)| e.clone())
}

/// `diagnosed` when it names a key type keyfence does not sign with, else
/// `e`: what to say does not depend on whether the library read the key.
fn known_refusal(e: KeyError, diagnosed: KeyError) -> KeyError {
    match (&e, diagnosed) {
        (KeyError::Curve(_) | KeyError::UnsupportedType(_), d @ KeyError::Unsupported { .. }) => d,
        _ => e,
    }
}

/// As [`diagnose_der`], for PEM: the armour says "encrypted" in two ways,
/// and the body is DER.
fn diagnose_pem(pem: &[u8]) -> KeyError {
    let Ok(text) = std::str::from_utf8(pem) else { return KeyError::Parse };
    if text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----") || text.contains("Proc-Type: 4,ENCRYPTED") {
        return KeyError::Encrypted;
    }
    // OpenSSL's "traditional" form of an RSA-PSS key: PKCS#1 inside,
    // under a label the library does not know.
    if text.contains("-----BEGIN RSA-PSS PRIVATE KEY-----") {
        return RSA_PSS_ONLY;
    }
    // Base64 of a secret key is as secret as the key.
    let body: Zeroizing<String> = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .filter(|l| !l.contains(':'))
        .map(str::trim)
        .collect::<String>()
        .into();
    match openssl::base64::decode_block(&body) {
        Ok(der) => diagnose_der(&Zeroizing::new(der)),
        Err(_) => KeyError::Parse,
    }
}

impl LocalKey {
    /// Loads a PEM private key: `RSA PRIVATE KEY` (PKCS#1), `EC PRIVATE KEY`
    /// (SEC1) or `PRIVATE KEY` (PKCS#8). Encrypted PEM is refused.
    ///
    /// # Errors
    /// [`KeyError::Parse`] for anything else; the other [`KeyError`]s for
    /// keys of an unsupported type or size, or inconsistent ones.
    pub(crate) fn from_pem(pem: &[u8]) -> Result<Self, KeyError> {
        // AWS-LC's default password callback (used when none is given)
        // supplies no password and never prompts, so encrypted keys fail
        // here rather than blocking on a terminal.
        let pkey = PKey::private_key_from_pem(pem).map_err(|_| diagnose_pem(pem))?;
        // A key the library reads but keyfence does not sign with
        // (secp256k1, DSA): the same words as when the library refuses it.
        Self::from_pkey(pkey).map_err(|e| known_refusal(e, diagnose_pem(pem)))
    }

    /// Loads a DER private key: PKCS#8 `PrivateKeyInfo`, PKCS#1
    /// `RSAPrivateKey` or SEC1 `ECPrivateKey`.
    ///
    /// # Errors
    /// As [`PrivateKey::from_pem`](super::PrivateKey::from_pem).
    pub(crate) fn from_der(der: &[u8]) -> Result<Self, KeyError> {
        let pkey = PKey::private_key_from_der(der).map_err(|_| diagnose_der(der))?;
        Self::from_pkey(pkey).map_err(|e| known_refusal(e, diagnose_der(der)))
    }

    /// Loads a key from bytes in memory, PEM or DER (told apart by the PEM
    /// armour). This is the path for a key that was just decrypted from a
    /// keyfence envelope: the caller keeps the bytes in a zeroizing buffer,
    /// and nothing is written to disk.
    ///
    /// # Errors
    /// As [`PrivateKey::from_pem`](super::PrivateKey::from_pem).
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        let start = bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(bytes.len());
        if bytes[start..].starts_with(b"-----BEGIN") {
            Self::from_pem(bytes)
        } else {
            Self::from_der(bytes)
        }
    }

    /// An Ed25519 key from its 32-byte seed (RFC 8032's private key).
    ///
    /// # Errors
    /// [`KeyError::Ed25519Length`] unless `seed` is 32 bytes.
    pub(crate) fn from_ed25519_seed(seed: &[u8]) -> Result<Self, KeyError> {
        if seed.len() != 32 {
            return Err(KeyError::Ed25519Length(seed.len()));
        }
        let mut der = Zeroizing::new(Vec::with_capacity(48));
        der.extend_from_slice(&ED25519_PKCS8_PREFIX);
        der.extend_from_slice(seed);
        Self::from_der(&der)
    }

    /// Generates a fresh key of `kind` (RSA with e = 65537).
    ///
    /// # Errors
    /// [`KeyError::RsaSize`] for RSA sizes outside 2048..=4096,
    /// [`KeyError::Generate`] if AWS-LC fails.
    pub(crate) fn generate(kind: KeyKind) -> Result<Self, KeyError> {
        let generr = |e: ErrorStack| KeyError::Generate(e.to_string());
        let pkey = match kind {
            KeyKind::Rsa { bits } => {
                if !(2048..=4096).contains(&bits) {
                    return Err(KeyError::RsaSize(bits));
                }
                PKey::from_rsa(Rsa::generate(bits).map_err(generr)?).map_err(generr)?
            }
            KeyKind::EcP256 | KeyKind::EcP384 => {
                let nid = if kind == KeyKind::EcP256 { Nid::X9_62_PRIME256V1 } else { Nid::SECP384R1 };
                let group = EcGroup::from_curve_name(nid).map_err(generr)?;
                PKey::from_ec_key(EcKey::generate(&group).map_err(generr)?).map_err(generr)?
            }
            KeyKind::Ed25519 => PKey::generate_ed25519().map_err(generr)?,
        };
        Self::from_pkey(pkey)
    }

    pub(crate) fn from_pkey(pkey: PKey<Private>) -> Result<Self, KeyError> {
        let (typed, kind) = match pkey.id() {
            Id::RSA => {
                let rsa = pkey.rsa().map_err(|_| KeyError::Parse)?;
                let bits = rsa.size() * 8;
                if !(2048..=4096).contains(&bits) {
                    return Err(KeyError::RsaSize(bits));
                }
                if !rsa.check_key().unwrap_or(false) {
                    return Err(KeyError::Inconsistent);
                }
                (Typed::Rsa(rsa), KeyKind::Rsa { bits })
            }
            Id::EC => {
                let ec = pkey.ec_key().map_err(|_| KeyError::Parse)?;
                let kind = match ec.group().curve_name() {
                    Some(Nid::X9_62_PRIME256V1) => KeyKind::EcP256,
                    Some(Nid::SECP384R1) => KeyKind::EcP384,
                    Some(nid) => return Err(KeyError::Curve(nid.short_name().unwrap_or("unnamed").to_string())),
                    None => return Err(KeyError::Curve("explicit parameters".into())),
                };
                ec.check_key().map_err(|_| KeyError::Inconsistent)?;
                (Typed::Ec(ec), kind)
            }
            Id::ED25519 => (Typed::Ed25519, KeyKind::Ed25519),
            other => return Err(KeyError::UnsupportedType(format!("{other:?}"))),
        };
        Ok(LocalKey { pkey, typed, kind })
    }

    pub(crate) fn kind(&self) -> KeyKind {
        self.kind
    }

    /// The RSA key, for an offload device's encoding (which lives with the
    /// offload code); `None` for other kinds.
    #[cfg_attr(not(any(feature = "qat", feature = "multibuffer")), allow(dead_code))]
    pub(crate) fn rsa(&self) -> Option<&Rsa<Private>> {
        match &self.typed {
            Typed::Rsa(rsa) => Some(rsa),
            _ => None,
        }
    }

    /// The EC key, for the multi-buffer device's lanes; `None` for other
    /// kinds.
    #[cfg_attr(not(feature = "multibuffer"), allow(dead_code))]
    pub(crate) fn ec(&self) -> Option<&openssl::ec::EcKey<Private>> {
        match &self.typed {
            Typed::Ec(ec) => Some(ec),
            _ => None,
        }
    }

    pub(crate) fn public_key_der(&self) -> Result<Vec<u8>, SignError> {
        self.pkey.public_key_to_der().map_err(crypto(CryptoOp::PublicKey))
    }

    /// Runs `op`, which the caller has checked against the key
    /// ([`PrivateKey::check`](super::PrivateKey::check)).
    pub(crate) fn perform_checked(&self, op: &Operation) -> Result<Output, SignError> {
        match op {
            Operation::Sign { alg, input: Input::Message(m) } => self.sign_checked(*alg, m, false),
            Operation::Sign { alg, input: Input::Digest(d) } => self.sign_checked(*alg, d, true),
            Operation::DecryptRaw { ciphertext } => self.decrypt_raw_checked(ciphertext),
        }
    }

    /// `input` is the message, or the digest when `prehashed`; the caller has
    /// checked that `alg` fits the key and the digest length.
    fn sign_checked(&self, alg: Algorithm, input: &[u8], prehashed: bool) -> Result<Output, SignError> {
        let err = crypto(CryptoOp::Sign);
        let Some(hash) = alg.hash() else {
            // Ed25519: the only algorithm without a separate hash.
            let mut signer = Signer::new_without_digest(&self.pkey).map_err(&err)?;
            return Ok(Zeroizing::new(signer.sign_oneshot_to_vec(input).map_err(&err)?));
        };
        let digest = digest_of(hash, input, prehashed)?;
        let digest = &digest[..];
        match (&self.typed, alg.family()) {
            (Typed::Rsa(rsa), Family::RsaPkcs1) => rsa_sign_pkcs1(rsa, hash, digest),
            (Typed::Rsa(rsa), Family::RsaPss) => rsa_sign_pss(rsa, hash, digest),
            (Typed::Ec(ec), Family::EcdsaP256 | Family::EcdsaP384) => {
                let sig = EcdsaSig::sign(digest, ec).map_err(&err)?;
                Ok(Zeroizing::new(sig.to_der().map_err(&err)?))
            }
            _ => Err(SignError::KeyMismatch { alg, key: self.kind }),
        }
    }

    fn decrypt_raw_checked(&self, ciphertext: &[u8]) -> Result<Output, SignError> {
        let Typed::Rsa(rsa) = &self.typed else {
            return Err(SignError::DecryptNeedsRsa(self.kind));
        };
        let mut out = Zeroizing::new(vec![0u8; rsa.size() as usize]);
        let n = rsa.private_decrypt(ciphertext, &mut out, Padding::NONE).map_err(crypto(CryptoOp::Decrypt))?;
        out.truncate(n);
        Ok(out)
    }
}

/// The digest to sign: `input` itself when the caller hashed it, else its
/// hash.
pub(crate) fn digest_of(hash: Hash, input: &[u8], prehashed: bool) -> Result<std::borrow::Cow<'_, [u8]>, SignError> {
    Ok(if prehashed { std::borrow::Cow::Borrowed(input) } else { std::borrow::Cow::Owned(hash.digest(input)?) })
}

/// The hash RSA-PSS uses for both the message and MGF1.
pub(crate) fn pss_digest(hash: Hash) -> Result<openssl::hash::MessageDigest, SignError> {
    hash.message_digest().ok_or_else(|| SignError::Crypto { op: CryptoOp::Sign, reason: "RSA-PSS is not defined over MD5+SHA-1".into() })
}

/// RSASSA-PKCS1-v1_5 over a digest. The safe `openssl` API signs messages
/// only; `RSA_sign` adds the DigestInfo (none for MD5+SHA-1, as TLS 1.0
/// wants).
fn rsa_sign_pkcs1(rsa: &RsaRef<Private>, hash: Hash, digest: &[u8]) -> Result<Output, SignError> {
    let mut out = Zeroizing::new(vec![0u8; rsa.size() as usize]);
    let mut out_len: std::os::raw::c_uint = 0;
    // SAFETY: `rsa.as_ptr()` is a valid RSA* for the duration of the borrow
    // and RSA_sign does not take ownership; `digest` and `out` are live
    // slices whose pointers and lengths are passed together; `out` has
    // RSA_size bytes, the most RSA_sign writes; `out_len` is a valid
    // pointer to a local.
    let ok =
        unsafe { openssl_sys::RSA_sign(hash.nid().as_raw(), digest.as_ptr(), digest.len(), out.as_mut_ptr(), &mut out_len, rsa.as_ptr()) };
    if ok != 1 {
        return Err(crypto(CryptoOp::Sign)(ErrorStack::get()));
    }
    out.truncate(out_len as usize);
    Ok(out)
}

/// RSASSA-PSS over a digest, MGF1 with the same hash and a salt as long as
/// the digest (what TLS 1.3 and rsa_pss_rsae_* require).
fn rsa_sign_pss(rsa: &RsaRef<Private>, hash: Hash, digest: &[u8]) -> Result<Output, SignError> {
    let md = pss_digest(hash)?;
    let mut out = Zeroizing::new(vec![0u8; rsa.size() as usize]);
    let mut out_len: usize = 0;
    // SAFETY: as in `rsa_sign_pkcs1`; `md.as_ptr()` is a static EVP_MD;
    // a null MGF1 digest means "the same as `md`"; salt length -1 is
    // RSA_PSS_SALTLEN_DIGEST; `out.len()` is passed as `max_out`.
    let ok = unsafe {
        openssl_sys::RSA_sign_pss_mgf1(
            rsa.as_ptr(),
            &mut out_len,
            out.as_mut_ptr(),
            out.len(),
            digest.as_ptr(),
            digest.len(),
            md.as_ptr(),
            std::ptr::null(),
            -1,
        )
    };
    if ok != 1 {
        return Err(crypto(CryptoOp::Sign)(ErrorStack::get()));
    }
    out.truncate(out_len);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_have_their_lengths() {
        for a in Algorithm::ALL {
            if let Some(h) = a.hash() {
                assert_eq!(h.digest(b"abc").unwrap().len(), h.len());
            }
        }
    }

    #[test]
    fn md5_sha1_is_the_concatenation() {
        let d = Hash::Md5Sha1.digest(b"abc").unwrap();
        assert_eq!(&d[..16], &openssl::hash::hash(MessageDigest::md5(), b"abc").unwrap()[..]);
        assert_eq!(&d[16..], &openssl::hash::hash(MessageDigest::sha1(), b"abc").unwrap()[..]);
    }
}
