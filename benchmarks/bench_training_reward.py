"""Does training raise the training reward on the training prompts? Scores fixed training prompts as the run samples them.

    python benchmarks/bench_training_reward.py [--iterations 120] [--every 40] [--prompts 96] [key=value ...]
    (two at once: give each its own run_name=...)

Trains the embedded default (configs/default.yaml plus the overrides) and, before training and every
``--every`` iterations, samples ``--prompts`` training prompts (drawn uniformly, as training draws
them, with a fixed seed) with the training rollout's sampler (DPM-Solver++ at the plan's step count
and the model's guidance) and fixed noise, and scores the same images with the training reward(s)
and with the held-out scorer (`eval.reward`); it also prints the mean training reward of the
iterations since the last line. A reward that rises on these images is one the learner climbs; one
that stays flat while the held-out score rises is not what moves the model (measured:
docs/results/training_reward.md).
"""

from __future__ import annotations

import argparse
import random
import shutil

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=120)
    parser.add_argument("--every", type=int, default=40, help="iterations between scorings")
    parser.add_argument("--prompts", type=int, default=96, help="fixed training prompts scored")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="key=value config overrides (train.seed=2, rewards=[...])")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from flowgrpo.config import load_config
    from flowgrpo.data import read_prompts
    from flowgrpo.evaluate import generate
    from flowgrpo.engine.trainer import Trainer
    from rewards import load_reward

    cfg = load_config(None, None, ["run_name=bench-training-reward", "resume=false", "eval.every=0", "eval.at_start=false",
                                   "log.progress=false", "log.samples_every=0", "log.save_every=0", *args.overrides])
    cfg.train.iterations = args.iterations
    shutil.rmtree(cfg.run_dir, ignore_errors=True)
    trainer = Trainer(cfg)
    prompts, metadata = read_prompts(cfg.prompts)
    chosen = random.Random(7).sample(range(len(prompts)), min(args.prompts, len(prompts)))
    texts, meta = [prompts[i] for i in chosen], [metadata[i] for i in chosen]
    scorers = {name: load_reward(name) for name in dict.fromkeys([spec.name for spec in cfg.rewards] + [cfg.eval.reward])}
    steps = cfg.sampling.plan.get("num_steps") or cfg.model.sample_steps

    def score(iteration: int, trained: list[float]) -> None:
        with torch.no_grad():
            images = generate(trainer.model, texts, seed=999, steps=steps, solver="dpmpp_2m", progress=False)
        means = {name: float(r(images, texts, meta).scores.nanmean()) for name, r in scorers.items()}
        since = f"; training reward of the last {len(trained)} iterations {sum(trained) / len(trained):.3f}" if trained else ""
        print(f"iteration {iteration:4d}: {args.prompts} fixed training prompts, {steps}-step samples: "
              + ", ".join(f"{name} {m:.3f}" for name, m in means.items()) + since, flush=True)

    score(0, [])
    trained: list[float] = []
    key = f"reward/{cfg.rewards[0].name}_mean"
    for iteration in range(args.iterations):
        trained.append(trainer.step(iteration)[key])
        if (iteration + 1) % args.every == 0:
            score(iteration + 1, trained)
            trained = []
    trainer.scoring.close()


if __name__ == "__main__":
    main()
