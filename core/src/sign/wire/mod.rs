//! The wire codec both of keyfence's signing protocols speak: the key
//! process's (`docs/isolation.md`, [`key_process::protocol`]) and the key
//! server's (`docs/remote.md`, [`remote::protocol`]).
//!
//! What the two protocols share lives here once, and each protocol module
//! keeps only the messages that are its own:
//!
//! - [`frame`]: the frame (`length:u32 kind:u8 id:u64 body`), the
//!   [`kind`]s both protocols use, its [`Decoder`] and [`encode`], and the
//!   [`BodyError`] every body parser answers with.
//! - [`hello`]: the shape of both hellos (magic, version, `u32` fields).
//! - [`op`]: the operation in an OP body (code, algorithm, data).
//! - [`public_key`]: a key's kind and public key, as a LOAD or PUBLIC
//!   reply carries it.
//! - [`error`]: the ERR body and the one table of its codes.
//!
//! Every field is read and written with the crate's one checked codec
//! ([`crate::codec`], big-endian). Nothing here needs AWS-LC except
//! `op::fit`: the codec builds without the `sign` feature, for the
//! fuzzers.
//!
//! [`key_process::protocol`]: crate::sign::key_process::protocol
//! [`remote::protocol`]: crate::sign::remote::protocol

pub mod error;
pub mod frame;
pub mod hello;
pub mod op;
pub mod public_key;

pub use error::{error_body, error_body_with, parse_error, parse_error_with, Detail, ErrorCode};
pub use frame::{encode, kind, BodyError, Decoder, Frame, FramingError, HEADER, MAX_FRAME};
