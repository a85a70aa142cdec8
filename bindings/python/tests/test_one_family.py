"""Every error the package raises is a keyfence.KeyfenceError, with its
code and a message that says what went wrong (docs/python.md: "exceptions
of one family"). The walk is by introspection: every public function, class
and method of keyfence, keyfence.policy, .abe, .wrap and .sign, called
with arguments of the wrong type and number, on closed objects, and with
bytes that decode as nothing. A function added later is walked too."""

from __future__ import annotations

import asyncio
import datetime
import inspect
import pathlib
from typing import Any, Callable, Dict, Iterator, List, Mapping, Tuple

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import keyfence
from keyfence import _core, abe, policy, sign, wrap

MODULES = [keyfence, policy, abe, wrap, sign]
GARBAGE = [b"", b"\x00", b"not a keyfence object at all" * 3]


class Wrong:
    """A type no keyfence function takes."""

    def __repr__(self) -> str:
        return "Wrong()"


def check_error(e: BaseException, cls: type = keyfence.KeyfenceError) -> None:
    assert isinstance(e, cls), f"{type(e).__module__}.{type(e).__name__}: {e}"
    assert isinstance(e, keyfence.KeyfenceError)
    assert str(e).strip(), f"{type(e).__name__} with an empty message"
    assert e.code == _core.result_name(e.number), (e.code, e.number)
    assert "Invoked with" not in str(e), "argument values in a message"


def raised(call: Callable[[], Any]) -> BaseException:
    """The exception `call` raises (running it if it is a coroutine)."""
    try:
        result = call()
        if inspect.iscoroutine(result):
            asyncio.run(result)
    except BaseException as e:  # noqa: B036 (the test is about what escapes)
        return e
    raise AssertionError(f"no exception; returned {result!r}")


