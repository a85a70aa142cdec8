//! Signature algorithms: names, TLS SignatureScheme code points, digest
//! names and lengths. Hashing itself is AWS-LC's, one layer up
//! ([`Hash::digest`] is implemented beside the local key), so that this
//! layer builds without it.

use std::fmt;
use std::str::FromStr;

/// The hash an algorithm signs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hash {
    /// MD5 followed by SHA-1 (36 bytes), the digest TLS 1.0 and 1.1 sign
    /// with RSA. Only for those protocol versions.
    Md5Sha1,
    /// SHA-256.
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
}

impl Hash {
    /// The digest length in bytes.
    pub fn len(self) -> usize {
        match self {
            Hash::Md5Sha1 => 36,
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    /// Never true: every digest has bytes (clippy's `len` companion).
    pub fn is_empty(self) -> bool {
        false
    }
}

/// A signature algorithm keyfence signs with.
///
/// Each has a command-line name ([`Algorithm::name`], parsed by `FromStr`)
/// and a TLS SignatureScheme code point ([`Algorithm::tls_code`],
/// [`Algorithm::from_tls_code`]). ECDSA algorithms are bound to their curve
/// as in TLS 1.3; signatures are DER `ECDSA-Sig-Value`, RSA-PSS uses MGF1
/// with the same hash and a salt as long as the hash (what TLS requires).
///
/// ```
/// use keyfence::sign::Algorithm;
/// let alg: Algorithm = "ecdsa-p256-sha256".parse().unwrap();
/// assert_eq!(alg.tls_code(), 0x0403);
/// assert_eq!(Algorithm::from_tls_code(0x0804).unwrap(), Algorithm::RsaPssSha256);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// RSASSA-PKCS1-v1_5 over MD5+SHA-1 without a DigestInfo (TLS 1.0/1.1).
    RsaPkcs1Md5Sha1,
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    RsaPkcs1Sha256,
    /// RSASSA-PKCS1-v1_5 with SHA-384.
    RsaPkcs1Sha384,
    /// RSASSA-PKCS1-v1_5 with SHA-512.
    RsaPkcs1Sha512,
    /// RSASSA-PSS, SHA-256, MGF1-SHA-256, 32-byte salt.
    RsaPssSha256,
    /// RSASSA-PSS, SHA-384, MGF1-SHA-384, 48-byte salt.
    RsaPssSha384,
    /// RSASSA-PSS, SHA-512, MGF1-SHA-512, 64-byte salt.
    RsaPssSha512,
    /// ECDSA on P-256 with SHA-256, DER signature.
    EcdsaP256Sha256,
    /// ECDSA on P-384 with SHA-384, DER signature.
    EcdsaP384Sha384,
    /// Ed25519 (pure, RFC 8032).
    Ed25519,
}

/// Families of algorithms, for matching against key kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    // The variants name themselves.
    #[allow(missing_docs)]
    RsaPkcs1,
    RsaPss,
    EcdsaP256,
    EcdsaP384,
    Ed25519,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 10] = [
        Algorithm::RsaPkcs1Md5Sha1,
        Algorithm::RsaPkcs1Sha256,
        Algorithm::RsaPkcs1Sha384,
        Algorithm::RsaPkcs1Sha512,
        Algorithm::RsaPssSha256,
        Algorithm::RsaPssSha384,
        Algorithm::RsaPssSha512,
        Algorithm::EcdsaP256Sha256,
        Algorithm::EcdsaP384Sha384,
        Algorithm::Ed25519,
    ];

    /// The command-line name, e.g. `rsa-pss-sha256`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::RsaPkcs1Md5Sha1 => "rsa-pkcs1-md5-sha1",
            Algorithm::RsaPkcs1Sha256 => "rsa-pkcs1-sha256",
            Algorithm::RsaPkcs1Sha384 => "rsa-pkcs1-sha384",
            Algorithm::RsaPkcs1Sha512 => "rsa-pkcs1-sha512",
            Algorithm::RsaPssSha256 => "rsa-pss-sha256",
            Algorithm::RsaPssSha384 => "rsa-pss-sha384",
            Algorithm::RsaPssSha512 => "rsa-pss-sha512",
            Algorithm::EcdsaP256Sha256 => "ecdsa-p256-sha256",
            Algorithm::EcdsaP384Sha384 => "ecdsa-p384-sha384",
            Algorithm::Ed25519 => "ed25519",
        }
    }

    /// The TLS SignatureScheme code point (RFC 8446 section 4.2.3). The
    /// MD5+SHA-1 algorithm has no IANA code; BoringSSL uses the private
    /// value `0xff01` for it, and so does keyfence.
    pub fn tls_code(self) -> u16 {
        match self {
            Algorithm::RsaPkcs1Md5Sha1 => 0xff01,
            Algorithm::RsaPkcs1Sha256 => 0x0401,
            Algorithm::RsaPkcs1Sha384 => 0x0501,
            Algorithm::RsaPkcs1Sha512 => 0x0601,
            Algorithm::RsaPssSha256 => 0x0804,
            Algorithm::RsaPssSha384 => 0x0805,
            Algorithm::RsaPssSha512 => 0x0806,
            Algorithm::EcdsaP256Sha256 => 0x0403,
            Algorithm::EcdsaP384Sha384 => 0x0503,
            Algorithm::Ed25519 => 0x0807,
        }
    }

    /// The algorithm for a TLS SignatureScheme code point.
    ///
    /// # Errors
    /// [`AlgorithmError::UnknownTlsScheme`] (which converts into
    /// [`SignError::UnknownTlsScheme`](super::SignError::UnknownTlsScheme))
    /// for code points keyfence does not sign with (SHA-1, RSA-PSS with PSS
    /// keys, P-521, ...).
    pub fn from_tls_code(code: u16) -> Result<Self, AlgorithmError> {
        Algorithm::ALL.into_iter().find(|a| a.tls_code() == code).ok_or(AlgorithmError::UnknownTlsScheme(code))
    }

    /// The hash, or `None` for Ed25519 (which hashes internally and cannot
    /// sign a digest).
    pub fn hash(self) -> Option<Hash> {
        match self {
            Algorithm::RsaPkcs1Md5Sha1 => Some(Hash::Md5Sha1),
            Algorithm::RsaPkcs1Sha256 | Algorithm::RsaPssSha256 | Algorithm::EcdsaP256Sha256 => Some(Hash::Sha256),
            Algorithm::RsaPkcs1Sha384 | Algorithm::RsaPssSha384 | Algorithm::EcdsaP384Sha384 => Some(Hash::Sha384),
            Algorithm::RsaPkcs1Sha512 | Algorithm::RsaPssSha512 => Some(Hash::Sha512),
            Algorithm::Ed25519 => None,
        }
    }

    pub(crate) fn family(self) -> Family {
        match self {
            Algorithm::RsaPkcs1Md5Sha1 | Algorithm::RsaPkcs1Sha256 | Algorithm::RsaPkcs1Sha384 | Algorithm::RsaPkcs1Sha512 => {
                Family::RsaPkcs1
            }
            Algorithm::RsaPssSha256 | Algorithm::RsaPssSha384 | Algorithm::RsaPssSha512 => Family::RsaPss,
            Algorithm::EcdsaP256Sha256 => Family::EcdsaP256,
            Algorithm::EcdsaP384Sha384 => Family::EcdsaP384,
            Algorithm::Ed25519 => Family::Ed25519,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An algorithm name or TLS code point keyfence does not sign with. It
/// converts into the matching [`SignError`](super::SignError) variant, so
/// `?` works in functions returning that.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AlgorithmError {
    /// A name that is not one of [`Algorithm::ALL`]'s names (at most 64
    /// characters of it are kept).
    #[error("unknown signature algorithm `{0}`; known: rsa-pkcs1-sha256, rsa-pkcs1-sha384, rsa-pkcs1-sha512, rsa-pkcs1-md5-sha1, rsa-pss-sha256, rsa-pss-sha384, rsa-pss-sha512, ecdsa-p256-sha256, ecdsa-p384-sha384, ed25519")]
    UnknownName(String),
    /// A TLS SignatureScheme code point keyfence does not sign with.
    #[error("unsupported TLS signature scheme {0:#06x}")]
    UnknownTlsScheme(u16),
}

impl FromStr for Algorithm {
    type Err = AlgorithmError;

    /// Parses a command-line name ([`Algorithm::name`]), ASCII
    /// case-insensitively.
    fn from_str(s: &str) -> Result<Self, AlgorithmError> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| AlgorithmError::UnknownName(s.chars().take(64).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::types::SignError;

    #[test]
    fn names_and_codes_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
            assert_eq!(Algorithm::from_tls_code(a.tls_code()).unwrap(), a);
        }
        assert_eq!("RSA-PSS-SHA256".parse::<Algorithm>().unwrap(), Algorithm::RsaPssSha256);
        assert!(matches!("rsa-sha1".parse::<Algorithm>().map_err(SignError::from), Err(SignError::UnknownAlgorithm(_))));
        // rsa_pkcs1_sha1 and ecdsa_secp521r1_sha512 are not signed with.
        assert_eq!(Algorithm::from_tls_code(0x0201).map_err(SignError::from), Err(SignError::UnknownTlsScheme(0x0201)));
        assert_eq!(Algorithm::from_tls_code(0x0603).map_err(SignError::from), Err(SignError::UnknownTlsScheme(0x0603)));
    }
}
