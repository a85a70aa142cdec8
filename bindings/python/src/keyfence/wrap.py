"""Policy-key wrapping of customer secrets on a store many machines share.

The authority (:class:`Authority`) wraps secrets under policies and issues
machine keys; each machine (:class:`Machine`) opens the envelopes its
attributes allow, reading sealed policy keys from the replicated store::

    auth = keyfence.wrap.Authority.init("/srv/keyfence")
    envelope = auth.wrap("region: EU", b"customer secret")
    machine = keyfence.wrap.Machine(auth.issue({"region": "EU"}), "/srv/keyfence")
    assert machine.open(envelope) == b"customer secret"

A store is named by one string: a directory, as above, or
``etcd://HOST:PORT[,HOST:PORT...]/PREFIX[?cacert=&cert=&key=]`` for a store
on an etcd cluster. ``machine.follow()`` keeps a machine's cache in step with
the store through a watch (a retired key forgotten at once, a rotated one
opened ahead), and ``machine.cache_stats()`` counts what it did.

A machine made with ``state=PATH`` (usually beside its key file,
``KEY.newest``) keeps the newest generation and revocation lists it accepts
in that file, so that after a restart it still refuses a store rolled back
to an older list (:class:`~keyfence.ReplayedObject`); ``newest_lists()`` and
``require(lists)`` hand that floor from one machine to another.

See ``docs/wrapping.md`` for formats, rotation and the threat model.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Union, cast

from . import _core
from ._guard import Native

__all__ = ["Authority", "Machine"]

Buffer = Union[bytes, bytearray, memoryview]
StrPath = Union[str, "os.PathLike[str]"]

Authority = _core.Authority
Machine = _core.Machine


def _authority() -> None:
    face = Native(Authority, "keyfence.wrap.Authority")
    native = face.native

    @face.static
    def init(store: StrPath) -> Authority:
        return cast(Authority, native["init"](store))

    @face.static
    def open(store: StrPath) -> Authority:
        return cast(Authority, native["open"](store))

    @face.method
    def issue(self: Any, attributes: Mapping[str, str]) -> bytes:
        return bytes(native["issue"](self, attributes))

    @face.method
    def wrap(self: Any, policy: str, secret: Buffer) -> bytes:
        return bytes(native["wrap"](self, policy, secret))

    @face.method
    def rotate_master(self: Any) -> int:
        return int(native["rotate_master"](self))

    @face.method
    def revoke(self: Any, machine_id: str) -> int:
        return int(native["revoke"](self, machine_id))

    @face.method
    def close(self: Any) -> None:
        native["close"](self)

    face.made_by("keyfence.wrap.Authority.init(store) or Authority.open(store)")
    face.closes()
    face.not_copied("open the store again with Authority.open(store) where another authority is needed")


def _machine() -> None:
    face = Native(Machine, "keyfence.wrap.Machine")
    native = face.native

    @face.method
    def __init__(self: Any, machine_key: Buffer, store: StrPath, *, state: Optional[StrPath] = None) -> None:
        native["__init__"](self, machine_key, store, state=state)

    @face.method
    def could_open(self: Any, envelope: Buffer) -> bool:
        return bool(native["could_open"](self, envelope))

    @face.method
    def open(self: Any, envelope: Buffer) -> bytes:
        return bytes(native["open"](self, envelope))

    @face.method
    def require(self: Any, lists: Buffer) -> None:
        native["require"](self, lists)

    @face.method
    def newest_lists(self: Any) -> bytes:
        return bytes(native["newest_lists"](self))

    @face.method
    def follow(self: Any) -> None:
        native["follow"](self)

    @face.method
    def cache_stats(self: Any) -> Dict[str, int]:
        return cast(Dict[str, int], native["cache_stats"](self))

    face.not_copied("make a Machine from its machine key in each process that needs one")


_authority()
_machine()
