"""Held-out evaluation during training, and the end-of-run summary.

``HeldOut.evaluate`` samples the held-out prompts (``eval.prompts``) with the pure ODE sampler from seeds
that never change (the run's seed + 12345), with the evaluation weights (the EMA when train.ema_decay > 0),
scores them with the held-out reward (``eval.reward`` built with ``eval.reward_kwargs``, once), writes every sample's score to
``eval_scores.jsonl`` and the first ``log.eval_samples`` samples to ``samples/eval_<n>/`` (the gallery
compares steps on them), and returns ``eval/*`` metrics. ``summary_lines`` reads the run folder's
evaluations back and gives the before/after lines the run ends with (flowgrpo/evaluate.py computes the
paired statistics). The reward-hacking watch (flowgrpo/engine/watch.py) scores the same samples with the
run's guards and compares them with the first evaluation.
"""

from __future__ import annotations

import torch

from flowgrpo.data import read_prompts
from flowgrpo.engine.watch import Watch, alarm_line
from flowgrpo.evaluate import before_after, before_after_lines, evaluate, second_half_level
from flowgrpo.run.errors import build_reward
from samplers.grids import EVAL_SEED_OFFSET



class HeldOut:
    """The held-out evaluation of a run (see the module docstring)."""

    def __init__(self, cfg, writer, modality: str = "image"):
        self.cfg, self.writer = cfg, writer
        self.watch = Watch(cfg, cfg.run_dir, modality)  # guards that cannot load fail now, before the model
        self.alarms: list = []  # the last evaluation's
        # built once, now: a reward model loads once, and one that cannot load fails before the model does
        self.reward = build_reward(cfg.eval.reward, cfg.eval.reward_kwargs, "the held-out reward (eval.reward)")

    def evaluate(self, policy, weights, iteration: int, training: tuple[float, float] | None = None) -> dict:
        """Evaluate ``policy`` with ``weights`` (a WeightCopy, or None for the current weights) at ``iteration``;
        ``training``: the training reward at the run's first iteration and now, for the watch."""
        e, log = self.cfg.eval, self.cfg.log
        prompts, metadata = read_prompts(e.prompts, e.limit)
        seed = self.cfg.train.seed + EVAL_SEED_OFFSET
        # every process evaluates its share of the prompts (each prompt's noise is its own): faster with several,
        # and needed when sharded (every model call is a collective); each then holds the whole results
        # (with context parallelism a context group's processes sample the same share, its first one scores it)
        layout = policy.layout
        processes = (layout.data_rank, layout.data_world, policy.gather, layout.from_leader) if policy.world > 1 else None
        with policy.sampling_with(weights), policy.autocast():  # a labelled bar: the base model's evaluation takes a while
            guidance = e.guidance_scale if e.guidance_scale is not None else self.cfg.sampling.guidance_scale
            summary, media, scores = evaluate(policy.model, prompts, self.reward, metadata, seed=seed, steps=e.steps,
                                              guidance_scale=guidance, batch_size=e.batch_size,
                                              progress=log.progress and policy.rank == 0,
                                              desc=f"held-out eval (iteration {iteration})", processes=processes)
        strict = f"; strict accuracy {summary['strict_accuracy']:.3f}" if "strict_accuracy" in summary else ""
        self.writer.info(f"held-out {e.reward} at iteration {iteration}: {summary['mean_score']:.3f} "
                         f"({summary['num_images']} samples{strict})")
        self.writer.write_eval_scores(iteration, scores, [m.get("task", "all") for m in metadata] if metadata else None)
        if log.eval_samples:  # the same first n held-out prompts and seeds every time: the gallery compares steps
            first: dict[str, int] = {}  # samples of the same prompt form a group in the preview
            same_prompt = torch.tensor([first.setdefault(p, len(first)) for p in prompts])
            shown = policy.model.preview(media, same_prompt, prompts)[: log.eval_samples]
            n = log.eval_samples
            self.writer.write_eval_samples(iteration, shown, prompts[:n], metadata[:n] if metadata else None,
                                           scores[:n], e.reward, seed, fps=log.video_fps)
        metrics = {f"eval/{k}": v for k, v in summary.items() if isinstance(v, (int, float))} | {
            f"eval/per_task/{k}": v for k, v in summary.get("per_task", {}).items()}
        if self.watch.active:
            values = self.watch.score(media, prompts, metadata, held_out=torch.as_tensor(scores))
            watched, self.alarms = self.watch.observe(iteration, values, training, write=policy.rank == 0)
            metrics.update(watched)
            site = self.cfg.run_dir / "gallery" / "index.html"
            for alarm in self.alarms:
                self.writer.warn(alarm_line(alarm, iteration, training, str(site)))
        return metrics

    def summary_lines(self) -> list[str]:
        """The end-of-run before/after lines: the run folder's first and last held-out evaluation."""
        evaluations = self.writer.read_eval_scores()
        if len(evaluations) < 2 or evaluations[0]["scores"].shape != evaluations[-1]["scores"].shape:
            return []
        first, final = evaluations[0], evaluations[-1]
        stats = before_after(first["scores"], final["scores"], first.get("tasks"))
        lines = before_after_lines(stats, self.cfg.eval.reward, first["iteration"], final["iteration"])
        same = [e for e in evaluations if e["scores"].shape == first["scores"].shape]
        level = second_half_level(same)
        if level["evaluations"] > 1:  # one evaluation of a step-function score scatters; their mean holds still
            (m, _), (c, c_se), (a, b) = level["end"], level["change"], level["iterations"]
            lines.append(f"  over the second half (iterations {a}-{b}, {level['evaluations']} evaluations averaged "
                         f"per sample): {m:.3f} (change {c:+.3f} ± {c_se:.3f})")
        return list(lines)


__all__ = ["EVAL_SEED_OFFSET", "HeldOut"]
