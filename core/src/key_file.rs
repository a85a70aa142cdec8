//! The keyfence key file: what an unmodified OpenSSL program (nginx,
//! HAProxy, Python's `ssl`) loads in place of a private key through
//! keyfence's OpenSSL provider (docs/openssl.md, "The key file").
//!
//! It says where the private key is, either opened on this machine from its
//! envelope or signed by key servers, and carries the key's public half, so
//! a server matches its certificate without asking anyone. It holds no
//! secret: the envelope is encrypted to its policy, and the rest are names.
//!
//! The body (what the PEM block `KEYFENCE KEY` carries, after base64) is
//! versioned: `KFKEY`, a version byte, then fields of a tag (1 byte), a
//! length (4 bytes, big-endian) and a value. A reader refuses another
//! version, a tag it does not know and a field given twice, so a version
//! that adds a field bumps the version byte: version 2 adds the agent
//! mode and its socket. A file is written in the oldest version that
//! carries it (local and remote keys in version 1, which older providers
//! read), and this reader reads both. One codec, here: the command line
//! writes it and the provider reads it through the C ABI.
//!
//! ```
//! use keyfence::key_file::{KeyFile, KeyLocation};
//!
//! let file = KeyFile {
//!     location: KeyLocation::Local { store: Some("/var/lib/keyfence".into()), machine_key: None },
//!     public_key: vec![0x30, 0x59],
//!     envelope: vec![1, 2, 3],
//! };
//! let body = file.to_bytes()?;
//! assert_eq!(KeyFile::from_bytes(&body)?, file);
//! assert!(KeyFile::from_bytes(&body[..body.len() - 1]).unwrap_err().to_string().contains("truncated"));
//! # Ok::<(), keyfence::key_file::KeyFileError>(())
//! ```

use crate::ErrorCode;

/// The PEM label of a key file.
pub const PEM_LABEL: &str = "KEYFENCE KEY";
/// The newest version of the body this module writes and reads (it reads
/// every version from 1).
pub const VERSION: u8 = 3;
/// The most key servers one remote key file names.
pub const MAX_PEERS: usize = 16;
const MAGIC: &[u8] = b"KFKEY";
/// The largest field a reader takes: an envelope is a few kilobytes, and a
/// hostile length must not make the reader allocate gigabytes.
const MAX_FIELD: usize = 1 << 20;

/// Field tags of version 1.
mod tag {
    pub const MODE: u8 = 1;
    pub const PUBLIC_KEY: u8 = 2;
    pub const ENVELOPE: u8 = 3;
    pub const STORE: u8 = 4;
    pub const MACHINE_KEY: u8 = 5;
    pub const TLS_CERT: u8 = 6;
    pub const TLS_KEY: u8 = 7;
    pub const TLS_CA: u8 = 8;
    pub const PEER: u8 = 9;
    /// Version 2: the agent's socket.
    pub const AGENT_SOCKET: u8 = 10;
    /// Version 3: a token key's PKCS#11 URI.
    pub const PKCS11_URI: u8 = 11;
}

/// The modes (the MODE field's byte).
mod mode {
    pub const LOCAL: u8 = 0;
    pub const REMOTE: u8 = 1;
    /// Version 2.
    pub const AGENT: u8 = 2;
    /// Version 3.
    pub const PKCS11: u8 = 3;
}

fn tag_name(t: u8) -> &'static str {
    match t {
        tag::MODE => "mode",
        tag::PUBLIC_KEY => "public key",
        tag::ENVELOPE => "envelope",
        tag::STORE => "store",
        tag::MACHINE_KEY => "machine key",
        tag::TLS_CERT => "TLS certificate",
        tag::TLS_KEY => "TLS key",
        tag::TLS_CA => "TLS CA",
        tag::PEER => "peer",
        tag::AGENT_SOCKET => "agent socket",
        tag::PKCS11_URI => "PKCS#11 URI",
        _ => "unknown",
    }
}

