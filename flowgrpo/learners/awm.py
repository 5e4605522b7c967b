"""AWM, Advantage Weighted Matching (Xue et al., ICML 2026; reference code
scxue/advantage_weighted_matching, train_sd3_awm.py). MATH.md §5.

The score-function (DDPO / Flow-GRPO) gradient is flow matching with noisy targets; AWM replaces the
per-step log-likelihood of an SDE transition by a surrogate log-likelihood of the clean sample at a
forward-process draw (t, ε), ℓ = −w·mean_D(v − u)² with u = ε − x0:

    uniform: w = 1   t: w = t   t2: w = t²   huber: −(√(m + 1e-10) − 1e-5)·t
    ghuber (the reference configs' default, p = 0.25): ℓ = −t·((m + 1e-10)^p − 1e-10^p)/p,  m = mean_D(v − u)²

and trains it with PPO's clipped ratio ρ = exp(ℓ_θ − ℓ_old) (ℓ_old: the rollout policy on the same
draw), the advantage scaled to [−1, 1] (A/A_max, as the reference code):

    L = mean over rows of max(−A·ρ, −A·clip(ρ, 1 − ε, 1 + ε)) + kl·mean_D(v_θ − v_ref)² + kl_ema·mean_D(v_θ − v_ema)²

ρ = 1 exactly at inner epoch 0 before the first step (``max_abs_ratio_minus_1_epoch0``). The EMA
(``learner.awm.ema``: λ = min(0.001·n, 0.3), updated after each iteration) serves its KL term and,
with ``sample_with_ema``, off-policy rollouts (ℓ_old then comes from the EMA weights).
"""

from __future__ import annotations

import torch

from flowgrpo.learners.forward import ForwardLearner, SoftCopy
from flowgrpo.loss import ppo_clip


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
    raise ValueError(f"learner.awm.weighting={weighting!r}; use uniform, t, t2, huber or ghuber")


def awm_loss(log_lik: torch.Tensor, log_lik_old: torch.Tensor, advantages: torch.Tensor, clip_range: float):
    """Per-row PPO loss [R] on ρ = exp(ℓ_θ − ℓ_old), and ρ (detached)."""
    ratio = torch.exp(log_lik - log_lik_old.detach())
    return ppo_clip(ratio, advantages.to(ratio), clip_range), ratio.detach()


class AWMLearner(ForwardLearner):
    name = "awm"
    contract_metric = "max_abs_ratio_minus_1"

    def __init__(self, trainer):
        super().__init__(trainer)
        awm = self.cfg.learner.awm
        self.ema = SoftCopy(trainer.params, awm.ema) if awm.ema_kl_coef > 0 or awm.sample_with_ema else None
        self.old_weights = None

    def sampling_weights(self):
        if self.cfg.learner.awm.sample_with_ema:
            return self.trainer.swapped(self.ema.values)
        return super().sampling_weights()

    def begin_update(self, batches, samples) -> None:
        # ℓ_old: the policy that made the rollout (its weights before this iteration's first step)
        if self.cfg.learner.awm.sample_with_ema:
            self.old_weights = [v.clone() for v in self.ema.values]
        else:
            self.old_weights = [p.detach().clone() for p in self.trainer.params]

    def after_iteration(self) -> None:
        if self.ema is not None:
            self.ema.update(self.trainer.params, self.trainer.optimizer_steps)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.named(self.ema.values, "awm_ema") if self.ema is not None else {}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        if self.ema is not None:
            self.copy_into(self.ema.values, tensors, "awm_ema")

    def micro_loss(self, members, batches, epoch, latent, grid, first):
        tr, lc = self.trainer, self.cfg.learner
        awm = lc.awm
        _, x_t, t, u, cond, adv, _ = self.rows(members, batches, epoch, latent, grid)
        # every no-gradient forward first: swapping weights in writes the parameters in place
        v_old = self.velocity_with(self.old_weights, x_t, t, cond)
        v_ref = self.velocity_with(None, x_t, t, cond) if lc.kl_coef > 0 else None
        v_ema = self.velocity_with(self.ema.values, x_t, t, cond) if awm.ema_kl_coef > 0 else None
        v = self.velocity(x_t, t, cond)
        tr.nfe.add("train_forward", x_t.shape[0])
        tr.nfe.add("train_backward", x_t.shape[0])
        lik = awm_log_likelihood(v, u, t, awm.weighting, awm.ghuber_power)
        lik_old = awm_log_likelihood(v_old, u, t, awm.weighting, awm.ghuber_power)
        loss, ratio = awm_loss(lik, lik_old, adv / lc.adv_max, awm.clip_range)
        total = loss.sum()
        d = {"ratio_mean": ratio, self.contract_metric: (ratio - 1).abs(),
             "clip_frac": ((ratio - 1).abs() > awm.clip_range).float()}
        for key, coef, other in (("kl_ref", lc.kl_coef, v_ref), ("kl_ema", awm.ema_kl_coef, v_ema)):
            if other is not None:
                kl = (v - other).square().flatten(1).mean(1)
                total = total + coef * kl.sum()
                d[key] = kl.detach()
        return total / self.normaliser, d
