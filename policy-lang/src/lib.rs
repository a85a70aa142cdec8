//! The keyfence policy language.
//!
//! A policy says which keys may open a ciphertext:
//!
//! ```text
//! country: US or (not region: EU)
//! ```
//!
//! [`parse`] turns the text into a [`Policy`]: a monotone circuit of
//! `and`/`or` gates over leaves `label: value` or `not label: value`, the
//! form the CP-ABE scheme encrypts under. The language is the one CIRCL's
//! `tkn20` accepts, with two differences:
//!
//! * **Quoted words.** Labels and values may be double-quoted strings with
//!   `\"` and `\\` escapes (`city: "São Paulo"`, `team: "red-1"`,
//!   `word: "and"`). CIRCL cannot parse such policies, though it decrypts
//!   ciphertexts made under them.
//! * **Stricter.** Text after a complete policy is an error (CIRCL ignores
//!   it, issue 697), and a policy whose encoding would overflow the
//!   ciphertext format's 16-bit length field is refused (CIRCL encrypts to
//!   it and the result can never be decrypted, issue 695).
//!
//! Grammar (whitespace is space, tab, CR, LF; keywords are lowercase):
//!
//! ```text
//! policy  = or EOF
//! or      = and { "or" and }
//! and     = not { "and" not }
//! not     = "not" not | primary
//! primary = "(" or ")" | word ":" word
//! word    = [A-Za-z0-9_]+ (not a keyword) | '"' ( [^"\\] | '\"' | '\\' )+ '"'
//! ```
//!
//! `not` binds tightest, then `and`, then `or`; both binary operators are
//! left associative. `not L: v` holds only when the key **has** label `L`
//! with another value: a key without `L` satisfies neither `L: v` nor
//! `not L: v` (CIRCL's semantics, which keep the circuit monotone).
//!
//! Errors carry the byte offset of the problem and render with a caret:
//!
//! ```
//! let src = "country: US) and region: EU";
//! let err = keyfence_policy::parse(src).unwrap_err();
//! assert_eq!(
//!     err.render(src),
//!     "invalid policy at byte 11: unexpected `)`: no `(` is open here (the policy already ended)\n  \
//!      country: US) and region: EU\n             ^"
//! );
//! ```

// Direction: each module uses only those before it, bottom to top:
// error, word (what a label or value may be, and its quoting), unicode, lexer,
// attributes, ast, circuit, limits, parser, display (a circuit's canonical text).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod ast;
mod attributes;
mod circuit;
mod display;
mod error;
mod lexer;
pub mod limits;
mod parser;
mod unicode;
mod word;

pub use ast::Expr;
pub use attributes::{Attributes, AttributesError};
pub use circuit::{circl_order, occurrence_numbers, satisfying_wires, CircuitError, Gate, GateKind, Leaf, Policy};
pub use error::{ParseError, ParseErrorKind};
pub use limits::{MAX_DEPTH, MAX_ENCODED_POLICY, MAX_LEAVES};
pub use parser::parse_expr;
pub use unicode::is_nfc;
pub use word::must_escape;

/// Parses and compiles a policy.
///
/// # Errors
/// [`ParseError`] with the byte offset and what was expected, for text
/// that is not a policy, nests deeper than [`MAX_DEPTH`], or would not fit
/// the ciphertext format ([`ParseErrorKind::TooLarge`]).
///
/// ```
/// use keyfence_policy::{parse, Attributes};
/// let p = parse("country: US or region: EU").unwrap();
/// let fr_eu: Attributes = "country=FR,region=EU".parse().unwrap();
/// assert!(p.eval(&fr_eu));
/// ```
pub fn parse(src: &str) -> Result<Policy, ParseError> {
    let (expr, offsets) = parser::parse_with_offsets(src)?;
    let policy = Policy::from_expr(&expr);
    let mut cost = 0;
    let mut first_over = None;
    for (leaf, &offset) in policy.leaves().iter().zip(&offsets) {
        cost += limits::term_cost(leaf.label.len(), leaf.value.len());
        if first_over.is_none() && limits::encoded_size(cost) > MAX_ENCODED_POLICY {
            first_over = Some(offset);
        }
    }
    if let Some(offset) = first_over {
        return Err(ParseError::new(offset, ParseErrorKind::TooLarge { encoded: limits::encoded_size(cost), limit: MAX_ENCODED_POLICY }));
    }
    Ok(policy)
}

impl std::str::FromStr for Policy {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}
