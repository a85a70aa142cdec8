//! The ERR body and the one table of its codes.
//!
//! ```text
//! err     = code:u8  message  [ 0x00  field* ]
//! message = UTF-8 without NUL, at most 1 KiB, never key material
//! field   = tag:u8  length:u16  value         (1: error code, u32; 2: token, UTF-8)
//! ```
//!
//! The fields ([`Detail`]) carry what a client needs to rebuild the error
//! its server had (the library's [`crate::ErrorCode`], a PKCS#11 token's
//! name), so that no client parses them back out of the message. A reader
//! that predates them shows them as the message's tail; unknown tags are
//! skipped.
//!
//! Both protocols draw their codes from [`ErrorCode`], so a number means
//! the same wherever it is read and is never reused; each protocol sends
//! only some of them (its `sends`) and reads any other as
//! [`ErrorCode::Internal`], as its documentation says a client must.

use super::frame::reader;
use crate::codec::{Order, Writer};

/// Why a key process or a key server refused a request: the first byte of
/// an ERR body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ErrorCode {
    /// The frame could not be decoded.
    Malformed = 1,
    /// No key under that id (a key server: it does not hold that key; its
    /// attributes do not allow it, or it has no such envelope; another
    /// capable peer may).
    UnknownKey = 2,
    /// The key could not be loaded (file, envelope or bytes). Key process
    /// only.
    Load = 3,
    /// AWS-LC refused the operation.
    Crypto = 4,
    /// The deadline (key process) or budget (key server) ran out before
    /// the operation completed.
    TimedOut = 5,
    /// A queue is full, or the connection has its maximum in flight: try
    /// another peer, or later. The key process's documentation calls it
    /// "busy" ([`ErrorCode::Busy`]).
    Overloaded = 6,
    /// The request is not valid for the key (algorithm, lengths).
    Invalid = 7,
    /// Dropping privileges failed. Key process only.
    Privileges = 8,
    /// Anything else, and any code a reader does not know.
    Internal = 9,
    /// The tenant has its maximum in flight on this server. Key server
    /// only.
    TenantLimit = 10,
    /// The hello named a protocol version the server does not speak. Key
    /// server only.
    Version = 11,
    /// The server is shutting down. Key server only.
    ShuttingDown = 12,
    /// The client's tenant (named by its certificate) may not use that
    /// key on this server, or the certificate names no tenant at all.
    /// Refused before any work; another peer may be configured to allow
    /// it. Key server only.
    NotAllowed = 13,
    /// The PKCS#11 token holding the key is gone and did not come back
    /// when its sessions were opened again.
    TokenUnavailable = 14,
    /// The PKCS#11 token needs a PIN none was given for, or refused it.
    TokenLogin = 15,
}

impl ErrorCode {
    /// Every code, in numeric order.
    pub const ALL: [ErrorCode; 15] = [
        ErrorCode::Malformed,
        ErrorCode::UnknownKey,
        ErrorCode::Load,
        ErrorCode::Crypto,
        ErrorCode::TimedOut,
        ErrorCode::Overloaded,
        ErrorCode::Invalid,
        ErrorCode::Privileges,
        ErrorCode::Internal,
        ErrorCode::TenantLimit,
        ErrorCode::Version,
        ErrorCode::ShuttingDown,
        ErrorCode::NotAllowed,
        ErrorCode::TokenUnavailable,
        ErrorCode::TokenLogin,
    ];

    /// The key process's name for [`ErrorCode::Overloaded`]: more requests
    /// in flight than agreed in the hello, or a queue full.
    #[allow(non_upper_case_globals)]
    pub const Busy: ErrorCode = ErrorCode::Overloaded;

    /// The code for a byte, `Internal` for unknown ones.
    pub fn from_u8(b: u8) -> Self {
        Self::ALL.into_iter().find(|c| *c as u8 == b).unwrap_or(ErrorCode::Internal)
    }

    /// A short snake_case name, for metrics labels and messages.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "malformed",
            ErrorCode::UnknownKey => "unknown_key",
            ErrorCode::Load => "load",
            ErrorCode::Crypto => "crypto",
            ErrorCode::TimedOut => "timed_out",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::Invalid => "invalid",
            ErrorCode::Privileges => "privileges",
            ErrorCode::Internal => "internal",
            ErrorCode::TenantLimit => "tenant_limit",
            ErrorCode::Version => "version",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::NotAllowed => "not_allowed",
            ErrorCode::TokenUnavailable => "token_unavailable",
            ErrorCode::TokenLogin => "token_login",
        }
    }
}

/// What an ERR carries besides its code and message: the error as it
/// was where it happened, as fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Detail {
    /// The library's error code (`docs/errors.md`).
    pub code: Option<crate::ErrorCode>,
    /// The PKCS#11 token (`pkcs11:token=LABEL`) a token's failure is about.
    pub token: Option<String>,
}

