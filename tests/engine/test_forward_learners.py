"""The forward-process learners' losses (docs/math.md §5; flowgrpo/engine/learners/nft.py, awm.py, dgpo.py) by hand,
their gradients against float64 autograd of the formulas written out here, and the shared draws and
soft copies (flowgrpo/engine/learners/forward.py).
Run: pytest tests/engine/test_forward_learners.py -q
"""

import math

import pytest
import torch

from flowgrpo.engine.learners.awm import awm_log_likelihood, awm_loss, per_sample
from flowgrpo.engine.learners.crd import centred, crd_loss, implicit_reward
from flowgrpo.engine.learners.dgpo import dgpo_clip_mask, dgpo_group_objective
from flowgrpo.models.copies import WeightCopy, soft_keep
from flowgrpo.engine.learners.forward import optimality_probability
from flowgrpo.engine.learners.nft import nft_loss
from train_fixtures import analytic_trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def close(a, b, rel=1e-6):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    assert torch.allclose(a, b, rtol=rel, atol=rel * float(b.abs().max().clamp(min=1e-12))), (a, b)


# ------------------------------------------------------------------------------------------------
# DiffusionNFT
# ------------------------------------------------------------------------------------------------
def test_nft_implicit_policies_equal_the_old_one_when_theta_is_theta_old():
    g = torch.Generator().manual_seed(0)
    v_old = torch.randn(3, 4, generator=g)
    x_t, x0, t = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g), torch.rand(3, generator=g)
    for beta in (1.0, 0.1, 2.5):
        _, v_pos, v_neg = nft_loss(v_old.clone(), v_old, x_t, x0, t, torch.zeros(3), beta=beta, adv_max=5.0)
        assert torch.equal(v_pos, v_old) and torch.equal(v_neg, v_old)


def test_nft_loss_on_a_hand_made_two_sample_batch():
    # two samples in d = 2; β = 1 (v⁺ = v_θ, v⁻ = 2·v_old − v_θ), A_max = 5
    x0 = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    eps = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    t = torch.tensor([0.5, 0.25])
    x_t = (1 - t[:, None]) * x0 + t[:, None] * eps  # [[0.5, 0.5], [0.25, 1.5]]
    v_theta = torch.tensor([[-1.0, 1.0], [2.0, -2.0]])
    v_old = torch.tensor([[0.0, 0.0], [1.0, -2.0]])
    adv = torch.tensor([5.0, -2.5])  # r = 1 and r = 0.25
    loss, _, _ = nft_loss(v_theta, v_old, x_t, x0, t, adv, beta=1.0, adv_max=5.0)
    # sample 0: r = 1, only v⁺ = v_θ: x̂0⁺ − x0 = x_t − 0.5·v_θ − x0 = [0.5+0.5−1, 0.5−0.5−0] = [0, 0] → ℓ⁺ = 0 (w floored)
    # sample 1: r = 0.25; x̂0⁺ − x0 = [0.25 − 0.5, 1.5 + 0.5 − 2] = [−0.25, 0] → ℓ⁺ = mean(0.0625, 0)/mean(0.25, 0) = 0.25
    #           v⁻ = 2·v_old − v_θ = [0, −2]; x̂0⁻ − x0 = [0.25, 1.5 + 0.5 − 2] = [0.25, 0] → ℓ⁻ = 0.25
    #           L = 5·(0.25·0.25 + 0.75·0.25)/1 = 1.25
    close(loss, [0.0, 1.25])
    # β = 0.5: v⁺ = 0.5·v_θ + 0.5·v_old = [1.5, −2], v⁻ = 1.5·v_old − 0.5·v_θ = [0.5, −2]
    # x̂0⁺ − x0 = [0.25 − 0.375, 0] = [−0.125, 0] → ℓ⁺ = 0.125; x̂0⁻ − x0 = [0.125, 0] → ℓ⁻ = 0.125; L = 5·0.125/0.5
    loss, _, _ = nft_loss(v_theta, v_old, x_t, x0, t, adv, beta=0.5, adv_max=5.0)
    close(loss[1], 1.25)
    assert optimality_probability(torch.tensor([-10.0, -5.0, 0.0, 2.5, 9.0]), 5.0).tolist() == [0.0, 0.0, 0.5, 0.75, 1.0]


