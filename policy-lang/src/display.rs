//! Canonical text of a compiled policy.

use std::fmt;

use crate::circuit::{GateKind, Policy};
use crate::lexer::is_ident_byte;

/// Writes `word` bare when it lexes back as a single identifier, else as a
/// double-quoted string with `"` and `\` escaped.
pub(crate) fn write_word(word: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let bare = !word.is_empty()
        && word.bytes().all(is_ident_byte)
        && !matches!(word, "and" | "or" | "not");
    if bare {
        return f.write_str(word);
    }
    write_quoted(word, f)
}

/// Writes `word` as a double-quoted string with `"` and `\` escaped, and
/// characters that must not reach a terminal raw written as `\u{hex}`: the
/// one quoting rule of policies and attribute lists. A policy decoded from
/// an attacker's ciphertext may hold any text; printed, it must neither
/// drive the terminal (escape sequences, bidi overrides that reorder what
/// the reader sees) nor fail to parse again.
pub(crate) fn write_quoted(word: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    f.write_str("\"")?;
    for c in word.chars() {
        if c == '"' || c == '\\' {
            f.write_str("\\")?;
            write!(f, "{c}")?;
        } else if must_escape(c) {
            write!(f, "\\u{{{:x}}}", u32::from(c))?;
        } else {
            write!(f, "{c}")?;
        }
    }
    f.write_str("\"")
}

/// Characters written as `\u{hex}`: controls (C0, DEL, C1) and the
/// invisible formatting characters that change how text around them is
/// shown (zero-width, bidi marks, embeddings, overrides and isolates, line
/// and paragraph separators, the byte-order mark).
pub fn must_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// Writes the sub-circuit driving `wire`. `parent` is the kind of the gate
/// it feeds and whether it is that gate's second input: a sub-expression
/// needs parentheses when it binds looser than its parent (`or` under
/// `and`), or when it is the right operand of the same operator, because
/// the operators are left associative and the numbering of gates must
/// survive a re-parse.
pub(crate) fn write_wire(
    p: &Policy,
    wire: usize,
    parent: Option<(GateKind, bool)>,
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
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