// Without `sign` (the fuzzers' build) no process sends or reads an ERR's
// detail: only the codec is built.
#[cfg_attr(not(feature = "sign"), allow(dead_code))]
impl Detail {
    /// `e` as an ERR carries it to another process: its message (a token's
    /// reason without the token, an argument's or configuration's words
    /// without the code) and the fields a client rebuilds it from.
    pub(crate) fn of(e: &crate::sign::types::SignError) -> (String, Detail) {
        use crate::sign::types::SignError;
        let token = match e {
            SignError::Token { token, .. } => Some(token.clone()),
            _ => None,
        };
        let message = match e {
            SignError::Token { reason, .. } => reason.clone(),
            SignError::InvalidArgument(m) | SignError::Config(m) => m.clone(),
            e => e.to_string(),
        };
        (message, Detail { code: Some(e.code()), token })
    }

    /// The error a server reported with this detail and `message`, as it
    /// was there, when the detail names one a client rebuilds (a token's
    /// failure, an argument or a configuration refused, a load declined
    /// for a reason of CP-ABE, wrapping or the store); `None` otherwise.
    pub(crate) fn rebuild(&self, message: &str) -> Option<crate::sign::types::SignError> {
        use crate::sign::types::{SignError, TokenFailure};
        use crate::ErrorCode as C;
        let token = |failure| SignError::Token {
            token: self.token.clone().unwrap_or_else(|| "pkcs11".into()),
            failure,
            reason: message.to_string(),
        };
        Some(match self.code? {
            C::TokenLogin => token(TokenFailure::Login),
            C::TokenUnavailable => token(TokenFailure::Unavailable),
            C::BackendFailed if self.token.is_some() => token(TokenFailure::Refused),
            C::InvalidPrivateKey if self.token.is_some() => token(TokenFailure::NotFound),
            C::InvalidArgument => SignError::InvalidArgument(message.to_string()),
            C::InvalidConfig => SignError::Config(message.to_string()),
            // 200-499: CP-ABE, wrapping and the store, the reasons an agent
            // declines an envelope; a "no" stays a "no" across the socket.
            // An agent's message leads with the code's name for readers
            // without the detail; the error carries the code itself.
            code if (200..500).contains(&(code as u32)) => {
                let reason = message.strip_prefix(code.name()).and_then(|m| m.strip_prefix(": ")).unwrap_or(message);
                SignError::Declined { code, reason: reason.to_string() }
            }
            _ => return None,
        })
    }
}

/// [`Detail::code`]'s tag.
const TAG_CODE: u8 = 1;
/// [`Detail::token`]'s tag.
const TAG_TOKEN: u8 = 2;

/// The body of an ERR reply; the message is cut to 1 KiB (on a character
/// boundary): messages are for logs, whatever produced them.
pub fn error_body(code: ErrorCode, message: &str) -> Vec<u8> {
    error_body_with(code, message, &Detail::default())
}

/// [`error_body`] with the error's [`Detail`] after the message. A NUL in
/// the message becomes a space: it separates the two.
pub fn error_body_with(code: ErrorCode, message: &str, detail: &Detail) -> Vec<u8> {
    let mut end = message.len().min(1024);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let text: Vec<u8> = message.as_bytes()[..end].iter().map(|&b| if b == 0 { b' ' } else { b }).collect();
    let mut w = Writer::new(Order::Big);
    w.u8(code as u8).raw(&text);
    if detail != &Detail::default() {
        w.u8(0);
        if let Some(c) = detail.code {
            w.u8(TAG_CODE).u16(4).u32(c as u32);
        }
        if let Some(token) = &detail.token {
            let mut end = token.len().min(1024);
            while !token.is_char_boundary(end) {
                end -= 1;
            }
            w.u8(TAG_TOKEN).u16(end as u16).raw(&token.as_bytes()[..end]);
        }
    }
    w.into_bytes().to_vec()
}

/// Decodes an ERR reply of a protocol that `sends` some codes: any other
/// code, and an empty body, read as [`ErrorCode::Internal`].
pub fn parse_error(body: &[u8], sends: fn(ErrorCode) -> bool) -> (ErrorCode, String) {
    let (code, message, _) = parse_error_with(body, sends);
    (code, message)
}

/// [`parse_error`] with the reply's [`Detail`]: fields that do not decode
/// are left out (the message and code stand), and unknown tags skipped.
pub fn parse_error_with(body: &[u8], sends: fn(ErrorCode) -> bool) -> (ErrorCode, String, Detail) {
    let mut r = reader(body);
    let known = |c| if sends(c) { c } else { ErrorCode::Internal };
    let Ok(code) = r.u8("error code") else {
        return (ErrorCode::Internal, "an empty error reply".into(), Detail::default());
    };
    let rest = r.rest();
    let (text, fields) = match rest.iter().position(|&b| b == 0) {
        Some(at) => (&rest[..at], &rest[at + 1..]),
        None => (rest, &[][..]),
    };
    (known(ErrorCode::from_u8(code)), String::from_utf8_lossy(text).into_owned(), parse_detail(fields))
}

