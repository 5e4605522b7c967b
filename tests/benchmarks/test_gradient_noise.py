"""The gradient-noise-scale statistics of benchmarks/bench_gradient_noise.py, on synthetic gradients
g_k = g + n_k whose signal |g|^2 and noise E|n_k|^2 are known."""

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "bench_gradient_noise", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gradient_noise.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _grads(k: int, p: int, signal: float, noise: float, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(p, generator=gen, dtype=torch.float64)
    g = g * (signal**0.5 / g.norm())
    return g + torch.randn(k, p, generator=gen, dtype=torch.float64) * (noise / p) ** 0.5


def test_signal_noise_and_noise_scale_match_the_construction():
    stats = bench.noise_scale(_grads(16, 50_000, signal=1.0, noise=3.0), samples=64)
    assert stats["detected"]
    assert stats["signal"] == pytest.approx(1.0, rel=0.05)
    assert stats["noise"] == pytest.approx(3.0, rel=0.05)
    assert stats["b_noise"] == pytest.approx(64 * 3.0, rel=0.1)
    assert stats["cos_mean"] == pytest.approx(1 / (1 + 3.0), abs=0.02)  # |g|^2 / (|g|^2 + noise)


def test_pure_noise_is_not_detected_and_gives_a_lower_bound():
    stats = bench.noise_scale(_grads(16, 50_000, signal=0.0, noise=1.0), samples=64)
    assert not stats["detected"]
    assert abs(stats["cos_mean"]) < 0.01
    assert stats["b_noise"] == pytest.approx(64 * stats["noise"] / stats["signal_bound"])
    assert stats["b_noise"] > 64 * 10  # a pure-noise gradient needs far more samples than one batch


def test_too_few_estimates_are_refused():
    with pytest.raises(ValueError, match="at least 3"):
        bench.noise_scale(torch.zeros(2, 5), samples=8)


def _gaussian_policy_b_noise(dim: int, group: int = 8, groups: int = 8, batches: int = 48, seed: int = 0) -> float:
    """B_noise of the GRPO gradient for the friendliest case: one Gaussian step x ~ N(θ, σ²I) in
    ``dim`` dimensions whose mean θ is the whole policy, a linear reward w·x, group z-scored
    advantages and the true (summed) log-density of samplers.kernels.log_prob."""
    from flowgrpo.engine.credit import group_zscore
    from samplers.kernels import log_prob

    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(dim, generator=gen)
    w /= w.norm()
    theta = torch.zeros(dim, requires_grad=True)
    ids = torch.arange(groups).repeat_interleave(group)
    grads = []
    for _ in range(batches):
        x = theta.detach() + 0.5 * torch.randn(group * groups, dim, generator=gen)
        advantages, _ = group_zscore(x @ w, ids)
        loss = -(advantages * log_prob(x, theta.expand_as(x), 0.5, reduce="sum")).mean()
        (grad,) = torch.autograd.grad(loss, theta)
        grads.append(grad)
    stats = bench.noise_scale(torch.stack(grads), samples=group * groups)
    assert stats["detected"]
    return stats["b_noise"]


def test_a_linear_reward_needs_as_many_samples_as_the_policy_has_dimensions():
    """The score-function (GRPO) gradient's noise grows with the dimension the policy moves in: with a
    reward that is linear in the sample, B_noise = D·G/(G − 1) (baseline = the group mean of G; the
    signal is E[A ε]/σ ∝ w, the noise E[A²|ε|²]/σ² ∝ D). This is why a 1,024-dimensional latent
    per step needs thousands of samples for one gradient with a signal-to-noise ratio of 1."""
    small, large = _gaussian_policy_b_noise(64), _gaussian_policy_b_noise(256)
    assert small == pytest.approx(64 * 8 / 7, rel=0.25)
    assert large == pytest.approx(256 * 8 / 7, rel=0.25)
    assert large / small == pytest.approx(4.0, rel=0.35)
