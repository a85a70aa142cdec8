"""An engine made before fork(): gunicorn --preload, multiprocessing's fork
start method, any preforking server. In the child it starts its threads
(and its key process) again on first use: calls answer, never hang; keys
in this process's memory keep working; a key the parent loaded into its
key process fails at once with ShutDown naming the fork, and loads again.
Every child has an alarm, so a hang fails the test instead of stalling it."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from typing import Any, Dict, List

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

import keyfence
from keyfence import sign

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")


def in_child(body: Any) -> None:
    """Runs `body` in a forked child; its failure (or a hang past 20 s)
    fails the test."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(20)
            body()
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported by the exit status
            print(f"child failed: {e!r}", flush=True)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child ended with status {status}"


def test_an_engine_made_before_fork_signs_in_the_child(pems: Dict[str, bytes], pyca_keys: Dict[str, Any]) -> None:
    engine = sign.Engine()
    key = engine.load_key(pems["p256"])
    public = pyca_keys["p256"].public_key()
    public.verify(engine.sign_sync(key, "ecdsa-p256-sha256", b"before"), b"before", ec.ECDSA(hashes.SHA256()))

    def child() -> None:
        assert not engine.closed
        sig = engine.sign_sync(key, "ecdsa-p256-sha256", b"child", timeout=2)
        public.verify(sig, b"child", ec.ECDSA(hashes.SHA256()))

        async def many() -> List[bytes]:
            return await asyncio.gather(*(engine.sign(key, "ecdsa-p256-sha256", b"%d" % i, timeout=2) for i in range(50)))

        for i, s in enumerate(asyncio.run(many())):
            public.verify(s, b"%d" % i, ec.ECDSA(hashes.SHA256()))
        engine.close()

    in_child(child)
    # The parent's engine is untouched by the child's end.
    public.verify(engine.sign_sync(key, "ecdsa-p256-sha256", b"after"), b"after", ec.ECDSA(hashes.SHA256()))
    engine.close()


def test_a_key_in_the_parents_key_process_fails_at_once_and_loads_again(
    pems: Dict[str, bytes], pyca_keys: Dict[str, Any]
) -> None:
    engine = sign.Engine(isolated=True)
    key = engine.load_key(pems["p256"])
    public = pyca_keys["p256"].public_key()
    assert engine.sign_sync(key, "ecdsa-p256-sha256", b"before")

    def child() -> None:
        with pytest.raises(keyfence.ShutDown, match="before this process .* forked") as e:
            engine.sign_sync(key, "ecdsa-p256-sha256", b"child", timeout=2)
        assert "load the key again" in str(e.value)
        again = engine.load_key(pems["p256"])
        public.verify(engine.sign_sync(again, "ecdsa-p256-sha256", b"again"), b"again", ec.ECDSA(hashes.SHA256()))

    in_child(child)
    # The child's end left the parent's key process running.
    public.verify(engine.sign_sync(key, "ecdsa-p256-sha256", b"after"), b"after", ec.ECDSA(hashes.SHA256()))
    engine.close()


# A module-level engine and key, as an application imports them before a
# fork-context pool starts its workers.
_POOL_ENGINE: Any = None
_POOL_KEY: Any = None


def _pool_sign(i: int) -> bytes:
    signal.alarm(20)
    return _POOL_ENGINE.sign_sync(_POOL_KEY, "ecdsa-p256-sha256", b"%d" % i, timeout=2)


def test_a_fork_context_pool_signs_with_the_parents_engine(pems: Dict[str, bytes], pyca_keys: Dict[str, Any]) -> None:
    global _POOL_ENGINE, _POOL_KEY
    _POOL_ENGINE = sign.Engine()
    _POOL_KEY = _POOL_ENGINE.load_key(pems["p256"])
    _POOL_ENGINE.sign_sync(_POOL_KEY, "ecdsa-p256-sha256", b"warm")
    try:
        with multiprocessing.get_context("fork").Pool(3) as pool:
            sigs = pool.map(_pool_sign, range(24), chunksize=2)
        for i, s in enumerate(sigs):
            pyca_keys["p256"].public_key().verify(s, b"%d" % i, ec.ECDSA(hashes.SHA256()))
    finally:
        _POOL_ENGINE.close()
        _POOL_ENGINE = _POOL_KEY = None
