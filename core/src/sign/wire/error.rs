//! The ERR body and the one table of its codes.
//!
//! ```text
//! err     = code:u8  message (UTF-8, at most 1 KiB, never key material)
//! ```
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

/// The body of an ERR reply; the message is cut to 1 KiB (on a character
/// boundary): messages are for logs, whatever produced them.
pub fn error_body(code: ErrorCode, message: &str) -> Vec<u8> {
    let mut end = message.len().min(1024);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let mut w = Writer::new(Order::Big);
    w.u8(code as u8).raw(&message.as_bytes()[..end]);
    w.into_bytes().to_vec()
}

/// Decodes an ERR reply of a protocol that `sends` some codes: any other
/// code, and an empty body, read as [`ErrorCode::Internal`].
pub fn parse_error(body: &[u8], sends: fn(ErrorCode) -> bool) -> (ErrorCode, String) {
    let mut r = reader(body);
    let known = |c| if sends(c) { c } else { ErrorCode::Internal };
    match r.u8("error code") {
        Ok(code) => (known(ErrorCode::from_u8(code)), String::from_utf8_lossy(r.rest()).into_owned()),
        Err(_) => (ErrorCode::Internal, "an empty error reply".into()),
    }
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
}
