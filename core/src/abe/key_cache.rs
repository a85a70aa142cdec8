//! What an attribute key precomputes for decryption: the Miller-loop
//! lines of its `k1` points (see [`super::lines`]). Built once per key,
//! when it is decoded or at its first decryption, and shared by its
//! clones; wiped when the last of them is dropped.

use super::keys::AttributeKey;
use super::lines::Lines;

/// An attribute key's precomputed values.
pub(crate) struct KeyCache {
    /// The lines of `k1`'s three points, in order.
    pub(crate) k1_lines: Vec<Lines>,
}

impl KeyCache {
    pub(crate) fn new(key: &AttributeKey) -> Self {
        Self { k1_lines: key.k1.e.iter().map(|q| Lines::new(q.0.as_ref())).collect() }
    }
}
