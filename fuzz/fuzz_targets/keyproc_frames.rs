//! Any bytes from a peer, in any pieces, through every body parser of the
//! key-process protocol's own messages: errors, never a panic, and a body
//! that parses re-encodes to the same bytes where the format has one
//! encoding. The shared codec has its own target (`wire_frames`).
#![no_main]

mod pieces;

use keyfence::sign::key_process::protocol as p;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    pieces::frames(data, |f| {
        if let Ok(max) = p::parse_hello_request(&f.body) {
            assert_eq!(p::hello_request(max)[..], f.body[..]);
        }
        if let Ok((pid, flags)) = p::parse_hello_reply(&f.body) {
            assert_eq!(p::hello_reply(pid, flags)[..], f.body[..]);
        }
        if let Ok((id, source)) = p::parse_load_request(&f.body) {
            assert_eq!(&p::load_request(id, &source)[..], &f.body[..]);
        }
        if let Ok((key_id, timeout, op)) = p::parse_op(&f.body) {
            // The timeout came from whole microseconds, and zero is sent as one.
            let mut again = Vec::new();
            p::encode_op(&mut again, f.id, key_id, timeout, &op);
            let us = u32::from_be_bytes(f.body[8..12].try_into().unwrap()).max(1);
            let mut want = f.body.to_vec();
            want[8..12].copy_from_slice(&us.to_be_bytes());
            assert_eq!(&again[13..], &want[..]);
        }
        if let Ok(key_id) = p::parse_unload_request(&f.body) {
            assert_eq!(p::unload_request(key_id)[..], f.body[..]);
        }
        if let Ok((uid, gid)) = p::parse_drop_privileges_request(&f.body) {
            assert_eq!(p::drop_privileges_request(uid, gid)[..], f.body[..]);
        }
        let (code, _) = p::parse_error(&f.body);
        assert!(p::sends(code), "{code:?} is not a key-process code");
        if let Ok(status) = p::Status::parse(&f.body) {
            assert_eq!(status.encode()[..], f.body[..]);
        }
    });
});
