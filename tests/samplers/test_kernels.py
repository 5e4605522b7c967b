"""Transition kernels and the shared log-prob (samplers/kernels.py) against docs/math.md §1.

Every kernel is checked against an independent float64 transcription of its docs/math.md formula, its
log-prob against torch.distributions.Normal reduced the same way, and η = 0 against the ODE step.
Run: pytest tests/samplers/test_kernels.py -q
"""

import math

import pytest
import torch

from samplers import (
    KERNEL_NAMES,
    get_kernel,
    kernel_coefficients,
    log_prob,
    ode,
    time_grid,
    transition,
)

STOCHASTIC = [k for k in KERNEL_NAMES if k != "ode"]
ETA = {"flow_sde": 0.7, "dance_sde": 0.3, "cps": 0.8, "sage_sde": 0.5}
GRID = time_grid(10, 3.0).to(torch.float32).double().tolist()  # the σ values a rollout uses
STEPS = [(GRID[0], GRID[1]), (GRID[4], GRID[5]), (GRID[8], GRID[9]), (GRID[9], GRID[10]), (0.6, 0.25)]


def reference(name, x, v, sigma, sigma_next, eta, sigma_1):
    """docs/math.md §1 transcribed literally, python floats in float64, one sample at a time."""
    delta = sigma - sigma_next
    x0_hat, x1_hat = x - sigma * v, x + (1 - sigma) * v
    if name == "ode":
        return x - delta * v, 0.0
    if name == "flow_sde":
        sigma_t = eta * math.sqrt(sigma / (1 - (sigma_1 if sigma == 1 else sigma)))
        return x - delta * (v + sigma_t**2 / (2 * sigma) * x1_hat), sigma_t * math.sqrt(delta)
    if name == "dance_sde":
        return x - delta * (v + eta**2 / (2 * sigma) * x1_hat), eta * math.sqrt(delta)
    if name == "cps":
        s = sigma_next * math.sin(eta * math.pi / 2)
        return (1 - sigma_next) * x0_hat + math.sqrt(sigma_next**2 - s**2) * x1_hat, s
    if name == "sage_sde":
        var = eta**2 * (-delta + math.log((1 - sigma_next) / (1 - min(sigma, 1 - 3e-3))))
        return x - delta * v - 0.5 * var * x1_hat / sigma, math.sqrt(var)
    raise AssertionError(name)


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype)
    v = (torch.randn(shape, generator=g) * 1.5).to(dtype)
    return x, v