/// A key file: where a private key is, and its public half.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFile {
    /// Where the private key is used from.
    pub location: KeyLocation,
    /// The public key, DER `SubjectPublicKeyInfo`.
    pub public_key: Vec<u8>,
    /// The key's envelope (`keyfence authority wrap --out`); empty for a
    /// token key, which has none.
    pub envelope: Vec<u8>,
}

/// Where a key file's private key is used from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyLocation {
    /// Opened by this machine from the envelope. A name left out is taken
    /// from the provider's configuration.
    Local {
        /// The store's name (a directory or `etcd://...`).
        store: Option<String>,
        /// The machine key file's path.
        machine_key: Option<String>,
    },
    /// Signed by key servers (`keyfence serve`) over mutual TLS.
    Remote {
        /// This client's certificate (PEM file path).
        tls_cert: String,
        /// This client's certificate key (PEM file path).
        tls_key: String,
        /// The CA certificates the servers' must come from (PEM file path).
        tls_ca: String,
        /// The key servers, at least one and at most [`MAX_PEERS`].
        peers: Vec<KeyFilePeer>,
    },
    /// Held by the key agent listening on a Unix socket (`keyfence
    /// agent`), which opens the envelope with its own machine key: the
    /// process loading the file holds only the socket's name.
    Agent {
        /// The agent's socket (an absolute path).
        socket: String,
    },
    /// In a PKCS#11 token, named by its RFC 7512 URI (which holds no PIN):
    /// loaded by the engine's key process, by the agent on `agent`'s
    /// socket, or in the loading process, which then maps the token's
    /// module (docs/pkcs11.md).
    Pkcs11 {
        /// The key's URI.
        uri: String,
        /// The agent that loads it, if one does (an absolute path).
        agent: Option<String>,
    },
}

/// A key server named in a remote key file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFilePeer {
    /// Its name in metrics and errors (and its certificate's DNS name
    /// unless `server_name` is given).
    pub name: String,
    /// `host:port`.
    pub addr: String,
    /// Its machine's attributes (`label=value,...`).
    pub attrs: String,
    /// The DNS name its certificate must carry, if not `name`.
    pub server_name: Option<String>,
}

/// A key file that cannot be read or written, with the field at fault.
/// Its code is [`ErrorCode::InvalidPrivateKey`]: the file stands for a
/// private key that cannot be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyFileError(String);

impl KeyFileError {
    /// The stable error code: [`ErrorCode::InvalidPrivateKey`].
    pub fn code(&self) -> ErrorCode {
        ErrorCode::InvalidPrivateKey
    }
}

fn err(msg: impl Into<String>) -> KeyFileError {
    KeyFileError(msg.into())
}

