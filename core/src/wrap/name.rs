//! A store named by one string, the same in every binding and on the
//! command line: a directory path ([`FileStore`]) or
//! `etcd://HOST:PORT[,HOST:PORT...]/PREFIX[?cacert=PATH&cert=PATH&key=PATH]`
//! (the `etcd` feature's `EtcdStore`; `cacert` switches to TLS, `cert`
//! and `key` add a client certificate).

use std::sync::Arc;

use super::store::{FileStore, Store, StoreError};

/// Opens the store `name` names (see the module documentation).
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let store = keyfence::wrap::open_store(dir.path().to_str().unwrap())?;
/// store.put("public/x", b"1")?;
/// assert!(keyfence::wrap::open_store("etcd://").is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`StoreError::InvalidName`] for an `etcd://` name without an endpoint
/// or prefix, an unknown option, an unreadable certificate file, or an
/// `etcd://` name in a build without the `etcd` feature;
/// [`StoreError::Io`] for a directory that cannot be created.
pub fn open_store(name: &str) -> Result<Arc<dyn Store>, StoreError> {
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
        None => Ok(Arc::new(FileStore::open(name)?)),
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
        let port = e.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
        if !matches!(port, Some((h, Ok(_))) if !h.is_empty()) {
            return Err(bad(format!("endpoint {e:?} is not HOST:PORT")));
        }
    }
    let mut config = super::etcd::EtcdConfig::new(endpoints, prefix);
    let read = |what: &str, path: &str| std::fs::read(path).map_err(|e| bad(format!("{what} {path:?}: {e}")));
    let (mut cert, mut key) = (None, None);
    for opt in query.split('&').filter(|o| !o.is_empty()) {
        match opt.split_once('=') {
            Some(("cacert", p)) => config.ca_pem = Some(read("cacert", p)?),
            Some(("cert", p)) => cert = Some(read("cert", p)?),
            Some(("key", p)) => key = Some(zeroize::Zeroizing::new(read("key", p)?)),
            _ => return Err(bad(format!("unknown option {opt:?} (cacert=, cert=, key=)"))),
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
        ] {
            let err = etcd_config("n", bad).unwrap_err();
            assert!(err.to_string().contains(why), "{bad}: {err}");
            assert_eq!(err.code(), crate::ErrorCode::InvalidArgument);
        }
        assert!(matches!(open_store("etcd://h:1/"), Err(StoreError::InvalidName { .. })));
    }
}
