//! Any bytes from a peer, in any pieces, through the remote protocol's
//! frame decoder and the key server's request parser (what the server runs
//! on every frame after the hello): frames or errors, never a panic; a
//! request that parses re-encodes to the same bytes.
#![no_main]

use keyfence::sign::remote::protocol::{self as p, Decoder, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&step, wire)) = data.split_first() else { return };
    let step = usize::from(step % 64) + 1;
    let mut d = Decoder::new();
    let mut at = 0;
    'feed: while at < wire.len() {
        let end = (at + step).min(wire.len());
        d.push(&wire[at..end]);
        at = end;
        loop {
            match d.next_frame() {
                Ok(Some(f)) => {
                    let _ = p::parse_hello_request(&f.body);
                    if let Ok(max) = p::parse_hello_reply(&f.body) {
                        assert_eq!(p::hello_reply(max)[..], f.body[..]);
                    }
                    let _ = p::parse_public_reply(&f.body);
                    let _ = p::parse_error(&f.body);
                    let mut again = Vec::new();
                    match p::parse_request(&f) {
                        Ok(Request::Ping) => p::encode_ping(&mut again, f.id),
                        Ok(Request::Public(head)) => p::encode_public(&mut again, f.id, &head),
                        Ok(Request::Op(head, op)) => p::encode_op(&mut again, f.id, &head, &op),
                        Err(_) => continue,
                    }
                    // The budget is the one field encoded from a Duration; it
                    // came from whole microseconds, so it round-trips too.
                    assert_eq!(&again[4..], &[&[f.kind][..], &f.id.to_be_bytes(), &f.body[..]].concat()[..]);
                }
                Ok(None) => break,
                // The stream cannot be resynchronised after this.
                Err(_) => break 'feed,
            }
        }
    }
});
