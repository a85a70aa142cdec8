//! Policy-key wrapping from C: the authority and the machine side, on a
//! store named by one string (`keyfence::wrap::open_store`): a directory,
//! or `etcd://HOST:PORT[,HOST:PORT...]/PREFIX` for an etcd cluster.

use std::ffi::c_char;
use std::sync::{Arc, Mutex};

use keyfence_core::policy::Attributes;
use keyfence_core::wrap::{Authority, CacheConfig, Envelope, Follower, Machine, MachineKey, NewestLists, Store};

use crate::bytes::{self, keyfence_bytes};
use crate::error::{keyfence_result, Error};
use crate::ffi;
use crate::policy;

/// An authority opened on a store (a directory or `etcd://...`): issues machine keys, wraps
/// secrets, rotates. Not thread-safe: the functions that change it
/// (`_wrap`, `_rotate_master`) need the handle to themselves.
pub struct keyfence_authority(pub(crate) Authority);

/// A machine: its machine key and the store holding the replicated sealed
/// policy keys, with a cache of opened policy keys. Thread-safe: one
/// handle may open envelopes from many threads at once.
pub struct keyfence_machine(pub(crate) Arc<Machine>, Mutex<Option<Follower>>);

/// A machine's cache counters (`keyfence_machine_cache_stats`), with what
/// following the store (`keyfence_machine_follow`) has done.
#[repr(C)]
#[derive(Debug, Default)]
pub struct keyfence_cache_stats {
    /// Opens served from the cache.
    pub hits: u64,
    /// Opens (and openings ahead) that had to open the policy key.
    pub misses: u64,
    /// Keys dropped for capacity or age.
    pub evictions: u64,
    /// Keys held now.
    pub entries: u64,
    /// Store changes applied from the watch.
    pub watch_events: u64,
    /// Full resyncs (the cache cleared after the watch lost changes).
    pub resyncs: u64,
    /// Generation lists (rotations) received through the watch: how many
    /// propagation delays were measured.
    pub propagations: u64,
    /// The last propagation delay, authority commit to this cache, in
    /// microseconds.
    pub propagation_last_us: u64,
    /// The longest propagation delay, in microseconds.
    pub propagation_max_us: u64,
}

/// The existing store `name` names: opening never creates one
/// (`KEYFENCE_STORE_IO`, saying so, for a name that holds none).
pub(crate) fn store(name: &str) -> Result<Arc<dyn Store>, Error> {
    Ok(keyfence_core::wrap::open_store(name)?)
}

/// Creates an authority with its first master generation in the store
/// named `store_name` (a store name: a directory, or
/// `etcd://HOST:PORT[,HOST:PORT...]/PREFIX[?cacert=&cert=&key=]`) and
/// returns it in `*out` (free it with `keyfence_authority_free`).
///
/// Errors: `KEYFENCE_AUTHORITY_EXISTS` if the store already holds one,
/// `KEYFENCE_STORE_IO` if the store cannot be written,
/// `KEYFENCE_STORE_CONFLICT` if another authority was created at the same
/// time, `KEYFENCE_INVALID_ARGUMENT` for a name that names no store.
///
/// # Safety
/// `store_name` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_authority_init(store_name: *const c_char, out: *mut *mut keyfence_authority) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(out, "out")?;
        // SAFETY: the caller's promise.
        let a = Authority::init(keyfence_core::wrap::create_store(unsafe { ffi::text(store_name, "store_name")? })?)?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { ffi::give(out, keyfence_authority(a)) };
        Ok(())
    })
}

