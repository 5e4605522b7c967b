"""AWM, Advantage Weighted Matching (Xue et al., ICML 2026; reference code
scxue/advantage_weighted_matching, train_sd3_awm.py). docs/math.md §5.

The score-function (DDPO / Flow-GRPO) gradient is flow matching with noisy targets; AWM replaces the
per-step log-likelihood of an SDE transition by a surrogate log-likelihood of the clean sample at a
forward-process draw (t, ε), ℓ = −w·mean_D(v − u)² with u = ε − x0:

    uniform: w = 1   t: w = t   t2: w = t²   huber: −(√(m + 1e-10) − 1e-5)·t
    ghuber (the reference configs' default, p = 0.25): ℓ = −t·((m + 1e-10)^p − 1e-10^p)/p,  m = mean_D(v − u)²
    adaptive (V-GRPO's "adaptive loss weighting", DiffusionNFT's x0 loss): the x0-prediction error e = x̂0 − x0 =
        t·(u − v) over its own detached mean size: ℓ = −mean_D(e²)/sg(max(mean_D|e|, 1e-5))

and trains it with PPO's clipped ratio ρ = exp(ℓ_θ − ℓ_old) (ℓ_old: the rollout policy on the same
draw), the advantage scaled to [−1, 1] (A/A_max, as the reference code):

    L = mean over rows of max(−A·ρ, −A·clip(ρ, 1 − ε, 1 + ε)) + kl·mean_D(v_θ − v_ref)² + kl_ema·mean_D(v_θ − v_ema)²

With ``ratio=sample`` (V-GRPO, arXiv 2604.23380: the ELBO surrogate of the whole sample) one ratio per sample
ρ_i = exp(mean_k ℓ_θ(k) − mean_k ℓ_old(k)) over its K draws, clipped once against A_i; each sample then weighs
as its K rows did. ρ = 1 exactly at inner epoch 0 before the first step (``max_abs_ratio_minus_1_epoch0``). The EMA
(``learner.awm.ema``: λ = min(0.001·n, 0.3), updated after each iteration) serves its KL term and,
with ``sample_with_ema``, off-policy rollouts (ℓ_old then comes from the EMA weights).
"""

from __future__ import annotations

import torch

from flowgrpo.engine.learners.forward import ForwardLearner, soft_copy
from flowgrpo.engine.loss import ppo_clip
from flowgrpo.engine.policy import REFERENCE


def awm_log_likelihood(v: torch.Tensor, u: torch.Tensor, t: torch.Tensor, weighting: str, power: float = 0.25):
    """The surrogate log-likelihood ℓ [R] of the module docstring; v, u [R, *latent], t [R]."""
    m = (v - u).square().flatten(1).mean(1)
    t = t.to(m)
    if weighting == "uniform":
        return -m
    if weighting == "t":
        return -t * m
    if weighting == "t2":
        return -t.square() * m
    if weighting == "huber":
        return -(torch.sqrt(m + 1e-10) - 1e-5) * t
    if weighting == "ghuber":
        return -t * ((m + 1e-10) ** power - 1e-10**power) / power
    if weighting == "adaptive":  # e = t·(u − v): mean_D(e²) = t²·m, its size t·mean_D|v − u| (detached)
        size = (t * (v - u).abs().flatten(1).mean(1)).detach().clamp(min=1e-5)
        return -t.square() * m / size
    raise ValueError(f"learner.awm.weighting={weighting!r}; use uniform, t, t2, huber, ghuber or adaptive")


def awm_loss(log_lik: torch.Tensor, log_lik_old: torch.Tensor, advantages: torch.Tensor, clip_range: float):
    """Per-row PPO loss [R] on ρ = exp(ℓ_θ − ℓ_old), and ρ (detached)."""
    ratio = torch.exp(log_lik - log_lik_old.detach())
    return ppo_clip(ratio, advantages.to(ratio), clip_range), ratio.detach()


def per_sample(values: torch.Tensor, index: torch.Tensor, members: int) -> torch.Tensor:
    """The mean of per-row ``values`` [R] over each member's rows (``index`` [R]: its member) -> [members]."""
    total = torch.zeros(members, dtype=values.dtype, device=values.device).index_add(0, index, values)
    count = torch.zeros(members, dtype=values.dtype, device=values.device).index_add(0, index, torch.ones_like(values))
    return total / count


class AWMLearner(ForwardLearner):
    name = "awm"
    contract = ("max_abs_ratio_minus_1", "max_abs_ratio_minus_1_epoch0")

    @property
    def unit(self) -> str:
        """A sample's draws stay in one micro-batch when its ratio is formed over them (``ratio=sample``)."""
        return "sample" if self.cfg.learner.awm.ratio == "sample" else "row"

    def __init__(self, cfg, policy):
        super().__init__(cfg, policy)
        awm = cfg.learner.awm
        self.ema = soft_copy(policy, "awm_ema", awm.ema, follows="iteration") if awm.ema_kl_coef > 0 or awm.sample_with_ema else None
        if awm.sample_with_ema:
            self.sampling_copy = self.ema
        # ℓ_old: the weights that made the rollout, set before each update (never saved: rebuilt every iteration)
        self.old = policy.copy("awm_old", follows="never", saved=False)

    def begin_update(self, samples) -> None:
        # the policy that made the rollout: its weights before this iteration's first step (or the EMA's)
        self.old.assign(self.ema.values if self.cfg.learner.awm.sample_with_ema else self.policy.params)

    def micro_loss(self, work, members, epoch, first, real):
        lc = self.cfg.learner
        awm = lc.awm
        _, x_t, t, u, cond, adv, index, _ = self.rows(members, work, epoch)
        # every no-gradient call first: a copy's weights are swapped into the parameters in place
        v_old = self.velocity(x_t, t, cond, weights=self.old)
        v_ref = self.velocity(x_t, t, cond, weights=REFERENCE) if lc.kl_coef > 0 else None
        v_ema = self.velocity(x_t, t, cond, weights=self.ema) if awm.ema_kl_coef > 0 else None
        v = self.velocity(x_t, t, cond)
        lik = awm_log_likelihood(v, u, t, awm.weighting, awm.ghuber_power)
        lik_old = awm_log_likelihood(v_old, u, t, awm.weighting, awm.ghuber_power)
        if awm.ratio == "sample":  # one ratio per sample from its draws' mean ℓ; the sample weighs as its K rows
            n = len(members)
            loss, ratio = awm_loss(per_sample(lik, index, n), per_sample(lik_old, index, n),
                                   per_sample(adv, index, n) / lc.adv_max, awm.clip_range)
            loss, ratio = loss[index], ratio[index]
        else:
            loss, ratio = awm_loss(lik, lik_old, adv / lc.adv_max, awm.clip_range)
        total = loss.sum()
        d = {"ratio_mean": ratio, "max_abs_ratio_minus_1": (ratio - 1).abs(),
             "clip_frac": ((ratio - 1).abs() > awm.clip_range).float()}
        for key, coef, other in (("kl_ref", lc.kl_coef, v_ref), ("kl_ema", awm.ema_kl_coef, v_ema)):
            if other is not None:
                kl = (v - other).square().flatten(1).mean(1)
                total = total + coef * kl.sum()
                d[key] = kl.detach()
        return total, d
