"""Every learner and credit rule on the editing world, with its negated control: does each learn to edit?

    python benchmarks/bench_edit_methods.py [--minutes 4] [--jobs 2] [--presets flow_grpo,diffusion_nft,...]

For each control preset of tests/engine/test_learning.py (one per learner and per credit rule), trains the shipped tiny
FLUX.1-Kontext on the toy edits (configs/edit.yaml under ``--preset``: the preset's method with the tiny world's
settings) for ``--minutes`` of training time, twice: on the reward, and on the negated reward (every reward weight
times -1: a rise learned from the reward becomes a fall). The held-out ``toy_edit`` score of the 128 held-out edits is
measured before and after each (the same prompts and seeds: the change is paired). A method learns to edit when its
run rises and its control falls. Prints the table and writes runs/bench-edit-methods/results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from parallel import map_jobs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))
from test_learning import CONTROLS  # noqa: E402  (one preset per learner and per credit rule)


def run(job: tuple) -> dict:
    from bench_train_default import run_seed

    preset, minutes, control, overrides = job
    # evaluations only at the start and the end (every 10,000 iterations: never in between)
    tag = f"-methods-{preset}{'-control' if control else ''}"
    result = run_seed((0, "edit", minutes, 10_000, overrides, 1, preset, tag, control))
    stats = result["stats"]
    return {"preset": preset, "control": control, "iterations": result["evaluations"][-1]["iteration"],
            "minutes": round(result["evaluations"][-1]["minutes"], 2), "start": stats["start"], "end": stats["end"],
            "change": stats["change"], "per_task": stats.get("per_task")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="training minutes per run (default 4)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one torch thread each (default 2)")
    parser.add_argument("--presets", default=",".join(CONTROLS), help="comma-separated presets (default: the controls)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args()
    presets = [p for p in args.presets.split(",") if p]
    jobs = [(p, args.minutes, control, args.overrides) for p in presets for control in (False, True)]
    results = map_jobs(run, jobs, args.jobs)
    out = Path("runs") / "bench-edit-methods"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\nheld-out toy_edit (128 edits), {args.minutes:g} training minutes a run on one thread; change paired "
          "(mean ± standard error); control: every reward weight negated")
    print("| preset | iterations | start | run: change | control: change | learns (run up, control down)? |")
    print("|---|---|---|---|---|---|")
    for preset in presets:
        r, c = (next(x for x in results if x["preset"] == preset and x["control"] == flag) for flag in (False, True))
        up, down = r["change"][0] - 2 * r["change"][1] > 0, c["change"][0] + 2 * c["change"][1] < 0
        print(f"| `{preset}` | {r['iterations']} / {c['iterations']} | {r['start'][0]:.3f} | {r['change'][0]:+.3f} ± "
              f"{r['change'][1]:.3f} | {c['change'][0]:+.3f} ± {c['change'][1]:.3f} | "
              f"{'yes' if up and down else 'run up' if up else 'control down' if down else 'no'} |")


if __name__ == "__main__":
    main()