/// Opens the authority in the store named `store_name` (a directory or
/// `etcd://...`, as `keyfence_authority_init` takes) into `*out`.
///
/// Errors: `KEYFENCE_NO_AUTHORITY` if the store holds none,
/// `KEYFENCE_INVALID_ENVELOPE` / `KEYFENCE_INCONSISTENT_STATE` if its state
/// does not decode, `KEYFENCE_STORE_IO`, `KEYFENCE_INVALID_ARGUMENT` for a
/// name that names no store.
///
/// # Safety
/// `store_name` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_authority_open(store_name: *const c_char, out: *mut *mut keyfence_authority) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(out, "out")?;
        // SAFETY: the caller's promise.
        let a = Authority::open(store(unsafe { ffi::text(store_name, "store_name")? })?)?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { ffi::give(out, keyfence_authority(a)) };
        Ok(())
    })
}

/// Issues a machine key for `attrs` (`label=value,label=value`): one
/// attribute key per live master generation, encoded into `*machine_key`
/// (a secret: give it to the machine only, free it with
/// `keyfence_bytes_free`, which wipes it).
///
/// Errors: `KEYFENCE_INVALID_ATTRIBUTES`, `KEYFENCE_RESERVED_LABEL`,
/// `KEYFENCE_LIMIT_EXCEEDED`, `KEYFENCE_STORE_IO`.
///
/// # Safety
/// `authority` is a live handle; `attrs` a NUL-terminated string;
/// `machine_key` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_authority_issue(
    authority: *const keyfence_authority, attrs: *const c_char, machine_key: *mut keyfence_bytes,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { issue(authority, machine_key, || policy::attributes(ffi::text(attrs, "attrs")?)) }
}

/// Issues a machine key as `keyfence_authority_issue` does, for the
/// `count` pairs at `attrs` (no quoting: see `keyfence_attribute`).
///
/// Errors: those of `keyfence_authority_issue`, and a pair's NULL pointer,
/// bad UTF-8 or NUL byte is `KEYFENCE_INVALID_ARGUMENT`.
///
/// # Safety
/// `authority` is a live handle; `attrs` holds `count` readable pairs (or
/// is NULL with `count == 0`); `machine_key` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_authority_issue_pairs(
    authority: *const keyfence_authority, attrs: *const policy::keyfence_attribute, count: usize, machine_key: *mut keyfence_bytes,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe { issue(authority, machine_key, || policy::pairs(attrs, count)) }
}

/// The body of both issues.
///
/// # Safety
/// `authority` is a live handle; `machine_key` is writable.
unsafe fn issue(
    authority: *const keyfence_authority, machine_key: *mut keyfence_bytes, attrs: impl FnOnce() -> Result<Attributes, Error>,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = bytes::out(machine_key, "machine_key")?;
        // SAFETY: the caller's promise.
        let a = unsafe { ffi::borrow(authority, "authority")? };
        let key = a.0.issue(&attrs()?)?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { bytes::give(out, &key.to_bytes()) };
        Ok(())
    })
}

/// Wraps the secret `secret[0..len]` under `policy` into `*envelope`: the
/// secret sealed to the policy's key (created on first use and sealed
/// under CP-ABE), in keyfence's versioned envelope format.
///
/// Errors: `KEYFENCE_POLICY_SYNTAX` / `KEYFENCE_POLICY_TOO_LARGE` (with the
/// position), `KEYFENCE_LIMIT_EXCEEDED`, `KEYFENCE_STORE_IO`.
///
/// # Safety
/// `authority` is a live handle no other thread uses during the call;
/// `policy` a NUL-terminated string; `secret` points to `len` readable
/// bytes; `envelope` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_authority_wrap(
    authority: *mut keyfence_authority, policy: *const c_char, secret: *const u8, len: usize, envelope: *mut keyfence_bytes,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = bytes::out(envelope, "envelope")?;
        // SAFETY: the caller's promises, passed on.
        let (a, text, secret) =
            unsafe { (ffi::borrow_mut(authority, "authority")?, ffi::text(policy, "policy")?, ffi::slice(secret, len, "secret")?) };
        // Parsed here first so that a syntax error carries its caret.
        policy::parse(text)?;
        let env = a.0.wrap(text, secret)?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { bytes::give(out, env.to_bytes()) };
        Ok(())
    })
}

