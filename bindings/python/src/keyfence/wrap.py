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

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union, cast

from . import _core
from ._args import describe
from ._guard import Native
from .exceptions import InvalidArgument, InvalidArgumentType

# WhereGroup and WhereResult are what Authority.where returns, Revocation
# and SkippedEnvelope what Authority.revoke returns, not for constructing:
# importable for annotations, outside __all__ as every result record the
# API walk (tests/test_one_family.py) leaves out.
__all__ = ["Authority", "Machine"]

Buffer = Union[bytes, bytearray, memoryview]
StrPath = Union[str, "os.PathLike[str]"]

Authority = _core.Authority
Machine = _core.Machine


@dataclass(frozen=True)
class WhereGroup:
    """One group of :class:`WhereResult` (a data center, a region): its
    machines, those that satisfy the policy, and with traffic the load it
    would sign."""

    #: Its value of the ``by`` label.
    value: str
    #: Its live machines.
    total: int
    #: Those that satisfy the policy.
    matching: int
    #: Its value of the ``near`` label (the most common among its machines).
    near: Optional[str]
    #: Its own handshakes per second (with traffic).
    own_rps: Optional[float]
    #: Handshakes per second other groups would send it (with traffic).
    received_rps: Optional[float]
    #: The group its handshakes go to when it cannot open the key (with traffic).
    sends_to: Optional[str]
    #: How many groups send it their handshakes (with traffic).
    senders: int
    #: Why it would be overloaded (it receives more than the warning ratio
    #: times its own traffic), or None.
    warning: Optional[str]

    @property
    def satisfies(self) -> bool:
        """Whether a machine of it satisfies the policy."""
        return self.matching > 0

    @property
    def load_rps(self) -> Optional[float]:
        """Its own plus received handshakes per second (with traffic)."""
        if self.own_rps is None or self.received_rps is None:
            return None
        return self.own_rps + self.received_rps


@dataclass(frozen=True)
class WhereResult:
    """Where a key wrapped under a policy can be used
    (:meth:`Authority.where`): the live machines of the authority's
    inventory that satisfy it, by group, and with traffic the share of
    handshakes signed in another group than their own."""

    #: The policy, canonical.
    policy: str
    #: The label grouped by.
    by: Optional[str]
    #: Live machines in the inventory.
    total: int
    #: Those that satisfy the policy.
    matching: int
    #: Revoked machines, left out of every count.
    revoked: int
    #: Live machines without the ``by`` label.
    ungrouped: int
    #: Those of them that satisfy the policy.
    ungrouped_matching: int
    #: Share of all handshakes signed remotely (with traffic).
    remote_share: Optional[float]
    #: All handshakes per second (with traffic).
    total_rps: Optional[float]
    #: Those signed in another group (with traffic).
    remote_rps: Optional[float]
    #: Those with no satisfying group to go to (with traffic).
    unserved_rps: Optional[float]
    #: The groups, sorted by value.
    groups: Tuple[WhereGroup, ...]
    #: The matching machines' ids, when asked for (``machines=True``).
    machines: Tuple[str, ...]

    def group(self, value: str) -> WhereGroup:
        """The group whose value is ``value``; KeyError if there is none."""
        for g in self.groups:
            if g.value == value:
                return g
        raise KeyError(value)

    @property
    def warnings(self) -> List[WhereGroup]:
        """The groups that would receive more than the warning ratio times
        their own traffic."""
        return [g for g in self.groups if g.warning is not None]


@dataclass(frozen=True)
class SkippedEnvelope:
    """An envelope in the store that a revocation could not re-wrap
    (:attr:`Revocation.skipped`): sealed to a retired policy key version
    now, it opens nowhere. Wrap its secret again."""

    #: Its name in the store (``envelopes/{secret id}``).
    name: str
    #: Why, by a stable name: ``malformed``, ``not_signed``,
    #: ``retired_version``, ``does_not_open`` or ``misnamed``.
    reason: str
    #: Why, in words.
    message: str


@dataclass(frozen=True)
class Revocation:
    """What :meth:`Authority.revoke` did."""

    #: The machine id revoked.
    id: str
    #: Whether the id was already revoked, and fully: nothing was done.
    already: bool
    #: Whether this call finished a revocation an interrupted one started.
    resumed: bool
    #: Policies given a new key version the machine cannot open.
    rekeyed: int
    #: Envelopes in the store re-wrapped to those versions.
    rewrapped: int
    #: Older policy key versions retired with their sealed copies.
    retired: int
    #: Whether the store's history was compacted afterwards (etcd).
    compacted: bool
    #: Milliseconds from the call until every new wrap sealed to a version
    #: the machine cannot open (0 when nothing was re-keyed).
    rekeyed_after_ms: float
    #: The store's envelopes it could not re-wrap: they open nowhere now.
    skipped: Tuple[SkippedEnvelope, ...]


def _revocation(text: str) -> Revocation:
    d = json.loads(text)
    return Revocation(
        id=d["id"],
        already=bool(d["already"]),
        resumed=bool(d["resumed"]),
        rekeyed=int(d["rekeyed"]),
        rewrapped=int(d["rewrapped"]),
        retired=int(d["retired"]),
        compacted=bool(d["compacted"]),
        rekeyed_after_ms=float(d["rekeyed_after_ms"]),
        skipped=tuple(SkippedEnvelope(name=x["name"], reason=x["reason"], message=x["message"]) for x in d["skipped"]),
    )