impl KeyFile {
    /// The body (what the PEM block carries), in version 1 for a local or
    /// remote key and version 2 for an agent's.
    ///
    /// Errors: a field the format cannot carry: an empty public key,
    /// envelope or name, a peer part holding a NUL byte, no peer or more
    /// than [`MAX_PEERS`] for a remote key, a field over 1 MiB.
    pub fn to_bytes(&self) -> Result<Vec<u8>, KeyFileError> {
        let mut out = MAGIC.to_vec();
        if matches!(self.location, KeyLocation::Pkcs11 { .. }) && !self.envelope.is_empty() {
            return Err(err("a token key's file carries no envelope"));
        }
        out.push(match self.location {
            KeyLocation::Pkcs11 { .. } => 3,
            KeyLocation::Agent { .. } => 2,
            _ => 1,
        });
        let mut field = |t: u8, value: &[u8]| -> Result<(), KeyFileError> {
            if value.is_empty() || value.len() > MAX_FIELD {
                return Err(err(format!("key file field {t} ({}) must hold 1 to {MAX_FIELD} bytes", tag_name(t))));
            }
            out.push(t);
            // MAX_FIELD fits in 4 bytes.
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value);
            Ok(())
        };
        match &self.location {
            KeyLocation::Local { store, machine_key } => {
                field(tag::MODE, &[mode::LOCAL])?;
                for (t, v) in [(tag::STORE, store), (tag::MACHINE_KEY, machine_key)] {
                    if let Some(v) = v {
                        field(t, text_bytes(t, v)?)?;
                    }
                }
            }
            KeyLocation::Remote { tls_cert, tls_key, tls_ca, peers } => {
                if peers.is_empty() || peers.len() > MAX_PEERS {
                    return Err(err(format!("a remote key file names 1 to {MAX_PEERS} key servers, not {}", peers.len())));
                }
                field(tag::MODE, &[mode::REMOTE])?;
                for (t, v) in [(tag::TLS_CERT, tls_cert), (tag::TLS_KEY, tls_key), (tag::TLS_CA, tls_ca)] {
                    field(t, text_bytes(t, v)?)?;
                }
                for p in peers {
                    let mut parts = vec![p.name.as_str(), p.addr.as_str(), p.attrs.as_str()];
                    parts.extend(p.server_name.as_deref());
                    if parts.iter().any(|s| s.is_empty() || s.contains('\0')) {
                        return Err(err(format!("key server {:?}: every part must be non-empty and free of NUL", p.name)));
                    }
                    field(tag::PEER, parts.join("\0").as_bytes())?;
                }
            }
            KeyLocation::Agent { socket } => {
                field(tag::MODE, &[mode::AGENT])?;
                field(tag::AGENT_SOCKET, text_bytes(tag::AGENT_SOCKET, socket)?)?;
            }
            KeyLocation::Pkcs11 { uri, agent } => {
                field(tag::MODE, &[mode::PKCS11])?;
                field(tag::PKCS11_URI, text_bytes(tag::PKCS11_URI, uri)?)?;
                if let Some(socket) = agent {
                    field(tag::AGENT_SOCKET, text_bytes(tag::AGENT_SOCKET, socket)?)?;
                }
            }
        }
        field(tag::PUBLIC_KEY, &self.public_key)?;
        if !matches!(self.location, KeyLocation::Pkcs11 { .. }) || !self.envelope.is_empty() {
            field(tag::ENVELOPE, &self.envelope)?;
        }
        Ok(out)
    }

    /// Reads a body of version 1 or 2.
    ///
    /// Errors, each naming the field at fault: not a key file (bad magic),
    /// another version, a damaged file (an unknown field tag where a field
    /// should start: bytes edited or a line lost), a field cut short, a
    /// repeated field, a field of another mode or a newer version, a
    /// malformed value (empty, not UTF-8, a NUL in a name, a peer not
    /// `name NUL host:port NUL attributes [NUL server name]`), too many
    /// peers, or a field missing (the mode, the public key, the envelope; a
    /// remote key's TLS files and peers; an agent key's socket).
    pub fn from_bytes(body: &[u8]) -> Result<KeyFile, KeyFileError> {
        let rest = body.strip_prefix(MAGIC).ok_or_else(|| err("not a keyfence key file body (bad magic)"))?;
        let (&version, mut rest) = rest.split_first().ok_or_else(|| err("not a keyfence key file body (bad magic)"))?;
        if !(1..=VERSION).contains(&version) {
            return Err(err(format!("key file version {version} is not supported (this keyfence reads versions 1 to {VERSION})")));
        }
        let mut f = Fields { version, ..Fields::default() };
        while !rest.is_empty() {
            let at = body.len() - rest.len();
            let t = rest[0];
            // A tag no version knows is a damaged file, not a field: what
            // follows is no length worth reporting.
            if tag_name(t) == "unknown" {
                return Err(err(format!(
                    "the key file is damaged: byte {at} should start a field but holds {t}, which is no field's tag (a line lost or edited?); write it again with `keyfence provider-key`"
                )));
            }
            if rest.len() < 5 {
                return Err(err(format!("key file truncated inside the header of field {t} ({})", tag_name(t))));
            }
            let n = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            rest = &rest[5..];
            if n > MAX_FIELD || n > rest.len() {
                return Err(err(format!(
                    "key file truncated or damaged: field {t} ({}) at byte {at} claims {n} bytes, {} remain",
                    tag_name(t),
                    rest.len()
                )));
            }
            let (value, after) = rest.split_at(n);
            rest = after;
            f.take(t, value)?;
        }
        f.finish()
    }
}