def test_nft_gradient_matches_float64_autograd_of_the_formula():
    g = torch.Generator().manual_seed(1)
    R, D, beta, adv_max = 5, 6, 0.7, 5.0
    x0, x_t, v_old = (torch.randn(R, D, generator=g) for _ in range(3))
    t, adv = torch.rand(R, generator=g) * 0.9 + 0.05, torch.randn(R, generator=g) * 3
    v = torch.randn(R, D, generator=g, requires_grad=True)
    nft_loss(v, v_old, x_t, x0, t, adv, beta=beta, adv_max=adv_max)[0].sum().backward()

    v64 = v.detach().double().requires_grad_(True)
    x0d, x_td, v_oldd, td, advd = (z.double() for z in (x0, x_t, v_old, t, adv))
    r = torch.clamp(0.5 + 0.5 * advd / adv_max, 0, 1)
    total = torch.zeros((), dtype=torch.float64)
    for i in range(R):  # written per sample, from docs/math.md §5
        vp = beta * v64[i] + (1 - beta) * v_oldd[i]
        vn = (1 + beta) * v_oldd[i] - beta * v64[i]
        ep, en = x_td[i] - td[i] * vp - x0d[i], x_td[i] - td[i] * vn - x0d[i]
        wp, wn = max(float(ep.detach().abs().mean()), 1e-5), max(float(en.detach().abs().mean()), 1e-5)
        total = total + adv_max * (r[i] * (ep**2).mean() / wp + (1 - r[i]) * (en**2).mean() / wn) / beta
    total.backward()
    close(v.grad, v64.grad, rel=2e-5)


# ------------------------------------------------------------------------------------------------
# AWM
# ------------------------------------------------------------------------------------------------
def test_awm_log_likelihood_weightings_by_hand():
    v, u = torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 1.0]])  # m = mean(1, 4) = 2.5
    t = torch.tensor([0.5])
    close(awm_log_likelihood(v, u, t, "uniform"), [-2.5])
    close(awm_log_likelihood(v, u, t, "t"), [-1.25])
    close(awm_log_likelihood(v, u, t, "t2"), [-0.625])
    close(awm_log_likelihood(v, u, t, "huber"), [-(math.sqrt(2.5 + 1e-10) - 1e-5) * 0.5])
    close(awm_log_likelihood(v, u, t, "ghuber", 0.25), [-0.5 * ((2.5 + 1e-10) ** 0.25 - 1e-10**0.25) / 0.25])
    # adaptive (V-GRPO): e = t·(u − v) = 0.5·[−1, −2]; mean(e²) = 0.625, its size mean|e| = 0.75: ℓ = −0.625/0.75
    close(awm_log_likelihood(v, u, t, "adaptive"), [-0.625 / 0.75])
    # the size is detached: ∂ℓ/∂v = −t²·∂m/∂v / size = −0.25·(2·(v − u)/2)/0.75 = −[1, 2]/3
    v_grad = v.clone().requires_grad_(True)
    awm_log_likelihood(v_grad, u, t, "adaptive").sum().backward()
    close(v_grad.grad, [[-1 / 3, -2 / 3]])
    # the floor: an error below 1e-5 in size is divided by 1e-5
    tiny, zero = torch.full((1, 2), 1e-7, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64)
    close(awm_log_likelihood(tiny, zero, torch.ones(1, dtype=torch.float64), "adaptive"), [-(1e-7**2) / 1e-5])
    with pytest.raises(ValueError, match="weighting"):
        awm_log_likelihood(v, u, t, "cubic")


def test_v_grpo_sample_ratio_averages_the_draws_inside_the_exp():
    """ratio=sample: ρ_i = exp(mean_k ℓ_θ − mean_k ℓ_old) over sample i's draws (rows member-major, ``index``)."""
    lik = torch.tensor([-1.0, -3.0, -0.5, -0.5, -0.5], dtype=torch.float64)
    lik_old = torch.tensor([-2.0, -2.2, -0.5, -0.5, -0.9], dtype=torch.float64)
    index = torch.tensor([0, 0, 1, 1, 1])
    close(per_sample(lik, index, 2), [-2.0, -0.5])
    close(per_sample(lik_old, index, 2), [-2.1, -19 / 30])
    _, ratio = awm_loss(per_sample(lik, index, 2), per_sample(lik_old, index, 2), torch.ones(2), clip_range=1.0)
    close(ratio, [math.exp(0.1), math.exp(-0.5 + 19 / 30)])  # not the mean of the per-draw ratios


