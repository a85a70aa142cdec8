"""Argument checks the Python modules share: a Python value checked and
turned into what the C ABI takes, or the exception a caller should see."""

from __future__ import annotations

from typing import Dict, Optional

from .exceptions import InvalidArgument, InvalidArgumentType

# The public name of each class of the native module, for messages: a
# wrong argument is named as a reader of the docs knows it
# ("keyfence.abe.MasterSecretKey"), never by its C++ type.
_PUBLIC: Dict[type, str] = {}


def public_name(cls: type, name: str) -> None:
    """Records ``name`` (``"keyfence.abe.PublicKey"``) as ``cls``'s name in messages."""
    _PUBLIC[cls] = name


def describe(value: object) -> str:
    """What ``value`` is, for a message: a keyfence class by its public
    name, anything else by its type's name (never the value itself, which
    may be a secret)."""
    cls = type(value)
    return repr(_PUBLIC.get(cls) or cls.__qualname__)


def instance(value: object, cls: type, what: str, *, none: bool = False) -> None:
    """Raises InvalidArgumentType, naming the argument ``what`` and the
    type it takes, unless ``value`` is a ``cls`` (or None when ``none``)."""
    if isinstance(value, cls) or (none and value is None):
        return
    expected = _PUBLIC.get(cls) or cls.__qualname__
    raise InvalidArgumentType(f"{what} must be a {expected}{' or None' if none else ''}, not {describe(value)}")


def _ms(seconds: Optional[float], what: str) -> int:
    """A deadline in whole milliseconds (at least 1); 0 means the engine's own."""
    if seconds is None:
        return 0
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgumentType(f"{what} must be a number of seconds, not {type(seconds).__name__!r}")
    if not seconds > 0 or seconds > 86_400:
        raise InvalidArgument(f"{what} must be between 0 and 86400 seconds, not {seconds!r}")
    return max(1, round(seconds * 1000))


def _count(value: Optional[int], what: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentType(f"{what} must be an int, not {type(value).__name__!r}")
    if not 1 <= value <= 1 << 20:
        raise InvalidArgument(f"{what} must be between 1 and 1048576, not {value!r}")
    return value
