//! The names of the objects in the store: built and read here only
//! (`docs/wrapping.md`, "Store layout").
//!
//! ```text
//! authority/state                           the authority's private state ("KFA2")
//! authority/fence                           held by a long operation on etcd (fence.rs)
//! authority/inventory/{shard}               the machines issued, 256 shards by id ("KFI1", authority/inventory.rs)
//! public/generations                        the signed generation list ("KFG2", generation_list.rs)
//! public/revoked                            the signed list of revoked machine ids ("KFR2", revocation.rs)
//! sealed/{policy id}/{version}/{generation} a sealed policy key ("KFP2")
//! envelopes/{secret id}                     an envelope ("KFE2")
//! ```
//!
//! Ids are lowercase hex, numbers decimal without leading zeros.

/// The authority's private state.
pub(crate) const STATE: &str = "authority/state";
/// The fence a long operation holds on a store without a writer lock.
pub(crate) const FENCE: &str = "authority/fence";
/// Prefix of the inventory's shards: the machines the authority issued
/// keys to. Under `authority/`, so no servers' copy holds it.
pub(crate) const INVENTORY: &str = "authority/inventory/";
/// The replicated list of generations and their states, for machines.
pub(crate) const GENERATIONS: &str = "public/generations";
/// The signed list of revoked machine ids.
pub(crate) const REVOKED: &str = "public/revoked";
/// Prefix of the objects every machine reads besides the sealed keys.
pub(crate) const PUBLIC: &str = "public/";
/// Prefix of every sealed policy key.
pub(crate) const SEALED: &str = "sealed/";
/// Prefix of every envelope.
pub(crate) const ENVELOPES: &str = "envelopes/";

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The sealed copy of policy key `version` of `policy_id` under master
/// generation `generation`.
pub(crate) fn sealed(policy_id: &[u8; 32], version: u32, generation: u32) -> String {
    format!("{SEALED}{}/{version}/{generation}", hex(policy_id))
}

/// The parts of a sealed-key name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SealedName {
    pub(crate) policy_id: [u8; 32],
    pub(crate) version: u32,
    pub(crate) generation: u32,
}

/// Reads a name [`sealed`] built; `None` for any other name, including
/// ones that differ only in spelling (uppercase hex, leading zeros).
pub(crate) fn parse_sealed(name: &str) -> Option<SealedName> {
    let mut parts = name.strip_prefix(SEALED)?.split('/');
    let (pid, version, generation) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || pid.len() != 64 {
        return None;
    }
    let mut policy_id = [0u8; 32];
    for (i, b) in policy_id.iter_mut().enumerate() {
        *b = u8::from_str_radix(pid.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    let parsed = SealedName { policy_id, version: version.parse().ok()?, generation: generation.parse().ok()? };
    (sealed(&parsed.policy_id, parsed.version, parsed.generation) == name).then_some(parsed)
}

/// The inventory shard that holds machine `id`: the first byte of a
/// digest of the id, so that a fleet spreads evenly over 256 objects
/// whatever its ids look like, and issuing one machine rewrites one
/// small object.
pub(crate) fn inventory_shard(id: &str) -> String {
    let h = blake2b_simd::Params::new().hash_length(32).personal(b"keyfence-invent").hash(id.as_bytes());
    format!("{INVENTORY}{:02x}", h.as_bytes()[0])
}

/// The envelope of secret `secret_id`.
pub(crate) fn envelope(secret_id: &[u8; 16]) -> String {
    format!("{ENVELOPES}{}", hex(secret_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_and_only_canonical_ones_do() {
        let pid = [0xab; 32];
        let name = sealed(&pid, 3, 12);
        assert_eq!(name, format!("sealed/{}/3/12", "ab".repeat(32)));
        assert_eq!(parse_sealed(&name), Some(SealedName { policy_id: pid, version: 3, generation: 12 }));
        for bad in [
            format!("sealed/{}/3/12", "AB".repeat(32)),
            format!("sealed/{}/03/12", "ab".repeat(32)),
            format!("sealed/{}/3", "ab".repeat(32)),
            format!("sealed/{}/3/12/1", "ab".repeat(32)),
            format!("sealed/{}/3/12", "ab".repeat(31)),
            format!("sealed/{}é/3/12", "ab".repeat(31)),
            "envelopes/00".to_owned(),
        ] {
            assert_eq!(parse_sealed(&bad), None, "{bad}");
        }
        assert_eq!(envelope(&[1; 16]), format!("envelopes/{}", "01".repeat(16)));
    }
}
