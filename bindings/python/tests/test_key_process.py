"""The key process from Python: the package ships keyfence-key-process
beside the native module, and the library finds it there (never on PATH)."""

from __future__ import annotations

import asyncio
import os
import pathlib
from typing import Any, Dict

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding

import keyfence
from keyfence import sign

PACKAGE = pathlib.Path(keyfence.__file__).parent


def test_key_process_ships_beside_the_module() -> None:
    key_process = PACKAGE / "keyfence-key-process"
    assert key_process.is_file() and os.access(key_process, os.X_OK)
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
    with sign.Engine(isolated=True, key_process=PACKAGE / "keyfence-key-process") as engine:
        key = sign.PrivateKey.from_pem(pems["ed25519"], engine=engine)
        assert len(engine.sign_sync(key, "ed25519", b"m")) == 64


def test_missing_key_process_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(keyfence.InvalidConfig, match="does not exist"):
        sign.Engine(isolated=True, key_process=tmp_path / "no-such-key-process")


def test_an_envelope_opened_by_the_key_process(tmp_path: pathlib.Path, pems: Dict[str, bytes], pyca_keys: Dict[str, Any]) -> None:
    """PrivateKey.load_envelope with an isolated engine: the key process
    opens the envelope, and this process reads only the machine key's
    public part (the memory test of the same C call is
    bindings/c/tests/test_isolation_memory.c); the same typed refusals as
    opening it here."""
    store = tmp_path / "store"
    authority = keyfence.wrap.Authority.init(store)
    envelope = authority.wrap("region: EU", pems["p256"])
    fra1, sfo1 = tmp_path / "fra1.machine", tmp_path / "sfo1.machine"
    fra1.write_bytes(authority.issue({"region": "EU", "country": "DE"}))
    sfo1.write_bytes(authority.issue({"region": "NA", "country": "US"}))
    authority.close()
    for isolated in (True, False):
        with sign.Engine(isolated=isolated) as engine:
            key = sign.PrivateKey.load_envelope(store, fra1, envelope, engine=engine)
            assert key.is_local is not isolated
            sig = engine.sign_sync(key, "ecdsa-p256-sha256", b"opened elsewhere")
            pyca_keys["p256"].public_key().verify(sig, b"opened elsewhere", ec.ECDSA(hashes.SHA256()))
            with pytest.raises(keyfence.PolicyNotSatisfied):
                sign.PrivateKey.load_envelope(store, sfo1, envelope, engine=engine)
            with pytest.raises(keyfence.ResourceError, match="machine key"):
                sign.PrivateKey.load_envelope(store, tmp_path / "missing", envelope, engine=engine)
            with pytest.raises(keyfence.InvalidEnvelope):
                sign.PrivateKey.load_envelope(store, fra1, b"junk", engine=engine)


def test_a_closed_engines_keys_fail_with_shut_down(pems: Dict[str, bytes]) -> None:
    """Closing an isolated engine ends its key process on purpose: its keys
    then fail as shut down, on that engine and on any other, never as a
    key process that died (of the SIGKILL the close sent it)."""
    engine = sign.Engine(isolated=True)
    key = engine.load_key(pems["p256"])
    assert engine.sign_sync(key, "ecdsa-p256-sha256", b"before")
    engine.close()
    with pytest.raises(keyfence.ShutDown, match="closed"):
        engine.sign_sync(key, "ecdsa-p256-sha256", b"after")
    with sign.Engine() as other:
        for attempt in (
            lambda: other.sign_sync(key, "ecdsa-p256-sha256", b"after"),
            lambda: asyncio.run(other.sign(key, "ecdsa-p256-sha256", b"after")),
        ):
            with pytest.raises(keyfence.ShutDown) as e:
                attempt()
            assert e.value.code == "SHUT_DOWN" and not isinstance(e.value, keyfence.BackendFailed)
            assert "SIGKILL" not in str(e.value) and "died" not in str(e.value), str(e.value)


def test_signatures_in_flight_when_an_isolated_engine_closes(pems: Dict[str, bytes], pyca_keys: Dict[str, Any]) -> None:
    """Queued, at the key process or on their way back when the engine
    closes: each one signs, or fails with ShutDown (RSA, so that closing
    finds many still at the key process)."""

    async def main() -> list[Any]:
        engine = sign.Engine(isolated=True, rsa_threads=1)
        key = engine.load_key(pems["rsa2048"])
        tasks = [asyncio.ensure_future(engine.sign(key, "rsa-pss-sha256", b"%d" % i)) for i in range(400)]
        await asyncio.sleep(0)  # every task has submitted its operation
        engine.close()
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)

    results = asyncio.run(main())
    public = pyca_keys["rsa2048"].public_key()
    for i, r in enumerate(results):
        if isinstance(r, bytes):
            public.verify(r, b"%d" % i, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())
        else:
            assert isinstance(r, keyfence.ShutDown), repr(r)
    assert any(isinstance(r, keyfence.ShutDown) for r in results)
