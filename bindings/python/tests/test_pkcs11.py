"""Keys in a PKCS#11 token from Python (a SoftHSM2 token made by
vectors/softhsm-fixture.sh): every algorithm signs and pyca/cryptography
verifies against the public key openssl wrote when it made the key; each
failure an operator meets raises its class; with a key process the token's
module is never mapped into this process, while a load in this process
maps it; no PIN shows in a repr or a message.

SoftHSM reads SOFTHSM2_CONF once per process, when the module is first
loaded, and a key process inherits this process's environment: the
module's fixture sets both for the module's tests. The tests that load the
module into this process come after the ones that check it never was.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding

import keyfence
from keyfence import sign

REPO = pathlib.Path(__file__).resolve().parents[3]

# (label on the token, algorithm): every algorithm family a token key signs.
CASES: List[Tuple[str, str]] = [
    ("tls-p256", "ecdsa-p256-sha256"),
    ("tls-p384", "ecdsa-p384-sha384"),
    ("tls-rsa", "rsa-pkcs1-sha256"),
    ("tls-rsa", "rsa-pss-sha256"),
    ("tls-ed", "ed25519"),
]


class Token:
    """The fixture's folder: the token `edge` with the keys of CASES (their
    PEMs in keys/), its PIN file, and `doomed`, a second token whose folder
    a test deletes while a key of it is in use."""

    def __init__(self, d: pathlib.Path) -> None:
        self.dir = d
        self.env: Dict[str, str] = dict(
            line.split("=", 1) for line in (d / "env").read_text().splitlines() if "=" in line
        )
        self.module = self.env["KEYFENCE_PKCS11_MODULE"]
        self.pin = (d / "pin").read_text().splitlines()[0]
        # Not the right PIN, nor part of it.
        self.bad_pin = "86420975" if self.pin == "97531864" else "97531864"
        (d / "badpin").write_text(self.bad_pin + "\n")

    def uri(self, label: str, pin_file: str = "pin", token: str = "edge") -> str:
        """The URI of `label`, with the module and the PIN file named in it."""
        return (
            f"pkcs11:token={token};object={label};type=private"
            f"?module-path={self.module}&pin-source=file:{self.dir / pin_file}"
        )

    def public_key(self, label: str) -> Any:
        """The public key openssl made `label` with (not the token's)."""
        pem = (self.dir / "keys" / f"{label}.pem").read_bytes()
        return serialization.load_pem_private_key(pem, None).public_key()


def _init_doomed(d: pathlib.Path, env: Dict[str, str]) -> None:
    """A second token, `doomed` (PIN 4321), with one P-256 key `k`; its
    folder is named in d/doomed.folder. Made now: SoftHSM lists the tokens
    it finds when a process first loads it."""
    before = set((d / "tokens").iterdir())
    run_env = {**os.environ, "SOFTHSM2_CONF": env["SOFTHSM2_CONF"]}
    util = ["softhsm2-util"]
    subprocess.run(
        [*util, "--init-token", "--free", "--label", "doomed", "--pin", "4321", "--so-pin", "8765"],
        env=run_env, check=True, capture_output=True,
    )
    (folder,) = set((d / "tokens").iterdir()) - before
    (d / "doomed.folder").write_text(str(folder))
    (d / "doomed.pin").write_text("4321\n")
    key = ec.generate_private_key(ec.SECP256R1())
    pem = d / "keys" / "doomed.pem"
    pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    subprocess.run(
        [*util, "--import", str(pem), "--token", "doomed", "--label", "k", "--id", "01", "--pin", "4321"],
        env=run_env, check=True, capture_output=True,
    )


@pytest.fixture(scope="module")
def token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Token]:
    d = tmp_path_factory.mktemp("pkcs11")
    r = subprocess.run(["bash", str(REPO / "vectors" / "softhsm-fixture.sh"), str(d)], capture_output=True, text=True, timeout=300)
    if r.returncode == 77:
        # The fixture itself fails instead when KEYFENCE_REQUIRE_SERVERS is set.
        pytest.skip(r.stderr.strip())
    assert r.returncode == 0, r.stderr
    t = Token(d)
    _init_doomed(d, t.env)
    saved = {k: os.environ.get(k) for k in t.env}
    os.environ.update(t.env)
    try:
        yield t
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def verify(public: Any, alg: str, sig: bytes, data: bytes) -> None:
    """pyca/cryptography's verdict (raises InvalidSignature)."""
    if alg == "ecdsa-p256-sha256":
        public.verify(sig, data, ec.ECDSA(hashes.SHA256()))
    elif alg == "ecdsa-p384-sha384":
        public.verify(sig, data, ec.ECDSA(hashes.SHA384()))
    elif alg == "rsa-pkcs1-sha256":
        public.verify(sig, data, padding.PKCS1v15(), hashes.SHA256())
    elif alg == "rsa-pss-sha256":
        public.verify(sig, data, padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.DIGEST_LENGTH), hashes.SHA256())
    elif alg == "ed25519":
        public.verify(sig, data)
    else:
        raise AssertionError(alg)


