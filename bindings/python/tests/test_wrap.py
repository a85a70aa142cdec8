from __future__ import annotations

import pathlib
import threading
from typing import Callable

import pytest

import keyfence
from keyfence import wrap


def test_authority_and_machines(store: pathlib.Path) -> None:
    auth = wrap.Authority.init(store)  # os.PathLike
    env = auth.wrap("region: EU", b"customer secret")
    eu = wrap.Machine(auth.issue({"region": "EU"}), str(store))
    us = wrap.Machine(auth.issue({"region": "US"}), store)
    assert eu.could_open(env) and not us.could_open(env)
    assert eu.open(env) == b"customer secret"
    assert eu.open(bytearray(env)) == b"customer secret"  # cached policy key now
    with pytest.raises(keyfence.PolicyNotSatisfied):
        us.open(env)


def test_rotation_keeps_envelopes_open(store: pathlib.Path) -> None:
    auth = wrap.Authority.init(store)
    env = auth.wrap("region: EU", b"s1")
    auth.wrap("region: US", b"s2")
    assert auth.rotate_master() == 2
    reopened = wrap.Authority.open(store)
    m = wrap.Machine(reopened.issue({"region": "EU"}), store)
    assert m.open(env) == b"s1"


def test_store_errors(store: pathlib.Path, tmp_path: pathlib.Path) -> None:
    # Opening never creates a store: a mistyped name is a store I/O error
    # that says so, and nothing is made there.
    with pytest.raises(keyfence.StoreIOError) as e:
        wrap.Authority.open(store)
    assert isinstance(e.value, keyfence.StoreError)
    assert "is not a keyfence store" in str(e.value)
    assert not store.exists()
    wrap.Authority.init(store)
    # A store inside another, or around one, is refused with nothing made.
    with pytest.raises(keyfence.InvalidArgument, match="lies inside the keyfence store"):
        wrap.Authority.init(store / "sealed" / "inner")
    assert not (store / "sealed" / "inner").exists()
    with pytest.raises(keyfence.InvalidArgument, match="holds the keyfence store"):
        wrap.Authority.init(store.parent)
    with pytest.raises(keyfence.AuthorityExists):
        wrap.Authority.init(store)
    afile = tmp_path / "a-file"
    afile.write_bytes(b"")
    with pytest.raises(keyfence.StoreError):
        wrap.Authority.init(afile)


def test_envelope_and_key_errors(store: pathlib.Path) -> None:
    auth = wrap.Authority.init(store)
    env = bytearray(auth.wrap("region: EU", b"secret"))
    m = wrap.Machine(auth.issue({"region": "EU"}), store)
    env[-1] ^= 1
    with pytest.raises(keyfence.InvalidEnvelope) as e:
        m.open(bytes(env))
    assert isinstance(e.value, ValueError)
    with pytest.raises(keyfence.InvalidEnvelope):
        m.could_open(b"\x00\x01")
    with pytest.raises((keyfence.InvalidKey, keyfence.InvalidEnvelope)):
        wrap.Machine(b"not a machine key", store)
    with pytest.raises(keyfence.PolicySyntaxError) as pe:
        auth.wrap("region: EU or", b"s")
    assert pe.value.position == 13
    with pytest.raises(keyfence.InvalidAttributes):
        auth.issue({"region": ""})
    with pytest.raises(TypeError):
        auth.wrap("region: EU", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        wrap.Machine(b"k", 42)  # type: ignore[arg-type]


def test_closed_authority(store: pathlib.Path) -> None:
    auth = wrap.Authority.init(store)
    auth.close()
    auth.close()
    assert auth.closed
    with pytest.raises(ValueError, match="closed"):
        auth.wrap("a: b", b"s")
    assert "closed" in repr(auth)


def test_authority_in_a_with_block(store: pathlib.Path) -> None:
    # Leaving the block closes it (wiping its master keys), as Engine and
    # RemoteSigner do; on an exception too.
    with wrap.Authority.init(store) as auth:
        assert isinstance(auth, wrap.Authority) and not auth.closed
        env = auth.wrap("region: EU", b"s")
    assert auth.closed
    with pytest.raises(keyfence.InvalidArgument, match="closed"):
        auth.wrap("region: EU", b"s")
    with pytest.raises(RuntimeError):
        with wrap.Authority.open(store) as again:
            machine_key = again.issue({"region": "EU"})
            raise RuntimeError("the block failed")
    assert again.closed
    assert wrap.Machine(machine_key, store).open(env) == b"s"


def test_one_authority_from_many_threads(
    store: pathlib.Path, in_threads: Callable[[int, Callable[[int], None]], None]
) -> None:
    # The C handle needs exclusive use for wrap; the binding serialises it.
    auth = wrap.Authority.init(store)
    envs: list[bytes] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        for j in range(5):
            e = auth.wrap(f"team: t{i % 3}", f"{i}-{j}".encode())
            with lock:
                envs.append(e)

    in_threads(6, work)
    machines = {i: wrap.Machine(auth.issue({"team": f"t{i}"}), store) for i in range(3)}
    opened = set()
    for e in envs:
        m = next(m for m in machines.values() if m.could_open(e))
        opened.add(m.open(e))
    assert len(opened) == 30


def test_machine_repr_hides_the_key(store: pathlib.Path) -> None:
    auth = wrap.Authority.init(store)
    key = auth.issue({"region": "EU"})
    m = wrap.Machine(key, store)
    assert key.hex() not in repr(m) and "secret" in repr(m)


def test_a_revocation_names_the_envelopes_that_open_nowhere_now(store: pathlib.Path) -> None:
    auth = wrap.Authority.init(store)
    auth.wrap("region: EU", b"customer secret")
    m = wrap.Machine(auth.issue({"region": "EU"}), store)
    (store / "envelopes" / ("0" * 32)).write_bytes(b"KFE2 garbage")
    r = auth.revoke(m.id)
    assert r.rewrapped == 1
    (skipped,) = r.skipped
    assert isinstance(skipped, wrap.SkippedEnvelope)
    assert (skipped.name, skipped.reason) == ("envelopes/" + "0" * 32, "malformed")
    assert skipped.message.startswith("not an envelope"), skipped.message


def test_revoking_a_machine(store: pathlib.Path) -> None:
    auth = wrap.Authority.init(store)
    handed = auth.wrap("region: EU", b"customer secret")
    thief = wrap.Machine(auth.issue({"region": "EU"}), store)
    peer = wrap.Machine(auth.issue({"region": "EU"}), store)
    assert len(thief.id) == 32 and thief.id != peer.id
    assert thief.open(handed) == b"customer secret"  # its cache now holds the policy key
    r = auth.revoke(thief.id)
    assert isinstance(r, wrap.Revocation)
    assert (r.id, r.already, r.rekeyed, r.rewrapped, r.retired, r.skipped) == (thief.id, False, 1, 1, 1, ())
    assert r.rekeyed_after_ms > 0
    again = auth.revoke(thief.id)  # already revoked: nothing is done
    assert (again.already, again.rewrapped, again.rekeyed_after_ms) == (True, 0, 0.0)
    (served,) = (store / "envelopes").iterdir()
    with pytest.raises(keyfence.MachineRevoked):
        thief.open(served.read_bytes())
    assert peer.open(served.read_bytes()) == b"customer secret"
    with pytest.raises(keyfence.MachineRevoked):
        auth.issue({"region": "EU", "machine": thief.id})
    with pytest.raises(keyfence.InvalidAttributes):
        auth.revoke("not an id")
