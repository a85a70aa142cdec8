//! Words: what a label or value may be, and how one is written so that it
//! lexes back to itself. The bottom of the crate: every other module may
//! use it, it uses none of them.

use std::fmt;

/// Bytes of an unquoted word (an identifier): `[A-Za-z0-9_]`.
pub(crate) fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Writes `word` bare when it lexes back as a single identifier, else as a
/// double-quoted string with `"` and `\` escaped.
pub(crate) fn write_word(word: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let bare = !word.is_empty() && word.bytes().all(is_ident_byte) && !matches!(word, "and" | "or" | "not");
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
    c.is_control() || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}
