"""A machine's floor kept across processes (issue 55.9): a Machine made
with state=PATH keeps the newest generation list it accepted in that file,
and a NEW process (a subprocess) whose machine names the same file refuses
a store rolled back to an older list with ReplayedObject; one without the
file takes the old list (the control). newest_lists() and require() hand
the floor from one machine to another."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass

import pytest

import keyfence
from keyfence import wrap

SECRET = b"-----BEGIN PRIVATE KEY-----\n..."

# One open in a process that has accepted nothing: prints OK, or the
# error's code and class.
CHILD = r"""
import sys
import keyfence

store, key, envelope, state = sys.argv[1:5]
with open(key, "rb") as f:
    machine_key = f.read()
with open(envelope, "rb") as f:
    env = f.read()
m = keyfence.wrap.Machine(machine_key, store, **({} if state == "-" else {"state": state}))
try:
    assert m.open(env) == %r
    print("OK")
except keyfence.KeyfenceError as e:
    print(e.code, type(e).__name__)
""" % (SECRET,)


@dataclass
class RolledBack:
    """A store whose generation list moved forward (a master rotation),
    a machine key, an envelope, and the list from before the rotation."""

    dir: pathlib.Path
    store: pathlib.Path
    machine_key: bytes
    envelope: bytes
    old_list: bytes

    @property
    def generations(self) -> pathlib.Path:
        return self.store / "public" / "generations"

    def roll_back(self) -> None:
        """What a store writer can do: put back the older list, which the
        authority did sign."""
        self.generations.write_bytes(self.old_list)

    def open_in_new_process(self, state: str) -> str:
        key, env = self.dir / "fra.key", self.dir / "secret.env"
        key.write_bytes(self.machine_key)
        env.write_bytes(self.envelope)
        r = subprocess.run(
            [sys.executable, "-c", CHILD, str(self.store), str(key), str(env), state],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()


@pytest.fixture()
def rolled(tmp_path: pathlib.Path) -> RolledBack:
    store = tmp_path / "store"
    with wrap.Authority.init(store) as auth:
        machine_key = auth.issue({"region": "EU", "country": "DE"})
        envelope = auth.wrap("region: EU", SECRET)
        old_list = (store / "public" / "generations").read_bytes()
        # Generation 1 goes decrypt-only, 2 is active: the old list (1
        # active) goes back on the new one, yet 1 is live in both.
        assert auth.rotate_master() == 1
    return RolledBack(tmp_path, store, machine_key, envelope, old_list)


def test_a_new_process_with_the_state_file_refuses_a_rolled_back_list(rolled: RolledBack) -> None:
    state = rolled.dir / "fra.key.newest"
    m = wrap.Machine(rolled.machine_key, rolled.store, state=state)
    assert m.open(rolled.envelope) == SECRET
    assert state.is_file() and state.read_bytes().startswith(b"KFN2")
    assert oct(os.stat(str(state) + ".lock").st_mode & 0o777) == "0o600"

    rolled.roll_back()
    assert rolled.open_in_new_process(str(state)) == "REPLAYED_OBJECT ReplayedObject"
    # The control: a new process without the file takes the old list.
    assert rolled.open_in_new_process("-") == "OK"
    # A fresh file is no floor either; the refusal above changed nothing.
    assert rolled.open_in_new_process(str(rolled.dir / "fresh.newest")) == "OK"
    assert rolled.open_in_new_process(str(state)) == "REPLAYED_OBJECT ReplayedObject"


def test_newest_lists_hand_the_floor_to_another_machine(rolled: RolledBack) -> None:
    seen = wrap.Machine(rolled.machine_key, rolled.store)
    assert seen.newest_lists() == b"KFN2" + bytes(8)  # nothing accepted yet
    assert seen.open(rolled.envelope) == SECRET
    lists = seen.newest_lists()
    assert lists.startswith(b"KFN2") and len(lists) > 12

    rolled.roll_back()
    required = wrap.Machine(rolled.machine_key, rolled.store)
    required.require(bytearray(lists))
    required.require(memoryview(lists))  # the same floor again: nothing changes
    with pytest.raises(keyfence.ReplayedObject) as e:
        required.open(rolled.envelope)
    assert e.value.code == "REPLAYED_OBJECT" and "generation list" in str(e.value)
    assert required.newest_lists() == lists
    # Not required, the old list is taken.
    assert wrap.Machine(rolled.machine_key, rolled.store).open(rolled.envelope) == SECRET

    # A machine with a state file writes a floor it is required to.
    state = rolled.dir / "required.newest"
    kept = wrap.Machine(rolled.machine_key, str(rolled.store), state=str(state))
    kept.require(lists)
    assert state.read_bytes() == lists
    assert rolled.open_in_new_process(str(state)) == "REPLAYED_OBJECT ReplayedObject"


def test_bad_floors_are_keyfence_errors(rolled: RolledBack, tmp_path: pathlib.Path) -> None:
    m = wrap.Machine(rolled.machine_key, rolled.store)
    for bad in (b"", b"KFE2", b"KFN2" + bytes(7)):
        with pytest.raises(keyfence.InvalidEnvelope) as e:
            m.require(bad)
        assert "newest lists" in str(e.value)
    with pytest.raises(keyfence.InvalidArgumentType):
        m.require("KFN2")  # type: ignore[arg-type]

    # Lists another authority signed: refused, nothing required.
    other_store = tmp_path / "other"
    with wrap.Authority.init(other_store) as other:
        stranger = wrap.Machine(other.issue({"region": "EU"}), other_store)
        stranger.open(other.wrap("region: EU", b"x"))
    with pytest.raises(keyfence.WrongAuthority):
        m.require(stranger.newest_lists())
    rolled.roll_back()
    assert m.open(rolled.envelope) == SECRET

    # A floor that cannot be kept is an error when the machine is made.
    with pytest.raises(keyfence.StoreIOError) as io:
        wrap.Machine(rolled.machine_key, rolled.store, state=tmp_path / "no-such-folder" / "fra.key.newest")
    assert isinstance(io.value, OSError) and "no-such-folder" in str(io.value)
    garbage = tmp_path / "garbage.newest"
    garbage.write_bytes(b"not lists")
    with pytest.raises(keyfence.InvalidEnvelope) as bad:
        wrap.Machine(rolled.machine_key, rolled.store, state=garbage)
    assert "garbage.newest" in str(bad.value)
    with pytest.raises(keyfence.InvalidArgumentType):
        wrap.Machine(rolled.machine_key, rolled.store, state=5)  # type: ignore[arg-type]
    with pytest.raises(keyfence.InvalidArgumentType):
        wrap.Machine(rolled.machine_key, rolled.store, garbage)  # type: ignore[misc]