def spki(public: Any) -> bytes:
    return bytes(public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


def softhsm_mapped() -> bool:
    """Whether this process has mapped SoftHSM's module."""
    return "libsofthsm2" in pathlib.Path("/proc/self/maps").read_text()


def sign_every_algorithm(engine: sign.Engine, token: Token) -> None:
    """Each case signed through `engine`, without and with asyncio, and
    verified by pyca against openssl's public key."""
    keys = {label: engine.load_pkcs11(token.uri(label)) for label in {label for label, _ in CASES}}
    for label, key in keys.items():
        assert key.public_key_der() == spki(token.public_key(label)), label
    for label, alg in CASES:
        data = f"{label} signs with {alg}".encode()
        sig = engine.sign_sync(keys[label], alg, data)
        verify(token.public_key(label), alg, sig, data)
        with pytest.raises(InvalidSignature):  # the check can fail
            verify(token.public_key(label), alg, sig, b"another message")

    async def many() -> List[bytes]:
        return await asyncio.gather(*(engine.sign(keys[label], alg, b"%d" % i) for i, (label, alg) in enumerate(CASES * 10)))

    for i, ((label, alg), sig) in enumerate(zip(CASES * 10, asyncio.run(many()))):
        verify(token.public_key(label), alg, sig, b"%d" % i)


# --- Through the key process: this process never maps the module. -------


def test_isolated_every_algorithm_and_the_module_is_never_mapped_here(token: Token) -> None:
    assert not softhsm_mapped(), "a test before this one loaded the token's module into this process"
    with sign.Engine(isolated=True) as engine:
        sign_every_algorithm(engine, token)
        # The module and PIN from the environment the key process inherited.
        key = sign.PrivateKey.load_pkcs11("pkcs11:token=edge;object=tls-p256", engine=engine)
        assert key.is_local is False
        verify(token.public_key("tls-p256"), "ecdsa-p256-sha256", engine.sign_sync(key, "ecdsa-p256-sha256", b"m"), b"m")
        # Here the held keys count on the classes of their kinds; the
        # token's threads are the key process's.
        m = engine.metrics()
        assert m["token"]["completed"] == 0 and m["ec"]["completed"] > 0 and m["rsa"]["completed"] > 0, m
    assert not softhsm_mapped(), "an isolated engine's token key mapped the module into this process"


def test_a_load_here_maps_the_module_in_a_subprocess(token: Token) -> None:
    """The control for the test above: the same check finds the module in
    a process that loaded the key itself (a subprocess, so this one stays
    clean)."""
    script = textwrap.dedent(
        f"""
        import pathlib, keyfence
        maps = lambda: "libsofthsm2" in pathlib.Path("/proc/self/maps").read_text()
        assert not maps()
        with keyfence.sign.Engine(isolated=True) as engine:
            engine.sign_sync(engine.load_pkcs11({token.uri("tls-ed")!r}), "ed25519", b"m")
        assert not maps()
        key = keyfence.sign.PrivateKey.load_pkcs11({token.uri("tls-ed")!r})
        assert key.is_local is False
        with keyfence.sign.Engine() as engine:
            assert len(engine.sign_sync(key, "ed25519", b"m")) == 64
        print("mapped" if maps() else "not mapped")
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "mapped", r.stdout


def test_isolated_refusals_never_show_the_pin(token: Token) -> None:
    with sign.Engine(isolated=True) as engine:
        with pytest.raises(keyfence.KeyfenceError) as e:
            engine.load_pkcs11(f"pkcs11:token=edge;object=tls-p256?module-path={token.module}&pin-value={token.bad_pin}")
        assert "pin-source" in str(e.value) and token.bad_pin not in str(e.value) + repr(e.value)
        with pytest.raises(keyfence.KeyfenceError) as e:
            engine.load_pkcs11(token.uri("no-such-key"))
        assert "no-such-key" in str(e.value) and token.pin not in str(e.value)
        # The engine goes on.
        key = engine.load_pkcs11(token.uri("tls-p256"))
        assert engine.sign_sync(key, "ecdsa-p256-sha256", b"m")
    assert not softhsm_mapped()


def test_isolated_load_errors_have_the_codes_of_a_load_here(token: Token) -> None:
    with sign.Engine(isolated=True) as engine:
        with pytest.raises(keyfence.InvalidPrivateKey):
            engine.load_pkcs11(token.uri("no-such-key"))
        with pytest.raises(keyfence.InvalidArgument):
            engine.load_pkcs11("pkcs11:token=edge;object=tls-p256?pin-value=1234")


def test_isolated_a_refused_pin_is_token_login(token: Token) -> None:
    with sign.Engine(isolated=True) as engine:
        with pytest.raises(keyfence.TokenLogin):
            engine.load_pkcs11(token.uri("tls-p256", pin_file="badpin"))


def test_still_not_mapped_here(token: Token) -> None:
    assert not softhsm_mapped()


# --- In this process: from here on the module is mapped. ----------------


def test_a_refused_pin_is_token_login_and_a_permission_error(token: Token) -> None:
    # Before any right PIN in this process, so that the token itself
    # refuses this one.
    uri = token.uri("tls-p256", pin_file="badpin")
    with pytest.raises(keyfence.TokenLogin) as e:
        sign.PrivateKey.load_pkcs11(uri)
    err = e.value
    assert isinstance(err, PermissionError) and isinstance(err, keyfence.KeyfenceError)
    assert (err.code, err.number) == ("TOKEN_LOGIN", 510)
    assert "PIN" in str(err)
    # Not tried a second time.
    with pytest.raises(keyfence.TokenLogin, match="does not try it again") as again:
        sign.PrivateKey.load_pkcs11(uri)
    for text in (str(err), repr(err), str(again.value), repr(again.value)):
        assert token.bad_pin not in text and token.pin not in text, text
    # A generic handler of access errors catches it.
    try:
        sign.PrivateKey.load_pkcs11(uri)
    except PermissionError:
        pass


def test_every_algorithm_in_this_process(token: Token) -> None:
    with sign.Engine(token_threads=3) as engine:
        sign_every_algorithm(engine, token)
        m = engine.metrics()
        assert set(m) == {"rsa", "ec", "slow", "token"}
        assert m["token"]["workers"] == 3
        # Every token signature ran on the token class.
        assert m["token"]["completed"] == 5 + 50, m["token"]
        assert m["ec"]["completed"] == m["rsa"]["completed"] == 0, m
        assert 'class="token"' in engine.metrics_prometheus()
    assert softhsm_mapped()


def test_a_key_loaded_without_an_engine_signs_with_any(token: Token) -> None:
    key = sign.PrivateKey.load_pkcs11(token.uri("tls-p384"))
    assert key.is_local is False
    assert repr(key) == "<keyfence.sign.PrivateKey (secret)>"
    with sign.Engine() as engine:
        sig = engine.sign_sync(key, "ecdsa-p384-sha384", b"m")
    verify(token.public_key("tls-p384"), "ecdsa-p384-sha384", sig, b"m")
    with pytest.raises(keyfence.InvalidRequest):
        with sign.Engine() as engine:
            engine.sign_sync(key, "rsa-pss-sha256", b"m")


def test_each_failure_raises_its_class(token: Token) -> None:
    with pytest.raises(keyfence.InvalidPrivateKey, match="no-such-key") as e:
        sign.PrivateKey.load_pkcs11(token.uri("no-such-key"))
    assert isinstance(e.value, ValueError) and e.value.code == "INVALID_PRIVATE_KEY"
    # No such token: the message lists the module's tokens.
    with pytest.raises(keyfence.InvalidPrivateKey, match="edge"):
        sign.PrivateKey.load_pkcs11(token.uri("tls-p256", token="no-such-token"))
    with pytest.raises(keyfence.InvalidConfig):
        sign.PrivateKey.load_pkcs11("pkcs11:token=edge;object=tls-p256?module-path=/nonexistent/libnothing.so")
    with pytest.raises(keyfence.InvalidArgument, match="pin-source") as e:
        sign.PrivateKey.load_pkcs11(f"pkcs11:token=edge;object=tls-p256?pin-value={token.pin}")
    assert token.pin not in str(e.value) + repr(e.value)
    with pytest.raises(keyfence.InvalidArgument):
        sign.PrivateKey.load_pkcs11("not a uri")
    with pytest.raises(keyfence.InvalidArgument, match="PIN file"):
        sign.PrivateKey.load_pkcs11(token.uri("tls-p256", pin_file="no-such-pin-file"))
    with pytest.raises(keyfence.InvalidArgumentType, match="uri must be a str"):
        sign.PrivateKey.load_pkcs11(token.uri("tls-p256").encode())  # type: ignore[arg-type]
    with pytest.raises(keyfence.InvalidArgumentType):
        sign.PrivateKey.load_pkcs11(token.uri("tls-p256"), engine="an engine")  # type: ignore[arg-type]
    with pytest.raises(keyfence.InvalidArgumentType):
        sign.PrivateKey.load_pkcs11(token.uri("tls-p256"), None)  # type: ignore[misc]
    engine = sign.Engine()
    engine.close()
    with pytest.raises(keyfence.ShutDown):
        engine.load_pkcs11(token.uri("tls-p256"))


def test_a_token_whose_files_go_away_fails_only_as_the_token(token: Token) -> None:
    """The token's folder deleted while a key of it is loaded: keyfence
    signs through a session copy of the key, in the module's memory, so
    signatures may go on; what fails, fails as TokenUnavailable (a
    ConnectionError), and loading the key again is refused with the
    token's or the key's class. Nothing hangs."""
    uri = f"pkcs11:token=doomed;object=k?module-path={token.module}&pin-source=file:{token.dir / 'doomed.pin'}"
    public = serialization.load_pem_private_key((token.dir / "keys" / "doomed.pem").read_bytes(), None).public_key()
    with sign.Engine() as engine:
        key = engine.load_pkcs11(uri)
        verify(public, "ecdsa-p256-sha256", engine.sign_sync(key, "ecdsa-p256-sha256", b"m"), b"m")
        shutil.rmtree((token.dir / "doomed.folder").read_text())

        async def later() -> bytes:
            return await engine.sign(key, "ecdsa-p256-sha256", b"m")

        # Without and with asyncio (through the completion queue).
        for attempt in [lambda: engine.sign_sync(key, "ecdsa-p256-sha256", b"m")] * 10 + [lambda: asyncio.run(later())] * 10:
            try:
                verify(public, "ecdsa-p256-sha256", attempt(), b"m")
            except keyfence.TokenUnavailable as e:
                assert isinstance(e, ConnectionError) and (e.code, e.number) == ("TOKEN_UNAVAILABLE", 509), repr(e)
        with pytest.raises((keyfence.InvalidPrivateKey, keyfence.TokenUnavailable)):
            engine.load_pkcs11(uri)
        # The other token is untouched.
        other = engine.load_pkcs11(token.uri("tls-p256"))
        assert engine.sign_sync(other, "ecdsa-p256-sha256", b"m")


def test_token_unavailable_is_a_connection_error_and_token_login_a_permission_error() -> None:
    """What the two codes raise, whichever call meets them (a token that
    stops answering cannot be made on demand: SoftHSM2 keeps a session's
    key in memory)."""
    gone = keyfence.exceptions._from_code(509, "pkcs11:token=edge: the token does not answer")
    assert type(gone) is keyfence.TokenUnavailable and isinstance(gone, ConnectionError) and isinstance(gone, OSError)
    assert (gone.code, gone.number, str(gone)) == ("TOKEN_UNAVAILABLE", 509, "pkcs11:token=edge: the token does not answer")
    refused = keyfence.exceptions._from_code(510, "pkcs11:token=edge: the token refused the PIN")
    assert type(refused) is keyfence.TokenLogin and isinstance(refused, PermissionError)
    assert refused.code == "TOKEN_LOGIN" and "TokenLogin(" in repr(refused)
    # Neither is mistaken for the other, nor for a key process's failure.
    assert not isinstance(gone, (PermissionError, keyfence.BackendFailed)) and not isinstance(refused, ConnectionError)