fn text_bytes(t: u8, v: &str) -> Result<&[u8], KeyFileError> {
    if v.contains('\0') {
        return Err(err(format!("key file field {t} ({}) holds a NUL character", tag_name(t))));
    }
    Ok(v.as_bytes())
}

/// The fields read so far, each at most once.
#[derive(Default)]
struct Fields {
    version: u8,
    mode: Option<u8>,
    agent_socket: Option<String>,
    pkcs11_uri: Option<String>,
    public_key: Option<Vec<u8>>,
    envelope: Option<Vec<u8>>,
    store: Option<String>,
    machine_key: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    tls_ca: Option<String>,
    peers: Vec<KeyFilePeer>,
}

fn malformed(t: u8) -> KeyFileError {
    err(format!("key file field {t} ({}) is malformed or repeated", tag_name(t)))
}

fn text(t: u8, v: &[u8]) -> Result<String, KeyFileError> {
    match std::str::from_utf8(v) {
        Ok(s) if !s.is_empty() && !s.contains('\0') => Ok(s.to_string()),
        _ => Err(malformed(t)),
    }
}

/// Sets a field read once; a second one is an error.
fn once<T>(slot: &mut Option<T>, t: u8, value: T) -> Result<(), KeyFileError> {
    if slot.is_some() {
        return Err(malformed(t));
    }
    *slot = Some(value);
    Ok(())
}

impl Fields {
    fn take(&mut self, t: u8, v: &[u8]) -> Result<(), KeyFileError> {
        match t {
            tag::MODE => match v {
                [m @ (mode::LOCAL | mode::REMOTE)] => once(&mut self.mode, t, *m),
                [m @ mode::AGENT] if self.version >= 2 => once(&mut self.mode, t, *m),
                [m @ mode::PKCS11] if self.version >= 3 => once(&mut self.mode, t, *m),
                _ => Err(malformed(t)),
            },
            tag::AGENT_SOCKET if self.version >= 2 => once(&mut self.agent_socket, t, text(t, v)?),
            tag::PKCS11_URI if self.version >= 3 => once(&mut self.pkcs11_uri, t, text(t, v)?),
            tag::PUBLIC_KEY | tag::ENVELOPE if v.is_empty() => Err(malformed(t)),
            tag::PUBLIC_KEY => once(&mut self.public_key, t, v.to_vec()),
            tag::ENVELOPE => once(&mut self.envelope, t, v.to_vec()),
            tag::STORE => once(&mut self.store, t, text(t, v)?),
            tag::MACHINE_KEY => once(&mut self.machine_key, t, text(t, v)?),
            tag::TLS_CERT => once(&mut self.tls_cert, t, text(t, v)?),
            tag::TLS_KEY => once(&mut self.tls_key, t, text(t, v)?),
            tag::TLS_CA => once(&mut self.tls_ca, t, text(t, v)?),
            tag::PEER => {
                if self.peers.len() == MAX_PEERS {
                    return Err(err(format!("key file names more than {MAX_PEERS} key servers")));
                }
                let s = std::str::from_utf8(v).map_err(|_| malformed(t))?;
                let parts: Vec<&str> = s.split('\0').collect();
                let (name, addr, attrs, server_name) = match parts[..] {
                    [n, a, at] => (n, a, at, None),
                    [n, a, at, sn] => (n, a, at, Some(sn).filter(|s| !s.is_empty())),
                    _ => return Err(malformed(t)),
                };
                if name.is_empty() || addr.is_empty() || attrs.is_empty() {
                    return Err(malformed(t));
                }
                self.peers.push(KeyFilePeer {
                    name: name.into(),
                    addr: addr.into(),
                    attrs: attrs.into(),
                    server_name: server_name.map(str::to_string),
                });
                Ok(())
            }
            _ => Err(err(format!("key file has unknown field {t}"))),
        }
    }

