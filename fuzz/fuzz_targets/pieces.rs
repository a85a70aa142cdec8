//! What every frame fuzzer shares: the input read as a peer's byte stream,
//! cut into pieces the way reads from a socket cut it.

use keyfence::sign::wire::{Decoder, Frame};

/// Feeds `data` to a frame decoder in pieces and hands `each` every whole
/// frame, until the bytes run out or the stream cannot be resynchronised
/// (a length word out of range). The first byte chooses the piece size,
/// so the decoder sees frames split across reads.
pub fn frames(data: &[u8], mut each: impl FnMut(&Frame)) {
    let Some((&step, wire)) = data.split_first() else { return };
    let step = usize::from(step % 64) + 1;
    let mut d = Decoder::new();
    for piece in wire.chunks(step) {
        d.push(piece);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => each(&f),
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}
