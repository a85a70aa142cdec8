//! A store named by one string, the same in every binding and on the
//! command line: a directory path ([`FileStore`]) or
//! `etcd://HOST:PORT[,HOST:PORT...]/PREFIX[?cacert=PATH&cert=PATH&key=PATH]`
//! (the `etcd` feature's `EtcdStore`; `cacert` switches to TLS, `cert`
//! and `key` add a client certificate).

use std::sync::Arc;

use super::store::{FileStore, Store, StoreError, STORE_MARK};

/// Opens the existing store `name` names (see the module documentation).
/// It never creates one: a mistyped directory is not made, and a name
/// that holds no store is an error, not an empty store that later fails
/// as a missing key would. [`create_store`] is what an authority's `init`
/// uses.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let name = dir.path().join("store");
/// let name = name.to_str().unwrap();
/// assert!(keyfence::wrap::open_store(name).is_err()); // nothing there yet
/// keyfence::wrap::Authority::init(keyfence::wrap::create_store(name)?)?;
/// let store = keyfence::wrap::open_store(name)?;
/// assert!(store.get("public/generations")?.is_some());
/// assert!(keyfence::wrap::open_store("etcd://").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`StoreError::NotAStore`] for a directory that does not exist or holds
/// no store, or an etcd prefix without one; [`StoreError::InvalidName`]
/// for an `etcd://` name without an endpoint or prefix, an unknown option,
/// an unreadable certificate file, or an `etcd://` name in a build
/// without the `etcd` feature; [`StoreError::Io`] for a store that cannot
/// be read.
pub fn open_store(name: &str) -> Result<Arc<dyn Store>, StoreError> {
    // A directory is looked at before anything is made.
    if !name.is_empty() && !name.starts_with("etcd://") && !std::path::Path::new(name).join(STORE_MARK).is_file() {
        return Err(StoreError::NotAStore { name: shown(name) });
    }
    let store = open_or_create(name)?;
    if store.get(STORE_MARK)?.is_none() {
        return Err(StoreError::NotAStore { name: shown(name) });
    }
    Ok(store)
}

/// The store `name` names, made if it is a directory that does not exist
/// yet (mode 700, its missing parents too): for an authority's `init`
/// (which then refuses a store already there, or nested in or around
/// another), and for scratch stores. Refuses a directory name inside
/// another store before creating anything.
///
/// # Errors
/// As [`open_store`], but for a store not being there;
/// [`StoreError::Nested`] for a directory inside another store;
/// [`StoreError::Io`] for a directory that cannot be created.
pub fn create_store(name: &str) -> Result<Arc<dyn Store>, StoreError> {
    if !name.starts_with("etcd://") && !name.is_empty() {
        // Before the directory is made: an init inside another store must
        // leave nothing there.
        let abs = std::path::absolute(name).unwrap_or_else(|_| std::path::PathBuf::from(name));
        for outer in abs.ancestors().skip(1) {
            if outer.join(STORE_MARK).is_file() {
                return Err(StoreError::Nested { store: name.to_owned(), other: outer.display().to_string(), inside: true });
            }
        }
    }
    open_or_create(name)
}

/// The name as messages show it: an etcd name without its options (which
/// name files, never passwords, but need not be repeated).
fn shown(name: &str) -> String {
    name.split('?').next().unwrap_or(name).to_owned()
}

fn open_or_create(name: &str) -> Result<Arc<dyn Store>, StoreError> {
    if let Some(rest) = name.strip_prefix("etcd://") {
        return open_etcd(name, rest);
    }
    if name.is_empty() {
        return Err(StoreError::InvalidName { name: String::new(), reason: "empty: a directory or etcd://HOST:PORT/PREFIX".into() });
    }
    Ok(Arc::new(FileStore::open(name)?))
}

/// [`open_store`] for a name held as a path (a command-line argument, a
/// key process's request): a UTF-8 path is a store name, `etcd://`
/// included; any other is a directory.
///
/// # Errors
/// As [`open_store`].
pub fn open_store_path(name: &std::path::Path) -> Result<Arc<dyn Store>, StoreError> {
    match name.to_str() {
        Some(s) => open_store(s),
        None if name.join(STORE_MARK).is_file() => Ok(Arc::new(FileStore::open(name)?)),
        None => Err(StoreError::NotAStore { name: name.display().to_string() }),
    }
}

