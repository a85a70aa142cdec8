"""The exceptions keyfence raises, one class per error code.

Every error has a stable code defined once in the Rust core and listed in
``docs/errors.md`` (the numbers reach Python in :mod:`keyfence._codes`,
generated from the core's table); this module maps each code to a class,
in one place.
All classes derive from :class:`KeyfenceError`, which carries the code's
name as ``.code`` and its number as ``.number``. Where a standard
exception fits, the class also derives from it (bad input is a
:class:`ValueError`, an expired deadline a :class:`TimeoutError`, a
PKCS#11 token that is gone a :class:`ConnectionError`, a PIN it refused a
:class:`PermissionError`), so generic handlers keep working.

Branch on the class or on ``.code``, never on the message: messages are
for people and may change. No message carries key material or plaintext.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

from ._codes import NAMES

__all__ = [
    "KeyfenceError",
    "InvalidArgument",
    "InvalidArgumentType",
    "ResourceError",
    "PolicySyntaxError",
    "InvalidAttributes",
    "InvalidCiphertext",
    "InvalidKey",
    "PolicyNotSatisfied",
    "ReservedLabel",
    "LimitExceeded",
    "InvalidEnvelope",
    "RetiredGeneration",
    "UnknownPolicyKey",
    "UnknownAlgorithm",
    "WrongAuthority",
    "ReplayedObject",
    "MachineRevoked",
    "StoreError",
    "NoAuthority",
    "AuthorityExists",
    "StoreIOError",
    "StoreLocked",
    "StoreConflict",
    "Overloaded",
    "TimedOut",
    "Cancelled",
    "ShutDown",
    "InvalidPrivateKey",
    "InvalidRequest",
    "BackendFailed",
    "InvalidConfig",
    "TokenUnavailable",
    "TokenLogin",
]


class KeyfenceError(Exception):
    """Base class of every error keyfence raises.

    Attributes:
        code: the error's stable name, e.g. ``"POLICY_SYNTAX"``.
        number: the error's stable number (the C API's ``keyfence_result``).
        message: the human-readable message (also ``str(err)``).
    """

    code: str
    number: int
    message: str

    def __init__(self, message: str, *, code: str = "INTERNAL", number: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.number = number

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r})"


class InvalidArgument(KeyfenceError, ValueError):
    """An argument is unusable before any work starts (``INVALID_ARGUMENT``):
    a value out of range, text that is not valid Unicode, a closed
    :class:`~keyfence.wrap.Authority`."""

    def __init__(self, message: str, *, code: str = "INVALID_ARGUMENT", number: int = 1) -> None:
        super().__init__(message, code=code, number=number)


class InvalidArgumentType(InvalidArgument, TypeError):
    """An argument of the wrong type, or a call with the wrong number of
    arguments (``INVALID_ARGUMENT``); also a :class:`TypeError`."""


class ResourceError(KeyfenceError, OSError):
    """The operating system refused a resource: a thread, a socket, a file (``IO``)."""


class PolicySyntaxError(KeyfenceError, ValueError):
    """The policy text does not parse, or is too large or deep for the format.

    ``position`` is the byte offset of the mistake in the UTF-8 policy text;
    ``str(err)`` shows the policy with a caret under it.
    """

    position: Optional[int]

    def __init__(self, message: str, *, code: str = "POLICY_SYNTAX", number: int = 100,
                 position: Optional[int] = None) -> None:
        super().__init__(message, code=code, number=number)
        self.position = position


class InvalidAttributes(KeyfenceError, ValueError):
    """Attributes with an empty label or value, or otherwise malformed."""


class InvalidCiphertext(KeyfenceError, ValueError):
    """A CP-ABE ciphertext is malformed (the message names the field), tampered
    with, or made for another authority. Never a wrong plaintext."""


class InvalidKey(KeyfenceError, ValueError):
    """Bytes that do not decode as the key they are said to be."""


class PolicyNotSatisfied(KeyfenceError):
    """The key's (or machine's) attributes do not satisfy the policy."""


class ReservedLabel(KeyfenceError, ValueError):
    """A policy or attribute uses a label keyfence reserves."""


class LimitExceeded(KeyfenceError, ValueError):
    """An object would pass a limit of its binary format."""


class InvalidEnvelope(KeyfenceError, ValueError):
    """An envelope or sealed policy key is malformed or failed its integrity check."""


class RetiredGeneration(KeyfenceError):
    """The machine holds keys only for retired master generations: issue it a new key."""


class UnknownPolicyKey(KeyfenceError):
    """No sealed copy of the envelope's policy key is in the store for a usable generation."""


class UnknownAlgorithm(KeyfenceError):
    """An algorithm identifier this version does not know."""


class WrongAuthority(KeyfenceError):
    """An envelope or sealed policy key was signed by another authority than
    the one the machine key trusts."""


class ReplayedObject(KeyfenceError):
    """A store object the authority signed, but older than one this machine
    already accepted (a generation list put back): the store was rolled back
    or replayed."""


class MachineRevoked(KeyfenceError):
    """The machine id is revoked: the authority refuses to issue it a key
    again, and the revoked machine cannot open the policy keys sealed since."""


class StoreError(KeyfenceError):
    """The store is unusable: its state contradicts itself, or an object name is invalid."""


