//! A policy as the scheme sees it: the circuit of `keyfence_policy` with
//! every leaf's value hashed to a scalar, its CIRCL encoding, and the
//! Boneh-Katz augmentation.

use blstrs::Scalar;
use keyfence_policy::{Gate, GateKind, Leaf, Policy};

use super::encoding::{put_bytes16, put_u16, Reader};
use super::error::{malformed, AbeError, Result};
use super::group;
use super::oracle::hash_value;

/// The label of the wildcard attribute the Boneh-Katz transform adds to
/// every key and ANDs into every policy.
pub(crate) const BK_LABEL: &str = "internal-boneh-katz-transform-attribute";

/// One input wire: `label: value` (or its negation) with the value hashed.
#[derive(Clone)]
pub(crate) struct Wire {
    pub(crate) label: String,
    pub(crate) raw: String,
    pub(crate) value: Scalar,
    pub(crate) positive: bool,
}

/// A policy in the scheme's numbering (leaves `0..=n`, gate outputs
/// `n+1..=2n`), in the gate order it is encoded in.
#[derive(Clone)]
pub(crate) struct AbePolicy {
    pub(crate) wires: Vec<Wire>,
    pub(crate) gates: Vec<Gate>,
}

impl AbePolicy {
    pub(crate) fn from_policy(p: &Policy) -> Result<Self> {
        if let Some(l) = p.leaves().iter().find(|l| l.label == BK_LABEL) {
            return Err(AbeError::ReservedLabel(l.label.clone()));
        }
        let wires = p
            .leaves()
            .iter()
            .map(|l| Wire {
                label: l.label.clone(),
                raw: l.value.clone(),
                value: hash_value(&l.value),
                positive: l.positive,
            })
            .collect();
        Ok(Self { wires, gates: p.gates().to_vec() })
    }

    /// Back to a `keyfence_policy::Policy` (to print or evaluate it).
    pub(crate) fn to_policy(&self) -> Result<Policy> {
        let leaves = self
            .wires
            .iter()
            .map(|w| Leaf { label: w.label.clone(), value: w.raw.clone(), positive: w.positive, occurrence: 0 })
            .collect();
        Policy::from_parts(leaves, self.gates.clone())
            .map_err(|e| malformed("ciphertext", "policy.formula", e.to_string()))
    }

    /// The copy index of every wire: how many earlier wires share its label.
    pub(crate) fn occurrences(&self) -> (Vec<usize>, usize) {
        let mut seen = std::collections::HashMap::<&str, usize>::new();
        let pi: Vec<usize> = self
            .wires
            .iter()
            .map(|w| {
                let c = seen.entry(&w.label).or_insert(0);
                *c += 1;
                *c - 1
            })
            .collect();
        let d = pi.iter().copied().max().map_or(0, |m| m + 1);
        (pi, d)
    }