fn parse_detail(fields: &[u8]) -> Detail {
    let mut detail = Detail::default();
    let mut r = reader(fields);
    while r.remaining() > 0 {
        let (Ok(tag), Ok(value)) = (r.u8("detail tag"), r.bytes16("detail value")) else { return Detail::default() };
        match tag {
            TAG_CODE => {
                let Ok(raw) = <[u8; 4]>::try_from(value) else { return Detail::default() };
                detail.code = crate::ErrorCode::from_u32(u32::from_be_bytes(raw));
            }
            TAG_TOKEN => detail.token = Some(String::from_utf8_lossy(value).into_owned()),
            _ => {}
        }
    }
    detail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_its_documented_byte_and_name() {
        // docs/isolation.md and docs/remote.md list these numbers.
        let want = [
            (1, "malformed"),
            (2, "unknown_key"),
            (3, "load"),
            (4, "crypto"),
            (5, "timed_out"),
            (6, "overloaded"),
            (7, "invalid"),
            (8, "privileges"),
            (9, "internal"),
            (10, "tenant_limit"),
            (11, "version"),
            (12, "shutting_down"),
            (13, "not_allowed"),
            (14, "token_unavailable"),
            (15, "token_login"),
        ];
        assert_eq!(ErrorCode::ALL.map(|c| (c as u8, c.name())), want);
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_u8(c as u8), c);
        }
        assert_eq!(ErrorCode::Busy as u8, 6);
        for b in [0, 16, 200, 255] {
            assert_eq!(ErrorCode::from_u8(b), ErrorCode::Internal);
        }
    }

    #[test]
    fn error_bodies_are_a_code_and_a_short_message() {
        assert_eq!(error_body(ErrorCode::Version, "v1"), [11, b'v', b'1']);
        let long = "é".repeat(600);
        let body = error_body(ErrorCode::Internal, &long);
        assert_eq!(body.len(), 1 + 1024);
        let all = |_| true;
        assert_eq!(parse_error(&body, all), (ErrorCode::Internal, "é".repeat(512)));
        let odd = format!("x{long}");
        assert_eq!(error_body(ErrorCode::Internal, &odd).len(), 1 + 1023, "cut on a character boundary");
        assert_eq!(parse_error(&[], all), (ErrorCode::Internal, "an empty error reply".into()));
        let few = |c| c == ErrorCode::Malformed;
        assert_eq!(parse_error(&[3, b'x'], few), (ErrorCode::Internal, "x".into()), "a code the protocol does not send");
        assert_eq!(parse_error(&[1, b'x'], few), (ErrorCode::Malformed, "x".into()));
        assert_eq!(parse_error(&[3, b'x'], all), (ErrorCode::Load, "x".into()));
    }

    #[test]
    fn a_holders_refusal_keeps_its_code_and_a_broken_holder_stays_a_backend_failure() {
        use crate::sign::types::SignError;
        use crate::ErrorCode as C;
        let declined = |code| Detail { code: Some(code), token: None }.rebuild("why");
        for code in [C::PolicyNotSatisfied, C::RetiredGeneration, C::MachineRevoked, C::InvalidEnvelope, C::StoreIo] {
            assert_eq!(declined(code), Some(SignError::Declined { code, reason: "why".into() }));
            assert_eq!(declined(code).unwrap().code(), code);
        }
        // The name an agent leads with is not said twice.
        let named = Detail { code: Some(C::PolicyNotSatisfied), token: None }.rebuild("POLICY_NOT_SATISFIED: why");
        assert_eq!(named.unwrap().to_string(), "why");
        // Failures of the holder itself are not the library's reasons: the
        // client reports them as the backend's.
        for code in [C::Internal, C::Io, C::BackendFailed, C::Overloaded, C::TimedOut] {
            assert_eq!(declined(code), None, "{code:?}");
        }
        assert_eq!(Detail::default().rebuild("why"), None);
    }

    #[test]
    fn the_detail_rides_after_the_message_and_old_readers_keep_the_code() {
        let detail = Detail { code: Some(crate::ErrorCode::TokenLogin), token: Some("pkcs11:token=edge".into()) };
        let body = error_body_with(ErrorCode::TokenLogin, "CKR_PIN_INCORRECT\0and more", &detail);
        let all = |_| true;
        assert_eq!(parse_error_with(&body, all), (ErrorCode::TokenLogin, "CKR_PIN_INCORRECT and more".into(), detail));
        // The documented bytes: code, message, NUL, then tag, length, value.
        let plain = error_body_with(ErrorCode::Load, "no", &Detail { code: Some(crate::ErrorCode::InvalidArgument), token: None });
        assert_eq!(plain, [3, b'n', b'o', 0, 1, 0, 4, 0, 0, 0, 1]);
        // No detail: the body as it always was.
        assert_eq!(error_body_with(ErrorCode::Load, "no", &Detail::default()), error_body(ErrorCode::Load, "no"));
        // Fields that do not decode, or tags this reader does not know.
        assert_eq!(parse_error_with(&[3, b'x', 0, 1, 0, 9], all).2, Detail::default());
        assert_eq!(parse_error_with(&[3, b'x', 0, 77, 0, 1, 5], all), (ErrorCode::Load, "x".into(), Detail::default()));
    }
}
