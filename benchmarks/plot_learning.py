"""Samples to the target against the dimension d, one line per method, from bench_learning.py's results.

    python benchmarks/plot_learning.py OUT.png RESULTS.json [RESULTS.json ...]

Each RESULTS file is what ``bench_learning.py --json`` writes (its measured runs under "runs"); a later file's
(preset, d) replaces an earlier one's. A point is the median over seeds of the rollout samples to the target; a
median that did not reach it ("> cap": half the seeds or more never got there) is drawn hollow at the cap. Both axes
are logarithmic. Prints the table it drew.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

COLOURS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207), (0, 0, 0), (90, 160, 250),
           (250, 160, 90), (120, 200, 120), (200, 90, 90), (160, 120, 220), (90, 60, 30), (255, 200, 0), (0, 110, 90)]


def medians(files: list[str]) -> dict[tuple[str, int], tuple[float, bool]]:
    """{(preset, d): (median samples, reached)} with each run at the cap counted as not reached."""
    by_key: dict[tuple[str, int], list[dict]] = {}
    for path in files:
        runs = json.loads(Path(path).read_text())["runs"]
        fresh: dict[tuple[str, int], list[dict]] = {}
        for r in runs:
            fresh.setdefault((r["preset"], r["dim"]), []).append(r)
        by_key.update(fresh)
    out = {}
    for key, rows in by_key.items():
        values = sorted(r["samples"] if r["reached"] else math.inf for r in rows)
        med = statistics.median_low(values) if len(values) % 2 else statistics.median(values)
        cap = max(r["samples"] for r in rows)
        out[key] = (cap, False) if math.isinf(med) else (med, True)
    return out


def plot(points: dict[tuple[str, int], tuple[float, bool]], path: str) -> None:
    from PIL import Image, ImageDraw

    presets = sorted({p for p, _ in points})
    dims = sorted({d for _, d in points})
    w, h, pad, legend = 860, 480, 56, 190
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    right = w - legend
    d.rectangle([pad, pad // 2, right, h - pad], outline="black")
    values = [v for v, _ in points.values()]
    lo, hi = math.log10(min(values)) - 0.1, math.log10(max(values)) + 0.1
    dlo, dhi = math.log10(min(dims)), math.log10(max(dims))

    def xy(dim, samples):
        x = pad + 20 + (right - pad - 40) * (math.log10(dim) - dlo) / max(dhi - dlo, 1e-9)
        y = (h - pad) - (h - 1.5 * pad) * (math.log10(samples) - lo) / (hi - lo)
        return x, y

    for dim in dims:
        x, _ = xy(dim, 10**lo)
        d.text((x - 12, h - pad + 6), f"d={dim}", fill="black")
    for e in range(math.ceil(lo), math.floor(hi) + 1):
        _, y = xy(dims[0], 10**e)
        d.line([(pad, y), (pad + 6, y)], fill="black")
        d.text((6, y - 6), f"{10**e:,}", fill="black")
    for i, p in enumerate(presets):
        colour = COLOURS[i % len(COLOURS)]
        line = [(xy(dim, points[(p, dim)][0]), points[(p, dim)][1]) for dim in dims if (p, dim) in points]
        if len(line) > 1:
            d.line([q for q, _ in line], fill=colour, width=2)
        for (x, y), reached in line:
            d.ellipse([x - 4, y - 4, x + 4, y + 4], outline=colour, fill=colour if reached else "white", width=2)
        d.text((right + 12, pad // 2 + 16 * i), p, fill=colour)
    d.text((pad, 4), "rollout samples to a 0.8 held-out hit rate (median over seeds; hollow: > cap)", fill="black")
    img.save(path)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    points = medians(argv[1:])
    plot(points, argv[0])
    dims = sorted({d for _, d in points})
    print("| preset | " + " | ".join(f"d = {d:,}" for d in dims) + " |")
    print("|---|" + "---|" * len(dims))
    for p in sorted({p for p, _ in points}):
        cells = []
        for dim in dims:
            if (p, dim) not in points:
                cells.append("–")
            else:
                v, reached = points[(p, dim)]
                cells.append(f"{v / 1000:.1f}k" if reached else f"> cap ({v / 1000:.1f}k)")
        print(f"| {p} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
