"""CIRCL interop through Python: keys and ciphertexts made by Cloudflare
CIRCL's tkn20 (the Go oracle in vectors/circl-oracle) load and decrypt here,
and ciphertexts made here decrypt in Go."""

from __future__ import annotations

import pathlib
import subprocess

from keyfence import abe

POLICY = "(region: EU or region: UK) and not country: FR"


def go(oracle: pathlib.Path, *args: str) -> str:
    return subprocess.run([str(oracle), *args], check=True, capture_output=True, text=True).stdout


def test_circl_made_keys_and_ciphertexts_decrypt_here(oracle: pathlib.Path, tmp_path: pathlib.Path) -> None:
    pk, msk, key, ct, msg = (tmp_path / n for n in ("pk", "msk", "key", "ct", "msg"))
    go(oracle, "setup", "--pk", str(pk), "--msk", str(msk))
    go(oracle, "keygen", "--msk", str(msk), "--attrs", "region=UK,country=DE", "--out", str(key))
    msg.write_bytes(b"made in Go")
    go(oracle, "encrypt", "--pk", str(pk), "--policy", POLICY, "--in", str(msg), "--out", str(ct))
    k = abe.AttributeKey.from_bytes(key.read_bytes())
    assert abe.decrypt(k, ct.read_bytes()) == b"made in Go"
    # Keys made here from CIRCL's master key decrypt CIRCL's ciphertexts too.
    ours = abe.keygen(abe.MasterSecretKey.from_bytes(msk.read_bytes()), {"region": "EU", "country": "ES"})
    assert abe.decrypt(ours, ct.read_bytes()) == b"made in Go"


def test_python_made_ciphertexts_decrypt_in_go(oracle: pathlib.Path, tmp_path: pathlib.Path) -> None:
    pk, msk = abe.setup()
    key = abe.keygen(msk, {"region": "UK", "country": "DE"})
    (tmp_path / "key").write_bytes(key.to_bytes())
    (tmp_path / "ct").write_bytes(abe.encrypt(pk, POLICY, b"made in Python"))
    go(oracle, "decrypt", "--key", str(tmp_path / "key"), "--in", str(tmp_path / "ct"), "--out", str(tmp_path / "pt"))
    assert (tmp_path / "pt").read_bytes() == b"made in Python"
    shown = go(oracle, "inspect", "--in", str(tmp_path / "ct"))
    assert "region" in shown
