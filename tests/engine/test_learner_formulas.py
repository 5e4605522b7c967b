"""The GRPO learner's formulas (flowgrpo/engine/loss.py, flowgrpo/engine/credit.py, samplers' node values)
against numbers worked out by hand from docs/math.md §2–3, in the style of torchtune's PPO-loss tests.

Every expected value below is either hand arithmetic (shown in the comments) or an independent
float64 transcription of a docs/math.md formula; no expected value is produced by the function under
test. Run: pytest tests/engine/test_learner_formulas.py -q -p no:cacheprovider
"""

import math

import pytest
import torch

import samplers
from flowgrpo.engine.credit import (
    best_of_n_mask,
    combine_rewards,
    gdpo,
    group_zscore,
    path_weighted_values,
    tree_advantages,
)
from flowgrpo import likelihood
from flowgrpo.engine.loss import clipped_policy_loss, gaussian_kl, kl_masked_policy_loss, ppo_clip, step_weights
from tolerance import ulp_tolerance

NAN = float("nan")
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def close(actual, expected, rtol=1e-6, atol=None):
    """atol by default: 8 ulps of the largest expected value in the dtype `actual` was computed in (at least
    1e-7): an element that should be 0, such as a z-score at the group mean, is a difference of numbers of
    about that size and rounds like them, which rtol (relative to 0) does not cover."""
    expected = torch.as_tensor(expected, dtype=torch.float64)
    if atol is None:
        atol = max(1e-7, ulp_tolerance(expected, 8, actual.dtype))
    torch.testing.assert_close(actual.double(), expected, rtol=rtol, atol=atol, equal_nan=True)


def _terms_at_means(x_next, mean_theta, std, reduce, mean_old=None):
    """The production likelihood terms (flowgrpo.likelihood's reference) of kernels whose mean is given:
    μ = a·x + b·v with a = 0, b = 1 and v = μ_θ is μ_θ exactly, whatever x."""
    return likelihood.transition_terms(torch.zeros_like(mean_theta), mean_theta, x_next, 0.0, 1.0, std,
                                       mu_old=mean_old, reduce=reduce, backend="reference")


def transition_loss(*, x_next, mean_theta, std, log_prob_old, advantages, clip_range, reduce="mean",
                    ratio_form="plain", mean_old=None):
    """The transition learner's per-transition loss at given means, from the production pieces it uses
    (flowgrpo/engine/learners/transition.py): the likelihood terms, then ``clipped_policy_loss``."""
    terms = _terms_at_means(x_next, mean_theta, std, reduce, mean_old)
    log_ratio_plain = terms.log_prob - log_prob_old.to(terms.log_prob)
    if ratio_form == "guard":
        if terms.guard is None:
            raise ValueError("loss.ratio=guard needs μ_old stored in the rollout")
        return clipped_policy_loss(terms.guard, log_ratio_plain, advantages, clip_range)
    return clipped_policy_loss(log_ratio_plain, log_ratio_plain, advantages, clip_range)


def guard_log_ratio(x_next, mean_theta, mean_old, std, reduce):
    """GRPO-Guard's log ρ̂ as the likelihood terms compute it."""
    return _terms_at_means(x_next, mean_theta, std, reduce, mean_old).guard


def gaussian_log_prob64(x_next, mean, std, reduce):
    """docs/math.md §1 log-density, float64, written out independently of samplers.log_prob."""
    d = x_next[0].numel()
    sq = ((x_next.double() - mean.double()) ** 2).flatten(1).sum(1)
    s = std.double()
    per_elem = -sq / (2 * s**2) - d * (torch.log(s) + HALF_LOG_2PI)
    return per_elem / d if reduce == "mean" else per_elem


