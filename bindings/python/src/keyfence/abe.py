"""Ciphertext-policy attribute-based encryption (TKN20, byte-compatible
with Cloudflare CIRCL's ``tkn20``).

An authority makes a key pair with :func:`setup`, issues
:class:`AttributeKey` objects for sets of attributes with :func:`keygen`;
anyone with the :class:`PublicKey` encrypts under a policy, and a key
decrypts exactly the ciphertexts whose policy its attributes satisfy::

    pk, msk = keyfence.abe.setup()
    key = keyfence.abe.keygen(msk, {"country": "FR", "region": "EU"})
    ct = keyfence.abe.encrypt(pk, "region: EU and not country: DE", b"secret")
    assert keyfence.abe.decrypt(key, ct) == b"secret"

Every function that computes releases the GIL, so threads run in parallel.
Keys are not pickled (nor secret keys copied): move them with
``to_bytes``/``from_bytes``. Public keys compare by value.
"""

from __future__ import annotations

from typing import Any, Mapping, Tuple, Union

from . import _core
from ._args import instance
from ._guard import Native, guard

__all__ = [
    "PublicKey",
    "MasterSecretKey",
    "AttributeKey",
    "setup",
    "keygen",
    "encrypt",
    "decrypt",
    "could_decrypt",
    "policy_of",
]

Buffer = Union[bytes, bytearray, memoryview]

PublicKey = _core.PublicKey
MasterSecretKey = _core.MasterSecretKey
AttributeKey = _core.AttributeKey


def _key_class(cls: Any, made_by: str) -> Native:
    """The Python face of one key class: ``from_bytes`` and ``to_bytes``
    with real signatures, and no constructor of its own."""
    face = Native(cls, f"keyfence.abe.{cls.__name__}")
    native_from_bytes, native_to_bytes = face.native["from_bytes"], face.native["to_bytes"]

    def from_bytes(data: Buffer) -> Any:
        return native_from_bytes(data)

    def to_bytes(self: Any) -> bytes:
        return bytes(native_to_bytes(self))

    from_bytes.__annotations__["return"] = cls.__name__
    face.static(from_bytes)
    face.method(to_bytes)
    face.made_by(f"{made_by} or {cls.__name__}.from_bytes()")
    return face


_public = _key_class(PublicKey, "keyfence.abe.setup()")
_public.pickled_never("move it with to_bytes() and PublicKey.from_bytes()")
_key_class(MasterSecretKey, "keyfence.abe.setup()").not_copied(
    "move it with to_bytes() and MasterSecretKey.from_bytes(), and keep those bytes as secret as the key"
)
_key_class(AttributeKey, "keyfence.abe.keygen()").not_copied(
    "move it with to_bytes() and AttributeKey.from_bytes(), and keep those bytes as secret as the key"
)
_native_public_bytes = _public.native["to_bytes"]


class _ByValue:
    """What a PublicKey compares and hashes by: its encoding (as
    pyca/cryptography compares public keys: by value, not identity)."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PublicKey):
            return NotImplemented
        return bytes(_native_public_bytes(self)) == bytes(_native_public_bytes(other))

    def __hash__(self) -> int:
        return hash(bytes(_native_public_bytes(self)))


for _name in ("__eq__", "__hash__"):
    _fn = vars(_ByValue)[_name]
    _fn.__qualname__ = f"PublicKey.{_name}"
    setattr(PublicKey, _name, _fn)


@guard
def setup() -> Tuple[PublicKey, MasterSecretKey]:
    """A new authority's public key and master secret key."""
    return _core.abe_setup()


@guard
def keygen(msk: MasterSecretKey, attributes: Mapping[str, str]) -> AttributeKey:
    """An attribute key for ``attributes``, e.g. ``{"country": "FR"}``.

    Raises:
        InvalidAttributes: an empty label or value.
        ReservedLabel: a label keyfence reserves.
        LimitExceeded: attributes too many or too long for the key format.
    """
    instance(msk, MasterSecretKey, "msk")
    return _core.abe_keygen(msk, attributes)


@guard
def encrypt(pk: PublicKey, policy: str, message: Buffer) -> bytes:
    """Encrypts ``message`` under ``policy``; the ciphertext is in CIRCL's format.

    Raises:
        PolicySyntaxError: the policy does not parse or is too large.
        LimitExceeded: a message near 4 GiB.
    """
    instance(pk, PublicKey, "pk")
    return _core.abe_encrypt(pk, policy, message)


@guard
def decrypt(key: AttributeKey, ciphertext: Buffer) -> bytes:
    """Decrypts ``ciphertext`` with ``key``.

    Raises:
        PolicyNotSatisfied: the key's attributes do not satisfy the policy.
        InvalidCiphertext: malformed (the message names the field), tampered
            with, or made for another authority. Never a wrong plaintext.
    """
    instance(key, AttributeKey, "key")
    return _core.abe_decrypt(key, ciphertext)


@guard
def could_decrypt(attributes: Mapping[str, str], ciphertext: Buffer) -> bool:
    """Whether a key with ``attributes`` could decrypt ``ciphertext``, from
    its policy alone (no cryptography).

    Raises:
        InvalidCiphertext: the bytes are not a ciphertext.
    """
    return _core.abe_could_decrypt(attributes, ciphertext)


@guard
def policy_of(ciphertext: Buffer) -> str:
    """The canonical text of the policy ``ciphertext`` was encrypted under.

    Raises:
        InvalidCiphertext: the bytes are not a ciphertext.
    """
    return _core.abe_policy_of(ciphertext)
