"""Signing through a real key agent (`keyfence agent`, docs/deploy.md),
started with the command line: this process names only the agent's socket
and loads envelopes, with no store and no machine key; pyca/cryptography
verifies. A key the agent's machine may not open is refused with the
agent's reason; the agent killed and started again, the engine connects
again and signs, within a bounded wait."""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
from typing import TYPE_CHECKING, Any, Callable

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding

import keyfence
from keyfence import sign

if TYPE_CHECKING:
    from conftest import KeyAgent  # the key_agent fixture's type

MSG = b"signed by the agent"


def public(agent: KeyAgent, name: str) -> Any:
    return serialization.load_pem_public_key((agent.dir / f"{name}.pub").read_bytes())


def verify_ec(agent: KeyAgent, signature: bytes, data: bytes = MSG) -> None:
    public(agent, "key").verify(signature, data, ec.ECDSA(hashes.SHA256()))


def within(seconds: float, attempt: Callable[[], bytes]) -> bytes:
    """attempt() until it returns, for at most `seconds`; its last error then."""
    until = time.monotonic() + seconds
    while True:
        try:
            return attempt()
        except (keyfence.BackendFailed, keyfence.TimedOut):
            if time.monotonic() > until:
                raise
        time.sleep(0.05)


def test_an_agents_engine_loads_envelopes_without_store_or_machine_key_and_signs(key_agent: KeyAgent) -> None:
    a = key_agent
    env = (a.dir / "key.env").read_bytes()
    with sign.Engine(agent=a.socket, timeout=5.0) as engine:
        assert engine.agent == str(a.socket)
        assert repr(engine) == f"<keyfence.sign.Engine (agent {a.socket})>"
        # The short form, and None for both names: the agent's own are used.
        key = sign.PrivateKey.load_envelope(env, engine=engine)
        same = sign.PrivateKey.load_envelope(None, None, bytearray(env), engine=engine)
        assert not key.is_local and not same.is_local
        verify_ec(a, engine.sign_sync(key, "ecdsa-p256-sha256", MSG))
        verify_ec(a, engine.sign_sync(same, "ecdsa-p256-sha256", MSG))

        async def many() -> list[bytes]:
            return await asyncio.gather(*(engine.sign(key, "ecdsa-p256-sha256", b"%d" % i) for i in range(50)))

        for i, sig in enumerate(asyncio.run(many())):
            verify_ec(a, sig, b"%d" % i)
        assert key.public_key_der() == public(a, "key").public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        # An RSA key through the same agent.
        rsa_key = sign.PrivateKey.load_envelope((a.dir / "rsa.env").read_bytes(), engine=engine)
        sig = engine.sign_sync(rsa_key, "rsa-pss-sha256", MSG)
        public(a, "rsa").verify(
            sig, MSG, padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32), hashes.SHA256()
        )
        # Names given anyway are not read: the agent opens with its own.
        missing = a.dir / "no-such-dir"
        assert not sign.PrivateKey.load_envelope(missing, missing / "machine.key", env, engine=engine).is_local
    assert repr(engine) == f"<keyfence.sign.Engine (agent {a.socket}) (closed)>"
    with pytest.raises(keyfence.ShutDown, match="closed"):
        sign.PrivateKey.load_envelope(env, engine=engine)
    # Its keys went with it: on another engine they fail as shut down too,
    # not as a lost connection to the agent.
    with sign.Engine() as other:
        with pytest.raises(keyfence.ShutDown):
            other.sign_sync(key, "ecdsa-p256-sha256", MSG)


