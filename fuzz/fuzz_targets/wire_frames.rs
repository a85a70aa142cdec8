//! Any bytes from a peer, in any pieces, through the codec both signing
//! protocols share (`keyfence::sign::wire`): frames or errors, never a
//! panic; a frame re-encodes to the bytes it came from, and every shared
//! body that parses (a hello's shape, an operation, a key's description,
//! an ERR body) re-encodes to the same value.
#![no_main]

mod pieces;

use keyfence::sign::wire::{self, encode, hello, op, public_key, ErrorCode};
use libfuzzer_sys::fuzz_target;

/// A hello of `N` fields under the body's own magic and version, and under
/// the key server's (so a wrong magic or version is refused too): if it
/// parses, it re-encodes to the same bytes.
fn hellos<const N: usize>(body: &[u8]) {
    let (Some(magic), Some(version)) = (body.get(..4), body.get(4..6)) else { return };
    let own = (magic.try_into().unwrap(), u16::from_be_bytes([version[0], version[1]]));
    for (magic, version) in [own, (*b"KFRS", 1)] {
        if let Ok(fields) = hello::parse_hello(body, magic, version, [""; N]) {
            assert_eq!(hello::hello(magic, version, &fields)[..], body[..]);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    pieces::frames(data, |f| {
        let mut again = Vec::new();
        encode(&mut again, f.kind, f.id, &[&f.body]);
        assert_eq!(&again[4..], &[&[f.kind][..], &f.id.to_be_bytes(), &f.body[..]].concat()[..]);
        hellos::<0>(&f.body);
        hellos::<1>(&f.body);
        hellos::<2>(&f.body);
        if let Ok(operation) = op::read(&mut wire::frame::reader(&f.body)) {
            let mut w = keyfence::codec::Writer::new(keyfence::codec::Order::Big);
            let data = op::write(&mut w, &operation);
            assert_eq!([&w.into_bytes()[..], data].concat(), f.body[..]);
        }
        if let Ok((kind, der)) = public_key::parse(&f.body) {
            // The bits of a non-RSA kind are implied, so compare values.
            assert_eq!(public_key::parse(&public_key::encode(kind, &der)), Ok((kind, der)));
        }
        let (code, message) = wire::parse_error(&f.body, |_| true);
        assert_eq!(wire::parse_error(&wire::error_body(code, &message), |_| true).0, code);
        assert_eq!(code, ErrorCode::from_u8(f.body.first().copied().unwrap_or(9)));
    });
});