/// Rotates the master key: a new active generation, policy keys re-sealed
/// under it (envelopes are never touched). Writes the number of policy
/// keys re-sealed to `*resealed` when it is not NULL.
///
/// Errors: `KEYFENCE_STORE_IO`, `KEYFENCE_LIMIT_EXCEEDED` (65,535
/// generations).
///
/// # Safety
/// `authority` is a live handle no other thread uses during the call;
/// `resealed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_authority_rotate_master(authority: *mut keyfence_authority, resealed: *mut usize) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promise.
        let a = unsafe { ffi::borrow_mut(authority, "authority")? };
        let report = a.0.rotate_master()?;
        if !resealed.is_null() {
            // SAFETY: non-NULL, writable by the caller's promise.
            unsafe { resealed.write(report.resealed) };
        }
        Ok(())
    })
}

/// Revokes the machine `machine_id` (its id, as `keyfence_machine_id`
/// gives it): records it (signed, for machines), gives every policy a new
/// key sealed so that machine cannot open it, re-wraps the store's
/// envelopes to them and retires the old keys, so the policy keys it
/// cached open nothing the store serves. Writes the number of envelopes
/// re-wrapped to `*rewrapped` when it is not NULL. After an interruption,
/// calling it again finishes; for an id already revoked it does nothing
/// (0 re-wrapped). `keyfence_authority_issue` refuses the id afterwards
/// (`KEYFENCE_MACHINE_REVOKED`).
///
/// Errors: `KEYFENCE_INVALID_ATTRIBUTES` for an id a policy cannot name
/// (`[A-Za-z0-9_]`, at most 64 characters), `KEYFENCE_POLICY_TOO_LARGE`
/// when the negations no longer fit (rotate the master key twice),
/// `KEYFENCE_STORE_IO`, `KEYFENCE_STORE_CONFLICT`.
///
/// # Safety
/// `authority` is a live handle no other thread uses during the call;
/// `machine_id` is a NUL-terminated string; `rewrapped` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_authority_revoke(
    authority: *mut keyfence_authority, machine_id: *const c_char, rewrapped: *mut usize,
) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promises, passed on.
        let (a, id) = unsafe { (ffi::borrow_mut(authority, "authority")?, ffi::text(machine_id, "machine_id")?) };
        let report = a.0.revoke(id)?;
        if !rewrapped.is_null() {
            // SAFETY: non-NULL, writable by the caller's promise.
            unsafe { rewrapped.write(report.rewrapped) };
        }
        Ok(())
    })
}

/// Revokes the machine `machine_id` as `keyfence_authority_revoke` does,
/// and writes the whole report to `*json` as one JSON object (free it with
/// `keyfence_bytes_free`): `{"id", "already", "resumed", "rekeyed",
/// "rewrapped", "retired", "compacted", "rekeyed_after_ms", "skipped":
/// [{"name", "reason", "message"}]}`, as `keyfence authority revoke
/// --json` prints it. `skipped` names the store's envelopes it could not
/// re-wrap, which open nowhere now (`reason`: `malformed`, `not_signed`,
/// `retired_version`, `does_not_open`, `misnamed`).
///
/// Errors: as `keyfence_authority_revoke`.
///
/// # Safety
/// `authority` is a live handle no other thread uses during the call;
/// `machine_id` is a NUL-terminated string; `json` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_authority_revoke_report(
    authority: *mut keyfence_authority, machine_id: *const c_char, json: *mut keyfence_bytes,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        bytes::make(json, "json", || {
            let (a, id) = (ffi::borrow_mut(authority, "authority")?, ffi::text(machine_id, "machine_id")?);
            Ok(a.0.revoke(id)?.to_json())
        })
    }
}

/// Frees an authority (its master keys are wiped); NULL is a no-op.
///
/// # Safety
/// `authority` is NULL or a live handle, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_authority_free(authority: *mut keyfence_authority) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(authority) }
}