# ------------------------------------------------------------------------------------------------
# CRD
# ------------------------------------------------------------------------------------------------
def test_crd_implicit_reward_and_centred_loss_by_hand():
    # one draw, d = 2; u = 0. Sample 0: v_θ = [1, 1] (err² mean 1, size 1 → 1), v_old = [2, 0] (mean 2, size 1 → 2)
    #   r_θ = −(1 − 2) = 1. Sample 1: v_θ = v_old = [0.5, −0.5] → r_θ = 0. Sample 2 (another group): r_θ = 0.
    u = torch.zeros(3, 2, dtype=torch.float64)
    v_theta = torch.tensor([[1.0, 1.0], [0.5, -0.5], [3.0, 0.0]], dtype=torch.float64, requires_grad=True)
    v_old = torch.tensor([[2.0, 0.0], [0.5, -0.5], [3.0, 0.0]], dtype=torch.float64)
    r = implicit_reward(v_theta, v_old, u)
    close(r.detach(), [1.0, 0.0, 0.0])
    assert torch.equal(implicit_reward(v_old, v_old, u), torch.zeros(3, dtype=torch.float64))  # θ = θ_old: exactly 0
    # group {0, 1}: a = [1, 0.5] → centred [0.25, −0.25]; r centred (mean 0.5, detached) → [0.5, −0.5]
    # β = 1, A_max = 5: L = 5·(0.5 − 0.25)² = 0.3125 for both; the lone sample of group 7: 5·(0 − 0)² = 0
    groups = torch.tensor([0, 0, 7])
    a = torch.tensor([1.0, 0.5, 0.9], dtype=torch.float64)
    assert centred(a, groups)[0].tolist() == [0.25, -0.25, 0.0]
    loss = crd_loss(r, a, groups, beta=1.0, adv_max=5.0)
    close(loss.detach(), [0.3125, 0.3125, 0.0])
    # β = 2: (A_max/β)·(β·r_c − a_c)² = 2.5·(1 − 0.25)² = 1.40625 each
    close(crd_loss(r.detach(), a, groups, beta=2.0, adv_max=5.0), [1.40625, 1.40625, 0.0])
    # the group mean of r_θ carries no gradient: ∂L0/∂r0 = 5·2·0.25 = 2.5, ∂L1/∂r1 = −2.5 (not through the mean)
    r_leaf = r.detach().clone().requires_grad_(True)
    crd_loss(r_leaf, a, groups, beta=1.0, adv_max=5.0).sum().backward()
    close(r_leaf.grad, [2.5, -2.5, 0.0])


