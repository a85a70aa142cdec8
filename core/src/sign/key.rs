//! Private keys: loading (PEM, DER, raw bytes) and the synchronous
//! BoringSSL operations the engine's executors run.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use boring::ec::{EcGroup, EcKey};
use boring::ecdsa::EcdsaSig;
use boring::error::ErrorStack;
use boring::nid::Nid;
use boring::pkey::{Id, PKey, Private};
use boring::rsa::{Padding, Rsa, RsaRef};
use boring::sign::Signer;
use foreign_types::ForeignTypeRef;
use zeroize::Zeroizing;

use super::alg::{Algorithm, Family, Hash};
use super::backend::Backend;
use super::error::{KeyError, SignError};
use super::op::{Input, Operation, Output};

/// What kind of private key this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// RSA with a modulus of `bits` bits (2048 to 4096).
    Rsa {
        /// Modulus size in bits.
        bits: u32,
    },
    /// ECDSA on NIST P-256.
    EcP256,
    /// ECDSA on NIST P-384.
    EcP384,
    /// Ed25519.
    Ed25519,
}

impl KeyKind {
    /// True for RSA keys.
    pub fn is_rsa(self) -> bool {
        matches!(self, KeyKind::Rsa { .. })
    }

    /// Whether `alg` can be used with a key of this kind.
    pub fn supports(self, alg: Algorithm) -> bool {
        matches!(
            (self, alg.family()),
            (KeyKind::Rsa { .. }, Family::RsaPkcs1 | Family::RsaPss)
                | (KeyKind::EcP256, Family::EcdsaP256)
                | (KeyKind::EcP384, Family::EcdsaP384)
                | (KeyKind::Ed25519, Family::Ed25519)
        )
    }

    /// The largest output an operation with this key produces, in bytes
    /// (signature or raw decryption).
    pub fn max_output_len(self) -> usize {
        match self {
            KeyKind::Rsa { bits } => (bits as usize).div_ceil(8),
            // DER ECDSA-Sig-Value: SEQUENCE { INTEGER r, INTEGER s }.
            KeyKind::EcP256 => 72,
            KeyKind::EcP384 => 104,
            KeyKind::Ed25519 => 64,
        }
    }
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyKind::Rsa { bits } => write!(f, "an RSA-{bits}"),
            KeyKind::EcP256 => f.write_str("a P-256 ECDSA"),
            KeyKind::EcP384 => f.write_str("a P-384 ECDSA"),
            KeyKind::Ed25519 => f.write_str("an Ed25519"),
        }
    }
}

/// The typed view of the key BoringSSL's low-level calls need, extracted
/// once at load time rather than per operation.
enum Typed {
    Rsa(Rsa<Private>),
    Ec(EcKey<Private>),
    Ed25519,
}

/// A private key held in BoringSSL memory.
///
/// Loaded from PEM or DER (PKCS#1, PKCS#8, SEC1) or from bytes in memory
/// (an opened envelope), so the secret need never touch disk. BoringSSL
/// frees key memory with `OPENSSL_free`, which overwrites it first, so the
/// secret is zeroized on drop; buffers keyfence itself builds from secrets
/// are [`Zeroizing`]. `Debug` shows the kind only.
///
/// The operations here are synchronous and run on the calling thread; the
/// [`Engine`](super::Engine) runs them on its executors.
///
/// ```
/// use keyfence::sign::{Algorithm, KeyKind, PrivateKey};
/// let key = PrivateKey::generate(KeyKind::EcP256).unwrap();
/// let sig = key.sign(Algorithm::EcdsaP256Sha256, b"hello").unwrap();
/// assert!(sig.len() <= KeyKind::EcP256.max_output_len());
/// ```
pub struct PrivateKey {
    holder: Holder,
    kind: KeyKind,
}

/// Where the secret lives.
enum Holder {
    /// In this process's BoringSSL memory.
    Local { pkey: PKey<Private>, typed: Typed },
    /// Somewhere else (an isolated key process); this process holds only
    /// an id, and the backend that can use it.
    Remote(RemoteKey),
}

/// A handle on a key held outside this process: the backend that holds it,
/// its id there, and the public key.
pub(crate) struct RemoteKey {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) id: u64,
    pub(crate) public_der: Vec<u8>,
    /// Called with `id` when the last handle goes, so the holder can
    /// forget the key.
    pub(crate) on_drop: Option<Box<dyn Fn(u64) + Send + Sync>>,
}

