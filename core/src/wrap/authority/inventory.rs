//! The inventory: the machines the authority issued keys to, with their
//! attributes, so that it can say before a key is wrapped where the key
//! can be used (`where`), and refuse a master rotation that would strand
//! them. Kept in the authority's part of the store
//! (`authority/inventory/{shard}`), which no servers' copy holds: a
//! server needs no list of the fleet, and the list says where every
//! data center is.
//!
//! 256 shards by a digest of the id, each one object ("KFI1"): issuing a
//! machine rewrites one small object (its commit expecting the shard and
//! the authority's state as read), and `where` over a fleet of 25,000
//! machines reads 256 objects, not 25,000.
//!
//! ```text
//! shard   = "KFI1" | u32 n | n x machine
//! machine = id (u16-prefixed) | issued u64 (Unix seconds) | flags u8 (1: imported, 2: revoked)
//!           | revoked at u64 (Unix seconds, 0: unknown or not revoked)
//!           | u16 g | g x generation u32 | u16 a | a x (label, value: u16-prefixed)
//! ```

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use keyfence_policy::Attributes;

use super::txn::LOCK_WAIT;
use super::Authority;
use crate::backoff::{Backoff, Jitter};
use crate::wrap::error::{codec, malformed, Result, WrapError};
use crate::wrap::format::{reader, writer};
use crate::wrap::layout;
use crate::wrap::machine::MachineKey;
use crate::wrap::revocation::{self, MACHINE_LABEL};
use crate::wrap::store::{Batch, Op, Stamp, Store, StoreError};

const MAGIC: &[u8; 4] = b"KFI1";
const O: &str = "inventory";
const IMPORTED: u8 = 1;
const REVOKED: u8 = 2;

/// Shards one commit of an import writes, and the bytes it may carry:
/// under etcd's 128 operations and 1.5 MiB per transaction.
const CHUNK_SHARDS: usize = 64;
const CHUNK_BYTES: usize = 1024 * 1024;

/// Times a write to the inventory is tried again after another writer
/// changed what it read, before it gives up with [`StoreError::Conflict`]:
/// an `issue` among busy writers (six processes wrapping, rotating and
/// issuing at once on one store) ran out of eight, and the pauses reach
/// 500 ms, so this is about half a minute of others' commits.
const RETRIES: u32 = 64;

/// One machine of the inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct InventoryMachine {
    /// Its id (the `machine` attribute of its key).
    pub id: String,
    /// Its attributes as its key holds them, `machine` included: what a
    /// policy is evaluated on.
    pub attributes: Attributes,
    /// When it was last issued a key (or imported), Unix seconds.
    pub issued: u64,
    /// The master generations its newest key holds keys of, newest first.
    /// For an imported machine, the generations live when it was imported
    /// (what the authority can assume it holds; issuing it again records
    /// what it does).
    pub generations: Vec<u32>,
    /// Whether it came from `inventory --import` rather than `issue`.
    pub imported: bool,
    /// Whether it is revoked (the authority's revocation list decides,
    /// whether or not the inventory was marked).
    pub revoked: bool,
    /// When it was revoked, Unix seconds, when the inventory was marked.
    pub revoked_at: Option<u64>,
}

impl InventoryMachine {
    /// Its newest generation: the one it stops opening without.
    pub fn newest_generation(&self) -> Option<u32> {
        self.generations.iter().copied().max()
    }
}

/// What an import did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Imported {
    /// Machines new to the inventory.
    pub added: usize,
    /// Machines it held whose attributes changed.
    pub updated: usize,
    /// Machines it held as given.
    pub unchanged: usize,
}

/// What the next master rotation would strand ([`Authority::stranding`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stranding {
    /// The generation the next rotation retires (`None`: it retires none).
    pub generation: Option<u32>,
    /// The machines (not revoked) whose newest key is of that generation,
    /// sorted: after the rotation they open nothing until issued again.
    pub machines: Vec<String>,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Decodes one shard, checking that each machine belongs in it.
