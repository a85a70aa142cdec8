"""Uses the public API as a service would; `mypy --strict` must accept it
(test_typing.py). Not a test module: it is only type-checked."""

from __future__ import annotations

import asyncio

import keyfence
from keyfence import abe, policy, sign, wrap


def cpabe() -> bytes:
    pk, msk = abe.setup()
    key: abe.AttributeKey = abe.keygen(msk, {"country": "FR", "region": "EU"})
    ct: bytes = abe.encrypt(pk, "region: EU and not country: DE", b"...")
    ok: bool = abe.could_decrypt({"region": "EU"}, ct) and policy.check("a: b", {"a": "b"})
    text: str = abe.policy_of(ct) + policy.canonical("a: b")
    pk2 = abe.PublicKey.from_bytes(pk.to_bytes())
    same: bool = pk == pk2 and hash(pk) == hash(pk2)
    del ok, text, pk2, same
    try:
        return abe.decrypt(key, ct)
    except keyfence.PolicySyntaxError as e:
        pos: int | None = e.position
        raise ValueError(pos) from e
    except keyfence.KeyfenceError as e:
        code: str = e.code
        raise RuntimeError(code) from e


def wrapping(path: str) -> bytes:
    with wrap.Authority.init(path) as auth:
        machine_key: bytes = auth.issue({"region": "EU"})
        envelope: bytes = auth.wrap("region: EU", b"secret")
        n: int = auth.rotate_master()
    m = wrap.Machine(machine_key, path)
    del n
    return m.open(envelope) if m.could_open(envelope) else b""


async def signing(pem: bytes) -> bytes:
    with sign.Engine(threads=2, queue_capacity=1024, timeout=0.5, isolated=False) as engine:
        key = sign.PrivateKey.from_pem(pem)
        held: sign.PrivateKey = sign.PrivateKey.from_pem(pem, engine=engine)
        loaded: sign.PrivateKey = engine.load_key(pem)
        none: sign.PrivateKey = sign.PrivateKey.from_pem(pem, engine=None)
        del held, loaded, none
        sig: bytes = await engine.sign(key, "ecdsa-p256-sha256", b"data")
        sig2: bytes = engine.sign_sync(key, "rsa-pss-sha256", b"data", timeout=1.0)
        workers: int = engine.metrics()["ec"]["workers"]
        del sig2, workers
        return sig


async def agent_signing(envelope: bytes) -> bytes:
    with sign.Engine(agent="/run/keyfence/agent.sock", timeout=0.5) as engine:
        socket: str | None = engine.agent
        key = sign.PrivateKey.load_envelope(envelope, engine=engine)
        same = sign.PrivateKey.load_envelope(None, None, envelope, engine=engine)
        del socket, same
        return await engine.sign(key, "ecdsa-p256-sha256", b"data")


async def token_signing(uri: str) -> bytes:
    with sign.Engine(isolated=True, token_threads=4) as engine:
        key: sign.PrivateKey = engine.load_pkcs11(uri)
        here: sign.PrivateKey = sign.PrivateKey.load_pkcs11(uri)
        held: sign.PrivateKey = sign.PrivateKey.load_pkcs11(uri, engine=engine)
        completed: int = engine.metrics()["token"]["completed"]
        del here, held, completed
        try:
            return await engine.sign(key, "ecdsa-p256-sha256", b"data")
        except keyfence.TokenLogin as e:
            code: str = e.code
            raise PermissionError(code) from e


def remote_signing(machine: wrap.Machine, envelope: bytes) -> bool:
    peers = [sign.Peer("sfo1", "127.0.0.1:7543", {"country": "US"}), sign.Peer("iad1", "[::1]:7543", {}, "iad1.mesh")]
    with sign.RemoteSigner(peers, cert="c.pem", key="c.key", ca="ca.pem", tenant=3, request_timeout=0.5) as remote:
        key: sign.PrivateKey = remote.open_or_forward(machine, envelope)
        with sign.Engine(isolated=True) as engine:
            here = sign.PrivateKey.from_envelope(machine, envelope, engine=engine)
            del here
        text: str = remote.metrics()
        del text
        return key.is_local


if __name__ == "__main__":
    asyncio.run(signing(b""))
