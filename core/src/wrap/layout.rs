//! The names of the objects in the store, and the replicated generation
//! list: built and read here only (`docs/wrapping.md`, "Store layout").
//!
//! ```text
//! authority/state                           the authority's private state ("KFA2")
//! public/generations                        "{generation} {state}\n" per generation, oldest first
//! sealed/{policy id}/{version}/{generation} a sealed policy key ("KFP2")
//! envelopes/{secret id}                     an envelope ("KFE2")
//! ```
//!
//! Ids are lowercase hex, numbers decimal without leading zeros.

use super::generation::GenerationState;
use super::error::{malformed, Result};

/// The authority's private state.
pub(crate) const STATE: &str = "authority/state";
/// The replicated list of generations and their states, for machines.
pub(crate) const GENERATIONS: &str = "public/generations";
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

/// The envelope of secret `secret_id`.
pub(crate) fn envelope(secret_id: &[u8; 16]) -> String {
    format!("{ENVELOPES}{}", hex(secret_id))
}

/// The generation list: one line `"{generation} {state}\n"` per
/// generation, oldest first, the state as in the authority state (0
/// active, 1 decrypt-only, 2 retired).
pub(crate) fn encode_generations(generations: impl IntoIterator<Item = (u32, GenerationState)>) -> String {
    generations.into_iter().map(|(n, s)| format!("{n} {}\n", s.code())).collect()
}

/// Reads the generation list; an absent list is an empty one.
pub(crate) fn decode_generations(bytes: &[u8]) -> Result<Vec<(u32, GenerationState)>> {
    const O: &str = "generation list";
    let text = std::str::from_utf8(bytes).map_err(|_| malformed(O, "not UTF-8"))?;
    let mut out = Vec::new();
    for line in text.lines() {
        let bad = || malformed(O, format!("bad line {line:?}"));
        let (n, s) = line.split_once(' ').ok_or_else(bad)?;
        let n: u32 = n.parse().map_err(|_| bad())?;
        let s = s.parse::<u8>().ok().and_then(GenerationState::from_code).ok_or_else(bad)?;
        out.push((n, s));
    }
    Ok(out)
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

    #[test]
    fn the_generation_list_reads_back() {
        let gens = vec![(1, GenerationState::Retired), (2, GenerationState::DecryptOnly), (3, GenerationState::Active)];
        let text = encode_generations(gens.clone());
        assert_eq!(text, "1 2\n2 1\n3 0\n");
        assert_eq!(decode_generations(text.as_bytes()).unwrap(), gens);
        assert_eq!(decode_generations(b"").unwrap(), vec![]);
        for bad in [&b"1 7\n"[..], b"x 0\n", b"1\n", b"\xff"] {
            assert!(decode_generations(bad).is_err());
        }
    }
}
