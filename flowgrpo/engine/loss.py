"""The per-transition GRPO loss of the denoising MDP (docs/math.md §3), given the log-ratios.

For trained transition t (sample i, step j) with advantage A and log-ratio log ρ (plain: lp_θ − lp_old;
GRPO-Guard's normalised one: reduce_D(ε_s·δ), both from flowgrpo.likelihood):
  L = max(−A·ρ, −A·clip(ρ, 1 − ε, 1 + ε)) · step weight, plus KL terms.
``clipped_policy_loss`` returns the per-transition loss and the diagnostics the learner logs (clip
fractions split by ρ > 1 and ρ < 1, approximate KL); ``kl_masked_policy_loss`` is Flow-DPPO's trust region in
place of the clip (an exact per-step KL mask); ``ppo_clip`` is the clip alone (AWM's learner uses it too); ``gaussian_kl`` the KL between two kernels of one std (SAGE's anchor and rollout terms);
``step_weights`` the per-transition multipliers (GRPO-Guard's 1/Δ, SAGE's equaliser). All math in fp32
(float64 inputs stay float64).
"""

from __future__ import annotations

import torch

from samplers import kernel_coefficients


def _reduce(values: torch.Tensor, reduce: str) -> torch.Tensor:
    flat = values.flatten(1)
    return flat.mean(1) if reduce == "mean" else flat.sum(1)


def ppo_clip(ratio: torch.Tensor, advantages: torch.Tensor, clip_range: float) -> torch.Tensor:
    """max(−A·ρ, −A·clip(ρ, 1−ε, 1+ε)), per transition."""
    return torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip_range, 1 + clip_range))


def gaussian_kl(mean_a, mean_b, std, reduce: str) -> torch.Tensor:
    """KL between N(μ_a, s²) and N(μ_b, s²) per element, reduced: reduce_D((μ_a − μ_b)²)/(2s²)."""
    return _reduce((mean_a - mean_b) ** 2, reduce) / (2 * std**2)


def step_weights(kind: str, kernels: list[str], sigma, sigma_next, eta) -> torch.Tensor:
    """Per-transition loss multipliers: none | inv_delta (GRPO-Guard: 1/Δ) | sage (SAGE's
    gradient-norm equaliser median_k(g)/g_k with g_k = |∂μ/∂v|/s_k from the kernel's coefficients)."""
    n = sigma.shape[0]
    if kind == "none":
        return torch.ones(n, dtype=torch.float32, device=sigma.device)
    if kind == "inv_delta":
        return (1.0 / (sigma.double() - sigma_next.double())).float()
    if kind == "sage":
        g = torch.empty(n, dtype=torch.float64, device=sigma.device)
        for name in set(kernels):
            rows = torch.tensor([k == name for k in kernels], device=sigma.device)
            _, b, s = kernel_coefficients(name, sigma[rows].double(), sigma_next[rows].double(), eta[rows].double())
            g[rows] = (b.abs() / s).double()
        # median over the distinct steps (not over rows: a step with more transitions must not count
        # more); for an even number of steps the lower middle one, as torch.median in SAGE's code
        _, first = torch.unique(torch.stack([sigma.double(), sigma_next.double()], 1), dim=0, return_inverse=True)
        per_step = torch.zeros(int(first.max()) + 1, dtype=torch.float64, device=g.device).index_copy_(0, first, g)
        return (torch.median(per_step) / g).float()
    raise ValueError(f"step_weight={kind!r}; use none, inv_delta or sage")


