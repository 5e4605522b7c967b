"""Every method preset on the tiny model with the same wall-clock budget.

    python benchmarks/bench_methods.py [--minutes 5] [--presets flow_grpo,mixgrpo,...]

Prints, per preset: seconds per iteration by phase (sample, score+advantage, update), rollout and
training NFEs per iteration, and the held-out toy score reached at fixed times. The forward-process
presets (diffusion_nft, awm, dgpo) count every training forward (policy, old policy, reference, EMA).
"""

import argparse
import json
import shutil

from flowgrpo.config import load_config
from flowgrpo.engine.trainer import Trainer

from pathlib import Path

DEFAULT = ",".join(sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "configs" / "presets").glob("*.yaml")))


def is_tree(preset: str) -> bool:
    """Whether the preset's plan is a tree (splits, a branching window, side branches): one tree per prompt."""
    plan = dict(load_config(preset, None, []).sampling.plan)
    return bool(plan.get("splits") or plan.get("side_steps") or plan.get("branch_window"))


def run(preset: str, minutes: float, checkpoints: list[float]) -> dict:
    # chains: 8 samples per prompt; tree plans (BranchGRPO, TreeGRPO, TempFlow, G²RPO, E-GRPO): one tree per prompt,
    # its leaves the group
    group = 1 if is_tree(preset) else 8
    cfg = load_config(preset, None, [f"run_name=bench-{preset}", "resume=false", "train.iterations=100000",
                                     "eval.every=0", "eval.at_start=false", "log.samples_every=0", "log.save_every=0",
                                     "log.eval_samples=0", "log.gallery=false", "log.progress=false",
                                     f"sampling.plan.group_size={group}"])
    shutil.rmtree(cfg.run_dir, ignore_errors=True)  # a benchmark run starts clean: no old logs, no run-identity clash
    trainer = Trainer(cfg)
    phases, iterations, scores, elapsed = {}, 0, {}, 0.0
    pending = list(checkpoints)
    while pending:
        metrics = trainer.step(iterations)
        iterations += 1
        for key in ("time/sample", "time/score_wait_and_advantage", "time/update"):
            phases[key] = phases.get(key, 0.0) + metrics.get(key, 0.0)
        elapsed += metrics["time/iteration"] / 60  # training time only; evaluations are not counted
        while pending and elapsed >= pending[0]:
            scores[pending.pop(0)] = trainer.evaluate()["eval/mean_score"]
    nfe = trainer.policy.nfe.as_dict()
    return {"preset": preset, "iterations": iterations,
            **{k: v / iterations for k, v in phases.items()},
            "rollout_nfe_per_iteration": nfe.get("rollout", 0) / iterations,
            "train_nfe_per_iteration": nfe.get("train_forward", 0) / iterations, "scores": scores}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--presets", default=DEFAULT, help="comma-separated (default: every file in configs/presets)")
    args = parser.parse_args()
    checkpoints = [args.minutes / 2, args.minutes]
    rows = []
    for preset in args.presets.split(","):
        rows.append(run(preset, args.minutes, checkpoints))
        print(json.dumps(rows[-1]), flush=True)  # one line per preset as it finishes: nothing lost to a later failure
    print(f"{'preset':16} {'s/it sample':>11} {'s/it score':>10} {'s/it update':>11} {'NFE roll':>8} {'NFE train':>9} "
          + " ".join(f"{'score@' + str(c) + 'm':>10}" for c in checkpoints))
    for r in rows:
        print(f"{r['preset']:16} {r['time/sample']:11.2f} {r['time/score_wait_and_advantage']:10.2f} "
              f"{r['time/update']:11.2f} {r['rollout_nfe_per_iteration']:8.0f} {r['train_nfe_per_iteration']:9.0f} "
              + " ".join(f"{r['scores'].get(c, float('nan')):10.3f}" for c in checkpoints))


if __name__ == "__main__":
    main()
