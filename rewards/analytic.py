"""The analytic world's rewards: verifiable scores of a sample x [B, d] against its prompt (no images).

``analytic_hit`` is 1 when the mode nearest to x is one the prompt names (constant on each mode's
region), ``analytic_smooth`` is exp(−dist²/(2τ²)) with dist the distance in the plane to the nearest
named mode. The world (modes, prompts, the formulas, the KL-regularised optimum) is worlds/analytic.py;
docs/analytic_world.md.
"""

from __future__ import annotations

import torch

from rewards.base import Reward, RewardOutput
from worlds.analytic import SMOOTH_TAU, hit_scores, nearest_mode, smooth_scores


class _AnalyticReward(Reward):
    modality = "vector"

    def score_vectors(self, x: torch.Tensor, prompts: list[str], metadata: list[dict] | None) -> RewardOutput:
        if x.shape[1] < 2:
            raise ValueError(f"{self.name}: samples must be [B, d] with d ≥ 2, got {tuple(x.shape)}")
        scores = self.score_points(x, prompts)
        return RewardOutput(scores.float(), {"nearest_mode": nearest_mode(x).tolist()})

    def score_points(self, x: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        raise NotImplementedError


class AnalyticHit(_AnalyticReward):
    """1 if the mode nearest to the sample is one its prompt names, else 0 (binary)."""

    name = "analytic_hit"

    def score_points(self, x, prompts):
        return hit_scores(x, prompts)


class AnalyticSmooth(_AnalyticReward):
    """exp(−dist²/(2τ²)), dist = distance in the plane to the nearest target mode (in [0, 1])."""

    name = "analytic_smooth"

    def __init__(self, tau: float = SMOOTH_TAU):
        if not tau > 0:
            raise ValueError(f"analytic_smooth: tau must be > 0, got {tau}")
        self.tau = float(tau)

    def score_points(self, x, prompts):
        return smooth_scores(x, prompts, self.tau)


__all__ = ["AnalyticHit", "AnalyticSmooth"]
