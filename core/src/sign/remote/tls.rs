//! Mutual TLS for the remote protocol, on AWS-LC: certificates and
//! keys from PEM files, TLS 1.3 only, and only the configured CA trusted
//! (never the system's roots), in both directions. A server refuses a
//! client without a certificate from that CA before any frame is read; a
//! client checks the server's certificate names the peer it meant.

use std::fmt;
use std::path::{Path, PathBuf};

use openssl::ssl::{SslAcceptor, SslConnector, SslContextBuilder, SslFiletype, SslMethod, SslVerifyMode, SslVersion};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::X509;

use crate::sign::types::SignError;

/// The files of one side of a mutual-TLS connection, all PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// This side's certificate chain (leaf first).
    pub cert: PathBuf,
    /// This side's private key (owner-readable only).
    pub key: PathBuf,
    /// The CA certificates the other side's certificate must chain to;
    /// nothing else is trusted.
    pub ca: PathBuf,
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Paths only; the key file's content is never read into a message.
        f.debug_struct("TlsFiles").field("cert", &self.cert).field("key", &self.key).field("ca", &self.ca).finish()
    }
}

fn config_error(what: &str, path: &Path, e: impl fmt::Display) -> SignError {
    SignError::Config(format!("{what} {}: {e}", path.display()))
}

/// This side's certificate, key, trusted CA and TLS 1.3.
fn configure(ctx: &mut SslContextBuilder, files: &TlsFiles) -> Result<(), SignError> {
    ctx.set_min_proto_version(Some(SslVersion::TLS1_3)).map_err(|e| SignError::Config(format!("TLS 1.3: {e}")))?;
    ctx.set_certificate_chain_file(&files.cert).map_err(|e| config_error("certificate", &files.cert, e))?;
    ctx.set_private_key_file(&files.key, SslFiletype::PEM).map_err(|e| config_error("private key", &files.key, e))?;
    ctx.check_private_key().map_err(|e| config_error("private key (does not match the certificate)", &files.key, e))?;
    let pem = std::fs::read(&files.ca).map_err(|e| config_error("CA file", &files.ca, e))?;
    let cas = X509::stack_from_pem(&pem).map_err(|e| config_error("CA file", &files.ca, e))?;
    if cas.is_empty() {
        return Err(config_error("CA file", &files.ca, "no certificate in it"));
    }
    let mut store = X509StoreBuilder::new().map_err(|e| SignError::Config(format!("certificate store: {e}")))?;
    for ca in cas {
        store.add_cert(ca).map_err(|e| config_error("CA file", &files.ca, e))?;
    }
    ctx.set_cert_store(store.build());
    Ok(())
}

/// The server's TLS context: a client must present a certificate from the
/// CA.
///
/// # Errors
/// [`SignError::Config`] naming the file that cannot be used.
pub(crate) fn acceptor(files: &TlsFiles) -> Result<SslAcceptor, SignError> {
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).map_err(|e| SignError::Config(format!("TLS context: {e}")))?;
    configure(&mut b, files)?;
    b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    Ok(b.build())
}

/// The client's TLS context: the server must present a certificate from
/// the CA for the name the client asks for.
///
/// # Errors
/// [`SignError::Config`] naming the file that cannot be used.
pub(crate) fn connector(files: &TlsFiles) -> Result<SslConnector, SignError> {
    let mut b = SslConnector::builder(SslMethod::tls()).map_err(|e| SignError::Config(format!("TLS context: {e}")))?;
    configure(&mut b, files)?;
    b.set_verify(SslVerifyMode::PEER);
    Ok(b.build())
}