impl Drop for RemoteKey {
    fn drop(&mut self) {
        if let Some(f) = self.on_drop.take() {
            f(self.id);
        }
    }
}

/// How long [`PrivateKey::perform`] waits for a key held elsewhere.
const REMOTE_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("PrivateKey");
        d.field("kind", &self.kind);
        if let Holder::Remote(r) = &self.holder {
            d.field("held_by", &r.backend.name()).field("id", &r.id);
        }
        d.finish_non_exhaustive()
    }
}

/// The PKCS#8 prefix of an Ed25519 private key (RFC 8410): a 32-byte seed
/// follows.
const ED25519_PKCS8_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

impl PrivateKey {
    /// Loads a PEM private key: `RSA PRIVATE KEY` (PKCS#1), `EC PRIVATE KEY`
    /// (SEC1) or `PRIVATE KEY` (PKCS#8). Encrypted PEM is refused.
    ///
    /// # Errors
    /// [`KeyError::Parse`] for anything else; the other [`KeyError`]s for
    /// keys of an unsupported type or size, or inconsistent ones.
    pub fn from_pem(pem: &[u8]) -> Result<Self, KeyError> {
        // BoringSSL's default password callback (used when none is given)
        // supplies no password and never prompts, so encrypted keys fail
        // here rather than blocking on a terminal.
        let pkey = PKey::private_key_from_pem(pem).map_err(|_| KeyError::Parse)?;
        Self::from_pkey(pkey)
    }

    /// Loads a DER private key: PKCS#8 `PrivateKeyInfo`, PKCS#1
    /// `RSAPrivateKey` or SEC1 `ECPrivateKey`.
    ///
    /// # Errors
    /// As [`PrivateKey::from_pem`].
    pub fn from_der(der: &[u8]) -> Result<Self, KeyError> {
        let pkey = PKey::private_key_from_der(der).map_err(|_| KeyError::Parse)?;
        Self::from_pkey(pkey)
    }

    /// Loads a key from bytes in memory, PEM or DER (told apart by the PEM
    /// armour). This is the path for a key that was just decrypted from a
    /// keyfence envelope: the caller keeps the bytes in a zeroizing buffer,
    /// and nothing is written to disk.
    ///
    /// # Errors
    /// As [`PrivateKey::from_pem`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
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
    pub fn from_ed25519_seed(seed: &[u8]) -> Result<Self, KeyError> {
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
    /// [`KeyError::Generate`] if BoringSSL fails.
    pub fn generate(kind: KeyKind) -> Result<Self, KeyError> {
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
            KeyKind::Ed25519 => PKey::generate(Id::ED25519).map_err(generr)?,
        };
        Self::from_pkey(pkey)
    }

    fn from_pkey(pkey: PKey<Private>) -> Result<Self, KeyError> {
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
        Ok(PrivateKey { holder: Holder::Local { pkey, typed }, kind })
    }

    /// A handle on a key that `backend` holds under `id`; operations on it
    /// go to that backend.
    pub(crate) fn remote(kind: KeyKind, remote: RemoteKey) -> Self {
        PrivateKey { holder: Holder::Remote(remote), kind }
    }

    /// The backend that holds this key, if it is not in this process. The
    /// engine runs such a key's operations there whatever the request says.
    pub(crate) fn home(&self) -> Option<&Arc<dyn Backend>> {
        match &self.holder {
            Holder::Local { .. } => None,
            Holder::Remote(r) => Some(&r.backend),
        }
    }

    /// The id a remote backend gave this key.
    pub(crate) fn remote_id(&self) -> Option<u64> {
        match &self.holder {
            Holder::Local { .. } => None,
            Holder::Remote(r) => Some(r.id),
        }
    }

    /// Whether the secret is in this process's memory (false for a key
    /// held by an isolated key process).
    pub fn is_local(&self) -> bool {
        matches!(self.holder, Holder::Local { .. })
    }

