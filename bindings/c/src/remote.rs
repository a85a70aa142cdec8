//! Remote signing from C: a client of key servers (`keyfence serve`) whose
//! keys are ordinary `keyfence_private_key` handles. An engine routes an
//! operation on such a key to its slow executor, which forwards it to the
//! nearest peer whose attributes may hold the key (docs/remote.md).

use std::ffi::c_char;
use std::sync::Arc;

use keyfence_core::sign::managed::set_remote_limits;
use keyfence_core::sign::remote::{PeerConfig, RemoteConfig, RemoteSigner, TlsFiles};
use keyfence_core::wrap::Envelope;

use crate::bytes::{self, keyfence_bytes};
use crate::error::keyfence_result;
use crate::ffi;
use crate::policy::attributes;
use crate::sign::{key_out, keyfence_engine, keyfence_private_key};
use crate::wrap::keyfence_machine;

/// A remote signer's settings, built before `keyfence_remote_new`: the
/// TLS files, the peers, and optional limits. Not thread-safe; free it
/// with `keyfence_remote_config_free` (the signer does not keep it).
pub struct keyfence_remote_config(RemoteConfig);

/// A client of remote key servers: a bounded pool of multiplexed mutual-TLS
/// connections per peer, routing to the nearest capable peer with
/// failover, circuit breakers and a retry budget. Thread-safe. The keys it
/// made hold their own reference to it, so it may be freed before them.
pub struct keyfence_remote(RemoteSigner);

/// Starts settings for a remote signer with this side's TLS certificate
/// chain `cert_file`, its private key `key_file` (PEM, owner-readable
/// only), and `ca_file`, the CA certificates the servers' certificates
/// must chain to (nothing else is trusted). The files are read by
/// `keyfence_remote_new`. Defaults: tenant 0, 2 connections per peer, 1 s
/// connect and request timeouts, 3 attempts.
///
/// Errors: `KEYFENCE_INVALID_ARGUMENT` for NULL or non-UTF-8 arguments.
///
/// # Safety
/// The three paths are NUL-terminated strings; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_remote_config_new(
    cert_file: *const c_char, key_file: *const c_char, ca_file: *const c_char, out: *mut *mut keyfence_remote_config,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        ffi::make(out, "out", || {
            let tls = TlsFiles {
                cert: ffi::text(cert_file, "cert_file")?.into(),
                key: ffi::text(key_file, "key_file")?.into(),
                ca: ffi::text(ca_file, "ca_file")?.into(),
            };
            Ok(keyfence_remote_config(RemoteConfig::new(Vec::new(), tls)))
        })
    }
}

/// Adds a key server: `name` (its name in metrics and errors, and the DNS
/// name its certificate must carry unless `server_name` is given), `addr`
/// (`host:port`), and `attrs`, its machine's attributes
/// (`label=value,...`): what it may open, so which keys it is asked for.
///
/// Errors: `KEYFENCE_INVALID_ATTRIBUTES`, `KEYFENCE_INVALID_CONFIG` for an
/// address that is not `host:port` (or does not resolve) or an empty name,
/// `KEYFENCE_INVALID_ARGUMENT` for NULL arguments.
///
/// # Safety
/// `config` is a live handle no other thread uses; `name`, `addr` and
/// `attrs` are NUL-terminated strings; `server_name` is NULL or one.
#[no_mangle]
pub unsafe extern "C" fn keyfence_remote_config_add_peer(
    config: *mut keyfence_remote_config, name: *const c_char, addr: *const c_char, attrs: *const c_char, server_name: *const c_char,
) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promises, passed on.
        let (c, name, addr, attrs) =
            unsafe { (ffi::borrow_mut(config, "config")?, ffi::text(name, "name")?, ffi::text(addr, "addr")?, ffi::text(attrs, "attrs")?) };
        let mut peer = PeerConfig::resolve(name, addr, attributes(attrs)?)?;
        if !server_name.is_null() {
            // SAFETY: non-NULL; a NUL-terminated string by the caller's promise.
            peer.server_name = unsafe { ffi::text(server_name, "server_name")? }.to_owned();
        }
        c.0.peers.push(peer);
        Ok(())
    })
}

/// Sets an id sent with each request for older servers; servers of this
/// version ignore it and take the tenant from the client certificate
/// (docs/remote.md, "Tenants").
///
/// # Safety
/// `config` is a live handle no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn keyfence_remote_config_set_tenant(config: *mut keyfence_remote_config, tenant: u64) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promise.
        unsafe { ffi::borrow_mut(config, "config")? }.0.tenant = tenant;
        Ok(())
    })
}

/// Sets the time allowed for a TCP connect plus TLS handshake
/// (`connect_ms`), the time one attempt waits for its reply before the
/// next peer is tried (`request_ms`, never past the operation's deadline),
/// and the attempts per operation, the first included (`max_attempts`).
///
/// Errors: `KEYFENCE_INVALID_ARGUMENT` for a zero.
///
/// # Safety
/// `config` is a live handle no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn keyfence_remote_config_set_limits(
    config: *mut keyfence_remote_config, connect_ms: u32, request_ms: u32, max_attempts: u32,
) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promise.
        let c = unsafe { ffi::borrow_mut(config, "config")? };
        let (connect, request) = (f64::from(connect_ms), f64::from(request_ms));
        Ok(set_remote_limits(&mut c.0, Some(connect), Some(request), Some(max_attempts))?)
    })
}

