#!/usr/bin/env python3
"""The Python binding against the Rust core, side by side in one run.

    ./x bench python        (or: target/python/bin/python benches/python_bench.py --keyfence target/release/keyfence)

Each round measures, alternating Rust then Python so both see the same
machine load:
- CP-ABE decrypt, median ms, on CIRCL's benchmark shapes (`keyfence bench
  abe` in Rust; the same policies and attributes from Python);
- a machine opening an envelope whose policy key it has cached, median µs
  (`keyfence bench wrap`);
- ECDSA P-256 signing throughput through the engine (`keyfence bench sign
  --path engine`) against asyncio `await engine.sign(...)` with 1,000 in
  flight;
- CP-ABE decrypt of `and50` from one thread and from two (GIL released).

Prints one JSON object per round and a summary with the median of each
round's ratio (Python / Rust for times, Python / Rust for throughput).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

import keyfence
from keyfence import abe, sign, wrap


def cases() -> Dict[str, tuple]:
    def clauses(neg: bool, op: str) -> str:
        return op.join(f"not a{i}: x{i}" if neg and i % 2 else f"a{i}: v{i}" for i in range(50))

    every = {f"a{i}": f"v{i}" for i in range(50)}
    return {
        "small": ("country: US or region: EU", {"country": "FR", "region": "EU"}),
        "and50": (clauses(False, " and "), every),
        "or50": (clauses(False, " or "), every),
        "and50neg25": (clauses(True, " and "), every),
    }


def rust(cli: str, *args: str) -> List[dict]:
    out = subprocess.run([cli, "bench", *args, "--json"], check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def py_decrypt(iters: int) -> Dict[str, float]:
    pk, msk = abe.setup()
    msg = b"a 23-byte test message!"
    out = {}
    for name, (policy, attrs) in cases().items():
        times = []
        for _ in range(iters):
            key = abe.keygen(msk, attrs)
            ct = abe.encrypt(pk, policy, msg)
            t = time.perf_counter()
            pt = abe.decrypt(key, ct)
            times.append((time.perf_counter() - t) * 1e3)
            assert pt == msg
        out[name] = statistics.median(times)
    return out


def py_open(iters: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        auth = wrap.Authority.init(d)
        env = auth.wrap("region: EU", bytes([7]) * 32)
        m = wrap.Machine(auth.issue({"region": "EU"}), d)
        m.open(env)
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            m.open(env)
            times.append((time.perf_counter() - t) * 1e6)
        return statistics.median(times)


def py_sign(seconds: float) -> float:
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    msg = b" " * 130  # as `keyfence bench sign`: a TLS 1.3 CertificateVerify input

    async def run() -> float:
        with sign.Engine(queue_capacity=4096) as engine:
            key = sign.PrivateKey.from_pem(pem)
            window, done = 1000, 0
            await asyncio.gather(*(engine.sign(key, "ecdsa-p256-sha256", msg) for _ in range(window)))
            t = time.perf_counter()
            while time.perf_counter() - t < seconds:
                await asyncio.gather(*(engine.sign(key, "ecdsa-p256-sha256", msg) for _ in range(window)))
                done += window
            return done / (time.perf_counter() - t)

    return asyncio.run(run())


def threads_speedup(n: int) -> Dict[str, float]:
    pk, msk = abe.setup()
    policy, attrs = cases()["and50"]
    key = abe.keygen(msk, attrs)
    ct = abe.encrypt(pk, policy, b"m")

    def work(k: int) -> None:
        for _ in range(k):
            abe.decrypt(key, ct)

    t = time.perf_counter()
    work(n)
    one = time.perf_counter() - t
    ths = [threading.Thread(target=work, args=(n // 2,)) for _ in range(2)]
    t = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    two = time.perf_counter() - t
    return {"one_thread_s": one, "two_threads_s": two, "speedup": one / two}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keyfence", required=True, help="the release `keyfence` command line")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args()
    ratios: Dict[str, List[float]] = {}
    for r in range(a.rounds):
        rust_abe = {c["case"]: c["decrypt_ms"] for c in rust(a.keyfence, "abe", "--iters", str(a.iters))}
        py_abe = py_decrypt(a.iters)
        rust_open = rust(a.keyfence, "wrap", "--iters", "2000")[0]["median_us"]
        py_open_us = py_open(2000)
        rust_sign = rust(a.keyfence, "sign", "--case", "ecdsa-p256-sha256", "--path", "engine", "--seconds", str(a.seconds))
        rust_ops = next(x["ops_per_s"] for x in rust_sign if x["path"] == "engine")
        py_ops = py_sign(a.seconds)
        speed = threads_speedup(20)
        row = {
            "round": r,
            "decrypt_ms": {c: {"rust": rust_abe[c], "python": py_abe[c]} for c in py_abe},
            "open_cached_us": {"rust": rust_open, "python": py_open_us},
            "ecdsa_p256_ops_per_s": {"rust_engine": rust_ops, "python_asyncio": py_ops},
            "decrypt_and50_two_threads": speed,
        }
        print(json.dumps(row), flush=True)
        for c in py_abe:
            ratios.setdefault(f"decrypt {c} python/rust", []).append(py_abe[c] / rust_abe[c])
        ratios.setdefault("open cached python/rust", []).append(py_open_us / rust_open)
        ratios.setdefault("ecdsa-p256 throughput python/rust", []).append(py_ops / rust_ops)
        ratios.setdefault("decrypt and50 2-thread speedup", []).append(speed["speedup"])
    summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in ratios.items()}
    print(json.dumps({"summary": summary, "keyfence": keyfence.__version__, "python": sys.version.split()[0]}))


if __name__ == "__main__":
    main()
