//! A policy as wrapping carries it: parsed once, with its canonical text
//! and its id, so that deciding whether a machine can open an envelope
//! evaluates a circuit instead of parsing text again.

use std::fmt;
use std::ops::Deref;

use keyfence_policy::{Attributes, ParseError, Policy};

use super::error::{malformed, Result};

/// A policy's id: BLAKE2b-256 of its canonical text, domain-separated.
pub fn policy_id(canonical: &str) -> [u8; 32] {
    let h = blake2b_simd::Params::new().hash_length(32).personal(b"keyfence.pol.v1").hash(canonical.as_bytes());
    // The hash was asked for 32 bytes, so this fills the whole array.
    let mut id = [0u8; 32];
    id.iter_mut().zip(h.as_bytes()).for_each(|(o, b)| *o = *b);
    id
}

/// A parsed policy with its canonical text and [`policy_id`], built once
/// and carried as one value: the three always agree.
///
/// It reads as its canonical text (`Display`, `Deref<Target = str>`).
///
/// ```
/// use keyfence::wrap::CanonicalPolicy;
/// let p = CanonicalPolicy::parse("(region: EU)")?;
/// assert_eq!(p.as_str(), "region: EU");
/// assert_eq!(p.id(), &keyfence::wrap::policy_id("region: EU"));
/// assert!(p.eval(&"region=EU".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanonicalPolicy {
    circuit: Policy,
    text: String,
    id: [u8; 32],
}

impl CanonicalPolicy {
    /// Parses policy text in any form (extra parentheses, `not` over a
    /// group) into its canonical value.
    ///
    /// # Errors
    /// [`ParseError`] with the position, as [`keyfence_policy::parse`].
    pub fn parse(text: &str) -> std::result::Result<Self, ParseError> {
        keyfence_policy::parse(text).map(Self::from_policy)
    }

    /// The canonical value of an already parsed policy.
    pub fn from_policy(circuit: Policy) -> Self {
        let text = circuit.to_string();
        let id = policy_id(&text);
        Self { circuit, text, id }
    }

    /// A policy read from a stored object next to its id: the id must be
    /// the text's, and the text canonical, so that one policy has one
    /// encoding.
    pub(crate) fn decode(text: &str, id: &[u8; 32], object: &'static str) -> Result<Self> {
        if *id != policy_id(text) {
            return Err(malformed(object, "policy id does not match the policy"));
        }
        let p = Self::parse(text).map_err(|e| malformed(object, format!("field policy: {e}")))?;
        if p.text != text {
            return Err(malformed(object, "field policy: not in canonical form"));
        }
        Ok(p)
    }

    /// The circuit.
    pub fn circuit(&self) -> &Policy {
        &self.circuit
    }

    /// The canonical text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The policy id (hash of the canonical text).
    pub fn id(&self) -> &[u8; 32] {
        &self.id
    }

    /// Whether `attrs` satisfy the policy (no cryptography).
    pub fn eval(&self, attrs: &Attributes) -> bool {
        self.circuit.eval(attrs)
    }
}

impl fmt::Display for CanonicalPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Deref for CanonicalPolicy {
    type Target = str;

    fn deref(&self) -> &str {
        &self.text
    }
}

impl AsRef<str> for CanonicalPolicy {
    fn as_ref(&self) -> &str {
        &self.text
    }
}
