//! Tenants on the server: who a client is, which keys it may use, and how
//! much of the server it may take.
//!
//! A client's tenant is read from its certificate (the CA's word), never
//! from its frames: a client cannot borrow another tenant's keys, limits
//! or slots by writing another id. Each tenant may have at most a fixed
//! number of requests and of request bytes in flight, so one tenant's
//! flood is refused while every other tenant is served (the first Geo Key
//! Manager outage was one new zone filling every queue). A lookup is one
//! hash-map access under a short lock, once per connection; the counts are
//! atomics.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use openssl::nid::Nid;
use openssl::x509::X509Ref;

use super::keyring::KeyId;
use super::metrics::{RequestStats, StatsCell};

/// Tenants tracked one by one; beyond this many, further tenants share one
/// entry (and its limits), so a CA that issues many certificates cannot
/// grow the server's memory without bound.
pub(crate) const MAX_TRACKED: usize = 10_000;

/// The name the shared entry past [`MAX_TRACKED`] reports.
pub(crate) const OVERFLOW: &str = "(overflow)";

/// Which part of a client's certificate names its tenant.
///
/// The tenant is the whole field, compared as whole bytes: a certificate
/// whose field holds a NUL or another control character, or that gives
/// the field more than once (two common names, two DNS names), names no
/// tenant and is refused; every name of the kind counts, and one that is
/// not text refuses the certificate rather than being skipped. A reader
/// that stops at a NUL, or keeps the first of two names where another
/// reads the last (Go's `pkix.Name` keeps the last common name), or skips
/// a name it cannot read, would otherwise let a CA that checked one reading
/// sign a certificate that this server reads as another tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TenantSource {
    /// The subject's common name (CN). The default.
    #[default]
    CommonName,
    /// The DNS name among the subject alternative names (exactly one).
    DnsName,
    /// The URI among the subject alternative names (exactly one; a SPIFFE
    /// id, say).
    Uri,
}

