//! Keys that never leave a PKCS#11 token: an HSM, a TPM, a cloud KMS's
//! PKCS#11 library, or SoftHSM2.
//!
//! A key is named by an RFC 7512 URI ([`Pkcs11Uri`]):
//! `pkcs11:token=edge;object=tls-p256;type=private?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/etc/keyfence/pin`.
//! [`load`] finds the token and the private key object, reads the public
//! key from the token (an RSA key's modulus, an EC or Ed25519 key's public
//! object beside it), checks with one signature that the two match, and
//! gives a [`PrivateKey`] whose operations the token performs: the secret
//! is never read out, and a non-extractable, sensitive key works as well
//! as any.
//!
//! - The module is loaded once per process (dlopen through the Parsec
//!   project's `cryptoki`), the token opened once: every key on it shares
//!   one pool of sessions and one login.
//! - Token keys run on the engine's [`OpClass::Token`](super::OpClass::Token)
//!   executor: a PKCS#11 call blocks its thread, so token keys have threads
//!   of their own, with the same queue bound, deadline and metrics as the
//!   other classes.
//! - Algorithms: ECDSA P-256/P-384 (`CKM_ECDSA` over the digest the engine
//!   computes, DER-encoded), RSA PKCS#1 v1.5 (`CKM_RSA_PKCS` over a
//!   `DigestInfo`) and PSS (`CKM_RSA_PKCS_PSS`, MGF1 with the same hash, a
//!   salt as long as the hash), raw RSA decryption (`CKM_RSA_X_509`), and
//!   Ed25519 (`CKM_EDDSA`).
//! - After `CKR_SESSION_HANDLE_INVALID`, `CKR_DEVICE_REMOVED` and the like,
//!   every session is dropped, the token logged into again, the key found
//!   again and the operation retried once; a token still gone fails with
//!   `TOKEN_UNAVAILABLE`. A refused PIN fails with `TOKEN_LOGIN` and is
//!   never tried again (that would lock the token): the refusal is
//!   remembered for the process (module, token, PIN source and a keyed
//!   digest of the PIN), not with the token's keys, and every later load
//!   with that PIN fails at once until the PIN file or variable changes.
//! - With [`Pkcs11Settings::fixed`] (an agent answering its clients),
//!   errors name neither the module's path nor the PIN file's, nor any
//!   token but the one the URI selects.
//! - The PIN comes from the URI's `pin-source` file, or
//!   `KEYFENCE_PKCS11_PIN_FILE`, or `KEYFENCE_PKCS11_PIN`; never from the
//!   URI itself. The module from `module-path`, `module-name` (p11-kit's
//!   configuration) or `KEYFENCE_PKCS11_MODULE`.
//!
//! With a key process or an agent, the URI is sent there and only that
//! process loads the module and reads the PIN
//! ([`KeySource::Pkcs11`](super::key_process::KeySource::Pkcs11)).
//! `docs/pkcs11.md` is the operator's page.

// One job a file: `uri` reads RFC 7512 URIs; `settings` says where the
// module and the PIN come from; `registry` holds the modules and tokens this
// process has open; `token` is a token and its keys (the `KeyHolder`) and
// loads a key, with the rest of the token's methods in `session` (its pool
// of sessions) and `login` (logging in, and the memory of refused PINs);
// `mechanism` says how each operation is asked of the token, `public_key`
// reads a key's public half, and `der` is the DER both write by hand;
// `keygen` generates a key pair; `bench` is the benchmark's floor.
#[cfg(feature = "bench")]
mod bench;
pub(crate) mod der;
mod keygen;
mod login;
mod mechanism;
mod public_key;
mod registry;
mod session;
mod settings;
mod token;
mod uri;

#[cfg(feature = "bench")]
pub use bench::direct_sign_loop;
pub use settings::Pkcs11Settings;
pub use uri::{ObjectType, Pkcs11Uri, UriError};

use super::private_key::PrivateKey;
use super::types::{KeyKind, SignError};

/// Loads the key `uri` names, with the module and PIN from the URI or,
/// where it says nothing, from `settings`.
///
/// ```no_run
/// use keyfence::sign::pkcs11::{self, Pkcs11Settings};
/// use keyfence::sign::Algorithm;
/// let key = pkcs11::load("pkcs11:token=edge;object=tls-p256?pin-source=file:/etc/keyfence/pin", &Pkcs11Settings::from_env())?;
/// let signature = key.sign(Algorithm::EcdsaP256Sha256, b"hello")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`SignError::InvalidArgument`] for a URI that does not parse (its
/// position) or names no key, an unreadable PIN file, or (with
/// [`Pkcs11Settings::fixed`]) a module or PIN file other than the fixed
/// ones; [`SignError::Config`] for a module that cannot be found, loaded
/// or initialized; [`SignError::Token`] for no such token or key
/// (`INVALID_PRIVATE_KEY`), a refused or missing PIN (`TOKEN_LOGIN`; a PIN
/// this process had refused before is not sent to the token again until
/// it changes), or a token that does not answer (`TOKEN_UNAVAILABLE`).
pub fn load(uri: &str, settings: &Pkcs11Settings) -> Result<PrivateKey, SignError> {
    let parsed = Pkcs11Uri::parse(uri).map_err(|e| SignError::InvalidArgument(e.to_string()))?;
    token::load(&parsed, settings)
}

/// What a process that hands `uri` to a key process can check without
/// loading anything, so a mistake has the code it has in process: the URI
/// parses (`INVALID_ARGUMENT`), and, unless an agent with modules of its
/// own loads it (`own_module` false), names a module file that exists
/// (`INVALID_CONFIG`).
pub(crate) fn precheck(uri: &str, own_module: bool) -> Result<(), SignError> {
    let parsed = Pkcs11Uri::parse(uri).map_err(|e| SignError::InvalidArgument(e.to_string()))?;
    if own_module {
        settings::module_exists(&parsed, &Pkcs11Settings::from_env())?;
    }
    Ok(())
}

/// Generates a key pair of `kind` on the token `uri` names, labelled with
/// the URI's `object` (and `id`, if given): a private key that is
/// sensitive, not extractable and may sign (RSA: and decrypt), and its
/// public key. What `keyfence pkcs11 keygen` runs; returns the public key
/// (DER `SubjectPublicKeyInfo`).
///
/// # Errors
/// As [`load`]; [`SignError::InvalidArgument`] when a key with that label
/// or id exists already; [`SignError::Token`] (`BACKEND_FAILED`) when the
/// token refuses to generate.
pub fn generate(uri: &str, kind: KeyKind, settings: &Pkcs11Settings) -> Result<Vec<u8>, SignError> {
    let parsed = Pkcs11Uri::parse(uri).map_err(|e| SignError::InvalidArgument(e.to_string()))?;
    keygen::generate(&parsed, kind, settings)?;
    load(uri, settings)?.public_key_der()
}
