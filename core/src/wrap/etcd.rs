//! The store on an etcd v3 cluster (the `etcd` feature): one authority's
//! state shared by a fleet, replicated by etcd's Raft.
//!
//! Objects are etcd keys `{prefix}/{name}`. Every multi-object commit of
//! the authority is one etcd transaction that compares the revision of the
//! authority state it read ([`Store::commit`]): of two authorities racing,
//! one commits and the other gets [`StoreError::Conflict`] with nothing
//! written, so no writer lock is needed ([`EtcdStore`]'s `lock` holds
//! nothing). Listing is paged at one revision; values and commits over
//! etcd's request limit (1.5 MiB by default) are refused with
//! [`StoreError::TooLarge`] before anything is sent.
//!
//! The client speaks to etcd's JSON gateway (`POST /v3/kv/...`, the gRPC
//! API transcoded, served on the client port) with a blocking HTTP/1.1
//! client: it fits the synchronous [`Store`] trait without an async
//! runtime. A request that fails on one endpoint (refused connection, a
//! member without a leader during an election) is retried on the next
//! until [`EtcdConfig::retry_for`] has passed.

use crate::spawn::QuietSpawn;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::backoff::{Backoff, Jitter};

use super::store::{check_key, Batch, Op, PageVisitor, Stamp, Store, StoreError, StoreLock, STORE_MARK};
use super::watch::{Watch, WatchEvent};

/// etcd's default `--max-request-bytes` (1.5 MiB), less room for the
/// request's framing: the largest value, or sum of keys and values of one
/// commit, the store sends.
pub const MAX_REQUEST: usize = 1536 * 1024 - 4096;

/// etcd's default `--max-txn-ops`: the most writes one commit may hold.
pub const MAX_TXN_OPS: usize = 128;

/// Keys per page when listing.
const PAGE: usize = 1000;

/// The first pause before trying the endpoints again (a call) or the next
/// one (a watch), doubled while none answers up to [`MAX_PAUSE`]: a
/// leader election takes a few seconds, and a call keeps trying for
/// [`EtcdConfig::retry_for`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_millis(500);

/// Largest reply read from a member: a transaction of 128 objects at
/// etcd's request limit, in base64 and JSON, is under it. A hostile or
/// broken endpoint's larger reply is an error, not memory.
const MAX_REPLY: u64 = 16 << 20;
/// Longest line of a watch stream (one message: the events of one
/// revision, which one request of at most 1.5 MiB wrote).
const MAX_WATCH_LINE: usize = 4 << 20;
/// Most bytes of names one listing gathers (about 3 million envelopes'
/// names): a listing that pages on past it is not a store's. A scan
/// counts its names against it too; its values it does not: a scan holds
/// one page at a time (each reply at most [`MAX_REPLY`]) and hands it to
/// its caller, and a revocation's scan of a large store reads gigabytes
/// of envelopes in all (1,286 bytes each), which the count of names and
/// the deadline bound.
const MAX_LISTING: usize = 256 << 20;
/// Most names one listing (or scan) gathers: empty names are refused, but
/// one-byte names would still be 24 bytes of `String` each and more,
/// which bytes of names alone do not count. About 4 million: more than
/// [`MAX_LISTING`] holds of envelopes' names.
const MAX_LISTED_NAMES: usize = 4 << 20;

/// How long one listing or scan may wait on etcd in all, by default
/// ([`EtcdStore::with_listing_deadline`]); time in a scan's caller (a
/// revocation re-wrapping a page) is not counted. Each page must move on,
/// so an endpoint cannot page forever with one name; but one that answers
/// a new name a page, slowly, would hold a command for as long as it
/// likes within the bounds on names. Not the 30 s of `retry_for`: that is
/// one call's, and a listing is thousands of calls. A page of 1,000 names
/// took 33 ms from a loopback etcd's JSON gateway on the 2-core build
/// machine (100,000 names of 77 bytes, read in 100 pages), so a
/// listing at [`MAX_LISTED_NAMES`] (4,096 pages) takes about 135 s; five
/// minutes leaves twice that for a slower cluster, so no listing the
/// bounds on names allow is cut.
const LISTING_DEADLINE: Duration = Duration::from_secs(300);

/// How to reach an etcd cluster.
#[derive(Clone)]
pub struct EtcdConfig {
    /// `HOST:PORT` of each member's client URL; tried in turn.
    pub endpoints: Vec<String>,
    /// Every object is stored under `{prefix}/`; not empty.
    pub prefix: String,
    /// PEM certificates that sign the members' server certificates: when
    /// set, the endpoints are spoken to over TLS (`https`).
    pub ca_pem: Option<Vec<u8>>,
    /// A PEM client certificate chain and its private key, for clusters
    /// that require client certificates (`--client-cert-auth`).
    pub client_pem: Option<(Vec<u8>, zeroize::Zeroizing<Vec<u8>>)>,
    /// How long one request waits for an answer.
    pub request_timeout: Duration,
    /// How long a call keeps retrying on other endpoints (a member down, a
    /// leader election) before it fails.
    pub retry_for: Duration,
    /// How long a watch waits in silence before it reconnects (from the
    /// revision it has reached, so nothing is missed) and checks whether
    /// its [`Watch`] was dropped.
    pub watch_idle: Duration,
    /// Whether plain HTTP may go to an endpoint that is not on this
    /// machine (a loopback address or `localhost`). Off by default: without
    /// TLS, anyone on the path reads the store (the authority's state
    /// holds the master keys) and answers for it. The store name's
    /// `insecure-transport=1` turns it on.
    pub plaintext: bool,
}

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("tls", &self.ca_pem.is_some())
            .field("client_cert", &self.client_pem.is_some())
            .finish_non_exhaustive()
    }
}