def test_awm_ratio_is_exactly_one_on_the_rollout_policy_and_its_clip_cases():
    lik = torch.tensor([-1.3, -0.2, -2.0])
    loss, ratio = awm_loss(lik, lik.clone(), torch.tensor([1.0, -1.0, 0.5]), clip_range=0.2)
    assert torch.equal(ratio, torch.ones(3))
    close(loss, [-1.0, 1.0, -0.5])
    # clip cases with ε = 0.2: (A > 0, ρ = e^0.5 > 1.2) clipped at 1.2, no gradient; (A > 0, ρ = e^-0.5 < 0.8) unclipped;
    # (A < 0, ρ = e^-0.5) clipped at 0.8, no gradient; (A < 0, ρ = e^0.5) unclipped
    lik_theta = torch.tensor([0.5, -0.5, -0.5, 0.5], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, ratio = awm_loss(lik_theta, torch.zeros(4), adv, clip_range=0.2)
    e = math.e
    close(loss, [-1.2, -e**-0.5, 0.8, e**0.5])
    loss.sum().backward()
    close(lik_theta.grad, [0.0, -(e**-0.5), 0.0, e**0.5])


def test_awm_gradient_matches_float64_autograd_of_the_formula():
    g = torch.Generator().manual_seed(2)
    R, D = 6, 5
    u, v_old = torch.randn(R, D, generator=g), torch.randn(R, D, generator=g)
    t, adv = torch.rand(R, generator=g), torch.tensor([0.9, -0.4, 0.2, -1.0, 0.6, -0.1])
    v = (v_old + 0.05 * torch.randn(R, D, generator=g)).requires_grad_(True)  # near the old policy: some clipped
    for weighting in ("uniform", "t2", "ghuber"):
        v.grad = None
        loss, _ = awm_loss(awm_log_likelihood(v, u, t, weighting), awm_log_likelihood(v_old, u, t, weighting), adv, 0.02)
        loss.sum().backward()
        v64 = v.detach().double().requires_grad_(True)
        total = torch.zeros((), dtype=torch.float64)
        for i in range(R):
            def lik(w):
                m = ((w - u[i].double()) ** 2).mean()
                ti = t[i].double()
                return {"uniform": -m, "t2": -ti**2 * m, "ghuber": -ti * ((m + 1e-10) ** 0.25 - 1e-10**0.25) / 0.25}[weighting]
            rho = torch.exp(lik(v64[i]) - lik(v_old[i].double()).detach())
            a = adv[i].double()
            total = total + torch.maximum(-a * rho, -a * rho.clamp(1 - 0.02, 1 + 0.02))
        total.backward()
        close(v.grad, v64.grad, rel=2e-5)


# ------------------------------------------------------------------------------------------------
# DGPO
# ------------------------------------------------------------------------------------------------
def diffusion_dpo_loss(err_w, err_w_ref, err_l, err_l_ref, beta):
    """Diffusion-DPO (Wallace et al. 2024) as its public training code writes it."""
    model_diff, ref_diff = err_w - err_l, err_w_ref - err_l_ref
    return -torch.nn.functional.logsigmoid(-0.5 * beta * (model_diff - ref_diff))


def test_dgpo_with_one_positive_and_one_negative_is_diffusion_dpo():
    err = torch.tensor([0.8, 1.7], dtype=torch.float64)  # winner, loser (policy)
    err_ref = torch.tensor([1.0, 1.5], dtype=torch.float64)
    for beta in (1.0, 100.0, 5000.0):
        objective, sizes = dgpo_group_objective(err - err_ref, torch.tensor([1.0, -1.0]), torch.tensor([7, 7]), beta)
        assert sizes.tolist() == [2.0]
        close(objective, diffusion_dpo_loss(err[0], err_ref[0], err[1], err_ref[1], beta).reshape(1), rel=1e-12)


def test_dgpo_groups_are_separate_and_weights_are_advantages_over_group_size():
    delta = torch.tensor([0.1, -0.2, 0.3, 0.05, -0.4], dtype=torch.float64)
    adv = torch.tensor([1.5, -0.5, -1.0, 2.0, -2.0], dtype=torch.float64)
    groups = torch.tensor([3, 3, 3, 9, 9])
    objective, sizes = dgpo_group_objective(delta, adv, groups, beta=4.0)
    s3 = 4.0 / 3 * (1.5 * 0.1 + 0.5 * 0.2 - 1.0 * 0.3)  # Σ_{A>0}|A|δ − Σ_{A<0}|A|δ = Σ A·δ
    s9 = 4.0 / 2 * (2.0 * 0.05 + 2.0 * 0.4)
    close(objective, [math.log1p(math.exp(s3)), math.log1p(math.exp(s9))], rel=1e-12)
    assert sizes.tolist() == [3.0, 2.0]


def test_dgpo_clip_detaches_errors_that_moved_too_far_on_their_side():
    err_old = torch.zeros(4)
    err = torch.tensor([-0.5, 0.5, 0.5, -0.5])  # ρ = exp(e_old − e_θ) = e^0.5, e^−0.5, e^−0.5, e^0.5
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    # positives may lower their error by at most ε (ρ ≤ 1 + ε), negatives raise it by at most ε (ρ ≥ 1 − ε)
    assert dgpo_clip_mask(err, err_old, adv, 0.01).tolist() == [True, False, True, False]
    assert not dgpo_clip_mask(err, err_old, torch.zeros(4), 0.01).any()


def test_dgpo_gradient_matches_float64_autograd_of_the_formula():
    """The learner trains (G/β)·softplus((β/G)·Σ A_i·(e_θ,i − e_ref,i)) per group; its gradient per sample is
    σ(S)·A_i·∇e_θ,i — β sharpens the weight but does not scale the gradient."""
    g = torch.Generator().manual_seed(3)
    G, D, beta = 4, 3, 7.0
    u, v_ref = torch.randn(G, D, generator=g), torch.randn(G, D, generator=g)
    adv = torch.tensor([1.2, -0.3, 0.4, -1.3])
    v = torch.randn(G, D, generator=g, requires_grad=True)
    err, err_ref = ((u - v) ** 2).mean(1), ((u - v_ref) ** 2).mean(1)
    objective, sizes = dgpo_group_objective(err - err_ref, adv, torch.zeros(G, dtype=torch.long), beta)
    (sizes / beta * objective).sum().backward()
    v64 = v.detach().double().requires_grad_(True)
    e64 = ((u.double() - v64) ** 2).mean(1)
    s = beta / G * (adv.double() * (e64 - ((u.double() - v_ref.double()) ** 2).mean(1))).sum()
    (G / beta * torch.nn.functional.softplus(s)).backward()
    close(v.grad, v64.grad, rel=2e-5)
    expected = torch.sigmoid(s.detach()) * adv.double()[:, None] * (-2.0 / D) * (u.double() - v64.detach())
    close(v.grad, expected, rel=2e-5)


# ------------------------------------------------------------------------------------------------
# soft copies (NFT's θ_old, AWM's EMA, DGPO's ema_ref)
# ------------------------------------------------------------------------------------------------
def test_soft_copy_schedule_and_update():
    p = [torch.zeros(2)]
    keep = soft_keep(rate=0.001, ceiling=0.5, delay=0)
    copy = WeightCopy("old", p, keep)
    assert [keep(n) for n in (0, 1, 100, 499, 500, 10_000)] == [0.0, 0.001, 0.1, 0.499, 0.5, 0.5]
    delayed = soft_keep(rate=0.0075, ceiling=0.999, delay=75)  # NFT's OCR schedule
    assert [delayed(n) for n in (0, 75, 76, 275)] == [0.0, 0.0, 0.0075, 0.999]
    started = soft_keep(rate=0.005, ceiling=0.999, start=0.25)  # CRD's old policy: min(0.25 + 0.005·n, 0.999)
    close([started(n) for n in (0, 1, 100, 149, 150, 1000)], [0.25, 0.255, 0.75, 0.995, 0.999, 0.999])
    p[0] += torch.tensor([1.0, 2.0])
    copy.follow(p, 100)  # θ_c ← 0.1·θ_c + 0.9·θ
    close(copy.values[0], [0.9, 1.8])
    copy.follow(p, 0)  # λ = 0: the copy is θ exactly
    assert torch.equal(copy.values[0], p[0])


# ------------------------------------------------------------------------------------------------
# the training draws (t, ε)
# ------------------------------------------------------------------------------------------------
def test_draws_are_pure_functions_of_their_keys_and_stay_in_the_time_range(tmp_path):
    from flowgrpo.engine.learners.forward import DrawSpace, Sample

    trainer = analytic_trainer(tmp_path, "dgpo")
    learner, grid = trainer.learner, trainer.schedule.plan(0).sigmas[:-1].float()
    space = DrawSpace(iteration=0, grid=grid, shift=trainer.schedule.plan(0).shift, latent=(2,))
    a = Sample(batch=0, leaf=0, advantage=1.0, group=5, key=(2, 1))
    t, eps = learner.draws(a, 0, space)
    t2, eps2 = learner.draws(Sample(batch=3, leaf=9, advantage=-1.0, group=5, key=(2, 1)), 0, space)
    assert torch.equal(t, t2) and torch.equal(eps, eps2)  # the same key (a group's members): the same draws
    t3, _ = learner.draws(a, 1, space)
    assert not torch.equal(t, t3)  # a new inner epoch draws anew
    assert t.numel() == 4 and len(set(t.tolist())) == 4 and all(float(x) in grid.tolist() for x in t)
    assert float(t.min()) >= 0.78  # the preset's time_min: DGPO trains the high-noise end only
    for sampler in ("uniform", "logit_normal"):
        other = analytic_trainer(tmp_path / sampler, "awm", f"learner.time_sampler={sampler}", "learner.time_min=0.2",
                                 "learner.time_max=0.7", "learner.train_times=64")
        t, _ = other.learner.draws(a, 0, space)
        assert 0.2 <= float(t.min()) and float(t.max()) <= 0.7 and t.unique().numel() > 30
    few = analytic_trainer(tmp_path / "few", "diffusion_nft", "learner.time_min=0.9", "learner.train_times=4")
    with pytest.raises(ValueError, match="lower train_times or widen the range"):
        few.learner.draws(a, 0, space)


def test_the_truncated_logit_normal_is_the_logit_normal_restricted_to_the_range(tmp_path):
    """Inverse-CDF draws on [0.3, 0.9] have the distribution of shift(sigmoid(N(m, s))) conditioned on
    that range (compared with rejection sampling: largest CDF gap below 0.04 for 4,000 draws each)."""
    from flowgrpo.engine.learners.forward import DrawSpace, Sample
    import samplers

    trainer = analytic_trainer(tmp_path, "awm", "learner.time_sampler=logit_normal", "learner.time_min=0.3",
                               "learner.time_max=0.9", "learner.train_times=4000", "learner.logit_mean=0.5")
    space = DrawSpace(iteration=0, grid=torch.zeros(0), shift=trainer.schedule.plan(0).shift, latent=(2,))
    t, _ = trainer.learner.draws(Sample(0, 0, 0.0, 0, (0, 0)), 0, space)
    direct = samplers.shift_sigmas(torch.sigmoid(0.5 + torch.randn(40_000, generator=torch.Generator().manual_seed(0),
                                                                    dtype=torch.float64)), 3.0)
    direct = direct[(direct >= 0.3) & (direct <= 0.9)][:4000].float()
    grid = torch.linspace(0.3, 0.9, 61)
    gap = ((t[None, :] <= grid[:, None]).float().mean(1) - (direct[None, :] <= grid[:, None]).float().mean(1)).abs().max()
    assert float(gap) < 0.04, float(gap)


# ------------------------------------------------------------------------------------------------
# composition: presets x model configs, forward-process learners x window and tree plans
# ------------------------------------------------------------------------------------------------
def test_every_preset_composes_with_every_model_config():
    from flowgrpo.config import load_config, preset_plan, resolve
    from flowgrpo.models.families import FAMILIES
    from flowgrpo.run.paths import configs_dir

    presets = sorted(p.stem for p in (configs_dir() / "presets").glob("*.yaml"))
    models = sorted(p.stem for p in (configs_dir() / "models").glob("*.yaml"))
    assert {"diffusion_nft", "awm", "dgpo"} <= set(presets) and {"sd3_5_medium", "flux_dev", "wan2_1_t2v_1_3b"} <= set(models)
    for model in models:
        family = load_config(None, model, []).model.family
        default = "default_t2v" if FAMILIES[family].modality == "video" else "default"
        extra = ["rewards=[{name: analytic_hit}]", "prompts=analytic-train", "eval.reward=analytic_hit"] if family == "analytic" else []
        for preset in presets:
            resolved = resolve(preset, model, extra, default=default)
            cfg = resolved.config
            # the preset's whole plan (its recipe may change keys of it), with a moving window where it writes one: in
            # its file, or in the recipe composed for this model (a family's recipe may give that family a window, as
            # flow_grpo's qwen_image_edit takes its official launch's)
            assert cfg.model.family == family and {"num_steps", "kernel"} <= set(cfg.sampling.plan)
            written = preset_plan(preset)[1] is not None or (bool(cfg.sampling.window) and any(
                layer.startswith("recipe") for key, layer in resolved.provenance.items() if key.startswith("sampling.window.")))
            assert bool(cfg.sampling.window) == written, (preset, model)


# the learner presets' plan (DPM-Solver++(2M), independent noise) merges under these: solver and initial_noise are set back
# to compose_plan's defaults (Euler, a group's shared x_T), which MixGRPO's and BranchGRPO's plans take
WINDOW_AND_TREE_PLANS = {
    "mixgrpo": ["sampling.plan={num_steps: 8, kernel: flow_sde, eta: 0.7, group_size: 4, solver: euler, "
                "initial_noise: shared}",
                "sampling.window={size: 4, strategy: progressive, interval: 1, stride: 1}"],  # moves every iteration
    "branchgrpo": ["sampling.plan={num_steps: 8, kernel: dance_sde, eta: 0.3, splits: [0, 3], branch_factor: 2, "
                   "group_size: 1, solver: euler, initial_noise: shared}"],
}


@pytest.mark.parametrize("method", sorted(WINDOW_AND_TREE_PLANS))
@pytest.mark.parametrize("learner", ["diffusion_nft", "awm", "dgpo"])
def test_forward_learners_train_on_window_and_tree_plans(learner, method, tmp_path):
    """A forward-process learner takes the leaves of any plan: an SDE window for exploration (MixGRPO's, which
    moves), or a BranchGRPO tree whose 4 leaves per prompt form the group (depth-wise leaf advantages). Tied groups
    train (A = 0) so that every leaf counts (skipping them: tests/engine/test_tied_and_diverse.py)."""
    trainer = analytic_trainer(tmp_path, learner, *WINDOW_AND_TREE_PLANS[method], "train.iterations=3",
                               "learner.train_times=2", "learner.time_min=0.0", "eval.every=0", "log.samples_every=0",
                               "advantage.tied_groups=train", "log.gallery=false")
    schedule = trainer.schedule  # the plan the config builds (its positions read without moving the window)
    if method == "mixgrpo":
        assert schedule.window.interval == 1 and schedule.window.size == 4
        plan = schedule.plan_at(1)
        assert [i for i, s in enumerate(plan.steps) if s.stochastic] == [1, 2, 3, 4]
    else:
        plan = schedule.plan_at(None)
        assert schedule.window is None and plan.counts()["leaves"] == 4
    assert {s.solver for s in plan.steps} == {"euler"}  # not the learner presets' DPM-Solver++(2M)
    before = [p.detach().clone() for p in trainer.policy.params]
    last = trainer.train()
    assert last["trained_samples"] == 8 * 4 and torch.isfinite(torch.tensor(last["loss"]))
    assert not trainer.learner.needs_transitions and last["nfe/train_backward"] == 3 * 8 * 4 * 2
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.params))