impl TenantSource {
    /// `cn`, `dns` or `uri`, as `keyfence serve --tenant-from` takes it.
    pub fn name(self) -> &'static str {
        match self {
            TenantSource::CommonName => "cn",
            TenantSource::DnsName => "dns",
            TenantSource::Uri => "uri",
        }
    }

    /// The tenant `cert` names, or why it names none: no such field, an
    /// empty one, one given more than once, or one holding a NUL, another
    /// control character or bytes that are not text.
    pub(crate) fn tenant_of(self, cert: &X509Ref) -> Result<String, String> {
        let field = match self {
            TenantSource::CommonName => "common name",
            TenantSource::DnsName => "DNS name",
            TenantSource::Uri => "URI name",
        };
        // Every name of the kind counts, read or not: an unreadable one
        // dropped here would leave `shop-a` the only DNS name of a
        // certificate that also gives `\xff.shop-b.example`.
        let names: Vec<Option<String>> = match self {
            TenantSource::CommonName => cert.subject_name().entries_by_nid(Nid::COMMONNAME).map(|e| whole_text(e.data())).collect(),
            TenantSource::DnsName | TenantSource::Uri => {
                let kind = if self == TenantSource::DnsName { openssl_sys::GEN_DNS } else { openssl_sys::GEN_URI };
                cert.subject_alt_names()
                    .map(|names| {
                        names
                            .iter()
                            .filter(|n| general_name_kind(n) == kind)
                            .map(|n| {
                                // `None` from AWS-LC's accessor is bytes
                                // that are not UTF-8; an IA5String holds
                                // ASCII only, so other bytes are not text
                                // either (readers differ on their decoding).
                                let text = if self == TenantSource::DnsName { n.dnsname() } else { n.uri() };
                                text.filter(|t| t.is_ascii()).map(str::to_string)
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            }
        };
        if names.iter().any(Option::is_none) {
            return Err(format!(
                "the client certificate's {field}{} not plain text (a NUL byte, or bytes that do not decode whole)",
                if names.len() > 1 { " (one of several) is" } else { " is" }
            ));
        }
        let name = match names.as_slice() {
            [] => return Err(format!("the client certificate has no {field}")),
            [Some(one)] => one.clone(),
            more => {
                return Err(format!(
                    "the client certificate gives {} {field}s; a tenant must be named once (readers differ on which one counts)",
                    more.len()
                ))
            }
        };
        if name.is_empty() {
            return Err(format!("the client certificate's {field} is empty"));
        }
        if name.chars().any(char::is_control) {
            return Err(format!("the client certificate's {field} holds a NUL or another control character"));
        }
        Ok(name)
    }
}

/// The kind of a subject alternative name (`GEN_DNS`, `GEN_URI`, ...), as
/// the library parsed it: the `openssl` crate's accessors answer `None` both
/// for another kind and for a name of the kind that is not UTF-8, and the
/// second must be counted (and refused), not skipped.
#[allow(unsafe_code)]
fn general_name_kind(name: &openssl::x509::GeneralNameRef) -> std::os::raw::c_int {
    use foreign_types::ForeignTypeRef;
    let mut kind = -1;
    // SAFETY: `name.as_ptr()` is a valid GENERAL_NAME for the borrow;
    // GENERAL_NAME_get0_value only reads it and writes the kind to
    // `kind`; the returned pointer is not used.
    unsafe { openssl_sys::GENERAL_NAME_get0_value(name.as_ptr(), &mut kind) };
    kind
}

/// The text of an ASN.1 string, only when it accounts for every byte of
/// the string: AWS-LC's conversion to UTF-8 ends at the first NUL, so
/// `shop-a\0.shop-b.example` would read as `shop-a`. The text is kept when
/// encoding it back (as UTF-8, UTF-16 for a BMPString, UTF-32 for a
/// UniversalString) gives the stored bytes exactly.
fn whole_text(s: &openssl::asn1::Asn1StringRef) -> Option<String> {
    // Deprecated for stopping at a NUL: exactly what the comparison with
    // the stored bytes below catches.
    #[allow(deprecated)]
    let text = s.as_utf8().ok()?.to_string();
    let raw = s.as_slice();
    let utf16: Vec<u8> = text.encode_utf16().flat_map(u16::to_be_bytes).collect();
    let utf32: Vec<u8> = text.chars().flat_map(|c| u32::from(c).to_be_bytes()).collect();
    (raw == text.as_bytes() || raw == utf16.as_slice() || raw == utf32.as_slice()).then_some(text)
}

impl fmt::Display for TenantSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TenantSource {
    type Err = String;

    /// `cn`, `dns` or `uri`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cn" => Ok(TenantSource::CommonName),
            "dns" => Ok(TenantSource::DnsName),
            "uri" => Ok(TenantSource::Uri),
            _ => Err(format!("unknown tenant source `{s}` (cn, dns or uri)")),
        }
    }
}

/// Which keys each tenant may use. A tenant not listed may use none.
///
/// ```
/// use keyfence::sign::remote::{AllowList, KeyId};
/// let mut allow = AllowList::new();
/// allow.allow("shop-a", KeyId([1; 32]));
/// assert!(allow.allows("shop-a", &KeyId([1; 32])));
/// assert!(!allow.allows("shop-a", &KeyId([2; 32])));
/// assert!(!allow.allows("shop-b", &KeyId([1; 32])));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    tenants: HashMap<String, Arc<HashSet<KeyId>>>,
}

impl AllowList {
    /// An empty list: nobody may use any key.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lets `tenant` use `key`.
    pub fn allow(&mut self, tenant: &str, key: KeyId) {
        Arc::make_mut(self.tenants.entry(tenant.to_string()).or_default()).insert(key);
    }

    /// Whether `tenant` may use `key`.
    pub fn allows(&self, tenant: &str, key: &KeyId) -> bool {
        self.tenants.get(tenant).is_some_and(|keys| keys.contains(key))
    }