impl EtcdConfig {
    /// Plain HTTP to `endpoints`, objects under `prefix`, 5 s per request,
    /// 30 s of retries (a Raft election takes a few seconds).
    pub fn new(endpoints: Vec<String>, prefix: impl Into<String>) -> Self {
        EtcdConfig {
            endpoints,
            prefix: prefix.into(),
            ca_pem: None,
            client_pem: None,
            request_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(30),
            watch_idle: Duration::from_secs(10),
            plaintext: false,
        }
    }
}

/// A [`Store`] on an etcd v3 cluster (see the module documentation).
#[derive(Clone)]
pub struct EtcdStore {
    agent: ureq::Agent,
    /// `http://HOST:PORT` or `https://HOST:PORT`.
    urls: Vec<String>,
    /// `{prefix}/`.
    prefix: String,
    /// The endpoint that answered last, tried first.
    next: Arc<AtomicUsize>,
    retry_for: Duration,
    /// How long one listing or scan may wait on etcd in all.
    listing_deadline: Duration,
    /// For watches: no overall timeout, `watch_idle` per read.
    watch_agent: ureq::Agent,
    /// Calls of [`EtcdStore::revision`] still to fail
    /// ([`EtcdStore::fail_revision_reads`]), shared by the clones.
    #[cfg(feature = "testing")]
    failing_revisions: Arc<AtomicUsize>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").field("endpoints", &self.urls).field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn io_err(key: &str, msg: impl Into<String>) -> StoreError {
    StoreError::Io { key: key.to_owned(), source: std::io::Error::other(msg.into()) }
}

/// An int64 of the gateway's JSON (a string, as proto3 JSON writes them;
/// absent is zero).
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// bytes of the gateway's JSON (base64; absent is empty).
fn bytes(v: &Value, key: &str) -> Result<Vec<u8>, StoreError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => {
            base64::engine::general_purpose::STANDARD.decode(s).map_err(|e| io_err(key, format!("etcd sent bad base64: {e}")))
        }
        _ => Err(io_err(key, "etcd sent a non-string for bytes")),
    }
}

/// Why one attempt failed: worth another endpoint, or final.
pub(super) enum Failure {
    Retry(String),
    Final(String),
}

// What the gateway's answers say, apart from the requests that fetch
// them: functions of the bytes alone, so that the fuzzers reach each one
// (`wrap::fuzzing`, fuzz target `etcd_replies`).

/// The JSON of an answer with HTTP `status` from `url`, or why it failed.
pub(super) fn answer(url: &str, status: u16, text: &[u8]) -> Result<Value, Failure> {
    let v: Value = serde_json::from_slice(text).map_err(|e| Failure::Retry(format!("{url}: answer is not JSON ({e})")))?;
    if status == 200 && v.get("error").is_none() {
        return Ok(v);
    }
    let msg = v.get("message").or_else(|| v.get("error")).and_then(Value::as_str).unwrap_or("").to_owned();
    // gRPC codes: 14 unavailable, 4 deadline exceeded, 10 aborted:
    // a member without a leader, an election, an overloaded member.
    let code = int(v.get("code").unwrap_or(&Value::Null));
    if matches!(code, 4 | 10 | 14) || status == 503 || msg.contains("leader") || msg.contains("timed out") {
        Err(Failure::Retry(format!("{url}: {msg} (HTTP {status})")))
    } else {
        Err(Failure::Final(format!("{url}: {msg} (HTTP {status}, gRPC code {code})")))
    }
}

/// The cluster's revision in an answer's header.
pub(super) fn revision_of(v: &Value) -> i64 {
    int(v.pointer("/header/revision").unwrap_or(&Value::Null))
}

/// The value and stamp of the one object a range answer holds, if any.
pub(super) fn range_value(v: &Value, key: &str) -> Result<Option<(Vec<u8>, Stamp)>, StoreError> {
    let Some(kv) = v.get("kvs").and_then(Value::as_array).and_then(|a| a.first()) else {
        return Ok(None);
    };
    let value = bytes(kv.get("value").unwrap_or(&Value::Null), key)?;
    Ok(Some((value, Stamp::revision(int(kv.get("mod_revision").unwrap_or(&Value::Null))))))
}

/// The names one page of a keys-only range answer holds (each key less
/// `store_prefix`), and whether another page follows.
pub(super) fn list_page(v: &Value, store_prefix: &str, prefix: &str) -> Result<(Vec<String>, bool), StoreError> {
    let kvs = v.get("kvs").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    let mut names = Vec::with_capacity(kvs.len());
    for kv in kvs {
        let k = bytes(kv.get("key").unwrap_or(&Value::Null), prefix)?;
        let k = String::from_utf8(k).map_err(|_| io_err(prefix, "etcd holds a key that is not UTF-8"))?;
        let name = k.strip_prefix(store_prefix).ok_or_else(|| io_err(prefix, "etcd answered outside the range"))?;
        names.push(name.to_owned());
    }
    let more = v.get("more").and_then(Value::as_bool).unwrap_or(false) && !kvs.is_empty();
    Ok((names, more))
}

/// One page of a range answer: the names (each less the store's prefix),
/// their values, and whether another page follows.
type RangePage = (Vec<String>, Vec<Vec<u8>>, bool);

