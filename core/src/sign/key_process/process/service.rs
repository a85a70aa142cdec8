//! The key process's service: the one table of what its client, its
//! parent, may ask, and the loading it does that the agent does not.
//!
//! Its client names the sources of its keys (a key file, key bytes, an
//! envelope with the store's objects, a token key) and may have it drop
//! privileges; it opens no store and names no path of its own. The agent
//! is the other service over the same engine (`agent/service.rs`).

use std::path::Path;

use zeroize::Zeroizing;

use crate::sign::key_process::protocol::{self as p, kind, ErrorCode, LoadBody, Source};
use crate::sign::key_process::server::{Client, Refusal, Service, Table};
use crate::sign::sys;
use crate::sign::PrivateKey;

/// What the key process permits.
pub(crate) static TABLE: Table = Table {
    requests: REQUESTS,
    other_requests: "the key process does not take this request",
    sources: &[Source::File, Source::Bytes, Source::EnvelopeObjects, Source::Pkcs11],
    other_sources: "a key process opens no envelope on its own: its client sends the envelope with the store's objects (source 6)",
};

#[cfg(not(feature = "testing"))]
const REQUESTS: &[u8] = &[kind::OP, kind::LOAD, kind::UNLOAD, kind::STATUS, kind::DROP_PRIVILEGES];
/// Test builds add two requests their sandbox tests make.
#[cfg(feature = "testing")]
const REQUESTS: &[u8] =
    &[kind::OP, kind::LOAD, kind::UNLOAD, kind::STATUS, kind::DROP_PRIVILEGES, kind::TEST_CREATE_FILE, kind::TEST_FORBIDDEN_CALL];

/// The key process as a [`Service`].
pub(crate) struct KeyProcessService;

impl Service for KeyProcessService {
    fn table(&self) -> &'static Table {
        &TABLE
    }

    fn load(&self, source: &LoadBody, _client: Option<&Client>) -> Result<PrivateKey, Refusal> {
        let failed = |msg: String| Refusal::new(ErrorCode::Load, msg);
        match source {
            LoadBody::File(path) => {
                let bytes = Zeroizing::new(std::fs::read(path).map_err(|e| failed(format!("reading {}: {e}", path.display())))?);
                PrivateKey::from_bytes(&bytes).map_err(|e| failed(format!("{}: {e}", path.display())))
            }
            LoadBody::Bytes(bytes) => PrivateKey::from_bytes(bytes).map_err(|e| failed(e.to_string())),
            LoadBody::EnvelopeObjects { machine_key, envelope, objects } => open_envelope(machine_key, envelope, objects),
            // With its detail: the client reports the load as it would in
            // process.
            LoadBody::Pkcs11(uri) => {
                crate::sign::pkcs11::load(uri, &crate::sign::pkcs11::Pkcs11Settings::from_env()).map_err(|e| Refusal::load_failed(&e))
            }
            LoadBody::AgentEnvelope(_) => Err(failed("a key process opens an envelope only with the machine key its client names".into())),
        }
    }

    fn own_request(&self, request: u8, body: &[u8]) -> Result<Vec<u8>, (ErrorCode, String)> {
        match request {
            kind::DROP_PRIVILEGES => {
                let (uid, gid) = p::parse_drop_privileges_request(body).map_err(|e| (ErrorCode::Malformed, e.to_string()))?;
                // Changing credentials can reset the dumpable flag: set it
                // again before answering.
                sys::drop_privileges(uid, gid)
                    .and_then(|()| sys::set_not_dumpable())
                    .map_err(|e| (ErrorCode::Privileges, e.to_string()))?;
                Ok(Vec::new())
            }
            #[cfg(feature = "testing")]
            kind::TEST_CREATE_FILE => {
                use std::os::unix::ffi::OsStrExt;
                let path = Path::new(std::ffi::OsStr::from_bytes(body));
                let created = std::fs::OpenOptions::new().write(true).create_new(true).open(path).is_ok();
                Ok(vec![u8::from(created)])
            }
            #[cfg(feature = "testing")]
            kind::TEST_FORBIDDEN_CALL => {
                // `socket`: the sandbox kills the process here.
                let survived = std::net::UdpSocket::bind("127.0.0.1:0").is_ok();
                Ok(vec![u8::from(survived)])
            }
            other => Err((ErrorCode::Malformed, format!("unknown request kind {other:#04x}"))),
        }
    }
}

/// Opens `envelope` with the machine key file and the store's objects the
/// client sent, each verified as the machine key's authority's. This is
/// the one place the secret machine key is decoded on the isolated path:
/// the key process's loader, never its client.
///
/// A refusal of the wrapping layer carries its code in the detail, so the
/// client's caller sees the code the same load has in process (a policy
/// the machine does not satisfy is a "no", not a backend failure).
fn open_envelope(machine_key: &Path, envelope: &[u8], objects: &[(String, Vec<u8>)]) -> Result<PrivateKey, Refusal> {
    use crate::wrap::{Machine, MachineKey, NewestLists, WrapError};
    let refused = |what: String, e: WrapError| Refusal {
        code: ErrorCode::Load,
        message: format!("{what}{e}"),
        detail: p::Detail { code: Some(e.code()), token: None },
    };
    let failed = |msg: String| Refusal::new(ErrorCode::Load, msg);
    let mk = Zeroizing::new(std::fs::read(machine_key).map_err(|e| failed(format!("reading {}: {e}", machine_key.display())))?);
    let mk = MachineKey::from_bytes(&mk).map_err(|e| refused(format!("{}: ", machine_key.display()), e))?;
    let (floor, objects): (Vec<_>, Vec<_>) = objects.iter().cloned().partition(|(name, _)| name == p::FLOOR_OBJECT);
    let machine = Machine::with_objects(mk, &objects).map_err(|e| refused(String::new(), e))?;
    // The newest lists this machine accepted before, which its client
    // keeps (the key process writes no file): the store's objects must not
    // go back on them.
    if let Some((_, bytes)) = floor.first() {
        let kept = NewestLists::from_bytes(bytes).map_err(|e| refused(String::new(), e))?;
        machine.require_kept(&kept).map_err(|e| refused(String::new(), e))?;
    }
    let secret = machine.open(envelope).map_err(|e| refused("opening the envelope: ".into(), e))?;
    PrivateKey::from_bytes(&secret).map_err(|e| failed(format!("the key in the envelope: {e}")))
}
