"""DGPO, Direct Group Preference Optimization (Luo et al., ICLR 2026; reference code Luo-Yihong/DGPO,
scripts/train_sd3_dgpo.py). docs/math.md §5.

A group's samples are compared on the same forward-process draw (t, ε shared within the group,
``learner.share_draws=group``): each has a denoising error e = mean_D(u − v)² (u = ε − x0) under the
policy and under the reference, and an implicit reward δ = e_θ − e_ref. Samples above the group mean
(A > 0) are the positives, below it the negatives, weighted by |A|/G; the group's preference is

    L_g = −log σ(−(β/G)·[Σ_{A>0} |A|·δ − Σ_{A<0} |A|·δ]) = softplus((β/G)·Σ_i A_i·δ_i)

(``dgpo_group_objective``): a group of one positive and one negative with A = ±1 gives Diffusion-DPO's
−log σ(−(β/2)·[(e_w,θ − e_w,ref) − (e_l,θ − e_l,ref)]), the form its public code uses. As in DGPO's
code, the loss trained is (G/β)·L_g, whose gradient is σ(S_g)·Σ_i A_i·∇e_θ,i (β sharpens the
sigmoid weight but does not scale the gradient, so the v-space KL kl·mean_D(v_θ − v_ref)² keeps its
calibration), averaged over samples × draws. Only high-noise times are trained (``learner.time_min``:
the reference trains the first 4–6 grid points of a 10-step shift-3 grid, t ≥ 0.82 or 0.67), and a
PPO-style clip detaches a sample's error when ρ = exp(e_old − e_θ) leaves 1 ± ε on its advantage's
side, "old" being ema_ref, a soft copy of θ updated after every optimizer step (λ = min(0.001·n, 0.3)).
"""

from __future__ import annotations

import torch

from flowgrpo.engine.learners.forward import ForwardLearner, soft_copy
from flowgrpo.engine.policy import REFERENCE


def dgpo_group_objective(delta: torch.Tensor, advantages: torch.Tensor, groups: torch.Tensor, beta: float):
    """L_g = softplus((β/G_g)·Σ_{i∈g} A_i·δ_i) for every group g; delta, advantages, groups [N] -> ([n_g], ids)."""
    ids, inverse = torch.unique(groups, return_inverse=True)
    sizes = torch.zeros(len(ids), dtype=delta.dtype, device=delta.device).index_add_(0, inverse, torch.ones_like(delta))
    weighted = torch.zeros(len(ids), dtype=delta.dtype, device=delta.device).index_add_(
        0, inverse, advantages.to(delta) * delta)
    return torch.nn.functional.softplus(beta / sizes * weighted), sizes


def dgpo_clip_mask(error: torch.Tensor, error_old: torch.Tensor, advantages: torch.Tensor, clip_range: float):
    """[N] bool: samples whose error stops contributing (ρ = exp(e_old − e_θ) beyond 1 ± ε on A's side)."""
    ratio = torch.exp(error_old - error.detach())
    return ((advantages > 0) & (ratio > 1 + clip_range)) | ((advantages < 0) & (ratio < 1 - clip_range))


class DGPOLearner(ForwardLearner):
    name = "dgpo"
    unit = "group_draw"  # its objective compares a group's members on each draw: never split one

    def __init__(self, cfg, policy):
        super().__init__(cfg, policy)
        # ema_ref: the "old" policy of the clip, a soft copy of θ that follows after every optimizer step
        self.ema_ref = soft_copy(policy, "ema_ref", cfg.learner.dgpo.ema_ref, follows="step")

    @property
    def sampling_copy(self):
        """The weights the rollout samples with: ema_ref once ``dgpo.sample_with_ema_after`` optimizer steps are taken
        (the reference code's switch of its sampler to the EMA), the current weights before (and when it is 0). A
        pure function of the step count, which a checkpoint restores: a resumed run switches where it would have."""
        after = self.cfg.learner.dgpo.sample_with_ema_after
        return self.ema_ref if 0 < after <= self.policy.optimizer_steps else None

    def micro_loss(self, work, members, epoch, first, real):
        lc = self.cfg.learner
        dg, K = lc.dgpo, lc.train_times
        _, x_t, t, u, cond, adv, index, draw = self.rows(members, work, epoch)
        v_ref = self.velocity(x_t, t, cond, weights=REFERENCE)
        v_old = self.velocity(x_t, t, cond, weights=self.ema_ref)
        v = self.velocity(x_t, t, cond)
        err = (u - v).square().flatten(1).mean(1)
        err_ref = (u - v_ref).square().flatten(1).mean(1)
        err_old = (u - v_old).square().flatten(1).mean(1)
        clipped = dgpo_clip_mask(err, err_old, adv, dg.clip_range)
        used = torch.where(clipped, err.detach(), err)
        # one comparison per group and draw (a micro-batch holds whole (group, draw) units: unit below)
        group_of_sample = torch.tensor([m.sample.group for m in members], device=x_t.device)
        keys = group_of_sample[index] * K + draw
        objective, sizes = dgpo_group_objective(used - err_ref, adv, keys, dg.beta)
        total = (sizes / dg.beta * objective).sum()
        d = {"group_objective": objective.detach(), "clip_frac": clipped.float(),
             "ratio_dev": (torch.exp(err_old - err.detach()) - 1).abs()}  # against ema_ref, which lags θ
        if lc.kl_coef > 0:
            kl = (v - v_ref).square().flatten(1).mean(1)
            total = total + lc.kl_coef * kl.sum()
            d["kl_ref"] = kl.detach()
        return total, d
