"""Shared fixtures: one CP-ABE authority per session, keys made by
pyca/cryptography (an implementation no one here wrote), and the CIRCL
oracle from vectors/circl-oracle."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import threading
from typing import Callable, Dict, Iterator, Tuple

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

import keyfence

REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def authority() -> Tuple[keyfence.abe.PublicKey, keyfence.abe.MasterSecretKey]:
    return keyfence.abe.setup()


def _pem(key: object) -> bytes:
    return key.private_bytes(  # type: ignore[attr-defined,no-any-return]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.fixture(scope="session")
def pyca_keys() -> Dict[str, object]:
    """Private keys of each kind, as pyca/cryptography objects."""
    return {
        "p256": ec.generate_private_key(ec.SECP256R1()),
        "p384": ec.generate_private_key(ec.SECP384R1()),
        "rsa2048": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ed25519": ed25519.Ed25519PrivateKey.generate(),
    }


@pytest.fixture(scope="session")
def pems(pyca_keys: Dict[str, object]) -> Dict[str, bytes]:
    return {name: _pem(k) for name, k in pyca_keys.items()}


@pytest.fixture(scope="session")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """CIRCL's tkn20 driven from the command line (vectors/circl-oracle).
    ./x test builds it once and passes KEYFENCE_CIRCL_ORACLE; Go is part of
    the toolchain, so without either this fails rather than skips."""
    env = os.environ.get("KEYFENCE_CIRCL_ORACLE")
    if env:
        return pathlib.Path(env)
    out = tmp_path_factory.mktemp("oracle") / "circl-oracle"
    go = shutil.which("go")
    assert go, "Go is required to build the CIRCL oracle (vectors/circl-oracle)"
    subprocess.run([go, "build", "-o", str(out), "."], cwd=REPO / "vectors" / "circl-oracle", check=True)
    return out


@pytest.fixture(scope="session")
def in_threads() -> Callable[[int, Callable[[int], None]], None]:
    """Runs work(i) on n threads at once (i from 0) and waits for them all."""

    def run(n: int, work: Callable[[int], None]) -> None:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    return run


@pytest.fixture()
def store(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    yield tmp_path / "store"


@pytest.fixture(scope="session")
def keyfence_cli() -> pathlib.Path:
    """The `keyfence` command line, which runs the key servers of the remote
    tests. ./x test passes KEYFENCE_CLI; otherwise cargo builds it (Rust is
    part of the toolchain, so this fails rather than skips)."""
    env = os.environ.get("KEYFENCE_CLI")
    if env:
        return pathlib.Path(env)
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    subprocess.run(["cargo", "build", "--locked", "-q", "-p", "keyfence-cli", "--bin", "keyfence"], cwd=REPO, check=True)
    return target / "debug" / "keyfence"


@pytest.fixture()
def key_server(keyfence_cli: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A `keyfence serve` for a US-only key on loopback, with its
    certificates, store and machine keys, from vectors/remote-fixture.sh
    (the fixture the C and Node tests run too); killed afterwards."""
    d = tmp_path / "remote"
    subprocess.run(["bash", str(REPO / "vectors" / "remote-fixture.sh"), str(keyfence_cli), str(d)], check=True, timeout=120)
    try:
        yield d
    finally:
        try:
            os.kill(int((d / "server.pid").read_text()), 9)
        except ProcessLookupError:
            pass