/// The names (each less `store_prefix`) and values one page of a range
/// answer holds, and whether another page follows.
pub(super) fn range_page(v: &Value, store_prefix: &str, prefix: &str) -> Result<RangePage, StoreError> {
    let kvs = v.get("kvs").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    let (names, more) = list_page(v, store_prefix, prefix)?;
    let mut values = Vec::with_capacity(kvs.len());
    for (kv, name) in kvs.iter().zip(&names) {
        values.push(bytes(kv.get("value").unwrap_or(&Value::Null), name)?);
    }
    Ok((names, values, more))
}

/// The values of a read-only transaction's answer, one per key read.
pub(super) fn txn_values(v: &Value, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
    let first = keys.first().map_or("", String::as_str);
    let responses = v.get("responses").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    if responses.len() != keys.len() {
        return Err(io_err(first, format!("etcd answered {} reads of {}", responses.len(), keys.len())));
    }
    let mut out = Vec::with_capacity(keys.len());
    for (k, r) in keys.iter().zip(responses) {
        let kv = r.pointer("/response_range/kvs/0");
        out.push(kv.map(|kv| bytes(kv.get("value").unwrap_or(&Value::Null), k)).transpose()?);
    }
    Ok(out)
}

/// Whether a transaction's comparisons held (and its writes were made).
pub(super) fn txn_succeeded(v: &Value) -> bool {
    v.get("succeeded").and_then(Value::as_bool).unwrap_or(false)
}

/// One line of a watch stream, as the watch thread reads it.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchLine {
    /// Not a watch message (not JSON, no `result`): the stream is over.
    End,
    /// etcd compacted the revisions the watch was to resume from.
    Compacted,
    /// The changes after the revision seen so far, in order (each key
    /// less the store's prefix).
    Events(Vec<WatchEvent>),
}

/// Reads one line of a watch stream whose watcher has seen revision
/// `last`, for a store whose keys start with `store_prefix`.
pub(super) fn watch_line(line: &str, store_prefix: &str, last: i64) -> WatchLine {
    let Ok(v) = serde_json::from_str::<Value>(line) else { return WatchLine::End };
    let Some(r) = v.get("result") else { return WatchLine::End };
    if int(r.get("compact_revision").unwrap_or(&Value::Null)) != 0 {
        return WatchLine::Compacted;
    }
    let mut events = Vec::new();
    for e in r.get("events").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
        let kv = e.get("kv").unwrap_or(&Value::Null);
        let revision = int(kv.get("mod_revision").unwrap_or(&Value::Null));
        let Ok(key) = bytes(kv.get("key").unwrap_or(&Value::Null), "").map(String::from_utf8) else { continue };
        let Ok(key) = key else { continue };
        if revision <= last {
            continue;
        }
        let key = key.strip_prefix(store_prefix).unwrap_or(&key).to_owned();
        events.push(if e.get("type").and_then(Value::as_str) == Some("DELETE") {
            WatchEvent::Delete { key, revision }
        } else {
            // The value is in the event: a watcher need not read it
            // again (a bad encoding leaves it to that read).
            let value = bytes(kv.get("value").unwrap_or(&Value::Null), &key).ok();
            WatchEvent::Put { key, revision, value }
        });
    }
    WatchLine::Events(events)
}

