"""The analytic world: Gaussian-mixture data whose flow is known in closed form (docs/math.md §6).

A world in which every learner must visibly learn, in seconds, with the answer known exactly:

- **Data.** K = 4 modes m_k on a circle of radius R in the first two coordinates of R^d (every other
  coordinate is 0 at the modes), each N(m_k, s²·I_d). Mode k sits at angle (2k + 1)·π/4, so mode 0 is
  upper right, 1 upper left, 2 lower left, 3 lower right: the four half-planes each hold two whole
  modes. Every coordinate off the plane is irrelevant to the rewards: it is where a score-function
  estimator's noise grows with d.
- **Prompts** name a set of target modes: ``mode k``, ``modes i and j``, ``the left half`` (modes 1
  and 2), ``the right half``, ``the upper half``, ``the lower half``. The base model's data for a
  prompt is the mixture with weights w_k ∝ 1 + adherence·[k is a target] (adherence 1: a "mode 2"
  prompt gives mode 2 weight 0.4 and the others 0.2 each): it follows its prompt, imperfectly, as a
  pretrained text-to-image model does.
- **Scores** are verifiable functions of the sample x [B, d] and its prompt (the rewards ``analytic_hit``
  and ``analytic_smooth`` of rewards/analytic.py, ``modality = "vector"``: no images): ``hit_scores`` is 1
  when the mode nearest to x is a target (the Voronoi cell of the
  modes in the plane, so it is constant on each component's region), ``analytic_smooth`` is
  ``smooth_scores`` is exp(−dist²/(2τ²)) with dist the distance in the plane to the nearest target mode (partial credit
  for near misses, τ = 1: about 0.02 at a neighbouring mode).
- **The optimum** of E[r] − β·KL(p ‖ p_base) for a reward r_k constant on each mode's region is the
  base mixture reweighted: w_k* ∝ w_k·exp(r_k/β) (``kl_optimum``), which the tests compare trained
  mode masses with.

The flow itself (velocity, the trainable policy) is the model adapter ``flowgrpo/models/analytic.py``;
this file holds the world's data and its verifiable scores, which the rewards and the adapter import
(worlds/ import only torch). Docs: docs/analytic_world.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch


NUM_MODES = 4
RADIUS = 2.0  # distance of every mode from the origin (neighbouring modes are R·√2 = 2.83 apart)
MODE_STD = 0.25  # s: per-coordinate standard deviation of every mode
ADHERENCE = 1.0  # base weight of a target mode is (1 + adherence) times that of the others
SMOOTH_TAU = 1.0  # τ of analytic_smooth
HALVES = {  # prompt -> target modes (modes sit at angles 45°, 135°, 225°, 315°)
    "the right half": (0, 3),
    "the upper half": (0, 1),
    "the left half": (1, 2),
    "the lower half": (2, 3),
}
_MODE = re.compile(r"^mode (\d+)$")
_MODES = re.compile(r"^modes (\d+(?:, \d+)*) and (\d+)$")


def mode_angles(num_modes: int = NUM_MODES) -> torch.Tensor:
    """[K] float64 angles (2k + 1)·π/K of the modes in the plane of the first two coordinates."""
    return (2 * torch.arange(num_modes, dtype=torch.float64) + 1) * math.pi / num_modes


def mode_means(dim: int, num_modes: int = NUM_MODES, radius: float = RADIUS) -> torch.Tensor:
    """[K, d] float64 mode centres m_k: radius·(cos, sin) of the mode's angle, 0 off the plane."""
    if dim < 2:
        raise ValueError(f"the analytic world needs d ≥ 2 (its modes lie in a plane), got d = {dim}")
    angles = mode_angles(num_modes)
    means = torch.zeros(num_modes, dim, dtype=torch.float64)
    means[:, 0], means[:, 1] = radius * angles.cos(), radius * angles.sin()
    return means


def parse_targets(prompt: str, num_modes: int = NUM_MODES) -> tuple[int, ...]:
    """The target modes a prompt names (sorted); a clear error for anything outside the grammar."""
    text = " ".join(prompt.strip().lower().split())
    if text in HALVES and num_modes == NUM_MODES:
        return HALVES[text]
    found = _MODE.match(text)
    modes: list[int] = []
    if found:
        modes = [int(found.group(1))]
    else:
        found = _MODES.match(text)
        if found:
            modes = [int(m) for m in found.group(1).split(", ")] + [int(found.group(2))]
    if not modes or any(not 0 <= m < num_modes for m in modes):
        raise ValueError(
            f"the analytic world does not understand the prompt {prompt!r}: write 'mode k' or 'modes i and j' "
            f"with k in 0..{num_modes - 1}, or one of {sorted(HALVES)}"
        )
    return tuple(sorted(set(modes)))