/// A machine holding the machine key `key[0..len]` (as issued by
/// `keyfence_authority_issue`) that reads sealed policy keys from the
/// store named `store_name` (a directory or `etcd://...`, as
/// `keyfence_authority_init` takes), into `*out`.
///
/// It keeps no floor across processes: after a restart it accepts a
/// generation list rolled back to one older than this process accepted.
/// A server that restarts should use `keyfence_machine_new_with_state`.
///
/// Errors: `KEYFENCE_INVALID_KEY` / `KEYFENCE_INVALID_ENVELOPE` if the
/// machine key does not decode, `KEYFENCE_STORE_IO`,
/// `KEYFENCE_INVALID_ARGUMENT` for a name that names no store.
///
/// # Safety
/// `key` points to `len` readable bytes; `store_name` is a NUL-terminated
/// string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_machine_new(
    key: *const u8, len: usize, store_name: *const c_char, out: *mut *mut keyfence_machine,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(out, "out")?;
        // SAFETY: the caller's promises, passed on.
        let (key, dir) = unsafe { (ffi::slice(key, len, "key")?, ffi::text(store_name, "store_name")?) };
        let m = Machine::new(MachineKey::from_bytes(key)?, store(dir)?, CacheConfig::default());
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { ffi::give(out, keyfence_machine(Arc::new(m), Mutex::new(None))) };
        Ok(())
    })
}

/// A machine as `keyfence_machine_new` makes it that keeps the newest
/// generation and revocation lists it accepts in the file `state_path`
/// (its floor), and starts from the lists that file holds: a store that
/// serves an older list, one from before a retirement or a revocation,
/// is refused (`KEYFENCE_REPLAYED_OBJECT`) by every process of this
/// machine that names the same file, not only by the one that saw the
/// newer list. The usual place is beside the machine key file,
/// `KEY.newest` (`machine.key` keeps `machine.key.newest`), where the
/// command line, `keyfence_key_from_envelope` and the key agent keep it:
/// processes of one machine share the file (updates are merged under an
/// advisory lock on `state_path` + `.lock`, mode 600, and written by
/// rename). The file holds only what the authority signed; it is not
/// secret. Into `*out` (free it with `keyfence_machine_free`).
///
/// A floor that cannot be kept is an error, never skipped: here when the
/// file's folder cannot take its lock file, and from
/// `keyfence_machine_open` (`KEYFENCE_STORE_IO`) when an update cannot be
/// written.
///
/// Errors: those of `keyfence_machine_new`; `KEYFENCE_STORE_IO` if the file
/// exists but cannot be read, or its folder cannot take the lock file;
/// `KEYFENCE_INVALID_ENVELOPE` if the file does not decode or a list in it
/// fails its authority's signature (the message names the file: delete
/// it to start again from the store); `KEYFENCE_INVALID_ARGUMENT` for a
/// NULL `state_path`.
///
/// # Safety
/// `key` points to `len` readable bytes; `store_name` and `state_path`
/// are NUL-terminated strings; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_machine_new_with_state(
    key: *const u8, len: usize, store_name: *const c_char, state_path: *const c_char, out: *mut *mut keyfence_machine,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(out, "out")?;
        // SAFETY: the caller's promises, passed on.
        let (key, dir, state) =
            unsafe { (ffi::slice(key, len, "key")?, ffi::text(store_name, "store_name")?, ffi::text(state_path, "state_path")?) };
        let m = Machine::new(MachineKey::from_bytes(key)?, store(dir)?, CacheConfig::default()).keep_newest_in(state)?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { ffi::give(out, keyfence_machine(Arc::new(m), Mutex::new(None))) };
        Ok(())
    })
}