impl EtcdStore {
    /// Connects to nothing yet: each call goes to the first endpoint that
    /// answers.
    ///
    /// # Errors
    /// [`StoreError::InvalidName`] for no endpoint, an empty prefix, a
    /// prefix that is not a store key, or certificates that do not parse.
    pub fn open(config: EtcdConfig) -> Result<Self, StoreError> {
        let bad =
            |reason: String| StoreError::InvalidName { name: format!("etcd://{}/{}", config.endpoints.join(","), config.prefix), reason };
        if config.endpoints.is_empty() {
            return Err(bad("no endpoint".into()));
        }
        let prefix = config.prefix.trim_matches('/');
        if prefix.is_empty() || check_key(prefix).is_err() {
            return Err(bad(format!("prefix {prefix:?}: not empty, `/`-separated parts of [A-Za-z0-9._-]")));
        }
        for e in &config.endpoints {
            check_endpoint(e).map_err(bad)?;
        }
        if config.ca_pem.is_none() && !config.plaintext {
            if let Some(e) = config.endpoints.iter().find(|e| !is_loopback(e)) {
                return Err(bad(format!(
                    "{e} is not on this machine, and without TLS anyone on the path reads the store and answers for it: \
                     give the cluster's CA (`?cacert=FILE`), or `?insecure-transport=1` to speak plain HTTP anyway"
                )));
            }
        }
        let scheme = if config.ca_pem.is_some() { "https" } else { "http" };
        let mut builder =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(config.request_timeout)).max_redirects(0);
        let mut watch_builder = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(config.request_timeout))
            .timeout_per_read(Some(config.watch_idle))
            .max_redirects(0);
        if let Some(ca) = &config.ca_pem {
            use ureq::tls::{parse_pem, ClientCert, PemItem, RootCerts, TlsConfig};
            let mut roots = Vec::new();
            for item in parse_pem(ca) {
                if let PemItem::Certificate(c) = item.map_err(|e| bad(format!("CA certificates: {e}")))? {
                    roots.push(c);
                }
            }
            if roots.is_empty() {
                return Err(bad("the CA file holds no certificate".into()));
            }
            let mut tls = TlsConfig::builder().root_certs(RootCerts::new_with_certs(&roots));
            if let Some((chain, key)) = &config.client_pem {
                let mut certs = Vec::new();
                for item in parse_pem(chain) {
                    if let PemItem::Certificate(c) = item.map_err(|e| bad(format!("client certificate: {e}")))? {
                        certs.push(c);
                    }
                }
                // The key's parse error names a position, never the key.
                let key = parse_pem(key)
                    .find_map(|i| match i {
                        Ok(PemItem::PrivateKey(k)) => Some(k),
                        _ => None,
                    })
                    .ok_or_else(|| bad("the client key file holds no private key".into()))?;
                if certs.is_empty() {
                    return Err(bad("the client certificate file holds no certificate".into()));
                }
                tls = tls.client_cert(Some(ClientCert::new_with_certs(&certs, key)));
            }
            let tls = tls.build();
            watch_builder = watch_builder.tls_config(tls.clone());
            builder = builder.tls_config(tls);
        } else if config.client_pem.is_some() {
            return Err(bad("a client certificate needs TLS: give the CA certificate too".into()));
        }
        Ok(EtcdStore {
            agent: builder.build().new_agent(),
            urls: config.endpoints.iter().map(|e| format!("{scheme}://{e}")).collect(),
            prefix: format!("{prefix}/"),
            next: Arc::new(AtomicUsize::new(0)),
            retry_for: config.retry_for,
            listing_deadline: LISTING_DEADLINE,
            watch_agent: watch_builder.build().new_agent(),
            #[cfg(feature = "testing")]
            failing_revisions: Arc::default(),
        })
    }

    /// The store with another deadline for each listing and scan: the
    /// most time one may wait on etcd in all before it fails with
    /// [`StoreError::Io`] (kind [`std::io::ErrorKind::TimedOut`]); five
    /// minutes by default, which a listing at the store's bound on names
    /// (4 Mi) takes less than half of on a loopback cluster. Time in a
    /// scan's caller is not counted. For tests of an endpoint that pages
    /// slowly forever, and for a cluster slower than the default allows
    /// for.
    #[must_use]
    pub fn with_listing_deadline(mut self, deadline: Duration) -> Self {
        self.listing_deadline = deadline;
        self
    }

    /// The names under `prefix` (relative to the store's prefix; `""` for
    /// every one), in pages of keys only, all at the revision of the first
    /// page, so a listing is one consistent snapshot however long it is.
    fn names_under(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let start = format!("{}{prefix}", self.prefix);
        let end = prefix_end(start.as_bytes());
        let mut from = start.clone().into_bytes();
        let mut revision = 0i64;
        let mut out = Vec::new();
        let mut listing = Listing::new(prefix, self.listing_deadline);
        loop {
            let mut req = json!({
                "key": b64(&from), "range_end": b64(&end), "limit": PAGE, "keys_only": true,
            });
            if revision != 0 {
                req["revision"] = json!(revision.to_string());
            }
            let v = listing.call(self, "/v3/kv/range", &req)?;
            if revision == 0 {
                revision = revision_of(&v);
            }
            let (names, more) = list_page(&v, &self.prefix, prefix)?;
            // Each page must move on, and the whole stay a store's size: an
            // endpoint saying `more` forever is an error, not memory.
            listing.check(&names, PAGE, more)?;
            out.extend(names);
            if !more {
                return Ok(out);
            }
            from = format!("{}{}\0", self.prefix, out.last().map_or("", String::as_str)).into_bytes();
        }
    }

    /// The prefix every object is stored under, with its final `/`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn one(&self, url: &str, path: &str, body: &[u8]) -> Result<Value, Failure> {
        let mut resp = self
            .agent
            .post(format!("{url}{path}"))
            .header("content-type", "application/json")
            .send(body)
            .map_err(|e| Failure::Retry(format!("{url}: {e}")))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(MAX_REPLY)
            .read_to_vec()
            .map_err(|e| Failure::Retry(format!("{url}: reading the answer: {e}")))?;
        answer(url, status, &text)
    }

    /// POSTs `body` to `path` on the endpoints in turn, from the one that
    /// answered last, until one answers or the retry time has passed.
    fn call(&self, key: &str, path: &str, body: &Value) -> Result<Value, StoreError> {
        self.call_until(key, path, body, None)
    }

    /// As [`EtcdStore::call`], retrying no later than `until` either (a
    /// listing's deadline).
    fn call_until(&self, key: &str, path: &str, body: &Value, until: Option<Instant>) -> Result<Value, StoreError> {
        let body = serde_json::to_vec(body).map_err(|e| io_err(key, e.to_string()))?;
        let start = Instant::now();
        let mut backoff = Backoff::new(FIRST_PAUSE, MAX_PAUSE, Jitter::None);
        loop {
            let first = self.next.load(Ordering::Relaxed);
            let mut last = String::new();
            for i in 0..self.urls.len() {
                let n = (first + i) % self.urls.len();
                match self.one(&self.urls[n], path, &body) {
                    Ok(v) => {
                        self.next.store(n, Ordering::Relaxed);
                        return Ok(v);
                    }
                    Err(Failure::Final(m)) => return Err(io_err(key, format!("etcd {path}: {m}"))),
                    Err(Failure::Retry(m)) => last = m,
                }
            }
            let now = Instant::now();
            if start.elapsed() >= self.retry_for || until.is_some_and(|u| now >= u) {
                return Err(io_err(key, format!("etcd {path}: no member answered in {:?}; last: {last}", now - start)));
            }
            let pause = backoff.pause();
            std::thread::sleep(until.map_or(pause, |u| pause.min(u - now)));
        }
    }

    fn full(&self, key: &str) -> Result<String, StoreError> {
        check_key(key)?;
        Ok(format!("{}{key}", self.prefix))
    }

    fn check_size(key: &str, len: usize) -> Result<(), StoreError> {
        if len > MAX_REQUEST {
            return Err(StoreError::TooLarge { key: key.to_owned(), what: "bytes", len, max: MAX_REQUEST });
        }
        Ok(())
    }
}

