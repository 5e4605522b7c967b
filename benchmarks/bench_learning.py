"""How many samples each method needs to learn, and how that grows with dimension (the analytic world).

    python benchmarks/bench_learning.py [--dims 2,64,1024] [--seeds 8] [--presets all] [--target 0.8]
                                        [--max-iterations 300] [--jobs 2] [--json out.json] [key=value ...]

For every preset in configs/presets/ (composed with configs/analytic.yaml, at its defaults) and every
dimension d, trains from the exact base model with seeds 0..S−1 and evaluates the held-out hit rate
(``analytic_hit`` on the 256 fresh ODE samples of ``analytic-eval``) every ``--eval-every``
iterations, until it reaches ``--target`` or ``--max-iterations``. Prints per (d, preset): how many
seeds reached the target, and the median and range of what it took: rollout samples (scored
leaves), NFEs (rollout + training forwards + backwards, per sample row) and seconds of training
(sampling, scoring, update; evaluations excluded). A run that never reached the target counts as
"> cap" and makes the median "> cap" when it is half or more of the seeds.

Each run uses one torch thread; ``--jobs`` runs that many at once (one per core).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import statistics
import tempfile
import time


def one_run(job: tuple) -> dict:
    """Train one (preset, d, seed) until the target; returns what it took."""
    preset, dim, seed, target, max_iterations, eval_every, overrides = job
    import torch

    torch.set_num_threads(1)
    from flowgrpo.config import load_config
    from flowgrpo.paths import configs_dir
    from flowgrpo.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(preset, None, [
            f"output_dir={out}", "resume=false", f"model.dim={dim}", f"train.seed={seed}",
            f"train.iterations={max_iterations}", f"eval.every={eval_every}", "eval.at_start=false",
            "log.samples_every=0", "log.save_every=0", "log.eval_samples=0", "log.gallery=false", "log.progress=false",
            *overrides], base=str(configs_dir() / "analytic.yaml"))
        trainer = Trainer(cfg)
        leaves = trainer.schedule.plan(0).counts()["leaves"] * cfg.train.prompts_per_iteration  # samples per iteration
        seconds, reached, score = 0.0, None, float("nan")
        for iteration in range(max_iterations):
            metrics = trainer.step(iteration)
            seconds += sum(metrics[k] for k in ("time/sample", "time/score_wait_and_advantage", "time/update"))
            if "eval/mean_score" in metrics:
                score = metrics["eval/mean_score"]
                if score >= target:
                    reached = iteration + 1
                    break
        nfe = trainer.nfe.as_dict()
        iterations = reached or max_iterations
        trainer.runner.close()
    return {"preset": preset, "dim": dim, "seed": seed, "reached": reached is not None, "iterations": iterations,
            "samples": iterations * leaves, "nfe": nfe.get("rollout", 0) + nfe.get("probe", 0) + nfe.get("train_forward", 0)
            + nfe.get("train_backward", 0), "seconds": seconds, "last_score": score}


def summary(runs: list[dict], key: str, cap: float) -> str:
    values = sorted(r[key] if r["reached"] else math.inf for r in runs)
    median = statistics.median(values)

    def fmt(v):
        if math.isinf(v):
            return f"> {cap:,.0f}" if key != "seconds" else "> cap"
        return f"{v:,.1f}" if key == "seconds" else f"{v:,.0f}"

    return f"{fmt(median)} [{fmt(values[0])}, {fmt(values[-1])}]"


def main() -> None:
    from flowgrpo.paths import configs_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", default="2,64,1024")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--presets", default="all", help="comma-separated names, or all (configs/presets/*.yaml)")
    parser.add_argument("--target", type=float, default=0.8, help="held-out hit rate to reach (the base model: 0.54)")
    parser.add_argument("--max-iterations", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--learning-rates", default="2:3e-3,64:3e-3,1024:1e-3",
                        help="learning rate per dimension d:lr (others: configs/analytic.yaml's); measured with Flow-GRPO: "
                             "at d = 1,024, 3e-3 random-walks below the base model and 3e-4 barely moves")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--json", help="also write every run's numbers to this file")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every run (e.g. train.learning_rate=1e-3)")
    args = parser.parse_args()
    presets = sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml")) if args.presets == "all" \
        else args.presets.split(",")
    dims = [int(d) for d in args.dims.split(",")]
    rates = dict(item.split(":") for item in args.learning_rates.split(",") if item)

    def overrides(d: int) -> list[str]:
        return ([f"train.learning_rate={rates[str(d)]}"] if str(d) in rates else []) + list(args.overrides)

    jobs = [(p, d, s, args.target, args.max_iterations, args.eval_every, overrides(d)) for d in dims for p in presets
            for s in range(args.seeds)]
    started = time.time()
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        runs = []
        for result in pool.imap(one_run, jobs):
            runs.append(result)
            print(f"  {result['preset']:15} d={result['dim']:<5} seed {result['seed']}: "
                  f"{'reached' if result['reached'] else 'not reached'} after {result['iterations']} iterations "
                  f"({result['seconds']:.1f} s, last score {result['last_score']:.3f})", flush=True)
    print(f"\n{len(runs)} runs in {(time.time() - started) / 60:.1f} min; target hit rate {args.target}, "
          f"cap {args.max_iterations} iterations; median [min, max] over {args.seeds} seeds; learning rates "
          f"{args.learning_rates}\n")
    print(f"| d | preset | reached | samples | NFEs | seconds |")
    print("|---|---|---|---|---|---|")
    for d in dims:
        for p in presets:
            rows = [r for r in runs if r["dim"] == d and r["preset"] == p]
            cap_samples = max(r["samples"] for r in rows)
            cap_nfe = max(r["nfe"] for r in rows)
            print(f"| {d} | {p} | {sum(r['reached'] for r in rows)}/{len(rows)} | {summary(rows, 'samples', cap_samples)} | "
                  f"{summary(rows, 'nfe', cap_nfe)} | {summary(rows, 'seconds', 0)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
