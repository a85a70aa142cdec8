"""Where Python's own argument errors become keyfence's, and where the
native module's classes get their Python face.

Every public function and method is guarded here, so that a call with a
wrong type, a wrong number of arguments or an unusable value raises a
:class:`~keyfence.KeyfenceError` (:class:`~keyfence.InvalidArgumentType`,
also a ``TypeError``; :class:`~keyfence.InvalidArgument`, also a
``ValueError``), never a bare builtin one: the docs promise one family of
exceptions, and ``except keyfence.KeyfenceError`` must catch everything
keyfence raises. Most such errors are raised as keyfence's already (by
``_core`` and the checks in the public modules, which name the argument
and the type it takes); what is left is pybind11's own dispatcher, which
rejects arguments it cannot convert with a bare ``TypeError`` before any
code of ours runs, and Python's arity errors.

The classes of ``_core`` (keys, the authority, the machine) are pybind11
classes, whose methods have no signature :mod:`inspect` can read and whose
argument errors name C++ types. :class:`Native` puts a Python function on
such a class for each public method: a real signature, a check of each
argument that names it, and the native call.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Optional, TypeVar, cast

from ._args import describe, public_name
from .exceptions import InvalidArgument, InvalidArgumentType, KeyfenceError

F = TypeVar("F", bound=Callable[..., Any])

# Set on what guard() returns, so that guarding twice wraps once.
_GUARDED = "_keyfence_guarded"


def _where(fn: Optional[Callable[..., Any]]) -> str:
    """``keyfence.abe.encrypt(pk: PublicKey, ...)``: the public callable and
    its signature, for a message."""
    if fn is None:
        return ""
    try:
        sig = str(inspect.signature(fn)).replace("'", "")
    except (TypeError, ValueError):
        sig = "(...)"
    return f"{fn.__module__}.{fn.__qualname__}{sig}"


def _message(e: BaseException, fn: Optional[Callable[..., Any]] = None) -> str:
    text = str(e)
    # pybind11 lists the call's arguments after "Invoked with:", by repr:
    # those may be plaintexts or key bytes, which no message may carry.
    text = text.split("\n\nInvoked with", 1)[0].split("; kwargs:", 1)[0]
    # ... and the native overloads it tried, whose types are the native
    # module's (C++ names for some), not the API's: the public callable's
    # own signature says what it takes.
    if "incompatible function arguments" in text or "incompatible constructor arguments" in text:
        where = _where(fn)
        return f"an argument of a type it does not take{f'; it takes {where}' if where else ''}"
    text = text.replace("keyfence._core.", "keyfence.")
    return text.strip() or f"invalid argument ({type(e).__name__})"


def translate(e: BaseException, fn: Optional[Callable[..., Any]] = None) -> Optional[KeyfenceError]:
    """The keyfence error for a builtin argument error raised by a call of
    ``fn``, or None to let ``e`` pass (it is keyfence's already, or not
    about arguments)."""
    if isinstance(e, KeyfenceError):
        return None
    if isinstance(e, TypeError):
        return InvalidArgumentType(f"invalid argument: {_message(e, fn)}", code="INVALID_ARGUMENT", number=1)
    if isinstance(e, (ValueError, OverflowError)):
        return InvalidArgument(f"invalid argument: {_message(e, fn)}", code="INVALID_ARGUMENT", number=1)
    return None


def guard(fn: F) -> F:
    """``fn`` raising keyfence errors for argument errors (coroutine
    functions too: their errors surface when awaited)."""
    if getattr(fn, _GUARDED, False):
        return fn
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def guarded_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except (TypeError, ValueError, OverflowError) as e:
                err = translate(e, fn)
                if err is None:
                    raise
                raise err from None

        setattr(guarded_async, _GUARDED, True)
        return cast(F, guarded_async)

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (TypeError, ValueError, OverflowError) as e:
            err = translate(e, fn)
            if err is None:
                raise
            raise err from None

    setattr(guarded, _GUARDED, True)
    return cast(F, guarded)


def guard_class(cls: type) -> None:
    """Guards, in place, the constructor and every public method and static
    method of ``cls`` (a Python class of the public modules)."""
    for name, attr in list(vars(cls).items()):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(attr, staticmethod):
            setattr(cls, name, staticmethod(guard(attr.__func__)))
        elif isinstance(attr, (classmethod, property)):
            continue
        elif callable(attr):
            setattr(cls, name, guard(attr))


def _native_doc(native: Any) -> Optional[str]:
    """A pybind11 function's docstring without the signature line pybind11
    writes first (its types are the native module's)."""
    doc = getattr(native, "__doc__", None) or ""
    first, _, rest = doc.partition("\n")
    if "(" in first and ("->" in first or first.endswith(")")):
        doc = rest
    return doc.strip() or None


class Native:
    """The Python face of one pybind11 class of ``_core``, public as
    ``public`` (``"keyfence.abe.PublicKey"``).

    ``native`` holds the class's own methods, taken before any is replaced;
    :meth:`method` and :meth:`static` put a Python function on the class in
    place of the native one of the same name, guarded, with the public
    module and qualified name (and the native docstring, unless the
    function has its own)."""

    def __init__(self, cls: type, public: str) -> None:
        self.cls = cls
        self.public = public
        self.module, _, self.name = public.rpartition(".")
        self.native: Dict[str, Any] = {
            n: getattr(cls, n) for n in vars(cls) if not n.startswith("_") or n == "__init__"
        }
        public_name(cls, public)

    def _dress(self, fn: Callable[..., Any]) -> None:
        fn.__module__ = self.module
        fn.__qualname__ = f"{self.name}.{fn.__name__}"
        # `self` is annotated for mypy only; a method's signature shows it bare.
        fn.__annotations__.pop("self", None)
        if not fn.__doc__:
            fn.__doc__ = _native_doc(self.native.get(fn.__name__))

    def static(self, fn: F) -> F:
        """Installs ``fn`` as the static method of its name."""
        self._dress(fn)
        setattr(self.cls, fn.__name__, staticmethod(guard(fn)))
        return fn

    def method(self, fn: F) -> F:
        """Installs ``fn`` as the method of its name; called on anything
        but an instance of the class (``PublicKey.to_bytes(msk)``) it
        raises InvalidArgumentType."""
        self._dress(fn)
        cls, public = self.cls, self.public

        @functools.wraps(fn)
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not isinstance(self, cls):
                raise InvalidArgumentType(f"{public}.{fn.__name__}() is a method of {public}, not of {describe(self)}")
            return fn(self, *args, **kwargs)

        setattr(self.cls, fn.__name__, guard(method))
        return fn

    def made_by(self, factories: str) -> None:
        """For a class that only keyfence's functions make (keys from
        ``setup`` and ``from_bytes``, ...): calling it raises
        InvalidArgumentType saying which make it."""
        public = self.public

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            raise InvalidArgumentType(f"{public} is not made by calling it: use {factories}")

        self._dress(__init__)
        setattr(self.cls, "__init__", __init__)

    def closes(self) -> None:
        """``with`` closes it: ``__enter__`` gives the object, ``__exit__``
        calls its ``close()``."""

        def __enter__(self: Any) -> Any:
            return self

        __enter__.__annotations__["return"] = self.name

        def __exit__(self: Any, *exc: Any) -> None:
            self.close()

        for fn in (__enter__, __exit__):
            self._dress(fn)
            setattr(self.cls, fn.__name__, fn)

    def not_copied(self, advice: str, *, secret: bool = True) -> None:
        """``copy.copy``, ``copy.deepcopy`` and ``pickle`` raise
        InvalidArgumentType (a ``TypeError``) saying why and what to do
        instead: a secret is never duplicated behind its owner's back, and
        a handle on threads or a process cannot travel."""
        what = f"{self.public} holds a secret, and secrets are not copied or pickled" if secret else (
            f"{self.public} is not copied or pickled"
        )
        message = f"{what}: {advice}"
        _refuse(self.cls, message, copies=True)

    def pickled_never(self, advice: str) -> None:
        """An immutable public value: ``copy.copy`` and ``copy.deepcopy``
        give the object itself (as pyca/cryptography's keys do), ``pickle``
        raises InvalidArgumentType with ``advice``."""
        _refuse(self.cls, f"{self.public} is not pickled: {advice}", copies=False)

        def __copy__(self: Any) -> Any:
            return self

        def __deepcopy__(self: Any, memo: Any) -> Any:
            return self

        for fn in (__copy__, __deepcopy__):
            self._dress(fn)
            setattr(self.cls, fn.__name__, fn)


def _refuse(cls: type, message: str, *, copies: bool) -> None:
    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        raise InvalidArgumentType(message)

    def __reduce__(self: Any) -> Any:
        raise InvalidArgumentType(message)

    def __copy__(self: Any) -> Any:
        raise InvalidArgumentType(message)

    def __deepcopy__(self: Any, memo: Any) -> Any:
        raise InvalidArgumentType(message)

    for fn in (__reduce_ex__, __reduce__) + ((__copy__, __deepcopy__) if copies else ()):
        fn.__qualname__ = f"{cls.__name__}.{fn.__name__}"
        setattr(cls, fn.__name__, fn)


def not_copied(cls: type, message: str) -> None:
    """As :meth:`Native.not_copied`, for a Python class of the public modules."""
    _refuse(cls, message, copies=True)