/// Requires the newest lists `lists[0..len]` (as
/// `keyfence_machine_newest_lists` wrote them, in this process or another
/// of the same machine) as a floor: from now on this machine refuses a
/// generation list that goes back on them, or a revocation list that
/// lacks one of their ids (`KEYFENCE_REPLAYED_OBJECT` from
/// `keyfence_machine_open`). Lists older than those it already accepted
/// change nothing. A machine made with `keyfence_machine_new_with_state`
/// also writes a floor it was raised to into its file.
///
/// Errors: `KEYFENCE_INVALID_ENVELOPE` if the bytes do not decode or a
/// list's signature fails, `KEYFENCE_INCONSISTENT_STATE` for a list that
/// is malformed, `KEYFENCE_WRONG_AUTHORITY` for lists another authority
/// signed (nothing is required then), `KEYFENCE_STORE_IO` if the machine's
/// state file cannot be written.
///
/// # Safety
/// `machine` is a live handle; `lists` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn keyfence_machine_require(machine: *const keyfence_machine, lists: *const u8, len: usize) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promises, passed on.
        let (m, lists) = unsafe { (ffi::borrow(machine, "machine")?, ffi::slice(lists, len, "lists")?) };
        m.0.require(&NewestLists::from_bytes(lists)?)?;
        Ok(())
    })
}

/// The newest generation and revocation lists this machine has accepted
/// (or was required to), as the authority signed them, encoded (`KFN2`)
/// into `*lists` (free it with `keyfence_bytes_free`; not secret): what to
/// hand to another machine of the same authority with
/// `keyfence_machine_require`. Empty lists (a machine that has read
/// none) encode too.
///
/// # Safety
/// `machine` is a live handle; `lists` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_machine_newest_lists(machine: *const keyfence_machine, lists: *mut keyfence_bytes) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        bytes::make(lists, "lists", || {
            let m = ffi::borrow(machine, "machine")?;
            Ok(m.0.newest_lists().to_bytes())
        })
    }
}

/// The machine's id (the `machine` attribute the authority set when it
/// issued the key; what `keyfence_authority_revoke` takes), as text
/// without a NUL into `*id` (free it with `keyfence_bytes_free`); empty
/// for a key issued before keyfence had machine ids.
///
/// # Safety
/// `machine` is a live handle; `id` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_machine_id(machine: *const keyfence_machine, id: *mut keyfence_bytes) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        bytes::make(id, "id", || {
            let m = ffi::borrow(machine, "machine")?;
            Ok(m.0.id().unwrap_or_default().as_bytes().to_vec())
        })
    }
}

/// Whether this machine could open the envelope `env[0..len]`, answered
/// from its policy and the machine's attributes without cryptography, so
/// a server can forward the request to a machine that can. `*could` is set
/// on success.
///
/// Errors: `KEYFENCE_INVALID_ENVELOPE` if the bytes are not an envelope.
///
/// # Safety
/// `machine` is a live handle; `env` points to `len` readable bytes;
/// `could` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_machine_could_open(
    machine: *const keyfence_machine, env: *const u8, len: usize, could: *mut bool,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(could, "could")?;
        // SAFETY: the caller's promises, passed on.
        let (m, env) = unsafe { (ffi::borrow(machine, "machine")?, ffi::slice(env, len, "env")?) };
        let yes = m.0.could_open(&Envelope::parse(env)?);
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { out.write(yes) };
        Ok(())
    })
}