impl EtcdStore {
    /// The cluster's current revision: a watch from it sees every later
    /// change.
    ///
    /// # Errors
    /// As [`Store::get`].
    pub fn revision(&self) -> Result<i64, StoreError> {
        #[cfg(feature = "testing")]
        if self.failing_revisions.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(io_err("", "etcd /v3/kv/range: no member answered (a failure the test asked for)"));
        }
        let full = format!("{}public/generations", self.prefix);
        let v = self.call("", "/v3/kv/range", &json!({ "key": b64(full.as_bytes()), "count_only": true }))?;
        Ok(revision_of(&v))
    }

    /// Makes the next `n` calls of [`EtcdStore::revision`] on this store
    /// and its clones (its watches' threads included) fail at once, as
    /// when no member answers for [`EtcdConfig::retry_for`]: for tests of
    /// what follows a failed read (`testing` only).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn fail_revision_reads(&self, n: usize) {
        self.failing_revisions.store(n, Ordering::SeqCst);
    }

    /// Watches the objects under `prefix` for changes after revision
    /// `after` (0: from now). A thread follows etcd's watch stream; when
    /// its connection fails or stays silent for [`EtcdConfig::watch_idle`],
    /// it reconnects (to the next endpoint if need be) from the last
    /// revision it delivered, so no change is missed or repeated.
    ///
    /// # Errors
    /// [`StoreError::InvalidKey`] for a prefix that is not a store key;
    /// for `after` 0, the errors of [`EtcdStore::revision`].
    pub fn watch(&self, prefix: &str, after: i64) -> Result<Watch, StoreError> {
        check_key(prefix.trim_end_matches('/'))?;
        // "From now" is now, not when the thread gets to it.
        let after = if after == 0 { self.revision()? } else { after };
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let this = self.clone();
        let start = format!("{}{prefix}", self.prefix);
        let flag = stop.clone();
        std::thread::Builder::new()
            .name("keyfence-etcd-watch".into())
            .spawn_quiet(move || this.follow(start, after, tx, flag))
            .map_err(|e| io_err(prefix, format!("cannot start the watch thread: {e}")))?;
        Ok(Watch::from_channel(rx, stop))
    }

    /// The watch thread: one stream at a time, resumed after `last`.
    fn follow(self, start: String, mut last: i64, tx: mpsc::Sender<WatchEvent>, stop: Arc<AtomicBool>) {
        let end = prefix_end(start.as_bytes());
        let mut n = self.next.load(Ordering::Relaxed);
        let mut backoff = Backoff::new(FIRST_PAUSE, MAX_PAUSE, Jitter::None);
        while !stop.load(Ordering::SeqCst) {
            if last == 0 {
                let Some(now) = self.revision_for_watch(&mut backoff, &stop) else { return };
                last = now;
            }
            let url = &self.urls[n % self.urls.len()];
            let req = json!({ "create_request": {
                "key": b64(start.as_bytes()), "range_end": b64(&end), "start_revision": (last + 1).to_string(),
            }});
            let body = serde_json::to_vec(&req).unwrap_or_default();
            let resp = self.watch_agent.post(format!("{url}/v3/watch")).header("content-type", "application/json").send(&body[..]);
            let mut resp = match resp {
                Ok(r) if r.status().as_u16() == 200 => r,
                _ => {
                    // Another member, after a pause that grows while none answers.
                    n += 1;
                    std::thread::sleep(backoff.pause());
                    continue;
                }
            };
            let mut lines = std::io::BufReader::new(resp.body_mut().as_reader());
            let mut line = String::new();
            loop {
                line.clear();
                // A line past the bound (an endpoint that never ends one)
                // is a broken stream: the next member.
                match read_line_bounded(&mut lines, &mut line, MAX_WATCH_LINE) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let events = match watch_line(&line, &self.prefix, last) {
                    WatchLine::End => break,
                    WatchLine::Events(events) => events,
                    WatchLine::Compacted => {
                        backoff.reset();
                        // What came before the compaction is gone: the
                        // watcher reads everything again, and the watch
                        // goes on from now. Until the revision of now is
                        // read, the stream is not read on (what follows
                        // the compaction would reach the watcher before
                        // it), nor is the compaction dropped (the watcher
                        // would never resync).
                        let Some(now) = self.revision_for_watch(&mut backoff, &stop) else { return };
                        backoff.reset();
                        last = now;
                        if tx.send(WatchEvent::Compacted { revision: now }).is_err() {
                            return;
                        }
                        break;
                    }
                };
                backoff.reset();
                // Events of one revision (one transaction) come in one
                // message: the revisions it holds are complete once all of
                // it is sent, and a resumed stream starts after them.
                let mut reached = last;
                for event in events {
                    reached = reached.max(event.revision());
                    if tx.send(event).is_err() {
                        return;
                    }
                }
                last = reached;
            }
            // The stream ended (a member died, silence): the next member,
            // from `last`.
            n += 1;
        }
    }

    /// The cluster's revision, for the watch thread: read again, after a
    /// pause that grows, until a read succeeds; `None` once the watch is
    /// dropped.
    fn revision_for_watch(&self, backoff: &mut Backoff, stop: &AtomicBool) -> Option<i64> {
        loop {
            if let Ok(now) = self.revision() {
                return Some(now);
            }
            if stop.load(Ordering::SeqCst) {
                return None;
            }
            std::thread::sleep(backoff.pause());
        }
    }
}