def test_awm_trains_on_sa_solver_rollouts(tmp_path):
    """AWM's real-model rollouts (SA-Solver, noise τ = 0.4 on the steps landing in [0.3, 0.9], AWM's grid edits) on the
    analytic world through the trainer: the plan the config builds, one model call a step, every leaf trained, the
    weights move."""
    plan = "{group_size: 4, num_steps: 8, solver: sa_solver, sa_tau: 0.4, sa_tau_window: [0.3, 0.9], grid_ends: awm}"
    trainer = analytic_trainer(tmp_path, "awm", f"sampling.plan={plan}", "train.iterations=2",
                               "learner.train_times=2", "learner.time_min=0.0", "advantage.tied_groups=train",
                               "eval.every=0", "log.samples_every=0", "log.gallery=false")
    plan_0 = trainer.schedule.plan(0)
    assert plan_0.sigmas[0] == 1 - 1e-3 and {s.solver for s in plan_0.steps} == {"sa_solver"}
    assert any(s.sa_tau == 0.4 for s in plan_0.steps) and any(s.sa_tau == 0 for s in plan_0.steps)
    before = [p.detach().clone() for p in trainer.policy.params]
    last = trainer.train()
    assert last["trained_samples"] == 8 * 4 and torch.isfinite(torch.tensor(last["loss"]))
    assert last["nfe/rollout"] == 2 * 8 * 4 * 8 and last["nfe/train_backward"] == 2 * 8 * 4 * 2
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.params))