#[cfg(not(feature = "etcd"))]
fn open_etcd(name: &str, _rest: &str) -> Result<Arc<dyn Store>, StoreError> {
    Err(StoreError::InvalidName { name: name.to_owned(), reason: "this build has no etcd store (the `etcd` feature)".into() })
}

#[cfg(feature = "etcd")]
fn open_etcd(name: &str, rest: &str) -> Result<Arc<dyn Store>, StoreError> {
    Ok(Arc::new(super::etcd::EtcdStore::open(etcd_config(name, rest)?)?))
}

/// The configuration an `etcd://` name gives (`rest` is what follows the
/// scheme).
#[cfg(feature = "etcd")]
pub(crate) fn etcd_config(name: &str, rest: &str) -> Result<super::etcd::EtcdConfig, StoreError> {
    let bad = |reason: String| StoreError::InvalidName { name: name.to_owned(), reason };
    let (main, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (hosts, prefix) = main.split_once('/').ok_or_else(|| bad("no /PREFIX after the endpoints".into()))?;
    let endpoints: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    for e in &endpoints {
        super::etcd::check_endpoint(e).map_err(bad)?;
    }
    let mut config = super::etcd::EtcdConfig::new(endpoints, prefix);
    let read = |what: &str, path: &str| std::fs::read(path).map_err(|e| bad(format!("{what} {path:?}: {e}")));
    let (mut cert, mut key) = (None, None);
    for opt in query.split('&').filter(|o| !o.is_empty()) {
        match opt.split_once('=') {
            Some(("cacert", p)) => config.ca_pem = Some(read("cacert", p)?),
            Some(("cert", p)) => cert = Some(read("cert", p)?),
            Some(("key", p)) => key = Some(zeroize::Zeroizing::new(read("key", p)?)),
            Some(("insecure-transport", "1")) => config.plaintext = true,
            _ => return Err(bad(format!("unknown option {opt:?} (cacert=, cert=, key=, insecure-transport=1)"))),
        }
    }
    match (cert, key) {
        (Some(c), Some(k)) => config.client_pem = Some((c, k)),
        (None, None) => {}
        _ => return Err(bad("cert= and key= go together".into())),
    }
    Ok(config)
}

#[cfg(all(test, feature = "etcd"))]
mod tests {
    use super::*;

    #[test]
    fn etcd_names_read_into_their_configuration() {
        let c = etcd_config("n", "127.0.0.1:2379,[::1]:2380/keyfence/prod").unwrap();
        assert_eq!(c.endpoints, vec!["127.0.0.1:2379", "[::1]:2380"]);
        assert_eq!(c.prefix, "keyfence/prod");
        assert!(c.ca_pem.is_none() && c.client_pem.is_none());
        for (bad, why) in [
            ("127.0.0.1:2379", "PREFIX"),
            ("127.0.0.1/kf", "HOST:PORT"),
            (":2379/kf", "HOST:PORT"),
            ("h:99999/kf", "HOST:PORT"),
            ("h:1/kf?color=red", "unknown option"),
            ("h:1/kf?cert=/dev/null", "together"),
            ("h:1/kf?cacert=/nonexistent/ca.pem", "/nonexistent/ca.pem"),
            ("10.255.255.1:2379@127.0.0.1:23790/t7", "HOST:PORT"),
            ("127.0.0.1:2379/kf?insecure-transport=yes", "unknown option"),
        ] {
            let err = etcd_config("n", bad).unwrap_err();
            assert!(err.to_string().contains(why), "{bad}: {err}");
            assert_eq!(err.code(), crate::ErrorCode::InvalidArgument);
        }
        assert!(matches!(open_store("etcd://h:1/"), Err(StoreError::InvalidName { .. })));
    }

    #[test]
    fn plain_http_goes_only_to_this_machine_unless_the_name_says_so() {
        use super::super::etcd::EtcdStore;
        for local in ["127.0.0.1:2379", "localhost:2379", "[::1]:2379", "127.8.9.1:1"] {
            EtcdStore::open(etcd_config("n", &format!("{local}/kf")).unwrap()).unwrap();
        }
        let err = EtcdStore::open(etcd_config("n", "127.0.0.1:2379,10.1.2.3:2379/kf").unwrap()).unwrap_err();
        assert!(err.to_string().contains("10.1.2.3:2379 is not on this machine") && err.to_string().contains("cacert"), "{err}");
        assert_eq!(err.code(), crate::ErrorCode::InvalidArgument);
        EtcdStore::open(etcd_config("n", "10.1.2.3:2379/kf?insecure-transport=1").unwrap()).unwrap();
    }
}
