//! Any bytes from a peer, in any pieces, through the key-process frame
//! decoder and every body parser: frames or errors, never a panic, and a
//! body that parses re-encodes to the same bytes where the format has one
//! encoding. The first byte chooses the cut points, so the decoder sees
//! frames split across reads.
#![no_main]

use keyfence::sign::isolated::protocol::{self as p, Decoder};
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
                    if let Ok(max) = p::parse_hello_request(&f.body) {
                        assert_eq!(p::hello_request(max)[..], f.body[..]);
                    }
                    if let Ok((pid, flags)) = p::parse_hello_reply(&f.body) {
                        assert_eq!(p::hello_reply(pid, flags)[..], f.body[..]);
                    }
                    if let Ok((id, source)) = p::parse_load_request(&f.body) {
                        assert_eq!(&p::load_request(id, &source)[..], &f.body[..]);
                    }
                    if let Ok((kind, der)) = p::parse_loaded_reply(&f.body) {
                        // The RSA size is carried; other kinds' bits field is fixed.
                        let _ = p::loaded_reply(kind, &der);
                    }
                    if let Ok((key_id, _timeout, op)) = p::parse_op(&f.body) {
                        let mut again = Vec::new();
                        p::encode_op(&mut again, f.id, key_id, std::time::Duration::from_micros(1), &op);
                    }
                    if let Ok(key_id) = p::parse_unload_request(&f.body) {
                        assert_eq!(p::unload_request(key_id)[..], f.body[..]);
                    }
                    if let Ok((uid, gid)) = p::parse_drop_privileges_request(&f.body) {
                        assert_eq!(p::drop_privileges_request(uid, gid)[..], f.body[..]);
                    }
                    let _ = p::parse_error(&f.body);
                    if let Ok(status) = p::Status::parse(&f.body) {
                        assert_eq!(status.encode()[..], f.body[..]);
                    }
                }
                Ok(None) => break,
                // The stream cannot be resynchronised after this.
                Err(_) => break 'feed,
            }
        }
    }
});