    /// The key's kind.
    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    /// The public key as DER `SubjectPublicKeyInfo`, for verifiers and
    /// certificates.
    ///
    /// # Errors
    /// [`SignError::Crypto`] if BoringSSL cannot encode it.
    pub fn public_key_der(&self) -> Result<Vec<u8>, SignError> {
        match &self.holder {
            Holder::Local { pkey, .. } => pkey.public_key_to_der().map_err(SignError::crypto),
            Holder::Remote(r) => Ok(r.public_der.clone()),
        }
    }

    /// Checks that `op` can run with this key: algorithm family, digest
    /// length, ciphertext length. The engine calls this at submission so a
    /// bad request fails at once instead of after queueing.
    ///
    /// # Errors
    /// [`SignError::KeyMismatch`], [`SignError::DigestNotSupported`],
    /// [`SignError::DigestLength`], [`SignError::DecryptNeedsRsa`],
    /// [`SignError::CiphertextLength`].
    pub fn check(&self, op: &Operation) -> Result<(), SignError> {
        match op {
            Operation::Sign { alg, input } => {
                if !self.kind.supports(*alg) {
                    return Err(SignError::KeyMismatch { alg: *alg, key: self.kind });
                }
                if let Input::Digest(d) = input {
                    let hash = alg.hash().ok_or(SignError::DigestNotSupported(*alg))?;
                    if d.len() != hash.len() {
                        return Err(SignError::DigestLength { alg: *alg, expected: hash.len(), got: d.len() });
                    }
                }
                Ok(())
            }
            Operation::DecryptRaw { ciphertext } => match self.kind {
                KeyKind::Rsa { bits } => {
                    let expected = (bits / 8) as usize;
                    if ciphertext.len() != expected {
                        return Err(SignError::CiphertextLength { expected, got: ciphertext.len() });
                    }
                    Ok(())
                }
                other => Err(SignError::DecryptNeedsRsa(other)),
            },
        }
    }

    /// Runs `op` on the calling thread.
    ///
    /// # Errors
    /// Those of [`PrivateKey::check`], and [`SignError::Crypto`] if
    /// BoringSSL fails.
    ///
    /// A key held elsewhere (an isolated key process) is used through its
    /// backend, waiting up to 10 seconds.
    pub fn perform(&self, op: &Operation) -> Result<Output, SignError> {
        self.check(op)?;
        if let Holder::Remote(r) = &self.holder {
            return r.backend.perform(self, op, Instant::now() + REMOTE_SYNC_TIMEOUT);
        }
        match op {
            Operation::Sign { alg, input: Input::Message(m) } => self.sign_checked(*alg, m, false),
            Operation::Sign { alg, input: Input::Digest(d) } => self.sign_checked(*alg, d, true),
            Operation::DecryptRaw { ciphertext } => self.decrypt_raw_checked(ciphertext),
        }
    }

    /// Signs `msg` with `alg` on the calling thread.
    ///
    /// # Errors
    /// [`SignError::KeyMismatch`] if `alg` does not fit the key;
    /// [`SignError::Crypto`] if BoringSSL fails.
    pub fn sign(&self, alg: Algorithm, msg: &[u8]) -> Result<Output, SignError> {
        self.perform(&Operation::Sign { alg, input: Input::Message(msg.to_vec()) })
    }

    /// Signs a pre-computed digest with `alg` on the calling thread (not for
    /// Ed25519, which signs messages).
    ///
    /// # Errors
    /// Those of [`PrivateKey::check`]; [`SignError::Crypto`] if BoringSSL
    /// fails.
    pub fn sign_digest(&self, alg: Algorithm, digest: &[u8]) -> Result<Output, SignError> {
        self.perform(&Operation::Sign { alg, input: Input::Digest(digest.to_vec()) })
    }

    /// Raw RSA decryption (no padding removed), as the TLS RSA key exchange
    /// hands it to a private-key method: BoringSSL removes the PKCS#1 padding
    /// itself, in constant time. The output is as long as the modulus.
    ///
    /// # Errors
    /// [`SignError::DecryptNeedsRsa`], [`SignError::CiphertextLength`];
    /// [`SignError::Crypto`] if the input is not smaller than the modulus.
    pub fn decrypt_raw(&self, ciphertext: &[u8]) -> Result<Output, SignError> {
        self.perform(&Operation::DecryptRaw { ciphertext: ciphertext.to_vec() })
    }

