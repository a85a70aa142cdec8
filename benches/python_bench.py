#!/usr/bin/env python3
"""The Python binding against the Rust core, side by side in one run.

    ./x bench python        (or: target/python/bin/python benches/python_bench.py --keyfence target/release/keyfence)

Each round measures, alternating Rust then Python so both see the same
machine load:
- CP-ABE decrypt, median ms, on CIRCL's benchmark shapes (`keyfence bench
  abe` in Rust; the same policies and attributes from Python), warm (a key
  loaded once) against Rust's `decrypt_ms` and cold (the key loaded from
  its bytes, then one decryption) against Rust's `decrypt_cold_ms`;
- a machine opening an envelope whose policy key it has cached, median µs
  (`keyfence bench wrap`);
- signing per CPU-second (`python-asyncio`: `await engine.sign(...)` in a
  loop in each of 1,000 tasks, the CPU of the whole process from getrusage: the event loop
  and the engine's threads), for ECDSA P-256, Ed25519 and RSA-2048 (PSS),
  against raw AWS-LC's in the same round (the `raw` rows of `keyfence
  bench sign --per-cpu`, run from here: the library the engine signs
  with, where pyca/cryptography's signing is OpenSSL's and would compare
  two libraries); and ECDSA P-256 throughput against the Rust engine's;
- CP-ABE decrypt of `and50` from one thread and from two (GIL released).

Prints one JSON object per round, and per round the `raw` and
`python-asyncio` signing rows in the shape of `keyfence bench sign --json
--per-cpu` (alg, path, per_cpu_second, vs_raw, target); then a summary
with the median of each round's ratio (Python / Rust for times, Python /
Rust for throughput and per CPU-second). `--only sign` measures signing
alone. `--loop uvloop` runs the signing on uvloop's event loop instead of
asyncio's (`pip install uvloop` first); its rows' path is `python-uvloop`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

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


def py_decrypt(iters: int) -> Dict[str, Dict[str, float]]:
    """Median ms per case of a warm decryption and of a cold one."""
    pk, msk = abe.setup()
    msg = b"a 23-byte test message!"
    out: Dict[str, Dict[str, float]] = {"warm": {}, "cold": {}}
    for name, (policy, attrs) in cases().items():
        warm, cold = [], []
        # As `keyfence bench abe` does: warm is a key loaded once, as a
        # machine holds its key; cold loads the key from its bytes and
        # decrypts once, as a short-lived process pays.
        key_bytes = abe.keygen(msk, attrs).to_bytes()
        key = abe.AttributeKey.from_bytes(key_bytes)
        for _ in range(iters):
            ct = abe.encrypt(pk, policy, msg)
            t = time.perf_counter()
            pt = abe.decrypt(key, ct)
            warm.append((time.perf_counter() - t) * 1e3)
            assert pt == msg
            t = time.perf_counter()
            pt = abe.decrypt(abe.AttributeKey.from_bytes(key_bytes), ct)
            cold.append((time.perf_counter() - t) * 1e3)
            assert pt == msg
        out["warm"][name] = statistics.median(warm)
        out["cold"][name] = statistics.median(cold)
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


# The algorithms signed per CPU-second, as `keyfence bench sign --per-cpu`
# names them, with a fresh key of each.
SIGN_ALGS = ["ecdsa-p256-sha256", "ed25519", "rsa2048-pss-sha256"]
# Issue 29: the asyncio path's signatures per CPU-second at least 0.75x
# raw AWS-LC's, for P-256 and Ed25519 (RSA-2048 is reported without one).
PER_CPU_TARGET = {"ecdsa-p256-sha256": 0.75, "ed25519": 0.75}


def sign_key_pem(alg: str) -> bytes:
    if alg == "ed25519":
        k = ed25519.Ed25519PrivateKey.generate()
    elif alg.startswith("rsa2048"):
        k = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    else:
        k = ec.generate_private_key(ec.SECP256R1())
    return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def cpu_seconds() -> float:
    """User and system CPU time of this whole process (every thread: the
    event loop and the engine's workers) so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def py_sign(alg: str, seconds: float, loop: str = "asyncio") -> Dict[str, float]:
    """asyncio signing for `seconds` from 1,000 tasks, each awaiting
    `engine.sign` in a loop (as a server's connection tasks would):
    signatures, wall seconds and CPU seconds of the process. (Gathering
    1,000 fresh calls per window instead, as this bench did before, also
    pays a new Task per signature: about 10% more CPU per signature.)"""
    pem = sign_key_pem(alg)
    # The library's algorithm name (the bench's case names the key size too).
    name = "rsa-pss-sha256" if alg.startswith("rsa2048") else alg
    msg = b" " * 130  # as `keyfence bench sign`: a TLS 1.3 CertificateVerify input

    async def run() -> Dict[str, float]:
        with sign.Engine(queue_capacity=4096) as engine:
            key = sign.PrivateKey.from_pem(pem)
            done, end = 0, time.perf_counter() + 0.3

            async def lane() -> None:
                nonlocal done
                while time.perf_counter() < end:
                    await engine.sign(key, name, msg)
                    done += 1

            await asyncio.gather(*(lane() for _ in range(1000)))  # warm-up
            done, end = 0, time.perf_counter() + seconds
            cpu, t = cpu_seconds(), time.perf_counter()
            await asyncio.gather(*(lane() for _ in range(1000)))
            wall, cpu = time.perf_counter() - t, cpu_seconds() - cpu
            return {"ops": done, "wall_s": wall, "cpu_s": cpu}

    if loop == "uvloop":
        import uvloop  # an optional dependency: only this option needs it

        return uvloop.run(run())
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
    ap.add_argument("--only", choices=["sign"], help="measure this alone")
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio", help="the event loop signing runs on")
    ap.add_argument("--svg", help="write a bar chart of the summary here")
    a = ap.parse_args()
    ratios: Dict[str, List[float]] = {}
    path = f"python-{a.loop}"
    for r in range(a.rounds):
        row: Dict[str, object] = {"round": r}
        if a.only is None:
            rust_rows = rust(a.keyfence, "abe", "--iters", str(a.iters))
            rust_abe = {c["case"]: c["decrypt_ms"] for c in rust_rows}
            rust_cold = {c["case"]: c["decrypt_cold_ms"] for c in rust_rows}
            py = py_decrypt(a.iters)
            py_abe, py_cold = py["warm"], py["cold"]
            rust_open = rust(a.keyfence, "wrap", "--iters", "2000")[0]["median_us"]
            py_open_us = py_open(2000)
            row["decrypt_ms"] = {c: {"rust": rust_abe[c], "python": py_abe[c]} for c in py_abe}
            row["decrypt_cold_ms"] = {c: {"rust": rust_cold[c], "python": py_cold[c]} for c in py_cold}
            row["open_cached_us"] = {"rust": rust_open, "python": py_open_us}
            for c in py_abe:
                ratios.setdefault(f"decrypt {c} python/rust", []).append(py_abe[c] / rust_abe[c])
                ratios.setdefault(f"decrypt cold {c} python/rust", []).append(py_cold[c] / rust_cold[c])
            ratios.setdefault("open cached python/rust", []).append(py_open_us / rust_open)
        # Signing, per algorithm: raw AWS-LC (and the Rust engine) right
        # before and right after the Python run, and Python against their
        # mean. This host's speed drifts over seconds, so a ratio against a
        # raw figure taken once, earlier, carries the drift (such rounds
        # scattered 0.54-0.78 for P-256 on an idle machine).
        signing = {}
        for alg in SIGN_ALGS:
            def rust_rows() -> Dict[str, dict]:
                out = rust(a.keyfence, "sign", "--per-cpu", "--path", "engine", "--seconds", str(a.seconds / 2), "--case", alg)
                return {x["path"]: x for x in out}
            before = rust_rows()
            m = py_sign(alg, a.seconds, a.loop)
            after = rust_rows()
            raw_pcs = statistics.mean([before["raw"]["per_cpu_second"], after["raw"]["per_cpu_second"]])
            engine_ops = statistics.mean([before["engine"]["ops_per_s"], after["engine"]["ops_per_s"]])
            per_cpu = m["ops"] / m["cpu_s"]
            vs_raw = per_cpu / raw_pcs
            ops = m["ops"] / m["wall_s"]
            print(json.dumps({
                "round": r, "alg": alg, "path": "raw", "per_cpu_second": round(raw_pcs), "vs_raw": 1.0, "target": None,
                "ops_per_s": round(statistics.mean([before["raw"]["ops_per_s"], after["raw"]["ops_per_s"]]), 1),
                "per_cpu_second_before": before["raw"]["per_cpu_second"], "per_cpu_second_after": after["raw"]["per_cpu_second"],
            }))
            print(json.dumps({
                "round": r, "alg": alg, "path": path, "per_cpu_second": round(per_cpu),
                "vs_raw": round(vs_raw, 3), "target": PER_CPU_TARGET.get(alg), "ops_per_s": round(ops, 1),
            }), flush=True)
            signing[alg] = {"raw_per_cpu_second": raw_pcs, "python_per_cpu_second": per_cpu,
                            "rust_engine_ops_per_s": engine_ops, f"{path.replace('-', '_')}_ops_per_s": ops}
            ratios.setdefault(f"{alg} per CPU-s {path}/raw", []).append(vs_raw)
            if alg == "ecdsa-p256-sha256":
                ratios.setdefault("ecdsa-p256 throughput python/rust", []).append(ops / engine_ops)
        row["sign"] = signing
        if a.only is None:
            speed = threads_speedup(20)
            row["decrypt_and50_two_threads"] = speed
            ratios.setdefault("decrypt and50 2-thread speedup", []).append(speed["speedup"])
        print(json.dumps(row), flush=True)
    summary = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in ratios.items()}
    print(json.dumps({"summary": summary, "keyfence": keyfence.__version__, "python": sys.version.split()[0]}))
    if a.svg:
        with open(a.svg, "w") as f:
            f.write(chart(summary))