def _opt_float(v: Any) -> Optional[float]:
    return None if v is None else float(v)


def _where_result(text: str) -> WhereResult:
    d = json.loads(text)
    groups = tuple(
        WhereGroup(
            value=g["value"],
            total=int(g["total"]),
            matching=int(g["matching"]),
            near=g.get("near"),
            own_rps=_opt_float(g.get("own_rps")),
            received_rps=_opt_float(g.get("received_rps")),
            sends_to=g.get("sends_to"),
            senders=int(g.get("senders", 0)),
            warning=g.get("warning"),
        )
        for g in d["groups"]
    )
    return WhereResult(
        policy=d["policy"],
        by=d.get("by"),
        total=int(d["total"]),
        matching=int(d["matching"]),
        revoked=int(d["revoked"]),
        ungrouped=int(d["ungrouped"]["total"]),
        ungrouped_matching=int(d["ungrouped"]["matching"]),
        remote_share=_opt_float(d.get("remote_share")),
        total_rps=_opt_float(d.get("total_rps")),
        remote_rps=_opt_float(d.get("remote_rps")),
        unserved_rps=_opt_float(d.get("unserved_rps")),
        groups=groups,
        machines=tuple(d.get("machines", ())),
    )


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InvalidArgumentType(f"{what} must be a number, not {describe(v)}")
    x = float(v)
    if not math.isfinite(x) or x < 0:
        raise InvalidArgument(f"{what} must be a finite number of at least 0, not {v!r}")
    return x


def _name(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise InvalidArgumentType(f"{what} must be a str, not {describe(v)}")
    return v


def _rates(traffic: Optional[Mapping[str, float]]) -> Optional[List[Tuple[str, float]]]:
    if traffic is None:
        return None
    if not isinstance(traffic, Mapping):
        raise InvalidArgumentType(f"traffic must be a mapping of group to handshakes per second, not {describe(traffic)}")
    return [(_name(g, "a traffic group"), _number(r, f"the traffic of {g!r}")) for g, r in traffic.items()]


def _latencies(latency: Optional[Mapping[Tuple[str, str], float]]) -> Optional[List[Tuple[str, str, float]]]:
    if latency is None:
        return None
    if not isinstance(latency, Mapping):
        raise InvalidArgumentType(f"latency must be a mapping of (from, to) to milliseconds, not {describe(latency)}")
    out = []
    for pair, ms in latency.items():
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise InvalidArgumentType(f"a latency key must be a (from, to) tuple of str, not {describe(pair)}")
        out.append((_name(pair[0], "a latency's from"), _name(pair[1], "a latency's to"), _number(ms, f"the latency {pair!r}")))
    return out


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
    def revoke(self: Any, machine_id: str) -> Revocation:
        """Revokes the machine ``machine_id`` (:attr:`Machine.id`): records
        it, gives every policy a new key it cannot open, re-wraps the
        store's envelopes to them and retires the old keys. The report
        names the envelopes it could not re-wrap (``skipped``), which open
        nowhere now. Call again after an interruption to finish.

        Raises InvalidAttributes for an id a policy cannot name,
        PolicyTooLarge when the negations no longer fit (rotate the master
        key twice), StoreError."""
        return _revocation(native["revoke"](self, machine_id))

    @face.method
    def where(
        self: Any,
        policy: str,
        *,
        by: Optional[str] = None,
        traffic: Optional[Mapping[str, float]] = None,
        latency: Optional[Mapping[Tuple[str, str], float]] = None,
        near: Optional[str] = None,
        warn_ratio: float = 4.0,
        machines: bool = False,
    ) -> WhereResult:
        """Where a key wrapped under ``policy`` can be used: the live
        machines of the inventory that satisfy it (attributes evaluated
        with the policy language's semantics, nothing decrypted), grouped
        by the label ``by``. With ``traffic`` (group to handshakes per
        second), each group that cannot open the key sends its handshakes
        to the nearest group that can, as the key server forwards: by
        ``latency`` ((from, to) to milliseconds, one way holding both
        ways), else a group with its value of the label ``near``, else the
        satisfying group that sorts first; ties to the value that sorts
        first. A group receiving more than ``warn_ratio`` times its own
        traffic carries a warning.

        Raises PolicySyntaxError, InvalidArgument (traffic without ``by``,
        a negative rate), InconsistentState, StoreError."""
        ratio = _number(warn_ratio, "warn_ratio")
        if ratio == 0:
            raise InvalidArgument("warn_ratio must be more than 0")
        text = native["where"](
            self,
            policy,
            by=by,
            near=near,
            traffic=_rates(traffic),
            latency=_latencies(latency),
            warn_ratio=ratio,
            machines=bool(machines),
        )
        return _where_result(str(text))

    @face.method
    def import_inventory(self: Any, text: str, *, name: str = "inventory") -> int:
        """Adds machines already issued (before the inventory, or
        elsewhere) to the authority's inventory: ``text`` holds one a
        line, the machine id, a tab, its attributes (``label=value,...``);
        ``name`` names it in errors. Returns how many were new.

        Raises InvalidArgument naming the line and field of a line that
        does not read, StoreError."""
        return int(native["import_inventory"](self, text, name=name))

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