def target_mask(prompts: list[str], num_modes: int = NUM_MODES) -> torch.Tensor:
    """[P, K] float32 multi-hot of each prompt's target modes."""
    mask = torch.zeros(len(prompts), num_modes)
    for i, prompt in enumerate(prompts):
        mask[i, list(parse_targets(prompt, num_modes))] = 1.0
    return mask


def base_weights(targets: torch.Tensor, adherence: float = ADHERENCE) -> torch.Tensor:
    """Base mixture weights [P, K] float64 from target masks [P, K]: w_k ∝ 1 + adherence·[k target].
    An all-zero row (no prompt: classifier-free guidance's unconditional row) gives uniform weights."""
    raw = 1.0 + adherence * targets.to(torch.float64)
    return raw / raw.sum(-1, keepdim=True)


def nearest_mode(x: torch.Tensor, num_modes: int = NUM_MODES, radius: float = RADIUS) -> torch.Tensor:
    """[B] long: the mode nearest to each sample x [B, d] (only the plane matters: the other
    coordinates add the same amount to every distance)."""
    means = mode_means(2, num_modes, radius).to(x.device)
    return torch.cdist(x[:, :2].double(), means).argmin(1)


def mode_masses(x: torch.Tensor, num_modes: int = NUM_MODES) -> torch.Tensor:
    """[K] float64: the fraction of samples x [B, d] whose nearest mode is k."""
    return torch.bincount(nearest_mode(x, num_modes), minlength=num_modes).double() / max(1, x.shape[0])


def kl_optimum(weights: torch.Tensor, rewards: torch.Tensor, beta: float) -> torch.Tensor:
    """The maximiser of E_p[r] − β·KL(p ‖ p_base) over mixtures of the base components, for a reward
    r_k constant on each component's region (docs/math.md §6): w_k* ∝ w_k·exp(r_k/β).

    weights [..., K] base weights, rewards [..., K] per-mode reward -> [..., K] float64 optimal weights."""
    if not beta > 0:
        raise ValueError(f"the KL weight beta must be > 0, got {beta}")
    logits = torch.log(weights.double()) + rewards.double() / beta
    return torch.softmax(logits, -1)


def hit_scores(x: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """[B]: 1 where the mode nearest to the sample x [B, d] is one its prompt names, else 0."""
    targets = target_mask(prompts).to(x.device)
    return targets.gather(1, nearest_mode(x).unsqueeze(1)).squeeze(1)


def smooth_scores(x: torch.Tensor, prompts: list[str], tau: float = SMOOTH_TAU) -> torch.Tensor:
    """[B]: exp(−dist²/(2τ²)), dist = the distance in the plane from x [B, d] to the nearest target mode."""
    means = mode_means(2).to(x.device)
    dist2 = torch.cdist(x[:, :2].double(), means).square()  # [B, K]
    targets = target_mask(prompts).to(x.device).bool()
    nearest_target = torch.where(targets, dist2, torch.full_like(dist2, math.inf)).min(1).values
    return torch.exp(-nearest_target / (2 * tau**2))


def mode_rewards(prompts: list[str], reward: str = "analytic_hit", num_modes: int = NUM_MODES) -> torch.Tensor:
    """[P, K] the reward of a sample sitting at each mode's centre, per prompt: the r_k of ``kl_optimum``
    (analytic_hit: 1 for target modes, 0 elsewhere)."""
    if reward == "analytic_hit":
        return target_mask(prompts, num_modes).double()
    if reward == "analytic_smooth":
        means = mode_means(2, num_modes)
        return smooth_scores(means.repeat(len(prompts), 1),
                             [p for p in prompts for _ in range(num_modes)]).view(-1, num_modes).double()
    raise ValueError(f"mode_rewards knows analytic_hit and analytic_smooth, not {reward!r}")


@dataclass(frozen=True)
class AnalyticPrompt:
    text: str
    task: str  # "mode" (one target mode) | "half" (two)

    def to_dict(self) -> dict:
        return {"task": self.task, "targets": list(parse_targets(self.text))}


def train_prompts() -> list[AnalyticPrompt]:
    """The eight prompts of the world: one per mode and one per half-plane."""
    return [AnalyticPrompt(f"mode {k}", "mode") for k in range(NUM_MODES)] + [
        AnalyticPrompt(text, "half") for text in HALVES
    ]


def eval_prompts(repeats: int = 32) -> list[AnalyticPrompt]:
    """The eight prompts, each ``repeats`` times in turn (256 samples): every prompt index draws its
    own noise in evaluation, so these are 32 fresh samples per prompt."""
    return [p for _ in range(repeats) for p in train_prompts()]


__all__ = [
    "ADHERENCE", "AnalyticPrompt", "HALVES", "MODE_STD", "NUM_MODES", "RADIUS", "SMOOTH_TAU", "base_weights",
    "eval_prompts", "hit_scores", "kl_optimum", "mode_angles", "mode_masses", "mode_means", "mode_rewards",
    "nearest_mode", "parse_targets", "smooth_scores", "target_mask", "train_prompts",
]