# ------------------------------------------------------------------------------------------------
# 1. PPO clip
# ------------------------------------------------------------------------------------------------
def test_ppo_clip_four_cases_values_and_zero_gradient_when_clipped():
    # ε = 0.2 → trust region [0.8, 1.2]. L = max(−A·ρ, −A·clip(ρ)).
    #   A = +2, ρ = 1.5: −3.0 vs −2.4 → −2.4 (clipped, dL/dρ = 0)
    #   A = +2, ρ = 0.5: −1.0 vs −1.6 → −1.0 (not clipped, dL/dρ = −A = −2)
    #   A = −2, ρ = 0.5: +1.0 vs +1.6 → +1.6 (clipped, dL/dρ = 0)
    #   A = −2, ρ = 1.5: +3.0 vs +2.4 → +3.0 (not clipped, dL/dρ = −A = +2)
    #   A = +2, ρ = 1.1: inside the region, −2.2, dL/dρ = −2
    ratio = torch.tensor([1.5, 0.5, 0.5, 1.5, 1.1], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([2.0, 2.0, -2.0, -2.0, 2.0], dtype=torch.float64)
    loss = ppo_clip(ratio, adv, 0.2)
    close(loss.detach(), [-2.4, -1.0, 1.6, 3.0, -2.2], rtol=1e-12, atol=1e-12)
    loss.sum().backward()
    assert ratio.grad.tolist() == [0.0, -2.0, 0.0, 2.0, -2.0]


def test_flow_dppo_kl_mask_drops_only_steps_outside_the_region_that_move_further():
    """Flow-DPPO: −A·ρ unclipped; dropped (0, no gradient) where KL ≥ δ and ρ moves on A's side. δ = 1e-5:
      ρ = 1.2, A = +1, KL 2e-5: outside, moving further up      -> dropped: 0
      ρ = 0.8, A = +1, KL 2e-5: outside, moving back toward π_old -> kept: −0.8, dL/dlogρ = −A·ρ = −0.8
      ρ = 1.2, A = −1, KL 2e-5: outside, moving back            -> kept: +1.2, dL/dlogρ = +1.2
      ρ = 0.8, A = −1, KL 2e-5: outside, moving further down    -> dropped: 0
      ρ = 1.5, A = +2, KL 5e-6: inside, unclipped               -> −3.0 (PPO at ε = 0.2 would give −2.4), grad −3.0"""
    log_ratio = torch.tensor([1.2, 0.8, 1.2, 0.8, 1.5], dtype=torch.float64).log().requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0], dtype=torch.float64)
    kl = torch.tensor([2e-5, 2e-5, 2e-5, 2e-5, 5e-6], dtype=torch.float64)
    loss, diag = kl_masked_policy_loss(log_ratio, log_ratio.detach(), adv, kl, 1e-5)
    close(loss.detach(), [0.0, -0.8, 1.2, 0.0, -3.0], rtol=1e-12, atol=1e-12)
    loss.sum().backward()
    close(log_ratio.grad, [0.0, -0.8, 1.2, 0.0, -3.0], rtol=1e-12, atol=1e-12)
    assert diag["clipped_high"].tolist() == [1, 0, 0, 0, 0] and diag["clipped_low"].tolist() == [0, 0, 0, 1, 0]
    # the threshold is inclusive and the mask follows it: at δ = 3e-5 nothing is outside, every term is −A·ρ
    loose, _ = kl_masked_policy_loss(log_ratio.detach(), log_ratio.detach(), adv, kl, 3e-5)
    close(loose, [-1.2, -0.8, 1.2, 0.8, -3.0], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# 2. transition_loss, plain ratio
# ------------------------------------------------------------------------------------------------
# Two transitions, D = 2 latent elements each.
#   row 0: x' = [1, 2], μ_old = [0, 0], s = 0.5, μ_θ = [0.1, 0.2]
#     Σ(x'−μ_old)² = 5, Σ(x'−μ_θ)² = 0.81 + 3.24 = 4.05; 2s² = 0.5
#     mean: lp_old = −5/0.5/2 − ln 0.5 − ½ln2π = −5 + ln2 − ½ln2π; log ρ = (5 − 4.05)/0.5/2 = 0.95
#     sum:  lp_old = −10 + 2 ln2 − ln2π;                               log ρ = 1.9
#   row 1: x' = μ_old = [−1, 1], s = 2, μ_θ = [0, 1]
#     Σ(x'−μ_old)² = 0, Σ(x'−μ_θ)² = 1; 2s² = 8
#     mean: lp_old = −ln2 − ½ln2π; log ρ = −1/8/2 = −0.0625
#     sum:  lp_old = −2 ln2 − ln2π; log ρ = −0.125
X_NEXT = torch.tensor([[1.0, 2.0], [-1.0, 1.0]], dtype=torch.float64)
MEAN_OLD = torch.tensor([[0.0, 0.0], [-1.0, 1.0]], dtype=torch.float64)
MEAN_THETA = torch.tensor([[0.1, 0.2], [0.0, 1.0]], dtype=torch.float64)
STD = torch.tensor([0.5, 2.0], dtype=torch.float64)
LN2, LN2PI = math.log(2.0), math.log(2 * math.pi)
LP_OLD = {
    "mean": [-5 + LN2 - 0.5 * LN2PI, -LN2 - 0.5 * LN2PI],
    "sum": [-10 + 2 * LN2 - LN2PI, -2 * LN2 - LN2PI],
}
LOG_RATIO = {"mean": [0.95, -0.0625], "sum": [1.9, -0.125]}


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_transition_loss_plain_ratio_hand_gaussian(reduce):
    mean_theta = MEAN_THETA.clone().requires_grad_(True)
    lp_old = torch.tensor(LP_OLD[reduce], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    # wide clip range: nothing clipped, L = −A·ρ = [−e^{log ρ_0}, +e^{log ρ_1}]
    loss, diag = transition_loss(
        x_next=X_NEXT, mean_theta=mean_theta, std=STD, log_prob_old=lp_old, advantages=adv,
        clip_range=10.0, reduce=reduce,
    )
    lr = LOG_RATIO[reduce]
    close(diag["log_ratio"], lr, rtol=1e-12, atol=1e-12)
    close(loss.detach(), [-math.exp(lr[0]), math.exp(lr[1])], rtol=1e-12, atol=1e-12)
    close(diag["approx_kl"], [0.5 * lr[0] ** 2, 0.5 * lr[1] ** 2], rtol=1e-12, atol=1e-12)
    # dL_0/dμ_θ = −ρ_0·∂lp_θ/∂μ_θ = −ρ_0·(x' − μ_θ)/s² (/D for mean) = −ρ_0·[0.9, 1.8]/0.25 (/2)
    loss[0].backward()
    per_d = 2 if reduce == "mean" else 1
    close(mean_theta.grad[0], [-math.exp(lr[0]) * 3.6 / per_d, -math.exp(lr[0]) * 7.2 / per_d], rtol=1e-12)
    assert mean_theta.grad[1].abs().max() == 0  # rows do not mix

    # ε = 0.2: row 0 (A > 0, ρ = e^0.95 ≈ 2.59 > 1.2) is clipped to −1.2; row 1 (ρ ≈ 0.94) is not
    loss, diag = transition_loss(
        x_next=X_NEXT, mean_theta=MEAN_THETA, std=STD, log_prob_old=lp_old, advantages=adv,
        clip_range=0.2, reduce=reduce,
    )
    close(loss, [-1.2, math.exp(lr[1])], rtol=1e-12, atol=1e-12)
    assert diag["clipped_high"].tolist() == [1.0, 0.0]
    assert diag["clipped_low"].tolist() == [0.0, 0.0]


def test_transition_loss_ratio_is_exactly_one_at_the_rollout_mean():
    # the ratio == 1 contract: lp_old is what the rollout stored (log_prob at μ_old, fp32), and the
    # recompute with μ_θ == μ_old must give log ρ = 0 and L = −A bit for bit
    gen = torch.Generator().manual_seed(0)
    x_next = torch.randn(4, 3, 2, 2, generator=gen)
    mean_old = torch.randn(4, 3, 2, 2, generator=gen)
    std = torch.rand(4, generator=gen) + 0.05
    adv = torch.tensor([1.5, -0.5, 0.0, 3.0])
    for reduce in ("mean", "sum"):
        lp_old = samplers.log_prob(x_next, mean_old, std, reduce)
        loss, diag = transition_loss(
            x_next=x_next, mean_theta=mean_old.clone(), std=std, log_prob_old=lp_old,
            advantages=adv, clip_range=1e-4, reduce=reduce,
        )
        assert torch.equal(diag["log_ratio"], torch.zeros(4))
        assert torch.equal(loss, -adv)


# ------------------------------------------------------------------------------------------------
# 3. GRPO-Guard
# ------------------------------------------------------------------------------------------------
def _guard_inputs(seed, m=3):
    gen = torch.Generator().manual_seed(seed)
    shape = (m, 2, 3)
    x_next = torch.randn(shape, generator=gen, dtype=torch.float64)
    mean_old = torch.randn(shape, generator=gen, dtype=torch.float64)
    mean_theta = mean_old + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
    std = torch.rand(m, generator=gen, dtype=torch.float64) + 0.1
    return x_next, mean_theta, mean_old, std


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_guard_log_ratio_matches_its_closed_form(reduce):
    # docs/math.md §3: log ρ̂ = reduce_D(ε_s·δ) = s·(lp_θ − lp_old) + reduce_D(δ²)/(2s)
    x_next, mean_theta, mean_old, std = _guard_inputs(1)
    lp_theta = gaussian_log_prob64(x_next, mean_theta, std, reduce)
    lp_old = gaussian_log_prob64(x_next, mean_old, std, reduce)
    delta_sq = ((mean_theta - mean_old) ** 2).flatten(1)
    red = delta_sq.mean(1) if reduce == "mean" else delta_sq.sum(1)
    expected = std * (lp_theta - lp_old) + red / (2 * std)
    close(guard_log_ratio(x_next, mean_theta, mean_old, std, reduce), expected, rtol=1e-10, atol=1e-12)
    # transition_loss(ratio="guard") uses exactly that log-ratio
    _, diag = transition_loss(
        x_next=x_next, mean_theta=mean_theta, std=std, log_prob_old=lp_old,
        advantages=torch.ones(3, dtype=torch.float64), clip_range=1e-4, reduce=reduce,
        ratio_form="guard", mean_old=mean_old,
    )
    close(diag["log_ratio"], expected, rtol=1e-10, atol=1e-12)


def test_guard_needs_mean_old():
    x_next, mean_theta, _, std = _guard_inputs(2)
    with pytest.raises(ValueError, match="μ_old"):
        transition_loss(
            x_next=x_next, mean_theta=mean_theta, std=std, log_prob_old=torch.zeros(3),
            advantages=torch.ones(3), clip_range=1e-4, ratio_form="guard",
        )


def test_guard_log_ratio_is_per_sample():
    # the public code's bug (its issue #244) averaged the bias term over the batch; here changing
    # sample 1 must leave samples 0 and 2 bit-identical
    x_next, mean_theta, mean_old, std = _guard_inputs(3)
    before = guard_log_ratio(x_next, mean_theta, mean_old, std, "mean")
    x2, mt2, mo2, s2 = (t.clone() for t in (x_next, mean_theta, mean_old, std))
    x2[1] += 3.0
    mt2[1] -= 0.7
    mo2[1] *= 2.0
    s2[1] = 0.01
    after = guard_log_ratio(x2, mt2, mo2, s2, "mean")
    assert after[0] == before[0] and after[2] == before[2]
    assert abs(float(after[1] - before[1])) > 1e-3


def test_guard_log_ratio_has_zero_mean_over_rollout_noise_plain_does_not():
    # x' = μ_old + s·ε: log ρ̂ = mean_d(ε_d·δ_d) has mean 0 and std sqrt(Σδ²)/D per draw.
    # The plain log-ratio has mean −mean_d(δ²)/(2s²) (minus the KL) and std sqrt(Σδ²)/(D·s).
    n, s = 20_000, 0.5
    delta = torch.tensor([0.3, -0.2, 0.5, 0.1], dtype=torch.float64)  # mean_d(δ²) = 0.0975
    gen = torch.Generator().manual_seed(4)
    mean_old = torch.randn(4, dtype=torch.float64, generator=gen).expand(n, 4)
    eps = torch.randn(n, 4, dtype=torch.float64, generator=gen)
    x_next = mean_old + s * eps
    mean_theta = mean_old + delta
    std = torch.full((n,), s, dtype=torch.float64)
    guard = guard_log_ratio(x_next, mean_theta, mean_old, std, "mean")
    se = math.sqrt(float((delta**2).sum())) / 4 / math.sqrt(n)  # ≈ 0.0022
    assert abs(float(guard.mean())) < 5 * se
    close(guard.std(unbiased=False), se * math.sqrt(n), rtol=0.03)
    plain = gaussian_log_prob64(x_next, mean_theta, std, "mean") - gaussian_log_prob64(x_next, mean_old, std, "mean")
    bias = -0.0975 / (2 * s**2)  # −0.195, ≈ 45 standard errors away from 0
    assert abs(float(plain.mean()) - bias) < 5 * se / s


@pytest.mark.parametrize("reduce,per_d", [("mean", 6), ("sum", 1)])
def test_guard_gradient_is_eps_s_over_d(reduce, per_d):
    x_next, mean_theta, mean_old, std = _guard_inputs(5)
    mean_theta = mean_theta.clone().requires_grad_(True)
    guard_log_ratio(x_next, mean_theta, mean_old, std, reduce).sum().backward()
    eps_s = (x_next - mean_old) / std.view(-1, 1, 1)
    close(mean_theta.grad, eps_s / per_d, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------------------------------------
# 4. Gaussian KL
# ------------------------------------------------------------------------------------------------
def test_gaussian_kl_hand_numbers():
    # row 0: μa − μb = [1, 2], s = 0.5: mean (1 + 4)/2 = 2.5 → 2.5/(2·0.25) = 5;  sum 5/0.5 = 10
    # row 1: μa − μb = [2, −2], s = 2:  mean 4 → 4/(2·4) = 0.5;                  sum 8/8 = 1
    mean_a = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    mean_b = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    std = torch.tensor([0.5, 2.0])
    close(gaussian_kl(mean_a, mean_b, std, "mean"), [5.0, 0.5])
    close(gaussian_kl(mean_a, mean_b, std, "sum"), [10.0, 1.0])
    assert torch.equal(gaussian_kl(mean_a, mean_a, std, "mean"), torch.zeros(2))


# ------------------------------------------------------------------------------------------------
# 5. Step weights
# ------------------------------------------------------------------------------------------------
def test_step_weights_none_and_inv_delta():
    sigma = torch.tensor([1.0, 0.75, 0.5])
    sigma_next = torch.tensor([0.75, 0.5, 0.0])
    eta = torch.full((3,), 0.7)
    kernels = ["flow_sde"] * 3
    assert torch.equal(step_weights("none", kernels, sigma, sigma_next, eta), torch.ones(3))
    # Δ = 0.25, 0.25, 0.5 → 4, 4, 2
    assert step_weights("inv_delta", kernels, sigma, sigma_next, eta).tolist() == [4.0, 4.0, 2.0]
    with pytest.raises(ValueError, match="step_weight"):
        step_weights("inverse_delta", kernels, sigma, sigma_next, eta)


def _sage_g(kernel, sigma, sigma_next, eta, sigma_1):
    """|∂μ/∂v|/s from docs/math.md §1, float64 python floats."""
    delta = sigma - sigma_next
    if kernel == "flow_sde":
        sigma_t = eta * math.sqrt(sigma / (1 - (sigma_1 if sigma == 1 else sigma)))
        dmu_dv = -delta * (1 + sigma_t**2 * (1 - sigma) / (2 * sigma))
        return abs(dmu_dv) / (sigma_t * math.sqrt(delta))
    assert kernel == "dance_sde"
    dmu_dv = -delta * (1 + eta**2 * (1 - sigma) / (2 * sigma))
    return abs(dmu_dv) / (eta * math.sqrt(delta))


def test_step_weights_sage_equalizer_against_math():
    grid = samplers.time_grid(10, 3.0).tolist()
    sigma_1 = grid[1]
    # five transitions (odd count: the median is a single middle element): three flow_sde steps,
    # σ = 1 among them (σ_1 in the denominator), and two dance_sde steps
    rows = [("flow_sde", 0, 0.7), ("flow_sde", 3, 0.7), ("flow_sde", 7, 0.7),
            ("dance_sde", 2, 0.3), ("dance_sde", 8, 0.3)]
    sigma = torch.tensor([grid[i] for _, i, _ in rows], dtype=torch.float64)
    sigma_next = torch.tensor([grid[i + 1] for _, i, _ in rows], dtype=torch.float64)
    eta = torch.tensor([e for _, _, e in rows], dtype=torch.float64)
    g = [_sage_g(k, grid[i], grid[i + 1], e, sigma_1) for k, i, e in rows]
    med = sorted(g)[2]
    expected = [med / gi for gi in g]
    got = step_weights("sage", [k for k, _, _ in rows], sigma, sigma_next, eta)
    assert got.dtype == torch.float32
    close(got, expected, rtol=1e-6)
    assert sorted(got.tolist())[2] == 1.0  # the median step keeps weight one
    # four steps (even count): the lower middle g, as torch.median in SAGE's code (not the interpolated one)
    four = step_weights("sage", [k for k, _, _ in rows[:4]], sigma[:4], sigma_next[:4], eta[:4])
    close(four, [sorted(g[:4])[1] / gi for gi in g[:4]], rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# 6. Group z-score
# ------------------------------------------------------------------------------------------------
def test_group_zscore_hand_example_group_and_global_std():
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0])
    groups = torch.tensor([0, 0, 1, 1])
    # group means 1.5 and 3.5, population std 0.5 in both → ±0.5/(0.5 + 1e-4)
    adv, stats = group_zscore(rewards, groups)
    a = 0.5 / (0.5 + 1e-4)
    close(adv, [-a, a, -a, a])
    assert stats["zero_std_group_fraction"] == 0.0 and stats["nan_reward_fraction"] == 0.0
    # global std: population std of [1, 2, 3, 4] = √1.25; the means stay per group
    adv, _ = group_zscore(rewards, groups, std="global")
    b = 0.5 / (math.sqrt(1.25) + 1e-4)
    close(adv, [-b, b, -b, b])
    # none (Dr. GRPO): the group-mean baseline alone, the reward's scale kept
    adv, _ = group_zscore(rewards, groups, std="none")
    assert adv.tolist() == [-0.5, 0.5, -0.5, 0.5]
    with pytest.raises(ValueError, match="std="):
        group_zscore(rewards, groups, std="batch")


def test_group_zscore_zero_std_group_gives_exact_zeros():
    rewards = torch.tensor([1.0, 2.0, 3.0, 3.0, 7.0, 7.0, 7.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    adv, stats = group_zscore(rewards, groups)
    a = 0.5 / (0.5 + 1e-4)
    close(adv[:2], [-a, a])
    assert adv[2:].tolist() == [0.0] * 5
    assert stats["zero_std_group_fraction"] == pytest.approx(2 / 3)


def test_group_zscore_nan_rewards_stay_nan_and_are_left_out_of_the_statistics():
    # group 0 = [1, NaN, 3] must give the same as [1, 3]: mean 2, std 1 → ∓1/(1 + 1e-4)
    rewards = torch.tensor([1.0, NAN, 3.0, 5.0, 9.0])
    groups = torch.tensor([0, 0, 0, 1, 1])
    adv, stats = group_zscore(rewards, groups)
    a = 1 / (1 + 1e-4)
    b = 2 / (2 + 1e-4)  # group 1 = [5, 9]: mean 7, std 2
    close(adv, [-a, NAN, a, -b, b])
    without, _ = group_zscore(rewards[[0, 2, 3, 4]], groups[[0, 2, 3, 4]])
    assert torch.equal(adv[[0, 2, 3, 4]], without)
    assert stats["nan_reward_fraction"] == pytest.approx(0.2)
    # global std over the valid rewards only: [1, 3, 5, 9] has mean 4.5, deviations
    # [−3.5, −1.5, 0.5, 4.5], population variance (12.25 + 2.25 + 0.25 + 20.25)/4 = 8.75
    adv, _ = group_zscore(rewards, groups, std="global")
    c = math.sqrt(8.75) + 1e-4
    close(adv, [-1 / c, NAN, 1 / c, -2 / c, 2 / c])


# ------------------------------------------------------------------------------------------------
# 7. GDPO vs plain weighted sum
# ------------------------------------------------------------------------------------------------
# Two groups of three, two rewards on very different scales. With eps = 0 and values (0, 1, 2)-like
# spacing, each group z-score is a permutation of [−1, 0, 1]·√1.5 (population std √(2/3)).
#   r0 = [0, 1, 2 | 2, 0, 1]        → z0 = [−1, 0, 1 | 1, −1, 0]·√1.5
#   r1 = [20, 0, 10 | 10, 20, 0]    → z1 = [1, −1, 0 | 0, 1, −1]·√1.5
#   z0 + z1 = [0, −1, 1 | 1, 0, −1]·√1.5: batch mean 0, population std √1.5·√(4/6) = 1
#   → GDPO = [0, −1, 1, 1, 0, −1]·√1.5
R0 = torch.tensor([0.0, 1.0, 2.0, 2.0, 0.0, 1.0], dtype=torch.float64)
R1 = torch.tensor([20.0, 0.0, 10.0, 10.0, 20.0, 0.0], dtype=torch.float64)
GROUPS6 = torch.tensor([0, 0, 0, 1, 1, 1])
W = torch.tensor([1.0, 1.0])


def test_gdpo_hand_example_and_invariance_to_rescaling_one_reward():
    r15 = math.sqrt(1.5)
    expected = [0.0, -r15, r15, r15, 0.0, -r15]
    out = gdpo(torch.stack([R0, R1], 1), W, GROUPS6, eps=0.0)
    close(out, expected, rtol=1e-6)
    assert torch.equal(combine_rewards(torch.stack([R0, R1], 1), W, GROUPS6, "gdpo", 0.0), out)
    scaled = gdpo(torch.stack([R0, 1000.0 * R1], 1), W, GROUPS6, eps=0.0)
    close(scaled, expected, rtol=1e-6)
    # with the default eps the invariance holds to ~eps/std
    default = gdpo(torch.stack([R0, R1], 1), W, GROUPS6)
    close(gdpo(torch.stack([R0, 1000.0 * R1], 1), W, GROUPS6), default, rtol=1e-3, atol=1e-3)


def test_plain_weighted_sum_is_dominated_by_the_large_scale_reward():
    rewards = torch.stack([R0, R1], 1)
    summed = combine_rewards(rewards, W, GROUPS6, "sum", 1e-4)
    close(summed, [20.0, 1.0, 12.0, 12.0, 20.0, 1.0])
    # group 0 of the sum = [20, 1, 12]: mean 11, deviations [9, −10, 1], var 182/3
    adv, _ = group_zscore(summed, GROUPS6, eps=0.0)
    sd = math.sqrt(182 / 3)
    close(adv[:3], [9 / sd, -10 / sd, 1 / sd], rtol=1e-6)
    # ×1000 on r1: the advantages become (≈) those of r1 alone — not invariant
    scaled_sum = combine_rewards(torch.stack([R0, 1000.0 * R1], 1), W, GROUPS6, "sum", 1e-4)
    adv_scaled, _ = group_zscore(scaled_sum, GROUPS6, eps=0.0)
    r15 = math.sqrt(1.5)
    close(adv_scaled, [r15, -r15, 0.0, 0.0, r15, -r15], rtol=0, atol=1e-3)
    assert (adv_scaled - adv).abs().max() > 0.1


def test_zsum_is_the_weighted_sum_of_group_z_scores_not_normalised_again():
    """MixGRPO's rule by hand, weights (1, 2), which its code divides by their sum 3: group 0's z-scores are R0
    (−r, 0, r), R1 (r, −r, 0) with r = √1.5, so the sum is (r, −2r, r)/3; group 1's (r, r, −2r)/3. GDPO would divide
    the unnormalised sum by its batch std √3. With torch.std's Bessel correction (std_correction=1) the z-scores of
    three values −1, 0, 1 are ±1, not ±√1.5."""
    r = math.sqrt(1.5)
    weights = torch.tensor([1.0, 2.0])
    out = combine_rewards(torch.stack([R0, R1], 1), weights, GROUPS6, "zsum", 0.0)
    close(out, [r / 3, -2 * r / 3, r / 3, r / 3, r / 3, -2 * r / 3], rtol=1e-6)
    close(gdpo(torch.stack([R0, R1], 1), weights, GROUPS6, eps=0.0), [x * math.sqrt(3) for x in out.tolist()], rtol=1e-6)
    bessel = combine_rewards(torch.stack([R0, R1], 1), weights, GROUPS6, "zsum", 0.0, correction=1)
    close(bessel, [1 / 3, -2 / 3, 1 / 3, 1 / 3, 1 / 3, -2 / 3], rtol=1e-6)
    adv, _ = group_zscore(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0, 0, 1, 1]), eps=0.0, correction=1)
    close(adv, [-1 / math.sqrt(2), 1 / math.sqrt(2)] * 2, rtol=1e-6)  # deviations ±0.5, Bessel std √0.5
    glob, _ = group_zscore(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0, 0, 1, 1]), "global", 0.0, correction=1)
    close(glob, [-0.5 / math.sqrt(5 / 3), 0.5 / math.sqrt(5 / 3)] * 2, rtol=1e-6)  # Σ dev² = 5, / (4 − 1)
    with_nan = torch.stack([R0, R1], 1).clone()
    with_nan[0, 1] = float("nan")
    assert torch.isnan(combine_rewards(with_nan, weights, GROUPS6, "zsum", 0.0)[0])