    /// The tenants listed, in no order.
    pub fn tenants(&self) -> impl Iterator<Item = &str> {
        self.tenants.keys().map(String::as_str)
    }

    fn keys_of(&self, tenant: &str) -> Arc<HashSet<KeyId>> {
        self.tenants.get(tenant).cloned().unwrap_or_default()
    }
}

/// The keys one connection's tenant may use.
#[derive(Clone)]
pub(crate) enum Keys {
    /// No allow-list is configured: every key the server holds.
    All,
    /// These only.
    Only(Arc<HashSet<KeyId>>),
}

impl Keys {
    pub(crate) fn of(allow: Option<&AllowList>, tenant: &str) -> Keys {
        match allow {
            None => Keys::All,
            Some(a) => Keys::Only(a.keys_of(tenant)),
        }
    }

    pub(crate) fn contains(&self, key: &KeyId) -> bool {
        match self {
            Keys::All => true,
            Keys::Only(keys) => keys.contains(key),
        }
    }
}

pub(crate) struct Tenant {
    pub(crate) name: String,
    in_flight: AtomicU32,
    queued_bytes: AtomicUsize,
    pub(crate) not_allowed: AtomicU64,
    pub(crate) stats: StatsCell,
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The tenant has its maximum requests in flight.
    TenantRequests,
    /// The tenant has its maximum request bytes in flight.
    TenantBytes,
    /// The whole server has its maximum request bytes in flight.
    ServerBytes,
}

/// One admitted request of a tenant; its slot and bytes are released when
/// dropped.
pub(crate) struct Admitted {
    tenant: Arc<Tenant>,
    bytes: usize,
    total: Arc<AtomicUsize>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.tenant.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.tenant.queued_bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.total.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl Admitted {
    pub(crate) fn tenant(&self) -> &Tenant {
        &self.tenant
    }
}

/// A tenant's entry in [`ServerMetrics`](super::ServerMetrics).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TenantMetrics {
    /// The tenant's name, as its certificate gives it (`(overflow)` for
    /// the entry tenants share past 10,000).
    pub name: String,
    /// Requests in flight now.
    pub in_flight: u32,
    /// Bytes of those requests.
    pub queued_bytes: usize,
    /// Requests refused because the tenant may not use the key
    /// (`not_allowed`); also counted as failed in `stats`.
    pub not_allowed: u64,
    /// Counters and latency.
    pub stats: RequestStats,
}

/// The limits [`Tenants`] admits under.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) tenant_requests: u32,
    pub(crate) tenant_bytes: usize,
    pub(crate) server_bytes: usize,
}

pub(crate) struct Tenants {
    limits: Limits,
    map: Mutex<HashMap<String, Arc<Tenant>>>,
    overflow: Arc<Tenant>,
    total_bytes: Arc<AtomicUsize>,
}

fn reserve(counter: &AtomicUsize, n: usize, limit: usize) -> bool {
    counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |have| have.checked_add(n).filter(|t| *t <= limit)).is_ok()
}

impl Tenants {
    pub(crate) fn new(limits: Limits) -> Self {
        Tenants {
            limits,
            map: Mutex::new(HashMap::new()),
            overflow: Arc::new(Tenant::new(OVERFLOW)),
            total_bytes: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub(crate) fn get(&self, name: &str) -> Arc<Tenant> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = map.get(name) {
            return t.clone();
        }
        if map.len() >= MAX_TRACKED {
            return self.overflow.clone();
        }
        map.entry(name.to_string()).or_insert_with(|| Arc::new(Tenant::new(name))).clone()
    }

    /// Takes a slot and `bytes` for `tenant`, or says which limit is
    /// reached. Nothing is held when it refuses.
    pub(crate) fn admit(&self, tenant: Arc<Tenant>, bytes: usize) -> Result<Admitted, Refused> {
        let limit = self.limits.tenant_requests;
        tenant
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .map_err(|_| Refused::TenantRequests)?;
        if !reserve(&tenant.queued_bytes, bytes, self.limits.tenant_bytes) {
            tenant.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::TenantBytes);
        }
        if !reserve(&self.total_bytes, bytes, self.limits.server_bytes) {
            tenant.in_flight.fetch_sub(1, Ordering::AcqRel);
            tenant.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return Err(Refused::ServerBytes);
        }
        Ok(Admitted { tenant, bytes, total: self.total_bytes.clone() })
    }

