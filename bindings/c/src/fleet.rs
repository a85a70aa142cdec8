//! The authority's inventory and `where` from C: which machines a policy
//! covers, by group, and the remote signing load it would draw, answered
//! as the JSON object `keyfence authority where --json` prints (one
//! definition of the answer for the command line and every binding).

use std::ffi::c_char;

use keyfence_core::wrap::{parse_inventory, CanonicalPolicy, Latencies, Traffic, WhereQuery};

use crate::bytes::{self, keyfence_bytes};
use crate::error::{keyfence_result, Error};
use crate::ffi;
use crate::policy;
use crate::wrap::keyfence_authority;

/// One group's traffic for `keyfence_authority_where`: handshakes per
/// second from `group`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct keyfence_group_rate {
    /// The group's value of the `by` label (NUL-terminated UTF-8).
    pub group: *const c_char,
    /// Handshakes per second, finite and at least 0.
    pub rps: f64,
}

/// One latency for `keyfence_authority_where`: from `from` to `to`, in
/// milliseconds (taken to hold both ways unless the other way is given).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct keyfence_group_latency {
    /// The group it is measured from (NUL-terminated UTF-8).
    pub from: *const c_char,
    /// The group it is measured to (NUL-terminated UTF-8).
    pub to: *const c_char,
    /// Milliseconds, finite and at least 0.
    pub ms: f64,
}

/// A NUL-terminated string, or `None` for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn optional<'a>(p: *const c_char, name: &str) -> Result<Option<&'a str>, Error> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, NUL-terminated by the caller's promise.
    unsafe { ffi::text(p, name) }.map(Some)
}

/// Answers where a key wrapped under `policy_text` can be used, into
/// `*json` (UTF-8, free it with `keyfence_bytes_free`): the live machines
/// of the authority's inventory that satisfy it (attributes evaluated,
/// nothing decrypted), grouped by the label `by` (NULL: totals only), and
/// with `traffic` (`traffic_count` groups; NULL with 0 for none) the load
/// each satisfying group would sign: every group that cannot open the key
/// sends its handshakes to the nearest that can, by `latency`
/// (`latency_count` entries), else to a group with its value of the label
/// `near`, else to the satisfying group that sorts first. A group
/// receiving more than `warn_ratio` times its own traffic is warned about
/// (0: the default, 4). `list_machines` adds the matching ids.
///
/// The object: `{"policy", "by", "total", "matching", "revoked",
/// "ungrouped", "remote_share", "groups": [{"value", "total", "matching",
/// "satisfies", "near", "own_rps", "received_rps", "senders", "sends_to",
/// "warning"}], "machines"}` (the rate fields with traffic only).
///
/// Errors: `KEYFENCE_POLICY_SYNTAX` (with the position),
/// `KEYFENCE_INVALID_ARGUMENT` for traffic, latencies or `near` without
/// `by`, a rate or latency that is not a finite number of at least 0, a
/// group given twice, a negative `warn_ratio`; `KEYFENCE_INCONSISTENT_STATE`
/// for an inventory that does not decode; `KEYFENCE_STORE_IO`.
///
/// # Safety
/// `authority` is a live handle; `policy_text` is a NUL-terminated
/// string; `by` and `near` are NULL or NUL-terminated strings; `traffic`
/// holds `traffic_count` readable entries and `latency` `latency_count`
/// (or NULL with a count of 0), each naming NUL-terminated strings;
/// `json` is writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn keyfence_authority_where(
    authority: *const keyfence_authority, policy_text: *const c_char, by: *const c_char, near: *const c_char,
    traffic: *const keyfence_group_rate, traffic_count: usize, latency: *const keyfence_group_latency, latency_count: usize,
    warn_ratio: f64, list_machines: bool, json: *mut keyfence_bytes,
) -> keyfence_result {
    // SAFETY: the caller's promises, passed on.
    unsafe {
        bytes::make(json, "json", || {
            let a = ffi::borrow(authority, "authority")?;
            let text = ffi::text(policy_text, "policy")?;
            // Parsed here first so that a syntax error carries its caret.
            policy::parse(text)?;
            let mut q = WhereQuery::new(CanonicalPolicy::parse(text).map_err(keyfence_core::abe::AbeError::from)?);
            q.by = optional(by, "by")?.map(str::to_owned);
            q.near = optional(near, "near")?.map(str::to_owned);
            if warn_ratio != 0.0 {
                q.warn_ratio = warn_ratio;
            }
            q.list_machines = list_machines;
            if !traffic.is_null() || traffic_count > 0 {
                let rows = ffi::array(traffic, traffic_count, "traffic")?;
                let pairs = rows.iter().map(|r| Ok((ffi::text(r.group, "traffic group")?, r.rps))).collect::<Result<Vec<_>, Error>>()?;
                q.traffic = Some(Traffic::from_pairs(pairs)?);
            }
            if !latency.is_null() || latency_count > 0 {
                let rows = ffi::array(latency, latency_count, "latency")?;
                let triples = rows
                    .iter()
                    .map(|r| Ok((ffi::text(r.from, "latency from")?, ffi::text(r.to, "latency to")?, r.ms)))
                    .collect::<Result<Vec<_>, Error>>()?;
                q.latency = Some(Latencies::from_triples(triples)?);
            }
            Ok(a.0.where_usable(&q)?.to_json().into_bytes())
        })
    }
}

/// Adds machines already issued to the authority's inventory (a store
/// made before it, a fleet issued elsewhere) from `text`: one a line, the
/// machine id, a tab, its attributes (`label=value,...`); blank and `#`
/// lines skipped. `file_name` (NULL: `inventory`) names the text in
/// errors. Writes how many machines were new to `*added` when it is not
/// NULL.
///
/// Errors: `KEYFENCE_INVALID_ARGUMENT` naming the file, line and field of
/// a line that does not read; `KEYFENCE_STORE_IO`, `KEYFENCE_STORE_CONFLICT`.
///
/// # Safety
/// `authority` is a live handle; `text` a NUL-terminated string;
/// `file_name` NULL or a NUL-terminated string; `added` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn keyfence_authority_import_inventory(
    authority: *const keyfence_authority, text: *const c_char, file_name: *const c_char, added: *mut usize,
) -> keyfence_result {
    ffi::boundary(|| {
        // SAFETY: the caller's promises, passed on.
        let (a, text, name) =
            unsafe { (ffi::borrow(authority, "authority")?, ffi::text(text, "text")?, optional(file_name, "file_name")?) };
        let machines = parse_inventory(name.unwrap_or("inventory"), text)?;
        let done = a.0.import_inventory(&machines)?;
        if !added.is_null() {
            // SAFETY: non-NULL, writable by the caller's promise.
            unsafe { added.write(done.added) };
        }
        Ok(())
    })
}
