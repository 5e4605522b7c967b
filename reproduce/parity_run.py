"""Trajectory parity of every preset with its official sampler, step by step (docs/results/peer_parity.md).

    FLOW_GRPO_PATH=... DANCEGRPO_PATH=... python reproduce/parity_run.py [code ...] [--out FILE]

Runs ``reproduce/parity/<code>.py`` for every code base whose checkout variable is set (reproduce/README.md
names them), prints one line per compared method (the largest σ, x' and log-prob differences, each within
TOLERANCE_ULPS float32 ulps of the values' magnitude) and writes the per-step rows to docs/results/peer_parity.json
(``--keep-others``: the rows it already holds of the code bases not run now stay).
Exit status 1 when any method differs, 2 when no checkout is set or one is at another commit than the data were
read at (told in one line, with the commit to check out).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from official import Checkout, ExtractionError  # noqa: E402
from parity import ROOT, markdown_table, write_reports  # noqa: E402

CODES = ("flow_grpo", "diffusion_nft", "awm", "dgpo", "dancegrpo", "mixgrpo", "branchgrpo")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("codes", nargs="*", help=f"code bases among {', '.join(CODES)} (default: every one set)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "peer_parity.json"))
    parser.add_argument("--markdown", help="also write the per-method table (docs/results/peer_parity.md's) here")
    parser.add_argument("--keep-others", action="store_true",
                        help="keep the rows --out already holds of the code bases not run now (rerunning one code base)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.codes) - set(CODES))
    if unknown:
        parser.error(f"unknown code bases {unknown}; use {', '.join(CODES)}")
    torch_threads = int(os.environ.get("OMP_NUM_THREADS", "0"))
    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)
    modules = {code: importlib.import_module(f"official.{code}") for code in CODES}
    codes = args.codes or [c for c in CODES if os.environ.get(modules[c].ENV)]
    if not codes:
        print("no checkout is set: " + ", ".join(f"{modules[c].ENV} ({modules[c].REPOSITORY})" for c in CODES),
              file=sys.stderr)
        return 2
    try:  # every checkout first: one at another commit than the data's is told in one line before any run
        checkouts = {code: Checkout.from_env(modules[code].REPOSITORY, modules[code].ENV) for code in codes}
    except ExtractionError as exc:
        print(exc, file=sys.stderr)
        return 2
    earlier = []
    if args.keep_others and Path(args.out).is_file():
        import json

        earlier = json.loads(Path(args.out).read_text())
    reports = []
    for code, checkout in checkouts.items():
        for report in importlib.import_module(f"parity.{code}").run(checkout):
            print(f"{code:14s} {report.line()}")
            reports.append(report)
    write_reports(reports, Path(args.out))
    if args.keep_others:  # the earlier rows of every other code base, in CODES order around the new ones
        import json

        out = Path(args.out)
        new = json.loads(out.read_text())
        kept = [row for row in earlier if row["code"] not in checkouts]
        out.write_text(json.dumps(sorted(kept + new, key=lambda row: CODES.index(row["code"])), indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(reports))
    print(f"wrote {args.out}: {sum(r.ok for r in reports)} of {len(reports)} methods equal step by step")
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