    /// Request bytes in flight on the whole server.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.total_bytes.load(Ordering::Relaxed)
    }

    /// Every tenant's entry, by name.
    pub(crate) fn snapshot(&self) -> Vec<TenantMetrics> {
        let mut tenants: Vec<Arc<Tenant>> = {
            let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            map.values().cloned().collect()
        };
        if self.overflow.stats.snapshot().counts.requests > 0 {
            tenants.push(self.overflow.clone());
        }
        let mut out: Vec<_> = tenants
            .iter()
            .map(|t| TenantMetrics {
                name: t.name.clone(),
                in_flight: t.in_flight.load(Ordering::Relaxed),
                queued_bytes: t.queued_bytes.load(Ordering::Relaxed),
                not_allowed: t.not_allowed.load(Ordering::Relaxed),
                stats: t.stats.snapshot(),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

impl Tenant {
    fn new(name: &str) -> Self {
        Tenant {
            name: name.to_string(),
            in_flight: AtomicU32::new(0),
            queued_bytes: AtomicUsize::new(0),
            not_allowed: AtomicU64::new(0),
            stats: StatsCell::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenants(requests: u32, tenant_bytes: usize, server_bytes: usize) -> Tenants {
        Tenants::new(Limits { tenant_requests: requests, tenant_bytes, server_bytes })
    }

    #[test]
    fn a_tenant_at_its_limit_is_refused_and_others_are_not() {
        let t = tenants(2, 1 << 20, 1 << 20);
        let a1 = t.admit(t.get("a"), 1).unwrap();
        let _a2 = t.admit(t.get("a"), 1).unwrap();
        assert_eq!(t.admit(t.get("a"), 1).err(), Some(Refused::TenantRequests));
        assert!(t.admit(t.get("b"), 1).is_ok());
        drop(a1);
        assert!(t.admit(t.get("a"), 1).is_ok());
    }

    #[test]
    fn bytes_are_bounded_per_tenant_and_in_all_and_released() {
        let t = tenants(100, 1000, 1500);
        let a = t.admit(t.get("a"), 800).unwrap();
        assert_eq!(t.admit(t.get("a"), 201).err(), Some(Refused::TenantBytes));
        let b = t.admit(t.get("b"), 700).unwrap();
        assert_eq!(t.admit(t.get("c"), 1).err(), Some(Refused::ServerBytes));
        assert_eq!(t.queued_bytes(), 1500);
        // A refusal holds nothing: the slot and bytes it tried are free.
        let snap = t.snapshot();
        let c = snap.iter().find(|m| m.name == "c").unwrap();
        assert_eq!((c.in_flight, c.queued_bytes), (0, 0));
        drop((a, b));
        assert_eq!(t.queued_bytes(), 0);
        assert!(t.admit(t.get("c"), 1000).is_ok());
    }

    #[test]
    fn many_tenants_share_one_entry_past_the_cap() {
        let t = tenants(1, 1, 1);
        for id in 0..MAX_TRACKED + 50 {
            t.get(&id.to_string());
        }
        assert_eq!(t.map.lock().unwrap().len(), MAX_TRACKED);
        assert_eq!(t.get("one more").name, OVERFLOW);
    }

    /// A self-signed certificate whose subject alternative names are
    /// `names`, each a context tag (`0x82` DNS, `0x86` URI, `0x81` email)
    /// and raw bytes, put in as DER so that an IA5String may hold any byte.
    fn with_sans(names: &[(u8, &[u8])]) -> openssl::x509::X509 {
        use openssl::ec::{EcGroup, EcKey};
        use openssl::pkey::PKey;
        let mut inner = Vec::new();
        for (tag, bytes) in names {
            inner.extend([*tag, u8::try_from(bytes.len()).unwrap()]);
            inner.extend_from_slice(bytes);
        }
        let mut der = vec![0x30, u8::try_from(inner.len()).unwrap()];
        der.extend(inner);
        let oid = openssl::asn1::Asn1Object::from_str("2.5.29.17").unwrap();
        let value = openssl::asn1::Asn1OctetString::new_from_bytes(&der).unwrap();
        let ext = openssl::x509::X509Extension::new_from_der(&oid, false, &value).unwrap();
        let key = PKey::from_ec_key(EcKey::generate(&EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap()).unwrap()).unwrap();
        let mut b = openssl::x509::X509Builder::new().unwrap();
        b.set_version(2).unwrap();
        b.set_pubkey(&key).unwrap();
        b.set_not_before(&openssl::asn1::Asn1Time::days_from_now(0).unwrap()).unwrap();
        b.set_not_after(&openssl::asn1::Asn1Time::days_from_now(1).unwrap()).unwrap();
        b.append_extension(ext).unwrap();
        b.sign(&key, openssl::hash::MessageDigest::sha256()).unwrap();
        b.build()
    }

    /// Issue 55, item 5: every name of the kind read counts; one that is
    /// not text refuses the certificate, wherever it stands, rather than
    /// leaving the other name the only one.
    #[test]
    fn an_unreadable_dns_or_uri_name_is_counted_and_refuses_the_certificate() {
        let (dns, uri, email) = (0x82u8, 0x86u8, 0x81u8);
        let a_uri: &[u8] = b"spiffe://example.org/shop-a";
        for (source, names) in [
            (TenantSource::DnsName, vec![(dns, &b"shop-a"[..]), (dns, b"\xff.shop-b.example")]),
            (TenantSource::DnsName, vec![(dns, &b"\xff.shop-b.example"[..]), (dns, b"shop-a")]),
            (TenantSource::DnsName, vec![(dns, &b"shop-a\xff"[..])]),
            (TenantSource::DnsName, vec![(dns, "shop-\u{e9}".as_bytes())]),
            (TenantSource::Uri, vec![(uri, a_uri), (uri, b"spiffe://example.org/\xff")]),
            (TenantSource::Uri, vec![(uri, &b"\xff"[..])]),
        ] {
            let err = source.tenant_of(&with_sans(&names)).unwrap_err();
            assert!(err.contains("not plain text"), "{source} {names:?}: {err}");
        }
        // Names of the other kinds are not counted, readable or not.
        let mixed = with_sans(&[(email, b"\xff@x"), (uri, b"\xff"), (dns, b"shop-a")]);
        assert_eq!(TenantSource::DnsName.tenant_of(&mixed).as_deref(), Ok("shop-a"));
        let mixed = with_sans(&[(dns, b"\xff.shop-b.example"), (uri, a_uri), (dns, b"shop-b")]);
        assert_eq!(TenantSource::Uri.tenant_of(&mixed).as_deref(), Ok("spiffe://example.org/shop-a"));
        // Two readable names are still two.
        let two = with_sans(&[(dns, b"shop-a"), (dns, b"shop-b")]);
        assert!(TenantSource::DnsName.tenant_of(&two).unwrap_err().contains("gives 2 DNS names"));
    }

    #[test]
    fn sources_parse_and_print() {
        for s in [TenantSource::CommonName, TenantSource::DnsName, TenantSource::Uri] {
            assert_eq!(s.name().parse::<TenantSource>(), Ok(s));
        }
        assert!("san".parse::<TenantSource>().unwrap_err().contains("cn, dns or uri"));
    }
}
