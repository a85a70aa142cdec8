"""Remote signing: :class:`RemoteSigner` and its :class:`Peer`, public as
``keyfence.sign.RemoteSigner`` and ``keyfence.sign.Peer`` (see
:mod:`keyfence.sign`)."""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Union

from . import _core
from ._args import _ms, public_name
from ._guard import guard, guard_class, not_copied
from .exceptions import InvalidArgument, InvalidArgumentType
from .wrap import Machine

Buffer = Union[bytes, bytearray, memoryview]
StrPath = Union[str, "os.PathLike[str]"]
PrivateKey = _core.PrivateKey


class Peer(NamedTuple):
    """A key server a :class:`RemoteSigner` may ask.

    Attributes:
        name: its name in metrics and errors, and the DNS name its TLS
            certificate must carry unless ``server_name`` is given.
        address: ``host:port`` where it listens.
        attributes: its machine's attributes, which decide the keys it is
            asked for (those whose policy they satisfy).
        server_name: the DNS name its certificate carries, when not ``name``.
    """

    name: str
    address: str
    attributes: Mapping[str, str]
    server_name: Optional[str] = None


def _attempts(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentType(f"max_attempts must be an int, not {type(value).__name__!r}")
    if not 1 <= value <= 100:
        raise InvalidArgument(f"max_attempts must be between 1 and 100, not {value!r}")
    return value


class RemoteSigner:
    """A client of remote key servers (``keyfence serve``), for keys this
    machine may not open: a bounded pool of multiplexed mutual-TLS
    connections per peer, the nearest capable peer first (by round-trip
    times it measures itself), the next on failure, a circuit breaker per
    peer, and retries with backoff under a retry budget (``docs/remote.md``).

    Args:
        peers: the key servers (:class:`Peer`).
        cert, key: this client's certificate chain and private key (PEM).
        ca: the CA certificates the servers' certificates must chain to;
            nothing else is trusted.
        tenant: an id sent with each request for older servers; servers of
            this version ignore it and take the tenant from this client's
            certificate (docs/remote.md, "Tenants").
        connect_timeout: seconds for a TCP connect and TLS handshake.
        request_timeout: seconds one attempt waits for its reply before the
            next peer is tried (never past the operation's deadline).
        max_attempts: attempts per operation, the first included.

    Raises:
        InvalidConfig: no peers, TLS files that cannot be used, or an
            address that is not ``host:port``.
        InvalidAttributes: a peer's attributes.

    Keys it gives keep their own reference to it; :meth:`close` (or leaving
    a ``with`` block) stops new calls on the signer itself.
    """

    __slots__ = ("_native",)

    def __init__(
        self,
        peers: Sequence[Peer],
        *,
        cert: StrPath,
        key: StrPath,
        ca: StrPath,
        tenant: int = 0,
        connect_timeout: float = 1.0,
        request_timeout: float = 1.0,
        max_attempts: int = 3,
    ) -> None:
        if isinstance(peers, (str, bytes)) or not isinstance(peers, Sequence):
            raise InvalidArgumentType("peers must be a sequence of keyfence.sign.Peer")
        native_peers = []
        for p in peers:
            if not isinstance(p, tuple):
                raise InvalidArgumentType(f"each peer must be a keyfence.sign.Peer, not {type(p).__name__!r}")
            p = Peer(*p)
            native_peers.append((p.name, p.address, p.attributes, p.server_name))
        if isinstance(tenant, bool) or not isinstance(tenant, int) or not 0 <= tenant < 1 << 64:
            raise InvalidArgument(f"tenant must be an int between 0 and 2**64 - 1, not {tenant!r}")
        self._native = _core.RemoteSigner(
            native_peers,
            cert,
            key,
            ca,
            tenant,
            _ms(connect_timeout, "connect_timeout"),
            _ms(request_timeout, "request_timeout"),
            _attempts(max_attempts),
        )

    def __repr__(self) -> str:
        return f"<keyfence.sign.RemoteSigner{' (closed)' if self._native.closed else ''}>"

    def __enter__(self) -> "RemoteSigner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def key(self, envelope: Buffer) -> PrivateKey:
        """A handle on the key in ``envelope`` held by the peers whose
        attributes satisfy its policy; the secret never comes here. Asks the
        nearest of them for the public half (blocking, GIL released).

        Raises:
            InvalidEnvelope: bytes that are not an envelope.
            BackendFailed: no configured peer may hold the key, or none answered.
            Overloaded: every capable peer refused for want of room.
        """
        return self._native.key(envelope)

    def open_or_forward(self, machine: Machine, envelope: Buffer) -> PrivateKey:
        """The key in ``envelope``: opened here when ``machine``'s attributes
        satisfy its policy, otherwise a handle on the peers that may hold it
        (as :meth:`key`). Raises as :meth:`keyfence.wrap.Machine.open` and
        :meth:`key`."""
        native = getattr(machine, "_native", machine)
        if not isinstance(native, _core.Machine):
            raise InvalidArgumentType(f"machine must be a keyfence.wrap.Machine, not {type(machine).__name__!r}")
        return self._native.open_or_forward(native, envelope)

    def metrics(self) -> str:
        """Per-peer round-trip time, breaker, connections, failovers,
        requests and latency, in Prometheus text format."""
        return str(self._native.metrics())

    def close(self) -> None:
        """Closes the signer; calling it again does nothing."""
        self._native.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return bool(self._native.closed)


guard_class(RemoteSigner)
public_name(RemoteSigner, "keyfence.sign.RemoteSigner")
not_copied(
    RemoteSigner,
    "keyfence.sign.RemoteSigner is not copied or pickled: it owns connections to the key servers; share "
    "this one (it is thread-safe), or make one in each process",
)
# A Peer with the wrong number of fields is an argument error like any
# other (its fields' types are checked where RemoteSigner uses them).
setattr(Peer, "__new__", staticmethod(guard(Peer.__new__)))