def test_the_agent_refuses_what_its_machine_may_not_open(key_agent: KeyAgent) -> None:
    a = key_agent
    with sign.Engine(agent=a.socket) as engine:
        # The agent's reason, as the same load raises in process (a "no",
        # not a broken backend), in bounded time.
        t = time.monotonic()
        with pytest.raises(keyfence.PolicyNotSatisfied, match="do not satisfy") as refused:
            sign.PrivateKey.load_envelope((a.dir / "fr.env").read_bytes(), engine=engine)
        assert refused.value.code == "POLICY_NOT_SATISFIED" and time.monotonic() - t < 10
        assert isinstance(refused.value, keyfence.KeyfenceError)
        # Bytes that are no envelope are refused here, before the agent.
        with pytest.raises(keyfence.InvalidEnvelope):
            sign.PrivateKey.load_envelope(b"junk", engine=engine)
        with pytest.raises(keyfence.InvalidArgumentType):
            sign.PrivateKey.load_envelope("key.env", engine=engine)  # type: ignore[call-overload]
        # An agent's engine loads envelopes only: no key bytes.
        with pytest.raises(keyfence.InvalidArgument, match="envelopes only"):
            engine.load_key((a.dir / "key.pub").read_bytes())
        # The engine still signs after the refusals.
        key = sign.PrivateKey.load_envelope((a.dir / "key.env").read_bytes(), engine=engine)
        verify_ec(a, engine.sign_sync(key, "ecdsa-p256-sha256", MSG))


def test_the_engine_connects_again_when_the_agent_comes_back(key_agent: KeyAgent) -> None:
    a = key_agent
    with sign.Engine(agent=a.socket, timeout=2.0) as engine:
        key = sign.PrivateKey.load_envelope((a.dir / "key.env").read_bytes(), engine=engine)
        verify_ec(a, engine.sign_sync(key, "ecdsa-p256-sha256", MSG))
        a.kill()
        # No agent: a typed failure, in bounded time.
        t = time.monotonic()
        with pytest.raises((keyfence.BackendFailed, keyfence.TimedOut)) as gone:
            engine.sign_sync(key, "ecdsa-p256-sha256", MSG)
        assert time.monotonic() - t < 10
        assert "agent" in str(gone.value)
        # Started again on the same socket (its stale file replaced): the
        # engine connects again and loads its keys again, the key handle
        # this process holds signs again.
        a.start()
        verify_ec(a, within(20, lambda: engine.sign_sync(key, "ecdsa-p256-sha256", MSG)))

        async def once() -> bytes:
            return await engine.sign(key, "ecdsa-p256-sha256", MSG)

        verify_ec(a, asyncio.run(once()))


def test_agent_settings_are_checked(key_agent: KeyAgent, tmp_path: pathlib.Path) -> None:
    a = key_agent
    with pytest.raises(keyfence.InvalidArgument, match="exclusive"):
        sign.Engine(agent=a.socket, isolated=True)
    with pytest.raises(keyfence.InvalidArgument, match="isolated"):
        sign.Engine(agent=a.socket, key_process="/bin/true")
    with pytest.raises(keyfence.InvalidArgumentType) as wrong:
        sign.Engine(agent=5)  # type: ignore[arg-type]
    assert isinstance(wrong.value, TypeError)
    with pytest.raises(keyfence.InvalidArgument, match="empty"):
        sign.Engine(agent="")
    # No agent listening: the engine is not made, and says why, at once.
    t = time.monotonic()
    with pytest.raises(keyfence.BackendFailed, match="agent"):
        sign.Engine(agent=tmp_path / "nobody.sock")
    assert time.monotonic() - t < 10
    # Envelopes without a store and machine key need an agent's engine.
    env = (a.dir / "key.env").read_bytes()
    with sign.Engine() as local:
        assert local.agent is None and repr(local) == "<keyfence.sign.Engine>"
        for load in (
            lambda: sign.PrivateKey.load_envelope(env, engine=local),
            lambda: sign.PrivateKey.load_envelope(None, None, env, engine=local),
            lambda: sign.PrivateKey.load_envelope(a.dir / "store", None, env, engine=local),
            lambda: sign.PrivateKey.load_envelope(env),
        ):
            with pytest.raises(keyfence.InvalidArgument, match="key agent") as e:
                load()
            assert not isinstance(e.value, TypeError)
        # With both, as before: opened here.
        key = sign.PrivateKey.load_envelope(a.dir / "store", a.dir / "machine.key", env, engine=local)
        assert key.is_local
        verify_ec(a, local.sign_sync(key, "ecdsa-p256-sha256", MSG))
    assert os.path.exists(a.socket)