/// Frees settings; NULL is a no-op.
///
/// # Safety
/// `config` is NULL or a live handle no other thread uses, not used
/// afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_remote_config_free(config: *mut keyfence_remote_config) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(config) }
}

/// Starts a remote signer from `config` into `*out` (free it with
/// `keyfence_remote_free`): reads the TLS files and starts measuring each
/// peer's round-trip time in the background. Connections are made when
/// first needed.
///
/// Errors: `KEYFENCE_INVALID_CONFIG` for no peers or TLS files that cannot
/// be used (the message names the file), `KEYFENCE_IO` if a thread cannot
/// start.
///
/// # Safety
/// `config` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_remote_new(config: *const keyfence_remote_config, out: *mut *mut keyfence_remote) -> keyfence_result {
    // SAFETY: the caller's promises.
    unsafe { ffi::make(out, "out", || Ok(keyfence_remote(RemoteSigner::start(ffi::borrow(config, "config")?.0.clone())?))) }
}

/// A handle in `*out` on the key in the wrapped-key envelope `env`, held by
/// the peers whose attributes satisfy its policy (the secret never comes
/// here). Asks the nearest of them for the key's public half, with the
/// same failover as an operation. Sign with it through any engine.
///
/// Errors: `KEYFENCE_INVALID_ENVELOPE` for bytes that are not an envelope,
/// `KEYFENCE_BACKEND_FAILED` when no configured peer may hold the key or
/// none answered (the message says which), `KEYFENCE_OVERLOADED` when
/// every capable peer refused for want of room.
///
/// # Safety
/// `remote` is a live handle; `env` points to `len` readable bytes; `out`
/// is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_remote_key(
    remote: *const keyfence_remote, env: *const u8, len: usize, out: *mut *mut keyfence_private_key,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    let (r, env) = unsafe { (ffi::borrow(remote, "remote"), ffi::slice(env, len, "env")) };
    // SAFETY: `out` is NULL or writable, by the caller's promise.
    unsafe { key_out(out, || Ok(r?.0.key(&Envelope::parse(env?)?)?)) }
}

/// The key in the envelope `env` as `machine` may have it: opened here
/// when the machine's attributes satisfy its policy (signed in this
/// process), otherwise a handle on the peers that may hold it, as
/// `keyfence_remote_key` gives. The decision Geo Key Manager makes for
/// every handshake.
///
/// Errors: those of `keyfence_machine_open` for an envelope the machine
/// may open, `KEYFENCE_INVALID_PRIVATE_KEY` if it holds no usable key,
/// and those of `keyfence_remote_key`.
///
/// # Safety
/// `remote` and `machine` are live handles; `env` points to `len` readable
/// bytes; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_remote_open_or_forward(
    remote: *const keyfence_remote, machine: *const keyfence_machine, env: *const u8, len: usize, out: *mut *mut keyfence_private_key,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    let (r, m, env) = unsafe { (ffi::borrow(remote, "remote"), ffi::borrow(machine, "machine"), ffi::slice(env, len, "env")) };
    // SAFETY: `out` is NULL or writable, by the caller's promise.
    unsafe { key_out(out, || Ok(r?.0.open_or_forward(&m?.0, env?)?)) }
}

/// Reports the signer's per-peer figures (round-trip time, breaker,
/// connections, failovers, requests and their latency) with `engine`'s
/// metrics from now on, so one `keyfence_engine_metrics_prometheus`
/// scrape shows the queues and the hop behind them.
///
/// Errors: `KEYFENCE_INVALID_ARGUMENT` for NULL handles.
///
/// # Safety
/// `engine` and `remote` are live handles.
#[no_mangle]
pub unsafe extern "C" fn keyfence_engine_attach_remote(engine: *const keyfence_engine, remote: *const keyfence_remote) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promises.
        let (e, r) = unsafe { (ffi::borrow(engine, "engine")?, ffi::borrow(remote, "remote")?) };
        Ok(e.0.attach_metrics(Arc::new(r.0.clone()))?)
    })
}

/// The signer's figures in Prometheus text format into `*out` (free it
/// with `keyfence_bytes_free`; NUL-terminated, the NUL not counted).
///
/// # Safety
/// `remote` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_remote_metrics_prometheus(remote: *const keyfence_remote, out: *mut keyfence_bytes) -> keyfence_result {
    // SAFETY: the caller's promises.
    unsafe { bytes::make(out, "out", || Ok(ffi::borrow(remote, "remote")?.0.metrics().prometheus())) }
}

/// Frees a remote signer, closing its connections; NULL is a no-op. It
/// returns once the signer's threads have ended (at most 5 s in all), as
/// `keyfence_engine_free` does.
///
/// # Safety
/// `remote` is NULL or a live handle no other thread uses, not used
/// afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_remote_free(remote: *mut keyfence_remote) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(remote) }
}
