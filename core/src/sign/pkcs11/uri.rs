//! RFC 7512 PKCS#11 URIs: which module, token and object a key is, and
//! where its PIN comes from.
//!
//! `pkcs11:token=edge;object=tls-p256;type=private?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/etc/keyfence/pin`
//!
//! Path attributes (before `?`, separated by `;`) select the token and the
//! object; query attributes (after `?`, separated by `&`) name the module
//! and the PIN's source. Values are percent-encoded. `pin-value` is refused:
//! a URI ends up on command lines, in configuration and in logs, and a PIN
//! there is a PIN anyone on the machine can read (`ps`).

use std::fmt;
use std::path::PathBuf;

/// Why a PKCS#11 URI was refused; `position` is the byte offset in the URI
/// where the problem starts. The message never repeats a PIN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PKCS#11 URI, at byte {position}: {message}")]
pub struct UriError {
    /// Byte offset of the problem in the URI.
    pub position: usize,
    /// What is wrong, and what would work.
    pub message: String,
}

/// The object type a URI names (`type=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectType {
    /// `type=private`: a private key (the only type keyfence signs with).
    Private,
    /// `type=public`.
    Public,
    /// `type=cert`.
    Cert,
    /// `type=secret-key`.
    SecretKey,
    /// `type=data`.
    Data,
}

/// A parsed RFC 7512 PKCS#11 URI.
///
/// `Display` gives the URI back in canonical form, with nothing secret in
/// it (a URI holding a PIN is refused when parsed).
///
/// ```
/// use keyfence::sign::pkcs11::Pkcs11Uri;
/// let uri: Pkcs11Uri = "pkcs11:token=edge;object=tls%20p256;type=private?pin-source=file:/run/pin".parse()?;
/// assert_eq!(uri.token.as_deref(), Some("edge"));
/// assert_eq!(uri.object.as_deref(), Some("tls p256"));
/// assert_eq!(uri.pin_source.as_deref(), Some(std::path::Path::new("/run/pin")));
/// # Ok::<(), keyfence::sign::pkcs11::UriError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pkcs11Uri {
    /// `token=`: the token's label.
    pub token: Option<String>,
    /// `manufacturer=`: the token's manufacturer.
    pub manufacturer: Option<String>,
    /// `serial=`: the token's serial number.
    pub serial: Option<String>,
    /// `model=`: the token's model.
    pub model: Option<String>,
    /// `slot-id=`: the slot's number.
    pub slot_id: Option<u64>,
    /// `object=`: the object's label (`CKA_LABEL`).
    pub object: Option<String>,
    /// `id=`: the object's id (`CKA_ID`), bytes.
    pub id: Option<Vec<u8>>,
    /// `type=`.
    pub object_type: Option<ObjectType>,
    /// `module-path=`: the module's file.
    pub module_path: Option<PathBuf>,
    /// `module-name=`: a module p11-kit knows by name (its `.module` file).
    pub module_name: Option<String>,
    /// `pin-source=`: the file holding the PIN (`file:` URI or a path).
    pub pin_source: Option<PathBuf>,
}

impl std::str::FromStr for Pkcs11Uri {
    type Err = UriError;

    fn from_str(s: &str) -> Result<Self, UriError> {
        Pkcs11Uri::parse(s)
    }
}

impl Pkcs11Uri {
    /// Whether `s` is meant as a PKCS#11 URI (starts with `pkcs11:`), so a
    /// caller that also takes file names knows which it was given.
    pub fn is_uri(s: &str) -> bool {
        s.as_bytes().get(..7).is_some_and(|p| p.eq_ignore_ascii_case(b"pkcs11:"))
    }

    /// Parses `s`.
    ///
    /// # Errors
    /// [`UriError`] naming the position: not a `pkcs11:` URI, an unknown
    /// or repeated attribute, a bad percent escape, a value that is not
    /// UTF-8 where text is needed, a `slot-id` that is not a number, an
    /// unknown `type`, or a `pin-value` (give the PIN in a file instead).
    pub fn parse(s: &str) -> Result<Self, UriError> {
        let err = |position: usize, message: String| UriError { position, message };
        if !Self::is_uri(s) {
            return Err(err(0, "a PKCS#11 URI starts with `pkcs11:` (RFC 7512)".into()));
        }
        let mut uri = Pkcs11Uri::default();
        let (path, query, query_at) = match s.find('?') {
            Some(q) => (&s[7..q], &s[q + 1..], q + 1),
            None => (&s[7..], "", s.len()),
        };
        for (at, attr) in pieces(path, ';', 7) {
            uri.path_attr(at, attr)?;
        }
        for (at, attr) in pieces(query, '&', query_at) {
            uri.query_attr(at, attr)?;
        }
        if uri.module_path.is_some() && uri.module_name.is_some() {
            return Err(err(query_at, "give `module-path` or `module-name`, not both".into()));
        }
        Ok(uri)
    }

