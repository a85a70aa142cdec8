#!/usr/bin/env python3
"""Charts `keyfence bench fleet --json` runs at several sizes.

    for s in "--quick" "--dcs 50 --machines 10 --envelopes 5000" ...; do
        keyfence bench fleet --json $s; done > fleet.jsonl
    python3 benches/fleet_chart.py fleet.jsonl --svg docs/benchmarks-fleet.svg

Prints a Markdown table (one row per size) and draws, against the number
of envelopes (log scale, both axes), the time of each authority operation
and the p99 propagation of each change to the data centers' caches, so
that how each cost grows with the fleet is visible.
"""

import argparse
import json
import math
import sys
from collections import defaultdict

SERIES = [
    ("issue", "issue_s", "issue every key (s)", "#4c72b0"),
    ("wrap", "wrap_s", "wrap every envelope (s)", "#dd8452"),
    ("rotate_master", "rotate_master_s", "master rotation (s)", "#55a868"),
    ("rotate_policy_key", "rotate_policy_key_s", "policy-key rotation (s)", "#c44e52"),
    ("revoke", "revoke_s", "revocation with re-wrap (s)", "#8172b3"),
    ("revoke_alone", "revoke_s", "revocation, no cache following (s)", "#da8bc3"),
    ("revoke", "propagation_p99_ms", "revocation reaching every cache, p99 (s)", "#937860"),
]


def load(path):
    runs = defaultdict(dict)
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            key = (r["store"], r["dcs"], r["machines_per_dc"], r["envelopes"])
            runs[key][r["phase"]] = r
    return runs


def value(run, phase, field):
    v = run.get(phase, {}).get(field)
    if v is None:
        return None
    return v / 1000.0 if field.endswith("_ms") else v


def table(runs):
    print("| store | data centers x machines | envelopes | issue | wrap | master rotation | policy-key rotation | revocation (re-wrapped), caches following | revocation, authority alone (/ wrap) | propagation p50 / p99 (revocation) | stored | per-DC wrapping |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (store, dcs, per_dc, envs), run in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][3])):
        rv = run.get("revoke", {})
        ra = run.get("revoke_alone", {})
        st = run.get("storage", {})
        print(
            f"| {store} | {dcs} x {per_dc} | {envs:,} | {value(run, 'issue', 'issue_s'):.1f} s "
            f"| {value(run, 'wrap', 'wrap_s'):.1f} s | {value(run, 'rotate_master', 'rotate_master_s'):.2f} s "
            f"| {value(run, 'rotate_policy_key', 'rotate_policy_key_s'):.1f} s "
            + (f"| {rv['revoke_s']:.1f} s ({rv['rewrapped']:,}) " if rv else "| not measured ")
            + (f"| {ra['revoke_s']:.1f} s ({ra['revoke_to_wrap']:.2f}x) " if ra else "| not measured ")
            + (f"| {rv['propagation_p50_ms']:.0f} / {rv['propagation_p99_ms']:.0f} ms " if rv else "| not measured ")
            + f"| {st.get('storage_bytes', 0) / 1e6:.1f} MB | {st.get('per_dc_wrapping_bytes', 0) / 1e6:.1f} MB |"
        )


def svg(runs, out):
    points = sorted(runs.items(), key=lambda kv: kv[0][3])
    xs = [k[3] for k, _ in points]
    vals = [value(r, p, f) for _, r in points for p, f, _, _ in SERIES]
    vals = [v for v in vals if v]
    width, height, left, top, bottom, right = 760, 360, 70, 30, 50, 250
    lo_x, hi_x = math.log10(min(xs)), math.log10(max(xs)) if max(xs) > min(xs) else math.log10(min(xs)) + 1
    lo_y, hi_y = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    pw, ph = width - left - right, height - top - bottom
    X = lambda v: left + pw * (math.log10(v) - lo_x) / max(hi_x - lo_x, 1e-9)
    Y = lambda v: top + ph * (1 - (math.log10(v) - lo_y) / max(hi_y - lo_y, 1e-9))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="16" font-size="13">keyfence bench fleet: time against envelopes (log-log)</text>',
    ]
    for e in range(lo_y, hi_y + 1):
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{Y(10 ** e):.1f}" y2="{Y(10 ** e):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{Y(10 ** e) + 4:.1f}" text-anchor="end">{10 ** e:g} s</text>')
    for x in xs:
        parts.append(f'<text x="{X(x):.1f}" y="{top + ph + 16}" text-anchor="middle">{x:,}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 10}" text-anchor="middle">envelopes (and machines with them)</text>')
    for i, (phase, field, label, colour) in enumerate(SERIES):
        pts = [(X(k[3]), Y(v)) for k, r in points if (v := value(r, phase, field))]
        if pts:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}"/>')
            parts.extend(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{colour}"/>' for a, b in pts)
        ly = top + 14 * i
        parts.append(f'<rect x="{left + pw + 12}" y="{ly}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{left + pw + 26}" y="{ly + 9}">{label}</text>')
    parts.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs")
    ap.add_argument("--svg")
    ap.add_argument("--store", help="chart only this store's runs (file, etcd); the table has every run")
    a = ap.parse_args()
    runs = load(a.runs)
    if not runs:
        sys.exit("no runs in " + a.runs)
    table(runs)
    if a.svg:
        svg({k: v for k, v in runs.items() if not a.store or k[0] == a.store}, a.svg)


if __name__ == "__main__":
    main()
