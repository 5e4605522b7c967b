"""CRD, Centered Reward Distillation (Zhu et al., arXiv 2603.14128; its trainer in X-GenGroup/Flow-Factory,
trainers/crd.py). docs/math.md §5.

The KL-regularised optimum p* ∝ p_anchor·exp(r/β) gives β·log(p*/p_anchor)(x) = r(x) − β·log Z(c): centred within a
prompt's samples, the normaliser log Z(c) cancels. CRD fits an *implicit reward* to the centred advantage. At a
forward-process draw (t, ε) of a clean sample x0 (u = ε − x0), with the current velocity v_θ and an older copy's
v_old (no gradient), each error over its own detached size w = sg(max(mean_D|v − u|, 1e-5)):

    r_θ = −mean_D[(v_θ − u)²/w_θ − (v_old − u)²/w_old]                         (0 where θ = θ_old)
    a = clamp(½ + ½·A/A_max, 0, 1)                                              (the advantage in [0, 1])
    L_pol = (A_max/β)·(β·(r_θ − sg(mean_g r_θ)) − (a − mean_g a))²              (mean_g: the sample's group, one draw)
    L_kl = kl_coef·(m + a·(1 − m))·mean_D(v_θ − v_ref)²,   m = kl_floor/kl_coef (reward_adaptive_kl; else kl_coef)

v_ref is the base model's velocity at the CFG scale ``crd.kl_cfg`` (the CFG-anchored reference). The old policy and
the policy that samples are two soft copies, followed after each iteration (``crd.old``: λ = min(0.25 + 0.005·n,
0.999); ``crd.sampler``: λ = 0 for 75 optimizer steps, then min(0.0075·(n − 75), 0.999)): a sampler that lags the
old copy keeps the implicit reward's signal alive. A group on one draw is one micro-batch unit (its centring needs
all of it). r_θ = 0 at the first optimizer step of the run (θ = θ_old; ``max_abs_implicit_reward_epoch0``).

Where this differs from the reference trainer: it centres r_θ and a over the whole gathered micro-batch, which holds
several prompts; here over each prompt's group, as the paper's derivation (and its name) says.
"""

from __future__ import annotations

import torch

from flowgrpo.engine.learners.forward import ForwardLearner, optimality_probability, soft_copy
from flowgrpo.engine.policy import REFERENCE


def _mean_d(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(1).mean(1)


def implicit_reward(v_theta: torch.Tensor, v_old: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """r_θ [R] of the module docstring: the old copy's normalised error less the current one's."""
    errors = []
    for v in (v_theta, v_old.detach()):
        err = (v - u).square()
        weight = _mean_d((v - u).abs()).detach().clamp(min=1e-5)
        errors.append(_mean_d(err) / weight)
    return -(errors[0] - errors[1])


def centred(values: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values − their group's mean [R] (``groups`` [R]: a row's group on its draw), and the means [R]."""
    ids, inverse = torch.unique(groups, return_inverse=True)
    total = torch.zeros(len(ids), dtype=values.dtype, device=values.device).index_add(0, inverse, values)
    count = torch.zeros(len(ids), dtype=values.dtype, device=values.device).index_add(0, inverse, torch.ones_like(values))
    mean = (total / count)[inverse]
    return values - mean, mean


def crd_loss(r_theta: torch.Tensor, a: torch.Tensor, groups: torch.Tensor, *, beta: float, adv_max: float):
    """Per-row policy loss [R]: (A_max/β)·(β·(r_θ − sg(mean_g r_θ)) − (a − mean_g a))²."""
    mean_r = centred(r_theta.detach(), groups)[1]
    a_c = centred(a.to(r_theta), groups)[0]
    return adv_max / beta * (beta * (r_theta - mean_r) - a_c).square()


class CRDLearner(ForwardLearner):
    name = "crd"
    unit = "group_draw"  # the centring compares a group's members on each draw: never split one
    contract = ("max_abs_implicit_reward", "max_abs_implicit_reward_epoch0")

    def __init__(self, cfg, policy):
        super().__init__(cfg, policy)
        crd = cfg.learner.crd
        self.old = soft_copy(policy, "crd_old", crd.old, follows="iteration")
        self.sampling_copy = soft_copy(policy, "crd_sampler", crd.sampler, follows="iteration")

    def micro_loss(self, work, members, epoch, first, real):
        lc = self.cfg.learner
        crd = lc.crd
        _, x_t, t, u, cond, adv, index, draw = self.rows(members, work, epoch)
        # every no-gradient call first: a copy's weights are swapped into the parameters in place
        v_old = self.velocity(x_t, t, cond, weights=self.old)
        v_ref = None
        if lc.kl_coef > 0:
            scale = crd.kl_cfg if crd.kl_cfg is not None else self.cfg.sampling.guidance_scale
            with self.policy.model.integer_timesteps(lc.integer_times, rounding="nearest"):
                v_ref = self.policy.velocity(x_t, t, cond, scale, REFERENCE)
        v = self.velocity(x_t, t, cond)
        # a row's group on its draw: the sample's advantage group and the draw's index
        group = torch.tensor([m.sample.group for m in members], device=index.device)[index]
        groups = group * lc.train_times + draw
        r_theta = implicit_reward(v, v_old, u)
        a = optimality_probability(adv, lc.adv_max)
        loss = crd_loss(r_theta, a, groups, beta=crd.beta, adv_max=lc.adv_max)
        total = loss.sum()
        d = {"crd_loss": loss.detach(), "implicit_reward": r_theta.detach(),
             "max_abs_implicit_reward": r_theta.detach().abs()}
        if v_ref is not None:
            kl = _mean_d((v - v_ref).square())
            weight = (crd.kl_floor / lc.kl_coef + a * (1 - crd.kl_floor / lc.kl_coef)) if crd.reward_adaptive_kl \
                else torch.ones_like(a)
            total = total + lc.kl_coef * (weight.to(kl) * kl).sum()
            d["kl_ref"] = kl.detach()
        return total, d
