//! The attributes a key holds: one value per label.

use std::collections::BTreeMap;
use std::fmt;

/// A set of `label = value` attributes, at most one value per label.
///
/// In text, a label or value may be double-quoted as in a policy, so that
/// it can hold a comma (or, for a label, `=`):
///
/// ```
/// use keyfence_policy::Attributes;
/// let a: Attributes = "country=FR,region=EU".parse().unwrap();
/// assert_eq!(a.get("region"), Some("EU"));
/// let b: Attributes = r#"city="Paris, 2e",team=red"#.parse().unwrap();
/// assert_eq!(b.get("city"), Some("Paris, 2e"));
/// assert_eq!(b.to_string(), r#"city="Paris, 2e",team=red"#);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Attributes {
    map: BTreeMap<String, String>,
}

/// Why an attribute list (`k=v,k=v`) was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttributesError {
    /// An item without `=`.
    #[error("attribute {index} ({item:?}) is not of the form label=value")]
    MissingEquals {
        /// Position in the list, from 0.
        index: usize,
        /// The item as given.
        item: String,
    },
    /// An empty label or value.
    #[error("attribute {index} has an empty label or value")]
    Empty {
        /// Position in the list, from 0.
        index: usize,
    },
    /// The same label twice.
    #[error("label {label:?} is given more than once")]
    Duplicate {
        /// The repeated label.
        label: String,
    },
    /// A label or value that is not in Unicode NFC: keys and policies
    /// compare bytes, and the composed and decomposed forms of one text
    /// look the same but differ (see [`crate::is_nfc`]).
    #[error(
        "attribute {index}: {part} not in Unicode NFC (composed) form: write {composed}; \
         labels and values compare byte for byte, and the two forms of one text differ"
    )]
    NotNfc {
        /// Position in the list (for a set built from pairs, in label
        /// order), from 0.
        index: usize,
        /// `label` or `value`.
        part: &'static str,
        /// The same text in NFC, quoted as policy text.
        composed: String,
    },
    /// A quoted label or value that is malformed (unterminated, an escape
    /// other than `\"` and `\\`, a control character, empty), or text
    /// after its closing quote.
    #[error("attribute {index}: {problem}")]
    Quoted {
        /// Position in the list, from 0.
        index: usize,
        /// What is wrong, in words.
        problem: String,
    },
}

impl AttributesError {
    /// The stable name of this error's code, `INVALID_ATTRIBUTES` for every
    /// variant: the name `keyfence::ErrorCode` gives it (listed in
    /// `docs/errors.md`), for callers of this crate alone.
    pub fn code(&self) -> &'static str {
        "INVALID_ATTRIBUTES"
    }
}

impl Attributes {
    /// An attribute set from `(label, value)` pairs, checked as text is:
    /// no empty label or value, no label twice, every label and value in
    /// Unicode NFC. What a binding builds from a map.
    ///
    /// ```
    /// use keyfence_policy::{Attributes, AttributesError};
    /// let a = Attributes::try_from_pairs([("city", "Z\u{fc}rich")]).unwrap();
    /// assert_eq!(a.get("city"), Some("Z\u{fc}rich"));
    /// let e = Attributes::try_from_pairs([("city", "Zu\u{308}rich")]).unwrap_err();
    /// assert!(matches!(e, AttributesError::NotNfc { part: "value", .. }));
    /// ```
    ///
    /// # Errors
    /// [`AttributesError::Empty`], [`AttributesError::Duplicate`],
    /// [`AttributesError::NotNfc`], naming the pair by its position in
    /// `pairs`.
    pub fn try_from_pairs<L: Into<String>, V: Into<String>>(pairs: impl IntoIterator<Item = (L, V)>) -> Result<Self, AttributesError> {
        let mut out = Attributes::default();
        for (index, (label, value)) in pairs.into_iter().enumerate() {
            let (label, value) = (label.into(), value.into());
            check_pair(index, &label, &value)?;
            if out.map.contains_key(&label) {
                return Err(AttributesError::Duplicate { label });
            }
            out.map.insert(label, value);
        }
        Ok(out)
    }

