//! The attributes a key holds: one value per label.

use std::collections::BTreeMap;
use std::fmt;

/// A set of `label = value` attributes, at most one value per label.
///
/// ```
/// use keyfence_policy::Attributes;
/// let a: Attributes = "country=FR,region=EU".parse().unwrap();
/// assert_eq!(a.get("region"), Some("EU"));
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
    /// An attribute set from `(label, value)` pairs; a later pair replaces
    /// an earlier one with the same label.
    pub fn from_pairs<L: Into<String>, V: Into<String>>(pairs: impl IntoIterator<Item = (L, V)>) -> Self {
        Self {
            map: pairs.into_iter().map(|(l, v)| (l.into(), v.into())).collect(),
        }
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

    /// Parses `label=value,label=value`; whitespace around items is
    /// trimmed, values may contain `=`, an empty string is the empty set.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = Attributes::default();
        if s.trim().is_empty() {
            return Ok(out);
        }
        for (index, item) in s.split(',').enumerate() {
            let item = item.trim();
            let (k, v) = item.split_once('=').ok_or_else(|| AttributesError::MissingEquals {
                index,
                item: item.to_owned(),
            })?;
            let (k, v) = (k.trim(), v.trim());
            if k.is_empty() || v.is_empty() {
                return Err(AttributesError::Empty { index });
            }
            if out.insert(k, v).is_some() {
                return Err(AttributesError::Duplicate { label: k.to_owned() });
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Attributes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

impl<L: Into<String>, V: Into<String>> FromIterator<(L, V)> for Attributes {
    fn from_iter<I: IntoIterator<Item = (L, V)>>(iter: I) -> Self {
        Self::from_pairs(iter)
    }
}