    fn path_attr(&mut self, at: usize, attr: &str) -> Result<(), UriError> {
        let (name, value, value_at) = split_attr(at, attr)?;
        let bytes = decode(value, value_at)?;
        let text = |bytes: Vec<u8>| {
            String::from_utf8(bytes).map_err(|_| UriError { position: value_at, message: format!("`{name}` is not UTF-8") })
        };
        let repeated = || UriError { position: at, message: format!("`{name}` is given twice") };
        match name {
            "token" => set(&mut self.token, text(bytes)?).ok_or_else(repeated),
            "manufacturer" => set(&mut self.manufacturer, text(bytes)?).ok_or_else(repeated),
            "serial" => set(&mut self.serial, text(bytes)?).ok_or_else(repeated),
            "model" => set(&mut self.model, text(bytes)?).ok_or_else(repeated),
            "object" => set(&mut self.object, text(bytes)?).ok_or_else(repeated),
            "id" => set(&mut self.id, bytes).ok_or_else(repeated),
            "slot-id" => {
                let n = text(bytes)?
                    .parse::<u64>()
                    .map_err(|_| UriError { position: value_at, message: "`slot-id` is a decimal number".into() })?;
                set(&mut self.slot_id, n).ok_or_else(repeated)
            }
            "type" => {
                let t = match text(bytes)?.as_str() {
                    "private" => ObjectType::Private,
                    "public" => ObjectType::Public,
                    "cert" => ObjectType::Cert,
                    "secret-key" => ObjectType::SecretKey,
                    "data" => ObjectType::Data,
                    _ => {
                        return Err(UriError {
                            position: value_at,
                            message: "`type` is one of private, public, cert, secret-key, data".into(),
                        })
                    }
                };
                set(&mut self.object_type, t).ok_or_else(repeated)
            }
            // Attributes that select a library or slot by description: a
            // token is found by label, serial, manufacturer or slot here,
            // and these narrow nothing further, so they are accepted as
            // RFC 7512 allows and not matched.
            "library-manufacturer" | "library-description" | "library-version" | "slot-description" | "slot-manufacturer" => Ok(()),
            n if n.starts_with("x-") => Ok(()),
            _ => Err(UriError {
                position: at,
                message: format!(
                    "unknown path attribute `{name}`; RFC 7512 names token, manufacturer, serial, model, slot-id, object, id, type"
                ),
            }),
        }
    }

    fn query_attr(&mut self, at: usize, attr: &str) -> Result<(), UriError> {
        let (name, value, value_at) = split_attr(at, attr)?;
        let repeated = || UriError { position: at, message: format!("`{name}` is given twice") };
        let path = |bytes: Vec<u8>| {
            use std::os::unix::ffi::OsStringExt;
            PathBuf::from(std::ffi::OsString::from_vec(bytes))
        };
        match name {
            "pin-value" => Err(UriError {
                position: at,
                message: "a PIN in the URI is refused: URIs end up on command lines and in logs; \
                          put the PIN in a file readable by the signing process only and name it with \
                          `pin-source=file:/path`, or set KEYFENCE_PKCS11_PIN_FILE or KEYFENCE_PKCS11_PIN"
                    .into(),
            }),
            "pin-source" => {
                let bytes = decode(value, value_at)?;
                let bytes = match bytes.strip_prefix(b"file:") {
                    Some(rest) => rest.strip_prefix(b"//").unwrap_or(rest).to_vec(),
                    None => bytes,
                };
                if bytes.first() != Some(&b'/') {
                    return Err(UriError {
                        position: value_at,
                        message: "`pin-source` is an absolute file name (`file:/path` or `/path`)".into(),
                    });
                }
                set(&mut self.pin_source, path(bytes)).ok_or_else(repeated)
            }
            "module-path" => {
                let bytes = decode(value, value_at)?;
                if bytes.first() != Some(&b'/') {
                    return Err(UriError { position: value_at, message: "`module-path` is an absolute file name".into() });
                }
                set(&mut self.module_path, path(bytes)).ok_or_else(repeated)
            }
            "module-name" => {
                let name = String::from_utf8(decode(value, value_at)?)
                    .ok()
                    .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) && !n.starts_with('.'))
                    .ok_or_else(|| UriError {
                        position: value_at,
                        message: "`module-name` is a p11-kit module's name (letters, digits, `-`, `_`, `.`)".into(),
                    })?;
                set(&mut self.module_name, name).ok_or_else(repeated)
            }
            n if n.starts_with("x-") => Ok(()),
            _ => Err(UriError {
                position: at,
                message: format!("unknown query attribute `{name}`; keyfence reads module-path, module-name, pin-source"),
            }),
        }
    }
}