def test_dgpo_rolls_out_with_ema_ref_after_the_configured_steps(tmp_path):
    """learner.dgpo.sample_with_ema_after: the reference code's switch of its sampler to the EMA. Before the step count
    the rollout uses θ (no sampling copy), from it on ema_ref, which lags θ; 0 never switches."""
    trainer = analytic_trainer(tmp_path, "dgpo", "learner.dgpo.sample_with_ema_after=2", "train.iterations=3",
                               "eval.every=0", "log.samples_every=0", "log.gallery=false", "learner.time_min=0.0")
    learner, policy = trainer.learner, trainer.policy
    assert learner.sampling_copy is None
    trainer.train()
    assert policy.optimizer_steps >= 2 and learner.sampling_copy is learner.ema_ref
    assert any(not torch.equal(a, b) for a, b in zip(learner.ema_ref.values, policy.params))
    never = analytic_trainer(tmp_path / "never", "dgpo")
    never.policy.optimizer_steps = 10**6
    assert never.learner.sampling_copy is None  # 0: always the current weights


@pytest.mark.parametrize("time_max, first, mean", [(0.99, 1, 0.755), (1.0, 0, 0.757)], ids=["geneval_ocr", "pickscore"])
def test_awms_stratified_draw_on_its_14_step_grid(tmp_path, time_max, first, mean):
    """AWM's draw (scxue/advantage_weighted_matching, train_sd3_awm.py): the 14-step scheduler grid's indices from
    ``first`` to 11 cut into 6 runs ({1}, {2, 3}, ..., {10, 11} for GenEval/OCR; {0, 1}, ... for PickScore), one index
    from each. GenEval/OCR: t in [0.357, 0.973], t = 0.973 always drawn, t = 1 never, mean t 0.755 (exact over the
    runs, and within 3 standard errors over 2,000 samples)."""
    from flowgrpo.engine.learners.forward import DrawSpace, Sample
    from samplers.grids import time_grid

    trainer = analytic_trainer(tmp_path, "awm", "learner.time_sampler=stratified", "learner.time_min=0.3",
                               f"learner.time_max={time_max}", "learner.train_times=6")
    grid = time_grid(14, 3.0, spacing="scheduler")[:-1].float()
    space = DrawSpace(iteration=0, grid=grid, shift=3.0, latent=(2,))
    draws = torch.stack([trainer.learner.draws(Sample(0, i, 0.0, 0, (i, 0)), 0, space)[0] for i in range(2000)])
    allowed = set(grid[first:12].tolist())
    assert set(draws.flatten().tolist()) == allowed  # the support: exactly the indices first..11
    runs = [[first], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]] if first == 1 else [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    for k, run in enumerate(runs):  # one draw from each run, in grid order
        assert set(draws[:, k].tolist()) == {float(grid[i]) for i in run}
    if first == 1:
        assert (draws[:, 0] == grid[1]).all() and float(grid[1]) == pytest.approx(0.973, abs=5e-4)
        assert float(grid[11]) == pytest.approx(0.357, abs=5e-4) and not (draws == 1.0).any()
    exact = sum(float(grid[run].mean()) for run in runs) / len(runs)
    assert exact == pytest.approx(mean, abs=1e-3)
    se = draws.mean(1).std().item() / 2000 ** 0.5
    assert abs(draws.mean().item() - exact) < 3 * se + 1e-6


def test_awm_draws_its_times_from_the_scheduler_grid_not_the_edited_rollout_ends():
    """AWM's SA-Solver rollout edits its grid's ends (t_0 = 1 − 1e-3, t_-2 = t_-3/2) on the scheduler's sigmas, but its
    training reads the scheduler's unedited timesteps (train_sd3_awm.py:909, 1180): the PickScore draw at index 0 is
    t = 1 exactly. The rollout keeps the edit; the draw space does not (fails if DrawSpace reads plan.sigmas)."""
    from types import SimpleNamespace

    import samplers
    from flowgrpo.engine.learners.forward import DrawSpace
    from samplers.grids import time_grid

    plan = samplers.compose_plan(14, shift=3.0, grid="scheduler", kernel="ode", solver="sa_solver", grid_ends="awm",
                                 group_size=2)
    assert float(plan.sigmas[0]) == pytest.approx(1 - 1e-3, rel=1e-12)
    space = DrawSpace.of(SimpleNamespace(plan=plan, iteration=0), (2,))
    assert torch.equal(space.grid, time_grid(14, 3.0, spacing="scheduler")[:-1].float())
    assert float(space.grid[0]) == 1.0
    exact = samplers.compose_plan(14, shift=3.0, grid="scheduler", kernel="ode", solver="sa_solver", group_size=2)
    assert exact.unedited_sigmas is None and torch.equal(DrawSpace.of(SimpleNamespace(plan=exact, iteration=0), (2,)).grid,
                                                         exact.sigmas[:-1].float())


@pytest.mark.parametrize("share_times", ["draw", "iteration"])
def test_dgpo_code_draws_one_set_of_times_an_iteration_for_every_group(tmp_path, share_times):
    """DGPO's code draws its K training times once an inner epoch for every group (rank 0's random.sample over grid
    indices 0..trunc_steps, broadcast: train_sd3_dgpo.py:67-72, 1062-1064) while ε stays per group
    (learner.share_times=iteration); share_times=draw gives each group its own times. Another epoch draws anew."""
    from flowgrpo.engine.learners.forward import DrawSpace, Sample
    from samplers.grids import time_grid

    trainer = analytic_trainer(tmp_path, "dgpo", f"learner.share_times={share_times}", "learner.time_min=0.0")
    space = DrawSpace(iteration=3, grid=time_grid(10, 3.0, spacing="scheduler")[:-1].float(), shift=3.0, latent=(2,))
    draw = trainer.learner.draws
    t = {g: draw(Sample(0, g, 0.0, g, (g, 0)), 0, space) for g in range(8)}
    same_group = draw(Sample(0, 99, 0.0, 0, (0, 0)), 0, space)
    assert torch.equal(same_group[0], t[0][0]) and torch.equal(same_group[1], t[0][1])  # a group shares (t, ε)
    assert len({tuple(v[1].flatten().tolist()) for v in t.values()}) == 8  # ε: each group its own
    times = {tuple(v[0].tolist()) for v in t.values()}
    if share_times == "iteration":
        assert len(times) == 1
        assert not torch.equal(draw(Sample(0, 0, 0.0, 0, (0, 0)), 1, space)[0], t[0][0])  # the next epoch: anew
    else:
        assert len(times) > 4  # 8 groups, 4 of 10 points each