    /// Checks what [`Attributes::from_pairs`] and [`Attributes::insert`]
    /// do not: no empty label or value, every label and value in NFC. Key
    /// generation calls it, so no key is issued for attributes that no
    /// policy text could name.
    ///
    /// # Errors
    /// [`AttributesError::Empty`] or [`AttributesError::NotNfc`], naming
    /// the attribute by its position in label order.
    pub fn validate(&self) -> Result<(), AttributesError> {
        self.iter().enumerate().try_for_each(|(index, (label, value))| check_pair(index, label, value))
    }

    /// An attribute set from `(label, value)` pairs; a later pair replaces
    /// an earlier one with the same label. Nothing is checked here (use
    /// [`Attributes::try_from_pairs`] for input); key generation checks
    /// with [`Attributes::validate`].
    pub fn from_pairs<L: Into<String>, V: Into<String>>(pairs: impl IntoIterator<Item = (L, V)>) -> Self {
        Self { map: pairs.into_iter().map(|(l, v)| (l.into(), v.into())).collect() }
    }

    /// Sets `label` to `value`, returning the previous value.
    pub fn insert(&mut self, label: impl Into<String>, value: impl Into<String>) -> Option<String> {
        self.map.insert(label.into(), value.into())
    }

    /// The value of `label`, if any.
    pub fn get(&self, label: &str) -> Option<&str> {
        self.map.get(label).map(String::as_str)
    }

    /// Number of labels.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are no attributes.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The attributes in label order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.map.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl std::str::FromStr for Attributes {
    type Err = AttributesError;

    /// Parses `label=value,label=value`; whitespace around labels and
    /// values is trimmed, an unquoted value may contain `=`, an empty
    /// string is the empty set. A label or value that starts with `"` is a
    /// quoted word as in a policy (`\"` and `\\` escapes), and may then
    /// hold commas, `=` and outer spaces.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = Attributes::default();
        if s.trim().is_empty() {
            return Ok(out);
        }
        let mut at = 0;
        let mut index = 0;
        loop {
            let start = at;
            let (k, after_k) = word(s, at, index, b"=,")?;
            if s.as_bytes().get(after_k) != Some(&b'=') {
                let end = s[start..].find(',').map_or(s.len(), |i| start + i);
                return Err(AttributesError::MissingEquals { index, item: s[start..end].trim().to_owned() });
            }
            let (v, after_v) = word(s, after_k + 1, index, b",")?;
            check_pair(index, &k, &v)?;
            if out.map.contains_key(&k) {
                return Err(AttributesError::Duplicate { label: k });
            }
            out.map.insert(k, v);
            if after_v >= s.len() {
                return Ok(out);
            }
            // `word` stops only at a byte of its stop set or the end.
            at = after_v + 1;
            index += 1;
        }
    }
}

/// The checks every label and value must pass, however it was given.
fn check_pair(index: usize, label: &str, value: &str) -> Result<(), AttributesError> {
    if label.is_empty() || value.is_empty() {
        return Err(AttributesError::Empty { index });
    }
    for (part, text) in [("label", label), ("value", value)] {
        if !crate::unicode::is_nfc(text) {
            return Err(AttributesError::NotNfc { index, part, composed: crate::unicode::composed(text) });
        }
    }
    Ok(())
}

/// Reads one label or value of item `index` from byte `at`: a quoted word,
/// or everything up to the first byte of `stop` (trimmed). Returns the
/// word and the offset of the stop byte (or the end of `s`).
fn word(s: &str, at: usize, index: usize, stop: &[u8]) -> Result<(String, usize), AttributesError> {
    let bytes = s.as_bytes();
    let lead = s[at..].len() - s[at..].trim_start().len();
    let begin = at + lead;
    if bytes.get(begin) == Some(&b'"') {
        let (w, end) = crate::lexer::quoted(s, begin).map_err(|e| match e.kind() {
            crate::ParseErrorKind::NotNfc { composed } => {
                AttributesError::NotNfc { index, part: if stop.contains(&b'=') { "label" } else { "value" }, composed: composed.clone() }
            }
            kind => AttributesError::Quoted { index, problem: kind.to_string() },
        })?;
        let rest = s[end..].trim_start();
        let next = end + (s[end..].len() - rest.len());
        match bytes.get(next) {
            None => Ok((w, next)),
            Some(b) if stop.contains(b) => Ok((w, next)),
            Some(_) => Err(AttributesError::Quoted {
                index,
                problem: "text after a closing `\"`: expected `=` after a label, `,` after a value".to_owned(),
            }),
        }
    } else {
        let end = bytes[at..].iter().position(|b| stop.contains(b)).map_or(s.len(), |i| at + i);
        Ok((s[at..end].trim().to_owned(), end))
    }
}

