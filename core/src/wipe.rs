//! Growing buffers that hold secrets without leaving copies behind.
//!
//! `Zeroizing<Vec<u8>>` wipes the allocation it ends with, but a `Vec`
//! that grows moves its bytes to a larger allocation and frees the old
//! one as it is: every reallocation leaves a copy on the heap. Buffers
//! that carry key material grow through [`extend`] instead.

use zeroize::Zeroize;

/// Appends `bytes` to `buf`; when `buf` must grow, its bytes move to a new
/// allocation (at least double) and the old one is wiped before it is
/// freed.
pub(crate) fn extend(buf: &mut Vec<u8>, bytes: &[u8]) {
    reserve(buf, bytes.len());
    buf.extend_from_slice(bytes);
}

/// Makes room for `additional` more bytes without leaving a copy behind.
pub(crate) fn reserve(buf: &mut Vec<u8>, additional: usize) {
    let need = buf.len().saturating_add(additional);
    if need <= buf.capacity() {
        return;
    }
    let mut bigger = Vec::with_capacity(need.max(buf.capacity().saturating_mul(2)).max(64));
    bigger.extend_from_slice(buf);
    // Wipes the elements and the spare capacity, then the old allocation
    // is freed already zeroed.
    buf.zeroize();
    *buf = bigger;
}

#[cfg(test)]
mod tests {
    #[test]
    fn growing_keeps_the_bytes_and_moves_to_a_larger_buffer() {
        let mut v = Vec::with_capacity(4);
        super::extend(&mut v, b"abc");
        let first = v.as_ptr();
        super::extend(&mut v, b"defgh");
        assert_eq!(v, b"abcdefgh");
        assert!(v.capacity() >= 64);
        assert_ne!(v.as_ptr(), first, "grew into a new allocation");
        let cap = v.capacity();
        super::extend(&mut v, b"i");
        assert_eq!(v.capacity(), cap, "no growth while there is room");
    }
}