    /// `input` is the message, or the digest when `prehashed`; the caller has
    /// checked that `alg` fits the key and the digest length.
    fn sign_checked(&self, alg: Algorithm, input: &[u8], prehashed: bool) -> Result<Output, SignError> {
        let Holder::Local { pkey, typed } = &self.holder else {
            // `perform` sends remote keys to their backend before this.
            return Err(SignError::Backend {
                backend: "software".into(),
                reason: "the key is not in this process".into(),
            });
        };
        let Some(hash) = alg.hash() else {
            // Ed25519: the only algorithm without a separate hash.
            let mut signer = Signer::new_without_digest(pkey).map_err(SignError::crypto)?;
            return Ok(Zeroizing::new(signer.sign_oneshot_to_vec(input).map_err(SignError::crypto)?));
        };
        let digest = digest_of(hash, input, prehashed)?;
        let digest = &digest[..];
        match (typed, alg.family()) {
            (Typed::Rsa(rsa), Family::RsaPkcs1) => rsa_sign_pkcs1(rsa, hash, digest),
            (Typed::Rsa(rsa), Family::RsaPss) => rsa_sign_pss(rsa, hash, digest),
            (Typed::Ec(ec), Family::EcdsaP256 | Family::EcdsaP384) => {
                let sig = EcdsaSig::sign(digest, ec).map_err(SignError::crypto)?;
                Ok(Zeroizing::new(sig.to_der().map_err(SignError::crypto)?))
            }
            _ => Err(SignError::KeyMismatch { alg, key: self.kind }),
        }
    }

    fn decrypt_raw_checked(&self, ciphertext: &[u8]) -> Result<Output, SignError> {
        let Holder::Local { typed: Typed::Rsa(rsa), .. } = &self.holder else {
            return Err(SignError::DecryptNeedsRsa(self.kind));
        };
        let mut out = Zeroizing::new(vec![0u8; rsa.size() as usize]);
        let n = rsa.private_decrypt(ciphertext, &mut out, Padding::NONE).map_err(SignError::crypto)?;
        out.truncate(n);
        Ok(out)
    }
}

/// An RSA key split the way an offload device takes it: the CRT
/// quintuple (PKCS #1 "representation 2"), big-endian, each padded to half
/// the modulus length, which is what QAT expects.
#[cfg(feature = "qat")]
pub(crate) struct RsaCrt {
    /// The modulus length in bytes.
    pub(crate) modulus_len: usize,
    pub(crate) p: Zeroizing<Vec<u8>>,
    pub(crate) q: Zeroizing<Vec<u8>>,
    pub(crate) dp: Zeroizing<Vec<u8>>,
    pub(crate) dq: Zeroizing<Vec<u8>>,
    pub(crate) qinv: Zeroizing<Vec<u8>>,
}

