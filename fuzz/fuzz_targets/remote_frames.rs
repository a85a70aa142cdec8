//! Any bytes from a peer, in any pieces, through the key server's request
//! parser (what the server runs on every frame after the hello) and the
//! remote protocol's own bodies: errors, never a panic; a request that
//! parses re-encodes to the same bytes. The shared codec has its own
//! target (`wire_frames`).
#![no_main]

mod pieces;

use keyfence::sign::remote::protocol::{self as p, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    pieces::frames(data, |f| {
        if p::parse_hello_request(&f.body).is_ok() {
            assert_eq!(p::hello_request()[..], f.body[..]);
        }
        if let Ok(max) = p::parse_hello_reply(&f.body) {
            assert_eq!(p::hello_reply(max)[..], f.body[..]);
        }
        let (code, _) = p::parse_error(&f.body);
        assert!(p::sends(code), "{code:?} is not a key server's code");
        let mut again = Vec::new();
        match p::parse_request(f) {
            Ok(Request::Ping) => p::encode_ping(&mut again, f.id),
            Ok(Request::Public(head)) => p::encode_public(&mut again, f.id, &head),
            Ok(Request::Op(head, op)) => p::encode_op(&mut again, f.id, &head, &op),
            Err(_) => return,
        }
        // The budget is the one field encoded from a Duration; it came
        // from whole microseconds, so it round-trips too.
        assert_eq!(&again[4..], &[&[f.kind][..], &f.id.to_be_bytes(), &f.body[..]].concat()[..]);
    });
});
