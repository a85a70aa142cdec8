//! The compiled policy: a monotone circuit of two-input `and`/`or` gates
//! over signed leaves, numbered the way the CP-ABE ciphertext format
//! numbers them.
//!
//! Numbering (CIRCL tkn20's): with `n` gates there are `n + 1` leaves,
//! wires `0..=n` are the leaves in order of appearance in the policy text,
//! and gate `k` (in the order the parser closes them, innermost first)
//! drives wire `n + 1 + k`; the last wire, `2n`, is the output. Every wire
//! but the output feeds exactly one gate input.

use crate::ast::Expr;
use crate::attributes::Attributes;

/// One input of the circuit: `label: value`, or its negation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leaf {
    /// Attribute label.
    pub label: String,
    /// Attribute value.
    pub value: String,
    /// `false` for `not label: value`, which holds only when the attributes
    /// have `label` with a different value.
    pub positive: bool,
    /// How many earlier leaves carry the same label (0 for the first). The
    /// scheme gives each repeated copy of a label its own key slot; this is
    /// the paper's ρ numbering, counted from 0.
    pub occurrence: usize,
}

impl Leaf {
    /// Whether `attrs` satisfy this leaf alone.
    pub fn holds(&self, attrs: &Attributes) -> bool {
        match attrs.get(&self.label) {
            None => false,
            Some(v) => (v == self.value) == self.positive,
        }
    }
}

/// Gate kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GateKind {
    /// Output holds when both inputs hold.
    And,
    /// Output holds when either input holds.
    Or,
}

impl GateKind {
    /// The keyword for this gate.
    pub fn keyword(self) -> &'static str {
        match self {
            GateKind::And => "and",
            GateKind::Or => "or",
        }
    }
}

/// A two-input gate; `in0`, `in1` and `out` are wire numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gate {
    /// `and` or `or`.
    pub kind: GateKind,
    /// First input wire.
    pub in0: usize,
    /// Second input wire.
    pub in1: usize,
    /// Output wire.
    pub out: usize,
}

/// Why a circuit given as raw parts (for example decoded from a
/// ciphertext) was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CircuitError {
    /// The leaf count is not the gate count plus one.
    #[error("circuit has {leaves} leaves but {gates} gates need exactly {}", gates + 1)]
    LeafCount {
        /// Leaves given.
        leaves: usize,
        /// Gates given.
        gates: usize,
    },
    /// A gate input is out of range or used twice.
    #[error("gate {gate} has input wire {wire} that is out of range or already used")]
    BadInput {
        /// Index of the gate.
        gate: usize,
        /// The offending wire.
        wire: usize,
    },
    /// A gate output is out of range or set twice.
    #[error("gate {gate} has output wire {wire} that is out of range or already set")]
    BadOutput {
        /// Index of the gate.
        gate: usize,
        /// The offending wire.
        wire: usize,
    },
    /// The gates form a cycle.
    #[error("circuit gates form a cycle")]
    Cycle,
    /// A leaf has an empty label or value.
    #[error("leaf {leaf} has an empty label or value")]
    EmptyLeaf {
        /// Index of the leaf.
        leaf: usize,
    },
}

/// A compiled policy: the monotone circuit CP-ABE encrypts under.
///
/// Build one with [`crate::parse`]; `Display` prints the canonical text,
/// which parses back to an equal `Policy`.
///
/// ```
/// let p = keyfence_policy::parse("country: US or (not region: EU)").unwrap();
/// assert_eq!(p.to_string(), "country: US or not region: EU");
/// assert_eq!(p.leaves().len(), 2);
/// assert!(!p.leaves()[1].positive);
/// ```
#[derive(Debug, Clone)]
pub struct Policy {
    leaves: Vec<Leaf>,
    /// In topological order: every gate comes after the gates feeding it.
    gates: Vec<Gate>,
}