class NoAuthority(StoreError):
    """The store holds no authority: create one with ``Authority.init``."""


class AuthorityExists(StoreError):
    """The store already holds an authority."""


class StoreIOError(StoreError, OSError):
    """The store could not read or write an object (the message names it)."""


class StoreLocked(StoreError):
    """Another writer held the store's lock for longer than the wait; retry later."""


class StoreConflict(StoreError):
    """Another writer committed between this call's read and its commit (an etcd store).

    Nothing of this call was written: run it again, and it starts from the new state.
    """


class Overloaded(KeyfenceError):
    """The executor's queue is full; the operation was not accepted. Shed load."""


class TimedOut(KeyfenceError, TimeoutError):
    """The operation's deadline passed; its resources were released."""


class Cancelled(KeyfenceError):
    """The operation was cancelled (a cancelled asyncio task raises
    :class:`asyncio.CancelledError` instead)."""


class ShutDown(KeyfenceError):
    """The signing engine has shut down."""


class InvalidPrivateKey(KeyfenceError, ValueError):
    """The private key could not be loaded: what is wrong with it, never its contents."""


class InvalidRequest(KeyfenceError, ValueError):
    """The request does not fit the key: wrong algorithm family, unknown algorithm name."""


class BackendFailed(KeyfenceError):
    """The backend that holds or runs the key failed (the key process died)."""


class InvalidConfig(KeyfenceError, ValueError):
    """The engine's configuration is unusable; or a PKCS#11 module that is
    not named, or cannot be found, loaded or initialized."""


class TokenUnavailable(KeyfenceError, ConnectionError):
    """A PKCS#11 token or its module is gone (the device removed, the
    module's service down) and did not come back when keyfence opened its
    sessions again and retried once.

    Also a :class:`ConnectionError`: like a peer that went away, the
    operation may succeed later or on another signer, and the handlers
    that retry or fail over on a lost connection apply.
    """


class TokenLogin(KeyfenceError, PermissionError):
    """A PKCS#11 token needs a PIN and none was given, or it refused the PIN.

    Also a :class:`PermissionError`: access was denied, and repeating the
    call does not help. A refused PIN is never tried again (that could lock
    the token): fix the PIN file, then load the key again. The message
    never holds the PIN.
    """


#: The class of each error code's name. A code missing here (one the Rust
#: core added since) raises the base class; a test holds the two together.
_CLASS_OF_NAME: Dict[str, Type[KeyfenceError]] = {
    "INVALID_ARGUMENT": InvalidArgument,
    "INTERNAL": KeyfenceError,
    "RNG": KeyfenceError,
    "PANIC": KeyfenceError,
    "IO": ResourceError,
    "POLICY_SYNTAX": PolicySyntaxError,
    "POLICY_TOO_LARGE": PolicySyntaxError,
    "INVALID_ATTRIBUTES": InvalidAttributes,
    "INVALID_CIPHERTEXT": InvalidCiphertext,
    "INVALID_KEY": InvalidKey,
    "POLICY_NOT_SATISFIED": PolicyNotSatisfied,
    "RESERVED_LABEL": ReservedLabel,
    "LIMIT_EXCEEDED": LimitExceeded,
    "INVALID_ENVELOPE": InvalidEnvelope,
    "RETIRED_GENERATION": RetiredGeneration,
    "UNKNOWN_POLICY_KEY": UnknownPolicyKey,
    "UNKNOWN_ALGORITHM": UnknownAlgorithm,
    "NO_AUTHORITY": NoAuthority,
    "AUTHORITY_EXISTS": AuthorityExists,
    "INCONSISTENT_STATE": StoreError,
    "WRONG_AUTHORITY": WrongAuthority,
    "REPLAYED_OBJECT": ReplayedObject,
    "MACHINE_REVOKED": MachineRevoked,
    "STORE_IO": StoreIOError,
    "INVALID_STORE_KEY": StoreError,
    "STORE_LOCKED": StoreLocked,
    "STORE_CONFLICT": StoreConflict,
    "OVERLOADED": Overloaded,
    "TIMED_OUT": TimedOut,
    "CANCELLED": Cancelled,
    "SHUT_DOWN": ShutDown,
    "INVALID_PRIVATE_KEY": InvalidPrivateKey,
    "INVALID_REQUEST": InvalidRequest,
    "CRYPTO_FAILED": KeyfenceError,
    "BACKEND_FAILED": BackendFailed,
    "INVALID_CONFIG": InvalidConfig,
    "TOKEN_UNAVAILABLE": TokenUnavailable,
    "TOKEN_LOGIN": TokenLogin,
}

#: The class of each error code, by number (``docs/errors.md``): the numbers
#: are the Rust core's (:mod:`keyfence._codes`, generated from its table).
CLASSES: Dict[int, Type[KeyfenceError]] = {
    number: _CLASS_OF_NAME.get(name, KeyfenceError) for number, name in NAMES.items()
}


def _from_code(number: int, message: str, position: Optional[int] = None) -> KeyfenceError:
    """The exception for a result code from the native module."""
    from . import _core

    cls = CLASSES.get(number, KeyfenceError)
    code = _core.result_name(number)
    if issubclass(cls, PolicySyntaxError):
        return cls(message, code=code, number=number, position=position)
    return cls(message, code=code, number=number)
