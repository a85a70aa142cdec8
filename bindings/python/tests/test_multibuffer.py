"""The multi-buffer device through Python (``Engine(offload=...)``), in
this process and in the key process, on the stand-in crypto_mb
(vectors/crypto-mb-stand-in/: Intel's names and ABI, each lane signed
with OpenSSL, on any CPU). The stand-in's log shows the lanes it signed
together; pyca/cryptography verifies every signature."""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import subprocess
from typing import Any, Dict, List, Tuple

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

import keyfence
from keyfence import sign

REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    cc = shutil.which("cc")
    assert cc, "a C compiler builds the stand-in crypto_mb (./x setup installs one)"
    out = tmp_path_factory.mktemp("crypto-mb") / "libcrypto_mb_stand_in.so"
    src = REPO / "vectors" / "crypto-mb-stand-in" / "crypto_mb_stand_in.c"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(src), "-lcrypto"], check=True)
    return out


def _grouped(log: pathlib.Path, what: str) -> List[Tuple[str, int, int]]:
    """The calls of more than one lane of `what` the stand-in logged."""
    calls = []
    for line in log.read_text().splitlines() if log.exists() else []:
        kind, bits, lanes = line.split()[:3]
        calls.append((kind, int(bits), int(lanes)))
    return [c for c in calls if f"{c[0]} {c[1]}" == what and c[2] > 1]


@pytest.mark.parametrize("isolated", [False, True], ids=["in-process", "isolated"])
def test_an_engine_signs_in_groups_on_the_device(
    isolated: bool,
    stand_in: pathlib.Path,
    pems: Dict[str, bytes],
    pyca_keys: Dict[str, Any],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The key process, under its sandbox, may write only a token's folder.
    log = tmp_path / "calls.log"
    monkeypatch.setenv("KF_MB_LOG", str(log))
    monkeypatch.setenv("KEYFENCE_PKCS11_TOKEN_DIRS", str(tmp_path))

    async def main() -> None:
        with sign.Engine(isolated=isolated, offload="on", crypto_mb=stand_in) as engine:
            key = engine.load_key(pems["p256"])
            sigs = await asyncio.gather(*(engine.sign(key, "ecdsa-p256-sha256", b"%d" % i) for i in range(64)))
            for i, s in enumerate(sigs):
                pyca_keys["p256"].public_key().verify(s, b"%d" % i, ec.ECDSA(hashes.SHA256()))

    asyncio.run(main())
    assert _grouped(log, "ecdsa 256"), log.read_text() if log.exists() else "no log"


def test_off_never_calls_the_library(stand_in: pathlib.Path, pems: Dict[str, bytes], tmp_path: pathlib.Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("KF_MB_LOG", str(log))

    async def main() -> None:
        with sign.Engine(offload="off", crypto_mb=stand_in) as engine:
            key = engine.load_key(pems["p256"])
            await asyncio.gather(*(engine.sign(key, "ecdsa-p256-sha256", b"%d" % i) for i in range(64)))

    asyncio.run(main())
    assert not log.exists() or not log.read_text()


def test_bad_settings_say_what_is_wrong(stand_in: pathlib.Path, pems: Dict[str, bytes], tmp_path: pathlib.Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(keyfence.InvalidConfig, match="off, on or auto"):
        sign.Engine(offload="maybe")
    with pytest.raises(keyfence.InvalidArgumentType, match="offload must be str"):
        sign.Engine(offload=1)  # type: ignore[arg-type]
    with pytest.raises(keyfence.InvalidConfig, match="set the offload mode too"):
        sign.Engine(crypto_mb=stand_in)
    with pytest.raises(keyfence.InvalidConfig, match="choose their own"):
        sign.Engine(agent=tmp_path / "agent.sock", offload="on")
    # `on` where crypto_mb says nothing runs on this CPU: refused, saying
    # why; `auto` signs in software.
    monkeypatch.setenv("KF_MB_MODE", "unsupported")
    with pytest.raises(keyfence.BackendFailed, match="crypto_mb"):
        sign.Engine(offload="on", crypto_mb=stand_in)
    with sign.Engine(offload="auto", crypto_mb=stand_in) as engine:
        assert engine.sign_sync(engine.load_key(pems["p256"]), "ecdsa-p256-sha256", b"m")

