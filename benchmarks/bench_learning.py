"""How many samples each method needs to learn, and how that grows with dimension (the analytic world).

    python benchmarks/bench_learning.py [--dims 2,64,1024] [--seeds 8] [--presets all] [--target 0.8]
                                        [--max-iterations 300] [--sweep 1e-3,3e-3,1e-2] [--sweep-dims 1024]
                                        [--jobs 2] [--json out.json] [key=value ...]

For every preset in configs/presets/ (composed with configs/analytic.yaml, at its defaults) and every
dimension d, trains from the exact base model with seeds 0..S−1 and evaluates the held-out hit rate
(``analytic_hit`` on the 256 fresh ODE samples of ``analytic-eval``) every ``--eval-every``
iterations, until it reaches ``--target`` or ``--max-iterations``. Prints per (d, preset): how many
seeds reached the target, and the median and range of what it took: rollout samples (scored
leaves), NFEs (rollout + training forwards + backwards, per sample row) and seconds of training
(sampling, scoring, update; evaluations excluded). A run that never reached the target counts as
"> cap" and makes the median "> cap" when it is half or more of the seeds.

The learning rate is configs/analytic.yaml's, or ``--learning-rates`` per d; in ``--sweep-dims`` each preset
gets the best of ``--sweep`` (most seeds at the target, then fewest samples) on ``--sweep-seeds``, seeds
that are not among the measured ones: at d = 1,024 one rate does not suit every estimator (measured:
Flow-GRPO random-walks below the base at 3e-3 and learns at 1e-3; DiffusionNFT barely moves at 1e-3).
Each run uses one torch thread; ``--jobs`` runs that many at once (one per core).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import statistics
import tempfile
import time


def one_run(job: tuple) -> dict:
    """Train one (preset, d, seed) until the target; returns what it took. A run that diverges (NaN
    samples) or fails counts as not reached, with its error."""
    try:
        return _one_run(job)
    except Exception as err:  # noqa: BLE001 - one failed configuration must not end the benchmark
        preset, dim, seed, target, max_iterations, eval_every, overrides = job
        lr = next((float(o.split("=")[1]) for o in overrides if o.startswith("train.learning_rate=")), float("nan"))
        return {"preset": preset, "dim": dim, "seed": seed, "lr": lr, "reached": False, "iterations": max_iterations,
                "samples": 0, "nfe": 0, "seconds": 0.0, "last_score": float("nan"), "error": str(err).split("\n")[0]}


def _one_run(job: tuple) -> dict:
    preset, dim, seed, target, max_iterations, eval_every, overrides = job
    import torch

    torch.set_num_threads(1)
    from flowgrpo.config import load_config
    from flowgrpo.run.paths import configs_dir
    from flowgrpo.engine.trainer import Trainer

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
        nfe = trainer.policy.nfe.as_dict()
        iterations = reached or max_iterations
        trainer.scoring.close()
    return {"preset": preset, "dim": dim, "seed": seed, "lr": cfg.train.learning_rate, "reached": reached is not None,
            "iterations": iterations,
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


def pick(runs: list[dict]) -> tuple:
    """Rank a learning rate's sweep runs: most seeds at the target, then fewest samples (median)."""
    reached = sum(r["reached"] for r in runs)
    samples = statistics.median(r["samples"] if r["reached"] else math.inf for r in runs)
    return (-reached, samples)


def run_all(pool, jobs: list[tuple], label: str, log: str | None) -> list[dict]:
    """Run ``jobs``, appending each result to the JSON-lines file ``log``; results already in it are reused."""
    def key(preset, dim, seed, lr):
        return (preset, int(dim), int(seed), round(float(lr), 12) if lr == lr else None)

    done = {}
    if log and os.path.exists(log):
        with open(log) as f:
            for line in f:
                r = json.loads(line)
                done[key(r["preset"], r["dim"], r["seed"], r["lr"])] = r

    def job_key(job):
        lr = next((float(o.split("=")[1]) for o in job[6] if o.startswith("train.learning_rate=")), None)
        return key(job[0], job[1], job[2], lr) if lr is not None else None

    out, todo = [], []
    for job in jobs:
        k = job_key(job)
        (out.append(done[k]) if k in done else todo.append(job))
    for result in pool.imap(one_run, todo):
        out.append(result)
        if log:
            with open(log, "a") as f:
                f.write(json.dumps(result) + "\n")
        note = f", {result['error']}" if "error" in result else ""
        print(f"  {label}{result['preset']:15} d={result['dim']:<5} lr {result['lr']:g} seed {result['seed']}: "
              f"{'reached' if result['reached'] else 'not reached'} after {result['iterations']} iterations "
              f"({result['seconds']:.1f} s, last score {result['last_score']:.3f}{note})", flush=True)
    return out