/// The RSA primitive split from its padding, for devices that compute
/// `m^d mod n` and nothing else.
#[cfg(feature = "qat")]
impl PrivateKey {
    /// The CRT components, or `None` for a key that is not a local RSA key
    /// or lacks them, or whose primes are not both half the modulus long.
    pub(crate) fn rsa_crt(&self) -> Option<RsaCrt> {
        let Holder::Local { typed: Typed::Rsa(rsa), .. } = &self.holder else { return None };
        let modulus_len = rsa.size() as usize;
        let half = modulus_len / 2;
        let pad = |b: Option<&boring::bn::BigNumRef>| -> Option<Zeroizing<Vec<u8>>> {
            let b = b?;
            if b.num_bytes() as usize > half {
                return None;
            }
            b.to_vec_padded(half).ok().map(Zeroizing::new)
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
    /// BoringSSL failure.
    pub(crate) fn rsa_encode(&self, op: &Operation) -> Result<Zeroizing<Vec<u8>>, SignError> {
        let Holder::Local { typed: Typed::Rsa(rsa), .. } = &self.holder else {
            return Err(SignError::DecryptNeedsRsa(self.kind));
        };
        let k = rsa.size() as usize;
        let (alg, input, prehashed) = match op {
            Operation::DecryptRaw { ciphertext } => {
                let n = rsa.n().to_vec_padded(k).map_err(SignError::crypto)?;
                // Big-endian, equal lengths: lexicographic order is numeric.
                if ciphertext.len() != k || ciphertext.as_slice() >= n.as_slice() {
                    return Err(SignError::Crypto("the ciphertext is not smaller than the modulus".into()));
                }
                return Ok(Zeroizing::new(ciphertext.clone()));
            }
            Operation::Sign { alg, input: Input::Message(m) } => (*alg, m, false),
            Operation::Sign { alg, input: Input::Digest(d) } => (*alg, d, true),
        };
        let Some(hash) = alg.hash() else { return Err(SignError::KeyMismatch { alg, key: self.kind }) };
        let digest = digest_of(hash, input, prehashed)?;
        let digest = &digest[..];
        let mut em = Zeroizing::new(vec![0u8; k]);
        match alg.family() {
            Family::RsaPkcs1 => {
                let t = pkcs1_digest_info(hash, digest)?;
                // EM = 00 01 FF..FF 00 T, with at least 8 bytes of FF.
                if t.len() + 11 > k {
                    return Err(SignError::Crypto("the modulus is too short for this digest".into()));
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
                    boring_sys::RSA_padding_add_PKCS1_PSS_mgf1(
                        rsa.as_ptr(),
                        em.as_mut_ptr(),
                        digest.as_ptr(),
                        md.as_ptr(),
                        std::ptr::null(),
                        -1,
                    )
                };
                if ok != 1 {
                    return Err(SignError::crypto(ErrorStack::get()));
                }
            }
            _ => return Err(SignError::KeyMismatch { alg, key: self.kind }),
        }
        Ok(em)
    }

    /// Whether `result` is the private-key operation's answer for `em`:
    /// `result^e mod n == em`. A device's result is checked this way
    /// before it is used, as BoringSSL checks its own CRT results: a
    /// faulty CRT signature reveals the key's factors (Boneh, DeMillo and
    /// Lipton; Lenstra).
    pub(crate) fn rsa_result_matches(&self, em: &[u8], result: &[u8]) -> bool {
        let Holder::Local { typed: Typed::Rsa(rsa), .. } = &self.holder else { return false };
        let k = rsa.size() as usize;
        if result.len() != k || em.len() != k {
            return false;
        }
        let mut back = Zeroizing::new(vec![0u8; k]);
        match rsa.public_encrypt(result, &mut back, Padding::NONE) {
            Ok(n) if n == k => boring::memcmp::eq(&back, em),
            _ => false,
        }
    }
}

/// The DigestInfo-prefixed digest RSASSA-PKCS1-v1_5 signs (the bare 36
/// bytes for MD5+SHA-1).
#[cfg(feature = "qat")]
fn pkcs1_digest_info(hash: Hash, digest: &[u8]) -> Result<Zeroizing<Vec<u8>>, SignError> {
    let mut out: *mut u8 = std::ptr::null_mut();
    let mut out_len: usize = 0;
    let mut alloced: std::os::raw::c_int = 0;
    // SAFETY: the out-pointers point at live locals; `digest` is passed
    // with its length. On success `out` points at `out_len` bytes, which
    // BoringSSL allocated when `alloced` is set (freed below) and which
    // otherwise alias `digest`.
    let ok = unsafe {
        boring_sys::RSA_add_pkcs1_prefix(
            &mut out,
            &mut out_len,
            &mut alloced,
            hash.nid().as_raw(),
            digest.as_ptr(),
            digest.len(),
        )
    };
    if ok != 1 {
        return Err(SignError::crypto(ErrorStack::get()));
    }
    // SAFETY: see above: `out` is valid for `out_len` bytes until freed.
    let t = Zeroizing::new(unsafe { std::slice::from_raw_parts(out, out_len) }.to_vec());
    if alloced != 0 {
        // SAFETY: BoringSSL allocated `out` with OPENSSL_malloc and hands
        // it to us; it is freed once, after the copy above.
        unsafe { boring_sys::OPENSSL_free(out.cast()) };
    }
    Ok(t)
}

/// The digest to sign: `input` itself when the caller hashed it, else its
/// hash.
fn digest_of(hash: Hash, input: &[u8], prehashed: bool) -> Result<std::borrow::Cow<'_, [u8]>, SignError> {
    Ok(if prehashed { std::borrow::Cow::Borrowed(input) } else { std::borrow::Cow::Owned(hash.digest(input)?) })
}

/// The hash RSA-PSS uses for both the message and MGF1.
fn pss_digest(hash: Hash) -> Result<boring::hash::MessageDigest, SignError> {
    hash.message_digest().ok_or_else(|| SignError::Crypto("RSA-PSS is not defined over MD5+SHA-1".into()))
}

/// RSASSA-PKCS1-v1_5 over a digest. The safe `boring` API signs messages
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
    let ok = unsafe {
        boring_sys::RSA_sign(
            hash.nid().as_raw(),
            digest.as_ptr(),
            digest.len(),
            out.as_mut_ptr(),
            &mut out_len,
            rsa.as_ptr(),
        )
    };
    if ok != 1 {
        return Err(SignError::crypto(ErrorStack::get()));
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
        boring_sys::RSA_sign_pss_mgf1(
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
        return Err(SignError::crypto(ErrorStack::get()));
    }
    out.truncate(out_len);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use boring::sign::{RsaPssSaltlen, Verifier};

    fn verify(key: &PrivateKey, alg: Algorithm, msg: &[u8], sig: &[u8]) -> bool {
        let public = PKey::public_key_from_der(&key.public_key_der().unwrap()).unwrap();
        let mut v = match alg.hash().and_then(Hash::message_digest) {
            Some(md) => Verifier::new(md, &public).unwrap(),
            None => Verifier::new_without_digest(&public).unwrap(),
        };
        if alg.family() == Family::RsaPss {
            v.set_rsa_padding(Padding::PKCS1_PSS).unwrap();
            v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).unwrap();
        }
        v.verify_oneshot(sig, msg).unwrap_or(false)
    }

