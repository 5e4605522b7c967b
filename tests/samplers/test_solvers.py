"""Time grids, ODE solvers and the evaluation rollout (samplers/grids.py, samplers/solvers.py).

Convergence is measured on Gaussian data, where the flow-matching velocity and the exact ODE flow
map are known in closed form: x0 ~ N(m, s0²), x_σ = (1−σ)·x0 + σ·x1 has std_σ² = (1−σ)²s0² + σ²,
v(x, σ) = (σ − (1−σ)s0²)/std_σ²·(x − (1−σ)m) − m, and the ODE carries x_σ to
(1−σ')m + (std_σ'/std_σ)·(x_σ − (1−σ)m).
Run: pytest tests/samplers/test_solvers.py -q
"""

import math

import pytest
import torch

from samplers import (
    compose_plan,
    data_prediction,
    dpmpp_2m_step,
    euler_step,
    flash_grid,
    flash_steps,
    make_generator,
    rollout,
    sample_ode,
    time_grid,
)
from samplers.grids import STREAM_INITIAL_NOISE, STREAM_STEP_NOISE, flash_tail_points
from samplers.kernels import flow_sde
from tolerance import assert_close_ulps

M, S0 = 0.5, 0.6


def gaussian_velocity(x, sigma, cond_index):
    s = sigma.to(torch.float64).view(-1, *([1] * (x.dim() - 1)))
    a = 1 - s
    var = a * a * S0 * S0 + s * s
    return ((s - a * S0 * S0) / var * (x.to(torch.float64) - a * M) - M).to(x.dtype)


def std_at(sigma):
    return math.sqrt((1 - sigma) ** 2 * S0**2 + sigma**2)


def ode_error(solver, sigmas, x_start):
    s32 = sigmas.to(torch.float32).double()  # the σ the solver actually uses
    lo, hi = float(s32[0]), float(s32[-1])
    exact = (1 - hi) * M + std_at(hi) / std_at(lo) * (x_start - (1 - lo) * M)
    cond = torch.zeros(x_start.shape[0], dtype=torch.long)
    return (sample_ode(gaussian_velocity, x_start, sigmas, cond, solver) - exact).abs().max().item()


def test_time_grid_is_the_shifted_linear_grid():
    for num_steps, shift in [(1, 3.0), (10, 3.0), (25, 1.0), (40, 5.0)]:
        grid = time_grid(num_steps, shift)
        assert grid.dtype == torch.float64 and grid.shape == (num_steps + 1,)
        t = [1 - i / num_steps for i in range(num_steps + 1)]
        expected = torch.tensor([shift * u / (1 + (shift - 1) * u) for u in t], dtype=torch.float64)
        assert_close_ulps(grid, expected, ulps=8)  # float64: 1.8e-15 at σ = 1
        assert grid[0] == 1.0 and grid[-1] == 0.0 and bool((grid[1:] < grid[:-1]).all())
    with pytest.raises(ValueError, match="positive integer"):
        time_grid(0)


@pytest.mark.parametrize(
    "T,start,size,ratio,expected_steps",
    # the official tail has int((T − l − w + 1)·r̃) points, ends included: 25·(0, 4, 0.4) takes 4 + 8 − 1 = 11 steps,
    # (0, 4, 0.2) 4 + 4 − 1 = 7; 15·0.4 = 6.000000000000001 stays 6 points; a window reaching T has no tail; a tail
    # of one point (18 + 4 = 22: 4·0.4 = 1.6) gets one step to σ = 0 where the official rollout stops at σ_22
    [(25, 0, 4, 0.4, 11), (25, 7, 4, 0.4, 16), (25, 0, 4, 0.2, 7), (20, 16, 4, 0.4, 20), (10, 3, 2, 0.5, 7),
     (25, 18, 4, 0.4, 23), (29, 10, 4, 0.4, 19)],
)
def test_flash_grid_keeps_the_head_and_compresses_the_tail(T, start, size, ratio, expected_steps):
    end = start + size
    grid = flash_grid(T, 3.0, end, ratio)
    points = flash_tail_points(T, end, ratio)
    assert points == (0 if end == T else max(int((T - end + 1) * ratio), 2))
    assert flash_steps(T, end, ratio) == expected_steps == grid.numel() - 1
    assert torch.equal(grid[: end + 1], time_grid(T, 3.0)[: end + 1])
    assert grid[-1] == 0 and bool((grid[1:] < grid[:-1]).all())
    if points:  # the tail: `points` σ's linear in the unshifted t from 1 − end/T to 0, shifted
        t = torch.linspace(1 - end / T, 0, points, dtype=torch.float64)
        assert_close_ulps(grid[end:], 3.0 * t / (1 + 2.0 * t), ulps=8)


def test_euler_is_first_order_and_dpmpp_2m_second_order_on_an_interior_grid():
    x = torch.tensor([[1.3], [-0.7], [0.2]], dtype=torch.float64)
    for solver, lo_ratio, hi_ratio in [("euler", 1.9, 2.1), ("dpmpp_2m", 3.7, 4.4)]:
        grids = [torch.linspace(0.9, 0.1, T + 1, dtype=torch.float64) for T in (20, 40, 80, 160)]
        errors = [ode_error(solver, grid, x) for grid in grids]
        ratios = [a / b for a, b in zip(errors, errors[1:])]
        assert all(lo_ratio < r < hi_ratio for r in ratios), (solver, errors, ratios)


