"""Authority.where (issue 61): typed results that agree with a second
evaluation written here, over a fleet the authority issued and one it
imported; traffic projected to the nearest satisfying group; bad input
raised as keyfence's own errors."""

from __future__ import annotations

import pathlib
import random

import pytest

import keyfence
from keyfence import wrap


def holds(policy: tuple, attrs: dict[str, str], negated: bool = False) -> bool:
    """The policy language's semantics, written again: `not` pushed to the
    leaves, `not L: v` only where L is present with another value."""
    op = policy[0]
    if op == "leaf":
        _, label, value = policy
        return label in attrs and ((attrs[label] == value) != negated)
    if op == "not":
        return holds(policy[1], attrs, not negated)
    a, b = holds(policy[1], attrs, negated), holds(policy[2], attrs, negated)
    return (a and b) if (op == "and") != negated else (a or b)


def text(policy: tuple) -> str:
    op = policy[0]
    if op == "leaf":
        return f"{policy[1]}: {policy[2]}"
    if op == "not":
        return f"not ({text(policy[1])})"
    return f"({text(policy[1])}) {op} ({text(policy[2])})"


LABELS = {"region": ["EU", "NA", "APAC"], "country": ["DE", "GB", "US", "JP"], "tier": ["gold", "silver"]}


def random_policy(rng: random.Random, depth: int) -> tuple:
    if depth == 0 or rng.random() < 0.3:
        label = rng.choice(sorted(LABELS))
        return ("leaf", label, rng.choice(LABELS[label]))
    op = rng.choice(["not", "and", "or", "and"])
    if op == "not":
        return ("not", random_policy(rng, depth - 1))
    return (op, random_policy(rng, depth - 1), random_policy(rng, depth - 1))


def test_where_agrees_with_a_second_evaluator(store: pathlib.Path) -> None:
    auth = wrap.Authority.init(store)
    rng = random.Random(61)
    fleet: dict[str, dict[str, str]] = {}
    lines = []
    for i in range(120):
        attrs = {label: rng.choice(values) for label, values in LABELS.items() if rng.random() < 0.8}
        attrs["dc"] = f"dc{i % 9}"
        mid = f"{i:032x}"
        fleet[mid] = dict(attrs, machine=mid)
        lines.append(mid + "\t" + ",".join(f"{k}={v}" for k, v in sorted(attrs.items())))
    assert auth.import_inventory("\n".join(lines) + "\n", name="fleet.tsv") == 120
    issued = wrap.Machine(auth.issue({"region": "EU", "dc": "dc0"}), store).id
    fleet[issued] = {"region": "EU", "dc": "dc0", "machine": issued}
    for round in range(80):
        p = random_policy(rng, 1 + round % 4)
        r = auth.where(text(p), by="dc", machines=True)
        assert isinstance(r, wrap.WhereResult)
        want = {mid for mid, attrs in fleet.items() if holds(p, attrs)}
        assert set(r.machines) == want, text(p)
        assert (r.total, r.matching) == (len(fleet), len(want))
        for g in r.groups:
            assert isinstance(g, wrap.WhereGroup)
            members = [a for a in fleet.values() if a["dc"] == g.value]
            assert (g.total, g.matching) == (len(members), sum(holds(p, a) for a in members)), (text(p), g)
            assert g.own_rps is None and g.received_rps is None


def test_traffic_goes_to_the_nearest_group_that_can_open_it(store: pathlib.Path) -> None:
    auth = wrap.Authority.init(store)
    for dc, region, country in [("fra1", "EU", "DE"), ("ams1", "EU", "NL"), ("lhr1", "EU", "GB"), ("ord1", "NA", "US")]:
        auth.issue({"dc": dc, "region": region, "country": country})
    r = auth.where(
        "region: EU and not country: GB",
        by="dc",
        traffic={"fra1": 100, "ams1": 50, "lhr1": 300, "ord1": 8000},
        latency={("lhr1", "ams1"): 8, ("lhr1", "fra1"): 12, ("ord1", "ams1"): 90, ("ord1", "fra1"): 90},
    )
    assert r.group("lhr1").sends_to == "ams1" and r.group("ord1").sends_to == "ams1"  # a tie: the first that sorts
    assert r.group("ams1").received_rps == 8300 and r.group("fra1").received_rps == 0
    assert r.group("ams1").load_rps == 8350
    assert [g.value for g in r.warnings] == ["ams1"]
    assert r.remote_share == pytest.approx(8300 / 8450)
    calm = auth.where("region: EU and not country: GB", by="dc", traffic={"fra1": 100, "ams1": 50, "lhr1": 300, "ord1": 8000}, near="region", warn_ratio=1000)
    assert calm.group("lhr1").sends_to == "ams1" and not calm.warnings
    none = auth.where("region: MARS", by="dc")
    assert none.matching == 0 and all(not g.satisfies for g in none.groups)


def test_bad_input_raises_keyfence_errors(store: pathlib.Path) -> None:
    auth = wrap.Authority.init(store)
    with pytest.raises(keyfence.PolicySyntaxError):
        auth.where("region: EU)")
    with pytest.raises(keyfence.InvalidArgument):
        auth.where("region: EU", traffic={"fra1": 1.0})  # traffic needs by
    with pytest.raises(keyfence.InvalidArgument):
        auth.where("region: EU", by="dc", traffic={"fra1": -1.0})
    with pytest.raises(keyfence.InvalidArgumentType):
        auth.where("region: EU", by="dc", traffic=[("fra1", 1.0)])  # type: ignore[arg-type]
    with pytest.raises(keyfence.InvalidArgumentType):
        auth.where("region: EU", by="dc", traffic={"fra1": 1.0}, latency={"fra1": 1.0})  # type: ignore[dict-item]
    with pytest.raises(keyfence.InvalidArgument) as e:
        auth.import_inventory(f"{0:032x}\tdc=a\nnot-an-id\tdc=b\n", name="fleet.tsv")
    assert "fleet.tsv, line 2, field id" in str(e.value)
