"""The policy language: ``country: US or (not region: EU)``.

Policies are ``label: value`` leaves joined by ``and``, ``or`` and ``not``
(see ``docs/policy-language.md``). ``not label: value`` holds when the
attributes *have* ``label`` with a different value.
"""

from __future__ import annotations

from typing import Mapping

from . import _core
from ._guard import guard

__all__ = ["check", "canonical"]


@guard
def check(policy: str, attributes: Mapping[str, str]) -> bool:
    """Whether ``attributes`` satisfy ``policy``, without cryptography.

    >>> check("region: EU and not country: DE", {"region": "EU", "country": "FR"})
    True

    Raises:
        PolicySyntaxError: the policy does not parse (``.position`` says where).
        InvalidAttributes: an empty label or value.
        InvalidArgumentType: ``policy`` is not a str, or ``attributes`` not
            a mapping of str (also a ``TypeError``).
    """
    return _core.policy_check(policy, attributes)


@guard
def canonical(policy: str) -> str:
    """The canonical text of ``policy``: what keyfence writes into
    ciphertexts and envelopes; it parses again to the same policy.

    >>> canonical("(region:EU)   and not country :DE")
    'region: EU and not country: DE'

    Raises:
        PolicySyntaxError: the policy does not parse.
    """
    return _core.policy_canonical(policy)
