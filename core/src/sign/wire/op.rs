//! The operation an OP frame asks for, after each protocol's own head:
//!
//! ```text
//! op      = code:u8  alg:u16  data
//! code    = 1 sign message | 2 sign digest | 3 raw RSA decrypt
//! alg     = the TLS SignatureScheme (0xff01 for MD5+SHA-1); 0 for decrypt
//! ```
//!
//! `data` runs to the end of the frame, so an OP body is never longer than
//! a frame allows: `fit` (with the `sign` feature) makes an operation
//! short enough first.

use super::frame::BodyError;
use crate::codec::{Reader, Writer};
use crate::sign::types::{Algorithm, Input, Operation};

/// Sign a message (the signer hashes it).
pub const SIGN_MESSAGE: u8 = 1;
/// Sign a digest.
pub const SIGN_DIGEST: u8 = 2;
/// Raw RSA decryption.
pub const DECRYPT_RAW: u8 = 3;

/// Bytes of `code` and `alg`.
pub const OP_CODE_LEN: usize = 1 + 2;

/// Writes `op`'s code and algorithm to `w` and returns its data, which
/// the caller appends as the frame's last part (a copy of a message to
/// sign is not made).
pub fn write<'a>(w: &mut Writer, op: &'a Operation) -> &'a [u8] {
    let (code, alg, data): (u8, u16, &[u8]) = match op {
        Operation::Sign { alg, input: Input::Message(m) } => (SIGN_MESSAGE, alg.tls_code(), m),
        Operation::Sign { alg, input: Input::Digest(d) } => (SIGN_DIGEST, alg.tls_code(), d),
        Operation::DecryptRaw { ciphertext } => (DECRYPT_RAW, 0, ciphertext),
    };
    w.u8(code).u16(alg);
    data
}

/// Reads an operation: code, algorithm, and the rest of the body as data.
///
/// # Errors
/// [`BodyError`] naming the field: a body shorter than code and
/// algorithm, an unknown code or algorithm, a decryption with an
/// algorithm.
pub fn read(r: &mut Reader<'_>) -> Result<Operation, BodyError> {
    let code = r.u8("op code")?;
    let alg = r.u16("op algorithm")?;
    let data = r.rest().to_vec();
    let sign_alg = || Algorithm::from_tls_code(alg).map_err(|_| BodyError::Value("op algorithm"));
    Ok(match code {
        SIGN_MESSAGE => Operation::Sign { alg: sign_alg()?, input: Input::Message(data) },
        SIGN_DIGEST => Operation::Sign { alg: sign_alg()?, input: Input::Digest(data) },
        DECRYPT_RAW if alg == 0 => Operation::DecryptRaw { ciphertext: data },
        _ => return Err(BodyError::Value("op code (1 sign message, 2 sign digest, 3 raw RSA decrypt)")),
    })
}

/// `op` in a form one OP frame carries, given the most data its protocol's
/// frame holds (`max`): a longer message is hashed here and sent as its
/// digest, which the signer signs exactly as it would have signed the
/// message (the signature is the same). Ed25519 messages cannot be hashed
/// first, and a digest or ciphertext is never that long.
///
/// # Errors
/// [`SignError::InputTooLarge`](crate::sign::SignError::InputTooLarge)
/// for what cannot be made to fit; a hashing failure as AWS-LC reports
/// it.
#[cfg(feature = "sign")]
pub fn fit(op: &Operation, max: usize) -> Result<std::borrow::Cow<'_, Operation>, crate::sign::SignError> {
    use std::borrow::Cow;
    if op.input_len() <= max {
        return Ok(Cow::Borrowed(op));
    }
    let too_large = |what, len| crate::sign::SignError::InputTooLarge { what, len, max, hint: "" };
    match op {
        Operation::Sign { alg, input: Input::Message(m) } => match alg.hash() {
            Some(hash) => Ok(Cow::Owned(Operation::Sign { alg: *alg, input: Input::Digest(hash.digest(m)?) })),
            None => Err(too_large("the message", m.len())),
        },
        Operation::Sign { input: Input::Digest(d), .. } => Err(too_large("the digest", d.len())),
        Operation::DecryptRaw { ciphertext } => Err(too_large("the ciphertext", ciphertext.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Order;

    fn encoded(op: &Operation) -> Vec<u8> {
        let mut w = Writer::new(Order::Big);
        let data = write(&mut w, op);
        [&w.into_bytes()[..], data].concat()
    }

    #[test]
    fn operations_are_code_algorithm_data() {
        let msg = Operation::Sign { alg: Algorithm::RsaPssSha256, input: Input::Message(b"hi".to_vec()) };
        assert_eq!(encoded(&msg), [1, 0x08, 0x04, b'h', b'i']);
        let digest = Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: Input::Digest(vec![0xCC; 2]) };
        assert_eq!(encoded(&digest), [2, 0x04, 0x03, 0xCC, 0xCC]);
        let decrypt = Operation::DecryptRaw { ciphertext: vec![0xDD] };
        assert_eq!(encoded(&decrypt), [3, 0, 0, 0xDD]);
        for op in [msg, digest, decrypt] {
            let bytes = encoded(&op);
            let mut r = crate::sign::wire::frame::reader(&bytes);
            assert_eq!(read(&mut r), Ok(op));
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn unknown_codes_and_algorithms_are_refused() {
        let read_of = |b: &[u8]| read(&mut crate::sign::wire::frame::reader(b));
        assert!(read_of(&[1, 0x08]).is_err(), "short");
        assert_eq!(read_of(&[9, 0, 0]), Err(BodyError::Value("op code (1 sign message, 2 sign digest, 3 raw RSA decrypt)")));
        assert_eq!(read_of(&[1, 0x12, 0x34]), Err(BodyError::Value("op algorithm")));
        assert!(read_of(&[3, 0x04, 0x03]).is_err(), "a decryption with an algorithm");
    }

    #[cfg(feature = "sign")]
    #[test]
    fn fit_hashes_long_messages_and_refuses_what_cannot_shrink() {
        use crate::sign::SignError;
        let long = Operation::Sign { alg: Algorithm::EcdsaP256Sha256, input: Input::Message(vec![1; 100]) };
        assert!(matches!(fit(&long, 100).unwrap(), std::borrow::Cow::Borrowed(_)));
        let Operation::Sign { input: Input::Digest(d), .. } = fit(&long, 99).unwrap().into_owned() else {
            panic!("a long message is sent as its digest")
        };
        assert_eq!(d, crate::sign::Hash::Sha256.digest(&[1; 100]).unwrap());
        let ed = Operation::Sign { alg: Algorithm::Ed25519, input: Input::Message(vec![1; 100]) };
        assert!(matches!(fit(&ed, 99), Err(SignError::InputTooLarge { what: "the message", len: 100, max: 99, .. })));
        let raw = Operation::DecryptRaw { ciphertext: vec![1; 100] };
        assert!(matches!(fit(&raw, 99), Err(SignError::InputTooLarge { what: "the ciphertext", .. })));
    }
}
