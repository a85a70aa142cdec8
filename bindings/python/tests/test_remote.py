"""Remote signing against a real `keyfence serve` on loopback: a Tokyo
machine that may not open a US-only key signs with it through the US server
(pyca/cryptography verifies), and every failure is a typed exception in
bounded time."""

from __future__ import annotations

import asyncio
import os
import pathlib
import time

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

import keyfence
from keyfence import sign, wrap

US = {"country": "US", "region": "NA"}
MSG = b"a TLS handshake from Tokyo"


def remote(d: pathlib.Path, attributes: dict[str, str] = US, client: str = "client", **kw: object) -> sign.RemoteSigner:
    addr = (d / "server.addr").read_text().strip()
    return sign.RemoteSigner(
        [sign.Peer("sfo1", addr, attributes)],
        cert=d / f"{client}.pem",
        key=d / f"{client}.key",
        ca=d / "ca.pem",
        **kw,  # type: ignore[arg-type]
    )


def verify(d: pathlib.Path, signature: bytes) -> None:
    pub = serialization.load_pem_public_key((d / "key.pub.pem").read_bytes())
    assert isinstance(pub, ec.EllipticCurvePublicKey)
    pub.verify(signature, MSG, ec.ECDSA(hashes.SHA256()))


def test_a_key_this_machine_may_not_open_is_signed_by_the_server_that_may(key_server: pathlib.Path) -> None:
    d = key_server
    env = (d / "key.env").read_bytes()
    tokyo = wrap.Machine((d / "nrt1.machine").read_bytes(), d / "store")
    sfo = wrap.Machine((d / "sfo1.machine").read_bytes(), d / "store")
    with sign.Engine(timeout=3.0) as engine, remote(d, tenant=7) as r:
        key = r.open_or_forward(tokyo, env)
        assert not key.is_local
        verify(d, engine.sign_sync(key, "ecdsa-p256-sha256", MSG))

        async def main() -> bytes:
            return await engine.sign(key, "ecdsa-p256-sha256", MSG)

        verify(d, asyncio.run(main()))
        # The public half the server reports is the envelope's key's.
        pub = serialization.load_pem_public_key((d / "key.pub.pem").read_bytes())
        assert key.public_key_der() == pub.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        # The US machine opens it here.
        local = r.open_or_forward(sfo, env)
        assert local.is_local
        verify(d, engine.sign_sync(local, "ecdsa-p256-sha256", MSG))
        # Metrics: per peer in the signer's text, and in the engine's once attached.
        assert 'peer="sfo1"' in r.metrics()
        assert "keyfence_remote_client" not in engine.metrics_prometheus()
        engine.attach_remote(r)
        text = engine.metrics_prometheus()
        assert "keyfence_engine_" in text and "keyfence_remote_client_operations_total" in text
        assert repr(r) == "<keyfence.sign.RemoteSigner>"
    assert r.closed
    with pytest.raises(keyfence.ShutDown, match="closed"):
        r.key(env)


def test_refusals_are_typed(key_server: pathlib.Path) -> None:
    d = key_server
    env = (d / "key.env").read_bytes()
    with remote(d, {"country": "DE"}) as eu:
        with pytest.raises(keyfence.BackendFailed, match="no configured peer"):
            eu.key(env)
        with pytest.raises(keyfence.InvalidEnvelope):
            eu.key(env[:-1])
        with pytest.raises(TypeError):
            eu.key("text")  # type: ignore[arg-type]
    # A client certificate from another CA gets nothing.
    with remote(d, client="stranger") as stranger:
        with pytest.raises(keyfence.BackendFailed):
            stranger.key(env)
    addr = (d / "server.addr").read_text().strip()
    tls = {"cert": d / "client.pem", "key": d / "client.key", "ca": d / "ca.pem"}
    with pytest.raises(keyfence.InvalidConfig):
        sign.RemoteSigner([], **tls)  # type: ignore[arg-type]
    with pytest.raises(keyfence.InvalidConfig, match="not host:port"):
        sign.RemoteSigner([sign.Peer("x", "not an address", US)], **tls)  # type: ignore[arg-type]
    with pytest.raises(keyfence.InvalidAttributes):
        sign.RemoteSigner([sign.Peer("x", addr, {"a": ""})], **tls)  # type: ignore[arg-type]
    with pytest.raises(keyfence.InvalidConfig):
        sign.RemoteSigner([sign.Peer("x", addr, US)], cert=d / "missing.pem", key=d / "client.key", ca=d / "ca.pem")
    with pytest.raises(TypeError):
        sign.RemoteSigner("sfo1", **tls)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sign.RemoteSigner([sign.Peer("x", addr, US)], max_attempts=0, **tls)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sign.RemoteSigner([sign.Peer("x", addr, US)], request_timeout=-1, **tls)  # type: ignore[arg-type]


def test_a_killed_server_fails_in_bounded_time(key_server: pathlib.Path) -> None:
    d = key_server
    with sign.Engine(timeout=3.0) as engine, remote(d) as r:
        key = r.key((d / "key.env").read_bytes())
        verify(d, engine.sign_sync(key, "ecdsa-p256-sha256", MSG))
        os.kill(int((d / "server.pid").read_text()), 9)
        t = time.monotonic()
        with pytest.raises((keyfence.BackendFailed, keyfence.TimedOut)):
            engine.sign_sync(key, "ecdsa-p256-sha256", MSG)
        assert time.monotonic() - t < 5
