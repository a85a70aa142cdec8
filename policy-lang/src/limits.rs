//! Limits of the policy language, and the size of a policy inside a
//! ciphertext.
//!
//! The ciphertext format (CIRCL tkn20 `v1.3.8`) stores the policy behind a
//! 16-bit length prefix. (It stores the policy as written: the term the
//! Boneh-Katz transform adds is rebuilt by the decryptor from the
//! ciphertext's id, so it costs nothing here.) CIRCL does not check the
//! length, so a large
//! enough policy encrypts to a ciphertext whose policy field wraps around
//! and that nothing can decrypt (CIRCL issue 695). keyfence computes the
//! encoded size while parsing and refuses such policies up front.

/// Deepest nesting accepted, counted as CIRCL counts it: the policy itself
/// is level 1, and each parenthesised group and each `not` adds one.
/// Equal to CIRCL's limit, so every policy CIRCL parses also parses here.
pub const MAX_DEPTH: usize = 64;

/// Largest encoded policy the ciphertext format can carry (16-bit length).
pub const MAX_ENCODED_POLICY: usize = u16::MAX as usize;

/// Bytes of a serialized BLS12-381 scalar (the hashed attribute value each
/// encoded term carries).
const SCALAR_LEN: usize = 32;

/// Policy field overhead: formula length, gate count, wire count.
const FIXED: usize = 2 + 2 + 2;
/// Per gate: class byte and three 16-bit wire numbers.
const PER_GATE: usize = 7;
/// Per term, besides its label and value bytes: the term's own length
/// prefix, label and value prefixes, scalar prefix and scalar, sign byte.
const PER_TERM: usize = 2 + 2 + 2 + 2 + SCALAR_LEN + 1;

/// Encoded size of one term with the given label and value lengths,
/// including the gate that joins it to the rest of the formula.
pub(crate) const fn term_cost(label_len: usize, value_len: usize) -> usize {
    PER_TERM + label_len + value_len + PER_GATE
}

/// Encoded size of the policy field for a policy of at least one term
/// whose terms cost `terms_cost` in total (a sum of [`term_cost`]); `n`
/// terms need `n - 1` gates, so one gate is over-counted.
pub(crate) const fn encoded_size(terms_cost: usize) -> usize {
    FIXED + terms_cost - PER_GATE
}

/// Bytes `policy` takes in a ciphertext's policy field (CIRCL's
/// encoding, without the Boneh-Katz term). [`crate::parse`] refuses any
/// policy for which this passes [`MAX_ENCODED_POLICY`]; the CP-ABE encoder
/// is tested to produce exactly this many bytes.
///
/// ```
/// let p = keyfence_policy::parse("a: xy").unwrap();
/// assert_eq!(keyfence_policy::limits::encoded_len(&p), 50);
/// ```
pub fn encoded_len(policy: &crate::Policy) -> usize {
    let terms: usize = policy.leaves().iter().map(|l| term_cost(l.label.len(), l.value.len())).sum();
    encoded_size(terms)
}

/// Most terms a policy can have and still fit [`MAX_ENCODED_POLICY`]
/// (every label and value at least one byte long).
pub const MAX_LEAVES: usize = (MAX_ENCODED_POLICY + PER_GATE - FIXED) / term_cost(1, 1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_leaves_is_tight() {
        assert_eq!(MAX_LEAVES, 1310);
        assert!(encoded_size(MAX_LEAVES * term_cost(1, 1)) <= MAX_ENCODED_POLICY);
        assert!(encoded_size((MAX_LEAVES + 1) * term_cost(1, 1)) > MAX_ENCODED_POLICY);
    }
}
