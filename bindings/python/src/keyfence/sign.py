"""Asynchronous signing: RSA, ECDSA and Ed25519 on BoringSSL, with keys in
this process or in a key process.

An :class:`Engine` runs operations on its own worker threads, one executor
per class (RSA, EC, slow backends), each with a bounded queue, so a slow
class never delays a fast one. From asyncio, :meth:`Engine.sign` returns an
awaitable completed through the engine's completion-queue file descriptor,
registered with the running loop: no thread per operation, and a thousand
signatures can be in flight from one event loop::

    engine = keyfence.sign.Engine()
    key = keyfence.sign.PrivateKey.from_pem(pem)
    signature = await engine.sign(key, "ecdsa-p256-sha256", data)

Algorithms are named as in ``docs/signing.md``: ``rsa-pkcs1-sha256``,
``rsa-pss-sha256``, ``ecdsa-p256-sha256``, ``ecdsa-p384-sha384``,
``ed25519``, ...

Keys this machine's attributes do not allow stay on the machines that may
hold them: a :class:`RemoteSigner` asks the nearest such key server
(``keyfence serve``) to sign, and its keys are :class:`PrivateKey` handles
that any engine signs with (``docs/remote.md``)::

    remote = keyfence.sign.RemoteSigner(
        [keyfence.sign.Peer("sfo1", "10.1.0.7:7543", {"country": "US"})],
        cert="edge.pem", key="edge.key", ca="mesh-ca.pem")
    key = remote.open_or_forward(machine, envelope)  # here if allowed, else remote
    signature = await engine.sign(key, "ecdsa-p256-sha256", data)

A server whose workers should hold neither the machine key nor the store
reaches its keys through the machine's key agent (``keyfence agent``,
``docs/deploy.md``): the agent opens envelopes and signs, and the worker
holds only its socket::

    engine = keyfence.sign.Engine(agent="/run/keyfence/agent.sock")
    key = keyfence.sign.PrivateKey.load_envelope(envelope, engine=engine)
    signature = await engine.sign(key, "ecdsa-p256-sha256", data)
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any, Dict, Optional, Union

from . import _core
from ._args import _count, _ms
from ._guard import guard_class
from ._remote import Peer, RemoteSigner
from .exceptions import InvalidArgument, InvalidArgumentType, _from_code

__all__ = ["Engine", "Peer", "PrivateKey", "RemoteSigner"]

Buffer = Union[bytes, bytearray, memoryview]
StrPath = Union[str, "os.PathLike[str]"]

PrivateKey = _core.PrivateKey
guard_class(PrivateKey)

# The C API's executor classes (keyfence_op_class).
_RSA, _EC, _SLOW = 0, 1, 2


class _LoopQueue:
    """One completion queue per event loop, registered with it by
    ``add_reader``: the loop drains it when its descriptor is readable and
    completes the waiting futures."""

    __slots__ = ("loop", "native", "pending", "tokens", "fd")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.native = _core.CompletionQueue()
        self.pending: Dict[int, "asyncio.Future[bytes]"] = {}
        self.tokens = itertools.count(1)
        self.fd = self.native.fileno()
        # The C++ half completes the futures, called by the loop directly:
        # a Python loop here cost more per signature than the rest of the
        # wake-up.
        loop.add_reader(self.fd, self.native.resolve, self.pending, _from_code)

    def ready(self) -> None:
        self.native.resolve(self.pending, _from_code)

    def detach(self) -> None:
        if not self.loop.is_closed():
            self.loop.remove_reader(self.fd)


class Engine:
    """A signing engine: worker threads per executor class, bounded queues,
    a deadline per operation, and optionally a key process.

    Args:
        threads: worker threads for each of the RSA and EC classes
            (default: from the number of cores).
        queue_capacity: operations that may wait in each class's queue;
            beyond it :meth:`sign` raises :class:`~keyfence.Overloaded` at once.
        rsa_threads, ec_threads, slow_threads: per-class thread counts,
            overriding ``threads``.
        timeout: the default deadline of an operation, in seconds (2 s
            unless set: the core's default); past it the operation raises
            :class:`~keyfence.TimedOut`.
        isolated: keep keys loaded through this engine
            (``PrivateKey.from_pem(pem, engine=...)``) in a separate key
            process, which this process cannot read.
        key_process: the ``keyfence-key-process`` program; by default the one
            installed beside the native module (never looked up on PATH).
        agent: the socket of a key agent (``keyfence agent``,
            ``docs/deploy.md``) that holds this machine's keys: envelopes
            load through it with no store or machine key here
            (``PrivateKey.load_envelope(envelope, engine=...)``), and it
            signs for this engine. The engine connects now, and again when
            the agent restarts, loading its keys again. Not with
            ``isolated=True``.

    Raises:
        InvalidArgumentType: a setting of the wrong type.
        InvalidArgument: a setting out of range, or ``agent`` with
            ``isolated=True``.
        InvalidConfig: settings the engine cannot use.
        BackendFailed: the key process did not start, or no agent answers
            on ``agent`` or it refuses this user (the reason in the message).

    The engine is thread-safe; :meth:`close` (or leaving a ``with`` block)
    shuts it down, failing queued operations with :class:`~keyfence.ShutDown`,
    as every later call on it fails.
    """

    __slots__ = ("_native", "_queues", "_agent", "__weakref__")

    def __init__(
        self,
        *,
        threads: Optional[int] = None,
        queue_capacity: Optional[int] = None,
        rsa_threads: Optional[int] = None,
        ec_threads: Optional[int] = None,
        slow_threads: Optional[int] = None,
        timeout: Optional[float] = None,
        isolated: bool = False,
        key_process: Optional[StrPath] = None,
        agent: Optional[StrPath] = None,
    ) -> None:
        t = _count(threads, "threads")
        cap = _count(queue_capacity, "queue_capacity")
        classes = [
            (_RSA, _count(rsa_threads, "rsa_threads") or t, cap),
            (_EC, _count(ec_threads, "ec_threads") or t, cap),
            (_SLOW, _count(slow_threads, "slow_threads"), cap),
        ]
        if key_process is not None and not isolated:
            raise InvalidArgument("key_process is only used with isolated=True")
        if agent is not None and isolated:
            raise InvalidArgument(
                "agent and isolated=True are exclusive: an engine's keys are either in its own key process "
                "or in the key agent"
            )
        self._queues: Dict[asyncio.AbstractEventLoop, _LoopQueue] = {}
        self._native = _core.Engine(classes, _ms(timeout, "timeout"), bool(isolated), key_process, agent)
        self._agent: Optional[str] = None if agent is None else os.fsdecode(os.fspath(agent))

    def __repr__(self) -> str:
        native = getattr(self, "_native", None)
        agent = getattr(self, "_agent", None)
        where = f" (agent {agent})" if agent else ""
        return f"<keyfence.sign.Engine{where}{' (closed)' if native is None or native.closed else ''}>"

    @property
    def agent(self) -> Optional[str]:
        """The key agent's socket when this engine's keys are in an agent
        (``Engine(agent=...)``), else None."""
        return getattr(self, "_agent", None)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return bool(self._native.closed)

    def close(self) -> None:
        """Shuts the engine down: queued operations fail with
        :class:`~keyfence.ShutDown`, and keys in its key process stop
        working. Calling it again does nothing."""
        self._native.close()
        for q in list(self._queues.values()):
            # Let each loop deliver the shutdown errors, then let go of it.
            if not q.loop.is_closed():
                q.loop.call_soon_threadsafe(self._release, q)

    def _release(self, q: _LoopQueue) -> None:
        q.ready()
        if not q.pending:
            q.detach()
            self._queues.pop(q.loop, None)

    def _queue(self, loop: asyncio.AbstractEventLoop) -> _LoopQueue:
        q = self._queues.get(loop)
        if q is None:
            # Forget loops that have closed (asyncio.run makes a new one each time).
            for old in [l for l in self._queues if l.is_closed()]:
                del self._queues[old]
            q = self._queues[loop] = _LoopQueue(loop)
        return q

    async def sign(self, key: PrivateKey, algorithm: str, data: Buffer, *, timeout: Optional[float] = None) -> bytes:
        """Signs ``data`` with ``key`` and ``algorithm`` without blocking the
        event loop; the result arrives through the loop's reader.

        Cancelling the awaiting task cancels the operation: one still queued
        never runs.

        Raises:
            Overloaded: the class's queue is full (at once, nothing queued).
            TimedOut: the deadline (``timeout`` seconds, or the engine's) passed.
            InvalidRequest: an unknown algorithm, or one that does not fit the key.
            BackendFailed: the key process or device failed.
            ShutDown: the engine was closed.
        """
        loop = asyncio.get_running_loop()
        q = self._queues.get(loop) or self._queue(loop)
        fut: "asyncio.Future[bytes]" = loop.create_future()
        token = next(q.tokens)
        q.pending[token] = fut
        try:
            ms = 0 if timeout is None else _ms(timeout, "timeout")
            op = self._native.submit(key, algorithm, data, ms, q.native, token)
        except BaseException:
            del q.pending[token]
            raise
        try:
            return await fut
        except asyncio.CancelledError:
            op.cancel()
            raise

    def sign_sync(self, key: PrivateKey, algorithm: str, data: Buffer, *, timeout: Optional[float] = None) -> bytes:
        """Signs and waits for the result, with the GIL released: for scripts
        and worker threads, not for an event loop. Raises as :meth:`sign`."""
        return self._native.sign(key, algorithm, data, _ms(timeout, "timeout"))

    def load_key(self, pem: Union[Buffer, str]) -> PrivateKey:
        """Loads a private key through this engine: with ``isolated=True``
        it goes to the key process and this process keeps only a handle.
        Same as ``PrivateKey.from_pem(pem, engine=self)``. An agent's
        engine loads envelopes only (``PrivateKey.load_envelope``): this
        raises :class:`~keyfence.InvalidArgument` there."""
        return _core.PrivateKey.from_pem(pem, self)

    def metrics_prometheus(self) -> str:
        """Every class's queue depths, counters and latency histograms, and
        the figures of attached remote signers, in Prometheus text format:
        what a ``/metrics`` endpoint serves."""
        return str(self._native.metrics_prometheus())

    def attach_remote(self, remote: "RemoteSigner") -> None:
        """Reports ``remote``'s per-peer figures (round-trip time, breaker,
        connections, failovers, requests and latency) with this engine's
        :meth:`metrics_prometheus` from now on."""
        if not isinstance(remote, RemoteSigner):
            raise InvalidArgumentType(f"remote must be a keyfence.sign.RemoteSigner, not {type(remote).__name__!r}")
        self._native.attach_remote(remote._native)

    def metrics(self) -> Dict[str, Dict[str, int]]:
        """Counters and latency percentiles per executor class (``rsa``,
        ``ec``, ``slow``): workers, queue_capacity, queue_depth, in_flight,
        submitted, completed, errors, overloaded, timed_out, p50_ns, p99_ns,
        p999_ns."""
        return self._native.metrics()


guard_class(Engine)

# Their home is keyfence._remote; their public name is here.
Peer.__module__ = RemoteSigner.__module__ = __name__
