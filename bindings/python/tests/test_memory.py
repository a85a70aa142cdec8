"""No leak across the boundary: after warm-up, resident memory stays within
10% over 100,000 signatures and 2,000 decrypts."""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Dict, Tuple

from keyfence import abe, sign

Authority = Tuple[abe.PublicKey, abe.MasterSecretKey]


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_resident_memory_stays_flat(pems: Dict[str, bytes], authority: Authority) -> None:
    pk, msk = authority
    key = abe.keygen(msk, {"region": "EU", "country": "FR"})
    ct = abe.encrypt(pk, "region: EU and not country: DE", b"m" * 64)
    engine = sign.Engine(queue_capacity=4096)
    ec_key = sign.PrivateKey.from_pem(pems["p256"])

    async def signatures(n: int) -> None:
        batch = 1000
        for _ in range(n // batch):
            await asyncio.gather(*(engine.sign(ec_key, "ecdsa-p256-sha256", b"data") for _ in range(batch)))

    def round_(sigs: int, decrypts: int) -> None:
        asyncio.run(signatures(sigs))
        for _ in range(decrypts):
            abe.decrypt(key, ct)
        gc.collect()

    # Warm-up of the same size: allocator arenas, thread stacks and caches
    # settle at what the load needs; after that a leak shows as growth.
    round_(100_000, 2_000)
    before = rss()
    round_(100_000, 2_000)
    after = rss()
    engine.close()
    assert after <= before * 1.10, f"RSS grew from {before >> 20} MiB to {after >> 20} MiB"