def tls_files(d: pathlib.Path) -> Dict[str, pathlib.Path]:
    """A CA and a client certificate it signed, enough to build a RemoteSigner."""
    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey, ca: bool) -> bytes:
        c = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .sign(signer, hashes.SHA256())
        )
        return c.public_bytes(serialization.Encoding.PEM)

    ca_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    files = {"ca": d / "ca.pem", "cert": d / "client.pem", "key": d / "client.key"}
    files["ca"].write_bytes(cert("test CA", ca_key, "test CA", ca_key, True))
    files["cert"].write_bytes(cert("client", client_key, "test CA", ca_key, False))
    files["key"].write_bytes(
        client_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return files


class World:
    """One live object of every public class, and valid arguments."""

    def __init__(self, tmp: pathlib.Path, pem: bytes) -> None:
        self.tmp = tmp
        self.pem = pem
        self.pk, self.msk = abe.setup()
        self.attr_key = abe.keygen(self.msk, {"region": "EU"})
        self.ct = abe.encrypt(self.pk, "region: EU", b"m")
        self.store = tmp / "store"
        self.authority = wrap.Authority.init(self.store)
        self.machine_key = self.authority.issue({"region": "EU"})
        self.envelope = self.authority.wrap("region: EU", pem)
        self.machine = wrap.Machine(self.machine_key, self.store)
        self.engine = sign.Engine(threads=1)
        self.key = sign.PrivateKey.from_pem(pem)
        self.tls = tls_files(tmp)
        self.peer = sign.Peer("peer", "127.0.0.1:9", {"region": "US"})
        self.remote = self.new_remote()

    def new_remote(self, peers: Any = None) -> sign.RemoteSigner:
        return sign.RemoteSigner([self.peer] if peers is None else peers, **self.tls)  # type: ignore[arg-type]

    def instances(self) -> Dict[type, object]:
        return {
            abe.PublicKey: self.pk,
            abe.MasterSecretKey: self.msk,
            abe.AttributeKey: self.attr_key,
            wrap.Authority: self.authority,
            wrap.Machine: self.machine,
            sign.Engine: self.engine,
            sign.PrivateKey: self.key,
            sign.RemoteSigner: self.remote,
            sign.Peer: self.peer,
        }

    def close(self) -> None:
        self.engine.close()
        self.remote.close()
        self.authority.close()


@pytest.fixture()
def world(tmp_path: pathlib.Path, pems: Dict[str, bytes]) -> Iterator[World]:
    w = World(tmp_path, pems["p256"])
    yield w
    w.close()


def public_callables(world: World) -> Iterator[Tuple[str, Callable[..., Any]]]:
    """Every public function, class and method, as (name, callable); methods
    bound to a live instance."""
    instances = world.instances()
    seen = set()
    for mod in MODULES:
        for name in mod.__all__:
            obj = getattr(mod, name)
            qual = f"{mod.__name__}.{name}"
            if inspect.ismodule(obj) or isinstance(obj, str) or id(obj) in seen:
                continue
            if isinstance(obj, type) and issubclass(obj, BaseException):
                continue
            seen.add(id(obj))
            yield qual, obj
            if isinstance(obj, type):
                assert obj in instances, f"no instance of {qual} to walk its methods"
                inst = instances[obj]
                for attr in dir(obj):
                    if attr.startswith("_") or isinstance(getattr(obj, attr, None), property):
                        continue
                    if any(attr in vars(base) for base in obj.__mro__ if base.__module__ == "builtins"):
                        continue  # a tuple's count and index, not keyfence's
                    member = getattr(inst, attr)
                    if callable(member):
                        yield f"{qual}.{attr}", member


def test_the_walk_finds_the_api(world: World) -> None:
    names = {n for n, _ in public_callables(world)}
    for expected in [
        "keyfence.policy.check",
        "keyfence.abe.decrypt",
        "keyfence.abe.PublicKey.from_bytes",
        "keyfence.wrap.Authority.rotate_master",
        "keyfence.wrap.Machine.open",
        "keyfence.sign.Engine.sign",
        "keyfence.sign.Engine.attach_remote",
        "keyfence.sign.PrivateKey.from_envelope",
        "keyfence.sign.RemoteSigner.open_or_forward",
    ]:
        assert expected in names


def test_wrong_types_and_counts_are_invalid_argument_type_errors(world: World) -> None:
    walked = 0
    for name, fn in public_callables(world):
        for n in range(1, 5):
            try:
                result = fn(*[Wrong()] * n)
                if inspect.iscoroutine(result):
                    result = asyncio.run(result)
            except BaseException as e:  # noqa: B036
                check_error(e, keyfence.InvalidArgumentType)
                assert isinstance(e, TypeError)
                walked += 1
                continue
            # Only a Peer takes anything: it is a record, whose fields are
            # checked where a RemoteSigner uses it.
            assert name == "keyfence.sign.Peer" and n >= 3, f"{name} accepted {n} wrong arguments: {result!r}"
            check_error(raised(lambda: world.new_remote([result])), keyfence.InvalidArgumentType)
    assert walked > 100


def test_the_reported_cases(world: World) -> None:
    e = raised(lambda: keyfence.policy.check(5, {}))  # type: ignore[arg-type]
    check_error(e, keyfence.InvalidArgumentType)
    assert isinstance(e, TypeError) and "policy must be str" in str(e)
    # Text that has no UTF-8 form, a NUL, a value out of range.
    check_error(raised(lambda: keyfence.policy.canonical("a: \ud800")), keyfence.InvalidArgument)
    check_error(raised(lambda: keyfence.policy.canonical("a: b\0")), keyfence.InvalidArgument)
    check_error(raised(lambda: sign.Engine(threads=0)), keyfence.InvalidArgument)
    check_error(raised(lambda: sign.Engine(timeout=-1)), keyfence.InvalidArgument)
    # No argument value (a plaintext, say) is copied into a message.
    e = raised(lambda: abe.encrypt(world.msk, "region: EU", b"the plaintext"))  # type: ignore[arg-type]
    check_error(e, keyfence.InvalidArgumentType)
    assert "the plaintext" not in str(e) and "plaintext" not in repr(e)


# Valid arguments for every public method of the objects that close; the
# test fails when a method is added without an entry here.
def engine_calls(w: World) -> Dict[str, Callable[[sign.Engine], Any]]:
    return {
        "sign": lambda e: e.sign(w.key, "ecdsa-p256-sha256", b"x"),
        "sign_sync": lambda e: e.sign_sync(w.key, "ecdsa-p256-sha256", b"x"),
        "load_key": lambda e: e.load_key(w.pem),
        "load_pkcs11": lambda e: e.load_pkcs11("pkcs11:token=edge;object=tls-p256"),
        "metrics": lambda e: e.metrics(),
        "metrics_prometheus": lambda e: e.metrics_prometheus(),
        "attach_remote": lambda e: e.attach_remote(w.remote),
    }


def remote_calls(w: World) -> Dict[str, Callable[[sign.RemoteSigner], Any]]:
    return {
        "key": lambda r: r.key(w.envelope),
        "open_or_forward": lambda r: r.open_or_forward(w.machine, w.envelope),
        "metrics": lambda r: r.metrics(),
    }


def authority_calls(w: World) -> Dict[str, Callable[[Any], Any]]:
    return {
        "issue": lambda a: a.issue({"region": "EU"}),
        "wrap": lambda a: a.wrap("region: EU", b"secret"),
        "rotate_master": lambda a: a.rotate_master(),
        "revoke": lambda a: a.revoke("0" * 32),
        "where": lambda a: a.where("region: EU"),
        "import_inventory": lambda a: a.import_inventory(""),
    }


def public_methods(obj: object) -> List[str]:
    cls = type(obj)
    return sorted(
        n
        for n in dir(cls)
        if not n.startswith("_")
        and n not in ("close", "init", "open")  # close is idempotent; init/open make new ones
        and not isinstance(getattr(cls, n), property)
        and callable(getattr(obj, n))
    )


def each_call_says_closed(obj: Any, calls: Mapping[str, Callable[[Any], Any]], cls: type) -> None:
    """Every public method of the closed `obj` (`calls` must name them all)
    raises `cls`, with a message that says it is closed."""
    assert sorted(calls) == public_methods(obj)
    for name, call in calls.items():
        e = raised(lambda: call(obj))
        check_error(e, cls)
        assert "closed" in str(e), (name, str(e))


def test_closed_objects(world: World) -> None:
    engine = sign.Engine()
    engine.close()
    each_call_says_closed(engine, engine_calls(world), keyfence.ShutDown)
    for load in (
        lambda: sign.PrivateKey.from_pem(world.pem, engine=engine),
        lambda: sign.PrivateKey.from_envelope(world.machine, world.envelope, engine=engine),
    ):
        check_error(raised(load), keyfence.ShutDown)

    remote = world.new_remote()
    remote.close()
    each_call_says_closed(remote, remote_calls(world), keyfence.ShutDown)
    # A live engine and a closed signer, and the other way round.
    check_error(raised(lambda: world.engine.attach_remote(remote)), keyfence.ShutDown)
    check_error(raised(lambda: engine.attach_remote(world.remote)), keyfence.ShutDown)

    authority = wrap.Authority.open(world.store)
    authority.close()
    each_call_says_closed(authority, authority_calls(world), keyfence.InvalidArgument)


def test_bad_bytes(world: World) -> None:
    w = world
    calls: Dict[str, Callable[[bytes], Any]] = {
        "abe.PublicKey.from_bytes": abe.PublicKey.from_bytes,
        "abe.MasterSecretKey.from_bytes": abe.MasterSecretKey.from_bytes,
        "abe.AttributeKey.from_bytes": abe.AttributeKey.from_bytes,
        "abe.decrypt": lambda b: abe.decrypt(w.attr_key, b),
        "abe.could_decrypt": lambda b: abe.could_decrypt({"region": "EU"}, b),
        "abe.policy_of": abe.policy_of,
        "wrap.Machine": lambda b: wrap.Machine(b, w.store),
        "wrap.Machine.open": w.machine.open,
        "wrap.Machine.could_open": w.machine.could_open,
        "sign.PrivateKey.from_pem": sign.PrivateKey.from_pem,
        "sign.PrivateKey.from_envelope": lambda b: sign.PrivateKey.from_envelope(w.machine, b),
        "sign.Engine.load_key": w.engine.load_key,
        "sign.RemoteSigner.key": w.remote.key,
        "sign.RemoteSigner.open_or_forward": lambda b: w.remote.open_or_forward(w.machine, b),
    }
    for name, call in calls.items():
        for bad in GARBAGE:
            for form in (bad, bytearray(bad), memoryview(bad)):
                e = raised(lambda: call(form))  # type: ignore[arg-type]
                check_error(e)
                assert not isinstance(e, keyfence.InvalidArgumentType), (name, e)


# What a message about an argument must never show: the native module's
# own names and pybind11's C++ types.
NATIVE_NAMES = ("kfpy", "::", "Handle<", "_core", "incompatible function arguments", "pybind11")


def test_a_wrong_keyfence_object_is_named_with_the_type_taken(world: World) -> None:
    """Every public callable given keyfence objects of the wrong class, in
    every position: InvalidArgumentType naming the argument and the type
    it takes, in the API's names, never pybind11's C++ types. (A remote
    signer is left out: attach_remote takes one.)"""
    w = world
    objects = [w.pk, w.msk, w.attr_key, w.authority, w.machine, w.engine, w.key]
    walked = 0
    for name, fn in public_callables(w):
        for obj in objects:
            for n in range(1, 5):
                try:
                    result = fn(*[obj] * n)
                    if inspect.iscoroutine(result):
                        result = asyncio.run(result)
                except BaseException as e:  # noqa: B036
                    check_error(e, keyfence.InvalidArgumentType)
                    assert not any(s in str(e) for s in NATIVE_NAMES), f"{name}: {e}"
                    walked += 1
                    continue
                assert name == "keyfence.sign.Peer" and n >= 3, f"{name} accepted {n} {obj!r}: {result!r}"
    assert walked > 500
    # The reported cases, word for word.
    cases: List[Tuple[Callable[[], Any], str]] = [
        (lambda: abe.encrypt(w.msk, "region: EU", b"m"), "pk must be a keyfence.abe.PublicKey, not 'keyfence.abe.MasterSecretKey'"),
        (lambda: abe.keygen(w.pk, {"a": "b"}), "msk must be a keyfence.abe.MasterSecretKey, not 'keyfence.abe.PublicKey'"),
        (lambda: abe.decrypt(w.msk, w.ct), "key must be a keyfence.abe.AttributeKey, not 'keyfence.abe.MasterSecretKey'"),
        (lambda: w.engine.sign_sync(w.msk, "ecdsa-p256-sha256", b"x"), "key must be a keyfence.sign.PrivateKey, not 'keyfence.abe.MasterSecretKey'"),
        (lambda: w.engine.sign(w.attr_key, "ecdsa-p256-sha256", b"x"), "key must be a keyfence.sign.PrivateKey, not 'keyfence.abe.AttributeKey'"),
        (lambda: sign.PrivateKey.from_envelope(w.authority, w.envelope), "machine must be a keyfence.wrap.Machine, not 'keyfence.wrap.Authority'"),
        (lambda: sign.PrivateKey.from_pem(w.pem, engine=w.machine), "engine must be a keyfence.sign.Engine or None, not 'keyfence.wrap.Machine'"),
        (lambda: sign.PrivateKey.load_envelope(w.envelope, engine=w.remote), "engine must be a keyfence.sign.Engine or None, not 'keyfence.sign.RemoteSigner'"),
        (lambda: abe.PublicKey.to_bytes(w.msk), "keyfence.abe.PublicKey.to_bytes() is a method of keyfence.abe.PublicKey, not of 'keyfence.abe.MasterSecretKey'"),
        (lambda: abe.PublicKey(), "keyfence.abe.PublicKey is not made by calling it: use keyfence.abe.setup() or PublicKey.from_bytes()"),
    ]
    for call, message in cases:
        e = raised(call)
        check_error(e, keyfence.InvalidArgumentType)
        assert isinstance(e, TypeError) and str(e) == message, str(e)


def all_members(world: World) -> Iterator[Tuple[str, Callable[..., Any]]]:
    """public_callables, and every public method unbound, from its class."""
    for name, fn in public_callables(world):
        yield name, fn
        if isinstance(fn, type):
            for attr in dir(fn):
                member = inspect.getattr_static(fn, attr)
                if attr.startswith("_") or isinstance(member, property) or not callable(getattr(fn, attr)):
                    continue  # a property, or a Peer's field
                if any(attr in vars(base) for base in fn.__mro__ if base.__module__ == "builtins"):
                    continue
                yield f"{name}.{attr} (unbound)", getattr(fn, attr)


# Classes only keyfence's functions make: calling one raises, whatever it
# is given, so its signature takes anything.
MADE_BY_FUNCTIONS = {abe.PublicKey, abe.MasterSecretKey, abe.AttributeKey, wrap.Authority, sign.PrivateKey}


def test_every_public_callable_has_a_signature(world: World) -> None:
    """inspect.signature works on every public function, class and method
    (bound and unbound), with the parameters' real names, and each says
    where it is public and what it does, in the API's names."""
    seen = 0
    for name, fn in all_members(world):
        sig = inspect.signature(fn)
        seen += 1
        assert not any(s in str(sig) for s in NATIVE_NAMES), (name, str(sig))
        kinds = {p.kind for p in sig.parameters.values()}
        if fn not in MADE_BY_FUNCTIONS and not name.startswith("keyfence.sign.PrivateKey.load_envelope"):
            assert inspect.Parameter.VAR_KEYWORD not in kinds, (name, str(sig))
            assert inspect.Parameter.VAR_POSITIONAL not in kinds, (name, str(sig))
        if not isinstance(fn, type):
            assert fn.__module__.startswith("keyfence.") and "_core" not in fn.__module__, (name, fn.__module__)
            assert fn.__qualname__ in name, (name, fn.__qualname__)
            assert fn.__doc__ and not any(s in fn.__doc__ for s in NATIVE_NAMES), (name, fn.__doc__)
    assert seen > 60
    w = world
    expected: Dict[Callable[..., Any], List[str]] = {
        abe.PublicKey.from_bytes: ["data"],
        abe.MasterSecretKey.to_bytes: ["self"],
        w.pk.to_bytes: [],
        wrap.Authority.init: ["store"],
        w.authority.issue: ["attributes"],
        w.authority.wrap: ["policy", "secret"],
        w.authority.revoke: ["machine_id"],
        wrap.Machine: ["machine_key", "store", "state"],
        w.machine.open: ["envelope"],
        w.machine.require: ["lists"],
        w.machine.newest_lists: [],
        w.machine.cache_stats: [],
        sign.PrivateKey.from_pem: ["pem", "engine"],
        sign.PrivateKey.from_envelope: ["machine", "envelope", "engine"],
        sign.PrivateKey.load_envelope: ["args", "engine"],
        sign.PrivateKey.load_pkcs11: ["uri", "engine"],
        w.key.public_key_der: [],
        sign.Engine.sign: ["self", "key", "algorithm", "data", "timeout"],
        w.engine.load_key: ["pem"],
        w.engine.load_pkcs11: ["uri"],
    }
    for fn, params in expected.items():
        assert list(inspect.signature(fn).parameters) == params, (fn, inspect.signature(fn))
    assert inspect.signature(sign.PrivateKey.from_pem).parameters["engine"].default is None
    assert inspect.signature(sign.PrivateKey.load_envelope).parameters["engine"].kind is inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(sign.PrivateKey.load_pkcs11).parameters["engine"].kind is inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(wrap.Machine).parameters["state"].kind is inspect.Parameter.KEYWORD_ONLY


def test_everything_that_closes_closes_in_a_with_block(world: World) -> None:
    """Each public class with close() is a context manager whose exit
    closes it (on an exception too); the test names how to make each."""
    w = world
    fresh: Dict[type, Callable[[], Any]] = {
        wrap.Authority: lambda: wrap.Authority.open(w.store),
        sign.Engine: lambda: sign.Engine(threads=1),
        sign.RemoteSigner: w.new_remote,
    }
    closing = sorted((c for c in w.instances() if callable(getattr(c, "close", None))), key=lambda c: c.__name__)
    assert sorted(fresh, key=lambda c: c.__name__) == closing
    for cls, make in fresh.items():
        with make() as obj:
            assert type(obj) is cls and not obj.closed
        assert obj.closed, cls
        with pytest.raises(RuntimeError):
            with make() as obj:
                raise RuntimeError("the block failed")
        assert obj.closed, cls


def test_secrets_and_handles_are_not_copied_or_pickled(world: World) -> None:
    """copy.copy, copy.deepcopy and pickle of a keyfence object that holds a
    secret, threads or connections raise InvalidArgumentType (a TypeError)
    saying so; a public key, immutable, copies as itself; a Peer is data."""
    import copy
    import pickle

    secrets = {abe.MasterSecretKey, abe.AttributeKey, wrap.Authority, wrap.Machine, sign.PrivateKey}
    handles = {sign.Engine, sign.RemoteSigner}
    instances = world.instances()
    assert secrets | handles | {abe.PublicKey, sign.Peer} == set(instances)
    for cls, obj in instances.items():
        if cls in secrets or cls in handles:
            for attempt in (lambda: copy.copy(obj), lambda: copy.deepcopy(obj), lambda: pickle.dumps(obj)):
                e = raised(attempt)
                check_error(e, keyfence.InvalidArgumentType)
                assert isinstance(e, TypeError) and "not copied or pickled" in str(e), str(e)
                assert ("holds a secret" in str(e)) == (cls in secrets), str(e)
                assert "Invoked" not in str(e) and "cannot pickle" not in str(e)
    pk = world.pk
    assert copy.copy(pk) is pk and copy.deepcopy({"pk": pk})["pk"] is pk
    e = raised(lambda: pickle.dumps(pk))
    check_error(e, keyfence.InvalidArgumentType)
    assert "to_bytes()" in str(e)
    assert pickle.loads(pickle.dumps(world.peer)) == world.peer


def test_pybind11_dispatch_errors_say_what_the_public_callable_takes() -> None:
    """The backstop for a native call no check of ours caught: pybind11's
    list of C++ overloads and the call's argument values (which may be
    secrets) give way to the public callable's own signature."""
    from keyfence._guard import translate

    native = TypeError(
        "abe_encrypt(): incompatible function arguments. The following argument types are supported:\n"
        "    1. (pk: kfpy::Handle<keyfence_abe_public_key, &keyfence_abe_public_key_free>, policy: object, "
        "message: object) -> bytes\n\nInvoked with: <keyfence.abe.MasterSecretKey (secret)>, 'a: b', b'the plaintext'"
    )
    e = translate(native, inspect.unwrap(abe.encrypt))
    assert isinstance(e, keyfence.InvalidArgumentType)
    check_error(e, keyfence.InvalidArgumentType)
    assert str(e) == (
        "invalid argument: an argument of a type it does not take; it takes "
        "keyfence.abe.encrypt(pk: PublicKey, policy: str, message: Buffer) -> bytes"
    ), str(e)