def test_combine_rewards_single_reward_passthrough_and_bad_mode():
    one = R0.unsqueeze(1)
    assert torch.equal(combine_rewards(one, torch.ones(1), GROUPS6, "gdpo", 1e-4), R0)
    # a single reward is scaled by its weight: −1 minimises it, and every advantage rule is odd in the
    # signal, so its advantages are exactly the negated ones (group z-score and BranchGRPO depth-wise)
    flipped = combine_rewards(one, -torch.ones(1), GROUPS6, "gdpo", 1e-4)
    assert torch.equal(flipped, -R0)
    for std in ("group", "global", "none"):
        assert torch.equal(group_zscore(flipped, GROUPS6, std)[0], -group_zscore(R0, GROUPS6, std)[0])
    depth = torch.tensor([0, 1, 1, 2, 2, 2])
    assert torch.equal(tree_advantages(-R0.view(1, -1), depth), -tree_advantages(R0.view(1, -1), depth))
    with pytest.raises(ValueError, match="multi_reward"):
        combine_rewards(torch.stack([R0, R1], 1), W, GROUPS6, "product", 1e-4)




# ------------------------------------------------------------------------------------------------
# 9, 12. BranchGRPO node values and depth-wise advantages
# ------------------------------------------------------------------------------------------------
# A binary tree of depth 2 (root 0; children 1, 2; grandchildren 3, 4 under 1 and 5, 6 under 2).
#   prompt 0, leaf rewards [1, 3, 5, 11]: r̄(1) = 2, r̄(2) = 8, r̄(0) = 5
#     depth 1: [2, 8], mean 5, std 3 → ∓3/(3 + 1e-4)
#     depth 2: [1, 3, 5, 11], mean 5, deviations [−4, −2, 0, 6], var (16 + 4 + 0 + 36)/4 = 14
#   prompt 1, leaf rewards [0, 0, 0, 4]: r̄(1) = 0, r̄(2) = 2, r̄(0) = 1
#     depth 1: [0, 2] → ∓1/(1 + 1e-4); depth 2: mean 1, deviations [−1, −1, −1, 3], var 3
LEAVES = [[1.0, 3.0, 5.0, 11.0], [0.0, 0.0, 0.0, 4.0]]
VALUES7 = [[5.0, 2.0, 8.0] + LEAVES[0], [1.0, 0.0, 2.0] + LEAVES[1]]
DEPTH7 = torch.tensor([0, 1, 1, 2, 2, 2, 2])


