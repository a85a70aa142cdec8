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
Keys pickle to nothing: move them with ``to_bytes``/``from_bytes``.
"""

from __future__ import annotations

from typing import Mapping, Tuple, Union

from . import _core
from ._guard import guard, guard_class

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
for _cls in (PublicKey, MasterSecretKey, AttributeKey):
    guard_class(_cls)


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
    return _core.abe_keygen(msk, attributes)


@guard
def encrypt(pk: PublicKey, policy: str, message: Buffer) -> bytes:
    """Encrypts ``message`` under ``policy``; the ciphertext is in CIRCL's format.

    Raises:
        PolicySyntaxError: the policy does not parse or is too large.
        LimitExceeded: a message near 4 GiB.
    """
    return _core.abe_encrypt(pk, policy, message)


@guard
def decrypt(key: AttributeKey, ciphertext: Buffer) -> bytes:
    """Decrypts ``ciphertext`` with ``key``.

    Raises:
        PolicyNotSatisfied: the key's attributes do not satisfy the policy.
        InvalidCiphertext: malformed (the message names the field), tampered
            with, or made for another authority. Never a wrong plaintext.
    """
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