/// Opens the envelope `env[0..len]` into `*secret` (wiped when freed with
/// `keyfence_bytes_free`). The first open under a policy decrypts its
/// policy key with CP-ABE (milliseconds); later ones hit the cache.
///
/// Errors: `KEYFENCE_POLICY_NOT_SATISFIED` if the machine's attributes do
/// not satisfy the envelope's policy, `KEYFENCE_RETIRED_GENERATION`,
/// `KEYFENCE_UNKNOWN_POLICY_KEY`, `KEYFENCE_WRONG_AUTHORITY` (the envelope
/// or its sealed policy key was signed by another authority than the one
/// the machine key trusts), `KEYFENCE_INVALID_ENVELOPE` (malformed, or its
/// signature fails), `KEYFENCE_REPLAYED_OBJECT` (the store put back a
/// generation list older than one this machine has seen),
/// `KEYFENCE_STORE_IO`.
///
/// # Safety
/// `machine` is a live handle; `env` points to `len` readable bytes;
/// `secret` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_machine_open(
    machine: *const keyfence_machine, env: *const u8, len: usize, secret: *mut keyfence_bytes,
) -> keyfence_result {
    ffi::boundary(|| {
        let out = bytes::out(secret, "secret")?;
        // SAFETY: the caller's promises, passed on.
        let (m, env) = unsafe { (ffi::borrow(machine, "machine")?, ffi::slice(env, len, "env")?) };
        let pt = m.0.open(env)?;
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { bytes::give(out, &pt) };
        Ok(())
    })
}

/// Makes the machine follow its store: a watch (etcd's stream, or a poll
/// of a directory every 100 ms) brings each change to the cache as it is
/// committed: a retired policy key is forgotten at once, a rotated one
/// opened ahead, a new generation list verified (and a replayed one
/// refused). Counted in `keyfence_machine_cache_stats`. Until the machine
/// is freed; calling it again changes nothing.
///
/// Errors: `KEYFENCE_STORE_IO` if the watch cannot start,
/// `KEYFENCE_INVALID_ARGUMENT` for a NULL handle.
///
/// # Safety
/// `machine` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn keyfence_machine_follow(machine: *const keyfence_machine) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promise.
        let m = unsafe { ffi::borrow(machine, "machine")? };
        let mut follower = m.1.lock().unwrap_or_else(|e| e.into_inner());
        if follower.is_none() {
            *follower = Some(m.0.follow()?);
        }
        Ok(())
    })
}

/// Writes the machine's cache counters, and what following its store has
/// done, to `*out`.
///
/// Errors: `KEYFENCE_INVALID_ARGUMENT` for a NULL pointer.
///
/// # Safety
/// `machine` is a live handle; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_machine_cache_stats(machine: *const keyfence_machine, out: *mut keyfence_cache_stats) -> keyfence_result {
    ffi::boundary(|| {
        let out = ffi::out(out, "out")?;
        // SAFETY: the caller's promise.
        let s = unsafe { ffi::borrow(machine, "machine")? }.0.cache_stats();
        let us = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let stats = keyfence_cache_stats {
            hits: s.hits,
            misses: s.misses,
            evictions: s.evictions,
            entries: s.entries as u64,
            watch_events: s.watch_events,
            resyncs: s.resyncs,
            propagations: s.propagations,
            propagation_last_us: us(s.propagation_last),
            propagation_max_us: us(s.propagation_max),
        };
        // SAFETY: checked non-NULL; writable by the caller's promise.
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Frees a machine (its keys and cached policy keys are wiped, and it stops
/// following its store); NULL is a no-op.
///
/// # Safety
/// `machine` is NULL or a live handle no other thread uses, not used
/// afterwards.
#[no_mangle]
pub unsafe extern "C" fn keyfence_machine_free(machine: *mut keyfence_machine) {
    // SAFETY: the caller's promise.
    unsafe { ffi::free(machine) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store argument is a store name: an `etcd://` name goes to the
    /// etcd store (here refused for its missing port before any request),
    /// never to a directory called `etcd:`.
    #[test]
    fn an_etcd_store_name_is_not_a_directory() {
        let mut out = std::ptr::null_mut();
        // SAFETY: a NUL-terminated literal and a writable pointer.
        let r = unsafe { keyfence_authority_open(c"etcd://no-port/kf".as_ptr(), &mut out) };
        assert_eq!(r, keyfence_core::ErrorCode::InvalidArgument);
        assert!(out.is_null());
        assert!(!std::path::Path::new("etcd:").exists());
    }
}
