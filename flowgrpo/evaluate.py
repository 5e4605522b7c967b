"""Evaluation: sample a prompt set with the pure ODE sampler and score it with a reward.

``flowgrpo eval`` (flowgrpo/cli/evaluation.py) is the command-line face of :func:`evaluate`; pretraining and
the training loop call the same functions, so every reported score is computed one way.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

import samplers
from flowgrpo.conditions import images_of, reward_conditions
from flowgrpo.run.errors import build_reward
from rewards import Reward


class NonFiniteSamples(RuntimeError):
    """The model's samples are NaN or inf (its weights diverged); the message names the fix."""


@torch.no_grad()
def generate(
    model,
    prompts: list[str],
    *,
    seed: int = 0,
    steps: int | None = None,
    guidance_scale: float | None = None,
    solver: str = "euler",
    batch_size: int = 64,
    progress: bool = True,
    desc: str = "sampling",
    noise_index: list[int] | None = None,
    metadata: list[dict] | None = None,
) -> torch.Tensor:
    """Images [N, 3, H, W] (video models: videos [N, F, 3, H, W]) in [0, 1] for N prompts, by ODE
    sampling from seeded noise: prompt i's x_T is drawn from (seed, ``noise_index[i]``), by default (seed, i).
    ``progress``: a bar labelled ``desc`` that counts ODE steps over all batches. ``metadata``: the prompts' rows,
    whose condition images (an edit's source, flowgrpo/conditions.py) are encoded with them."""
    noise_index = list(range(len(prompts))) if noise_index is None else list(noise_index)
    steps = steps or model.config.sample_steps
    sigmas = samplers.time_grid(steps, model.shift_for(steps), model.shift_terminal)
    images = []
    starts = range(0, len(prompts), batch_size)
    # leave=None: the bar stays when it is the only one (the start-up evaluation), goes when it sits under another
    with tqdm(total=len(starts) * (len(sigmas) - 1), desc=desc, unit="step", disable=not progress, leave=None) as bar:
        for start in starts:
            chunk = prompts[start : start + batch_size]
            cond = model.encode_prompts(chunk, images=images_of(metadata[start : start + batch_size] if metadata else None))
            x = samplers.eval_noise(model.latent_shape(), seed, noise_index[start : start + len(chunk)])
            x = x.to(model.device, model.dtype)
            velocity = model.velocity_fn(cond, guidance_scale)

            def counted(*args, velocity=velocity):  # one call per ODE step (euler and dpmpp_2m alike)
                out = velocity(*args)
                bar.update(1)
                return out

            index = torch.arange(len(chunk), device=model.device)
            latents = samplers.sample_ode(counted, x, sigmas, index, solver=solver)
            decoded = model.decode(latents).float().cpu() if bool(torch.isfinite(latents).all()) else None
            if decoded is None or not bool(torch.isfinite(decoded).all()):  # huge latents decode to NaN
                raise NonFiniteSamples("the model's samples are NaN or inf: its weights diverged (in training: lower "
                                       "train.learning_rate or keep train.grad_clip on, and restart from an earlier "
                                       "checkpoint), or the guidance scale is too large for them")
            images.append(decoded)
    return torch.cat(images)


def summarize(scores: torch.Tensor, info: dict, tasks: list[str] | None) -> dict:
    """Overall mean, strict accuracy (when the reward reports it) and per-task means."""
    valid = ~torch.isnan(scores)
    summary = {
        "mean_score": round(scores[valid].mean().item(), 4) if valid.any() else float("nan"),
        "num_images": int(scores.numel()),
        "num_not_applicable": int((~valid).sum()),
    }
    if "strict" in info:
        strict = torch.as_tensor(info["strict"], dtype=torch.float32)
        summary["strict_accuracy"] = round(strict[valid].mean().item(), 4)
    if tasks:
        per_task = {}
        for task in sorted(set(tasks)):
            mask = torch.tensor([t == task for t in tasks]) & valid
            per_task[task] = round(scores[mask].mean().item(), 4) if mask.any() else float("nan")
        summary["per_task"] = per_task
    return summary