impl Policy {
    /// Compiles an expression: negations pushed to the leaves by De
    /// Morgan's laws, leaves and gates numbered as CIRCL numbers them.
    pub fn from_expr(expr: &Expr) -> Policy {
        let mut leaves = Vec::new();
        let mut gates = Vec::new();
        compile(expr, false, &mut leaves, &mut gates);
        // Gate outputs were recorded as gate indices; now that the leaf
        // count is known they become wire numbers.
        let n = leaves.len();
        for g in &mut gates {
            g.in0 = resolve(g.in0, n);
            g.in1 = resolve(g.in1, n);
            g.out = resolve(g.out, n);
        }
        let mut p = Policy { leaves, gates };
        p.number_occurrences();
        p
    }

    /// Builds a policy from leaves and gates in wire numbering, as decoded
    /// from a ciphertext. The gates may come in any order; they are
    /// validated (every wire used exactly once, no cycles) and stored in
    /// topological order.
    ///
    /// # Errors
    /// [`CircuitError`] naming the first malformed gate or leaf.
    pub fn from_parts(leaves: Vec<Leaf>, gates: Vec<Gate>) -> Result<Policy, CircuitError> {
        let n = gates.len();
        if leaves.len() != n + 1 {
            return Err(CircuitError::LeafCount { leaves: leaves.len(), gates: n });
        }
        if let Some(i) = leaves.iter().position(|l| l.label.is_empty() || l.value.is_empty()) {
            return Err(CircuitError::EmptyLeaf { leaf: i });
        }
        let gates = toposort(&gates)?;
        let mut p = Policy { leaves, gates };
        p.number_occurrences();
        Ok(p)
    }

    fn number_occurrences(&mut self) {
        let numbers = occurrence_numbers(self.leaves.iter().map(|l| l.label.as_str()));
        for (leaf, n) in self.leaves.iter_mut().zip(numbers) {
            leaf.occurrence = n;
        }
    }

    /// The leaves, in wire order.
    pub fn leaves(&self) -> &[Leaf] {
        &self.leaves
    }

    /// The gates, each after the gates that feed it.
    pub fn gates(&self) -> &[Gate] {
        &self.gates
    }

    /// The output wire (`2n` for `n` gates).
    pub fn output_wire(&self) -> usize {
        2 * self.gates.len()
    }

    /// The largest number of leaves sharing one label (1 if no label
    /// repeats). The scheme needs this many key slots per label.
    pub fn max_repeats(&self) -> usize {
        self.leaves.iter().map(|l| l.occurrence + 1).max().unwrap_or(0)
    }

    /// Evaluates the circuit: does a key with `attrs` satisfy the policy?
    ///
    /// ```
    /// use keyfence_policy::{parse, Attributes};
    /// let p = parse("country: US or (not region: EU)").unwrap();
    /// assert!(p.eval(&Attributes::from_pairs([("region", "APAC")])));
    /// assert!(!p.eval(&Attributes::from_pairs([("region", "EU")])));
    /// assert!(!p.eval(&Attributes::default()));
    /// ```
    pub fn eval(&self, attrs: &Attributes) -> bool {
        self.satisfying_leaves(attrs).is_some()
    }

    /// A minimal set of leaves (wire numbers, ascending) whose truth under
    /// `attrs` makes the policy hold, or `None` if it does not hold.
    ///
    /// The choice is CIRCL's: an `and` takes both sides, an `or` takes its
    /// first input unless the second needs strictly fewer leaves. Decryption
    /// works with exactly these leaves.
    pub fn satisfying_leaves(&self, attrs: &Attributes) -> Option<Vec<usize>> {
        let mut out = satisfying_wires(&self.gates, |i| self.leaves.get(i).is_some_and(|l| l.holds(attrs)))?;
        out.sort_unstable();
        Some(out)
    }

    /// The distinct `(label, value)` pairs the policy mentions, in order of
    /// first appearance, whatever their sign.
    pub fn attribute_pairs(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for l in &self.leaves {
            let pair = (l.label.as_str(), l.value.as_str());
            if !out.contains(&pair) {
                out.push(pair);
            }
        }
        out
    }

