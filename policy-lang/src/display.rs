//! Canonical text of a compiled policy.

use std::fmt;

use crate::circuit::{GateKind, Policy};
use crate::word::write_word;

impl fmt::Display for Policy {
    /// The canonical text: `not` only on terms, `and` binding tighter than
    /// `or`, parentheses only where needed, labels and values quoted only
    /// when they are not plain identifiers.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_wire(self, self.output_wire(), None, f)
    }
}

/// Writes the sub-circuit driving `wire`. `parent` is the kind of the gate
/// it feeds and whether it is that gate's second input: a sub-expression
/// needs parentheses when it binds looser than its parent (`or` under
/// `and`), or when it is the right operand of the same operator, because
/// the operators are left associative and the numbering of gates must
/// survive a re-parse.
fn write_wire(p: &Policy, wire: usize, parent: Option<(GateKind, bool)>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let Some(g) = p.gate_driving(wire) else {
        let leaf = &p.leaves()[wire];
        if !leaf.positive {
            f.write_str("not ")?;
        }
        write_word(&leaf.label, f)?;
        f.write_str(": ")?;
        return write_word(&leaf.value, f);
    };
    let parens = match parent {
        Some((GateKind::And, _)) if g.kind == GateKind::Or => true,
        Some((k, true)) if k == g.kind => true,
        _ => false,
    };
    if parens {
        f.write_str("(")?;
    }
    write_wire(p, g.in0, Some((g.kind, false)), f)?;
    write!(f, " {} ", g.kind.keyword())?;
    write_wire(p, g.in1, Some((g.kind, true)), f)?;
    if parens {
        f.write_str(")")?;
    }
    Ok(())
}