pub(super) fn decode_shard(name: &str, b: &[u8]) -> Result<Vec<InventoryMachine>> {
    let mut r = reader(b, O, MAGIC)?;
    let n = r.u32("machine count").map_err(codec(O))?;
    let mut out = Vec::new();
    for i in 0..n {
        let id = r.text16(|| format!("id[{i}]")).map_err(codec(O))?.to_owned();
        revocation::check_machine_id(&id).map_err(|e| malformed(O, format!("{name}: {e}")))?;
        if layout::inventory_shard(&id) != name {
            return Err(malformed(O, format!("{name}: machine {id} belongs in {}", layout::inventory_shard(&id))));
        }
        let issued = r.u64(|| format!("issued[{i}]")).map_err(codec(O))?;
        let flags = r.u8(|| format!("flags[{i}]")).map_err(codec(O))?;
        if flags & !(IMPORTED | REVOKED) != 0 {
            return Err(malformed(O, format!("{name}: machine {id} has unknown flags {flags:#x}")));
        }
        let revoked_at = r.u64(|| format!("revoked at[{i}]")).map_err(codec(O))?;
        let g = r.u16(|| format!("generation count[{i}]")).map_err(codec(O))?;
        let mut generations = Vec::with_capacity(g.into());
        for _ in 0..g {
            generations.push(r.u32(|| format!("generation[{i}]")).map_err(codec(O))?);
        }
        let a = r.u16(|| format!("attribute count[{i}]")).map_err(codec(O))?;
        let mut pairs = Vec::with_capacity(a.into());
        for _ in 0..a {
            let label = r.text16(|| format!("label[{i}]")).map_err(codec(O))?;
            let value = r.text16(|| format!("value[{i}]")).map_err(codec(O))?;
            pairs.push((label, value));
        }
        let attributes = Attributes::try_from_pairs(pairs).map_err(|e| malformed(O, format!("{name}: machine {id}: {e}")))?;
        if out.iter().any(|m: &InventoryMachine| m.id == id) {
            return Err(malformed(O, format!("{name}: machine {id} is listed twice")));
        }
        out.push(InventoryMachine {
            id,
            attributes,
            issued,
            generations,
            imported: flags & IMPORTED != 0,
            revoked: flags & REVOKED != 0,
            revoked_at: (revoked_at != 0).then_some(revoked_at),
        });
    }
    r.finish().map_err(codec(O))?;
    Ok(out)
}

/// One shard's encoding. Every field was checked when the machine was
/// recorded (ids of at most 64 bytes, attributes a machine key holds, as
/// many generations as the state's 16-bit count), so none overflows.
pub(super) fn encode_shard(machines: &[InventoryMachine]) -> Vec<u8> {
    let mut w = writer(MAGIC);
    w.len32(machines.len());
    for m in machines {
        let flags = if m.imported { IMPORTED } else { 0 } | if m.revoked { REVOKED } else { 0 };
        w.bytes16(m.id.as_bytes()).u64(m.issued).u8(flags).u64(m.revoked_at.unwrap_or(0)).len16(m.generations.len());
        for g in &m.generations {
            w.u32(*g);
        }
        w.len16(m.attributes.len());
        for (l, v) in m.attributes.iter() {
            w.bytes16(l.as_bytes()).bytes16(v.as_bytes());
        }
    }
    w.into_bytes().to_vec()
}

