"""Argument checks the Python modules share: a Python value checked and
turned into what the C ABI takes, or the exception a caller should see."""

from __future__ import annotations

from typing import Optional

from .exceptions import InvalidArgument, InvalidArgumentType


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
