"""keyfence: keep private keys inside a policy.

- :mod:`keyfence.policy`: the policy language (``country: US or (not region: EU)``).
- :mod:`keyfence.abe`: ciphertext-policy attribute-based encryption,
  byte-compatible with Cloudflare CIRCL's ``tkn20``.
- :mod:`keyfence.wrap`: policy-key wrapping of secrets on a shared store.
- :mod:`keyfence.sign`: asynchronous signing (asyncio), with keys in this
  process or a key process.

Errors are subclasses of :class:`KeyfenceError` (see
:mod:`keyfence.exceptions`); bytes go in and out, and every call that
computes releases the GIL.
"""

from __future__ import annotations

from . import _core
from .exceptions import *  # noqa: F401,F403 (the exception classes are part of the top-level API)
from .exceptions import __all__ as _exceptions
from . import abe, policy, sign, wrap

__version__: str = _core.version()

__all__ = ["__version__", "abe", "policy", "sign", "wrap", *_exceptions]
