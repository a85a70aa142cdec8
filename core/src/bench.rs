//! Measuring tools for `keyfence bench` and the benchmarks, behind the
//! `bench` feature: what a benchmark compares against, not what a
//! program using keyfence calls.
//!
//! - [`decrypt_floor`]: the primitives a CP-ABE decryption cannot skip,
//!   timed on this machine, so a benchmark reports how close decryption
//!   comes to its lower bound.
//! - [`abe_cases`]: CIRCL's CP-ABE benchmark shapes, so every benchmark
//!   of decryption measures the same policies.
//! - The simulated offload device, `sign::offload::SimDevice` (with the
//!   `sign` feature), stands where a QAT device would for
//!   `keyfence bench sign --path offload-sim`.

pub use crate::abe::floor::{decrypt_floor, DecryptFloor};

use crate::policy::Attributes;

/// CIRCL's CP-ABE benchmark shapes, as `(name, policy, key attributes)`:
/// `small` (two attributes), `and50` and `or50` (50 clauses joined by `and`
/// or `or`) and `and50neg25` (50 clauses, every second one negated). The
/// key satisfies every policy. `keyfence bench abe`, the criterion bench
/// and the comparison with CIRCL all measure these, so their figures can
/// be set side by side.
///
/// ```
/// let cases = keyfence::bench::abe_cases();
/// assert_eq!(cases.iter().map(|c| c.0).collect::<Vec<_>>(), ["small", "and50", "or50", "and50neg25"]);
/// ```
pub fn abe_cases() -> Vec<(&'static str, String, Attributes)> {
    crate::abe::circl_benchmark_shapes()
}
