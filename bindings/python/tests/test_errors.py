"""The exception classes match the error table in docs/errors.md, code by
code, and every code the native library knows has a class."""

from __future__ import annotations

import pathlib
import re

import keyfence
from keyfence import _core
from keyfence._codes import NAMES
from keyfence.exceptions import _CLASS_OF_NAME, CLASSES

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "errors.md"


def rows() -> list[tuple[int, str, str]]:
    out = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| (\d+) \| `([A-Z_]+)` \|.*\| (.+) \|$", line)
        if m:
            out.append((int(m.group(1)), m.group(2), m.group(3)))
    return out


def test_table_and_classes_agree() -> None:
    table = rows()
    assert {n for n, _, _ in table} == set(CLASSES), "a code without a class, or a class without a row"
    for number, name, column in table:
        assert _core.result_name(number) == name
        cls = CLASSES[number]
        named = re.findall(r"`(\w+)`", column)
        assert named and named[0] == cls.__name__, (number, column, cls)
        assert getattr(keyfence, cls.__name__) is cls
        # The bases the table promises: "also `ValueError`", "a `StoreError`".
        for base in re.findall(r"(?:also|a) `(\w+)`", column):
            import builtins

            assert issubclass(cls, getattr(builtins, base, None) or getattr(keyfence, base)), (cls, base)


def test_every_code_of_the_core_has_a_class_chosen_for_it() -> None:
    # The numbers come from the core's table (keyfence/_codes.py); the
    # class of each name is chosen in exceptions.py, none left to the
    # fallback by mistake and none for a name the core does not have.
    assert set(_CLASS_OF_NAME) == set(NAMES.values())
    for number, name in NAMES.items():
        assert _core.result_name(number) == name
        assert CLASSES[number] is _CLASS_OF_NAME[name]


def test_unknown_numbers_fall_back_to_the_base_class() -> None:
    e = keyfence.exceptions._from_code(99_999, "m")
    assert type(e) is keyfence.KeyfenceError and e.code == "UNKNOWN"


def test_every_exception_is_a_keyfence_error() -> None:
    for cls in CLASSES.values():
        assert issubclass(cls, keyfence.KeyfenceError)


def test_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", keyfence.__version__)
