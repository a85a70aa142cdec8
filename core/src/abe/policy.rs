//! A policy as the scheme sees it: the circuit of `keyfence_policy` with
//! every leaf's value hashed to a scalar, its CIRCL encoding, and the
//! Boneh-Katz augmentation.

use blstrs::Scalar;
use keyfence_policy::{Gate, GateKind, Leaf, Policy};

use super::error::{codec, malformed, AbeError, Result};
use super::group;
use super::oracle::hash_value;
use crate::codec::{CodecError, Order, Reader, Writer};

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
            .map(|l| Wire { label: l.label.clone(), raw: l.value.clone(), value: hash_value(&l.value), positive: l.positive })
            .collect();
        Ok(Self { wires, gates: p.gates().to_vec() })
    }

    /// Back to a `keyfence_policy::Policy` (to print or evaluate it).
    pub(crate) fn to_policy(&self) -> Result<Policy> {
        let leaves =
            self.wires.iter().map(|w| Leaf { label: w.label.clone(), value: w.raw.clone(), positive: w.positive, occurrence: 0 }).collect();
        Policy::from_parts(leaves, self.gates.clone()).map_err(|e| malformed("ciphertext", "policy.formula", e.to_string()))
    }

    /// The copy index of every wire (how many earlier wires share its
    /// label) and the most copies of any one label.
    pub(crate) fn occurrences(&self) -> (Vec<usize>, usize) {
        let pi = keyfence_policy::occurrence_numbers(self.wires.iter().map(|w| w.label.as_str()));
        let d = pi.iter().copied().max().map_or(0, |m| m + 1);
        (pi, d)
    }

    /// CIRCL's encoding (the policy field of a ciphertext).
    ///
    /// Parsed policies fit by construction (the parser refuses any whose
    /// encoding would pass the field's 16-bit length); one assembled from
    /// parts is checked here.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let mut f = Writer::new(Order::Little);
        f.len16(self.gates.len());
        for g in &self.gates {
            f.u8(match g.kind {
                GateKind::And => 0,
                GateKind::Or => 1,
            });
            for w in [g.in0, g.in1, g.out] {
                f.len16(w);
            }
        }
        let formula = f.finish().map_err(too_long("policy formula"))?;
        let mut out = Writer::new(Order::Little);
        out.bytes16(&formula).len16(self.wires.len());
        for w in &self.wires {
            let mut wb = Writer::new(Order::Little);
            wb.bytes16(w.label.as_bytes()).bytes16(w.raw.as_bytes()).bytes16(&w.value.to_bytes_be()).u8(u8::from(w.positive));
            out.bytes16(&wb.finish().map_err(too_long("policy wire"))?);
        }
        let mut bytes = out.finish().map_err(too_long("policy"))?;
        Ok(std::mem::take(&mut *bytes))
    }

    /// Decodes and validates the policy field of a ciphertext. Stricter
    /// than CIRCL: every length is exact, the hashed values must match the
    /// values' text, and the formula must be a well-formed circuit.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut r = Reader::new(bytes, Order::Little);
        let fbytes = r.bytes16("policy.formula").map_err(in_ciphertext)?;
        let mut fr = Reader::new(fbytes, Order::Little);
        let ng = usize::from(fr.u16("policy.formula.gates").map_err(in_ciphertext)?);
        let mut gates = Vec::with_capacity(ng);
        for i in 0..ng {
            let kind = match fr.u8(|| format!("policy.formula.gates[{i}].class")).map_err(in_ciphertext)? {
                0 => GateKind::And,
                1 => GateKind::Or,
                c => return Err(malformed(CT, format!("policy.formula.gates[{i}].class"), format!("unknown gate class {c}"))),
            };
            let mut wire = |f: &'static str| fr.u16(|| format!("policy.formula.gates[{i}].{f}")).map(usize::from).map_err(in_ciphertext);
            let (in0, in1, out) = (wire("in0")?, wire("in1")?, wire("out")?);
            gates.push(Gate { kind, in0, in1, out });
        }
        fr.finish_as("policy.formula").map_err(in_ciphertext)?;
        let nw = usize::from(r.u16("policy.wires").map_err(in_ciphertext)?);
        if nw != ng + 1 {
            return Err(malformed(CT, "policy.wires", format!("{nw} wires but {ng} gates need {}", ng + 1)));
        }
        let mut wires = Vec::with_capacity(nw);
        for i in 0..nw {
            let wb = r.bytes16(|| format!("policy.wires[{i}]")).map_err(in_ciphertext)?;
            let mut wr = Reader::new(wb, Order::Little);
            let field = |f: &str| format!("policy.wires[{i}].{f}");
            let label = wr.text16(|| field("label")).map_err(in_ciphertext)?.to_owned();
            let raw = wr.text16(|| field("value")).map_err(in_ciphertext)?.to_owned();
            let sb = wr.bytes16(|| field("scalar")).map_err(in_ciphertext)?;
            let value = group::scalar_from_be(sb).ok_or_else(|| malformed(CT, field("scalar"), "not a canonical 32-byte scalar"))?;
            let positive = match wr.u8(|| field("sign")).map_err(in_ciphertext)? {
                0 => false,
                1 => true,
                s => return Err(malformed(CT, field("sign"), format!("must be 0 or 1, found {s}"))),
            };
            wr.finish_as(|| field("end")).map_err(in_ciphertext)?;
            if label.is_empty() || raw.is_empty() {
                return Err(malformed(CT, field("label"), "empty label or value"));
            }
            if label == BK_LABEL {
                return Err(malformed(CT, field("label"), "reserved label"));
            }
            if hash_value(&raw) != value {
                return Err(malformed(CT, field("scalar"), "does not match the hash of the value"));
            }
            wires.push(Wire { label, raw, value, positive });
        }
        r.finish_as("policy").map_err(in_ciphertext)?;
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
        let mut gates: Vec<Gate> =
            self.gates.iter().map(|g| Gate { kind: g.kind, in0: shift(g.in0), in1: shift(g.in1), out: g.out + 1 }).collect();
        let in0 = if n == 0 { 0 } else { n + 1 };
        gates.push(Gate { kind: GateKind::And, in0, in1: 2 * n + 1, out: 2 * n + 2 });
        let mut wires = self.wires.clone();
        wires.push(Wire { label: BK_LABEL.into(), raw: String::new(), value: id, positive: true });
        Self { wires, gates }
    }

    /// The gates in CIRCL's topological order: the order in which the
    /// encryptor draws secret shares, so known-answer tests against CIRCL
    /// need exactly this one ([`keyfence_policy::circl_order`]).
    pub(crate) fn circl_order(&self) -> Vec<Gate> {
        keyfence_policy::circl_order(&self.gates)
    }

    /// CIRCL's choice of satisfying wires, given which wires hold
    /// ([`keyfence_policy::satisfying_wires`]). The gates are put in
    /// CIRCL's order first: a decoded ciphertext lists them as it likes.
    pub(crate) fn satisfying(&self, holds: impl Fn(usize, &Wire) -> bool) -> Option<Vec<usize>> {
        keyfence_policy::satisfying_wires(&self.circl_order(), |i| self.wires.get(i).is_some_and(|w| holds(i, w)))
    }
}