def evaluate(
    model,
    prompts: list[str],
    reward: Reward | str = "toy",
    metadata: list[dict] | None = None,
    *,
    seed: int = 0,
    steps: int | None = None,
    guidance_scale: float | None = None,
    batch_size: int = 64,
    progress: bool = True,
    desc: str = "sampling",
    processes: tuple[int, int, Callable] | None = None,
    first_index: int = 0,
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Sample every prompt once and score it (``progress``: a bar labelled ``desc`` over the sampling steps).

    Returns a JSON-ready summary (mean score, strict accuracy, per-task means, number of images,
    seconds), the images [N, 3, H, W] (videos [N, F, 3, H, W]) in [0, 1] and the per-sample scores [N]
    (NaN = not applicable).

    ``processes`` = (rank, world, gather[, share]): every process of a run calls this and samples and scores its
    contiguous share of the prompts (padded to the same size, so that each makes the same model calls:
    a sharded network's calls are collectives); ``gather`` (a tensor of every process, concatenated in rank
    order) gives every process the whole results, equal to one process's (each prompt's noise is drawn
    from its own index). ``share(compute)``: where processes hold the same share (a context-parallel group,
    flowgrpo/engine/context.py), one of them scores and the others receive its scores. ``first_index``: the index of ``prompts[0]`` in a larger set that is evaluated in
    blocks: prompt i's noise is drawn from (seed, first_index + i), the same as in one call over the whole set.
    """
    started = time.time()
    reward = build_reward(reward, {}, "the held-out reward (eval.reward, --reward)") if isinstance(reward, str) else reward
    n, index = len(prompts), list(range(len(prompts)))
    share = (lambda compute: compute())
    if processes is not None:
        rank, world, gather, *more = processes
        share = more[0] if more else share
        per = -(-n // world)
        index = index[rank * per : (rank + 1) * per]
        index += [index[-1] if index else 0] * (per - len(index))  # padding: repeats, dropped after the gather
    mine, mine_meta = [prompts[i] for i in index], None if metadata is None else [metadata[i] for i in index]
    images = generate(
        model, mine, seed=seed, steps=steps, guidance_scale=guidance_scale,
        batch_size=batch_size, progress=progress, desc=desc, noise_index=[first_index + i for i in index],
        metadata=mine_meta,
    )
    outputs = share(lambda: [
        reward(images[i : i + batch_size], mine[i : i + batch_size],
               None if mine_meta is None else mine_meta[i : i + batch_size],
               reward_conditions(None if mine_meta is None else mine_meta[i : i + batch_size], images.shape[-2:],
                                 [reward]))
        for i in range(0, len(mine), batch_size)
    ])
    scores = torch.cat([o.scores for o in outputs])
    info = {}
    if all("strict" in o.info for o in outputs):
        info["strict"] = torch.cat([torch.as_tensor(o.info["strict"]) for o in outputs])
    if processes is not None:
        images, scores = gather(images)[:n], gather(scores)[:n]
        info = {k: gather(v.float())[:n] for k, v in info.items()}
    tasks = [m.get("task", "all") for m in metadata] if metadata else None
    summary = summarize(scores, info, tasks)
    summary["seconds"] = round(time.time() - started, 2)
    summary["steps"] = steps or model.config.sample_steps
    summary["guidance_scale"] = guidance_scale if guidance_scale is not None else model.config.guidance_scale
    summary["seed"] = seed
    return summary, images, scores


def best_of_k(scores: torch.Tensor) -> dict:
    """Headroom of a model: how good its best of k samples per prompt is, for k = 1, 2, 4, ... K.

    ``scores`` [K, N]: K samples (seeds) of each of N prompts (NaN = not applicable). ``best_of``
    maps k to the mean over prompts of the best of the first k samples; a policy that always made a
    prompt's best sample would score that. NaN samples are skipped; a prompt counts towards k once
    one of its first k samples is scored."""
    if scores.dim() != 2:
        raise ValueError(f"scores must be [K samples, N prompts], got shape {tuple(scores.shape)}")
    K = scores.shape[0]
    filled = torch.where(torch.isnan(scores), float("-inf"), scores.float())
    ks = sorted({2**i for i in range(K.bit_length())} | {K})
    best = {}
    for k in ks:
        top = filled[:k].max(0).values
        best[k] = round(top[torch.isfinite(top)].mean().item(), 4)
    return {"samples_per_prompt": K, "mean_over_samples": round(scores.nanmean().item(), 4), "best_of": best}


def before_after(first: torch.Tensor, last: torch.Tensor, tasks: list[str] | None = None) -> dict:
    """Held-out scores of two evaluations of the same prompts and seeds [N] (NaN = not applicable): each
    mean with its standard error (std/√n), the paired change (mean ± standard error of the per-sample
    differences, which the shared prompts and noise make much tighter), and per-task means."""
    def mean_se(x: torch.Tensor) -> tuple[float, float]:
        x = x[~torch.isnan(x)].double()
        if x.numel() == 0:
            return float("nan"), float("nan")
        return float(x.mean()), float(x.std() / x.numel() ** 0.5) if x.numel() > 1 else float("nan")

    if first.shape != last.shape:
        raise ValueError(f"before_after needs the same samples twice, got {tuple(first.shape)} and {tuple(last.shape)}")
    out = {"n": int((~torch.isnan(first) & ~torch.isnan(last)).sum()), "start": mean_se(first), "end": mean_se(last),
           "change": mean_se(last - first)}
    if tasks:
        out["per_task"] = {task: (mean_se(first[mask])[0], mean_se(last[mask])[0])
                           for task in sorted(set(tasks)) for mask in [torch.tensor([t == task for t in tasks])]}
    return out


def second_half_level(evaluations: list[dict]) -> dict:
    """The level a run holds: ``before_after`` of its first evaluation against the per-sample mean of
    every evaluation in its second half (iteration ≥ half the last one's, and > 0), plus their count and
    the iterations they span.
    ``evaluations``: the run's ``eval_scores.jsonl`` records ({"iteration", "scores"}), in order. One
    evaluation of a step-function score scatters by about its standard error as borderline samples
    flip (README, "Measured: the embedded default run"); this mean does not."""
    last = evaluations[-1]["iteration"]
    half = [e for e in evaluations[1:] if e["iteration"] > 0 and 2 * e["iteration"] >= last]  # never the start itself
    if not half:
        raise ValueError("second_half_level needs an evaluation after the first, past iteration 0")
    first = torch.as_tensor(evaluations[0]["scores"], dtype=torch.float64)
    mean = torch.stack([torch.as_tensor(e["scores"], dtype=torch.float64) for e in half]).mean(0)
    return {"evaluations": len(half), "iterations": (half[0]["iteration"], last), **before_after(first, mean)}


def before_after_lines(stats: dict, reward: str, first_iteration: int, last_iteration: int) -> list[str]:
    """The end-of-run summary of ``before_after`` as printed lines."""
    (s, s_se), (e, e_se), (c, c_se) = stats["start"], stats["end"], stats["change"]
    lines = [f"held-out {reward} over {stats['n']} samples: iteration {first_iteration} {s:.3f} ± {s_se:.3f} -> "
             f"iteration {last_iteration} {e:.3f} ± {e_se:.3f} (change {c:+.3f} ± {c_se:.3f}, same prompts and seeds)"]
    if stats.get("per_task"):
        lines.append("  per task: " + ", ".join(f"{task} {a:.3f} -> {b:.3f}" for task, (a, b) in stats["per_task"].items()))
    return lines


def evaluate_toy(model, toy_prompts, *, seed: int = 0, **kwargs) -> dict:
    """:func:`evaluate` on toy prompts (``rewards.toy.ToyPrompt``) with the toy scorer."""
    summary, _, _ = evaluate(
        model, [p.text for p in toy_prompts], "toy", [p.to_dict() for p in toy_prompts], seed=seed, **kwargs
    )
    return summary