    /// The wire driving `wire`: `None` for a leaf, else the gate.
    pub(crate) fn gate_driving(&self, wire: usize) -> Option<&Gate> {
        if wire <= self.gates.len() {
            return None;
        }
        self.gates.iter().find(|g| g.out == wire)
    }
}

impl Policy {
    /// Gates ordered by output wire: the same circuit listed in another
    /// topological order compares equal.
    fn canonical_gates(&self) -> Vec<Gate> {
        let mut g = self.gates.clone();
        g.sort_unstable_by_key(|g| g.out);
        g
    }
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.leaves == other.leaves && self.canonical_gates() == other.canonical_gates()
    }
}

impl Eq for Policy {}

impl std::hash::Hash for Policy {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.leaves.hash(state);
        self.canonical_gates().hash(state);
    }
}

/// Marks a gate index while compiling, before the leaf count is known.
const GATE_TAG: usize = 1 << (usize::BITS - 1);

fn resolve(w: usize, n_leaves: usize) -> usize {
    if w & GATE_TAG != 0 {
        n_leaves + (w & !GATE_TAG)
    } else {
        w
    }
}

fn compile(e: &Expr, neg: bool, leaves: &mut Vec<Leaf>, gates: &mut Vec<Gate>) -> usize {
    match e {
        Expr::Term { label, value } => {
            leaves.push(Leaf { label: label.clone(), value: value.clone(), positive: !neg, occurrence: 0 });
            leaves.len() - 1
        }
        Expr::Not(inner) => compile(inner, !neg, leaves, gates),
        Expr::And(a, b) | Expr::Or(a, b) => {
            let in0 = compile(a, neg, leaves, gates);
            let in1 = compile(b, neg, leaves, gates);
            let is_and = matches!(e, Expr::And(..));
            let kind = if is_and != neg { GateKind::And } else { GateKind::Or };
            let out = GATE_TAG | gates.len();
            gates.push(Gate { kind, in0, in1, out });
            out
        }
    }
}

/// Validates gates in wire numbering and orders them so that inputs are
/// set before they are read, keeping the given order when it already is.
fn toposort(gates: &[Gate]) -> Result<Vec<Gate>, CircuitError> {
    let n = gates.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut used = vec![false; 2 * n];
    let mut setter = vec![usize::MAX; n];
    for (i, g) in gates.iter().enumerate() {
        for w in [g.in0, g.in1] {
            if w >= 2 * n || used[w] {
                return Err(CircuitError::BadInput { gate: i, wire: w });
            }
            used[w] = true;
        }
        if g.out < n + 1 || g.out > 2 * n || setter[g.out - n - 1] != usize::MAX {
            return Err(CircuitError::BadOutput { gate: i, wire: g.out });
        }
        setter[g.out - n - 1] = i;
    }
    // Every input wire used once and every output set once, so the wires
    // form a forest; Kahn's algorithm finds any cycle.
    let mut set = vec![false; 2 * n + 1];
    set[..=n].iter_mut().for_each(|w| *w = true);
    let in_order = gates.iter().all(|g| {
        let ok = set[g.in0] && set[g.in1];
        set[g.out] = true;
        ok
    });
    if in_order {
        return Ok(gates.to_vec());
    }
    let order = circl_order(gates);
    if order.len() != n {
        return Err(CircuitError::Cycle);
    }
    Ok(order)
}

