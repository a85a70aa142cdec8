"""Where Python's own argument errors become keyfence's.

Every public function and method is guarded here, so that a call with a
wrong type, a wrong number of arguments or an unusable value raises a
:class:`~keyfence.KeyfenceError` (:class:`~keyfence.InvalidArgumentType`,
also a ``TypeError``; :class:`~keyfence.InvalidArgument`, also a
``ValueError``), never a bare builtin one: the docs promise one family of
exceptions, and ``except keyfence.KeyfenceError`` must catch everything
keyfence raises. Most such errors are raised as keyfence's already (by
``_core`` and the checks in :mod:`keyfence.sign`); what is left is
pybind11's own dispatcher, which rejects arguments it cannot convert with
a bare ``TypeError`` before any code of ours runs, and Python's arity
errors.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional, TypeVar, cast

from .exceptions import InvalidArgument, InvalidArgumentType, KeyfenceError

F = TypeVar("F", bound=Callable[..., Any])


def _message(e: BaseException) -> str:
    text = str(e)
    # pybind11 lists the call's arguments after "Invoked with:", by repr:
    # those may be plaintexts or key bytes, which no message may carry.
    text = text.split("\n\nInvoked with", 1)[0].split("; kwargs:", 1)[0]
    text = text.replace("keyfence._core.", "keyfence.")
    return text.strip() or f"invalid argument ({type(e).__name__})"


def translate(e: BaseException) -> Optional[KeyfenceError]:
    """The keyfence error for a builtin argument error, or None to let
    ``e`` pass (it is keyfence's already, or not about arguments)."""
    if isinstance(e, KeyfenceError):
        return None
    if isinstance(e, TypeError):
        return InvalidArgumentType(f"invalid argument: {_message(e)}", code="INVALID_ARGUMENT", number=1)
    if isinstance(e, (ValueError, OverflowError)):
        return InvalidArgument(f"invalid argument: {_message(e)}", code="INVALID_ARGUMENT", number=1)
    return None


def guard(fn: F) -> F:
    """``fn`` raising keyfence errors for argument errors (coroutine
    functions too: their errors surface when awaited)."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def guarded_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except (TypeError, ValueError, OverflowError) as e:
                err = translate(e)
                if err is None:
                    raise
                raise err from None

        return cast(F, guarded_async)

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (TypeError, ValueError, OverflowError) as e:
            err = translate(e)
            if err is None:
                raise
            raise err from None

    return cast(F, guarded)


def guard_class(cls: type) -> None:
    """Guards, in place, the constructor and every public method and static
    method of ``cls`` (a pybind11 class of ``_core`` or a Python class)."""
    for name, attr in list(vars(cls).items()):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(attr, staticmethod):
            setattr(cls, name, staticmethod(guard(attr.__func__)))
        elif isinstance(attr, (classmethod, property)):
            continue
        elif callable(attr):
            setattr(cls, name, guard(attr))
    if "__init__" not in vars(cls):
        # A class made only by keyfence's functions (keys from setup,
        # from_bytes, ...): calling it is an argument error too.
        base_init = getattr(cls, "__init__")

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            base_init(self, *args, **kwargs)

        setattr(cls, "__init__", guard(__init__))
