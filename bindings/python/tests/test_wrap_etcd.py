"""The store named by one string, from Python: an etcd cluster (three
members on loopback, vectors/etcd-fixture.sh) and a directory, each with
a machine that follows the store and sees a rotation arrive through the
watch."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time
from typing import Iterator

import pytest

import keyfence
from keyfence import wrap

REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The endpoints of a running cluster (killed afterwards, by process group)."""
    work = tmp_path_factory.mktemp("etcd")
    r = subprocess.run(
        ["bash", str(REPO / "vectors" / "etcd-fixture.sh"), str(work)], capture_output=True, text=True, timeout=400
    )
    if r.returncode == 77:
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
    try:
        yield (work / "endpoints").read_text().strip()
    finally:
        for group in (work / "pids").read_text().split():
            try:
                os.killpg(int(group), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _wait_for_rotation(m: wrap.Machine) -> dict[str, int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        s = m.cache_stats()
        if s["propagations"] >= 1:
            return s
        time.sleep(0.01)
    raise AssertionError(f"no rotation reached the machine in 30 s: {m.cache_stats()}")


def _wrap_open_follow(store: str) -> None:
    auth = wrap.Authority.init(store)
    env = auth.wrap("region: EU", b"customer secret")
    m = wrap.Machine(auth.issue({"region": "EU"}), store)
    assert m.open(env) == b"customer secret"
    m.follow()
    m.follow()  # a second call changes nothing
    before = m.cache_stats()
    assert before["propagations"] == 0 and before["misses"] == 1 and before["entries"] == 1
    assert auth.rotate_master() == 1
    after = _wait_for_rotation(m)
    assert after["watch_events"] >= 1 and after["resyncs"] == 0
    assert after["propagation_last_us"] <= after["propagation_max_us"] < 30_000_000
    assert m.open(env) == b"customer secret"
    # The same authority, opened again from its name.
    assert wrap.Authority.open(store).issue({"region": "EU"})


def test_wrap_open_and_follow_on_etcd(etcd: str) -> None:
    _wrap_open_follow(f"etcd://{etcd}/python")


def test_wrap_open_and_follow_on_a_directory(tmp_path: pathlib.Path) -> None:
    _wrap_open_follow(str(tmp_path / "store"))


def test_a_bad_etcd_name_is_refused_before_any_request() -> None:
    with pytest.raises(keyfence.InvalidArgument) as e:
        wrap.Authority.open("etcd://no-port/kf")
    assert "HOST:PORT" in str(e.value)