    #[test]
    fn every_algorithm_signs_and_verifies_by_message_and_digest() {
        let rsa = PrivateKey::generate(KeyKind::Rsa { bits: 2048 }).unwrap();
        let p256 = PrivateKey::generate(KeyKind::EcP256).unwrap();
        let p384 = PrivateKey::generate(KeyKind::EcP384).unwrap();
        let ed = PrivateKey::generate(KeyKind::Ed25519).unwrap();
        let msg = b"keyfence signs this";
        for alg in Algorithm::ALL {
            let key = [&rsa, &p256, &p384, &ed].into_iter().find(|k| k.kind().supports(alg)).unwrap();
            let sig = key.sign(alg, msg).unwrap();
            assert!(sig.len() <= key.kind().max_output_len(), "{alg}");
            if alg != Algorithm::RsaPkcs1Md5Sha1 {
                assert!(verify(key, alg, msg, &sig), "{alg} does not verify");
                assert!(!verify(key, alg, b"another message", &sig), "{alg} verifies the wrong message");
            }
            match alg.hash() {
                Some(h) => {
                    let by_digest = key.sign_digest(alg, &h.digest(msg).unwrap()).unwrap();
                    if alg.family() == Family::RsaPkcs1 {
                        // Deterministic: the two paths must agree exactly.
                        assert_eq!(by_digest, sig, "{alg}");
                    } else if alg != Algorithm::RsaPkcs1Md5Sha1 {
                        assert!(verify(key, alg, msg, &by_digest), "{alg} by digest");
                    }
                }
                None => assert_eq!(key.sign_digest(alg, &[0; 32]).unwrap_err(), SignError::DigestNotSupported(alg)),
            }
        }
    }

    #[test]
    fn md5_sha1_signature_is_raw_pkcs1_over_the_36_bytes() {
        let rsa = PrivateKey::generate(KeyKind::Rsa { bits: 2048 }).unwrap();
        let sig = rsa.sign(Algorithm::RsaPkcs1Md5Sha1, b"tls 1.0").unwrap();
        let public = Rsa::public_key_from_der(&rsa.public_key_der().unwrap()).unwrap();
        let mut out = vec![0; 256];
        let n = public.public_decrypt(&sig, &mut out, Padding::PKCS1).unwrap();
        assert_eq!(&out[..n], &Hash::Md5Sha1.digest(b"tls 1.0").unwrap()[..]);
    }