def _hand_tree_adv():
    a, b = 3 / (3 + 1e-4), 1 / (1 + 1e-4)
    s14, s3 = math.sqrt(14) + 1e-4, math.sqrt(3) + 1e-4
    return [
        [0.0, -a, a, -4 / s14, -2 / s14, 0.0, 6 / s14],
        [0.0, -b, b, -1 / s3, -1 / s3, -1 / s3, 3 / s3],
    ]


def test_tree_advantages_depthwise_hand_tree():
    adv = tree_advantages(torch.tensor(VALUES7), DEPTH7)
    close(adv, _hand_tree_adv())
    # a depth where every node has the same value gives exact zeros
    flat = tree_advantages(torch.tensor([[2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]]), DEPTH7)
    assert flat.tolist() == [[0.0] * 7]
    # BranchGRPO's code (torch.std): prompt 0's depth 1 [2, 8] has Bessel std √18, depth 2 deviations [−4, −2, 0, 6]
    # sum 56 over 3: √(56/3)
    bessel = tree_advantages(torch.tensor(VALUES7), DEPTH7, correction=1)
    s18, s56 = math.sqrt(18) + 1e-4, math.sqrt(56 / 3) + 1e-4
    close(bessel[0], [0.0, -3 / s18, 3 / s18, -4 / s56, -2 / s56, 0.0, 6 / s56])