impl fmt::Display for Attributes {
    /// `label=value,...`, quoting a label or value only where the bare
    /// text would not parse back to it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write_part(k, "=,", f)?;
            f.write_str("=")?;
            write_part(v, ",", f)?;
        }
        Ok(())
    }
}

fn write_part(word: &str, stop: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let bare = !word.starts_with('"') && word.trim() == word && !word.contains(|c: char| stop.contains(c));
    if bare {
        return f.write_str(word);
    }
    crate::word::write_quoted(word, f)
}

impl<L: Into<String>, V: Into<String>> FromIterator<(L, V)> for Attributes {
    fn from_iter<I: IntoIterator<Item = (L, V)>>(iter: I) -> Self {
        Self::from_pairs(iter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Attributes, AttributesError> {
        s.parse()
    }

    #[test]
    fn quoted_words_hold_commas_and_round_trip() {
        let a = parse(r#" "data center" = "fra, 1" , city="S\"P\\" , x=a=b "#).unwrap();
        assert_eq!(a.get("data center"), Some("fra, 1"));
        assert_eq!(a.get("city"), Some(r#"S"P\"#));
        assert_eq!(a.get("x"), Some("a=b"));
        assert_eq!(parse(&a.to_string()).unwrap(), a);
        let odd = Attributes::from_pairs([("a=b", " c,d "), ("\"q", "\"v")]);
        assert_eq!(parse(&odd.to_string()).unwrap(), odd);
    }

    #[test]
    fn decomposed_text_is_refused_however_it_is_given() {
        let nfd = "Zu\u{308}rich";
        for s in [format!("city={nfd}"), format!(r#"city="{nfd}""#), r#"a=b,city="Zu\u{308}rich""#.to_owned()] {
            let e = parse(&s).unwrap_err();
            assert!(matches!(e, AttributesError::NotNfc { part: "value", .. }), "{s}: {e}");
            assert!(e.to_string().contains("write \"Z\u{fc}rich\""), "{e}");
        }
        let e = parse("Gru\u{308}n=x").unwrap_err();
        assert!(matches!(e, AttributesError::NotNfc { index: 0, part: "label", .. }), "{e}");
        assert!(parse("city=Z\u{fc}rich").is_ok());

        let e = Attributes::try_from_pairs([("a", "b"), ("city", nfd)]).unwrap_err();
        assert!(matches!(e, AttributesError::NotNfc { index: 1, part: "value", .. }), "{e}");
        assert_eq!(Attributes::try_from_pairs([("a", "")]), Err(AttributesError::Empty { index: 0 }));
        assert_eq!(Attributes::try_from_pairs([("a", "x"), ("a", "y")]), Err(AttributesError::Duplicate { label: "a".into() }));
        let unchecked = Attributes::from_pairs([("b", "x"), ("city", nfd)]);
        assert!(matches!(unchecked.validate(), Err(AttributesError::NotNfc { index: 1, .. })));
        assert_eq!(Attributes::from_pairs([("a", "")]).validate(), Err(AttributesError::Empty { index: 0 }));
    }

    #[test]
    fn malformed_quotes_are_refused_with_the_item() {
        for (s, want) in [
            (r#"a="x"#, "attribute 0: unterminated quoted string"),
            (r#"a=b,c="x" y"#, "attribute 1: text after a closing"),
            (r#"a="\n""#, "attribute 0: invalid escape"),
            (r#""a" b=c"#, "attribute 0: text after a closing"),
        ] {
            let e = parse(s).unwrap_err().to_string();
            assert!(e.starts_with(want), "{s}: {e}");
        }
        assert_eq!(parse("a=b,c"), Err(AttributesError::MissingEquals { index: 1, item: "c".into() }));
        assert_eq!(parse(r#"a="x",a=y"#), Err(AttributesError::Duplicate { label: "a".into() }));
    }
}