@pytest.mark.parametrize("name", KERNEL_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 2, 4, 4), (2, 2, 3, 4, 4)])
def test_kernel_matches_float64_formula(name, dtype, shape):
    x, v = _inputs(shape, dtype)
    eta = ETA.get(name, 0.0)
    for sigma, sigma_next in STEPS:
        mean, std = get_kernel(name)(x, v, sigma, sigma_next, eta)
        assert mean.dtype == torch.float32 and std.dtype == torch.float32  # fp32 math for bf16 too
        assert mean.shape == x.shape and std.shape == (shape[0],)
        xs, vs = x.double().flatten().tolist(), v.double().flatten().tolist()
        ref = [reference(name, a, b, sigma, sigma_next, eta, GRID[1])[0] for a, b in zip(xs, vs)]
        ref_std = reference(name, 0.0, 0.0, sigma, sigma_next, eta, GRID[1])[1]
        torch.testing.assert_close(mean.double().flatten(), torch.tensor(ref, dtype=torch.float64),
                                   rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(std.double(), torch.full((shape[0],), ref_std, dtype=torch.float64),
                                   rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_per_sample_sigma_and_eta_equal_scalar_calls(name):
    x, v = _inputs((4, 3, 5), torch.float32, seed=1)
    sig = torch.tensor([GRID[0], GRID[2], GRID[6], GRID[9]], dtype=torch.float32)
    nxt = torch.tensor([GRID[1], GRID[3], GRID[7], GRID[10]], dtype=torch.float32)
    eta = torch.tensor([0.1, 0.3, 0.5, 0.9])
    mean, std = get_kernel(name)(x, v, sig, nxt, eta)
    for i in range(4):
        m_i, s_i = get_kernel(name)(x[i : i + 1], v[i : i + 1], float(sig[i]), float(nxt[i]), float(eta[i]))
        assert torch.equal(mean[i : i + 1], m_i) and torch.equal(std[i : i + 1], s_i)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_eta_zero_is_the_ode_step_exactly(name):
    x, v = _inputs((3, 2, 6, 6), torch.bfloat16, seed=2)
    for sigma, sigma_next in STEPS:
        mean, std = get_kernel(name)(x, v, sigma, sigma_next, 0.0)
        ode_mean, ode_std = ode(x, v, sigma, sigma_next)
        assert torch.equal(mean, ode_mean), (name, sigma)
        assert torch.all(std == 0) and torch.all(ode_std == 0)


@pytest.mark.parametrize("name", STOCHASTIC)
@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_log_prob_equals_torch_normal(name, reduce):
    x, v = _inputs((4, 3, 4, 4), torch.float32, seed=3)
    sigma, sigma_next = GRID[3], GRID[4]
    mean, std = get_kernel(name)(x, v, sigma, sigma_next, ETA[name])
    g = torch.Generator().manual_seed(4)
    x_next = mean + std.view(-1, 1, 1, 1) * torch.randn(mean.shape, generator=g) * 1.3
    lp = log_prob(x_next, mean, std, reduce)
    dist = torch.distributions.Normal(mean.double(), std.double().view(-1, 1, 1, 1))
    elementwise = dist.log_prob(x_next.double()).flatten(1)
    expected = elementwise.mean(1) if reduce == "mean" else elementwise.sum(1)
    assert lp.dtype == torch.float32 and lp.shape == (4,)
    torch.testing.assert_close(lp.double(), expected, rtol=1e-5, atol=1e-4)


def test_log_prob_reductions_differ_by_dimension():
    x, v = _inputs((2, 3, 4, 4), torch.float32, seed=5)
    mean, std = get_kernel("flow_sde")(x, v, GRID[2], GRID[3], 0.7)
    x_next = mean + std.view(-1, 1, 1, 1) * 0.5
    torch.testing.assert_close(log_prob(x_next, mean, std, "sum"), 48 * log_prob(x_next, mean, std, "mean"))


def test_log_prob_rejects_zero_std_and_bad_reduce():
    x, v = _inputs((2, 4), torch.float32)
    mean, std = ode(x, v, 0.5, 0.4)
    with pytest.raises(ValueError, match="std > 0"):
        log_prob(mean, mean, std)
    mean, std = get_kernel("cps")(x, v, GRID[9], 0.0, 0.8)  # cps at σ' = 0 has no density
    with pytest.raises(ValueError, match="do not train"):
        log_prob(mean, mean, std)
    with pytest.raises(ValueError, match="reduce"):
        log_prob(mean, mean, 1.0, reduce="max")


def test_bad_kernel_arguments_raise_with_the_fix():
    x, v = _inputs((2, 4), torch.float32)
    with pytest.raises(ValueError, match="sigma > sigma_next"):
        get_kernel("flow_sde")(x, v, 0.4, 0.5, 0.7)
    with pytest.raises(ValueError, match="eta in"):
        get_kernel("cps")(x, v, 0.5, 0.4, 1.5)
    with pytest.raises(ValueError, match="unknown kernel"):
        get_kernel("ddim")
    with pytest.raises(ValueError, match="per-sample tensor"):
        get_kernel("dance_sde")(x, v, torch.tensor([0.5, 0.5, 0.5]), 0.4, 0.3)


@pytest.mark.parametrize("name", STOCHASTIC)
def test_transition_draws_then_scores_the_stored_sample(name):
    """ratio == 1 contract: x' is rounded to its storage dtype before its log-prob is taken."""
    x, v = _inputs((3, 4, 4, 4), torch.bfloat16, seed=6)
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(7))
    drawn = transition(name, x, v, GRID[2], GRID[3], ETA[name], noise=noise)
    assert drawn.next_state.dtype == torch.bfloat16
    scored = transition(name, x, v, GRID[2], GRID[3], ETA[name], next_state=drawn.next_state)
    assert torch.equal(drawn.log_prob, scored.log_prob)
    unrounded = drawn.mean + drawn.std.view(-1, 1, 1, 1) * noise
    assert not torch.equal(log_prob(unrounded, drawn.mean, drawn.std), drawn.log_prob)


def test_transition_refuses_ambiguous_requests():
    x, v = _inputs((2, 4), torch.float32)
    with pytest.raises(ValueError, match="not both"):
        transition("flow_sde", x, v, 0.5, 0.4, 0.7, noise=x, next_state=x)
    with pytest.raises(ValueError, match="stochastic"):
        transition("flow_sde", x, v, 0.5, 0.4, 0.7)
    with pytest.raises(ValueError, match="deterministic"):
        transition("ode", x, v, 0.5, 0.4, 0.0, noise=x)
    assert transition("ode", x, v, 0.5, 0.4, 0.0).log_prob is None


@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_b_coefficient_is_the_velocity_gain(name):
    """kernel_coefficients' b = ∂μ/∂v (SAGE-GRPO's gradient-norm equaliser uses it)."""
    x, v = _inputs((2, 3), torch.float64, seed=8)
    v.requires_grad_(True)
    mean, _ = get_kernel(name)(x, v, GRID[5], GRID[6], ETA.get(name, 0.0))
    (grad,) = torch.autograd.grad(mean.sum(), v)
    b = kernel_coefficients(name, GRID[5], GRID[6], ETA.get(name, 0.0))[1]
    torch.testing.assert_close(grad, torch.full_like(grad, float(b)))


def test_sage_variance_is_the_integral_of_flow_sde_diffusion():
    """s² = η²·∫_{σ'}^{σ} u/(1−u) du, and it is smaller than flow_sde's left rectangle for σ < 1."""
    for sigma, sigma_next in STEPS[1:]:
        u = torch.linspace(sigma_next, sigma, 200001, dtype=torch.float64)
        integral = torch.trapezoid(u / (1 - u), u)
        sage_std = kernel_coefficients("sage_sde", sigma, sigma_next, 0.7)[2]
        flow_std = kernel_coefficients("flow_sde", sigma, sigma_next, 0.7)[2]
        torch.testing.assert_close(sage_std.square(), 0.49 * integral.view(1), rtol=1e-8, atol=0)
        assert sage_std < flow_std


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_squared_error_form_is_flow_grpos_cps_score(reduce):
    """form="squared_error": −reduce_D (x' − μ)², no 1/(2s²) and no constants (Flow-GRPO's CPS code); a ratio of two
    such scores is the Gaussian ratio with the exponent scaled by 2s²."""
    x, v = _inputs((3, 2, 4, 4), torch.float32, seed=8)
    mean, std = get_kernel("cps")(x, v, GRID[3], GRID[4], 0.8)
    x_next = mean + std.view(-1, 1, 1, 1) * torch.randn(mean.shape, generator=torch.Generator().manual_seed(9))
    diff = (x_next.double() - mean.double()).square().flatten(1)
    expected = -(diff.mean(1) if reduce == "mean" else diff.sum(1))
    got = log_prob(x_next, mean, std, reduce, form="squared_error")
    torch.testing.assert_close(got.double(), expected, rtol=4 * torch.finfo(torch.float32).eps, atol=0)
    other = mean + 0.01 * v  # another policy's mean
    gaussian = log_prob(x_next, mean, std, reduce) - log_prob(x_next, other, std, reduce)
    squared = log_prob(x_next, mean, std, reduce, "squared_error") - log_prob(x_next, other, std, reduce, "squared_error")
    torch.testing.assert_close(squared.double(), (gaussian * 2 * std.square()).double(), rtol=1e-4, atol=0)
    with pytest.raises(ValueError, match="form"):
        log_prob(x_next, mean, std, reduce, form="laplace")
