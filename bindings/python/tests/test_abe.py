from __future__ import annotations

import copy
import pickle
from typing import Tuple

import pytest

import keyfence
from keyfence import abe

Authority = Tuple[abe.PublicKey, abe.MasterSecretKey]


def test_round_trip(authority: Authority) -> None:
    pk, msk = authority
    key = abe.keygen(msk, {"country": "FR", "region": "EU"})
    ct = abe.encrypt(pk, "region: EU and not country: DE", b"the customer's key")
    assert isinstance(ct, bytes)
    assert abe.decrypt(key, ct) == b"the customer's key"
    # Any bytes-like input.
    assert abe.decrypt(key, bytearray(ct)) == b"the customer's key"
    assert abe.decrypt(key, memoryview(ct)) == b"the customer's key"
    assert abe.encrypt(pk, "region: EU", bytearray(b"x"))


def test_not_satisfied(authority: Authority) -> None:
    pk, msk = authority
    de = abe.keygen(msk, {"country": "DE", "region": "EU"})
    ct = abe.encrypt(pk, "region: EU and not country: DE", b"m")
    with pytest.raises(keyfence.PolicyNotSatisfied) as e:
        abe.decrypt(de, ct)
    assert e.value.code == "POLICY_NOT_SATISFIED"
    assert not abe.could_decrypt({"country": "DE", "region": "EU"}, ct)
    assert abe.could_decrypt({"country": "FR", "region": "EU"}, ct)


def test_policy_of(authority: Authority) -> None:
    pk, _ = authority
    ct = abe.encrypt(pk, "(region:EU)  and not country:DE", b"m")
    assert abe.policy_of(ct) == "region: EU and not country: DE"


def test_tampered_and_truncated_ciphertexts(authority: Authority) -> None:
    pk, msk = authority
    key = abe.keygen(msk, {"region": "EU"})
    ct = bytearray(abe.encrypt(pk, "region: EU", b"secret"))
    for i in (len(ct) - 1, len(ct) // 2, 10):
        bad = bytearray(ct)
        bad[i] ^= 1
        with pytest.raises(keyfence.InvalidCiphertext):
            abe.decrypt(key, bytes(bad))
    with pytest.raises(keyfence.InvalidCiphertext) as e:
        abe.decrypt(key, bytes(ct[:40]))
    assert isinstance(e.value, ValueError)
    with pytest.raises(keyfence.InvalidCiphertext):
        abe.decrypt(key, b"")
    with pytest.raises(keyfence.InvalidCiphertext):
        abe.policy_of(b"\x00" * 5)


def test_other_authority(authority: Authority) -> None:
    pk, _ = authority
    _, other_msk = abe.setup()
    key = abe.keygen(other_msk, {"region": "EU"})
    with pytest.raises(keyfence.InvalidCiphertext):
        abe.decrypt(key, abe.encrypt(pk, "region: EU", b"m"))


def test_keys_round_trip_through_bytes(authority: Authority) -> None:
    pk, msk = authority
    pk2 = abe.PublicKey.from_bytes(pk.to_bytes())
    msk2 = abe.MasterSecretKey.from_bytes(msk.to_bytes())
    key = abe.AttributeKey.from_bytes(abe.keygen(msk2, {"a": "b"}).to_bytes())
    assert pk2.to_bytes() == pk.to_bytes()
    assert abe.decrypt(key, abe.encrypt(pk2, "a: b", b"m")) == b"m"


@pytest.mark.parametrize("cls", [abe.PublicKey, abe.MasterSecretKey, abe.AttributeKey])
def test_bad_key_bytes(cls: type) -> None:
    with pytest.raises(keyfence.InvalidKey) as e:
        cls.from_bytes(b"\x01\x02\x03")  # type: ignore[attr-defined]
    assert e.value.code == "INVALID_KEY"
    with pytest.raises(TypeError):
        cls.from_bytes("not bytes")  # type: ignore[attr-defined]


def test_secrets_are_not_shown_copied_or_pickled(authority: Authority) -> None:
    pk, msk = authority
    key = abe.keygen(msk, {"a": "b"})
    for secret in (msk, key):
        r = repr(secret)
        assert "secret" in r and len(r) < 60
        # keyfence's own error, a TypeError as copy and pickle raise, saying why.
        for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(keyfence.InvalidArgumentType, match="secrets are not copied or pickled") as e:
                attempt(secret)
            assert isinstance(e.value, TypeError) and "from_bytes()" in str(e.value)
    assert repr(pk) == "<keyfence.abe.PublicKey>"


def test_public_keys_compare_by_value(authority: Authority) -> None:
    """As pyca/cryptography's public keys: equal when their bytes are, and
    (unlike those) hashable to match; a copy is the key itself."""
    pk, msk = authority
    same = abe.PublicKey.from_bytes(pk.to_bytes())
    assert same is not pk
    assert same == pk and pk == same and not same != pk
    assert hash(same) == hash(pk) and len({pk, same}) == 1 and {pk: 1}[same] == 1
    other, _ = abe.setup()
    assert other != pk and pk != other and not other == pk
    assert len({pk, same, other}) == 2
    # Against what is not a public key: unequal, never an error.
    for non_key in (msk, abe.keygen(msk, {"a": "b"}), pk.to_bytes(), None, "pk", 0, object()):
        assert pk != non_key and non_key != pk and not pk == non_key
    assert copy.copy(pk) is pk and copy.deepcopy(pk) is pk
    with pytest.raises(keyfence.InvalidArgumentType, match="not pickled"):
        pickle.dumps(pk)


def test_errors_of_each_function(authority: Authority) -> None:
    pk, msk = authority
    with pytest.raises(keyfence.PolicySyntaxError) as e:
        abe.encrypt(pk, "region: EU)", b"m")
    assert e.value.position == 10
    with pytest.raises(keyfence.InvalidAttributes):
        abe.keygen(msk, {"region": ""})
    # "u" + U+0308 looks like "\u00fc": refused, with the composed form.
    with pytest.raises(keyfence.InvalidAttributes, match="not in Unicode NFC.*write \"Z\u00fcrich\""):
        abe.keygen(msk, {"city": "Zu\u0308rich"})
    with pytest.raises(keyfence.PolicySyntaxError) as e:
        abe.encrypt(pk, 'city: "Zu\u0308rich"', b"m")
    assert e.value.position == 6
    with pytest.raises(keyfence.LimitExceeded):
        abe.keygen(msk, {f"label{i}": "v" * 40 for i in range(2000)})
    with pytest.raises(TypeError):
        abe.keygen(pk, {"a": "b"})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        abe.encrypt(pk, "a: b", "text, not bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        abe.decrypt(msk, b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        abe.could_decrypt({"a": "b"}, None)  # type: ignore[arg-type]