def _branch_record():
    plan = samplers.compose_plan(4, kernel="dance_sde", splits=(0, 1), branch_factor=2)
    return samplers.rollout(lambda x, s, c: -x, plan, prompt_ids=[0, 1], latent_shape=(2,), seed=0)


def test_rollout_tree_node_values_and_depthwise_advantages():
    rec = _branch_record()
    # splits at steps 0 and 1, then two single-child steps: the hand tree above with every
    # grandchild extended by a chain of two nodes (3→7→11, 4→8→12, 5→9→13, 6→10→14)
    assert rec.node_parent.tolist() == [-1, 0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert rec.node_depth.tolist() == [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4]
    assert rec.leaf_node.tolist() == [11, 12, 13, 14] * 2 and rec.leaf_prompt.tolist() == [0] * 4 + [1] * 4
    leaf_rewards = torch.tensor(LEAVES[0] + LEAVES[1], dtype=torch.float64)
    values = rec.node_values(leaf_rewards)
    # chain nodes carry their leaf's value: depths 2, 3 and 4 repeat the grandchildren's values
    expected = [row + row[3:] + row[3:] for row in VALUES7]
    close(values, expected, rtol=1e-12, atol=0)
    hand = _hand_tree_adv()
    close(tree_advantages(values, rec.node_depth), [row + row[3:] + row[3:] for row in hand])
    # the edges of step 0 of prompt 0 (x' = nodes 1, 2) are credited with r̄ = 2 and 8
    first = (rec.step == 0) & (rec.prompt == 0)
    assert rec.node[first].tolist() == [1, 2]
    close(rec.transition_values(leaf_rewards)[first], [2.0, 8.0], rtol=1e-12, atol=0)


def test_treegrpo_carries_the_leaves_z_scores_up_without_normalising_per_depth():
    """advantage.tree_norm=leaves (TreeGRPO): each prompt's leaves are z-scored once (prompt 0: rewards 1, 3, 5, 11,
    mean 5, population std √14), a node's advantage is the mean of its leaves' (node 1: (−4 − 2)/2/√14, node 2:
    (0 + 6)/2/√14); depth (BranchGRPO) z-scores the node values [2, 8] among their depth instead: ∓3/3."""
    from types import SimpleNamespace

    from flowgrpo.engine import credit

    rec = _branch_record()
    rewards = torch.tensor(LEAVES[0] + LEAVES[1]).unsqueeze(1)
    cfg = SimpleNamespace(multi_reward="gdpo", eps=1e-4, std_correction=0, std="group", diversity=False,
                          tree_value="mean", tree_beta=1.0, tree_norm="leaves", best_of_n=0, clip=5.0,
                          tied_groups="train", soft_clip=0.0)

    def step0(norm):
        cfg.tree_norm = norm
        adv, _ = credit.assign([rec], [[0, 1]], rewards, torch.ones(1), cfg, True, lambda t: t, 0)
        first = (rec.step == 0) & (rec.prompt == 0)
        return adv.transitions[0][first], adv.leaves[0][:4]

    s = math.sqrt(14) + 1e-4
    edges, leaves = step0("leaves")
    close(edges, [-3 / s, 3 / s], rtol=1e-6, atol=1e-6)
    close(leaves, [-4 / s, -2 / s, 0.0, 6 / s], rtol=1e-6, atol=1e-6)  # a leaf keeps its own z-score
    edges, _ = step0("depth")
    close(edges, [-3 / (3 + 1e-4), 3 / (3 + 1e-4)], rtol=1e-6, atol=1e-6)


def test_path_weighted_values_beta_zero_is_the_plain_mean_and_beta_one_is_a_softmax():
    rec = _branch_record()
    leaf_rewards = torch.tensor(LEAVES[0] + LEAVES[1])
    close(path_weighted_values(rec, leaf_rewards, beta=0.0), rec.node_values(leaf_rewards))
    # β = 1 by hand for prompt 0: the path log-prob of a leaf is the sum of the stored log-probs of
    # its trained edges (steps 0–2; step 3 is the untrained last step). For node 1 the shared edge
    # 0→1 cancels in the softmax: w ∝ exp(lp(1→3) + lp(3→7)), exp(lp(1→4) + lp(4→8)).
    lp = {int(n): float(v) for n, v, p in zip(rec.node, rec.log_prob.double(), rec.prompt) if p == 0}
    assert sorted(lp) == list(range(1, 11))
    path = {11: lp[1] + lp[3] + lp[7], 12: lp[1] + lp[4] + lp[8], 13: lp[2] + lp[5] + lp[9], 14: lp[2] + lp[6] + lp[10]}
    reward = dict(zip([11, 12, 13, 14], LEAVES[0]))

    def softmax_value(leaves):
        top = max(path[leaf] for leaf in leaves)
        w = {leaf: math.exp(path[leaf] - top) for leaf in leaves}
        return sum(w[leaf] * reward[leaf] for leaf in leaves) / sum(w.values())

    got = path_weighted_values(rec, leaf_rewards, beta=1.0)
    expected = [softmax_value([11, 12, 13, 14]), softmax_value([11, 12]), softmax_value([13, 14]), 1.0]
    close(got[0, [0, 1, 2, 3]], expected, rtol=1e-5)


def test_tree_advantages_leave_nan_nodes_out_of_the_depth_statistics():
    # advantages.py's contract: "NaN rewards stay NaN: they never enter a mean or std". One failed
    # leaf reward (node 6) must not wipe out its depth: depth 2 = [1, 3, 5, NaN] → mean 3,
    # population std √(8/3) over the three valid nodes; depth 1 = [2, 5] → ∓1.5/(1.5 + 1e-4).
    values = torch.tensor([[3.0, 2.0, 5.0, 1.0, 3.0, 5.0, NAN]])
    s = math.sqrt(8 / 3) + 1e-4
    a = 1.5 / (1.5 + 1e-4)
    close(tree_advantages(values, DEPTH7), [[0.0, -a, a, -2 / s, 0.0, 2 / s, NAN]])


def test_node_values_average_only_the_valid_descendant_leaves():
    # same contract for r̄(n): with leaf 14 (prompt 0) NaN, its chain (6, 10, 14) is NaN, but
    # r̄(2) = mean of the valid leaf 13 = 5 and r̄(0) = mean(1, 3, 5) = 3
    rec = _branch_record()
    values = rec.node_values(torch.tensor([1.0, 3.0, 5.0, NAN, 0.0, 0.0, 0.0, 4.0], dtype=torch.float64))
    close(values[0, [0, 1, 2, 6, 14]], [3.0, 2.0, 5.0, NAN, NAN], rtol=1e-12, atol=0)


# ------------------------------------------------------------------------------------------------
# 10. TempFlow noise-aware side weights
# ------------------------------------------------------------------------------------------------
# time_grid(6, shift 3): t = 1, 5/6, 2/3, 1/2, 1/3, 1/6, 0 → σ = 3t/(1 + 2t) =
#   1, 15/16, 6/7, 3/4, 3/5, 3/8, 0
# weight_j = 2.25·σ_t(j)·√Δ_j, σ_t = 0.7·√(σ_j/(1 − σ_j)), σ_1 = 15/16 in the denominator at σ = 1:
#   j = 0: Δ = 1/16,  σ_t = 0.7·√(1/(1/16)) = 2.8,   s = 2.8/4 = 0.7           → 1.575
#   j = 1: Δ = 9/112, σ_t = 0.7·√15,                  s = 2.1·√(15/112)         → 4.725·√(15/112)
#   j = 2: Δ = 3/28,  σ_t = 0.7·√6,                   s = 0.7·√(18/28) = 2.1/√14 → 4.725/√14
TEMPFLOW_W = [1.575, 4.725 * math.sqrt(15 / 112), 4.725 / math.sqrt(14)]


def _tempflow(side_weight):
    return samplers.compose_plan(
        num_steps=6, kernel="ode", side_steps=(0, 1, 2), side_children=2, side_kernel="flow_sde",
        side_eta=0.7, side_weight=side_weight,
    )


def test_tempflow_noise_aware_side_weights():
    plan = _tempflow("noise_aware")
    close(plan.sigmas, [1.0, 15 / 16, 6 / 7, 3 / 4, 3 / 5, 3 / 8, 0.0], rtol=1e-12, atol=1e-15)
    weights = torch.tensor([st.side_loss_weight for st in plan.steps], dtype=torch.float64)
    close(weights, TEMPFLOW_W + [1.0, 1.0, 1.0], rtol=1e-6)
    assert [st.side for st in plan.steps] == [2, 2, 2, 0, 0, 0]
    # the rollout record carries them onto every side transition
    rec = samplers.rollout(lambda x, s, c: -x, plan, prompt_ids=[3], latent_shape=(2,), seed=1)
    assert rec.step.tolist() == [0, 0, 1, 1, 2, 2]
    close(rec.loss_weight, [w for w in TEMPFLOW_W for _ in range(2)], rtol=1e-6)

    steps = _tempflow("noise_aware_mean_one").steps[:3]
    mean_one = torch.tensor([st.side_loss_weight for st in steps], dtype=torch.float64)
    close(mean_one, [w / (sum(TEMPFLOW_W) / 3) for w in TEMPFLOW_W], rtol=1e-6)
    close(mean_one.mean(), 1.0, rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# 11. DanceGRPO best-of-N
# ------------------------------------------------------------------------------------------------
def test_best_of_n_mask_hand_example():
    adv = torch.tensor([0.5, -1.0, 2.0, 0.0, 1.5, -0.5, 3.0, -2.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    # n = 2: keep the top 1 and bottom 1 of each group: indices 2, 1 and 6, 7
    assert best_of_n_mask(adv, groups, 2).tolist() == [False, True, True, False, False, False, True, True]
    # n = 4 keeps all four of each group; n = 0 disables the filter
    assert best_of_n_mask(adv, groups, 4).all()
    assert best_of_n_mask(adv, groups, 0).all()


def test_best_of_n_mask_never_picks_a_nan_advantage_as_a_top_sample():
    # a NaN reward gives a NaN advantage (masked from the loss anyway); it must not take the "top"
    # slot from the real best sample (index 3, advantage 2)
    adv = torch.tensor([0.5, NAN, -1.0, 2.0])
    assert best_of_n_mask(adv, torch.zeros(4, dtype=torch.long), 2).tolist() == [False, False, True, True]


def test_the_soft_clip_bounds_advantages_smoothly_before_the_clip():
    """advantage.soft_clip η (V-GRPO stage 1: η = 3): A' = η·tanh(A/η), then the clamp at ±clip. A chain group's
    leaves with rewards 0, 0, 0, 0, 0, 0, 0, 10 have population z-scores −1/√7 (seven) and √7 = 2.6458 (one): 3·tanh(·/3)
    gives −0.3760 and 2.1221 by hand; a tiny clip still clamps after it; η = 0 leaves the z-scores as they are."""
    from types import SimpleNamespace

    from flowgrpo.engine import credit
    from samplers import compose_plan, rollout

    rec = rollout(lambda x, s, c: x * 0.5, compose_plan(2, group_size=8), prompt_ids=[0], latent_shape=(2,),
                  seed=0).bookkeeping_on_cpu()
    rewards = torch.tensor([0.0] * 7 + [10.0]).unsqueeze(1)

    def leaves(soft, clip=5.0):
        cfg = SimpleNamespace(multi_reward="gdpo", eps=0.0, std_correction=0, std="group", diversity=False,
                              tree_value="mean", tree_beta=1.0, tree_norm="depth", best_of_n=0, clip=clip,
                              tied_groups="train", soft_clip=soft)
        adv, _ = credit.assign([rec], [[0]], rewards, torch.ones(1), cfg, False, lambda t: t, 0)
        return adv.leaves[0]

    z = torch.tensor([-1 / math.sqrt(7)] * 7 + [math.sqrt(7)])
    close(leaves(0.0), z)
    close(leaves(3.0), 3 * torch.tanh(z / 3))
    close(leaves(3.0)[-1], 2.1221, rtol=1e-4)
    close(leaves(3.0, clip=1.0), (3 * torch.tanh(z / 3)).clamp(-1, 1))
