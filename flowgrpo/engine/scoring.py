"""The SCORE phase: the run's rewards, scored in a worker thread, their failures counted and named.

``Scoring`` loads every reward of the config before the model (a bad name fails in seconds), checks
that each takes what the model makes (images, videos or vectors), and scores each decoded chunk of
leaves in a worker thread while the next chunk decodes and the next batch samples
(``rewards.runner.RewardRunner``). A reward that fails is retried, then gives NaN for that chunk (masked
out of the loss) and a warning; ``collect`` turns an iteration's results into the reward matrix and
counts iterations in which no sample got a valid reward: ``train.max_iterations_without_reward`` of
them in a row stop the run with ``NoValidRewardError`` naming the reward, its last error and the fix.
"""

from __future__ import annotations

import math

import torch

from flowgrpo.run.checkpoint import checkpoint_dirs
from flowgrpo.run.errors import ConfigError, UserError, build_reward
from rewards import RewardLookupError, reward_class
from flowgrpo.conditions import reward_conditions
from rewards.runner import RewardRunner

EXAMPLE_REWARD = {"image": "toy", "video": "toy_video", "vector": "analytic_hit"}


class NoValidRewardError(UserError, RuntimeError):
    """No sample got a valid reward for train.max_iterations_without_reward iterations in a row: the entry
    points print the message (the reward, its last error, the fix) as one line, exit status 2."""


def reward_takes(reward_modality: str, modality: str) -> bool:
    """Whether a reward of ``reward_modality`` scores what a model of ``modality`` makes ("both" = pictures)."""
    return reward_modality == modality or (reward_modality == "both" and modality in ("image", "video"))


def check_reward_modalities(rewards, names: list[str], eval_reward: str, modality: str) -> None:
    """A reward must take what the model makes (images, videos or vectors): fail at start-up, naming the fix."""
    for reward, name in zip(rewards, names):
        theirs = getattr(reward, "modality", "both")
        if not reward_takes(theirs, modality):
            fix = (f"rewards=[{{name: per_frame, kwargs: {{reward: {name}}}}}] scores it frame by frame, or use a "
                   "video reward such as toy_video" if modality == "video" and theirs == "image" else
                   f"use a {modality} reward such as {EXAMPLE_REWARD[modality]}")
            raise ConfigError(f"reward {name!r} scores {theirs if theirs != 'both' else 'picture'}s but the model "
                              f"makes {modality}s; {fix}")
    try:
        eval_modality = getattr(reward_class(eval_reward), "modality", "both")
    except RewardLookupError:
        return  # a bad name fails with the resolver's message when the held-out reward is built
    if not reward_takes(eval_modality, modality):
        raise ConfigError(f"eval.reward={eval_reward!r} scores {eval_modality}s but the model makes {modality}s; "
                          f"set eval.reward to a {modality} reward such as {EXAMPLE_REWARD[modality]} (and "
                          "eval.prompts to match)")