/// Reads one line (up to and with its `\n`) into `line`, refusing one
/// longer than `max` bytes: `BufRead::read_line` grows without bound.
fn read_line_bounded(r: &mut impl std::io::BufRead, line: &mut String, max: usize) -> std::io::Result<usize> {
    let mut bytes = Vec::new();
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            break;
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if bytes.len() + take > max {
            return Err(std::io::Error::other(format!("a watch line longer than {max} bytes")));
        }
        bytes.extend_from_slice(&buf[..take]);
        r.consume(take);
        if done {
            break;
        }
    }
    line.push_str(std::str::from_utf8(&bytes).map_err(|_| std::io::Error::other("a watch line that is not UTF-8"))?);
    Ok(bytes.len())
}

/// Refuses an endpoint that is not `HOST:PORT`: a user name before an `@`
/// (`etcd://10.0.0.1:2379@127.0.0.1:23790/p` would connect to 127.0.0.1),
/// a path, a query, anything a URL would read as something else.
pub(crate) fn check_endpoint(e: &str) -> Result<(), String> {
    let Some((host, port)) = e.rsplit_once(':') else { return Err(format!("endpoint {e:?} is not HOST:PORT")) };
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    };
    if !host_ok || port.parse::<u16>().is_err() {
        return Err(format!("endpoint {e:?} is not HOST:PORT (a name, an IPv4 address or a bracketed IPv6 address, and a port)"));
    }
    Ok(())
}

