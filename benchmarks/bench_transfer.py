"""Does what the learner climbs on its training prompts reach the held-out prompts? One task (or prompt) at a time.

    python benchmarks/bench_transfer.py [--tasks colors,counting] [--prompt "a photo of a blue square" ...]
                                        [--iterations 200] [--every 50] [--jobs 2] [key=value ...]

For each task named (its prompts of the training split, ``worlds.toy.scenes.train_prompts``) and each
single ``--prompt``, trains the embedded default (configs/default.yaml plus the overrides; the
benchmark sets ``prompts``) on those prompts alone for ``--iterations`` iterations and prints, every ``--every`` iterations, the mean
training reward of the iterations since the last line and the held-out `toy` score of the same task
(its 32 held-out prompts, combinations the training split leaves out) beside the held-out mean. A
task whose training reward climbs while its held-out score stays flat or falls is one where what the
learner learns is tied to the training combinations: more training on it cannot lift the held-out
score (measured: docs/results/transfer.md). Runs go to runs/bench-transfer-<name>; the
results to runs/bench-transfer/results.json. ``--jobs 2`` runs two at once, one torch thread each.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from parallel import map_jobs


class TransferSpecError(ValueError):
    """A task, prompt or held-out set this benchmark cannot use; the message names the fix."""


def job_name(spec: tuple[str, str]) -> str:
    kind, value = spec
    return value if kind == "task" else "prompt-" + re.sub(r"[^a-z0-9]+", "-", value.lower()).strip("-")


def write_prompts(spec: tuple[str, str], path: Path) -> str:
    """The job's training prompts as a .jsonl file (with the world's metadata); returns the held-out task they test.
    A task that is not the toy world's, or a prompt its grammar does not parse, raises TransferSpecError naming the fix."""
    from worlds.toy.scenes import TASKS, parse_prompt, train_prompts

    kind, value = spec
    if kind == "task":
        if value not in TASKS:
            raise TransferSpecError(f"--tasks: {value!r} is not a toy task; choose from {', '.join(TASKS)}")
        prompts = [p for p in train_prompts() if p.task == value]
    else:
        try:
            prompts = [parse_prompt(value)]
        except ValueError as exc:
            raise TransferSpecError(f"--prompt {value!r}: {exc}") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p.text, "metadata": p.to_dict()}) + "\n" for p in prompts))
    return prompts[0].task


def held_out_tasks(cfg) -> set[str]:
    """The tasks of the held-out prompts the run evaluates (eval.prompts, eval.limit)."""
    from flowgrpo.data import read_prompts

    _, metadata = read_prompts(cfg.eval.prompts, cfg.eval.limit)
    return {m.get("task") for m in metadata if isinstance(m, dict)}


def run_job(job: tuple) -> dict:
    spec, iterations, every, overrides, threads = job
    import torch

    if threads:
        torch.set_num_threads(threads)
    from flowgrpo.config import load_config
    from flowgrpo.engine.trainer import Trainer

    name = job_name(spec)
    cfg = load_config(None, None, [f"run_name=bench-transfer-{name}", "resume=false", f"eval.every={every}",
                                   "log.progress=false", "log.samples_every=0", "log.save_every=0", *overrides])
    cfg.train.iterations = iterations
    prompt_file = Path(cfg.output_dir) / "bench-transfer" / f"{name}.jsonl"
    task = write_prompts(spec, prompt_file)
    if task not in held_out_tasks(cfg):
        raise TransferSpecError(f"the held-out evaluation holds no {task} prompts; leave eval.limit and eval.prompts at "
                         "their defaults (the 192 toy held-out prompts)")
    cfg.prompts = str(prompt_file)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    trainer = Trainer(cfg)
    reward_key = f"reward/{trainer.scoring.names[0]}_mean"

    def row(iteration: int, metrics: dict, trained: list[float]) -> dict:
        out = {"iteration": iteration, "held_out": metrics["eval/mean_score"],
               "held_out_task": metrics[f"eval/per_task/{task}"],
               "reward": sum(trained) / len(trained) if trained else None}
        reward = "" if out["reward"] is None else f"training reward {out['reward']:.3f} (last {len(trained)} iterations); "
        print(f"{name}  iteration {iteration:4d}: {reward}held-out {task} {out['held_out_task']:.3f}, "
              f"held-out mean {out['held_out']:.3f}", flush=True)
        return out

    rows, trained = [row(0, trainer.evaluate(), [])], []
    for iteration in range(iterations):
        metrics = trainer.step(iteration)
        trained.append(metrics[reward_key])
        if "eval/mean_score" in metrics:
            rows.append(row(iteration + 1, metrics, trained))
            trained = []
    if trained:
        rows.append(row(iterations, trainer.evaluate(), trained))
    trainer.scoring.close()
    return {"job": name, "task": task, "prompts": len(Path(cfg.prompts).read_text().splitlines()), "run_dir": str(cfg.run_dir),
            "learning_rate": cfg.train.learning_rate, "reward_name": trainer.scoring.names[0], "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="colors,counting", help="comma-separated toy tasks ('' for none)")
    parser.add_argument("--prompt", action="append", default=[], help="a single training prompt (repeatable)")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--every", type=int, default=50, help="iterations between lines (held-out evaluations)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (then one torch thread each)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (train.learning_rate=3e-4, ...)")
    args = parser.parse_args()
    specs = [("task", t) for t in args.tasks.split(",") if t] + [("prompt", p) for p in args.prompt]
    if not specs:
        raise SystemExit("nothing to train: name --tasks or give --prompt")
    if args.iterations < 1 or args.every < 1:
        raise SystemExit(f"--iterations ({args.iterations}) and --every ({args.every}) must be at least 1")
    jobs = [(spec, args.iterations, args.every, args.overrides, 1 if args.jobs > 1 else 0) for spec in specs]
    try:  # a bad task, prompt or held-out set is refused before training, in one line naming the fix
        results = map_jobs(run_job, jobs, args.jobs)
    except TransferSpecError as exc:
        raise SystemExit(f"bench_transfer: {exc}") from None

    print(f"\ntrained on one task (or prompt) at a time, {args.iterations} iterations; held-out `toy` of the same task")
    print("| trained on | prompts | learning rate | training reward, first → last block | held-out, same task | held-out mean |")
    print("|---|---|---|---|---|---|")
    for r in results:
        first, last = r["rows"][1], r["rows"][-1]
        print(f"| {r['job']} | {r['prompts']} | {r['learning_rate']:g} | {first['reward']:.3f} → {last['reward']:.3f} "
              f"| {r['rows'][0]['held_out_task']:.3f} → {last['held_out_task']:.3f} "
              f"(highest after training {max(x['held_out_task'] for x in r['rows'][1:]):.3f}) "
              f"| {r['rows'][0]['held_out']:.3f} → {last['held_out']:.3f} |")
    out = Path("runs/bench-transfer/results.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"files: {out}")


if __name__ == "__main__":
    main()
