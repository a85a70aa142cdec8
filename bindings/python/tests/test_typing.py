"""The type stubs: mypy --strict accepts the package and a program using
it, rejects a misuse, and stubtest finds the native module as described."""

from __future__ import annotations

import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", *args], capture_output=True, text=True)


def test_package_and_usage_type_check() -> None:
    for target in (["-p", "keyfence"], [str(HERE / "typed_usage.py")]):
        r = mypy("--strict", *target)
        assert r.returncode == 0, r.stdout + r.stderr


def test_misuse_is_caught(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from keyfence import abe\n"
        "pk, msk = abe.setup()\n"
        "abe.encrypt(msk, 'a: b', b'x')\n"  # a master key where the public key goes
        "abe.decrypt(abe.keygen(msk, {'a': 'b'}), 'text')\n"  # str where bytes go
    )
    r = mypy("--strict", str(bad))
    assert r.returncode == 1 and r.stdout.count("error:") == 2, r.stdout


def test_the_engine_argument_is_typed(tmp_path: pathlib.Path) -> None:
    """engine= takes a keyfence.sign.Engine or None, not Any: anything else
    is caught before it runs (typed_usage.py passes both)."""
    bad = tmp_path / "bad_engine.py"
    bad.write_text(
        "from keyfence import sign, wrap\n"
        "sign.PrivateKey.from_pem(b'', engine='an engine')\n"
        "sign.PrivateKey.from_envelope(wrap.Machine(b'', 's'), b'', engine=object())\n"
        "sign.PrivateKey.load_envelope(b'', engine=1)\n"
    )
    r = mypy("--strict", str(bad))
    assert r.returncode == 1 and r.stdout.count("error:") == 3, r.stdout
    assert r.stdout.count('"Engine | None"') + r.stdout.count('"Optional[Engine]"') >= 2, r.stdout


def test_stubs_match_the_native_module() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "keyfence._core", "--allowlist", str(HERE / "stubtest-allowlist.txt")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
