"""The bar chart of the benchmarks that compare keyfence with another
implementation (benches/sign_vs_openssl.py, benches/token_chart.py): one
bar per row at its median ratio, the range of the rounds' ratios as a
whisker, and the target as a dashed line. 1.0x is 300 pixels."""

SCALE = 300  # pixels for 1.0x


def ratio_svg(data, title, goal, *, width, left, bar, height=None):
    """An SVG document. `data`: rows with "alg", "ratio" and "rounds" (the
    ratios of the rounds; none: the ratio alone). `goal`: the target ratio,
    drawn when not None. `height`: by default, what the rows need."""
    top = 30
    if height is None:
        height = top + 40 + len(data) * (bar + 24)
    lines = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<text x="{left}" y="18" font-size="13">{title}</text>',
    ]
    for i, r in enumerate(data):
        y = top + 20 + i * (bar + 24)
        ratio = r.get("ratio", 0)
        rounds = r.get("rounds", []) or [ratio]
        lines.append(f'<text x="{left - 8}" y="{y + bar / 2 + 4}" text-anchor="end">{r["alg"]}</text>')
        lines.append(f'<rect x="{left}" y="{y}" width="{ratio * SCALE:.1f}" height="{bar}" fill="#4c72b0"/>')
        lo, hi, mid = min(rounds) * SCALE + left, max(rounds) * SCALE + left, y + bar / 2
        lines.append(f'<line x1="{lo:.1f}" y1="{mid}" x2="{hi:.1f}" y2="{mid}" stroke="black"/>')
        lines.append(f'<text x="{left + ratio * SCALE + 6:.1f}" y="{y - 3}">{ratio:.2f}x</text>')
    if goal:
        target = left + goal * SCALE
        lines.append(f'<line x1="{target}" y1="{top}" x2="{target}" y2="{height - 20}" stroke="#c44e52" stroke-dasharray="4 3"/>')
        lines.append(f'<text x="{target + 4}" y="{height - 8}" fill="#c44e52">{goal}x target</text>')
    lines.append("</svg>")
    return "\n".join(lines) + "\n"
