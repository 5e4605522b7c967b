"""The gradient-noise-scale statistics of benchmarks/bench_gradient_noise.py, on synthetic gradients
g_k = g + n_k whose signal |g|^2 and noise E|n_k|^2 are known."""

import importlib.util
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location(
    "bench_gradient_noise", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gradient_noise.py")
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