class Scoring:
    """The run's weighted rewards, their worker thread, and the record of their failures."""

    def __init__(self, cfg, modality: str, writer=None):
        self.cfg, self.writer = cfg, writer
        self.rewards = [build_reward(spec.name, spec.kwargs, f"rewards[{i}]") for i, spec in enumerate(cfg.rewards)]
        check_reward_modalities(self.rewards, [spec.name for spec in cfg.rewards], cfg.eval.reward, modality)
        self.weights = torch.tensor([spec.weight for spec in cfg.rewards], dtype=torch.float32)
        names = [r.name for r in self.rewards]
        keys = [r.name if names.count(r.name) == 1 else f"{r.name}_{i}" for i, r in enumerate(self.rewards)]
        self.runner = RewardRunner({k: (r, spec.weight) for k, r, spec in zip(keys, self.rewards, cfg.rewards)},
                                   retries=2, backoff_s=0.1, max_workers=1, report_failures=False,
                                   timeouts={k: spec.timeout_s for k, spec in zip(keys, cfg.rewards)})
        self.errors: dict[str, str] = {}  # reward key -> its last error after retries
        self.rewardless = 0  # consecutive iterations in which no sample got a valid reward
        self.ties_warned = False  # the tied-groups warning is out and has not cleared

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.rewards]

    def submit(self, media: torch.Tensor, texts: list[str], metadata: list[dict]):
        """Score a decoded chunk in the worker thread; a Future of its RewardResult. The rows' condition images (an
        edit's source, flowgrpo/conditions.py) go with it, at the chunk's size, to the rewards that see them."""
        return self.runner.submit(media, texts, metadata, reward_conditions(metadata, media.shape[-2:], self.rewards))

    def collect(self, futures: list) -> torch.Tensor:
        """The rewards [L, K] of an iteration's chunks (in leaf order), warning once per failed call."""
        results = [f.result() for f in futures]
        for result in results:
            for key, error in result.errors.items():
                self.errors[key] = error
                self.writer.warn(f"reward {key!r} failed on a batch after retries (scores set to NaN): {error}")
        return torch.cat([result.matrix().float() for result in results])

    def statistics(self, all_rewards: torch.Tensor) -> dict:
        """Each reward's mean and std over every process's leaves ([L, K]; NaN left out)."""
        stats = {f"reward/{r.name}_mean": float(torch.nanmean(all_rewards[:, k])) for k, r in enumerate(self.rewards)}
        for k, r in enumerate(self.rewards):
            valid = all_rewards[:, k][~all_rewards[:, k].isnan()]
            stats[f"reward/{r.name}_std"] = float(valid.std(unbiased=False)) if valid.numel() else float("nan")
        return stats

    def objective(self, metrics: dict) -> float:
        """What training raises: Σ_k w_k·(mean of reward k) over the iteration's samples (a weight −1 minimises its
        reward, so its fall is a rise here); NaN where a reward has no mean. The watch's training rise."""
        means = [metrics.get(f"reward/{name}_mean", math.nan) for name in self.names]
        return float(sum(float(w) * m for w, m in zip(self.weights.tolist(), means)))

    def check_alive(self, iteration: int, valid_fraction: float, local_rewards: torch.Tensor) -> None:
        """Count an iteration without any valid reward; too many in a row stop the run (before training on nothing)."""
        self.rewardless = self.rewardless + 1 if valid_fraction == 0 else 0
        limit = self.cfg.train.max_iterations_without_reward
        if limit and self.rewardless >= limit:
            raise NoValidRewardError(self._no_reward_message(iteration, local_rewards))

    def report_ties(self, iteration: int, tied: list[float]) -> None:
        """One warning when half the groups or more had equal rewards in each of the last 5 iterations (``tied``:
        their fractions, ``iteration`` the last one's number, from 1); again only once it has cleared."""
        every = len(tied) == 5 and min(tied) >= 0.5
        if every and not self.ties_warned:
            rule = self.cfg.advantage.tied_groups
            self.writer.warn(
                f"{sum(tied) / 5:.0%} of the groups had equal rewards over iterations {iteration - 4}-{iteration} "
                f"({'not trained on' if rule == 'skip' else 'trained with A = 0'}: advantage.tied_groups={rule}); "
                "the reward cannot tell a group's samples apart: raise sampling.plan.group_size, use a denser reward, "
                "or check its scores (zero_std_group_fraction in metrics.jsonl)")
        self.ties_warned = every or (self.ties_warned and max(tied) >= 0.5)

    def _no_reward_message(self, iteration: int, local_rewards: torch.Tensor) -> str:
        """Which reward gave nothing (local_rewards [L, K]) and its last error, and the two ways on."""
        n = self.cfg.train.max_iterations_without_reward
        parts = []
        for k, (key, spec) in enumerate(zip(self.runner.rewards, self.cfg.rewards)):
            if not bool(local_rewards[:, k].isnan().all()):
                continue
            who = f"reward {key!r}" + (f" ({spec.name})" if spec.name != key else "")
            error = self.errors.get(key)
            parts.append(f"{who} failed on every call; its last error: {error}" if error else
                         f"{who} returned NaN (not applicable) for every sample")
        if not parts:
            parts = [f"no sample had a finite score in every reward ({', '.join(self.runner.rewards)})"]
        saved = checkpoint_dirs(self.cfg.run_dir)
        where = f"the newest checkpoint is {saved[-1]}" if saved else "no checkpoint was saved"
        return (f"no valid reward in {n} iterations in a row (iterations {iteration - n + 2}-{iteration + 1}): "
                + "; ".join(parts) + f". The run stopped without a checkpoint of these iterations ({where}); fix the "
                "reward and rerun the same command (it resumes from the newest checkpoint), or raise "
                "train.max_iterations_without_reward (0 = never stop)")

    def close(self) -> None:
        self.runner.close()


__all__ = ["NoValidRewardError", "Scoring", "check_reward_modalities"]
