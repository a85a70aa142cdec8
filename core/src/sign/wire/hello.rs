//! The shape both hellos have: a protocol's magic, its version, then a
//! fixed number of `u32` fields.
//!
//! ```text
//! hello   = magic:[4]  version:u16  field:u32*
//! ```
//!
//! The magic tells the protocols apart (`KFKP` the key process, `KFRS` a
//! key server), so a client pointed at the wrong one learns it from the
//! first reply; which fields follow is each protocol's.

use super::frame::{reader, BodyError};
use crate::codec::{Order, Writer};

/// The error [`parse_hello`] answers for a version other than the one
/// expected; a server may answer it with a code of its own.
pub const WRONG_VERSION: BodyError = BodyError::Value("hello version");

/// The body of a hello: `magic`, `version`, then `fields`.
pub fn hello(magic: [u8; 4], version: u16, fields: &[u32]) -> Vec<u8> {
    let mut w = Writer::new(Order::Big);
    w.raw(&magic).u16(version);
    for &f in fields {
        w.u32(f);
    }
    w.into_bytes().to_vec()
}

/// Decodes a hello of `N` fields, each named by `names` in errors.
///
/// # Errors
/// [`BodyError`] for a magic other than `magic`, a version other than
/// `version` ([`WRONG_VERSION`]), or a body that is not exactly `N`
/// fields long.
pub fn parse_hello<const N: usize>(body: &[u8], magic: [u8; 4], version: u16, names: [&'static str; N]) -> Result<[u32; N], BodyError> {
    let mut r = reader(body);
    if r.take(4, "hello magic")? != magic {
        return Err(BodyError::Value("hello magic"));
    }
    if r.u16("hello version")? != version {
        return Err(WRONG_VERSION);
    }
    let mut fields = [0; N];
    for (f, name) in fields.iter_mut().zip(names) {
        *f = r.u32(name)?;
    }
    r.finish_as("hello (trailing bytes)")?;
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hellos_are_magic_version_and_fields() {
        assert_eq!(hello(*b"ABCD", 1, &[]), b"ABCD\x00\x01");
        assert_eq!(hello(*b"ABCD", 2, &[7, 0x0102_0304]), b"ABCD\x00\x02\x00\x00\x00\x07\x01\x02\x03\x04");
        assert_eq!(parse_hello(&hello(*b"ABCD", 2, &[7, 8]), *b"ABCD", 2, ["a", "b"]), Ok([7, 8]));
        assert_eq!(parse_hello(b"ABCD\x00\x01", *b"ABCD", 1, []), Ok([]));
    }

    #[test]
    fn a_wrong_magic_version_or_length_is_refused() {
        assert_eq!(parse_hello(b"ABCE\x00\x01", *b"ABCD", 1, []), Err(BodyError::Value("hello magic")));
        assert_eq!(parse_hello(b"ABCD\x00\x02", *b"ABCD", 1, []), Err(WRONG_VERSION));
        assert!(parse_hello(b"ABCD\x00\x01\x00", *b"ABCD", 1, []).is_err(), "trailing");
        let short = parse_hello(b"ABCD\x00\x01\x00\x00\x00", *b"ABCD", 1, ["hello pid"]).unwrap_err();
        assert!(short.to_string().contains("hello pid"), "{short}");
        assert!(parse_hello(b"AB", *b"ABCD", 1, []).is_err(), "short magic");
    }
}