# Targets from the Python issue: a time ratio at most 1.1, a throughput
# ratio at least 0.5; issue 29: per CPU-second at least 0.75 of raw
# AWS-LC for P-256 and Ed25519; the two-thread speedup has none (2 cores
# shared).
TARGETS = {"decrypt": (1.1, "max"), "open": (1.1, "max"), "ecdsa-p256 throughput": (0.5, "min"),
           "ecdsa-p256-sha256 per CPU-s": (0.75, "min"), "ed25519 per CPU-s": (0.75, "min")}


def chart(summary: Dict[str, Dict[str, float]]) -> str:
    """Horizontal bars: each ratio's median with its min-max range, and the
    target as a red tick."""
    rows = list(summary.items())
    w, left, bar, scale = 720, 300, 22, 240.0
    h = 40 + bar * len(rows) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           '<text x="10" y="20" font-size="14">Python binding / Rust core (side by side; median of rounds, range in grey)</text>']
    for i, (name, v) in enumerate(rows):
        y = 36 + i * bar
        out.append(f'<text x="{left - 8}" y="{y + 14}" text-anchor="end">{name}</text>')
        out.append(f'<rect x="{left}" y="{y + 3}" width="{v["median"] * scale:.1f}" height="{bar - 8}" fill="#4a7bd0"/>')
        out.append(f'<line x1="{left + v["min"] * scale:.1f}" x2="{left + v["max"] * scale:.1f}" y1="{y + 11}" y2="{y + 11}" stroke="#888" stroke-width="3"/>')
        out.append(f'<text x="{left + v["median"] * scale + 6:.1f}" y="{y + 14}">{v["median"]:.2f}</text>')
        target = next((t for k, t in TARGETS.items() if name.startswith(k)), None)
        if target:
            x = left + target[0] * scale
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y + 1}" y2="{y + bar - 3}" stroke="#d03030" stroke-width="2"/>')
    x1 = left + scale
    out.append(f'<line x1="{x1}" x2="{x1}" y1="32" y2="{h - 26}" stroke="#000" stroke-dasharray="3,3"/>')
    out.append(f'<text x="{x1}" y="{h - 10}" text-anchor="middle">1.0</text>')
    out.append("</svg>\n")
    return "\n".join(out)


if __name__ == "__main__":
    main()
