"""Asynchronous signing: RSA, ECDSA and Ed25519 on AWS-LC, with keys in
this process, in a key process, or in a PKCS#11 token.

An :class:`Engine` runs operations on its own worker threads, one executor
per class (RSA, EC, slow backends, PKCS#11 tokens), each with a bounded
queue, so a slow class never delays a fast one. From asyncio, :meth:`Engine.sign` returns an
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

Keys that never leave a PKCS#11 token (an HSM, a TPM, SoftHSM2) are named
by an RFC 7512 URI; the token signs, on the engine's ``token`` class, and
with ``isolated=True`` only the key process loads the token's module and
reads its PIN::

    engine = keyfence.sign.Engine(isolated=True)
    key = engine.load_pkcs11("pkcs11:token=edge;object=tls-p256?pin-source=file:/etc/keyfence/pin")
    signature = await engine.sign(key, "ecdsa-p256-sha256", data)
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any, Dict, Optional, Union, cast

from . import _core
from ._args import _count, _ms, instance, public_name
from ._guard import Native, guard_class, not_copied
from ._remote import Peer, RemoteSigner
from .exceptions import InvalidArgument, InvalidArgumentType, _from_code
from .wrap import Machine

__all__ = ["Engine", "Peer", "PrivateKey", "RemoteSigner"]

Buffer = Union[bytes, bytearray, memoryview]
StrPath = Union[str, "os.PathLike[str]"]

PrivateKey = _core.PrivateKey


def _private_key() -> None:
    face = Native(PrivateKey, "keyfence.sign.PrivateKey")
    native = face.native

    @face.static
    def from_pem(pem: Union[Buffer, str], engine: Optional[Engine] = None) -> PrivateKey:
        instance(engine, Engine, "engine", none=True)
        return cast(PrivateKey, native["from_pem"](pem, engine))

    @face.static
    def from_envelope(machine: Machine, envelope: Buffer, engine: Optional[Engine] = None) -> PrivateKey:
        instance(machine, Machine, "machine")
        instance(engine, Engine, "engine", none=True)
        return cast(PrivateKey, native["from_envelope"](machine, envelope, engine))

    @face.static
    def load_envelope(*args: Any, engine: Optional[Engine] = None) -> PrivateKey:
        """Loads the private key an envelope holds, in one of two forms.

        ``load_envelope(store, machine_key, envelope, engine=...)`` opens it
        with the machine key file ``machine_key`` against the store
        ``store``. With an isolated engine its key process opens the
        envelope and keeps the key: this process reads only the machine
        key's public part, so neither the machine key's secret nor the
        private key is ever here. Otherwise it is opened here. With an
        agent's engine (``Engine(agent=...)``) the agent opens it with its
        own machine key and store: ``store`` and ``machine_key`` may be
        None, and are not read.

        ``load_envelope(envelope, engine=...)``, with an agent's engine
        only, is the same as ``load_envelope(None, None, envelope,
        engine=...)``.

        Raises:
            ResourceError: the machine key file cannot be read.
            InvalidArgument: ``store`` or ``machine_key`` None, or the
                envelope alone, without an agent's engine.
            PolicyNotSatisfied, RetiredGeneration, MachineRevoked,
                ReplayedObject: the agent's machine may not open it, as
                in process.
            BackendFailed: the agent itself failed (its reason in the
                message).
            InvalidEnvelope: bytes that are not an envelope; and as
                :meth:`keyfence.wrap.Machine.open` and :meth:`from_pem`.
        """
        instance(engine, Engine, "engine", none=True)
        if len(args) not in (1, 3):
            raise InvalidArgumentType(
                "load_envelope takes the envelope, or the store, the machine key file and the envelope "
                f"(and engine=...), not {len(args)} positional arguments"
            )
        return cast(PrivateKey, native["load_envelope"](*args, engine=engine))

    @face.static
    def load_pkcs11(uri: str, *, engine: Optional[Engine] = None) -> PrivateKey:
        """Loads the private key the PKCS#11 URI ``uri`` (RFC 7512) names:
        a handle on a key that never leaves its token, which signs for it
        on the engine's ``token`` executor class.

        The URI names the token and the key object, and may name the
        module and a file whose first line is the PIN; what it leaves out
        comes from the environment of the process that loads the key:
        ``KEYFENCE_PKCS11_MODULE``, then ``KEYFENCE_PKCS11_PIN_FILE`` or
        ``KEYFENCE_PKCS11_PIN``. A PIN in the URI (``pin-value=``) is
        refused. With ``engine`` None or an engine without a key process
        the module is loaded here, once per process, and every key of a
        token shares its sessions and login. With ``Engine(isolated=True)``
        the key process loads it (with the environment it inherits from
        this process), and with ``Engine(agent=...)`` the agent, with its
        own module and PIN file: this process never maps the module nor
        reads the PIN. The GIL is released while the token answers.

        For example, with the module and the PIN file named in the URI:

            engine = keyfence.sign.Engine(isolated=True)
            key = keyfence.sign.PrivateKey.load_pkcs11(
                "pkcs11:token=edge;object=tls-p256;type=private"
                "?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/etc/keyfence/pin",
                engine=engine,
            )

        Raises:
            InvalidArgumentType: ``uri`` is not a str.
            InvalidArgument: a URI that does not parse (its position in the
                message), holds a PIN, or names a PIN file that cannot be
                read; an engine whose keys are on remote key servers.
            InvalidConfig: no module named, or one that cannot be loaded.
            InvalidPrivateKey: no such token (the message lists the
                module's tokens) or no such key on it.
            TokenLogin: the token needs a PIN and none was given, or it
                refused the PIN (not tried again: fix the PIN file and load
                again). Also a :class:`PermissionError`.
            TokenUnavailable: the token does not answer. Also a
                :class:`ConnectionError`.
            BackendFailed: the key process or the agent failed or refused.
            ShutDown: the engine was closed.
        """
        instance(uri, str, "uri")
        instance(engine, Engine, "engine", none=True)
        return cast(PrivateKey, native["load_pkcs11"](uri, engine=engine))

    @face.method
    def public_key_der(self: Any) -> bytes:
        return bytes(native["public_key_der"](self))

    face.made_by(
        "PrivateKey.from_pem(), from_envelope(), load_envelope() or load_pkcs11(), Engine.load_key() or "
        "load_pkcs11(), or RemoteSigner.key() or open_or_forward()"
    )
    face.not_copied(
        "load it again where it is needed, from its PEM, envelope or PKCS#11 URI (PrivateKey.from_pem, "
        "from_envelope, load_envelope, load_pkcs11)"
    )


_private_key()

# The C API's executor classes (keyfence_op_class).
_RSA, _EC, _SLOW, _TOKEN = 0, 1, 2, 3


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
        token_threads: threads of the class that runs the operations of
            PKCS#11 token keys loaded in this process
            (:meth:`load_pkcs11`): each waits on the token, so the class
            has threads of its own (default: from the number of cores).
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
        offload: whether keys in this process, or in its key process
            (``isolated=True``), sign on Intel's crypto_mb multi-buffer
            device (``docs/offload.md``): ``"on"`` (the engine is refused,
            saying why, where crypto_mb cannot run: no library, or a CPU
            without AVX-512 IFMA), ``"auto"`` (the device where it runs,
            else software) or ``"off"``. Default: software in this
            process, ``"auto"`` in a key process. Not with ``agent``: the
            agent chooses (``keyfence agent --offload``).
        crypto_mb: crypto_mb's library for ``offload`` (a path, or a name
            the loader finds); default ``KEYFENCE_CRYPTO_MB``, else
            ``libcrypto_mb.so.13``.

    Raises:
        InvalidArgumentType: a setting of the wrong type.
        InvalidArgument: a setting out of range, or ``agent`` with
            ``isolated=True``.
        InvalidConfig: settings the engine cannot use (an ``offload``
            that is not ``"off"``, ``"on"`` or ``"auto"``, ``offload``
            with ``agent``, or ``crypto_mb`` without ``offload``).
        BackendFailed: the key process did not start, ``offload="on"``
            where crypto_mb cannot run, or no agent answers on ``agent``
            or it refuses this user (the reason in the message).

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
        token_threads: Optional[int] = None,
        timeout: Optional[float] = None,
        isolated: bool = False,
        key_process: Optional[StrPath] = None,
        agent: Optional[StrPath] = None,
        offload: Optional[str] = None,
        crypto_mb: Optional[StrPath] = None,
    ) -> None:
        t = _count(threads, "threads")
        cap = _count(queue_capacity, "queue_capacity")
        classes = [
            (_RSA, _count(rsa_threads, "rsa_threads") or t, cap),
            (_EC, _count(ec_threads, "ec_threads") or t, cap),
            (_SLOW, _count(slow_threads, "slow_threads"), cap),
            (_TOKEN, _count(token_threads, "token_threads"), cap),
        ]
        if key_process is not None and not isolated:
            raise InvalidArgument("key_process is only used with isolated=True")
        if agent is not None and isolated:
            raise InvalidArgument(
                "agent and isolated=True are exclusive: an engine's keys are either in its own key process "
                "or in the key agent"
            )
        self._queues: Dict[asyncio.AbstractEventLoop, _LoopQueue] = {}
        self._native = _core.Engine(classes, _ms(timeout, "timeout"), bool(isolated), key_process, agent, offload, crypto_mb)
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
        if not isinstance(key, PrivateKey):  # inline: this path runs once per signature
            instance(key, PrivateKey, "key")
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
        if not isinstance(key, PrivateKey):
            instance(key, PrivateKey, "key")
        return self._native.sign(key, algorithm, data, _ms(timeout, "timeout"))

    def load_key(self, pem: Union[Buffer, str]) -> PrivateKey:
        """Loads a private key through this engine: with ``isolated=True``
        it goes to the key process and this process keeps only a handle.
        Same as ``PrivateKey.from_pem(pem, engine=self)``. An agent's
        engine loads envelopes only (``PrivateKey.load_envelope``): this
        raises :class:`~keyfence.InvalidArgument` there."""
        return PrivateKey.from_pem(pem, self)

    def load_pkcs11(self, uri: str) -> PrivateKey:
        """Loads the private key the PKCS#11 URI ``uri`` names, through this
        engine: in its key process with ``isolated=True``, in its agent with
        ``agent=...``, else in this process. Same as
        ``PrivateKey.load_pkcs11(uri, engine=self)``, which says where the
        module and PIN come from; raises as it does. For example:

            with keyfence.sign.Engine() as engine:
                key = engine.load_pkcs11("pkcs11:token=edge;object=tls-p256?pin-source=file:/etc/keyfence/pin")
                signature = engine.sign_sync(key, "ecdsa-p256-sha256", b"data")
        """
        return PrivateKey.load_pkcs11(uri, engine=self)

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
        ``ec``, ``slow``, ``token``): workers, queue_capacity, queue_depth, in_flight,
        submitted, completed, errors, overloaded, timed_out, p50_ns, p99_ns,
        p999_ns."""
        return self._native.metrics()


guard_class(Engine)
public_name(Engine, "keyfence.sign.Engine")
not_copied(
    Engine,
    "keyfence.sign.Engine is not copied or pickled: it owns worker threads, and a key process or agent "
    "connection; share this one (it is thread-safe), or make one in each process",
)

# Their home is keyfence._remote; their public name is here.
Peer.__module__ = RemoteSigner.__module__ = __name__
