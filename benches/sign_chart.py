#!/usr/bin/env python3
"""Summarises repeated `keyfence bench sign --json` runs.

    for i in 1 2 3 4 5; do keyfence bench sign --json; done > runs.jsonl
    python3 benches/sign_chart.py runs.jsonl --svg docs/benchmarks-sign.svg

    for i in 1 2 3; do keyfence bench sign --json --per-cpu; done > per-cpu.jsonl
    python3 benches/sign_chart.py --per-cpu per-cpu.jsonl --svg docs/benchmarks-sign-percpu.svg

With --per-cpu it reads rows of `bench sign --json --per-cpu` (and the
`python-asyncio` and `node-promise` rows the Python and Node benches print
in the same shape) and gives, per algorithm and path, the median over runs
of signatures per CPU-second and of `vs_raw` (that figure over raw
AWS-LC's in the same run), with the range and issue 29's target, as a
table and a chart of per-core efficiency by path.

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


def bar_chart(out, *, title, size, algs, paths, colour, bar, target, legend, legend_step, target_label):
    """Grouped bars, one group per algorithm and one bar per path, on a
    0-1.2 ratio axis: `bar(alg, path)` gives (value, range or None) or
    None for no bar, `target(alg, path)` the red dash, if any."""
    width, height = size
    left, top, bottom = 60, 30, 70
    plot_h = height - top - bottom
    top_value = 1.2
    group_w = (width - left - 20) / len(algs)
    bar_w = group_w / (len(paths) + 1)
    y = lambda v: top + plot_h * (1 - min(v, top_value) / top_value)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="16" font-size="13">{title}</text>',
    ]
    for v in [0, 0.25, 0.5, 0.75, 1.0]:
        parts.append(f'<line x1="{left}" x2="{width - 20}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    for i, alg in enumerate(algs):
        gx = left + i * group_w + bar_w / 2
        for j, name in enumerate(paths):
            b = bar(alg, name)
            if b is None:
                continue
            v, spread = b
            x = gx + j * bar_w
            parts.append(
                f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{bar_w - 2:.1f}" height="{y(0) - y(v):.1f}" '
                f'fill="{colour[name]}"/>'
            )
            mid = x + bar_w / 2 - 1
            top_of_bar = v
            if spread is not None:
                parts.append(
                    f'<line x1="{mid:.1f}" x2="{mid:.1f}" y1="{y(spread[0]):.1f}" y2="{y(spread[1]):.1f}" stroke="#333"/>'
                )
                top_of_bar = max(v, spread[1])
            parts.append(f'<text x="{mid:.1f}" y="{y(top_of_bar) - 3:.1f}" text-anchor="middle">{v:.2f}</text>')
            t = target(alg, name)
            if t:
                parts.append(
                    f'<line x1="{x - 2:.1f}" x2="{x + bar_w:.1f}" y1="{y(t):.1f}" y2="{y(t):.1f}" '
                    'stroke="#c00" stroke-width="2" stroke-dasharray="4 2"/>'
                )
        parts.append(
            f'<text x="{gx + (len(paths) - 1) * bar_w / 2 + bar_w / 2:.1f}" y="{height - bottom + 16}" '
            f'text-anchor="middle">{alg}</text>'
        )
    lx = left
    for name in paths:
        parts.append(f'<rect x="{lx}" y="{height - 30}" width="12" height="12" fill="{colour[name]}"/>')
        parts.append(f'<text x="{lx + 16}" y="{height - 20}">{legend(name)}</text>')
        lx += legend_step
    parts.append(
        f'<line x1="{lx}" x2="{lx + 20}" y1="{height - 24}" y2="{height - 24}" stroke="#c00" '
        'stroke-width="2" stroke-dasharray="4 2"/>'
    )
    parts.append(f'<text x="{lx + 24}" y="{height - 20}">{target_label}</text>')
    parts.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(parts) + "\n")


def svg(ratios, algs, out):
    def bar(alg, name):
        runs = ratios.get((alg, name))
        return (statistics.median(o for o, _ in runs), None) if runs else None

    bar_chart(
        out,
        title="Throughput ratio, median of same-run ratios (engine/raw, isolated/engine, offload-sim/engine)",
        size=(760, 320), algs=algs, paths=PATHS, colour=COLOURS, bar=bar,
        target=lambda alg, name: TARGETS.get((alg, name)),
        legend=lambda name: f"{name} / {BASE[name]}", legend_step=170, target_label="issue 7 target",
    )


# The paths of the per-CPU figures, in the order they hop further away.
PER_CPU_PATHS = ["engine", "isolated", "remote", "python-asyncio", "python-uvloop", "node-promise"]
PER_CPU_COLOURS = {
    "engine": "#4c72b0", "isolated": "#dd8452", "remote": "#c44e52",
    "python-asyncio": "#55a868", "python-uvloop": "#64b5cd", "node-promise": "#8172b3",
}


def load_per_cpu(path):
    """Per (alg, path): lists over runs of (per_cpu_second, vs_raw), the
    target, and the algorithms in the order first seen."""
    runs, targets, algs = defaultdict(list), {}, []
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if "vs_raw" not in r:
                continue
            key = (r["alg"], r["path"])
            runs[key].append((r["per_cpu_second"], r["vs_raw"]))
            targets[key] = r.get("target")
            if r["alg"] not in algs:
                algs.append(r["alg"])
    return runs, targets, algs


def per_cpu_svg(runs, targets, algs, out):
    """Grouped bars: per algorithm, each path's median vs_raw (1.0 = raw
    AWS-LC), its range as a line, its target as a red dash."""
    def bar(alg, name):
        r = runs.get((alg, name))
        if not r:
            return None
        ratios = [v for _, v in r]
        return statistics.median(ratios), (min(ratios), max(ratios))

    bar_chart(
        out,
        title="Signatures per CPU-second of every process a path uses, "
        "over raw AWS-LC's in the same run (median of runs, range as a line)",
        size=(820, 340), algs=algs, paths=[p for p in PER_CPU_PATHS if any((a, p) in runs for a in algs)],
        colour=PER_CPU_COLOURS, bar=bar, target=lambda alg, name: targets.get((alg, name)),
        legend=lambda name: name, legend_step=120, target_label="issue 29 target",
    )


def per_cpu_main(a):
    runs, targets, algs = load_per_cpu(a.runs)
    if not runs:
        sys.exit(f"{a.runs}: no rows with vs_raw (`keyfence bench sign --json --per-cpu`)")
    n = max(len(v) for v in runs.values())
    print(f"Medians over up to {n} runs (range of vs_raw in brackets).\n")
    print("| alg | path | per CPU-second | vs_raw | range | target |")
    print("| --- | --- | ---: | ---: | --- | ---: |")
    for alg in algs:
        for name in ["raw"] + PER_CPU_PATHS:
            r = runs.get((alg, name))
            if not r:
                continue
            ratios = [v for _, v in r]
            target = targets.get((alg, name))
            verdict = "" if target is None else (" met" if statistics.median(ratios) >= target else " not met")
            print(
                f"| {alg} | {name} | {statistics.median(p for p, _ in r):.0f} | **{statistics.median(ratios):.3f}** | "
                f"{min(ratios):.2f}-{max(ratios):.2f} | {'' if target is None else f'>= {target}'}{verdict} |"
            )
    if a.svg:
        per_cpu_svg(runs, targets, algs, a.svg)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", help="JSON lines from repeated `keyfence bench sign --json`")
    ap.add_argument("--svg", help="write a bar chart here")
    ap.add_argument("--per-cpu", action="store_true", help="rows of `bench sign --json --per-cpu` (see above)")
    a = ap.parse_args()
    if a.per_cpu:
        return per_cpu_main(a)
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
