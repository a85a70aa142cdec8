from __future__ import annotations

import pytest

import keyfence
from keyfence import policy


def test_check_evaluates_negation_and_or() -> None:
    p = "country: US or (not region: EU)"
    assert policy.check(p, {"country": "FR", "region": "APAC"})
    assert not policy.check(p, {"country": "FR", "region": "EU"})
    assert policy.check(p, {"country": "US", "region": "EU"})


def test_attribute_values_pass_through_unchanged() -> None:
    # Commas, '=', quotes, backslashes and spaces in labels and values.
    p = 'team: "key ops, EU" and q: "a=\\"b\\\\"'
    assert policy.check(p, {"team": "key ops, EU", "q": 'a="b\\'})
    assert not policy.check(p, {"team": "key ops", "q": 'a="b\\'})


def test_attributes_reach_keyfence_as_they_are() -> None:
    # Labels and values go to the C library as separate strings, not as
    # text the binding quotes: a control character, which no quoted word
    # may hold raw, still arrives and matches the policy's escape for it.
    p = 'note: "line\\u{a}two" and tab: "\\u{9}"'
    assert policy.check(p, {"note": "line\ntwo", "tab": "\t"})
    assert not policy.check(p, {"note": "line two", "tab": "\t"})
    assert policy.check('city: "Z\u00fcrich \u6771\u4eac"', {"city": "Z\u00fcrich \u6771\u4eac"})


def test_any_mapping_is_accepted() -> None:
    from types import MappingProxyType

    assert policy.check("a: b", MappingProxyType({"a": "b"}))


def test_syntax_error_has_position_and_caret() -> None:
    with pytest.raises(keyfence.PolicySyntaxError) as e:
        policy.check("country: US) and region: EU", {})
    assert e.value.position == 11
    assert e.value.code == "POLICY_SYNTAX"
    assert e.value.number == 100
    assert "^" in str(e.value)
    assert isinstance(e.value, ValueError)
    assert isinstance(e.value, keyfence.KeyfenceError)


def test_position_is_a_byte_offset() -> None:
    # "é" is two bytes in UTF-8.
    with pytest.raises(keyfence.PolicySyntaxError) as e:
        policy.check('a: "é" or', {})
    assert e.value.position == len('a: "é" or'.encode())


def test_too_large_is_a_syntax_error_with_its_own_code() -> None:
    deep = "(" * 100 + "a: b" + ")" * 100
    with pytest.raises(keyfence.PolicySyntaxError) as e:
        policy.canonical(deep)
    assert e.value.code == "POLICY_TOO_LARGE"


def test_canonical() -> None:
    assert policy.canonical("(region:EU)   and not country :DE") == "region: EU and not country: DE"
    assert policy.canonical(policy.canonical("a: 1 or b: 2 and c: 3")) == policy.canonical("a: 1 or b: 2 and c: 3")


def test_bad_attributes() -> None:
    with pytest.raises(keyfence.InvalidAttributes):
        policy.check("a: b", {"a": ""})
    with pytest.raises(keyfence.InvalidAttributes):
        policy.check("a: b", {"": "b"})


@pytest.mark.parametrize(
    "args",
    [
        (b"a: b", {"a": "b"}),
        (None, {"a": "b"}),
        ("a: b", [("a", "b")]),
        ("a: b", "a=b"),
        ("a: b", {"a": 1}),
        ("a: b", {1: "b"}),
    ],
)
def test_wrong_types_raise_type_error(args: tuple) -> None:  # type: ignore[type-arg]
    with pytest.raises(TypeError):
        policy.check(*args)


def test_nul_characters_are_refused_not_truncated() -> None:
    with pytest.raises(ValueError, match="NUL"):
        policy.check("a: b\0 or c: d", {"a": "b"})
    with pytest.raises(ValueError, match="NUL"):
        policy.check("a: b", {"a": "b\0c"})
