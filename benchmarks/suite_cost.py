"""What the test suite costs: wall time, seconds per test file and per marker, the slowest tests, peak memory.

    python benchmarks/suite_cost.py run OUT [PYTEST_ARGS ...]     # the README's test command with --cost-log=OUT/cost
    python benchmarks/suite_cost.py report OUT [--before OTHER]   # tables from a run's cost log (and a run to compare)

``run`` runs ``python -m pytest -n 2 -q`` (the README's command; extra arguments follow it) with the cost plugin of
tests/cost_log.py, and writes OUT/cost/<worker>.jsonl (each test's seconds, the worker's resident memory after it,
its peak during it, a child process's peak), OUT/wall.json (the whole run's wall seconds and pytest's closing line)
and OUT/report.md. ``report`` prints the tables in Markdown: per file and per marker (tests, seconds, the largest
peak), the 25 slowest tests, every test over 60 s, every test whose worker peaked over 4 GB; with ``--before`` each
file's seconds beside the other run's, so growth shows where it happens. docs/results/suite_cost.md keeps the runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOW_S, HEAVY_GB = 60.0, 4.0


def load(folder: Path) -> list[dict]:
    cost = folder / "cost" if (folder / "cost").is_dir() else folder
    rows = [json.loads(line) for path in sorted(cost.glob("gw*.jsonl")) or sorted(cost.glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        sys.exit(f"no cost log under {cost} (run: python benchmarks/suite_cost.py run {folder})")
    return rows


def _peak(row: dict) -> float:
    return max(row.get("peak_gb") or 0.0, row.get("rss_gb") or 0.0)


def _table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _by(rows: list[dict], key) -> dict:
    groups = collections.defaultdict(list)
    for row in rows:
        for k in key(row):
            groups[k].append(row)
    return groups


def report(folder: Path, before: Path | None = None) -> str:
    rows = load(folder)
    out = []
    wall = folder / "wall.json"
    if wall.is_file():
        w = json.loads(wall.read_text())
        minutes, seconds = divmod(round(w["seconds"]), 60)
        out.append(f"wall time {minutes}:{seconds:02d} ({w['seconds']:.0f} s); {w['summary']}")
    total = sum(r["seconds"] for r in rows)
    out.append(f"{len(rows)} tests, {total:.0f} s of test time over {len({r['worker'] for r in rows})} workers; "
               f"largest worker peak {max(_peak(r) for r in rows):.2f} GB")
    old = _by(load(before), lambda r: [r["nodeid"].split("::")[0]]) if before else {}
    files = _by(rows, lambda r: [r["nodeid"].split("::")[0]])
    head = ["file", "tests", "seconds", "largest peak GB"] + (["seconds before"] if before else [])
    body = []
    for name, group in sorted(files.items(), key=lambda kv: -sum(r["seconds"] for r in kv[1])):
        line = [name, len(group), f"{sum(r['seconds'] for r in group):.1f}", f"{max(_peak(r) for r in group):.2f}"]
        if before:
            line.append(f"{sum(r['seconds'] for r in old.get(name, [])):.1f}")
        body.append(line)
    out += ["", "## Per file", "", _table(head, body)]
    markers = _by(rows, lambda r: r.get("markers") or ["(none)"])
    out += ["", "## Per marker", "", _table(["marker", "tests", "seconds"], [
        [m, len(g), f"{sum(r['seconds'] for r in g):.1f}"] for m, g in sorted(markers.items(), key=lambda kv: kv[0])])]
    slowest = sorted(rows, key=lambda r: -r["seconds"])
    out += ["", "## The 25 slowest tests", "", _table(["seconds", "peak GB", "test"], [
        [f"{r['seconds']:.1f}", f"{_peak(r):.2f}", r["nodeid"]] for r in slowest[:25]])]
    over = [r for r in slowest if r["seconds"] > SLOW_S]
    out += ["", f"## Tests over {SLOW_S:.0f} s: {len(over)}", ""] + [f"- {r['seconds']:.1f} s {r['nodeid']}" for r in over]
    heavy = sorted((r for r in rows if _peak(r) > HEAVY_GB or (r.get("children_peak_gb") or 0) > HEAVY_GB),
                   key=lambda r: -_peak(r))
    out += ["", f"## Tests whose worker or child peaked over {HEAVY_GB:.0f} GB: {len(heavy)}", ""]
    out += [f"- worker {_peak(r):.2f} GB, child {r.get('children_peak_gb')} GB: {r['nodeid']}" for r in heavy]
    return "\n".join(out) + "\n"


def run(folder: Path, extra: list[str]) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "-q", f"--cost-log={folder / 'cost'}", *extra]
    begun = time.time()
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.time() - begun
    (folder / "pytest.txt").write_text(result.stdout + result.stderr)
    closing = [line for line in result.stdout.splitlines() if " in " in line and ("passed" in line or "failed" in line)]
    (folder / "wall.json").write_text(json.dumps({"seconds": round(seconds, 1), "summary": closing[-1].strip("= ")
                                                  if closing else "(no closing line)", "command": cmd[1:]}))
    text = report(folder)
    (folder / "report.md").write_text(text)
    print(text)
    return result.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the suite with the cost log, then report")
    r.add_argument("out", type=Path)
    p = sub.add_parser("report", help="tables from a run's cost log")
    p.add_argument("out", type=Path)
    p.add_argument("--before", type=Path, help="another run's folder (or cost log folder): its seconds per file beside")
    args, extra = parser.parse_known_args(argv)
    if args.command == "run":
        return run(args.out, extra)
    print(report(args.out, args.before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
