//! Parse errors that point at the offending byte of the policy text.

use std::fmt;

/// What went wrong while parsing a policy.
///
/// Every variant names what the parser expected, so that a message can be
/// shown to the person who wrote the policy without further context.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// A byte that cannot start any token (only `[A-Za-z0-9_]`, `:`, `(`,
    /// `)`, `"` and whitespace can).
    UnexpectedChar(char),
    /// A double-quoted string that never closes.
    UnterminatedString,
    /// A backslash escape other than `\"` and `\\` inside a quoted string.
    InvalidEscape(char),
    /// A control character inside a quoted string.
    ControlCharInString,
    /// A quoted label or value with nothing in it.
    EmptyString,
    /// A quoted label or value that is not in Unicode NFC: keys and
    /// policies compare bytes, and the composed and decomposed forms of
    /// one text differ (see [`crate::is_nfc`]).
    NotNfc {
        /// The same text in NFC, quoted as policy text.
        composed: String,
    },
    /// A token appeared where something else was required.
    Unexpected {
        /// The token that was found, rendered for humans (`` `)` ``, `end of input`).
        found: String,
        /// What the grammar allows at this point.
        expected: &'static str,
    },
    /// A `)` with no open `(` before it (text after a complete policy).
    UnmatchedClose,
    /// Parentheses and `not` nested deeper than [`crate::MAX_DEPTH`].
    TooDeep {
        /// The limit that was exceeded.
        limit: usize,
    },
    /// More leaves than any policy that fits the ciphertext format can have.
    TooManyLeaves {
        /// The limit that was exceeded.
        limit: usize,
    },
    /// The policy parses, but its encoding would overflow the 16-bit length
    /// field of the ciphertext format, so nothing encrypted under it could
    /// ever be decrypted (CIRCL issue 695).
    TooLarge {
        /// Size of the encoded policy in bytes.
        encoded: usize,
        /// The largest size the format can carry.
        limit: usize,
    },
}

impl fmt::Display for ParseErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnexpectedChar(c) => {
                write!(f, "unexpected character {c:?}: labels and values are [A-Za-z0-9_]+ or a \"quoted string\"")
            }
            Self::UnterminatedString => f.write_str("unterminated quoted string: expected a closing `\"`"),
            Self::InvalidEscape(c) => {
                write!(f, "invalid escape `\\{c}` in quoted string: only `\\\"` and `\\\\` are allowed")
            }
            Self::ControlCharInString => f.write_str("control character in quoted string"),
            Self::EmptyString => f.write_str("empty label or value: expected at least one character"),
            Self::NotNfc { composed } => write!(
                f,
                "label or value not in Unicode NFC (composed) form: write {composed}; \
                 labels and values compare byte for byte, and the two forms of one text differ"
            ),
            Self::Unexpected { found, expected } => write!(f, "unexpected {found}: expected {expected}"),
            Self::UnmatchedClose => f.write_str("unexpected `)`: no `(` is open here (the policy already ended)"),
            Self::TooDeep { limit } => {
                write!(f, "policy nested too deeply: at most {limit} levels of parentheses and `not`")
            }
            Self::TooManyLeaves { limit } => {
                write!(f, "policy too large: more than {limit} `label: value` terms cannot fit the ciphertext format")
            }
            Self::TooLarge { encoded, limit } => {
                write!(f, "policy too large: it encodes to {encoded} bytes but the ciphertext format holds at most {limit}")
            }
        }
    }
}

/// A policy that could not be parsed, with the byte offset of the problem.
///
/// `Display` gives a one-line message; [`ParseError::render`] adds the
/// policy text with a caret under the offending byte:
///
/// ```
/// let err = keyfence_policy::parse("country: US) and region: EU").unwrap_err();
/// assert_eq!(err.offset(), 11);
/// assert!(err.render("country: US) and region: EU").ends_with("           ^"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    offset: usize,
    kind: ParseErrorKind,
}

impl ParseError {
    pub(crate) fn new(offset: usize, kind: ParseErrorKind) -> Self {
        Self { offset, kind }
    }

    /// Byte offset into the policy text where the problem was found.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// What went wrong.
    pub fn kind(&self) -> &ParseErrorKind {
        &self.kind
    }

    /// The stable name of this error's code: `POLICY_TOO_LARGE` for a
    /// policy that nests too deeply or does not fit the ciphertext format,
    /// `POLICY_SYNTAX` for everything else. It is the name
    /// `keyfence::ErrorCode` gives the same error (listed in
    /// `docs/errors.md`), for callers of this crate alone.
    ///
    /// ```
    /// assert_eq!(keyfence_policy::parse("a: b or").unwrap_err().code(), "POLICY_SYNTAX");
    /// ```
    pub fn code(&self) -> &'static str {
        match self.kind {
            ParseErrorKind::TooDeep { .. } | ParseErrorKind::TooManyLeaves { .. } | ParseErrorKind::TooLarge { .. } => "POLICY_TOO_LARGE",
            _ => "POLICY_SYNTAX",
        }
    }

    /// The message, the policy text, and a caret under the offending byte.
    ///
    /// Tabs and newlines in the text are shown as spaces so the caret lines
    /// up; the column is counted in characters, not bytes, so multi-byte
    /// UTF-8 inside quoted strings does not push it right. A text longer
    /// than 80 characters is shown as a window of 80 characters
    /// around the caret, with `...` where it was cut: a policy over the
    /// size limit is tens of kilobytes, and echoing all of it buries the
    /// message.
    ///
    /// ```
    /// let long = format!("a: b{})", " or a: b".repeat(1000));
    /// let err = keyfence_policy::parse(&long).unwrap_err();
    /// let shown = err.render(&long);
    /// assert!(shown.lines().all(|l| l.chars().count() < 200));
    /// assert!(shown.lines().nth(1).unwrap().trim_end().ends_with("or a: b)"));
    /// ```
    pub fn render(&self, source: &str) -> String {
        let shown: Vec<char> = source.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
        let cut = self.offset.min(source.len());
        let column = source.get(..cut).map(|s| s.chars().count()).unwrap_or(cut);
        if shown.len() <= RENDER_WIDTH {
            let shown: String = shown.into_iter().collect();
            return format!("{self}\n  {shown}\n  {}^", " ".repeat(column));
        }
        let start = column.saturating_sub(RENDER_WIDTH / 2).min(shown.len() - RENDER_WIDTH);
        let end = start + RENDER_WIDTH;
        let (before, after) = (if start > 0 { "..." } else { "" }, if end < shown.len() { "..." } else { "" });
        let window: String = shown[start..end].iter().collect();
        let caret = before.len() + column - start;
        format!("{self}\n  {before}{window}{after}\n  {}^", " ".repeat(caret))
    }
}

/// The most characters of policy text [`ParseError::render`] shows.
const RENDER_WIDTH: usize = 80;

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid policy at byte {}: {}", self.offset, self.kind)
    }
}

impl std::error::Error for ParseError {}
