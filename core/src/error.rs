//! Stable error codes: the one table every binding maps.
//!
//! The codes are declared once, below, through `error_codes!`: number,
//! name and documentation. That declaration is the [`ErrorCode`] enum, its
//! [`ALL`](ErrorCode::ALL) list and lookups, and the source of every other
//! list of the codes, each generated from it by a test that fails when the
//! checked-in copy is stale: the C header's `keyfence_result`
//! (`bindings/c/tests/header.rs`), Python's numbers of the codes and the
//! table of `docs/errors.md` (`core/tests/error_codes_generated.rs`).
//!
//! Every error type of the library answers [`Coded::code`] with its code,
//! and bindings go through that trait: the C ABI returns the number as
//! `keyfence_result`, Python raises the exception class named for it, Node
//! sets `err.code` to its [`name`](ErrorCode::name).
//!
//! Numbers are allocated in blocks of 100 per area and never reused: a code
//! that is retired stays reserved here as a comment. New codes go at the end
//! of their block.

use std::fmt;

use keyfence_policy::{AttributesError, ParseError};

/// Declares the error codes: the enum with its documentation, [`ALL`],
/// `name()`, `doc()` and the lookups. Each entry is a variant's doc comment
/// (a summary paragraph, then details), `Variant = number => "NAME"`; the
/// numbers must be in increasing order (a test checks it).
///
/// [`ALL`]: ErrorCode::ALL
macro_rules! error_codes {
    (
        $(#[$attr:meta])*
        pub enum $enum:ident {
            $( $(#[doc = $doc:literal])+ $code:ident = $number:literal => $name:literal, )+
        }
    ) => {
        $(#[$attr])*
        #[repr(u32)]
        #[non_exhaustive]
        pub enum $enum {
            $( $(#[doc = $doc])+ $code = $number, )+
        }

        impl $enum {
            /// Every code, in numeric order.
            pub const ALL: &'static [$enum] = &[$($enum::$code),+];

            /// The code's stable name, `SCREAMING_SNAKE_CASE`: Node's `err.code`,
            /// the C `KEYFENCE_` constant without its prefix.
            pub fn name(self) -> &'static str {
                match self {
                    $($enum::$code => $name,)+
                }
            }

            /// The code's documentation, its doc comment above: the lines as
            /// written there, a blank line between paragraphs. The first
            /// paragraph is the summary (the C header's comment on the
            /// constant); `docs/errors.md` shows all of it.
            pub fn doc(self) -> &'static str {
                match self {
                    $($enum::$code => {
                        const RAW: &str = concat!($($doc, "\n"),+);
                        const TEXT: [u8; unindented_len(RAW)] = unindent(RAW);
                        const DOC: &str = match std::str::from_utf8(&TEXT) {
                            Ok(doc) => doc,
                            Err(_) => panic!("removing ASCII spaces keeps UTF-8 valid"),
                        };
                        DOC
                    })+
                }
            }

            /// The code with this number, if there is one.
            pub fn from_u32(n: u32) -> Option<$enum> {
                match n {
                    $($number => Some($enum::$code),)+
                    _ => None,
                }
            }
        }
    };
}

// A `///` line reaches a macro as `#[doc = " line"]`: the two functions
// below take the space after `///` off each line, and the newline off the
// end, at compile time, so that `doc()` is a `&'static str` as written.

/// The length of `raw` (doc lines, each ended by a newline) without the
/// first space of each line and without its last newline.
const fn unindented_len(raw: &str) -> usize {
    let raw = raw.as_bytes();
    let (mut i, mut n, mut line_start) = (0, 0, true);
    while i < raw.len() {
        if !(line_start && raw[i] == b' ') {
            n += 1;
        }
        line_start = raw[i] == b'\n';
        i += 1;
    }
    n - 1
}

/// `raw` without the first space of each line, cut to `N` bytes (which
/// [`unindented_len`] says, so that the last newline is left off).
const fn unindent<const N: usize>(raw: &str) -> [u8; N] {
    let raw = raw.as_bytes();
    let mut out = [0; N];
    let (mut i, mut n, mut line_start) = (0, 0, true);
    while n < N {
        if !(line_start && raw[i] == b' ') {
            out[n] = raw[i];
            n += 1;
        }
        line_start = raw[i] == b'\n';
        i += 1;
    }
    out
}

error_codes! {
    /// A stable, documented error code.
    ///
    /// ```
    /// use keyfence::{Coded, ErrorCode};
    /// let err = keyfence::policy::parse("country: US)").unwrap_err();
    /// let code = Coded::code(&err);
    /// assert_eq!(code, ErrorCode::PolicySyntax);
    /// assert_eq!((code as u32, code.name()), (100, "POLICY_SYNTAX"));
    /// assert_eq!(ErrorCode::from_u32(100), Some(code));
    /// assert!(code.doc().starts_with("The policy text does not parse"));
    /// ```
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum ErrorCode {
        // 1-99: not specific to one area.

        /// An argument is unusable before any work starts: a NULL pointer
        /// across the C ABI, a value of the wrong type in a binding, text that
        /// is not UTF-8.
        ///
        /// Also a PKCS#11 URI that does not parse, carries a PIN (`pin-value`)
        /// or names a PIN file that cannot be read.
        InvalidArgument = 1 => "INVALID_ARGUMENT",
        /// An invariant of keyfence's own code did not hold: a bug, never the
        /// input's fault. Please report it.
        Internal = 2 => "INTERNAL",
        /// The operating system's random number generator failed.
        Rng = 3 => "RNG",
        /// A panic was caught at a binding boundary (a bug; reported instead of
        /// unwinding into the caller).
        Panic = 4 => "PANIC",
        /// The operating system refused a resource: a thread, a socket, a file.
        Io = 5 => "IO",

        // 100-199: the policy language.

        /// The policy text does not parse; the message has the byte position.
        ///
        /// The message also shows the policy with a caret under the mistake.
        PolicySyntax = 100 => "POLICY_SYNTAX",
        /// The policy parses but is too large for the ciphertext format, or
        /// nested too deeply.
        ///
        /// Too deep is more than 64 levels; too large, more than the ciphertext
        /// format's 16-bit policy field holds.
        PolicyTooLarge = 101 => "POLICY_TOO_LARGE",
        /// Attributes (`label=value,...`) that are malformed: no `=`, an empty
        /// label or value, a repeated label, text not in Unicode NFC.
        ///
        /// The syntax is in `docs/policy-language.md`, "Attributes".
        InvalidAttributes = 102 => "INVALID_ATTRIBUTES",

        // 200-299: CP-ABE.

        /// A ciphertext is malformed, was tampered with, or belongs to another
        /// authority; the message names the field at fault.
        ///
        /// A field is named as the CP-ABE ciphertext format names it, e.g.
        /// `c3[4]`.
        InvalidCiphertext = 200 => "INVALID_CIPHERTEXT",
        /// Bytes that do not decode as the key they are said to be (public key,
        /// master secret key, attribute key, machine key).
        InvalidKey = 201 => "INVALID_KEY",
        /// The key's attributes do not satisfy the policy.
        ///
        /// For an envelope, the machine's attributes.
        PolicyNotSatisfied = 202 => "POLICY_NOT_SATISFIED",
        /// A policy or attribute uses a label keyfence reserves.
        ///
        /// The labels are reserved for the Boneh-Katz transform.
        ReservedLabel = 203 => "RESERVED_LABEL",
        /// An object would pass a limit of its binary format (attribute too
        /// long, too many attributes, a field over its length prefix).
        ///
        /// For example an attribute over 65,535 bytes, an attribute block over
        /// the key format's 16-bit length, a secret too large for an envelope.
        LimitExceeded = 204 => "LIMIT_EXCEEDED",

        // 300-399: policy-key wrapping.

        /// An envelope or sealed policy key is malformed or failed its
        /// integrity check.
        InvalidEnvelope = 300 => "INVALID_ENVELOPE",
        /// The machine holds keys only for retired master generations.
        ///
        /// Issue it a new key.
        RetiredGeneration = 301 => "RETIRED_GENERATION",
        /// No sealed copy of the envelope's policy key is in the store for a
        /// generation the machine can use.
        ///
        /// Also a policy-key rotation that names a policy that has no key.
        UnknownPolicyKey = 302 => "UNKNOWN_POLICY_KEY",
        /// An algorithm identifier this version does not know.
        ///
        /// For example an HPKE suite in an object.
        UnknownAlgorithm = 303 => "UNKNOWN_ALGORITHM",
        /// The store holds no authority (run `authority init`).
        NoAuthority = 304 => "NO_AUTHORITY",
        /// The store already holds an authority.
        AuthorityExists = 305 => "AUTHORITY_EXISTS",
        /// The authority's state contradicts itself (a live generation without
        /// its master key, a policy key that is not there).
        ///
        /// Also an authority state or a replicated generation list that does
        /// not decode.
        InconsistentState = 306 => "INCONSISTENT_STATE",
        /// An envelope or sealed policy key was made by another authority than
        /// the one the machine key trusts (its signature names another key).
        ///
        /// See `docs/wrapping.md`, "Threat model".
        WrongAuthority = 307 => "WRONG_AUTHORITY",
        /// A store object the authority signed, but older than one the machine
        /// has already accepted (a generation list put back): the store was
        /// rolled back or replayed.
        ///
        /// The newest lists accepted count in this process and in later ones
        /// (they are kept beside the machine key, `KEY.newest`). Older is a
        /// generation list that lacks a generation, or says one is in an
        /// earlier state, than the newest list seen, or a list withheld after
        /// one was seen. Whoever can write the store put back an old list; the
        /// machine refuses it rather than treat a retired generation as live
        /// (`docs/wrapping.md`, "Threat model").
        ReplayedObject = 308 => "REPLAYED_OBJECT",
        /// The machine id is revoked: the authority refuses to issue it a key
        /// again, and a revoked machine cannot open the policy keys sealed
        /// since.
        ///
        /// Opening an envelope, a revoked machine finds its policy key sealed
        /// so that it cannot open it (`not machine: ID`; `docs/wrapping.md`,
        /// "Revocation").
        MachineRevoked = 309 => "MACHINE_REVOKED",

        // 400-499: the store.

        /// The store could not read or write an object.
        ///
        /// The message names it.
        StoreIo = 400 => "STORE_IO",
        /// A store object name that is not allowed.
        ///
        /// A name has only characters of `[A-Za-z0-9._-/]`, no empty part and
        /// no `..`.
        InvalidStoreKey = 401 => "INVALID_STORE_KEY",
        /// Another writer held the store's lock for longer than the wait.
        ///
        /// The writer is another process or handle; an authority waits 30 s.
        /// The message names its pid (unless the lock file has another name
        /// too: a `.lock` that is a hard link is locked but never written).
        /// Retry later.
        StoreLocked = 402 => "STORE_LOCKED",
        /// Another writer committed to the store between this writer's read and
        /// its commit (a replicated store's compare-and-swap failed); nothing
        /// of this commit was written. Re-run the operation.
        ///
        /// An etcd store's transaction compares the revisions it read, and one
        /// changed. Run again, the operation starts from the new state.
        StoreConflict = 403 => "STORE_CONFLICT",

        // 500-599: signing.

        /// The executor's queue is full: shed load or retry later.
        ///
        /// The operation was not accepted.
        Overloaded = 500 => "OVERLOADED",
        /// The operation's deadline passed.
        ///
        /// Its resources were released.
        TimedOut = 501 => "TIMED_OUT",
        /// The operation was cancelled.
        ///
        /// Through its handle, by dropping its future or by cancelling its task.
        Cancelled = 502 => "CANCELLED",
        /// The engine has shut down.
        ShutDown = 503 => "SHUT_DOWN",
        /// The private key could not be loaded: not a key, an unsupported type,
        /// size or curve, or inconsistent; a keyfence key file that does not
        /// parse; or a PKCS#11 URI whose token or key object is not there.
        ///
        /// The message names a key file's field at fault (the format is in
        /// `docs/openssl.md`), and the module's tokens when the URI's token is
        /// not there.
        InvalidPrivateKey = 504 => "INVALID_PRIVATE_KEY",
        /// The request does not fit the key: wrong algorithm family, a digest
        /// or ciphertext of the wrong length, an unknown algorithm name, another
        /// backend named for a key held by a key process.
        ///
        /// Also an input larger than a key process takes in one request (an
        /// Ed25519 message over 1 MiB).
        InvalidRequest = 505 => "INVALID_REQUEST",
        /// AWS-LC refused the operation.
        ///
        /// For raw RSA decryption, an input not below the modulus.
        CryptoFailed = 506 => "CRYPTO_FAILED",
        /// The backend that holds or runs the key failed (the isolated key
        /// process died, an offload device failed).
        BackendFailed = 507 => "BACKEND_FAILED",
        /// The engine's configuration is unusable.
        ///
        /// Also a PKCS#11 module that is not named, or cannot be found, loaded
        /// or initialized.
        InvalidConfig = 508 => "INVALID_CONFIG",
        /// A PKCS#11 token or its module is gone and did not come back after
        /// its sessions were opened again.
        ///
        /// Gone: the device removed, the module's service down, the token's
        /// files deleted; keyfence dropped its sessions, logged in again and
        /// retried the operation once. Retry later, or fail over to another
        /// signer.
        TokenUnavailable = 509 => "TOKEN_UNAVAILABLE",
        /// A PKCS#11 token needs a PIN none was given for, or refused the PIN.
        ///
        /// A PIN comes from `pin-source=file:...` in the URI,
        /// `KEYFENCE_PKCS11_PIN_FILE` or `KEYFENCE_PKCS11_PIN`. A refused PIN is
        /// never tried again, so keyfence cannot lock the token: fix the PIN
        /// file, then load the key again. The message never holds the PIN.
        TokenLogin = 510 => "TOKEN_LOGIN",
    }
}

impl ErrorCode {
    /// The code with this [`name`](ErrorCode::name), if there is one.
    pub fn from_name(name: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.name() == name)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error with a stable code: every error type the library returns.
///
/// The one mapping from errors to codes. A binding converts any `Coded`
/// error the same way (the C ABI, Node), so none covers a different set of
/// error types.
///
/// ```
/// use keyfence::{Coded, ErrorCode};
/// let err = keyfence::policy::parse("a: b or").unwrap_err();
/// // `ParseError::code` (the policy crate's own) names the code; this is the trait's.
/// assert_eq!((Coded::code(&err), err.policy_position()), (ErrorCode::PolicySyntax, Some(7)));
/// ```
pub trait Coded: std::error::Error {
    /// The stable code of this error (`docs/errors.md`).
    fn code(&self) -> ErrorCode;

    /// The byte offset in a policy text this error is about, for a policy
    /// that does not parse; bindings point at the mistake with it.
    fn policy_position(&self) -> Option<usize> {
        None
    }
}

/// The code of any [`Coded`] error, as `ErrorCode::from(&err)`.
impl<E: Coded + ?Sized> From<&E> for ErrorCode {
    fn from(e: &E) -> Self {
        e.code()
    }
}

impl Coded for ParseError {
    /// `POLICY_TOO_LARGE` or `POLICY_SYNTAX`, as the policy crate names
    /// them (it does not depend on this one).
    fn code(&self) -> ErrorCode {
        ErrorCode::from_name(ParseError::code(self)).unwrap_or(ErrorCode::Internal)
    }

    fn policy_position(&self) -> Option<usize> {
        Some(self.offset())
    }
}

impl Coded for AttributesError {
    fn code(&self) -> ErrorCode {
        ErrorCode::from_name(AttributesError::code(self)).unwrap_or(ErrorCode::Internal)
    }
}

/// `Coded` for error types that have their own `code()` (and, where a
/// policy can be at fault, `policy_position()`), next to their variants.
macro_rules! coded {
    ($( $(#[$cfg:meta])* $ty:ty $({ $position:ident })?, )+) => {
        $(
            $(#[$cfg])*
            impl Coded for $ty {
                fn code(&self) -> ErrorCode {
                    <$ty>::code(self)
                }
                $(
                    fn policy_position(&self) -> Option<usize> {
                        <$ty>::$position(self)
                    }
                )?
            }
        )+
    };
}

coded! {
    crate::abe::AbeError { policy_position },
    crate::wrap::WrapError { policy_position },
    crate::wrap::StateError,
    crate::wrap::StoreError,
    crate::key_file::KeyFileError,
    #[cfg(any(feature = "sign", feature = "testing"))]
    crate::sign::SignError,
    #[cfg(any(feature = "sign", feature = "testing"))]
    crate::sign::KeyError,
    #[cfg(feature = "sign")]
    crate::sign::managed::LoadError,
    #[cfg(feature = "sign")]
    crate::sign::remote::KeyRingError,
    #[cfg(feature = "sign")]
    crate::sign::remote::OpenOrForwardError,
}

/// An unknown algorithm name or TLS code point: the [`SignError`] it
/// converts into says (`INVALID_REQUEST`).
///
/// [`SignError`]: crate::sign::SignError
#[cfg(any(feature = "sign", feature = "testing"))]
impl Coded for crate::sign::AlgorithmError {
    fn code(&self) -> ErrorCode {
        crate::sign::SignError::from(self.clone()).code()
    }
}

/// A PKCS#11 URI that does not parse (`INVALID_ARGUMENT`, as loading a key
/// by that URI answers).
#[cfg(feature = "sign")]
impl Coded for crate::sign::pkcs11::UriError {
    fn code(&self) -> ErrorCode {
        ErrorCode::InvalidArgument
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for &c in ErrorCode::ALL {
            assert!(seen.insert(c as u32), "{c:?} reuses a number");
            assert_eq!(ErrorCode::from_u32(c as u32), Some(c));
            assert_eq!(ErrorCode::from_name(c.name()), Some(c));
            let upper_snake: String = format!("{c:?}")
                .chars()
                .enumerate()
                .flat_map(|(i, ch)| (i > 0 && ch.is_uppercase()).then_some('_').into_iter().chain(ch.to_uppercase()))
                .collect();
            assert_eq!(c.name(), upper_snake, "a name is its variant's, in SCREAMING_SNAKE_CASE");
        }
        assert!(ErrorCode::ALL.windows(2).all(|w| (w[0] as u32) < (w[1] as u32)), "ALL is in numeric order");
        assert_eq!(ErrorCode::from_u32(0), None);
        assert_eq!(ErrorCode::from_name("OK"), None);
    }

    #[test]
    fn every_code_has_a_summary_without_the_doc_comment_indentation() {
        for &c in ErrorCode::ALL {
            let doc = c.doc();
            assert!(doc.starts_with(char::is_uppercase), "{c:?}: {doc:?}");
            assert!(!doc.ends_with('\n') && !doc.contains("\n ") && !doc.contains("\n\n\n"), "{c:?}: {doc:?}");
            let summary = doc.split("\n\n").next().unwrap();
            assert!(summary.ends_with('.'), "{c:?}: the summary is a sentence: {summary:?}");
        }
        assert_eq!(ErrorCode::Rng.doc(), "The operating system's random number generator failed.");
        assert!(ErrorCode::InvalidArgument.doc().contains("text that\nis not UTF-8.\n\nAlso a PKCS#11 URI"));
        // Multi-byte characters survive the unindenting.
        assert_eq!(unindented_len(" é\n x\n"), 4);
        assert_eq!(&unindent::<4>(" é\n x\n"), "é\nx".as_bytes());
    }

    #[test]
    fn policy_errors_map_to_their_codes() {
        let syntax = keyfence_policy::parse("a: b or").unwrap_err();
        assert_eq!((Coded::code(&syntax), syntax.policy_position()), (ErrorCode::PolicySyntax, Some(7)));
        let deep = format!("{}a: b{}", "(".repeat(80), ")".repeat(80));
        assert_eq!(ErrorCode::from(&keyfence_policy::parse(&deep).unwrap_err()), ErrorCode::PolicyTooLarge);
        let attrs = "a".parse::<keyfence_policy::Attributes>().unwrap_err();
        assert_eq!((Coded::code(&attrs), attrs.policy_position()), (ErrorCode::InvalidAttributes, None));
    }

    #[cfg(feature = "sign")]
    #[test]
    fn algorithm_and_uri_errors_have_the_codes_their_sign_errors_have() {
        let unknown = "rsa-foo".parse::<crate::sign::Algorithm>().unwrap_err();
        assert_eq!(Coded::code(&unknown), ErrorCode::InvalidRequest);
        let tls = crate::sign::Algorithm::from_tls_code(0xffff).unwrap_err();
        assert_eq!(Coded::code(&tls), ErrorCode::InvalidRequest);
        let uri = crate::sign::pkcs11::Pkcs11Uri::parse("pkcs11:pin-value=1234").unwrap_err();
        assert_eq!(Coded::code(&uri), ErrorCode::InvalidArgument);
    }
}
