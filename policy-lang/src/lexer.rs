//! Turns policy text into tokens, each with the byte offset where it starts.
//!
//! The unquoted token set is CIRCL's: identifiers `[A-Za-z0-9_]+`, the
//! lowercase keywords `and`, `or`, `not`, `(`, `)`, `:`, and the whitespace
//! bytes space, tab, CR and LF. Double-quoted strings are keyfence's
//! extension; they are never keywords.

use crate::error::{ParseError, ParseErrorKind};
use crate::word::is_ident_byte;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tok {
    LParen,
    RParen,
    Colon,
    And,
    Or,
    Not,
    /// A label or a value, unescaped.
    Word(String),
    Eof,
}

impl Tok {
    /// How the token is named in error messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::LParen => "`(`".into(),
            Tok::RParen => "`)`".into(),
            Tok::Colon => "`:`".into(),
            Tok::And => "`and`".into(),
            Tok::Or => "`or`".into(),
            Tok::Not => "`not`".into(),
            Tok::Word(w) => format!("{w:?}"),
            Tok::Eof => "end of input".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    pub(crate) offset: usize,
}

pub(crate) fn tokenize(src: &str) -> Result<Vec<Token>, ParseError> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        let b = bytes[i];
        let tok = match b {
            b' ' | b'\t' | b'\r' | b'\n' => {
                i += 1;
                continue;
            }
            b'(' => {
                i += 1;
                Tok::LParen
            }
            b')' => {
                i += 1;
                Tok::RParen
            }
            b':' => {
                i += 1;
                Tok::Colon
            }
            b'"' => {
                let (word, end) = quoted(src, i)?;
                i = end;
                Tok::Word(word)
            }
            _ if is_ident_byte(b) => {
                while i < bytes.len() && is_ident_byte(bytes[i]) {
                    i += 1;
                }
                match &src[start..i] {
                    "and" => Tok::And,
                    "or" => Tok::Or,
                    "not" => Tok::Not,
                    w => Tok::Word(w.to_owned()),
                }
            }
            _ => {
                let c = src[i..].chars().next().unwrap_or('\u{fffd}');
                return Err(ParseError::new(i, ParseErrorKind::UnexpectedChar(c)));
            }
        };
        out.push(Token { tok, offset: start });
    }
    out.push(Token { tok: Tok::Eof, offset: src.len() });
    Ok(out)
}

/// Reads `{HEX}` (1 to 6 hex digits naming a Unicode scalar value) at the
/// start of `rest`; returns the character and the bytes read (all ASCII,
/// so also the chars read).
fn unicode_escape(rest: &str) -> Option<(char, usize)> {
    let body = rest.strip_prefix('{')?;
    let close = body.find('}')?;
    let hex = &body[..close];
    if hex.is_empty() || hex.len() > 6 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let c = char::from_u32(u32::from_str_radix(hex, 16).ok()?)?;
    Some((c, close + 2))
}

/// Reads a quoted string starting at the `"` at `start`; returns the
/// unescaped text and the offset just past the closing quote.
pub(crate) fn quoted(src: &str, start: usize) -> Result<(String, usize), ParseError> {
    let mut word = String::new();
    let mut chars = src[start + 1..].char_indices();
    while let Some((rel, c)) = chars.next() {
        let at = start + 1 + rel;
        match c {
            '"' => {
                if word.is_empty() {
                    return Err(ParseError::new(start, ParseErrorKind::EmptyString));
                }
                // Unquoted words are ASCII; only quoted ones can be
                // decomposed, whether written raw or through `\u{..}`.
                if !crate::unicode::is_nfc(&word) {
                    let composed = crate::unicode::composed(&word);
                    return Err(ParseError::new(start, ParseErrorKind::NotNfc { composed }));
                }
                return Ok((word, at + 1));
            }
            '\\' => match chars.next() {
                Some((_, e @ ('"' | '\\'))) => word.push(e),
                // `\u{1b}`: how canonical text writes characters that must
                // not reach a terminal raw (controls, bidi overrides).
                Some((_, 'u')) => {
                    let rest = &src[start + 1 + rel + 2..];
                    let Some((c, len)) = unicode_escape(rest) else {
                        return Err(ParseError::new(at, ParseErrorKind::InvalidEscape('u')));
                    };
                    word.push(c);
                    // Skip the `{hex}` just read.
                    for _ in 0..len {
                        chars.next();
                    }
                }
                Some((_, e)) => return Err(ParseError::new(at, ParseErrorKind::InvalidEscape(e))),
                None => return Err(ParseError::new(start, ParseErrorKind::UnterminatedString)),
            },
            c if c.is_control() => return Err(ParseError::new(at, ParseErrorKind::ControlCharInString)),
            c => word.push(c),
        }
    }
    Err(ParseError::new(start, ParseErrorKind::UnterminatedString))
}