/// Whether `HOST:PORT` names this machine.
fn is_loopback(e: &str) -> bool {
    let host = e.rsplit_once(':').map_or(e, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The first key after every key that starts with `p`: etcd's `range_end`.
fn prefix_end(p: &[u8]) -> Vec<u8> {
    let mut end = p.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// One listing's (or scan's) progress, and what holds it to a store's
/// bounds whatever an endpoint answers: each name is under the listing's
/// prefix, not empty, and after the one before (within a page and across
/// pages, so no name is repeated and every page moves on); a page holds at
/// most the names asked for, and says "more" only with a name; the whole
/// gathers at most [`MAX_LISTED_NAMES`] names and [`MAX_LISTING`] bytes of
/// them, and waits on etcd at most its deadline in all. Each refusal is a
/// [`StoreError::Io`] naming the problem (kind `InvalidData`, or
/// `TimedOut` for the deadline), at the first page that breaks a rule.
struct Listing<'a> {
    prefix: &'a str,
    last: Option<String>,
    names: usize,
    bytes: usize,
    waited: Duration,
    deadline: Duration,
}

impl<'a> Listing<'a> {
    fn new(prefix: &'a str, deadline: Duration) -> Self {
        Listing { prefix, last: None, names: 0, bytes: 0, waited: Duration::ZERO, deadline }
    }

    fn refuse(&self, kind: std::io::ErrorKind, msg: String) -> StoreError {
        StoreError::Io { key: self.prefix.to_owned(), source: std::io::Error::new(kind, msg) }
    }

    /// One page's request, its time counted against the deadline.
    fn call(&mut self, store: &EtcdStore, path: &str, body: &Value) -> Result<Value, StoreError> {
        let timed_out = |l: &Self, last: String| {
            l.refuse(
                std::io::ErrorKind::TimedOut,
                format!("a listing still paging after {:?} waiting on etcd, its deadline ({} names so far){last}", l.waited, l.names),
            )
        };
        let Some(left) = self.deadline.checked_sub(self.waited).filter(|l| !l.is_zero()) else {
            return Err(timed_out(self, String::new()));
        };
        let t = Instant::now();
        let v = store.call_until(self.prefix, path, body, Some(t + left));
        self.waited += t.elapsed();
        match v {
            Err(e) if self.waited >= self.deadline => Err(timed_out(self, format!("; last: {e}"))),
            v => v,
        }
    }

    /// Checks one page of `names` (at most `asked`; `more` if another
    /// follows) against the listing so far, and counts it.
    fn check(&mut self, names: &[String], asked: usize, more: bool) -> Result<(), StoreError> {
        use std::io::ErrorKind::InvalidData;
        let bad = |l: &Self, what: String| l.refuse(InvalidData, format!("etcd answered a listing page {what}"));
        if names.len() > asked {
            return Err(bad(self, format!("of {} names, more than the {asked} asked for", names.len())));
        }
        if more && names.is_empty() {
            return Err(bad(self, "that does not move on: no name, and \"more\"".into()));
        }
        let mut before = self.last.as_deref();
        for name in names {
            if name.is_empty() {
                return Err(bad(self, "with an empty name (the store's prefix alone)".into()));
            }
            if !name.starts_with(self.prefix) {
                return Err(bad(self, format!("with {name:?}, outside the range {:?}", self.prefix)));
            }
            if name == self.prefix {
                return Err(bad(self, format!("with an empty name ({:?} alone)", self.prefix)));
            }
            match before {
                Some(b) if name == b => return Err(bad(self, format!("that does not move on: {name:?} repeated"))),
                Some(b) if name.as_str() < b => {
                    return Err(bad(self, format!("that does not move on: {name:?} after {b:?} (names must rise)")))
                }
                _ => {}
            }
            before = Some(name);
        }
        self.names += names.len();
        self.bytes += names.iter().map(String::len).sum::<usize>();
        if self.names > MAX_LISTED_NAMES {
            return Err(self.refuse(InvalidData, format!("a listing of more than {MAX_LISTED_NAMES} names")));
        }
        if self.bytes > MAX_LISTING {
            return Err(self.refuse(InvalidData, format!("a listing of more than {MAX_LISTING} bytes of names")));
        }
        if let Some(l) = names.last() {
            self.last = Some(l.clone());
        }
        Ok(())
    }
}

impl Store for EtcdStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.get_stamped(key)?.map(|(v, _)| v))
    }

    fn get_stamped(&self, key: &str) -> Result<Option<(Vec<u8>, Stamp)>, StoreError> {
        let full = self.full(key)?;
        let v = self.call(key, "/v3/kv/range", &json!({ "key": b64(full.as_bytes()) }))?;
        range_value(&v, key)
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        let full = self.full(key)?;
        Self::check_size(key, full.len() + value.len())?;
        self.call(key, "/v3/kv/put", &json!({ "key": b64(full.as_bytes()), "value": b64(value) }))?;
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        let full = self.full(key)?;
        self.call(key, "/v3/kv/deleterange", &json!({ "key": b64(full.as_bytes()) }))?;
        Ok(())
    }

    /// A consistent snapshot of the names ([`EtcdStore::names_under`]).
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        check_key(prefix.trim_end_matches('/'))?;
        self.names_under(prefix)
    }

    /// Another store's mark (`public/generations`) at a prefix around this
    /// one (this store lies inside it), or below this one: on `init`
    /// anywhere below, else among the sealed copies, which clean-up walks.
    fn check_nesting(&self, creating: bool) -> Result<(), StoreError> {
        let name = self.prefix.trim_end_matches('/');
        let parts: Vec<&str> = name.split('/').collect();
        for i in 1..parts.len() {
            let outer = parts[..i].join("/");
            let mark = format!("{outer}/{STORE_MARK}");
            let v = self.call(&mark, "/v3/kv/range", &json!({ "key": b64(mark.as_bytes()), "keys_only": true }))?;
            if range_value(&v, &mark)?.is_some() {
                return Err(StoreError::Nested { store: name.to_owned(), other: outer, inside: true });
            }
        }
        let below = if creating { self.names_under("")? } else { self.list(super::layout::SEALED)? };
        let nested = format!("/{STORE_MARK}");
        if let Some(inner) = below.iter().find_map(|n| n.strip_suffix(nested.as_str())) {
            return Err(StoreError::Nested { store: name.to_owned(), other: format!("{}{inner}", self.prefix), inside: false });
        }
        Ok(())
    }

    /// Holds nothing: every commit is a transaction that compares what it
    /// read ([`Store::commit`]), which fences writers without a lock that
    /// a paused process could believe it still holds.
    fn lock(&self, _wait: Duration) -> Result<StoreLock, StoreError> {
        Ok(StoreLock::new(()))
    }

    fn lock_is_exclusive(&self) -> bool {
        false
    }

    /// etcd's compaction at the current revision. Not `physical`: the
    /// call returns once the compaction is applied, and from then on every
    /// read at an older revision is refused (`required revision has been
    /// compacted`), which is what a revocation needs; the members drop the
    /// old values from their backends in the background, where waiting
    /// for them made 35% of a 20,000-envelope revocation's time and closed
    /// no read. It is the whole cluster's: a cluster shared with others
    /// loses their history too, which is why a revocation lets the caller
    /// skip it.
    fn compact(&self) -> Result<bool, StoreError> {
        let revision = self.revision()?;
        self.call("", "/v3/kv/compaction", &json!({ "revision": revision.to_string(), "physical": false }))?;
        Ok(true)
    }

    /// One range request a page, names and values together, each page
    /// starting after the last name of the one before (read at the
    /// cluster's revision of the moment: a long scan is not held to one
    /// revision, which a compaction meanwhile would end). A page that does
    /// not move on is an error, as for a listing.
    fn scan(&self, prefix: &str, page: usize, each: &mut PageVisitor<'_>) -> Result<(), StoreError> {
        check_key(prefix.trim_end_matches('/'))?;
        let most = page.clamp(1, PAGE);
        // The first page is small; then each holds as many values as fit
        // half the reply cap at the largest value seen so far, so a store
        // of large values pages in fewer of them rather than failing on a
        // reply over the cap.
        let mut page = most.min(MAX_TXN_OPS);
        let mut largest = 0usize;
        let start = format!("{}{prefix}", self.prefix);
        let end = prefix_end(start.as_bytes());
        let mut from = start.into_bytes();
        let mut listing = Listing::new(prefix, self.listing_deadline);
        loop {
            let req = json!({ "key": b64(&from), "range_end": b64(&end), "limit": page });
            let v = listing.call(self, "/v3/kv/range", &req)?;
            let (names, values, more) = range_page(&v, &self.prefix, prefix)?;
            // Names rise strictly, within the page and past the last page,
            // and stay under the prefix: an endpoint that repeats or
            // reorders a page is an error, not a loop. And the whole stays a
            // store's size, as for a listing.
            listing.check(&names, page, more)?;
            let Some(tail) = names.last().cloned() else { return Ok(()) };
            largest = largest.max(values.iter().map(Vec::len).max().unwrap_or(0) + tail.len());
            each(names, values.into_iter().map(Some).collect())?;
            if !more {
                return Ok(());
            }
            // Base64 and JSON make a value about 4/3 its size, and more.
            let fits = (MAX_REPLY as usize / 2) / (largest * 3 / 2 + 64).max(1);
            page = fits.clamp(1, most);
            from = format!("{}{tail}\0", self.prefix).into_bytes();
        }
    }

    /// One read-only transaction per 128 objects (etcd's `--max-txn-ops`),
    /// each a linearizable read of all of them at one revision.
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(MAX_TXN_OPS) {
            let mut success = Vec::with_capacity(chunk.len());
            for k in chunk {
                success.push(json!({ "request_range": { "key": b64(self.full(k)?.as_bytes()) } }));
            }
            let first = chunk.first().map_or("", String::as_str);
            let v = self.call(first, "/v3/kv/txn", &json!({ "success": success }))?;
            out.extend(txn_values(&v, chunk)?);
        }
        Ok(out)
    }

    /// etcd's own watch stream ([`EtcdStore::watch`]): no polling, and a
    /// revision to resume from that etcd remembers until it compacts.
    fn watch(self: Arc<Self>, prefix: &str, after: i64) -> Result<Watch, StoreError> {
        EtcdStore::watch(&self, prefix, after)
    }

    /// One etcd transaction: `compare` the `mod_revision` of each expected
    /// object (or that it does not exist), `success` the writes. All or
    /// nothing; [`StoreError::Conflict`] when a comparison fails.
    fn commit(&self, batch: &Batch) -> Result<(), StoreError> {
        let first = batch.ops.first().map(|o| o.key().to_owned()).unwrap_or_default();
        if batch.ops.len() > MAX_TXN_OPS {
            return Err(StoreError::TooLarge { key: first, what: "writes in one commit", len: batch.ops.len(), max: MAX_TXN_OPS });
        }
        Self::check_size(&first, batch.size() + batch.ops.len() * self.prefix.len())?;
        let mut compare = Vec::new();
        for (key, stamp) in &batch.expect {
            let k = b64(self.full(key)?.as_bytes());
            compare.push(match stamp {
                None => json!({ "key": k, "target": "VERSION", "result": "EQUAL", "version": "0" }),
                Some(s) => match s.as_revision() {
                    Some(r) => json!({ "key": k, "target": "MOD", "result": "EQUAL", "mod_revision": r.to_string() }),
                    // A stamp from a store without revisions cannot be
                    // this store's: the object was not read here.
                    None => return Err(StoreError::Conflict { key: key.clone() }),
                },
            });
        }
        let mut success = Vec::new();
        for op in &batch.ops {
            let k = b64(self.full(op.key())?.as_bytes());
            success.push(match op {
                Op::Put(_, v) => json!({ "request_put": { "key": k, "value": b64(v) } }),
                Op::Delete(_) => json!({ "request_delete_range": { "key": k } }),
            });
        }
        let v = self.call(&first, "/v3/kv/txn", &json!({ "compare": compare, "success": success }))?;
        if txn_succeeded(&v) {
            return Ok(());
        }
        let key = batch.expect.first().map(|(k, _)| k.clone()).unwrap_or(first);
        Err(StoreError::Conflict { key })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_bound_exactly_their_prefix() {
        assert_eq!(prefix_end(b"kf/envelopes/"), b"kf/envelopes0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn bad_configurations_are_refused_before_any_request() {
        let c = |e: &[&str], p: &str| EtcdConfig::new(e.iter().map(|s| s.to_string()).collect(), p);
        for (config, why) in [
            (c(&[], "kf"), "no endpoint"),
            (c(&["127.0.0.1:1"], ""), "prefix"),
            (c(&["127.0.0.1:1"], "a/../b"), "prefix"),
            (EtcdConfig { client_pem: Some((b"x".to_vec(), b"y".to_vec().into())), ..c(&["127.0.0.1:1"], "kf") }, "needs TLS"),
            (EtcdConfig { ca_pem: Some(b"not a certificate".to_vec()), ..c(&["127.0.0.1:1"], "kf") }, "no certificate"),
        ] {
            let err = EtcdStore::open(config).unwrap_err();
            assert!(matches!(err, StoreError::InvalidName { .. }) && err.to_string().contains(why), "{why}: {err}");
            assert_eq!(err.code(), crate::ErrorCode::InvalidArgument);
        }
    }

    #[test]
    fn values_and_commits_over_the_request_limit_are_refused_before_sending() {
        // Port 1 answers nothing: a request would fail with STORE_IO, so
        // LIMIT_EXCEEDED shows the refusal came first.
        let s = EtcdStore::open(EtcdConfig { retry_for: Duration::ZERO, ..EtcdConfig::new(vec!["127.0.0.1:1".into()], "kf") }).unwrap();
        let big = vec![0u8; MAX_REQUEST];
        let err = s.put("envelopes/aa", &big).unwrap_err();
        assert_eq!(err.code(), crate::ErrorCode::LimitExceeded, "{err}");
        let mut batch = Batch::default();
        for i in 0..=MAX_TXN_OPS {
            batch.push(Op::Delete(format!("envelopes/{i}")));
        }
        assert_eq!(s.commit(&batch).unwrap_err().code(), crate::ErrorCode::LimitExceeded);
        let mut batch = Batch::default();
        batch.push(Op::Put("a/1".into(), vec![0; MAX_REQUEST / 2]));
        batch.push(Op::Put("a/2".into(), vec![0; MAX_REQUEST / 2]));
        assert_eq!(s.commit(&batch).unwrap_err().code(), crate::ErrorCode::LimitExceeded);
        assert_eq!(s.put("envelopes/aa", b"small").unwrap_err().code(), crate::ErrorCode::StoreIo);
    }
}