    fn finish(self) -> Result<KeyFile, KeyFileError> {
        let lacks = |what: &str| err(format!("key file lacks its {what}"));
        let mode = self.mode.ok_or_else(|| lacks("mode"))?;
        let public_key = self.public_key.ok_or_else(|| lacks("public key"))?;
        let remote_fields = self.tls_cert.is_some() || self.tls_key.is_some() || self.tls_ca.is_some() || !self.peers.is_empty();
        let local_fields = self.store.is_some() || self.machine_key.is_some();
        if mode == mode::PKCS11 {
            if remote_fields || local_fields || self.envelope.is_some() {
                return Err(err("key file of a token key names a store, a machine key, key servers, TLS files or an envelope"));
            }
            let uri = self.pkcs11_uri.ok_or_else(|| lacks("PKCS#11 URI"))?;
            return Ok(KeyFile { location: KeyLocation::Pkcs11 { uri, agent: self.agent_socket }, public_key, envelope: Vec::new() });
        }
        if self.pkcs11_uri.is_some() {
            return Err(err("key file of an envelope's key names a PKCS#11 URI"));
        }
        let envelope = self.envelope.ok_or_else(|| lacks("envelope"))?;
        if mode != mode::AGENT && self.agent_socket.is_some() {
            return Err(err("key file of a local or remote key names an agent socket"));
        }
        let location = if mode == mode::AGENT {
            if remote_fields || local_fields {
                return Err(err("key file of an agent's key names a store, a machine key, key servers or TLS files"));
            }
            KeyLocation::Agent { socket: self.agent_socket.ok_or_else(|| lacks("agent socket"))? }
        } else if mode == mode::LOCAL {
            if remote_fields {
                return Err(err("key file of a local key names key servers or TLS files"));
            }
            KeyLocation::Local { store: self.store, machine_key: self.machine_key }
        } else {
            if local_fields {
                return Err(err("key file of a remote key names a store or machine key"));
            }
            let (Some(tls_cert), Some(tls_key), Some(tls_ca)) = (self.tls_cert, self.tls_key, self.tls_ca) else {
                return Err(lacks("TLS files of a remote key"));
            };
            if self.peers.is_empty() {
                return Err(lacks("peers of a remote key"));
            }
            KeyLocation::Remote { tls_cert, tls_key, tls_ca, peers: self.peers }
        };
        Ok(KeyFile { location, public_key, envelope })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn remote() -> KeyFile {
        KeyFile {
            location: KeyLocation::Remote {
                tls_cert: "/etc/kf/client.crt".into(),
                tls_key: "/etc/kf/client.key".into(),
                tls_ca: "/etc/kf/ca.crt".into(),
                peers: vec![
                    KeyFilePeer { name: "ks1".into(), addr: "127.0.0.1:9000".into(), attrs: "role=ks".into(), server_name: None },
                    KeyFilePeer {
                        name: "ks2".into(),
                        addr: "[::1]:9001".into(),
                        attrs: "role=ks,region=EU".into(),
                        server_name: Some("ks.example".into()),
                    },
                ],
            },
            public_key: vec![0x30; 91],
            envelope: vec![7; 400],
        }
    }

    /// A body of raw fields, for files the writer would refuse to make.
    fn body(fields: &[(u8, &[u8])]) -> Vec<u8> {
        let mut out = b"KFKEY\x01".to_vec();
        for (t, v) in fields {
            out.push(*t);
            out.extend_from_slice(&(v.len() as u32).to_be_bytes());
            out.extend_from_slice(v);
        }
        out
    }

    fn refused(b: &[u8], needle: &str) {
        let e = KeyFile::from_bytes(b).expect_err(needle);
        assert!(e.to_string().contains(needle), "{e} lacks {needle:?}");
        assert_eq!(e.code(), ErrorCode::InvalidPrivateKey);
    }

    #[test]
    fn both_modes_round_trip() {
        let local = KeyFile {
            location: KeyLocation::Local { store: Some("etcd://127.0.0.1:2379/kf".into()), machine_key: Some("/m.key".into()) },
            public_key: vec![1; 44],
            envelope: vec![2; 300],
        };
        let agent = KeyFile {
            location: KeyLocation::Agent { socket: "/run/keyfence/agent.sock".into() },
            public_key: vec![1; 44],
            envelope: vec![2; 300],
        };
        let token = |agent: Option<&str>| KeyFile {
            location: KeyLocation::Pkcs11 { uri: "pkcs11:token=edge;object=tls".into(), agent: agent.map(Into::into) },
            public_key: vec![1; 44],
            envelope: Vec::new(),
        };
        // Local and remote keys stay in version 1, which older readers take.
        for (f, version) in [(local, 1), (remote(), 1), (agent, 2), (token(None), 3), (token(Some("/run/a.sock")), 3)] {
            let b = f.to_bytes().unwrap();
            assert_eq!(b[5], version, "{f:?}");
            assert_eq!(KeyFile::from_bytes(&b).unwrap(), f);
        }
    }

    #[test]
    fn every_malformed_body_is_refused_with_the_field_at_fault() {
        let good = remote().to_bytes().unwrap();
        refused(b"KFKE", "bad magic");
        refused(b"KFKEY", "bad magic");
        refused(b"PEM!!\x01", "bad magic");
        refused(b"KFKEY\x04", "version 4 is not supported");
        refused(b"KFKEY\x00", "version 0 is not supported");
        refused(&good[..good.len() - 20], "field 3 (envelope) at byte");
        refused(&good[..good.len() - 20], "claims 400 bytes, 380 remain");
        refused(&good[..9], "truncated inside the header of field 1 (mode)");
        let mut unknown = good.clone();
        unknown.extend_from_slice(&[99, 0, 0, 0, 1, 0]);
        refused(&unknown, &format!("damaged: byte {} should start a field but holds 99", good.len()));
        // Version 2's agent fields are no version 1 file's.
        refused(&body(&[(1, &[2]), (10, b"/s"), (2, b"k"), (3, b"e")]), "field 1 (mode)");
        refused(&body(&[(1, &[0]), (10, b"/s"), (2, b"k"), (3, b"e")]), "unknown field 10");
        let v2 = |fields: &[(u8, &[u8])]| {
            let mut b = body(fields);
            b[5] = 2;
            b
        };
        refused(&v2(&[(1, &[2]), (2, b"k"), (3, b"e")]), "lacks its agent socket");
        refused(&v2(&[(1, &[2]), (10, b"/s"), (4, b"/store"), (2, b"k"), (3, b"e")]), "agent's key names a store");
        refused(&v2(&[(1, &[0]), (10, b"/s"), (2, b"k"), (3, b"e")]), "local or remote key names an agent socket");
        refused(&v2(&[(1, &[2]), (10, b""), (2, b"k"), (3, b"e")]), "field 10 (agent socket)");
        // Version 3's token mode: its URI, no envelope, no older file's.
        let v3 = |fields: &[(u8, &[u8])]| {
            let mut b = body(fields);
            b[5] = 3;
            b
        };
        refused(&v2(&[(1, &[3]), (11, b"pkcs11:"), (2, b"k")]), "field 1 (mode)");
        refused(&v3(&[(1, &[3]), (2, b"k")]), "lacks its PKCS#11 URI");
        refused(&v3(&[(1, &[3]), (11, b"pkcs11:"), (2, b"k"), (3, b"e")]), "token key names");
        refused(&v3(&[(1, &[0]), (11, b"pkcs11:"), (2, b"k"), (3, b"e")]), "envelope's key names a PKCS#11 URI");
        refused(&body(&[(1, &[0]), (1, &[0]), (2, b"k"), (3, b"e")]), "field 1 (mode) is malformed or repeated");
        refused(&body(&[(1, &[2]), (2, b"k"), (3, b"e")]), "field 1 (mode)");
        refused(&body(&[(1, &[0]), (2, b""), (3, b"e")]), "field 2 (public key)");
        refused(&body(&[(1, &[0]), (4, b"a\0b"), (2, b"k"), (3, b"e")]), "field 4 (store)");
        refused(&body(&[(1, &[0]), (5, &[0xff, 0xfe]), (2, b"k"), (3, b"e")]), "field 5 (machine key)");
        refused(&body(&[(1, &[0]), (2, b"k")]), "lacks its envelope");
        refused(&body(&[(2, b"k"), (3, b"e")]), "lacks its mode");
        refused(&body(&[(1, &[0]), (3, b"e")]), "lacks its public key");
        refused(&body(&[(1, &[1]), (9, b"a\0b:1\0c=d"), (2, b"k"), (3, b"e")]), "lacks its TLS files");
        let tls: [(u8, &[u8]); 3] = [(6, b"c"), (7, b"k"), (8, b"a")];
        let mut f: Vec<(u8, &[u8])> = vec![(1, &[1]), (2, b"k"), (3, b"e")];
        f.extend(tls);
        refused(&body(&f), "lacks its peers");
        for bad_peer in [&b"a\0b:1"[..], b"\0b:1\0c=d", b"a\0b:1\0c=d\0s\0x", b"a\0\0c=d"] {
            let mut g = f.clone();
            g.push((9, bad_peer));
            refused(&body(&g), "field 9 (peer)");
        }
        let mut g = f.clone();
        g.push((4, b"/store"));
        g.push((9, b"a\0b:1\0c=d"));
        refused(&body(&g), "remote key names a store");
        refused(&body(&[(1, &[0]), (6, b"c"), (2, b"k"), (3, b"e")]), "local key names key servers or TLS files");
        let peer: &[u8] = b"a\0b:1\0c=d";
        let mut many = f.clone();
        many.extend(std::iter::repeat_n((9, peer), MAX_PEERS + 1));
        refused(&body(&many), "more than 16 key servers");
    }

    /// A PEM file with one base64 line deleted still decodes, into bytes
    /// shifted by 48: the reader says the file is damaged, never that
    /// some field 19 claims billions of bytes as if that were a field.
    /// (A loss inside one long field can leave a file that reads; the
    /// provider then finds its public key is not the key's.)
    #[test]
    fn a_file_with_a_line_lost_is_reported_damaged() {
        let good = remote().to_bytes().unwrap();
        let mut caught = 0;
        // 48 bytes are one 64-character base64 line.
        for line in 0..good.len() / 48 {
            let mut b = good[..line * 48].to_vec();
            b.extend_from_slice(&good[(line + 1) * 48..]);
            let Err(e) = KeyFile::from_bytes(&b) else { continue };
            let e = e.to_string();
            caught += 1;
            assert!(e.contains("damaged") || e.contains("malformed") || e.contains("lacks") || e.contains("bad magic"), "line {line}: {e}");
        }
        assert!(caught >= good.len() / 48 / 2, "{caught} of {} losses caught", good.len() / 48);
    }

    #[test]
    fn the_writer_refuses_what_the_reader_would() {
        let mut f = remote();
        if let KeyLocation::Remote { peers, .. } = &mut f.location {
            peers[0].attrs = "a\0b".into();
        }
        assert!(f.to_bytes().unwrap_err().to_string().contains("free of NUL"));
        let mut f = remote();
        if let KeyLocation::Remote { peers, .. } = &mut f.location {
            peers.clear();
        }
        assert!(f.to_bytes().is_err());
        let mut f = remote();
        f.envelope.clear();
        assert!(f.to_bytes().unwrap_err().to_string().contains("field 3 (envelope)"));
        let f =
            KeyFile { location: KeyLocation::Pkcs11 { uri: "pkcs11:token=t".into(), agent: None }, public_key: vec![1], envelope: vec![2] };
        assert!(f.to_bytes().unwrap_err().to_string().contains("carries no envelope"));
    }

    proptest! {
        /// Whatever the bytes, a typed error or a file that writes back to
        /// the same body: never a panic, never two readings of one body.
        #[test]
        fn any_body_is_read_or_refused(cut in 0usize..600, flip in any::<(usize, u8)>(), extra in proptest::collection::vec(any::<u8>(), 0..40)) {
            let mut b = remote().to_bytes().unwrap();
            b.truncate(cut.max(6).min(b.len()));
            let i = flip.0 % b.len();
            b[i] ^= flip.1;
            b.extend_from_slice(&extra);
            if let Ok(f) = KeyFile::from_bytes(&b) {
                prop_assert_eq!(KeyFile::from_bytes(&f.to_bytes().unwrap()).unwrap(), f);
            }
        }
    }
}
