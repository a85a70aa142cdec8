//! Reading keyfence key files (`keyfence provider-key`, docs/openssl.md):
//! the OpenSSL provider reads them through these, so the format has one
//! reader, the core's `keyfence::key_file`.

use std::ffi::{c_char, CString};

use keyfence_core::key_file::{KeyFile, KeyLocation};
use keyfence_core::ErrorCode;

use crate::error::{keyfence_result, Error};
use crate::ffi;

/// A parsed key file. Immutable, so it may be read from several threads;
/// the pointers its accessors return stay valid until
/// `keyfence_key_file_free`.
pub struct keyfence_key_file {
    file: KeyFile,
    /// The text fields as C strings, indexed by `keyfence_key_file_field`.
    texts: [Option<CString>; 7],
    /// Each peer's name, address, attributes and server name.
    peers: Vec<[Option<CString>; 4]>,
}

/// The text fields of a key file: the `field` argument of
/// `keyfence_key_file_text` (a `uint32_t`, so that no value C passes is
/// undefined behaviour in Rust).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum keyfence_key_file_field {
    /// A local key's store (a directory or `etcd://...`).
    KEYFENCE_KEY_FILE_STORE = 0,
    /// A local key's machine key file.
    KEYFENCE_KEY_FILE_MACHINE_KEY = 1,
    /// A remote key's client certificate file.
    KEYFENCE_KEY_FILE_TLS_CERT = 2,
    /// A remote key's client certificate key file.
    KEYFENCE_KEY_FILE_TLS_KEY = 3,
    /// A remote key's CA certificates file.
    KEYFENCE_KEY_FILE_TLS_CA = 4,
    /// An agent's key: the agent's socket (also a token key's, when the
    /// agent loads it).
    KEYFENCE_KEY_FILE_AGENT_SOCKET = 5,
    /// A token key's PKCS#11 URI (docs/pkcs11.md).
    KEYFENCE_KEY_FILE_PKCS11_URI = 6,
}

/// A text of the format, which the core has checked to hold no NUL.
fn c_text(s: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::new(ErrorCode::Internal, "a key file text holds a NUL"))
}

impl keyfence_key_file {
    fn new(file: KeyFile) -> Result<Self, Error> {
        let opt = |s: &Option<String>| s.as_deref().map(c_text).transpose();
        let (texts, peers) = match &file.location {
            KeyLocation::Local { store, machine_key } => ([opt(store)?, opt(machine_key)?, None, None, None, None, None], Vec::new()),
            KeyLocation::Agent { socket } => ([None, None, None, None, None, Some(c_text(socket)?), None], Vec::new()),
            KeyLocation::Pkcs11 { uri, agent } => ([None, None, None, None, None, opt(agent)?, Some(c_text(uri)?)], Vec::new()),
            KeyLocation::Remote { tls_cert, tls_key, tls_ca, peers } => {
                let peers = peers
                    .iter()
                    .map(|p| Ok([Some(c_text(&p.name)?), Some(c_text(&p.addr)?), Some(c_text(&p.attrs)?), opt(&p.server_name)?]))
                    .collect::<Result<Vec<_>, Error>>()?;
                ([None, None, Some(c_text(tls_cert)?), Some(c_text(tls_key)?), Some(c_text(tls_ca)?), None, None], peers)
            }
        };
        Ok(keyfence_key_file { file, texts, peers })
    }
}

fn c_ptr(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr())
}

/// Parses a key file's body (the bytes of its `KEYFENCE KEY` PEM block,
/// after base64) into `*out`.
///
/// Errors: `KEYFENCE_INVALID_PRIVATE_KEY` with a message naming the field
/// at fault (bad magic, another version, a field cut short, an unknown or
/// repeated field, a field missing); `KEYFENCE_INVALID_ARGUMENT` for NULL
/// arguments.
///
/// # Safety
/// `body` points to `len` readable bytes; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_file_parse(body: *const u8, len: usize, out: *mut *mut keyfence_key_file) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        ffi::make(out, "out", || {
            // SAFETY: the caller's promise.
            let b = ffi::slice(body, len, "body")?;
            keyfence_key_file::new(KeyFile::from_bytes(b)?)
        })
    }
}

/// Whether the key is signed by key servers (else this machine or a key
/// agent opens it). False for NULL.
///
/// # Safety
/// `file` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_file_is_remote(file: *const keyfence_key_file) -> bool {
    // SAFETY: the caller's promise; NULL becomes `None`.
    unsafe { file.as_ref() }.is_some_and(|f| matches!(f.file.location, KeyLocation::Remote { .. }))
}

/// Whether the key is held by a key agent (`keyfence agent`) whose socket
/// the file names (`KEYFENCE_KEY_FILE_AGENT_SOCKET`). False for NULL.
///
/// # Safety
/// `file` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_file_is_agent(file: *const keyfence_key_file) -> bool {
    // SAFETY: the caller's promise; NULL becomes `None`.
    unsafe { file.as_ref() }.is_some_and(|f| matches!(f.file.location, KeyLocation::Agent { .. }))
}