/// Every machine of the inventory in `store`, sorted by id, as stored
/// (not yet marked from the revocation list).
pub(super) fn read_all(store: &dyn Store) -> Result<Vec<InventoryMachine>> {
    let mut out = Vec::new();
    let mut failed: Option<WrapError> = None;
    store.scan(layout::INVENTORY, 256, &mut |names, values| {
        for (name, value) in names.iter().zip(values) {
            let Some(value) = value else { continue };
            match decode_shard(name, &value) {
                Ok(ms) => out.extend(ms),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        Ok(())
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// Reads one line of an inventory file: the id, a tab, the attributes as
/// `issue --attrs` takes them. The attributes returned carry the id as
/// `machine`.
fn parse_line(file: &str, line: usize, text: &str) -> Result<(String, Attributes)> {
    let bad = |field: &'static str, reason: String| WrapError::InvalidLine { file: file.to_owned(), line, field, reason };
    let Some((id, attrs)) = text.split_once('\t') else {
        return Err(bad("id", "no tab: a line is the machine id, a tab, then its attributes (label=value,label=value)".into()));
    };
    let id = id.trim();
    revocation::check_machine_id(id).map_err(|e| bad("id", e.to_string()))?;
    let mut attributes: Attributes = attrs.trim().parse().map_err(|e| bad("attributes", format!("{e}")))?;
    match attributes.get(MACHINE_LABEL) {
        Some(given) if given != id => {
            return Err(bad("attributes", format!("`{MACHINE_LABEL}={given}` is not the line's id {id}")));
        }
        _ => {}
    }
    attributes.insert(MACHINE_LABEL, id);
    MachineKey::check_attributes(&attributes).map_err(|e| bad("attributes", e.to_string()))?;
    Ok((id.to_owned(), attributes))
}

/// Reads an inventory file (`file` names it in errors): one machine a
/// line, `ID<TAB>label=value,...`; blank lines and lines starting with
/// `#` are skipped. An id given twice is an error naming both lines.
///
/// # Errors
/// [`WrapError::InvalidLine`] with the file, the line and the field.
pub fn parse_inventory(file: &str, text: &str) -> Result<Vec<(String, Attributes)>> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let (id, attrs) = parse_line(file, line_no, line)?;
        if let Some(first) = seen.insert(id.clone(), line_no) {
            return Err(WrapError::InvalidLine {
                file: file.to_owned(),
                line: line_no,
                field: "id",
                reason: format!("machine {id} is already on line {first}"),
            });
        }
        out.push((id, attrs));
    }
    Ok(out)
}

impl Authority {
    /// Every machine of the inventory, sorted by id, revoked ones marked as
    /// the authority's revocation list says (also where an interrupted
    /// `revoke` did not get to mark the inventory).
    ///
    /// # Errors
    /// [`WrapError::Store`]; [`WrapError::Malformed`] (object `inventory`)
    /// for a shard that does not decode.
    pub fn inventory(&self) -> Result<Vec<InventoryMachine>> {
        let (fresh, _) = self.latest()?;
        let this = fresh.as_ref().map_or(&self.state, |(state, _)| state);
        let mut machines = read_all(&*self.store)?;
        for m in &mut machines {
            if this.revoked.iter().any(|r| r.id == m.id) {
                m.revoked = true;
            }
        }
        Ok(machines)
    }

    /// Records machine `id` in the inventory, issued now with `attributes`
    /// and keys of `generations`, in one commit that expects the shard and
    /// the authority's state (`state`) as read: a rotation or revocation
    /// committed meanwhile makes it a conflict, and `issue` starts over.
    pub(super) fn record_issued(&self, state: Stamp, id: &str, attributes: &Attributes, generations: &[u32]) -> Result<()> {
        let shard = layout::inventory_shard(id);
        let (mut machines, stamp) = self.read_shard(&shard)?;
        let m = InventoryMachine {
            id: id.to_owned(),
            attributes: attributes.clone(),
            issued: now(),
            generations: generations.to_vec(),
            imported: false,
            revoked: false,
            revoked_at: None,
        };
        match machines.iter_mut().find(|x| x.id == id) {
            Some(x) => *x = m,
            None => machines.push(m),
        }
        machines.sort_by(|a, b| a.id.cmp(&b.id));
        let batch = Batch {
            expect: vec![(layout::STATE.to_owned(), Some(state)), (shard.clone(), stamp)],
            ops: vec![Op::Put(shard, encode_shard(&machines))],
        };
        Ok(self.store.commit(&batch)?)
    }

    /// Marks machine `id` revoked in the inventory (after `revoke`
    /// committed), if the inventory holds it. The revocation list stays
    /// what decides: [`Authority::inventory`] marks from it too.
    pub(super) fn mark_revoked(&self, id: &str) -> Result<()> {
        let shard = layout::inventory_shard(id);
        self.retrying(|a| {
            let _lock = a.store.lock(LOCK_WAIT)?;
            let (mut machines, stamp) = a.read_shard(&shard)?;
            let Some(m) = machines.iter_mut().find(|m| m.id == id) else { return Ok(()) };
            if m.revoked {
                return Ok(());
            }
            m.revoked = true;
            m.revoked_at = Some(now());
            let batch = Batch { expect: vec![(shard.clone(), stamp)], ops: vec![Op::Put(shard.clone(), encode_shard(&machines))] };
            Ok(a.store.commit(&batch)?)
        })
    }

    /// Adds machines already issued to the inventory (a store made before
    /// the inventory, a fleet issued elsewhere): `machines` as
    /// [`parse_inventory`] reads them. A machine the inventory holds gets
    /// the attributes given (and keeps its issue record); one the
    /// authority revoked is recorded revoked. Imported machines are taken
    /// to hold keys of the generations live now.
    ///
    /// Shards are written in commits of at most 64, each expecting the
    /// shards it read; a conflict re-reads and writes that commit again.
    ///
    /// # Errors
    /// [`WrapError::InvalidMachineId`] and the attribute checks of `issue`
    /// for a machine the file did not come from [`parse_inventory`];
    /// [`WrapError::Store`].
    pub fn import_inventory(&self, machines: &[(String, Attributes)]) -> Result<Imported> {
        for (id, attrs) in machines {
            revocation::check_machine_id(id)?;
            MachineKey::check_attributes(attrs)?;
        }
        let (fresh, _) = self.latest()?;
        let this = fresh.as_ref().map_or(&self.state, |(state, _)| state);
        let mut live: Vec<u32> = this.live().map(|g| g.number).collect();
        live.sort_unstable_by(|a, b| b.cmp(a));
        let revoked: Vec<&str> = this.revoked.iter().map(|r| r.id.as_str()).collect();
        let mut by_shard: BTreeMap<String, Vec<(&str, Attributes)>> = BTreeMap::new();
        for (id, attrs) in machines {
            let mut attrs = attrs.clone();
            attrs.insert(MACHINE_LABEL, id.as_str());
            by_shard.entry(layout::inventory_shard(id)).or_default().push((id, attrs));
        }
        let at = now();
        let mut done = Imported::default();
        let shards: Vec<(String, Vec<(&str, Attributes)>)> = by_shard.into_iter().collect();
        let mut rest = &shards[..];
        while !rest.is_empty() {
            // A chunk of shards, bounded in count here and in bytes below.
            let take = rest.len().min(CHUNK_SHARDS);
            let (chunk, next) = rest.split_at(take);
            let counted = self.retrying(|a| {
                let _lock = a.store.lock(LOCK_WAIT)?;
                let mut counts = Imported::default();
                let mut batch = Batch::default();
                let mut written = Vec::new();
                for (shard, adds) in chunk {
                    let (mut held, stamp) = a.read_shard(shard)?;
                    for (id, attrs) in adds {
                        match held.iter_mut().find(|m| m.id == *id) {
                            Some(m) if m.attributes == *attrs => counts.unchanged += 1,
                            Some(m) => {
                                m.attributes = attrs.clone();
                                counts.updated += 1;
                            }
                            None => {
                                let is_revoked = revoked.contains(id);
                                held.push(InventoryMachine {
                                    id: (*id).to_owned(),
                                    attributes: attrs.clone(),
                                    issued: at,
                                    generations: live.clone(),
                                    imported: true,
                                    revoked: is_revoked,
                                    revoked_at: None,
                                });
                                counts.added += 1;
                            }
                        }
                    }
                    held.sort_by(|x, y| x.id.cmp(&y.id));
                    batch.expect.push((shard.clone(), stamp));
                    written.push(shard.clone());
                    batch.ops.push(Op::Put(shard.clone(), encode_shard(&held)));
                    if batch.size() >= CHUNK_BYTES {
                        // Sent now; the shards after it in this chunk in
                        // commits of their own.
                        a.store.commit(&std::mem::take(&mut batch))?;
                    }
                }
                a.store.commit(&batch)?;
                Ok(counts)
            })?;
            done.added += counted.added;
            done.updated += counted.updated;
            done.unchanged += counted.unchanged;
            rest = next;
        }
        Ok(done)
    }

    /// What the next master rotation would strand: the machines of the
    /// inventory, not revoked, whose newest key is of the generation it
    /// would retire (the decrypt-only one).
    ///
    /// # Errors
    /// As [`Authority::inventory`].
    pub fn stranding(&self) -> Result<Stranding> {
        let (fresh, _) = self.latest()?;
        let this = fresh.as_ref().map_or(&self.state, |(state, _)| state);
        let generation = this.generations.iter().find(|g| g.state == crate::wrap::GenerationState::DecryptOnly).map(|g| g.number);
        Ok(Stranding { generation, machines: self.stranded_by(generation)? })
    }

    /// The machines (not revoked) whose newest key is of `generation`.
    pub(super) fn stranded_by(&self, generation: Option<u32>) -> Result<Vec<String>> {
        let Some(g) = generation else { return Ok(Vec::new()) };
        Ok(self.inventory()?.into_iter().filter(|m| !m.revoked && m.newest_generation() == Some(g)).map(|m| m.id).collect())
    }

    /// A shard's machines and the stamp read (`None`: absent).
    fn read_shard(&self, shard: &str) -> Result<(Vec<InventoryMachine>, Option<Stamp>)> {
        match self.store.get_stamped(shard)? {
            Some((bytes, stamp)) => Ok((decode_shard(shard, &bytes)?, Some(stamp))),
            None => Ok((Vec::new(), None)),
        }
    }

    /// Runs `f` again after a conflict (another writer changed what it
    /// read), up to [`RETRIES`] times with jittered pauses.
    pub(super) fn retrying<T>(&self, mut f: impl FnMut(&Self) -> Result<T>) -> Result<T> {
        let mut backoff = Backoff::new(std::time::Duration::from_millis(10), std::time::Duration::from_millis(500), Jitter::UpperHalf);
        let mut tries = 0;
        loop {
            match f(self) {
                Err(WrapError::Store(StoreError::Conflict { .. })) if tries < RETRIES => {
                    tries += 1;
                    std::thread::sleep(backoff.pause());
                }
                r => return r,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(id: &str, attrs: &str) -> InventoryMachine {
        let mut attributes: Attributes = attrs.parse().unwrap();
        attributes.insert(MACHINE_LABEL, id);
        InventoryMachine {
            id: id.into(),
            attributes,
            issued: 7,
            generations: vec![2, 1],
            imported: true,
            revoked: true,
            revoked_at: Some(9),
        }
    }

    #[test]
    fn shards_read_back_and_refuse_what_does_not_belong() {
        let id = "0123456789abcdef0123456789abcdef";
        let shard = layout::inventory_shard(id);
        let ms = vec![machine(id, "dc=fra1,region=EU")];
        assert_eq!(decode_shard(&shard, &encode_shard(&ms)).unwrap(), ms);
        let other = (0..).map(|i| format!("{i:032x}")).find(|x| layout::inventory_shard(x) != shard).unwrap();
        let e = decode_shard(&shard, &encode_shard(&[machine(&other, "a=b")])).unwrap_err();
        assert!(e.to_string().contains("belongs in"), "{e}");
        let bytes = encode_shard(&ms);
        for cut in [3, 8, bytes.len() - 1] {
            assert!(matches!(decode_shard(&shard, &bytes[..cut]), Err(WrapError::Malformed { object: "inventory", .. })));
        }
    }

    #[test]
    fn bad_lines_name_file_line_and_field() {
        let id = "0123456789abcdef0123456789abcdef";
        let cases = [
            (format!("{id} dc=fra1"), 1, "id"),
            (format!("# fleet\n\n{id}\tdc=fra1\nnot-an-id\tdc=x"), 4, "id"),
            (format!("{id}\tdc"), 1, "attributes"),
            (format!("{id}\tmachine=other"), 1, "attributes"),
            (format!("{id}\tdc=a\n{id}\tdc=b"), 2, "id"),
        ];
        for (text, line, field) in cases {
            match parse_inventory("fleet.tsv", &text) {
                Err(WrapError::InvalidLine { file, line: l, field: f, .. }) => {
                    assert_eq!((file.as_str(), l, f), ("fleet.tsv", line, field), "{text}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let ok = parse_inventory("f", &format!("{id}\tdc=fra1,region=EU\n")).unwrap();
        assert_eq!(ok[0].1.get(MACHINE_LABEL), Some(id));
    }
}
