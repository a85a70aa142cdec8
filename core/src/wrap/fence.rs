//! The fence a long operation holds on a store without a writer lock
//! (etcd): `authority/fence`, written by a master rotation, a policy-key
//! rotation or retirement, or a revocation before it reads the state, and
//! compared by every commit it makes, so that two long operations never
//! interleave their chunks. Short writers (a wrap) do not wait for a
//! shared fence: the long operation re-bases over what they commit. When
//! they commit faster than it can re-base, it makes the fence exclusive,
//! and a wrap that would add a policy key waits until it is let go
//! (`docs/wrapping.md`, "Writers at once").
//!
//! The record is plain text, for an operator reading it with `etcdctl`:
//!
//! ```text
//! keyfence fence 1
//! holder 5f0c…(32 hex digits)
//! operation rotate master
//! until 1795833600000
//! process 4242@host-a
//! mode shared
//! ```
//!
//! `until` (Unix milliseconds) bounds how long a holder that died keeps
//! others out; a live holder moves it forward as it works. A record that
//! does not parse holds nothing: a store writer could block long
//! operations with it forever otherwise.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand_core::{OsRng, RngCore};

/// How long a fence holds without being renewed: the longest a holder that
/// died keeps other long operations waiting.
pub(crate) const TTL: Duration = Duration::from_secs(30);

/// Longest record read: anything larger is not one of ours.
const MAX_RECORD: usize = 512;

const MAGIC: &str = "keyfence fence 1";

/// A fence record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fence {
    /// Random, per acquisition: tells the holder's own record from another's.
    pub(crate) holder: [u8; 16],
    /// What holds it, for the message of whoever waits.
    pub(crate) operation: String,
    /// Unix milliseconds after which the fence holds nothing.
    pub(crate) until_ms: u64,
    /// `pid@host` of the holder, for the operator.
    pub(crate) process: String,
    /// Whether wraps that add a policy key wait for it too.
    pub(crate) exclusive: bool,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Fence {
    /// A new record for `operation` by this process, valid for [`TTL`].
    pub(crate) fn new(operation: &str) -> Self {
        let mut holder = [0u8; 16];
        OsRng.fill_bytes(&mut holder);
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let host: String = host.trim().chars().filter(|c| c.is_ascii_graphic()).take(64).collect();
        Self {
            holder,
            operation: operation.to_owned(),
            until_ms: now_ms() + TTL.as_millis() as u64,
            process: format!("{}@{host}", std::process::id()),
            exclusive: false,
        }
    }

    /// The same holder's record, valid for another [`TTL`] from now.
    pub(crate) fn renewed(&self) -> Self {
        Self { until_ms: now_ms() + TTL.as_millis() as u64, ..self.clone() }
    }

    /// The same holder's record, renewed, that wraps adding a policy key
    /// wait for.
    pub(crate) fn exclusive(&self) -> Self {
        Self { exclusive: true, ..self.renewed() }
    }

    /// Whether it still holds.
    pub(crate) fn is_live(&self) -> bool {
        now_ms() < self.until_ms
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let holder: String = self.holder.iter().map(|b| format!("{b:02x}")).collect();
        let mode = if self.exclusive { "exclusive" } else { "shared" };
        format!("{MAGIC}\nholder {holder}\noperation {}\nuntil {}\nprocess {}\nmode {mode}\n", self.operation, self.until_ms, self.process)
            .into_bytes()
    }

    /// The record in `bytes`, or `None` for anything else.
    pub(crate) fn parse(bytes: &[u8]) -> Option<Self> {
        if bytes.len() > MAX_RECORD {
            return None;
        }
        let text = std::str::from_utf8(bytes).ok()?;
        let mut lines = text.lines();
        if lines.next()? != MAGIC {
            return None;
        }
        let mut field = |name: &str| lines.next()?.strip_prefix(name)?.strip_prefix(' ').map(str::to_owned);
        let holder_hex = field("holder")?;
        let operation = field("operation")?;
        let until_ms = field("until")?.parse().ok()?;
        let process = field("process")?;
        let exclusive = match field("mode")?.as_str() {
            "shared" => false,
            "exclusive" => true,
            _ => return None,
        };
        if holder_hex.len() != 32 {
            return None;
        }
        let mut holder = [0u8; 16];
        for (i, b) in holder.iter_mut().enumerate() {
            *b = u8::from_str_radix(holder_hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self { holder, operation, until_ms, process, exclusive })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_anything_else_holds_nothing() {
        let f = Fence::new("rotate master");
        assert!(f.is_live());
        assert_eq!(Fence::parse(&f.encode()), Some(f.clone()));
        let r = f.renewed();
        assert_eq!((r.holder, r.until_ms >= f.until_ms), (f.holder, true));
        let x = f.exclusive();
        assert!(x.exclusive && !f.exclusive);
        assert_eq!(Fence::parse(&x.encode()), Some(x));
        for bad in [&b""[..], b"keyfence fence 2\n", &[b'x'; 600], b"keyfence fence 1\nholder zz\n"] {
            assert_eq!(Fence::parse(bad), None);
        }
        let old = Fence { until_ms: 1, ..f };
        assert!(!old.is_live());
    }
}