/// Whether the key is in a PKCS#11 token, named by the file's URI
/// (`KEYFENCE_KEY_FILE_PKCS11_URI`), loaded by the agent whose socket the
/// file names if it names one (`KEYFENCE_KEY_FILE_AGENT_SOCKET`). Such a
/// file has no envelope. False for NULL.
///
/// # Safety
/// `file` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_file_is_pkcs11(file: *const keyfence_key_file) -> bool {
    // SAFETY: the caller's promise; NULL becomes `None`.
    unsafe { file.as_ref() }.is_some_and(|f| matches!(f.file.location, KeyLocation::Pkcs11 { .. }))
}

/// The key's public half (DER `SubjectPublicKeyInfo`) into `*data` and
/// `*len`, borrowed from `file`.
///
/// Errors: `KEYFENCE_INVALID_ARGUMENT` for NULL arguments.
///
/// # Safety
/// `file` is a live handle; `data` and `len` are writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_file_public_key(
    file: *const keyfence_key_file, data: *mut *const u8, len: *mut usize,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { view(file, data, len, |f| &f.public_key) }
}

/// The key's envelope into `*data` and `*len`, borrowed from `file`
/// (empty for a token key).
///
/// Errors: `KEYFENCE_INVALID_ARGUMENT` for NULL arguments.
///
/// # Safety
/// `file` is a live handle; `data` and `len` are writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_file_envelope(
    file: *const keyfence_key_file, data: *mut *const u8, len: *mut usize,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { view(file, data, len, |f| &f.envelope) }
}

/// # Safety
/// As the functions above.
unsafe fn view(
    file: *const keyfence_key_file, data: *mut *const u8, len: *mut usize, field: impl Fn(&KeyFile) -> &Vec<u8>,
) -> keyfence_result {
    ffi::boundary(|| {
        let (data, len) = (ffi::out(data, "data")?, ffi::out(len, "len")?);
        // SAFETY: the caller's promise.
        let b = field(&unsafe { ffi::borrow(file, "file")? }.file);
        // SAFETY: both checked non-NULL; writable by the caller's promise.
        unsafe {
            data.write(b.as_ptr());
            len.write(b.len());
        }
        Ok(())
    })
}

/// A text field into `*out` (NUL-terminated, borrowed from `file`), or NULL
/// when the file does not name it: a local key's store or machine key left
/// to the provider's configuration, or a field of the other mode.
///
/// Errors: `KEYFENCE_INVALID_ARGUMENT` for a `field` that is no
/// `keyfence_key_file_field` or NULL arguments.
///
/// # Safety
/// `file` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_file_text(file: *const keyfence_key_file, field: u32, out: *mut *const c_char) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(out, "out")?;
        // SAFETY: the caller's promise.
        let f = unsafe { ffi::borrow(file, "file")? };
        let text = usize::try_from(field)
            .ok()
            .and_then(|i| f.texts.get(i))
            .ok_or_else(|| Error::new(ErrorCode::InvalidArgument, format!("{field} is no keyfence_key_file_field")))?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { out.write(c_ptr(text)) };
        Ok(())
    })
}

/// How many key servers a remote key file names (0 for a local key or
/// NULL).
///
/// # Safety
/// `file` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_file_peer_count(file: *const keyfence_key_file) -> usize {
    // SAFETY: the caller's promise; NULL becomes `None`.
    unsafe { file.as_ref() }.map_or(0, |f| f.peers.len())
}

/// Key server `index` of a remote key file: its name, `host:port`,
/// attributes and server name (NULL when it is the name), each
/// NUL-terminated and borrowed from `file`.
///
/// Errors: `KEYFENCE_INVALID_ARGUMENT` for an index not below
/// `keyfence_key_file_peer_count` or NULL arguments (`server_name` may not
/// be NULL either; `*server_name` may be).
///
/// # Safety
/// `file` is a live handle; the four outputs are writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_file_peer(
    file: *const keyfence_key_file, index: usize, name: *mut *const c_char, addr: *mut *const c_char, attrs: *mut *const c_char,
    server_name: *mut *const c_char,
) -> keyfence_result {
    ffi::boundary(|| {
        let outs = [ffi::out(name, "name")?, ffi::out(addr, "addr")?, ffi::out(attrs, "attrs")?, ffi::out(server_name, "server_name")?];
        // SAFETY: the caller's promise.
        let f = unsafe { ffi::borrow(file, "file")? };
        let peer = f.peers.get(index).ok_or_else(|| {
            Error::new(ErrorCode::InvalidArgument, format!("key server {index} asked of a key file that names {}", f.peers.len()))
        })?;
        for (out, s) in outs.into_iter().zip(peer) {
            // SAFETY: checked non-NULL; writable by the caller's promise.
            unsafe { out.write(c_ptr(s)) };
        }
        Ok(())
    })
}

/// Frees a key file; NULL is a no-op.
///
/// # Safety
/// `file` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_key_file_free(file: *mut keyfence_key_file) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(file) }
}