    /// CIRCL's encoding (the policy field of a ciphertext).
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let mut f = Vec::with_capacity(2 + 7 * self.gates.len());
        put_u16(&mut f, self.gates.len(), "policy gate count")?;
        for g in &self.gates {
            f.push(match g.kind {
                GateKind::And => 0,
                GateKind::Or => 1,
            });
            for w in [g.in0, g.in1, g.out] {
                put_u16(&mut f, w, "policy wire number")?;
            }
        }
        let mut out = Vec::new();
        put_bytes16(&mut out, &f, "policy formula")?;
        put_u16(&mut out, self.wires.len(), "policy wire count")?;
        for w in &self.wires {
            let mut wb = Vec::with_capacity(41 + w.label.len() + w.raw.len());
            put_bytes16(&mut wb, w.label.as_bytes(), "policy label")?;
            put_bytes16(&mut wb, w.raw.as_bytes(), "policy value")?;
            put_bytes16(&mut wb, &w.value.to_bytes_be(), "policy scalar")?;
            wb.push(u8::from(w.positive));
            put_bytes16(&mut out, &wb, "policy wire")?;
        }
        Ok(out)
    }

    /// Decodes and validates the policy field of a ciphertext. Stricter
    /// than CIRCL: every length is exact, the hashed values must match the
    /// values' text, and the formula must be a well-formed circuit.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        const O: &str = "ciphertext";
        let mut r = Reader::new(bytes, O);
        let fbytes = r.bytes16(&|| "policy.formula".into())?;
        let mut fr = Reader::new(fbytes, O);
        let ng = fr.u16(&|| "policy.formula.gates".into())?;
        let mut gates = Vec::with_capacity(ng);
        for i in 0..ng {
            let kind = match fr.u8(&|| format!("policy.formula.gates[{i}].class"))? {
                0 => GateKind::And,
                1 => GateKind::Or,
                c => return Err(fr.err(format!("policy.formula.gates[{i}].class"), format!("unknown gate class {c}"))),
            };
            let in0 = fr.u16(&|| format!("policy.formula.gates[{i}].in0"))?;
            let in1 = fr.u16(&|| format!("policy.formula.gates[{i}].in1"))?;
            let out = fr.u16(&|| format!("policy.formula.gates[{i}].out"))?;
            gates.push(Gate { kind, in0, in1, out });
        }
        fr.finish("policy.formula")?;
        let nw = r.u16(&|| "policy.wires".into())?;
        if nw != ng + 1 {
            return Err(r.err("policy.wires", format!("{nw} wires but {ng} gates need {}", ng + 1)));
        }
        let mut wires = Vec::with_capacity(nw);
        for i in 0..nw {
            let wb = r.bytes16(&|| format!("policy.wires[{i}]"))?;
            let mut wr = Reader::new(wb, O);
            let field = |f: &str| format!("policy.wires[{i}].{f}");
            let label = String::from_utf8(wr.bytes16(&|| field("label"))?.to_vec())
                .map_err(|_| malformed(O, field("label"), "not UTF-8"))?;
            let raw = String::from_utf8(wr.bytes16(&|| field("value"))?.to_vec())
                .map_err(|_| malformed(O, field("value"), "not UTF-8"))?;
            let sb = wr.bytes16(&|| field("scalar"))?;
            let value = group::scalar_from_be(sb)
                .ok_or_else(|| malformed(O, field("scalar"), "not a canonical 32-byte scalar"))?;
            let positive = match wr.u8(&|| field("sign"))? {
                0 => false,
                1 => true,
                s => return Err(malformed(O, field("sign"), format!("must be 0 or 1, found {s}"))),
            };
            wr.finish(&field("end"))?;
            if label.is_empty() || raw.is_empty() {
                return Err(malformed(O, field("label"), "empty label or value"));
            }
            if label == BK_LABEL {
                return Err(malformed(O, field("label"), "reserved label"));
            }
            if hash_value(&raw) != value {
                return Err(malformed(O, field("scalar"), "does not match the hash of the value"));
            }
            wires.push(Wire { label, raw, value, positive });
        }
        r.finish("policy")?;
        let p = Self { wires, gates };
        // Validates the circuit (every wire used once, no cycle).
        p.to_policy()?;
        Ok(p)
    }

    /// The Boneh-Katz augmentation: `policy AND bk-label: id`, numbered as
    /// CIRCL numbers it (the new leaf is wire `n+1`, gate outputs shift up
    /// by one, the new AND gate is last).
    pub(crate) fn with_bk(&self, id: Scalar) -> Self {
        let n = self.gates.len();
        let shift = |w: usize| if w > n { w + 1 } else { w };
        let mut gates: Vec<Gate> = self
            .gates
            .iter()
            .map(|g| Gate { kind: g.kind, in0: shift(g.in0), in1: shift(g.in1), out: g.out + 1 })
            .collect();
        let in0 = if n == 0 { 0 } else { n + 1 };
        gates.push(Gate { kind: GateKind::And, in0, in1: 2 * n + 1, out: 2 * n + 2 });
        let mut wires = self.wires.clone();
        wires.push(Wire { label: BK_LABEL.into(), raw: String::new(), value: id, positive: true });
        Self { wires, gates }
    }

    /// The gates in CIRCL's topological order: breadth first from the gates
    /// whose inputs are all leaves, in index order. The order in which the
    /// encryptor draws secret shares depends on it, so known-answer tests
    /// against CIRCL need exactly this order.
    pub(crate) fn circl_order(&self) -> Vec<Gate> {
        let n = self.gates.len();
        if n == 0 {
            return Vec::new();
        }
        let mut pending = vec![0usize; n];
        let mut consumer = vec![usize::MAX; n];
        for (i, g) in self.gates.iter().enumerate() {
            for w in [g.in0, g.in1] {
                if w > n {
                    consumer[w - n - 1] = i;
                    pending[i] += 1;
                }
            }
        }
        let mut queue: std::collections::VecDeque<usize> = (0..n).filter(|&i| pending[i] == 0).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(i) = queue.pop_front() {
            order.push(self.gates[i]);
            let c = consumer[self.gates[i].out - n - 1];
            if c != usize::MAX {
                pending[c] -= 1;
                if pending[c] == 0 {
                    queue.push_back(c);
                }
            }
        }
        order
    }

    /// CIRCL's choice of satisfying wires, given which wires hold: an AND
    /// takes both sides, an OR its first input unless the second needs
    /// strictly fewer wires.
    pub(crate) fn satisfying(&self, holds: impl Fn(usize, &Wire) -> bool) -> Option<Vec<usize>> {
        let n = self.gates.len();
        let mut sets: Vec<Option<Vec<usize>>> = vec![None; 2 * n + 1];
        for (i, w) in self.wires.iter().enumerate() {
            if holds(i, w) {
                sets[i] = Some(vec![i]);
            }
        }
        for g in self.circl_order() {
            sets[g.out] = match (g.kind, &sets[g.in0], &sets[g.in1]) {
                (GateKind::And, Some(a), Some(b)) => Some([a.as_slice(), b.as_slice()].concat()),
                (GateKind::And, _, _) => None,
                (GateKind::Or, Some(a), Some(b)) => Some(if b.len() < a.len() { b.clone() } else { a.clone() }),
                (GateKind::Or, Some(x), None) | (GateKind::Or, None, Some(x)) => Some(x.clone()),
                (GateKind::Or, None, None) => None,
            };
        }
        sets.pop().flatten()
    }
}
