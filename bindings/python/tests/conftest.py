"""Shared fixtures: one CP-ABE authority per session, keys made by
pyca/cryptography (an implementation no one here wrote), and the CIRCL
oracle from vectors/circl-oracle."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import threading
from typing import Callable, Dict, Iterator, Optional, Tuple

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


class KeyAgent:
    """A `keyfence agent` (docs/deploy.md) on ``socket`` in ``dir``, with
    the store and machine key (``country=US``) only it reads, and in the
    same folder what a client has: ``key.env`` and ``rsa.env`` (keys
    wrapped under ``country: US``, their public halves ``key.pub`` and
    ``rsa.pub``) and ``fr.env`` (under ``country: FR``, which the agent's
    machine may not open). Made with the command line, as an operator
    would."""

    def __init__(self, cli: pathlib.Path, d: pathlib.Path) -> None:
        self.cli = cli
        self.dir = d
        self.socket = d / "agent.sock"
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.reader: Optional[threading.Thread] = None
        self.starts = 0

    def run(self, *args: str) -> None:
        subprocess.run([str(self.cli), *args], cwd=self.dir, check=True, timeout=120, capture_output=True)

    def make_world(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run("authority", "init", "--store", "store")
        self.run("authority", "issue", "--store", "store", "--attrs", "country=US", "--out", "machine.key")
        for name, key in (
            ("key", ec.generate_private_key(ec.SECP256R1())),
            ("rsa", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        ):
            (self.dir / f"{name}.pem").write_bytes(_pem(key))
            (self.dir / f"{name}.pub").write_bytes(
                key.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )
            self.run("authority", "wrap", "--store", "store", "--policy", "country: US", "--in", f"{name}.pem", "--out", f"{name}.env")
        self.run("authority", "wrap", "--store", "store", "--policy", "country: FR", "--in", "key.pem", "--out", "fr.env")
        # The agent reads the servers' copy, without the authority's secrets.
        self.run("authority", "export", "--store", "store", "--to", "served")
        # From here on only the envelopes hold the keys.
        for name in ("key", "rsa"):
            (self.dir / f"{name}.pem").unlink()

    def start(self, wait: float = 30.0) -> None:
        """Starts the agent and waits (at most `wait` seconds) for its
        `listening` line."""
        assert self.proc is None, "the agent runs already"
        self.starts += 1
        log = open(self.dir / f"agent-{self.starts}.log", "wb")
        proc = subprocess.Popen(
            [str(self.cli), "agent", "--socket", str(self.socket), "--store", "served", "--machine-key", "machine.key"],
            cwd=self.dir,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        log.close()
        self.proc = proc
        listening = threading.Event()

        def read() -> None:
            assert proc.stdout
            for line in proc.stdout:
                if line.startswith(b"listening"):
                    listening.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not listening.wait(wait):
            self.kill()
            raise AssertionError(f"the agent did not start in {wait} s: {(self.dir / f'agent-{self.starts}.log').read_text()}")

    def kill(self) -> None:
        """Kills the agent by its pid (SIGKILL: it leaves its socket file,
        as a crash would) and reaps it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
        # Its output ended with it: the reader has seen the end.
        if self.reader:
            self.reader.join(timeout=10)
        if proc.stdout:
            proc.stdout.close()


@pytest.fixture()
def key_agent(keyfence_cli: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[KeyAgent]:
    """A running key agent and the envelopes its clients load (KeyAgent);
    killed afterwards, whatever the test did."""
    agent = KeyAgent(keyfence_cli, tmp_path / "agent")
    agent.make_world()
    try:
        agent.start()
        yield agent
    finally:
        agent.kill()
