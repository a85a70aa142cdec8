#!/usr/bin/env python3
"""keyfence's signatures against OpenSSL's own, per CPU-second, on this CPU.

    python3 benches/sign_vs_openssl.py --keyfence target/release/keyfence \\
        --rounds 3 --seconds 3 --json docs/benchmarks-sign-vs-openssl.jsonl --svg docs/benchmarks-sign-vs-openssl.svg

For each algorithm, in turn and `--rounds` times (so a change in the
machine's load falls on both alike): `keyfence bench sign --per-cpu --path
raw --threads 1` (the library keyfence signs with, called directly, one
thread; signatures per CPU-second of the process) and `openssl speed`
(OpenSSL's libcrypto; it divides by user CPU time unless told
`-elapsed`). The ratio is keyfence's CPU per signature over OpenSSL's,
each round's pair on its own: at most 1.05 is "no signature costs more
than OpenSSL's own" (issue 53). Prints a Markdown table and one JSON
object per algorithm; draws the ratios with their range.

`--path multibuffer` (or `isolated-multibuffer`, the key process on it)
measures Intel's crypto_mb instead of `raw`: the CPU of every thread the
path uses, against the same `openssl speed`; its target is 0.4x (issue 60).
It needs a CPU with AVX-512 IFMA and the library (`--crypto-mb`, or
KEYFENCE_CRYPTO_MB; `./x setup` fetches it into target/crypto-mb/):

    python3 benches/sign_vs_openssl.py --keyfence target/release/keyfence --path multibuffer \
        --case rsa2048-pkcs1-sha256 --case ecdsa-p256-sha256 --crypto-mb target/crypto-mb/lib-2026.2.0/libcrypto_mb.so.13
"""

import argparse
import json
import statistics
import subprocess
import sys

from ratio_svg import ratio_svg

# keyfence's case, openssl speed's name, and the summary line of
# `openssl speed -mr` that carries its signatures per second: `+F2:N:BITS:
# SIGN:VERIFY` (RSA), `+F4:N:BITS:SIGN:VERIFY` (ECDSA), `+F6:N:BITS:NAME:
# SIGN:VERIFY` (EdDSA), and the field the signing rate is in.
# PSS is compared with `rsa2048` too: `openssl speed` signs PKCS#1 v1.5
# only, and the private-key operation, which is the cost, is the same.
CASES = [
    ("rsa2048-pkcs1-sha256", "rsa2048", "F2", 3),
    ("rsa2048-pss-sha256", "rsa2048", "F2", 3),
    ("rsa3072-pkcs1-sha256", "rsa3072", "F2", 3),
    ("rsa4096-pkcs1-sha256", "rsa4096", "F2", 3),
    ("ecdsa-p256-sha256", "ecdsap256", "F4", 3),
    ("ecdsa-p384-sha384", "ecdsap384", "F4", 3),
    ("ed25519", "ed25519", "F6", 4),
]
# keyfence's CPU per signature over OpenSSL's, at most: the library itself
# (issue 53) and crypto_mb's device (issue 60).
TARGETS = {"raw": 1.05, "multibuffer": 0.4, "isolated-multibuffer": 0.4}
PATHS = ["raw", "engine", "isolated", "multibuffer", "isolated-multibuffer"]


def keyfence_rate(cli, case, seconds, path="raw", crypto_mb=None):
    cmd = [cli, "bench", "sign", "--json", "--per-cpu", "--threads", "1", "--path", path, "--case", case, "--seconds", str(seconds)]
    if crypto_mb:
        cmd += ["--crypto-mb", crypto_mb]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {run.stderr.strip()}")
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if row.get("path") == path and row.get("alg") == case:
                return float(row["per_cpu_second"])
    raise SystemExit(f"no {path} row for {case} in: {run.stdout}")


def openssl_rate(name, tag, field, seconds):
    """Signatures per CPU-second from `openssl speed -mr` (which divides
    by user CPU time unless told `-elapsed`)."""
    out = subprocess.run(
        ["openssl", "speed", "-mr", "-seconds", str(max(1, round(seconds))), name], check=True, capture_output=True, text=True, timeout=600
    ).stdout
    for line in out.splitlines():
        parts = line.strip().split(":")
        if parts[0] == f"+{tag}" and len(parts) > field:
            return float(parts[field])
    raise SystemExit(f"no +{tag}: line from openssl speed {name}: {out}")


def measure(cli, rounds, seconds, only, path="raw", crypto_mb=None):
    results = []
    for case, name, tag, field in CASES:
        if only and case not in only:
            continue
        ratios, ours, theirs = [], [], []
        for i in range(rounds):
            # Alternate which goes first, round by round.
            pair = [
                ("k", lambda: keyfence_rate(cli, case, seconds, path, crypto_mb)),
                ("o", lambda: openssl_rate(name, tag, field, seconds)),
            ]
            if i % 2:
                pair.reverse()
            got = dict((k, f()) for k, f in pair)
            ours.append(got["k"])
            theirs.append(got["o"])
            # CPU per signature: 1/rate. keyfence's over OpenSSL's.
            ratios.append(got["o"] / got["k"])
        results.append(
            {
                "alg": case,
                "path": path,
                "keyfence_per_cpu_s": round(statistics.median(ours), 1),
                "openssl_per_cpu_s": round(statistics.median(theirs), 1),
                "ratio": round(statistics.median(ratios), 3),
                "rounds": [round(r, 3) for r in ratios],
                "target": TARGETS.get(path),
                "openssl": subprocess.run(["openssl", "version"], capture_output=True, text=True).stdout.strip(),
            }
        )
    return results


def table(data):
    out = [
        "| signature | keyfence (sig/CPU-s) | OpenSSL (sig/CPU-s) | keyfence CPU / OpenSSL CPU per signature | rounds | target |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in data:
        span = f"{min(r['rounds']):.3f}-{max(r['rounds']):.3f}"
        target = f"<= {r['target']}x" if r.get("target") else ""
        out.append(
            f"| {r['alg']} | {r['keyfence_per_cpu_s']:,} | {r['openssl_per_cpu_s']:,} | **{r['ratio']:.2f}x** | {span} | {target} |"
        )
    return "\n".join(out)


def svg(data):
    goal = data[0].get("target") if data else None
    return ratio_svg(data, "keyfence CPU per signature / OpenSSL's (lower is faster)", goal, width=560, left=170, bar=34)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keyfence", required=True, help="the keyfence command line (a release build)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--json", help="write one JSON object per algorithm here")
    ap.add_argument("--svg", help="write the chart here")
    ap.add_argument("--case", action="append", default=[], help="only this signature (repeatable); default: all")
    ap.add_argument("--path", default="raw", choices=PATHS, help="keyfence's path (default raw: the library called directly)")
    ap.add_argument("--crypto-mb", help="crypto_mb's library, for the multibuffer paths")
    args = ap.parse_args()
    unknown = set(args.case) - {c[0] for c in CASES}
    if unknown:
        ap.error(f"unknown case(s) {', '.join(sorted(unknown))}; known: {', '.join(c[0] for c in CASES)}")
    data = measure(args.keyfence, args.rounds, args.seconds, set(args.case), args.path, args.crypto_mb)
    print(table(data))
    for r in data:
        print(json.dumps(r, sort_keys=True))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in data)
    if args.svg:
        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(svg(data))


if __name__ == "__main__":
    sys.exit(main())
