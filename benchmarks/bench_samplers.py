"""Rollout cost of every method preset, side by side, on a small conditioned conv velocity (CPU).

    python benchmarks/bench_samplers.py [--prompts 2] [--repeats 3] [--threads 1] [--latent 4 32 32]

For each rollout plan the presets write (configs/presets/<name>.yaml: ``sampling.plan`` and ``sampling.window``, at
iteration 0; presets sharing a plan share a row) it prints: steps, leaves,
forwards (NFE) and trained transitions per prompt (= per group for chains, per tree for BranchGRPO,
per trunk for TempFlow), the rollout wall time for the batch (best of ``--repeats``), the time spent
inside velocity calls, and the executor overhead ratio = wall time / velocity time (target ≤ 1.10).
The first run of each plan is a warm-up (it also builds the plan's cached tree template).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flowgrpo.config import preset_names, preset_plan  # noqa: E402
from samplers import build_schedule, rollout  # noqa: E402


def preset_plans() -> dict[str, tuple[dict, dict | None]]:
    """{the presets writing it, joined by '/': (plan, window)} for every distinct rollout plan of configs/presets/."""
    plans: list[tuple[list[str], tuple[dict, dict | None]]] = []
    for name in preset_names():
        spec = preset_plan(name)
        same = next((names for names, other in plans if other == spec), None)
        if same is None:
            plans.append(([name], spec))
        else:
            same.append(name)
    return {"/".join(names): spec for names, spec in plans}


class TinyVelocity(nn.Module):
    """A 3-layer conv net conditioned on σ and a prompt embedding: v(x, σ, c) [N, C, H, W]."""

    def __init__(self, channels: int, width: int = 64, num_prompts: int = 64):
        super().__init__()
        self.embed = nn.Embedding(num_prompts, width)
        self.time = nn.Linear(1, width)
        self.inp = nn.Conv2d(channels, width, 3, padding=1)
        self.mid = nn.Conv2d(width, width, 3, padding=1)
        self.out = nn.Conv2d(width, channels, 3, padding=1)

    def forward(self, x, sigma, cond_index):
        bias = self.time(sigma.view(-1, 1)) + self.embed(cond_index)
        h = nn.functional.silu(self.inp(x) + bias[:, :, None, None])
        h = nn.functional.silu(self.mid(h))
        return self.out(h)


class TimedVelocity:
    """The velocity callable handed to the executor; accumulates the time spent inside it."""

    def __init__(self, model):
        self.model, self.seconds, self.calls = model, 0.0, 0

    def __call__(self, x, sigma, cond_index):
        start = time.perf_counter()
        v = self.model(x, sigma, cond_index)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return v


def measure(velocity, plan, prompts, latent, repeats):
    best = None
    for attempt in range(repeats + 1):  # attempt 0 is the warm-up
        velocity.seconds, velocity.calls = 0.0, 0
        start = time.perf_counter()
        record = rollout(velocity, plan, prompt_ids=list(range(prompts)), latent_shape=latent, seed=0)
        wall = time.perf_counter() - start
        if attempt and (best is None or wall < best[0]):
            best = (wall, velocity.seconds, velocity.calls, record)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--latent", type=int, nargs=3, default=(4, 32, 32), metavar=("C", "H", "W"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TinyVelocity(args.latent[0]).eval()
    velocity = TimedVelocity(model)
    latent = tuple(args.latent)
    print(f"latent {latent}, {args.prompts} prompts, {torch.get_num_threads()} thread(s), "
          f"velocity net {sum(p.numel() for p in model.parameters())} params, best of {args.repeats}")
    header = f"{'preset':24s} {'steps':>5s} {'leaves':>6s} {'NFE/prompt':>10s} {'trained/prompt':>14s} " \
             f"{'calls':>5s} {'wall s':>8s} {'velocity s':>10s} {'overhead':>8s}"
    print(header)
    print("-" * len(header))
    with torch.no_grad():
        for name, (plan, window) in preset_plans().items():
            plan = build_schedule(plan, window, name=name).plan(0)
            counts = plan.counts()
            wall, inside, calls, record = measure(velocity, plan, args.prompts, latent, args.repeats)
            assert record.nfe["rollout"] == args.prompts * counts["nfe"]
            assert record.num_transitions == args.prompts * counts["trained"]
            print(f"{name:24s} {plan.num_steps:5d} {counts['leaves']:6d} {counts['nfe']:10d} "
                  f"{counts['trained']:14d} {calls:5d} {wall:8.3f} {inside:10.3f} {wall / inside:8.3f}")


if __name__ == "__main__":
    main()