def test_dpmpp_2m_on_the_full_grid_approaches_second_order():
    """From σ = 1 to σ = 0 the end steps have λ = ∓∞: the error is O(log T / T²), so the ratio
    creeps up to 4 (3.4–3.6 here) instead of sitting on it; Euler stays at 2."""
    x = torch.tensor([[1.3], [-0.7], [0.2]], dtype=torch.float64)
    euler = [ode_error("euler", time_grid(T, 1.0), x) for T in (80, 160, 320)]
    dpm = [ode_error("dpmpp_2m", time_grid(T, 1.0), x) for T in (80, 160, 320)]
    assert all(1.9 < a / b < 2.1 for a, b in zip(euler, euler[1:])), euler
    assert all(3.2 < a / b < 4.4 for a, b in zip(dpm, dpm[1:])), dpm
    assert dpm[0] < euler[0] / 10


def test_dpmpp_2m_falls_back_to_first_order():
    g = torch.Generator().manual_seed(0)
    x, v, prev = (torch.randn(4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    # no history: DDIM in flow form, which is Euler up to rounding
    torch.testing.assert_close(dpmpp_2m_step(x, v, 0.7, 0.5), euler_step(x, v, 0.7, 0.5), rtol=0, atol=1e-14)
    # previous σ = 1 (λ = −∞) and final step (σ' = 0, x' = x̂0) ignore the history
    after_sigma_one = dpmpp_2m_step(x, v, 0.8, 0.6, 1.0, prev)
    torch.testing.assert_close(after_sigma_one, euler_step(x, v, 0.8, 0.6), rtol=0, atol=1e-14)
    final = dpmpp_2m_step(x, v, 0.2, 0.0, 0.4, prev)
    assert_close_ulps(final, data_prediction(x, v, 0.2), ulps=8)
    # with usable history the step is second order, hence different
    assert not torch.allclose(dpmpp_2m_step(x, v, 0.7, 0.5, 0.85, prev), euler_step(x, v, 0.7, 0.5))


@pytest.mark.parametrize("solver", ["euler", "dpmpp_2m"])
def test_sample_ode_equals_an_all_ode_plan(solver):
    """The evaluation rollout and an ODE plan run by the executor agree bit for bit."""
    plan = compose_plan(8, kernel="ode", solver=solver)
    record = rollout(gaussian_velocity, plan, prompt_ids=[3, 4], latent_shape=(2, 3, 3), seed=11)
    assert record.num_transitions == 0 and record.nfe == {"rollout": 16}
    x0 = sample_ode(gaussian_velocity, record.root_state, plan.sigmas, torch.tensor([0, 1]), solver)
    assert torch.equal(x0, record.leaf_state)


def test_sample_ode_keeps_storage_dtype_and_any_rank():
    x = torch.randn(2, 3, 5, 4, 4).to(torch.bfloat16)  # video latents [N, C, F, H, W]
    out = sample_ode(gaussian_velocity, x, time_grid(6), torch.zeros(2, dtype=torch.long), "dpmpp_2m")
    assert out.dtype == torch.bfloat16 and out.shape == x.shape and torch.isfinite(out.float()).all()
    with pytest.raises(ValueError, match="unknown ODE solver"):
        sample_ode(gaussian_velocity, x, time_grid(6), torch.zeros(2, dtype=torch.long), "heun")
    with pytest.raises(ValueError, match="velocity returned"):
        sample_ode(lambda x, s, c: x[:1], x, time_grid(6), torch.zeros(2, dtype=torch.long))


def test_post_window_solver_starts_at_full_order_from_sde_history():
    """A Flash plan, replayed by hand from the documented seeds: the first DPM-Solver++(2M) step after
    the SDE window uses the x̂0 of the last SDE step. Without that history the result differs."""
    plan = compose_plan(6, kernel="flow_sde", window=(1, 2), post_window_ratio=0.75)  # a tail of int(4·0.75) = 3 points
    assert [s.kernel for s in plan.steps] == ["ode", "flow_sde", "flow_sde", "ode", "ode"]
    record = rollout(gaussian_velocity, plan, prompt_ids=[7], latent_shape=(4,), seed=5, iteration=2)
    sig = plan.sigmas.to(torch.float32).tolist()

    def replay(feed_sde_history):
        x = torch.randn((1, 4), generator=make_generator(STREAM_INITIAL_NOISE, 5, 2, 7, 0))
        prev = None
        for i, step in enumerate(plan.steps):
            v = gaussian_velocity(x, torch.full((1,), sig[i]), torch.zeros(1, dtype=torch.long))
            if step.kernel == "ode" and step.solver == "euler":
                x_next = euler_step(x, v, sig[i], sig[i + 1])
            elif step.kernel == "ode":
                x_next = dpmpp_2m_step(x, v, sig[i], sig[i + 1], *(prev or (None, None)))
            else:
                mean, std = flow_sde(x, v, sig[i], sig[i + 1], step.eta)
                eps = torch.randn((1, 1, 4), generator=make_generator(STREAM_STEP_NOISE, 5, 2, 7, i))[0]
                x_next = mean + std.view(-1, 1) * eps
            if step.kernel == "ode" or feed_sde_history:
                prev = (sig[i], data_prediction(x, v, sig[i]))
            else:
                prev = None
            x = x_next.to(torch.float32)
        return x

    assert torch.equal(replay(True), record.leaf_state)
    assert not torch.allclose(replay(False), record.leaf_state)
