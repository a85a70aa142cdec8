//! BLAKE2b as CIRCL uses it: the BLAKE2Xb extendable-output function of Go's
//! `golang.org/x/crypto/blake2b.NewXOF` with unknown output length, keyed
//! BLAKE2b-256 as a MAC, and plain BLAKE2b-256.
//!
//! BLAKE2Xb: the root is keyed BLAKE2b-512 of the input with the XOF length
//! (`0xFFFFFFFF`, "unknown") in the upper half of the node-offset word; the
//! output is the concatenation of unkeyed BLAKE2b-512 hashes of the root,
//! each with leaf length 64, inner length 64, fanout 0, depth 0 and node
//! offset `i`.

use blake2b_simd::{Params, State};

const UNKNOWN_LENGTH: u64 = 0xFFFF_FFFF;

/// An absorbing BLAKE2Xb instance; [`Xof::finish`] turns it into a reader.
#[derive(Clone)]
pub(crate) struct Xof {
    state: State,
}

impl Xof {
    pub(crate) fn new(key: &[u8]) -> Self {
        let state = Params::new().hash_length(64).key(key).node_offset(UNKNOWN_LENGTH << 32).to_state();
        Self { state }
    }

    pub(crate) fn update(&mut self, data: &[u8]) -> &mut Self {
        self.state.update(data);
        self
    }

    pub(crate) fn finish(&self) -> XofReader {
        let mut root = [0u8; 64];
        root.copy_from_slice(self.state.finalize().as_bytes());
        XofReader { root, block: [0; 64], used: 64, node: 0 }
    }
}

/// The output stream of a BLAKE2Xb instance.
pub(crate) struct XofReader {
    root: [u8; 64],
    block: [u8; 64],
    used: usize,
    node: u32,
}

impl XofReader {
    pub(crate) fn fill(&mut self, out: &mut [u8]) {
        let mut filled = 0;
        while filled < out.len() {
            if self.used == 64 {
                let h = Params::new()
                    .hash_length(64)
                    .fanout(0)
                    .max_depth(0)
                    .max_leaf_length(64)
                    .inner_hash_length(64)
                    .node_offset((UNKNOWN_LENGTH << 32) | u64::from(self.node))
                    .hash(&self.root);
                self.block.copy_from_slice(h.as_bytes());
                self.node = self.node.wrapping_add(1);
                self.used = 0;
            }
            let n = (64 - self.used).min(out.len() - filled);
            out[filled..filled + n].copy_from_slice(&self.block[self.used..self.used + n]);
            self.used += n;
            filled += n;
        }
    }
}

impl Drop for XofReader {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.root);
        zeroize::Zeroize::zeroize(&mut self.block);
    }
}

impl rand_core::RngCore for XofReader {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill(&mut b);
        u32::from_le_bytes(b)
    }
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill(&mut b);
        u64::from_le_bytes(b)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.fill(dest)
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill(dest);
        Ok(())
    }
}

/// The reader is a deterministic function of public or secret input, never
/// a source of fresh entropy; it is marked `CryptoRng` only so that it can
/// drive the scalar sampler exactly as CIRCL drives Go's `rand.Int`.
impl rand_core::CryptoRng for XofReader {}

/// BLAKE2b-256, optionally keyed.
pub(crate) fn blake2b_256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut st = Params::new().hash_length(32).key(key).to_state();
    for p in parts {
        st.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(st.finalize().as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xof_is_a_stream() {
        // Reading in pieces gives the same bytes as reading at once.
        let mut x = Xof::new(b"key");
        x.update(b"value");
        let mut whole = [0u8; 200];
        x.finish().fill(&mut whole);
        let mut r = x.finish();
        let mut parts = [0u8; 200];
        r.fill(&mut parts[..7]);
        r.fill(&mut parts[7..130]);
        r.fill(&mut parts[130..]);
        assert_eq!(whole, parts);
        assert_ne!(whole[..64], whole[64..128]);
    }
}
