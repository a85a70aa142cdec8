"""asyncio: awaitables completed through the engine's completion-queue fd."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Dict, List

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding

import keyfence
from keyfence import sign


def test_many_in_flight_from_one_loop(pems: Dict[str, bytes], pyca_keys: Dict[str, Any]) -> None:
    async def main() -> List[bytes]:
        with sign.Engine(queue_capacity=4096) as engine:
            key = sign.PrivateKey.from_pem(pems["p256"])
            return await asyncio.gather(*(engine.sign(key, "ecdsa-p256-sha256", b"%d" % i) for i in range(2000)))

    sigs = asyncio.run(main())
    pub = pyca_keys["p256"].public_key()
    for i, s in enumerate(sigs):
        pub.verify(s, b"%d" % i, ec.ECDSA(hashes.SHA256()))


# Seconds of RSA work the batch below is sized to: long enough that a loop
# blocked by the engine shows one gap far above the 10 ms timer's, on any CPU.
RSA_WORK = 1.0


def test_loop_stays_responsive_with_a_slow_backend(pems: Dict[str, bytes], pyca_keys: Dict[str, Any]) -> None:
    """A batch of RSA signatures sized to about a second of work on this
    machine, behind one RSA worker (a slow backend), and 600 ECDSA ones,
    while a 10 ms timer on the same loop keeps firing. Decided on ratios a
    loaded machine cannot fake: a loop blocked by the engine would show one
    gap as long as the whole batch."""

    async def main() -> None:
        with sign.Engine(rsa_threads=1, queue_capacity=1 << 16, timeout=60) as engine:
            rsa_key = sign.PrivateKey.from_pem(pems["rsa2048"])
            ec_key = sign.PrivateKey.from_pem(pems["p256"])
            # What one RSA signature costs here: 800 took 0.35 s on one
            # machine and 0.19 s on one with AVX-512 IFMA, so a fixed count
            # cannot promise the work is long enough. The fastest of three
            # rounds: a load spike in one does not shrink the batch.
            rounds = []
            for _ in range(3):
                t0 = time.monotonic()
                await asyncio.gather(*(engine.sign(rsa_key, "rsa-pss-sha256", b"calibrate") for _ in range(100)))
                rounds.append((time.monotonic() - t0) / 100)
            rsa_n = min(40000, max(800, int(RSA_WORK / min(rounds))))
            loop = asyncio.get_running_loop()
            gaps: List[float] = []
            done = asyncio.Event()

            async def ticker() -> None:
                last = loop.time()
                while not done.is_set():
                    await asyncio.sleep(0.01)
                    now = loop.time()
                    gaps.append(now - last)
                    last = now

            t = asyncio.create_task(ticker())
            start = time.monotonic()
            rsa_sigs = [engine.sign(rsa_key, "rsa-pss-sha256", b"%d" % i) for i in range(rsa_n)]
            ec_sigs = [engine.sign(ec_key, "ecdsa-p256-sha256", b"%d" % i) for i in range(600)]
            results = await asyncio.gather(*rsa_sigs, *ec_sigs)
            elapsed = time.monotonic() - start
            done.set()
            await t
            rsa_pub = pyca_keys["rsa2048"].public_key()
            for i, s in enumerate(results[:rsa_n]):
                rsa_pub.verify(s, b"%d" % i, padding.PSS(padding.MGF1(hashes.SHA256()), 32), hashes.SHA256())
            # Long enough that a blocked loop's one gap (the whole batch)
            # would break the bound below.
            assert elapsed > 0.3, ("the backend should have been slow", rsa_n, rounds, elapsed)
            # The timer ran all along: no gap near the whole batch's time,
            # and ticks all through it.
            assert max(gaps) < max(0.25, elapsed / 4), (max(gaps), elapsed)
            assert len(gaps) >= 10, (len(gaps), elapsed)

    asyncio.run(main())


def test_full_queue_raises_overloaded_at_once(pems: Dict[str, bytes]) -> None:
    async def main() -> None:
        with sign.Engine(rsa_threads=1, queue_capacity=2, timeout=30) as engine:
            key = sign.PrivateKey.from_pem(pems["rsa2048"])
            results = await asyncio.gather(
                *(engine.sign(key, "rsa-pss-sha256", b"x") for _ in range(20)), return_exceptions=True
            )
            over = [r for r in results if isinstance(r, keyfence.Overloaded)]
            ok = [r for r in results if isinstance(r, bytes)]
            assert over and ok and len(over) + len(ok) == 20, results
            assert over[0].code == "OVERLOADED"
            assert engine.metrics()["rsa"]["overloaded"] == len(over)

    asyncio.run(main())


def on_one_rsa_thread(
    pems: Dict[str, bytes], body: Callable[[sign.Engine, sign.PrivateKey], Awaitable[None]], **options: Any
) -> None:
    """Runs body(engine, key) in an event loop: an engine with one RSA
    worker (so RSA-2048 signatures queue behind each other) and an RSA key."""

    async def main() -> None:
        with sign.Engine(rsa_threads=1, queue_capacity=512, **options) as engine:
            await body(engine, sign.PrivateKey.from_pem(pems["rsa2048"]))

    asyncio.run(main())


def test_deadline_raises_timed_out(pems: Dict[str, bytes]) -> None:
    async def body(engine: sign.Engine, key: sign.PrivateKey) -> None:
        results = await asyncio.gather(
            *(engine.sign(key, "rsa-pss-sha256", b"x", timeout=0.005) for _ in range(200)),
            return_exceptions=True,
        )
        late = [r for r in results if isinstance(r, keyfence.TimedOut)]
        assert late, "200 RSA signatures on one thread cannot all finish in 5 ms"
        assert isinstance(late[0], TimeoutError)
        assert all(isinstance(r, (bytes, keyfence.TimedOut)) for r in results), results

    on_one_rsa_thread(pems, body)


def test_cancelling_the_task_cancels_the_operation(pems: Dict[str, bytes]) -> None:
    async def body(engine: sign.Engine, key: sign.PrivateKey) -> None:
        tasks = [asyncio.create_task(engine.sign(key, "rsa-pss-sha256", b"x")) for _ in range(100)]
        await asyncio.sleep(0)  # let them submit
        for t in tasks[1:]:
            t.cancel()
        assert isinstance(await tasks[0], bytes)
        for t in tasks[1:]:
            with pytest.raises(asyncio.CancelledError):
                await t
        # Queued operations never ran: far fewer than 100 signatures made.
        await asyncio.sleep(0.2)
        m = engine.metrics()["rsa"]
        assert m["completed"] < 20, m
        assert m["queue_depth"] == 0

    on_one_rsa_thread(pems, body, timeout=60)


def test_wait_for_timeout_cancels_too(pems: Dict[str, bytes]) -> None:
    async def body(engine: sign.Engine, key: sign.PrivateKey) -> None:
        blockers = [asyncio.create_task(engine.sign(key, "rsa-pss-sha256", b"x")) for _ in range(50)]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.sign(key, "rsa-pss-sha256", b"y"), 0.001)
        await asyncio.gather(*blockers)

    on_one_rsa_thread(pems, body, timeout=60)


def test_errors_arrive_through_the_awaitable(pems: Dict[str, bytes]) -> None:
    async def main() -> None:
        with sign.Engine() as engine:
            key = sign.PrivateKey.from_pem(pems["p256"])
            with pytest.raises(keyfence.InvalidRequest):
                await engine.sign(key, "rsa-pss-sha256", b"x")
            with pytest.raises(TypeError):
                await engine.sign(key, "ecdsa-p256-sha256", 5)  # type: ignore[arg-type]

    asyncio.run(main())


def test_close_fails_pending_operations_with_shut_down(pems: Dict[str, bytes]) -> None:
    async def main() -> None:
        engine = sign.Engine(rsa_threads=1, queue_capacity=512, timeout=60)
        key = sign.PrivateKey.from_pem(pems["rsa2048"])
        tasks = [asyncio.create_task(engine.sign(key, "rsa-pss-sha256", b"x")) for _ in range(50)]
        await asyncio.sleep(0.01)
        engine.close()
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
        assert any(isinstance(r, keyfence.ShutDown) for r in results), results
        assert all(isinstance(r, (bytes, keyfence.ShutDown)) for r in results), results
        with pytest.raises(keyfence.ShutDown, match="closed"):
            await engine.sign(key, "rsa-pss-sha256", b"x")

    asyncio.run(main())


def test_one_engine_many_loops(pems: Dict[str, bytes]) -> None:
    engine = sign.Engine()
    key = sign.PrivateKey.from_pem(pems["ed25519"])
    for _ in range(5):
        assert len(asyncio.run(engine.sign(key, "ed25519", b"x"))) == 64
    assert len(engine._queues) <= 1  # closed loops are forgotten
    engine.close()


def test_a_future_that_refuses_its_result_strands_no_other(pems: Dict[str, bytes], pyca_keys: Dict[str, Any]) -> None:
    """The native drain completes every finished operation even when one
    future raises: the others get their signatures, the pending map loses
    every entry it resolved, and the first error reaches the loop."""
    import select

    from keyfence import _core

    class Refuses:
        def done(self) -> bool:
            return False

        def set_result(self, value: bytes) -> None:
            raise ValueError("refused")

    loop = asyncio.new_event_loop()
    try:
        with sign.Engine() as engine:
            key = sign.PrivateKey.from_pem(pems["p256"])
            queue = _core.CompletionQueue()
            good = [loop.create_future() for _ in range(3)]
            pending: Dict[int, Any] = {1: good[0], 2: Refuses(), 3: good[1], 4: good[2]}
            for token in pending:
                engine._native.submit(key, "ecdsa-p256-sha256", b"%d" % token, 0, queue, token)
            deadline = time.monotonic() + 30
            with pytest.raises(ValueError, match="refused"):
                while time.monotonic() < deadline:
                    select.select([queue.fileno()], [], [], 1)
                    queue.resolve(pending, keyfence.exceptions._from_code)
            # The rest arrive on later wake-ups if they were not ready yet.
            while pending and time.monotonic() < deadline:
                select.select([queue.fileno()], [], [], 1)
                queue.resolve(pending, keyfence.exceptions._from_code)
            assert pending == {}
            pub = pyca_keys["p256"].public_key()
            for token, fut in zip((1, 3, 4), good):
                pub.verify(fut.result(), b"%d" % token, ec.ECDSA(hashes.SHA256()))
    finally:
        loop.close()
