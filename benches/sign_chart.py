#!/usr/bin/env python3
"""Summarises repeated `keyfence bench sign --json` runs.

    for i in 1 2 3 4 5; do keyfence bench sign --json; done > runs.jsonl
    python3 benches/sign_chart.py runs.jsonl --svg docs/benchmarks-sign.svg

Each run measures every path side by side; this takes, per algorithm and
path, the median over runs of the ratio to its base (`engine` to `raw`,
`isolated` and `offload-sim` to `engine`), for throughput and for CPU per
operation, prints a Markdown table and draws a bar chart. Medians of
same-run ratios, because on a shared machine the absolute figures move
with the neighbours' load from one run to the next.
"""

import argparse
import json
import statistics
import sys
from collections import defaultdict

PATHS = ["engine", "isolated", "offload-sim"]
BASE = {"engine": "raw", "isolated": "engine", "offload-sim": "engine"}
# Issue 7's targets for the key process.
TARGETS = {("rsa2048-pkcs1-sha256", "isolated"): 0.9, ("ecdsa-p256-sha256", "isolated"): 0.7}
COLOURS = {"engine": "#4c72b0", "isolated": "#dd8452", "offload-sim": "#55a868"}


def load(path):
    """Ratios per (alg, path): lists over runs of (ops ratio, cpu ratio)."""
    ratios = defaultdict(list)
    p50 = defaultdict(list)
    current = {}
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            alg, name = r["alg"], r["path"]
            if name == "raw":
                current = {}
            current[name] = r
            p50[(alg, name)].append(r["p50_us"])
            base = current.get(BASE.get(name, ""))
            if base:
                ops = r["ops_per_s"] / base["ops_per_s"]
                cpu = base["cpu_us_per_op"] / r["cpu_us_per_op"] if r.get("cpu_us_per_op") else float("nan")
                ratios[(alg, name)].append((ops, cpu))
    return ratios, p50


def svg(ratios, algs, out):
    width, height, left, top, bottom = 760, 320, 60, 30, 70
    plot_h = height - top - bottom
    top_value = 1.2
    group_w = (width - left - 20) / len(algs)
    bar_w = group_w / (len(PATHS) + 1)
    y = lambda v: top + plot_h * (1 - min(v, top_value) / top_value)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="16" font-size="13">Throughput ratio, median of same-run ratios '
        "(engine/raw, isolated/engine, offload-sim/engine)</text>",
    ]
    for v in [0, 0.25, 0.5, 0.75, 1.0]:
        parts.append(f'<line x1="{left}" x2="{width - 20}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    for i, alg in enumerate(algs):
        gx = left + i * group_w + bar_w / 2
        for j, name in enumerate(PATHS):
            runs = ratios.get((alg, name))
            if not runs:
                continue
            v = statistics.median(o for o, _ in runs)
            x = gx + j * bar_w
            parts.append(
                f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{bar_w - 2:.1f}" height="{y(0) - y(v):.1f}" '
                f'fill="{COLOURS[name]}"/>'
            )
            parts.append(f'<text x="{x + bar_w / 2 - 1:.1f}" y="{y(v) - 3:.1f}" text-anchor="middle">{v:.2f}</text>')
            target = TARGETS.get((alg, name))
            if target:
                parts.append(
                    f'<line x1="{x - 2:.1f}" x2="{x + bar_w:.1f}" y1="{y(target):.1f}" y2="{y(target):.1f}" '
                    'stroke="#c00" stroke-width="2" stroke-dasharray="4 2"/>'
                )
        parts.append(
            f'<text x="{gx + 1.5 * bar_w:.1f}" y="{height - bottom + 16}" text-anchor="middle">{alg}</text>'
        )
    lx = left
    for name in PATHS:
        parts.append(f'<rect x="{lx}" y="{height - 30}" width="12" height="12" fill="{COLOURS[name]}"/>')
        parts.append(f'<text x="{lx + 16}" y="{height - 20}">{name} / {BASE[name]}</text>')
        lx += 170
    parts.append(
        f'<line x1="{lx}" x2="{lx + 20}" y1="{height - 24}" y2="{height - 24}" stroke="#c00" '
        'stroke-width="2" stroke-dasharray="4 2"/>'
    )
    parts.append(f'<text x="{lx + 24}" y="{height - 20}">issue 7 target</text>')
    parts.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", help="JSON lines from repeated `keyfence bench sign --json`")
    ap.add_argument("--svg", help="write a bar chart here")
    a = ap.parse_args()
    ratios, p50 = load(a.runs)
    if not ratios:
        sys.exit(f"{a.runs}: no `keyfence bench sign --json` lines")
    algs = list(dict.fromkeys(alg for alg, _ in ratios))
    n = max(len(v) for v in ratios.values())
    print(f"Medians over {n} runs (range in brackets).\n")
    print("| alg | path | ops ratio | range | CPU/op ratio | p50 µs |")
    print("| --- | --- | ---: | --- | ---: | ---: |")
    for alg in algs:
        for name in PATHS:
            runs = ratios.get((alg, name))
            if not runs:
                continue
            ops = [o for o, _ in runs]
            cpu = [c for _, c in runs]
            print(
                f"| {alg} | {name} / {BASE[name]} | **{statistics.median(ops):.3f}** | "
                f"{min(ops):.2f}-{max(ops):.2f} | {statistics.median(cpu):.3f} | "
                f"{statistics.median(p50[(alg, name)]):.1f} |"
            )
    if a.svg:
        svg(ratios, algs, a.svg)


if __name__ == "__main__":
    main()
