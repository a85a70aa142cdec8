//! Per-algorithm routing: which operations go to the offload device and
//! which stay in software.

use std::fmt;
use std::str::FromStr;

use crate::sign::types::{KeyKind, Operation, SignError};

/// Where an operation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// On the offload device (if there is one and it does the operation;
    /// otherwise in software).
    Device,
    /// In process, with AWS-LC, on the engine's RSA or EC executor.
    Software,
}

impl Route {
    /// `device` or `software`.
    pub fn name(self) -> &'static str {
        match self {
            Route::Device => "device",
            Route::Software => "software",
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Route {
    type Err = SignError;

    /// Parses `device` or `software`.
    ///
    /// # Errors
    /// [`SignError::Config`] for anything else.
    fn from_str(s: &str) -> Result<Self, SignError> {
        match s {
            "device" => Ok(Route::Device),
            "software" => Ok(Route::Software),
            other => Err(SignError::Config(format!("unknown offload route `{other}`; expected device or software"))),
        }
    }
}

/// Which operations go to the device, per algorithm family.
///
/// The default sends RSA (signatures and raw decryption, a millisecond or
/// more of CPU each) to the device and keeps ECDSA and Ed25519 in software:
/// a P-256 signature takes tens of microseconds on a CPU, about what a
/// round trip to an accelerator costs, and QAT does not sign with Ed25519
/// at all.
///
/// ```
/// use keyfence::sign::KeyKind;
/// use keyfence::sign::offload::{Route, Routing};
/// let mut routing = Routing::default();
/// assert_eq!(routing.rsa_sign, Route::Device);
/// routing.ecdsa_p256 = Route::Device;
/// assert_eq!(routing.for_kind(KeyKind::EcP256, false), Route::Device);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Routing {
    /// RSA PKCS#1 v1.5 and PSS signatures. Default [`Route::Device`].
    pub rsa_sign: Route,
    /// Raw RSA decryption (TLS RSA key exchange). Default
    /// [`Route::Device`].
    pub rsa_decrypt: Route,
    /// ECDSA on P-256. Default [`Route::Software`].
    pub ecdsa_p256: Route,
    /// ECDSA on P-384. Default [`Route::Software`].
    pub ecdsa_p384: Route,
    /// Ed25519. Default [`Route::Software`].
    pub ed25519: Route,
}

impl Default for Routing {
    fn default() -> Self {
        Routing {
            rsa_sign: Route::Device,
            rsa_decrypt: Route::Device,
            ecdsa_p256: Route::Software,
            ecdsa_p384: Route::Software,
            ed25519: Route::Software,
        }
    }
}

impl Routing {
    /// Every family on `route`.
    pub fn all(route: Route) -> Self {
        Routing { rsa_sign: route, rsa_decrypt: route, ecdsa_p256: route, ecdsa_p384: route, ed25519: route }
    }

    /// The route of a key of `kind`; `decrypt` selects RSA decryption
    /// rather than RSA signing (it is ignored for other kinds).
    pub fn for_kind(&self, kind: KeyKind, decrypt: bool) -> Route {
        match kind {
            KeyKind::Rsa { .. } if decrypt => self.rsa_decrypt,
            KeyKind::Rsa { .. } => self.rsa_sign,
            KeyKind::EcP256 => self.ecdsa_p256,
            KeyKind::EcP384 => self.ecdsa_p384,
            KeyKind::Ed25519 => self.ed25519,
        }
    }

    /// The route of `op` with a key of `kind`.
    pub fn route(&self, kind: KeyKind, op: &Operation) -> Route {
        self.for_kind(kind, matches!(op, Operation::DecryptRaw { .. }))
    }
}
