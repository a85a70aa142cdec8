#!/usr/bin/env python3
"""Charts `bindings/openssl/tests/bench_token.sh` (what `./x bench openssl`
runs after the handshakes): keyfence's OpenSSL provider against
pkcs11-provider, signing with SoftHSM2 keys from unmodified OpenSSL.

    ./x bench openssl > bench.out        # the token lines are the JSON ones with "alg"
    grep '"alg"' bench.out > docs/benchmarks-token.jsonl
    python3 benches/token_chart.py docs/benchmarks-token.jsonl --svg docs/benchmarks-token.svg

Prints a Markdown table (signatures per CPU-second each, the median of the
same-round ratios and their range) and draws one bar per key type: the
median ratio, its range as a whisker, and the 1.0x target as a line.
"""

import argparse
import json
import sys

from ratio_svg import ratio_svg


def rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip().startswith("{")]


def table(data):
    out = [
        "| key | keyfence (sig/CPU-s) | pkcs11-provider (sig/CPU-s) | keyfence / pkcs11-provider | rounds | target |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in data:
        rounds = r.get("rounds", [])
        span = f"{min(rounds):.3f}-{max(rounds):.3f}" if rounds else ""
        out.append(
            f"| {r['alg']} | {r['keyfence_per_cpu_s']:,} | {r.get('pkcs11_provider_per_cpu_s', 0):,} | "
            f"**{r.get('ratio', 0):.2f}x** | {span} | >= {r.get('target', 1.0)}x |"
        )
    return "\n".join(out)


def svg(data):
    title = "keyfence / pkcs11-provider, signatures per CPU-second (SoftHSM2)"
    return ratio_svg(data, title, 1.0, width=520, left=150, bar=36, height=260)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("jsonl")
    p.add_argument("--svg")
    a = p.parse_args()
    data = [r for r in rows(a.jsonl) if "pkcs11_provider_per_cpu_s" in r]
    if not data:
        sys.exit("no rows with pkcs11-provider's figures")
    print(table(data))
    if a.svg:
        with open(a.svg, "w", encoding="utf-8") as f:
            f.write(svg(data))


if __name__ == "__main__":
    main()