    #[test]
    fn wrong_key_and_bad_lengths_are_typed_errors() {
        let p256 = PrivateKey::generate(KeyKind::EcP256).unwrap();
        assert!(matches!(p256.sign(Algorithm::EcdsaP384Sha384, b"x"), Err(SignError::KeyMismatch { .. })));
        assert!(matches!(p256.sign(Algorithm::RsaPssSha256, b"x"), Err(SignError::KeyMismatch { .. })));
        assert!(matches!(
            p256.sign_digest(Algorithm::EcdsaP256Sha256, &[0; 31]),
            Err(SignError::DigestLength { expected: 32, got: 31, .. })
        ));
        assert_eq!(p256.decrypt_raw(&[0; 256]).unwrap_err(), SignError::DecryptNeedsRsa(KeyKind::EcP256));
        let rsa = PrivateKey::generate(KeyKind::Rsa { bits: 2048 }).unwrap();
        assert!(matches!(rsa.decrypt_raw(&[1; 255]), Err(SignError::CiphertextLength { expected: 256, got: 255 })));
        // Not smaller than the modulus: BoringSSL refuses, no panic.
        assert!(matches!(rsa.decrypt_raw(&[0xff; 256]), Err(SignError::Crypto(_))));
    }

    #[test]
    fn loading_rejects_garbage_and_unsupported_keys_and_debug_hides_the_key() {
        assert_eq!(PrivateKey::from_bytes(b"").unwrap_err(), KeyError::Parse);
        assert_eq!(
            PrivateKey::from_bytes(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").unwrap_err(),
            KeyError::Parse
        );
        assert_eq!(PrivateKey::from_der(&[0x30, 0x03, 0x02, 0x01]).unwrap_err(), KeyError::Parse);
        assert_eq!(PrivateKey::from_ed25519_seed(&[0; 31]).unwrap_err(), KeyError::Ed25519Length(31));
        assert_eq!(PrivateKey::generate(KeyKind::Rsa { bits: 1024 }).unwrap_err(), KeyError::RsaSize(1024));
        let small = PKey::from_rsa(Rsa::generate(1024).unwrap()).unwrap();
        assert_eq!(PrivateKey::from_der(&small.private_key_to_der().unwrap()).unwrap_err(), KeyError::RsaSize(1024));
        let p521 = EcKey::generate(&EcGroup::from_curve_name(Nid::SECP521R1).unwrap()).unwrap();
        assert!(matches!(PrivateKey::from_pem(&p521.private_key_to_pem().unwrap()), Err(KeyError::Curve(_))));

        let ed = PrivateKey::from_ed25519_seed(&[7; 32]).unwrap();
        let shown = format!("{ed:?}");
        assert_eq!(shown, "PrivateKey { kind: Ed25519, .. }");
    }

    #[test]
    fn loads_every_encoding() {
        let rsa = Rsa::generate(2048).unwrap();
        let ec = EcKey::generate(&EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap()).unwrap();
        let ed = PKey::generate(Id::ED25519).unwrap();
        let rsa_pkey = PKey::from_rsa(rsa.clone()).unwrap();
        let ec_pkey = PKey::from_ec_key(ec.clone()).unwrap();
        let cases: Vec<(Vec<u8>, KeyKind)> = vec![
            (rsa.private_key_to_pem().unwrap(), KeyKind::Rsa { bits: 2048 }), // PKCS#1 PEM
            (rsa.private_key_to_der().unwrap(), KeyKind::Rsa { bits: 2048 }), // PKCS#1 DER
            (rsa_pkey.private_key_to_pem_pkcs8().unwrap(), KeyKind::Rsa { bits: 2048 }),
            (rsa_pkey.private_key_to_der_pkcs8().unwrap(), KeyKind::Rsa { bits: 2048 }),
            (ec.private_key_to_pem().unwrap(), KeyKind::EcP256), // SEC1 PEM
            (ec.private_key_to_der().unwrap(), KeyKind::EcP256), // SEC1 DER
            (ec_pkey.private_key_to_pem_pkcs8().unwrap(), KeyKind::EcP256),
            (ec_pkey.private_key_to_der_pkcs8().unwrap(), KeyKind::EcP256),
            (ed.private_key_to_pem_pkcs8().unwrap(), KeyKind::Ed25519),
            (ed.private_key_to_der_pkcs8().unwrap(), KeyKind::Ed25519),
        ];
        for (bytes, kind) in cases {
            let key = PrivateKey::from_bytes(&bytes).unwrap();
            assert_eq!(key.kind(), kind);
        }
    }
}