class SageKLWeight:
    """SAGE-GRPO's adaptive KL weight (its code's AdaptiveKLController, with target = ceiling = ``high`` and start =
    floor = ``low``): each transition uses the current weight, then reports its KL. Over the first 100 reports the
    weight ramps linearly from ``low`` to ``high``; after that it is multiplied by 0.9 while the mean of the last 10
    reports exceeds 1.5·high, by 1.1 while it is below 0.5·high, and kept within [low, high]."""

    RAMP, WINDOW = 100, 10

    def __init__(self, high: float, low: float):
        self.high, self.low = float(high), float(low)
        self.weight, self.calls, self.recent = self.low, 0, []

    def next(self, kl: float) -> float:
        """The weight of this transition (the one before its report), then the update with its KL."""
        used = self.weight
        self.calls += 1
        self.recent = (self.recent + [float(kl)])[-self.WINDOW:]
        if self.calls < self.RAMP:
            self.weight = self.low + (self.high - self.low) * self.calls / self.RAMP
        elif len(self.recent) >= self.WINDOW:
            error = sum(self.recent) / len(self.recent) - self.high
            if error > 0.5 * self.high:
                self.weight *= 0.9
            elif error < -0.5 * self.high:
                self.weight *= 1.1
            self.weight = max(self.low, min(self.high, self.weight))
        return used

    def state_dict(self) -> dict:
        return {"weight": self.weight, "calls": self.calls, "recent": list(self.recent)}

    def load_state_dict(self, state: dict) -> None:
        self.weight, self.calls, self.recent = float(state["weight"]), int(state["calls"]), list(state["recent"])


def kl_masked_policy_loss(
    log_ratio: torch.Tensor,  # [M] with grad
    log_ratio_plain: torch.Tensor,  # [M] lp_θ − lp_old (for the approximate KL diagnostic)
    advantages: torch.Tensor,  # [M]
    kl: torch.Tensor,  # [M] KL(π_old ‖ π_θ) of the step's Gaussians: reduce_D((μ_θ − μ_old)²)/(2s²)
    threshold: float,
) -> tuple[torch.Tensor, dict]:
    """Flow-DPPO's loss [M]: −A·ρ unclipped, except that a transition whose step has left the trust region
    (KL ≥ ``threshold``) and whose ratio moves further on its advantage's side (ρ > 1 with A > 0, or ρ < 1 with
    A < 0) contributes 0 (counted in the normaliser). A transition inside the region, or one moving back toward
    π_old, keeps its whole gradient. The mask carries no gradient."""
    ratio = torch.exp(log_ratio)
    advantages = advantages.to(ratio)
    with torch.no_grad():
        outside = kl.detach() >= threshold
        high = outside & (ratio > 1) & (advantages > 0)
        low = outside & (ratio < 1) & (advantages < 0)
    loss = torch.where(high | low, torch.zeros_like(ratio), -advantages * ratio)  # where: an overflowing ρ·0 is no NaN
    with torch.no_grad():
        diag = {
            "log_ratio": log_ratio.detach(),
            "ratio_dev": (ratio - 1).abs().detach(),
            "clipped_high": high.float(),  # dropped: ρ above 1 on a positive advantage, outside the region
            "clipped_low": low.float(),
            "approx_kl": 0.5 * log_ratio_plain.detach() ** 2,
        }
    return loss, diag


def clipped_policy_loss(
    log_ratio: torch.Tensor,  # [M] the ratio used (plain or GRPO-Guard), with grad
    log_ratio_plain: torch.Tensor,  # [M] lp_θ − lp_old (for the approximate KL diagnostic)
    advantages: torch.Tensor,  # [M]
    clip_range: float,
) -> tuple[torch.Tensor, dict]:
    """PPO's clipped loss [M] from log-ratios, and diagnostics (tensors [M], detached)."""
    ratio = torch.exp(log_ratio)
    loss = ppo_clip(ratio, advantages.to(ratio), clip_range)
    with torch.no_grad():
        diag = {
            "log_ratio": log_ratio.detach(),
            "ratio_dev": (ratio - 1).abs().detach(),
            "clipped_high": (ratio > 1 + clip_range).float(),  # ρ above the trust region
            "clipped_low": (ratio < 1 - clip_range).float(),  # ρ below it
            "approx_kl": 0.5 * log_ratio_plain.detach() ** 2,
        }
    return loss, diag