const CT: &str = "ciphertext";

fn in_ciphertext(e: CodecError) -> AbeError {
    codec(CT)(e)
}

/// A policy whose encoding passes a 16-bit length: the same error the
/// encoder has always reported for it.
fn too_long(what: &'static str) -> impl Fn(CodecError) -> AbeError {
    move |e| malformed("encoding", what, e.problem.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn quoted(s: &str) -> String {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    }

    proptest! {
        // The parser's size limit is computed from policy-lang's byte
        // costs; they must be what this encoder writes.
        #[test]
        fn the_encoder_writes_what_the_limits_count(
            terms in proptest::collection::vec(("[a-c]{1,3}", "[a-z\"é ]{1,12}", any::<bool>(), any::<bool>()), 1..12)
        ) {
            let text = terms
                .iter()
                .enumerate()
                .map(|(i, (l, v, neg, and))| {
                    let op = if i == 0 { "" } else if *and { " and " } else { " or " };
                    format!("{op}{}{l}: {}", if *neg { "not " } else { "" }, quoted(v))
                })
                .collect::<String>();
            let p = keyfence_policy::parse(&text).unwrap();
            let encoded = AbePolicy::from_policy(&p).unwrap().encode().unwrap();
            prop_assert_eq!(encoded.len(), keyfence_policy::limits::encoded_len(&p));
            let back = AbePolicy::decode(&encoded).unwrap().to_policy().unwrap();
            prop_assert_eq!(back, p);
        }
    }
}
