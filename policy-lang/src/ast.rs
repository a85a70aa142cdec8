//! The policy as written: a tree of `and`, `or`, `not` over `label: value`
//! terms, before negations are pushed to the leaves.

use crate::attributes::Attributes;

/// A parsed policy expression, exactly as written (with `not` where the
/// author put it).
///
/// Most callers want the compiled [`crate::Policy`]; the expression is
/// exposed for tools that show the policy back to its author and for
/// cross-checking the compiler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// `label: value`.
    Term {
        /// Attribute label, e.g. `country`.
        label: String,
        /// Attribute value, e.g. `US`.
        value: String,
    },
    /// `not e`.
    Not(Box<Expr>),
    /// `a and b`.
    And(Box<Expr>, Box<Expr>),
    /// `a or b`.
    Or(Box<Expr>, Box<Expr>),
}

impl Expr {
    /// Evaluates the expression against `attrs` with CIRCL's negation
    /// semantics: `not L: v` holds only when `attrs` has `L` with a value
    /// other than `v`. A missing label satisfies neither `L: v` nor
    /// `not L: v`, so `not` is not boolean complement; it is pushed to the
    /// terms by De Morgan's laws.
    ///
    /// ```
    /// use keyfence_policy::{parse_expr, Attributes};
    /// let e = parse_expr("not region: EU").unwrap();
    /// assert!(e.eval(&Attributes::from_pairs([("region", "US")])));
    /// assert!(!e.eval(&Attributes::default())); // no region at all
    /// ```
    pub fn eval(&self, attrs: &Attributes) -> bool {
        self.eval_signed(attrs, false)
    }

    fn eval_signed(&self, attrs: &Attributes, negated: bool) -> bool {
        match self {
            Expr::Term { label, value } => match attrs.get(label) {
                None => false,
                Some(have) => (have == value) != negated,
            },
            Expr::Not(e) => e.eval_signed(attrs, !negated),
            Expr::And(a, b) if !negated => a.eval_signed(attrs, false) && b.eval_signed(attrs, false),
            Expr::And(a, b) => a.eval_signed(attrs, true) || b.eval_signed(attrs, true),
            Expr::Or(a, b) if !negated => a.eval_signed(attrs, false) || b.eval_signed(attrs, false),
            Expr::Or(a, b) => a.eval_signed(attrs, true) && b.eval_signed(attrs, true),
        }
    }
}
