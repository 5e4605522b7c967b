"""DiffusionNFT: online diffusion reinforcement with the forward process (Zheng et al., ICLR 2026;
reference code NVlabs/DiffusionNFT, scripts/train_nft_sd3.py). docs/math.md §5.

Negative-aware fine-tuning: the advantage becomes an optimality probability
r = clamp(½ + ½·A/A_max, 0, 1), and the velocity is regressed through two *implicit* policies built
from the trained velocity v_θ and the sampling policy's v_old (no gradient):

    v⁺ = β·v_θ + (1 − β)·v_old,      v⁻ = (1 + β)·v_old − β·v_θ,

whose clean estimates x̂0^± = x_t − t·v^± are pulled to the sample x0 with adaptive, per-sample
weights w^± = stopgrad(max(mean_D |x̂0^± − x0|, 1e-5)):

    L = A_max · [ r·mean_D(x̂0⁺ − x0)²/w⁺ + (1 − r)·mean_D(x̂0⁻ − x0)²/w⁻ ] / β  (+ kl·mean_D(v_θ − v_ref)²)

averaged over samples × training draws. At θ = θ_old, v⁺ = v⁻ = v_old (logged at inner epoch 0 as
``max_abs_vplus_minus_vold_epoch0``). The policy that samples is θ_old, a soft copy updated after
each iteration: θ_old ← λ·θ_old + (1 − λ)·θ with λ = min(0.001·n, 0.5) after n optimizer steps (the
reference code's default schedule; ``learner.nft.old``); it starts as θ. CFG-free: it trains (and,
in its preset, samples) without guidance. The ×A_max and ÷β follow the reference code.
"""

from __future__ import annotations

import torch

from flowgrpo.engine.learners.forward import ForwardLearner, optimality_probability, soft_copy
from flowgrpo.engine.policy import REFERENCE


def _mean_d(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(1).mean(1)


def nft_loss(v_theta, v_old, x_t, x0, t, advantages, *, beta: float, adv_max: float):
    """Per-row DiffusionNFT loss [R] (see the module docstring) and the implicit velocities.

    v_theta (with grad), v_old, x_t, x0: [R, *latent]; t, advantages: [R]. Returns (loss [R], v⁺, v⁻)."""
    col = t.to(v_theta).view((-1,) + (1,) * (v_theta.dim() - 1))
    v_old = v_old.detach()
    step = beta * (v_theta - v_old)  # v± = v_old ± β·(v_θ − v_old): exactly v_old at θ = θ_old, in floats too
    v_pos, v_neg = v_old + step, v_old - step
    losses = []
    for v in (v_pos, v_neg):
        err = x_t - col * v - x0  # x̂0 − x0
        weight = _mean_d(err.abs()).detach().clamp(min=1e-5)
        losses.append(_mean_d(err.square()) / weight)
    r = optimality_probability(advantages.to(v_theta), adv_max)
    loss = adv_max * (r * losses[0] + (1.0 - r) * losses[1]) / beta
    return loss, v_pos, v_neg


class NFTLearner(ForwardLearner):
    name = "diffusion_nft"
    contract = ("max_abs_vplus_minus_vold", "max_abs_vplus_minus_vold_epoch0")

    def __init__(self, cfg, policy):
        super().__init__(cfg, policy)
        # the sampling policy θ_old, a soft copy of θ that follows after each iteration
        self.old = self.sampling_copy = soft_copy(policy, "old", cfg.learner.nft.old, follows="iteration")

    def micro_loss(self, work, members, epoch, first, real):
        lc = self.cfg.learner
        x0, x_t, t, u, cond, adv, _, _ = self.rows(members, work, epoch)
        # every no-gradient call first: a copy's weights are swapped into the parameters in place
        v_old = self.velocity(x_t, t, cond, weights=self.old)
        v_ref = self.velocity(x_t, t, cond, weights=REFERENCE) if lc.kl_coef > 0 else None
        v = self.velocity(x_t, t, cond)
        loss, v_pos, _ = nft_loss(v, v_old, x_t, x0, t, adv, beta=lc.nft.beta, adv_max=lc.adv_max)
        total = loss.sum()
        d = {"nft_loss": loss.detach()}
        if v_ref is not None:
            kl = _mean_d((v - v_ref).square())
            total = total + lc.kl_coef * kl.sum()
            d["kl_ref"] = kl.detach()
        d["max_abs_vplus_minus_vold"] = (v_pos.detach() - v_old).abs().flatten(1).amax(1)
        return total, d
