"""Signing without asyncio, every signature verified by pyca/cryptography."""

from __future__ import annotations

from typing import Any, Callable, Dict

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding

import keyfence
from keyfence import sign


def verify(pyca_key: Any, alg: str, sig: bytes, data: bytes) -> None:
    pub = pyca_key.public_key()
    if alg.startswith("ecdsa-p256"):
        pub.verify(sig, data, ec.ECDSA(hashes.SHA256()))
    elif alg.startswith("ecdsa-p384"):
        pub.verify(sig, data, ec.ECDSA(hashes.SHA384()))
    elif alg == "ed25519":
        pub.verify(sig, data)
    elif alg == "rsa-pss-sha256":
        pub.verify(sig, data, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())
    elif alg == "rsa-pkcs1-sha256":
        pub.verify(sig, data, padding.PKCS1v15(), hashes.SHA256())
    else:
        raise AssertionError(alg)


CASES = [
    ("p256", "ecdsa-p256-sha256"),
    ("p384", "ecdsa-p384-sha384"),
    ("ed25519", "ed25519"),
    ("rsa2048", "rsa-pss-sha256"),
    ("rsa2048", "rsa-pkcs1-sha256"),
]


@pytest.mark.parametrize("kind,alg", CASES)
def test_sign_sync_verifies_with_pyca(kind: str, alg: str, pems: Dict[str, bytes], pyca_keys: Dict[str, Any]) -> None:
    with sign.Engine() as engine:
        key = sign.PrivateKey.from_pem(pems[kind])
        data = b"TLS 1.3, server CertificateVerify" + bytes(range(64))
        sig = engine.sign_sync(key, alg, data)
        verify(pyca_keys[kind], alg, sig, data)
        # The public half matches pyca's.
        der = pyca_keys[kind].public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        assert key.public_key_der() == der


def test_pem_as_text_and_der(pems: Dict[str, bytes], pyca_keys: Dict[str, Any]) -> None:
    sign.PrivateKey.from_pem(pems["p256"].decode())
    der = pyca_keys["p256"].private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    assert sign.PrivateKey.from_pem(der).public_key_der() == sign.PrivateKey.from_pem(pems["p256"]).public_key_der()


def test_bad_keys() -> None:
    with pytest.raises(keyfence.InvalidPrivateKey) as e:
        sign.PrivateKey.from_pem(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
    assert isinstance(e.value, ValueError) and e.value.code == "INVALID_PRIVATE_KEY"
    secp256k1 = ec.generate_private_key(ec.SECP256K1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with pytest.raises(keyfence.InvalidPrivateKey, match="(?i)secp256k1|curve"):
        sign.PrivateKey.from_pem(secp256k1)
    with pytest.raises(TypeError):
        sign.PrivateKey.from_pem(12)  # type: ignore[arg-type]


def test_bad_requests(pems: Dict[str, bytes]) -> None:
    with sign.Engine() as engine:
        ec_key = sign.PrivateKey.from_pem(pems["p256"])
        with pytest.raises(keyfence.InvalidRequest) as e:
            engine.sign_sync(ec_key, "rsa-pss-sha256", b"x")
        assert e.value.code == "INVALID_REQUEST"
        with pytest.raises(keyfence.InvalidRequest):
            engine.sign_sync(ec_key, "no-such-algorithm", b"x")
        with pytest.raises(TypeError):
            engine.sign_sync(ec_key, "ecdsa-p256-sha256", "text")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            engine.sign_sync("key", "ecdsa-p256-sha256", b"x")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            engine.sign_sync(ec_key, "ecdsa-p256-sha256", b"x", timeout=-1)


def test_engine_options_are_checked() -> None:
    with pytest.raises(ValueError):
        sign.Engine(threads=0)
    with pytest.raises(TypeError):
        sign.Engine(threads="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sign.Engine(key_process="/bin/true")
    with pytest.raises(TypeError):
        sign.Engine(2)  # type: ignore[misc]


def test_closed_engine(pems: Dict[str, bytes]) -> None:
    engine = sign.Engine()
    key = sign.PrivateKey.from_pem(pems["p256"])
    engine.close()
    engine.close()
    assert engine.closed and "closed" in repr(engine)
    with pytest.raises(keyfence.ShutDown, match="closed"):
        engine.sign_sync(key, "ecdsa-p256-sha256", b"x")
    with pytest.raises(keyfence.ShutDown, match="closed"):
        engine.metrics()


def test_metrics_count_operations(pems: Dict[str, bytes]) -> None:
    with sign.Engine(ec_threads=1, queue_capacity=64) as engine:
        key = sign.PrivateKey.from_pem(pems["p256"])
        for _ in range(5):
            engine.sign_sync(key, "ecdsa-p256-sha256", b"x")
        m = engine.metrics()
        assert set(m) == {"rsa", "ec", "slow", "token"}
        assert m["ec"]["completed"] == 5 and m["ec"]["workers"] == 1 and m["ec"]["queue_capacity"] == 64
        assert m["rsa"]["completed"] == 0


def test_key_from_envelope(tmp_path: Any, pems: Dict[str, bytes], pyca_keys: Dict[str, Any]) -> None:
    auth = keyfence.wrap.Authority.init(tmp_path / "store")
    env = auth.wrap("region: EU", pems["p256"])
    machine = keyfence.wrap.Machine(auth.issue({"region": "EU"}), tmp_path / "store")
    with sign.Engine() as engine:
        key = sign.PrivateKey.from_envelope(machine, env)
        sig = engine.sign_sync(key, "ecdsa-p256-sha256", b"m")
        verify(pyca_keys["p256"], "ecdsa-p256-sha256", sig, b"m")
    us = keyfence.wrap.Machine(auth.issue({"region": "US"}), tmp_path / "store")
    with pytest.raises(keyfence.PolicyNotSatisfied):
        sign.PrivateKey.from_envelope(us, env)


def test_threads_share_one_engine(
    pems: Dict[str, bytes], pyca_keys: Dict[str, Any], in_threads: Callable[[int, Callable[[int], None]], None]
) -> None:
    errors: list[BaseException] = []
    with sign.Engine() as engine:
        key = sign.PrivateKey.from_pem(pems["ed25519"])

        def work(i: int) -> None:
            try:
                for j in range(50):
                    data = f"{i}/{j}".encode()
                    verify(pyca_keys["ed25519"], "ed25519", engine.sign_sync(key, "ed25519", data), data)
            except BaseException as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        in_threads(4, work)
    assert not errors


def test_key_repr_hides_the_key(pems: Dict[str, bytes]) -> None:
    key = sign.PrivateKey.from_pem(pems["p256"])
    assert repr(key) == "<keyfence.sign.PrivateKey (secret)>"