/// `slot` := `value` unless it is set already (then `None`).
fn set<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

/// The non-empty pieces of `s` between `sep`, with their offsets (`base`
/// is the offset of `s` in the URI).
fn pieces(s: &str, sep: char, base: usize) -> impl Iterator<Item = (usize, &str)> {
    let mut at = base;
    s.split(sep).filter_map(move |piece| {
        let here = at;
        at += piece.len() + 1;
        (!piece.is_empty()).then_some((here, piece))
    })
}

fn split_attr(at: usize, attr: &str) -> Result<(&str, &str, usize), UriError> {
    let eq = attr.find('=').ok_or_else(|| UriError { position: at, message: format!("`{}` has no `=value`", shorten(attr)) })?;
    Ok((&attr[..eq], &attr[eq + 1..], at + eq + 1))
}

fn shorten(s: &str) -> String {
    s.chars().take(40).collect()
}

/// Percent-decodes `s` (at offset `at` in the URI).
fn decode(s: &str, at: usize) -> Result<Vec<u8>, UriError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = |c: u8| (c as char).to_digit(16);
            match (b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
                (Some(h), Some(l)) => out.push((h * 16 + l) as u8),
                _ => return Err(UriError { position: at + i, message: "a `%` is followed by two hex digits".into() }),
            }
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// Percent-encodes what RFC 7512 does not allow unescaped in a value.
fn encode(bytes: &[u8], out: &mut String) {
    for &c in bytes {
        if c.is_ascii_alphanumeric() || b"-._~:[]@!$'()*+,=&/".contains(&c) && c != b';' {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
}

impl fmt::Display for Pkcs11Uri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use std::os::unix::ffi::OsStrExt;
        let mut path = Vec::new();
        let mut attr = |name: &str, bytes: &[u8]| {
            let mut s = format!("{name}=");
            encode(bytes, &mut s);
            path.push(s);
        };
        if let Some(v) = &self.token {
            attr("token", v.as_bytes());
        }
        if let Some(v) = &self.manufacturer {
            attr("manufacturer", v.as_bytes());
        }
        if let Some(v) = &self.serial {
            attr("serial", v.as_bytes());
        }
        if let Some(v) = &self.model {
            attr("model", v.as_bytes());
        }
        if let Some(v) = self.slot_id {
            attr("slot-id", v.to_string().as_bytes());
        }
        if let Some(v) = &self.object {
            attr("object", v.as_bytes());
        }
        if let Some(v) = &self.id {
            let mut s = String::from("id=");
            for c in v {
                s.push_str(&format!("%{c:02X}"));
            }
            path.push(s);
        }
        if let Some(t) = self.object_type {
            let t = match t {
                ObjectType::Private => "private",
                ObjectType::Public => "public",
                ObjectType::Cert => "cert",
                ObjectType::SecretKey => "secret-key",
                ObjectType::Data => "data",
            };
            path.push(format!("type={t}"));
        }
        let mut query = Vec::new();
        let mut q = |name: &str, bytes: &[u8]| {
            let mut s = format!("{name}=");
            encode(bytes, &mut s);
            query.push(s.replace('&', "%26"));
        };
        if let Some(p) = &self.module_path {
            q("module-path", p.as_os_str().as_bytes());
        }
        if let Some(n) = &self.module_name {
            q("module-name", n.as_bytes());
        }
        if let Some(p) = &self.pin_source {
            let mut b = b"file:".to_vec();
            b.extend_from_slice(p.as_os_str().as_bytes());
            q("pin-source", &b);
        }
        write!(f, "pkcs11:{}", path.join(";"))?;
        if !query.is_empty() {
            write!(f, "?{}", query.join("&"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_7512_examples_parse() {
        let u = Pkcs11Uri::parse("pkcs11:token=The%20Software%20PKCS%2311%20Softtoken;manufacturer=Snake%20Oil,%20Inc.;model=1.0;object=my-certificate;type=cert;id=%69%95%3E%5C%F4%BD%EC%91;serial=").unwrap();
        assert_eq!(u.token.as_deref(), Some("The Software PKCS#11 Softtoken"));
        assert_eq!(u.manufacturer.as_deref(), Some("Snake Oil, Inc."));
        assert_eq!(u.id.as_deref(), Some(&[0x69, 0x95, 0x3e, 0x5c, 0xf4, 0xbd, 0xec, 0x91][..]));
        assert_eq!(u.object_type, Some(ObjectType::Cert));
        assert_eq!(u.serial.as_deref(), Some(""));
        let u = Pkcs11Uri::parse("pkcs11:object=my-sign-key;type=private?module-name=mypkcs11").unwrap();
        assert_eq!(u.module_name.as_deref(), Some("mypkcs11"));
        let u = Pkcs11Uri::parse("pkcs11:slot-id=3;x-vendor=1?module-path=/mnt/libmypkcs11.so.1&x-v=2").unwrap();
        assert_eq!(u.slot_id, Some(3));
        assert_eq!(u.module_path.as_deref(), Some(std::path::Path::new("/mnt/libmypkcs11.so.1")));
        assert_eq!(Pkcs11Uri::parse("PKCS11:").unwrap(), Pkcs11Uri::default());
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "pkcs11:token=edge;object=tls%20p256;id=%01%FF;type=private?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/p%20in",
            "pkcs11:token=a%3Bb;serial=12;slot-id=7;type=public?module-name=softhsm2",
        ] {
            let u = Pkcs11Uri::parse(s).unwrap();
            assert_eq!(Pkcs11Uri::parse(&u.to_string()).unwrap(), u, "{s} -> {u}");
        }
    }

    #[test]
    fn bad_uris_name_their_position_and_never_echo_a_pin() {
        let cases: &[(&str, usize, &str)] = &[
            ("pkcs:token=a", 0, "starts with `pkcs11:`"),
            ("pkcs11:token=a;token=b", 15, "twice"),
            ("pkcs11:token=a%2", 14, "two hex digits"),
            ("pkcs11:slot-id=x", 15, "decimal"),
            ("pkcs11:type=key", 12, "one of private"),
            ("pkcs11:colour=red", 7, "unknown path attribute `colour`"),
            ("pkcs11:token", 7, "no `=value`"),
            ("pkcs11:token=%FF", 13, "not UTF-8"),
            ("pkcs11:?pin-source=relative", 19, "absolute"),
            ("pkcs11:?module-path=lib.so", 20, "absolute"),
            ("pkcs11:?module-name=../x", 20, "p11-kit"),
            ("pkcs11:?module-name=a&module-path=/b", 8, "not both"),
            ("pkcs11:?foo=1", 8, "unknown query attribute"),
        ];
        for (s, pos, msg) in cases {
            let e = Pkcs11Uri::parse(s).unwrap_err();
            assert_eq!(e.position, *pos, "{s}: {e}");
            assert!(e.to_string().contains(msg), "{s}: {e}");
        }
        // Bytes that are not a character boundary at 7 are not a panic.
        for s in ["pkcs11\u{e9}token=a", "pkcs1\u{20ac}", "\u{20ac}\u{20ac}\u{20ac}"] {
            assert_eq!(Pkcs11Uri::parse(s).unwrap_err().position, 0, "{s}");
        }
        let e = Pkcs11Uri::parse("pkcs11:token=a?pin-value=123456").unwrap_err();
        assert!(e.to_string().contains("pin-source") && !e.to_string().contains("123456"), "{e}");
    }

    proptest::proptest! {
        /// Whatever the text: a URI that prints back to itself, or an
        /// error whose position is inside the text; never a panic.
        #[test]
        fn any_text_is_read_or_refused_where_it_goes_wrong(tail in "[a-z=;?&%0-9A-F/:._-]{0,60}") {
            let s = format!("pkcs11:{tail}");
            match Pkcs11Uri::parse(&s) {
                Ok(u) => proptest::prop_assert_eq!(Pkcs11Uri::parse(&u.to_string()).unwrap(), u),
                Err(e) => proptest::prop_assert!(e.position <= s.len(), "{e} for {s}"),
            }
        }
    }
}