/// The gates in CIRCL's topological order: breadth first from the gates
/// whose inputs are all leaves, in index order, each gate queued once both
/// its inputs are set. `gates` are in wire numbering (`n` gates, leaves
/// `0..=n`) in any order.
///
/// The order in which an encryptor draws secret shares follows it, so
/// known-answer tests against CIRCL need exactly this order. Gates that a
/// cycle or an out-of-range wire keeps from ever becoming ready are left
/// out, so a result shorter than `gates` means the circuit is malformed.
///
/// ```
/// use keyfence_policy::{circl_order, parse};
/// let p = parse("(a: 1 or b: 2) and (c: 3 or d: 4)").unwrap();
/// let outs: Vec<usize> = circl_order(p.gates()).iter().map(|g| g.out).collect();
/// assert_eq!(outs, vec![4, 5, 6]);
/// ```
pub fn circl_order(gates: &[Gate]) -> Vec<Gate> {
    let n = gates.len();
    // Gate `k`'s position among the gate outputs, `None` for a leaf or a
    // wire past the circuit.
    let gate_of = |w: usize| w.checked_sub(n + 1).filter(|&k| k < n);
    let mut pending = vec![0usize; n];
    let mut consumer = vec![None; n];
    for (i, g) in gates.iter().enumerate() {
        for w in [g.in0, g.in1] {
            if let Some(k) = gate_of(w) {
                consumer[k] = Some(i);
                pending[i] += 1;
            }
        }
    }
    let mut queue: std::collections::VecDeque<usize> = (0..n).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(i) = queue.pop_front() {
        order.push(gates[i]);
        if let Some(c) = gate_of(gates[i].out).and_then(|k| consumer[k]) {
            pending[c] -= 1;
            if pending[c] == 0 {
                queue.push_back(c);
            }
        }
    }
    order
}

/// CIRCL's choice of satisfying leaves: given which leaves hold, the wire
/// numbers of a minimal set that makes the output wire hold, or `None` if
/// it does not hold. An `and` takes both sides, an `or` its first input
/// unless the second needs strictly fewer leaves. Decryption works with
/// exactly these leaves.
///
/// `gates` (in wire numbering: `n` gates, leaves `0..=n`, output `2n`)
/// must come in a topological order ([`Policy::gates`] or
/// [`circl_order`]); the result lists the leaves in the order the `and`
/// gates join them, not sorted.
///
/// ```
/// use keyfence_policy::{parse, satisfying_wires};
/// let p = parse("a: 1 or (b: 2 and c: 3)").unwrap();
/// assert_eq!(satisfying_wires(p.gates(), |i| i != 0), Some(vec![1, 2]));
/// assert_eq!(satisfying_wires(p.gates(), |i| i == 1), None);
/// ```
pub fn satisfying_wires(gates: &[Gate], holds: impl Fn(usize) -> bool) -> Option<Vec<usize>> {
    let n = gates.len();
    let mut sets: Vec<Option<Vec<usize>>> = (0..=2 * n).map(|i| (i <= n && holds(i)).then(|| vec![i])).collect();
    for g in gates {
        // Each wire feeds exactly one gate, so its set can be moved out.
        let a = sets.get_mut(g.in0).and_then(Option::take);
        let b = sets.get_mut(g.in1).and_then(Option::take);
        let out = match (g.kind, a, b) {
            (GateKind::And, Some(mut a), Some(b)) => {
                a.extend(b);
                Some(a)
            }
            (GateKind::And, _, _) => None,
            (GateKind::Or, Some(a), Some(b)) => Some(if b.len() < a.len() { b } else { a }),
            (GateKind::Or, x, None) | (GateKind::Or, None, x) => x,
        };
        if let Some(slot) = sets.get_mut(g.out) {
            *slot = out;
        }
    }
    sets.get_mut(2 * n).and_then(Option::take)
}

/// The occurrence number of each label in turn: how many earlier labels
/// are the same (0 for the first). The scheme gives each repeated copy of
/// a label its own key slot (the paper's ρ numbering, from 0); this is
/// [`Leaf::occurrence`].
///
/// ```
/// assert_eq!(keyfence_policy::occurrence_numbers(["a", "b", "a", "a"]), vec![0, 0, 1, 2]);
/// ```
pub fn occurrence_numbers<'a>(labels: impl IntoIterator<Item = &'a str>) -> Vec<usize> {
    let mut seen = std::collections::HashMap::<&str, usize>::new();
    labels
        .into_iter()
        .map(|l| {
            let c = seen.entry(l).or_insert(0);
            *c += 1;
            *c - 1
        })
        .collect()
}