def main() -> None:
    from flowgrpo.run.paths import configs_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", default="2,64,1024")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--presets", default="all", help="comma-separated names, or all (configs/presets/*.yaml)")
    parser.add_argument("--target", type=float, default=0.8, help="held-out hit rate to reach (the base model: 0.54)")
    parser.add_argument("--max-iterations", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--learning-rates", default="2:3e-3,64:3e-3,1024:1e-3",
                        help="learning rate per dimension d:lr where no sweep runs (others: configs/analytic.yaml's)")
    parser.add_argument("--sweep", default="1e-3,3e-3,1e-2", help="learning rates tried per preset in --sweep-dims")
    parser.add_argument("--sweep-dims", default="1024", help="dimensions where each preset gets its best learning rate")
    parser.add_argument("--sweep-seeds", default="100,101", help="seeds of the sweep (not among the measured 0..S-1)")
    parser.add_argument("--json", help="also write every run's numbers to this file")
    parser.add_argument("--log", help="append each run's result to this JSON-lines file as it ends; rerunning with the "
                                      "same file reuses them (an interrupted benchmark resumes)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = parser.parse_args()
    presets = sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml")) if args.presets == "all" \
        else args.presets.split(",")
    dims = [int(d) for d in args.dims.split(",")]
    fixed = {int(d): float(lr) for d, lr in (item.split(":") for item in args.learning_rates.split(",") if item)}
    sweep_dims = [int(d) for d in args.sweep_dims.split(",") if d] if args.sweep else []
    sweep_rates = [float(x) for x in args.sweep.split(",") if x]
    sweep_seeds = [int(x) for x in args.sweep_seeds.split(",") if x]

    def job(p, d, seed, lr):
        return (p, d, seed, args.target, args.max_iterations, args.eval_every,
                ([f"train.learning_rate={lr}"] if lr is not None else []) + list(args.overrides))

    started = time.time()
    chosen, sweep_runs = {}, []
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        jobs = [job(p, d, s, lr) for d in dims if d in sweep_dims for p in presets for lr in sweep_rates for s in sweep_seeds]
        if jobs:
            sweep_runs = run_all(pool, jobs, "sweep ", args.log)
        for d in dims:
            for p in presets:
                if d in sweep_dims:
                    by_rate = {lr: [r for r in sweep_runs if r["preset"] == p and r["dim"] == d and r["lr"] == lr]
                               for lr in sweep_rates}
                    chosen[(p, d)] = min(sweep_rates, key=lambda lr: pick(by_rate[lr]))
                else:
                    chosen[(p, d)] = fixed.get(d)
        runs = run_all(pool, [job(p, d, s, chosen[(p, d)]) for d in dims for p in presets for s in range(args.seeds)], "",
                       args.log)
    print(f"\n{len(runs) + len(sweep_runs)} runs in {(time.time() - started) / 60:.1f} min; target hit rate {args.target}, "
          f"cap {args.max_iterations} iterations, evaluated every {args.eval_every}; median [min, max] over seeds "
          f"0..{args.seeds - 1}; learning rate: {args.learning_rates} (d:lr), or the best of {args.sweep} on seeds "
          f"{args.sweep_seeds} for d in {args.sweep_dims}\n")
    print("| d | preset | lr | reached | samples | NFEs | seconds |")
    print("|---|---|---|---|---|---|---|")
    for d in dims:
        for p in presets:
            rows = [r for r in runs if r["dim"] == d and r["preset"] == p]
            cap_samples = max(r["samples"] for r in rows)
            cap_nfe = max(r["nfe"] for r in rows)
            print(f"| {d} | {p} | {rows[0]['lr']:g} | {sum(r['reached'] for r in rows)}/{len(rows)} | "
                  f"{summary(rows, 'samples', cap_samples)} | {summary(rows, 'nfe', cap_nfe)} | {summary(rows, 'seconds', 0)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "chosen": {f"{p}@{d}": lr for (p, d), lr in chosen.items()},
                       "sweep": sweep_runs, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
