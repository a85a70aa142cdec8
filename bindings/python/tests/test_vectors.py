"""The vector file every language runs (vectors/shared.kfv, format in
vectors/README.md): the Python binding gives the same answers and error
codes as the Rust core, the C ABI and Node."""

from __future__ import annotations

import pathlib
from typing import Dict, List, Tuple

import pytest

import keyfence
from keyfence import abe, policy

FILE = pathlib.Path(__file__).resolve().parents[3] / "vectors" / "shared.kfv"


def load() -> List[List[Tuple[str, str]]]:
    vectors, cur = [], []
    for line in FILE.read_text(encoding="utf-8").splitlines() + [""]:
        if line.startswith("#"):
            continue
        if not line:
            if cur:
                vectors.append(cur)
                cur = []
            continue
        k, v = line.split(": ", 1)
        cur.append((k, v))
    return vectors


VECTORS = load()


def fields(v: List[Tuple[str, str]]) -> Dict[str, str]:
    return {k: val for k, val in v if k != "attribute"}


def attributes(v: List[Tuple[str, str]]) -> Dict[str, str]:
    return dict(val.split("=", 1) for k, val in v if k == "attribute")  # type: ignore[misc]


def outcome(f: object) -> str:
    try:
        r = f()  # type: ignore[operator]
    except keyfence.KeyfenceError as e:
        return f"error {e.code}"
    return r if isinstance(r, str) else "ok"


def test_file_has_every_kind() -> None:
    assert len(VECTORS) >= 20
    assert {fields(v)["kind"] for v in VECTORS} == {"policy-check", "policy-canonical", "abe-decrypt", "abe-key"}


@pytest.mark.parametrize("v", VECTORS, ids=[fields(v)["name"] for v in VECTORS])
def test_vector(v: List[Tuple[str, str]]) -> None:
    f = fields(v)
    kind, expect = f["kind"], f["expect"]
    if kind == "policy-check":
        try:
            got = str(policy.check(f["policy"], attributes(v))).lower()
        except keyfence.PolicySyntaxError as e:
            got = f"error {e.code}"
            assert str(e.position) == f["position"]
        except keyfence.KeyfenceError as e:
            got = f"error {e.code}"
            assert "position" not in f
        assert got == expect
    elif kind == "policy-canonical":
        assert policy.canonical(f["policy"]) == f["canonical"]
    elif kind == "abe-key":
        cls = {"public-key": abe.PublicKey, "master-key": abe.MasterSecretKey, "attribute-key": abe.AttributeKey}
        load = cls[f["object"]].from_bytes
        assert outcome(lambda: load(bytes.fromhex(f["bytes"])) and None) == expect
    elif kind == "abe-decrypt":
        abe.PublicKey.from_bytes(bytes.fromhex(f["public_key"]))
        key = abe.AttributeKey.from_bytes(bytes.fromhex(f["attribute_key"]))
        ct = bytes.fromhex(f["ciphertext"])
        try:
            pt = abe.decrypt(key, ct)
            assert expect == "ok" and pt.hex() == f["plaintext"]
        except keyfence.KeyfenceError as e:
            assert f"error {e.code}" == expect
        if "policy_of" in f:
            assert abe.policy_of(ct) == f["policy_of"]
        if "could_decrypt" in f:
            assert str(abe.could_decrypt(attributes(v), ct)).lower() == f["could_decrypt"]
    else:
        pytest.fail(f"unknown kind {kind}")
