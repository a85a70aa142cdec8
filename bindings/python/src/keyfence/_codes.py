"""The error codes, by number: generated from the Rust core's table
(``core/src/error.rs``) by ``core/tests/error_codes_generated.rs``; do not
edit (``KEYFENCE_UPDATE_CODES=1`` rewrites it). The exception class of each
code is chosen in :mod:`keyfence.exceptions`."""

from __future__ import annotations

from typing import Dict

#: The stable name of each error code, by number.
NAMES: Dict[int, str] = {
    1: "INVALID_ARGUMENT",
    2: "INTERNAL",
    3: "RNG",
    4: "PANIC",
    5: "IO",
    100: "POLICY_SYNTAX",
    101: "POLICY_TOO_LARGE",
    102: "INVALID_ATTRIBUTES",
    200: "INVALID_CIPHERTEXT",
    201: "INVALID_KEY",
    202: "POLICY_NOT_SATISFIED",
    203: "RESERVED_LABEL",
    204: "LIMIT_EXCEEDED",
    300: "INVALID_ENVELOPE",
    301: "RETIRED_GENERATION",
    302: "UNKNOWN_POLICY_KEY",
    303: "UNKNOWN_ALGORITHM",
    304: "NO_AUTHORITY",
    305: "AUTHORITY_EXISTS",
    306: "INCONSISTENT_STATE",
    307: "WRONG_AUTHORITY",
    308: "REPLAYED_OBJECT",
    309: "MACHINE_REVOKED",
    400: "STORE_IO",
    401: "INVALID_STORE_KEY",
    402: "STORE_LOCKED",
    403: "STORE_CONFLICT",
    500: "OVERLOADED",
    501: "TIMED_OUT",
    502: "CANCELLED",
    503: "SHUT_DOWN",
    504: "INVALID_PRIVATE_KEY",
    505: "INVALID_REQUEST",
    506: "CRYPTO_FAILED",
    507: "BACKEND_FAILED",
    508: "INVALID_CONFIG",
    509: "TOKEN_UNAVAILABLE",
    510: "TOKEN_LOGIN",
}
