//! Labels and values must be in Unicode Normalization Form C.
//!
//! Keys and policies compare labels and values byte for byte (so does
//! CIRCL, and a ciphertext hashes its values as bytes). `é` written as one
//! code point (NFC) and as `e` plus U+0301 (NFD) look identical and would
//! be different values: a key issued for one would silently fail a policy
//! written with the other. keyfence refuses text that is not in NFC where
//! it enters (policy text, attribute lists, key generation) rather than
//! normalising it, so the bytes a caller wrote are the bytes that are
//! encrypted under, and a mismatch is a clear error instead of a key that
//! does not open.

use std::fmt;

use unicode_normalization::UnicodeNormalization;

/// Whether `text` is in Unicode Normalization Form C, the form keyfence
/// requires of every label and value.
///
/// ```
/// assert!(keyfence_policy::is_nfc("Z\u{fc}rich"));
/// assert!(!keyfence_policy::is_nfc("Zu\u{308}rich"));
/// ```
pub fn is_nfc(text: &str) -> bool {
    text.is_ascii() || unicode_normalization::is_nfc(text)
}

/// `text` in NFC, written as a quoted policy word (escapes included), for
/// messages that tell the writer what to use instead.
pub(crate) fn composed(text: &str) -> String {
    struct Quoted<'a>(&'a str);
    impl fmt::Display for Quoted<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            crate::word::write_quoted(self.0, f)
        }
    }
    let nfc: String = text.nfc().collect();
    Quoted(&nfc).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composed_and_decomposed_forms() {
        assert!(is_nfc("S\u{e3}o Paulo"));
        assert!(!is_nfc("Sa\u{303}o Paulo"));
        assert_eq!(composed("Sa\u{303}o \"P\""), "\"S\u{e3}o \\\"P\\\"\"");
        // Hangul: jamo sequences compose to syllables.
        assert!(!is_nfc("\u{1100}\u{1161}"));
        assert_eq!(composed("\u{1100}\u{1161}"), "\"\u{ac00}\"");
        // Singletons: the Ångström sign is not NFC, its composition is Å.
        assert!(!is_nfc("\u{212b}"));
    }
}
