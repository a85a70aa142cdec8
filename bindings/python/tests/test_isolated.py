"""The isolated key process from Python: the package ships keyfence-keyd
beside the native module, and the library finds it there (never on PATH)."""

from __future__ import annotations

import asyncio
import os
import pathlib
from typing import Any, Dict

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

import keyfence
from keyfence import sign

PACKAGE = pathlib.Path(keyfence.__file__).parent


def test_key_process_ships_beside_the_module() -> None:
    keyd = PACKAGE / "keyfence-keyd"
    assert keyd.is_file() and os.access(keyd, os.X_OK)
    assert any(p.name.startswith("libkeyfence.so") for p in PACKAGE.iterdir())


def test_isolated_engine_signs(pems: Dict[str, bytes], pyca_keys: Dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # found beside the library, not on PATH

    async def main() -> None:
        with sign.Engine(isolated=True) as engine:
            key = engine.load_key(pems["p256"])
            sigs = await asyncio.gather(*(engine.sign(key, "ecdsa-p256-sha256", b"%d" % i) for i in range(200)))
            for i, s in enumerate(sigs):
                pyca_keys["p256"].public_key().verify(s, b"%d" % i, ec.ECDSA(hashes.SHA256()))
            assert engine.sign_sync(key, "ecdsa-p256-sha256", b"m")
            assert sum(c["completed"] for c in engine.metrics().values()) >= 201

    asyncio.run(main())


def test_explicit_key_process_path(pems: Dict[str, bytes]) -> None:
    with sign.Engine(isolated=True, key_process=PACKAGE / "keyfence-keyd") as engine:
        key = sign.PrivateKey.from_pem(pems["ed25519"], engine=engine)
        assert len(engine.sign_sync(key, "ed25519", b"m")) == 64


def test_missing_key_process_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(keyfence.InvalidConfig, match="does not exist"):
        sign.Engine(isolated=True, key_process=tmp_path / "no-such-keyd")
