"""The fused transition op (csrc/, flowgrpo/likelihood/) against the samplers' reference and float64.

The first fused test builds the op (≈15 s, once; cached under ~/.cache/flowgrpo/ops). Tests that
need a CUDA device skip without one; the nvcc tests skip without nvcc.
"""

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from flowgrpo import likelihood as ops
from samplers.kernels import DEFAULT_ETA, KERNEL_NAMES, get_kernel, kernel_coefficients
from tolerance import assert_close_ulps, ulp_tolerance

ROOT = Path(__file__).resolve().parents[2]
SDE_KERNELS = [k for k in KERNEL_NAMES if k != "ode"]
HAS_CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def fused():
    """Builds (or loads) the op; a build failure fails the tests unless no C++ toolchain exists."""
    reason = ops.fused_unavailable_reason("cpu")
    if reason is not None:
        if shutil.which("c++") is None or shutil.which("ninja") is None:
            pytest.skip(f"no C++ toolchain to build the op: {reason}")
        pytest.fail(f"the fused op did not build: {reason}")
    return torch.ops.flowgrpo


def make_case(kernel, dtype=torch.float32, n=3, latent=(3, 5, 7), seed=0, device="cpu"):
    """x, v, x' and a perturbed old / reference mean for kernel ``kernel`` with per-sample σ, η.
    σ = 1 in row 0 exercises flow_sde's first-step rule; the latent size D = 105 is odd."""
    g = torch.Generator().manual_seed(seed)
    sigma = torch.tensor([1.0, 0.6, 0.2, 0.75, 0.4][:n], dtype=torch.float32)
    sigma_next = torch.tensor([0.9, 0.45, 0.05, 0.7, 0.3][:n], dtype=torch.float32)
    eta = DEFAULT_ETA[kernel] * (1.0 + 0.1 * torch.arange(n, dtype=torch.float32))
    if kernel == "cps":
        eta = eta.clamp(max=1.0)  # cps has a density for η ≤ 1 only (s = σ'·sin(ηπ/2))
    shape = (n, *latent)
    x = torch.randn(shape, generator=g).to(dtype)
    v = torch.randn(shape, generator=g).to(dtype)
    mu, std = get_kernel(kernel)(x, v, sigma, sigma_next, eta)
    col = std.view(-1, *[1] * len(latent))
    x_next = (mu + col * torch.randn(shape, generator=g)).to(dtype)
    mu_old = mu + 1e-3 * col * torch.randn(shape, generator=g)
    mu_ref = mu + 1e-2 * col * torch.randn(shape, generator=g)
    a, b, s = ops.transition_coefficients(kernel, sigma, sigma_next, eta)
    case = dict(x=x, v=v, x_next=x_next, mu_old=mu_old, mu_ref=mu_ref, a=a, b=b, std=s, mu=mu)
    return {k: t.to(device) for k, t in case.items()}, (sigma, sigma_next, eta)


def float64_terms(mu, x_next, mu_old, mu_ref, std, reduce):
    """docs/math.md §1/§3 recomputed in float64 from the float32 kernel mean (the independent check)."""
    mu, xn, s = mu.double().flatten(1), x_next.double().flatten(1), std.double()
    d = mu.shape[1]
    dp = d if reduce == "mean" else 1
    s = s.to(mu.device)
    lp = -((xn - mu) ** 2).sum(1) / (2 * s**2) / dp - (d / dp) * (torch.log(s) + 0.5 * math.log(2 * math.pi))
    out = {"log_prob": lp}
    if mu_old is not None:
        mo = mu_old.double().flatten(1)
        lp_old = -((xn - mo) ** 2).sum(1) / (2 * s**2) / dp - (d / dp) * (torch.log(s) + 0.5 * math.log(2 * math.pi))
        out["guard"] = (((xn - mo) / s[:, None]) * (mu - mo)).sum(1) / dp
        out["log_ratio"] = lp - lp_old
    if mu_ref is not None:
        out["kl"] = ((mu - mu_ref.double().flatten(1)) ** 2).sum(1) / (2 * s**2) / dp
    return out


def run(case, backend, reduce="mean", grad=False, velocity_form=False, **kw):
    inputs = {k: case[k].detach().clone().requires_grad_(grad) for k in ("x", "v", "x_next", "mu_old", "mu_ref")}
    terms = ops.transition_terms(
        inputs["x"], inputs["v"], inputs["x_next"], case["a"], case["b"], case["std"],
        mu_old=inputs["mu_old"], mu_ref=inputs["mu_ref"], reduce=reduce, return_mean=True,
        backend=backend, **kw,
    )
    return terms, inputs


def weighted_loss(terms):
    """Every output with a distinct weight, so each path of the backward is exercised."""
    return (1.3 * terms.log_prob.sum() - 2.0 * terms.guard.sum() + 0.7 * terms.log_ratio.sum()
            + 0.5 * terms.kl.sum()
            + 1e-3 * (terms.mean * torch.linspace(-1, 1, terms.mean[0].numel(), device=terms.mean.device).view_as(terms.mean[0])).sum())


# ---------------------------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduce", ["mean", "sum"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("kernel", SDE_KERNELS)
def test_values_match_the_samplers_reference_and_float64(fused, kernel, dtype, reduce):
    case, _ = make_case(kernel, dtype)
    f, _ = run(case, "fused", reduce)
    r, _ = run(case, "reference", reduce)
    # μ is bit-identical to the samplers' kernel (same float32 products and sum, no fma), both paths
    assert f.mean.dtype == torch.float32 and torch.equal(f.mean, case["mu"])
    assert torch.equal(r.mean, case["mu"])
    exact = float64_terms(case["mu"], case["x_next"], case["mu_old"], case["mu_ref"], case["std"], reduce)
    for name, want in exact.items():
        got, ref = getattr(f, name), getattr(r, name)
        assert got.dtype == torch.float32 and got.shape == (3,)
        # fused: float64 accumulation, one rounding to float32 at the end (≤ 1 ulp)
        ulp = torch.finfo(torch.float32).eps * want.abs()
        assert ((got.double() - want).abs() <= ulp + 1e-30).all(), (name, got.double() - want)
        # the float32 reference: the same numbers to float32 accumulation accuracy
        scale = want.abs().max() if name != "log_ratio" else exact["log_prob"].abs().max()
        torch.testing.assert_close(ref.double(), want, rtol=0, atol=float(5e-6 * scale))


def test_log_ratio_is_one_difference_not_two_rounded_log_probs(fused):
    """lp_θ − lp_old from the op carries float64 accuracy; subtracting two float32 log-probs does
    not (the error is ~1 ulp of |lp|, the size of the clip ranges of interest)."""
    case, _ = make_case("flow_sde", latent=(16, 32, 32), seed=3)
    case["mu_old"] = case["mu"] + 1e-5 * torch.randn_like(case["mu"])
    f, _ = run(case, "fused")
    exact = float64_terms(case["mu"], case["x_next"], case["mu_old"], None, case["std"], "mean")
    err_fused = (f.log_ratio.double() - exact["log_ratio"]).abs().max()
    # the best two float32 log-probs can do: each correctly rounded, then subtracted
    lp_new32 = exact["log_prob"].float()
    lp_old32 = float64_terms(case["mu_old"], case["x_next"], None, None, case["std"], "mean")["log_prob"].float()
    err_diff = ((lp_new32 - lp_old32).double() - exact["log_ratio"]).abs().max()
    assert err_fused < 1e-12 + 1e-6 * exact["log_ratio"].abs().max(), err_fused
    assert err_diff > 10 * err_fused, (err_diff, err_fused)


def test_bf16_inputs_accumulate_in_float64(fused):
    """Video-sized rows of bf16 latents: the reductions agree with float64 to ~1 float32 ulp."""
    case, _ = make_case("dance_sde", torch.bfloat16, n=2, latent=(16, 13, 24, 32), seed=5)
    f, _ = run(case, "fused")
    exact = float64_terms(case["mu"], case["x_next"], case["mu_old"], case["mu_ref"], case["std"], "mean")
    for name, want in exact.items():
        rel = ((getattr(f, name).double() - want).abs() / want.abs()).max()
        assert rel < 2.5e-7, (name, rel)


@pytest.mark.parametrize("kernel", SDE_KERNELS)
def test_velocity_form_equals_mean_form(fused, kernel):
    """v_old / v_ref give μ_old = a·x + b·v_old computed in the op: the same numbers as passing
    the stored mean (bit for bit), and the gradient to v_old is b × the gradient to μ_old."""
    case, args = make_case(kernel, seed=7)
    v_old = case["v"] + 1e-3 * torch.randn_like(case["v"])
    v_ref = case["v"] + 1e-2 * torch.randn_like(case["v"])
    mu_old = get_kernel(kernel)(case["x"], v_old, *args)[0]
    mu_ref = get_kernel(kernel)(case["x"], v_ref, *args)[0]
    common = (case["x"], case["v"], case["x_next"], case["a"], case["b"], case["std"])
    by_mean = ops.transition_terms(*common, mu_old=mu_old, mu_ref=mu_ref, backend="fused")
    vo, vr = v_old.clone().requires_grad_(), v_ref.clone().requires_grad_()
    by_vel = ops.transition_terms(*common, v_old=vo, v_ref=vr, backend="fused")
    for name in ("log_prob", "guard", "log_ratio", "kl"):
        assert torch.equal(getattr(by_mean, name), getattr(by_vel, name)), name
    mo, mr = mu_old.clone().requires_grad_(), mu_ref.clone().requires_grad_()
    by_mean = ops.transition_terms(*common, mu_old=mo, mu_ref=mr, backend="fused")
    g_mean = torch.autograd.grad((by_mean.guard + by_mean.kl).sum(), (mo, mr))
    g_vel = torch.autograd.grad((by_vel.guard + by_vel.kl).sum(), (vo, vr))
    col = case["b"].float().view(-1, 1, 1, 1)
    for gm, gv in zip(g_mean, g_vel):
        torch.testing.assert_close(gv, col * gm, rtol=1e-6, atol=1e-12)


def test_guard_identity_of_math_md(fused):
    """log ρ̂ = reduce(ε_s·δ) = s·(lp_θ − lp_old) + reduce(δ²)/(2s), checked in float64 inputs."""
    case, _ = make_case("sage_sde", torch.float64, seed=11)
    case["mu_old"] = case["mu_old"].double()
    f, _ = run(case, "fused")
    s = case["std"]
    lp_old = float64_terms(case["mu_old"], case["x_next"], None, None, s, "mean")["log_prob"]
    delta_sq = ((f.mean - case["mu_old"]) ** 2).flatten(1).mean(1)
    torch.testing.assert_close(f.guard, s * (f.log_prob - lp_old) + delta_sq / (2 * s), rtol=1e-9, atol=1e-12)
    assert f.guard.dtype == torch.float64


# ---------------------------------------------------------------------------------------------
# gradients
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel", SDE_KERNELS)
def test_gradients_match_the_reference(fused, kernel, dtype):
    case, _ = make_case(kernel, dtype)
    f, fin = run(case, "fused", grad=True)
    r, rin = run(case, "reference", grad=True)
    names = ("x", "v", "x_next", "mu_old", "mu_ref")
    g_f = torch.autograd.grad(weighted_loss(f), [fin[k] for k in names])
    g_r = torch.autograd.grad(weighted_loss(r), [rin[k] for k in names])
    g_e = exact_gradients(case, names)
    for name, gf, gr, ge in zip(names, g_f, g_r, g_e):
        assert gf.dtype == case[name].dtype and gf.shape == case[name].shape, name
        if dtype == torch.float32:  # float64 accumulation, float32 products: a few float32 ulps
            scale = float(ge.abs().max())
            torch.testing.assert_close(gf.double(), ge, rtol=0, atol=1e-6 * scale, msg=name)
            torch.testing.assert_close(gr.double(), ge, rtol=0, atol=5e-6 * scale, msg=name)
        else:  # float32 math rounded to bf16 at the end: within one bf16 ulp of the exact value, and an
            # element near 0 (a cancellation) within a few float32 ulps of the gradient's magnitude
            near_zero = ulp_tolerance(ge, 8, torch.float32)
            torch.testing.assert_close(gf.double(), ge, rtol=2 ** -8, atol=near_zero, msg=name)
            torch.testing.assert_close(gf.float(), gr.float(), rtol=2 ** -7, atol=near_zero, msg=name)


def exact_gradients(case, names, reduce="mean"):
    """float64 autograd of the same function: μ keeps its float32 value (μ32 + a·(x − x̄) + b·(v − v̄)
    has value μ32 and derivatives a, b), everything downstream is exact."""
    leaves = {k: case[k].double().requires_grad_() for k in names}
    col = lambda t: t.float().double().view(-1, *[1] * (case["x"].dim() - 1))  # noqa: E731
    x, v = leaves["x"], leaves["v"]
    mu = case["mu"].double() + col(case["a"]) * (x - x.detach()) + col(case["b"]) * (v - v.detach())
    exact = float64_terms(mu, leaves["x_next"], leaves["mu_old"], leaves["mu_ref"], case["std"], reduce)
    loss = weighted_loss(SimpleNamespace(mean=mu, **exact))
    return torch.autograd.grad(loss, [leaves[k] for k in names])


@pytest.mark.parametrize("reduce", ["mean", "sum"])
@pytest.mark.parametrize("velocity_form", [False, True])
def test_gradcheck_float64(fused, reduce, velocity_form):
    """Analytic backward vs finite differences, every differentiable input at once."""
    case, _ = make_case("flow_sde", torch.float64, n=2, latent=(2, 3), seed=2)
    g = torch.Generator().manual_seed(3)
    old = case["v"] + 0.1 * torch.randn(case["v"].shape, generator=g) if velocity_form else case["mu_old"]
    ref = case["v"] - 0.1 * torch.randn(case["v"].shape, generator=g) if velocity_form else case["mu_ref"]
    x, v, xn, old, ref = (t.double().clone().requires_grad_() for t in (case["x"], case["v"], case["x_next"], old, ref))
    weights = torch.randn(2, 2, 3, dtype=torch.float64)

    def fn(x, v, xn, old, ref):
        kw = dict(v_old=old, v_ref=ref) if velocity_form else dict(mu_old=old, mu_ref=ref)
        t = ops.transition_terms(x, v, xn, case["a"], case["b"], case["std"], reduce=reduce,
                                 return_mean=True, backend="fused", **kw)
        return t.log_prob, t.guard, t.log_ratio, t.kl, (t.mean * weights).sum()

    assert torch.autograd.gradcheck(fn, (x, v, xn, old, ref), eps=1e-6, atol=1e-7, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# layouts, determinism, batches of mixed kernels
# ---------------------------------------------------------------------------------------------


def test_non_contiguous_and_expanded_inputs(fused):
    case, _ = make_case("cps", n=3, latent=(4, 6, 10), seed=4)
    base = {k: case[k] for k in ("x", "v", "x_next", "mu_old", "mu_ref")}
    strided = {"x": base["x"].permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)}  # inner dims permuted
    wide = torch.zeros(3, 4, 6, 20)
    wide[..., ::2] = base["v"]
    strided["v"] = wide[..., ::2]  # element stride 2
    strided["x_next"] = base["x_next"].contiguous(memory_format=torch.channels_last)
    big = torch.zeros(6, 4, 6, 10)
    big[::2] = base["mu_old"]
    strided["mu_old"] = big[::2]  # row stride 2·D, rows contiguous
    strided["mu_ref"] = base["mu_ref"].transpose(1, 2).contiguous().transpose(1, 2)
    assert not any(t.is_contiguous() for t in strided.values())
    common = (case["a"], case["b"], case["std"])
    want = ops.transition_terms(base["x"], base["v"], base["x_next"], *common, mu_old=base["mu_old"],
                                mu_ref=base["mu_ref"], return_mean=True, backend="fused")
    got = ops.transition_terms(strided["x"], strided["v"], strided["x_next"], *common,
                               mu_old=strided["mu_old"], mu_ref=strided["mu_ref"], return_mean=True,
                               backend="fused")
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    # an expanded batch (row stride 0): one state shared by every row, as with shared initial noise
    x0 = base["x"][:1].expand(3, -1, -1, -1)
    want = ops.transition_terms(x0.contiguous(), base["v"], base["x_next"], *common, backend="fused")
    v = base["v"].clone().requires_grad_()
    xe = base["x"][:1].clone().requires_grad_()
    got = ops.transition_terms(xe.expand(3, -1, -1, -1), v, base["x_next"], *common, backend="fused")
    assert torch.equal(want.log_prob, got.log_prob)
    gx, = torch.autograd.grad(got.log_prob.sum(), xe)
    xc = x0.contiguous().requires_grad_()
    gxc, = torch.autograd.grad(ops.transition_terms(xc, base["v"], base["x_next"], *common, backend="fused").log_prob.sum(), xc)
    assert_close_ulps(gx, gxc.sum(0, keepdim=True), ulps=8)  # a sum of 3 rows: 1e-9 was 0.02 ulps of its 5.9


def test_rows_do_not_depend_on_batch_or_threads(fused):
    """Fixed chunking: a row gives the same bits alone or in a batch, on 1 or 2 threads, across
    several chunks (D = 3·8192 + 5)."""
    case, _ = make_case("flow_sde", torch.bfloat16, n=4, latent=(3 * 8192 + 5,), seed=6)

    def terms(rows, threads):
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            t = ops.transition_terms(*(case[k][rows] for k in ("x", "v", "x_next")), case["a"][rows],
                                     case["b"][rows], case["std"][rows], mu_old=case["mu_old"][rows],
                                     mu_ref=case["mu_ref"][rows], backend="fused")
        finally:
            torch.set_num_threads(previous)
        return torch.stack([t.log_prob, t.guard, t.log_ratio, t.kl])

    full = terms(torch.arange(4), 2)
    assert torch.equal(full, terms(torch.arange(4), 1))
    assert torch.equal(full[:, [2, 0]], terms(torch.tensor([2, 0]), 1))
    assert torch.equal(full[:, [3]], terms(torch.tensor([3]), 2))


def test_mixed_kernel_batch_in_one_call(fused):
    """Per-row coefficients from Trajectory-style kernel indices: one op call for a batch of mixed
    kernels gives each row the numbers of its own kernel."""
    kernels = torch.tensor([1, 4, 3, 2, 1])  # flow_sde, sage_sde, cps, dance_sde, flow_sde
    sigma = torch.tensor([1.0, 0.8, 0.6, 0.4, 0.3])
    sigma_next = torch.tensor([0.9, 0.7, 0.5, 0.3, 0.2])
    eta = torch.tensor([0.7, 0.5, 0.8, 0.3, 0.9])
    a, b, s = ops.transition_coefficients(kernels, sigma, sigma_next, eta)
    g = torch.Generator().manual_seed(8)
    x, v, xn = (torch.randn(5, 4, 3, 3, generator=g) for _ in range(3))
    t = ops.transition_terms(x, v, xn, a, b, s, return_mean=True, backend="fused")
    for i, k in enumerate(kernels.tolist()):
        mu, std = get_kernel(KERNEL_NAMES[k])(x[i:i + 1], v[i:i + 1], sigma[i:i + 1], sigma_next[i:i + 1], eta[i:i + 1])
        assert torch.equal(t.mean[i:i + 1], mu)
        assert torch.equal(s[i:i + 1], kernel_coefficients(KERNEL_NAMES[k], sigma[i:i + 1], sigma_next[i:i + 1], eta[i:i + 1])[2])
        exact = float64_terms(mu, xn[i:i + 1], None, None, s[i:i + 1], "mean")["log_prob"]
        assert abs(float(t.log_prob[i]) - float(exact)) <= 1.2e-7 * abs(float(exact))


def test_ratio_is_one_at_the_old_policy(fused):
    """Before any update μ_θ = μ_old: log_ratio and guard are exactly 0 (the ratio == 1 contract)."""
    case, _ = make_case("sage_sde", torch.bfloat16, seed=9)
    common = (case["x"], case["v"], case["x_next"], case["a"], case["b"], case["std"])
    for kw in (dict(mu_old=case["mu"]), dict(v_old=case["v"])):
        t = ops.transition_terms(*common, mu_ref=case["mu"], backend="fused", **kw)
        assert torch.equal(t.log_ratio, torch.zeros(3)) and torch.equal(t.guard, torch.zeros(3))
        assert torch.equal(t.kl, torch.zeros(3))


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_refuses_zero_std_and_bad_arguments(fused, backend):
    case, args = make_case("cps", seed=1)
    common = (case["x"], case["v"], case["x_next"])
    a, b, std = kernel_coefficients("ode", *args[:2], 0.0)
    with pytest.raises(ValueError, match="std > 0"):
        ops.transition_terms(*common, a, b, std, backend=backend)
    with pytest.raises(ValueError, match="not both"):
        ops.transition_terms(*common, case["a"], case["b"], case["std"], mu_old=case["mu"], v_old=case["v"], backend=backend)
    with pytest.raises(ValueError, match="shape"):
        ops.transition_terms(case["x"], case["v"][:, :2], case["x_next"], case["a"], case["b"], case["std"], backend=backend)
    with pytest.raises(ValueError, match="reduce"):
        ops.transition_terms(*common, case["a"], case["b"], case["std"], reduce="max", backend=backend)
    with pytest.raises(ValueError, match="constants"):
        ops.transition_terms(*common, case["a"].clone().requires_grad_(), case["b"], case["std"], backend=backend)


def test_empty_batch(fused):
    x = torch.zeros(0, 2, 3)
    empty = torch.zeros(0, dtype=torch.float64)
    t = ops.transition_terms(x, x, x, empty, empty, empty, mu_old=x, return_mean=True, backend="fused")
    assert t.log_prob.shape == (0,) and t.mean.shape == (0, 2, 3) and t.guard.shape == (0,)


# ---------------------------------------------------------------------------------------------
# torch.library checks and torch.compile
# ---------------------------------------------------------------------------------------------


def _op_args(dtype, old, ref, return_mean, requires_grad=True):
    case, _ = make_case("flow_sde", dtype, n=2, latent=(3, 4), seed=12)
    x, v, xn = (case[k].clone().requires_grad_(requires_grad) for k in ("x", "v", "x_next"))
    old_t = {"none": None, "mean": case["mu_old"], "velocity": case["v"] + 0.01}[old]
    ref_t = {"none": None, "mean": case["mu_ref"], "velocity": case["v"] - 0.01}[ref]
    return (x, v, xn, case["a"], case["b"], case["std"], old_t, ref_t, old == "velocity",
            ref == "velocity", "mean", return_mean)


@pytest.mark.parametrize(
    "dtype,old,ref,return_mean",
    [
        (torch.float32, "none", "none", False),
        (torch.float32, "mean", "mean", True),
        (torch.bfloat16, "velocity", "mean", False),
        (torch.float64, "mean", "velocity", True),
    ],
)
def test_opcheck_forward(fused, dtype, old, ref, return_mean):
    torch.library.opcheck(fused.transition_terms.default, _op_args(dtype, old, ref, return_mean))


def test_opcheck_backward(fused):
    x, v, xn, a, b, s, old, ref, ov, rv, reduce, _ = _op_args(torch.float32, "mean", "velocity", True, False)
    g = torch.randn(2)
    args = (torch.randn(2, 3, 4), g, g * 2, None, g * 3, x, v, xn, a, b, s, old, ref, ov, rv, reduce,
            [True, True, True, True, True])
    torch.library.opcheck(fused.transition_terms_backward.default, args)


@pytest.mark.slow
def test_torch_compile_fullgraph(fused):
    case, _ = make_case("dance_sde", seed=13)

    def loss(x, v, xn, mo):
        t = ops.transition_terms(x, v, xn, case["a"], case["b"], case["std"], mu_old=mo, backend="fused")
        return (t.log_prob + t.guard).sum()

    v1 = case["v"].clone().requires_grad_()
    v2 = case["v"].clone().requires_grad_()
    eager = loss(case["x"], v1, case["x_next"], case["mu_old"])
    compiled = torch.compile(loss, fullgraph=True)(case["x"], v2, case["x_next"], case["mu_old"])
    assert torch.equal(eager, compiled)
    g1, = torch.autograd.grad(eager, v1)
    g2, = torch.autograd.grad(compiled, v2)
    assert torch.equal(g1, g2)


# ---------------------------------------------------------------------------------------------
# backend selection and fallback
# ---------------------------------------------------------------------------------------------


def test_backend_precedence(monkeypatch):
    monkeypatch.setenv("FLOWGRPO_OPS_BACKEND", "reference")
    assert ops.resolve_backend() == "reference"
    with ops.use_backend("reference"):
        assert ops.resolve_backend("fused") == "reference"  # the test override beats the argument
        with ops.use_backend(None):
            assert ops.resolve_backend("reference") == "reference"
    with pytest.raises(ValueError, match="unknown likelihood backend"):
        ops.resolve_backend("triton")
    with pytest.raises(ValueError, match="unknown likelihood backend"):
        ops.set_backend_override("cuda")


def test_backend_auto_and_fused_choose_the_op(fused):
    assert ops.fused_available("cpu")
    assert ops.resolve_backend("auto") == "fused" and ops.resolve_backend("fused") == "fused"
    assert ops.fused_unavailable_reason("meta") is not None
    with pytest.raises(RuntimeError, match="backend='reference'"):
        ops.resolve_backend("fused", "meta")
    if not HAS_CUDA:
        assert not ops.fused_available("cuda")


def test_missing_build_warns_and_falls_back_or_raises(tmp_path):
    """In a fresh process whose sources are missing: "auto" warns once and returns the reference
    numbers; "fused" raises with instructions."""
    script = """
import warnings, torch
from flowgrpo import likelihood as ops
x = torch.randn(2, 3, 4); a, b, s = ops.transition_coefficients("flow_sde", 0.5, 0.4, 0.7, n=2)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    t = ops.transition_terms(x, x, x, a, b, s)
    ops.transition_terms(x, x, x, a, b, s)
assert len([w for w in caught if "fused likelihood op is unavailable" in str(w.message)]) == 1, caught
assert torch.equal(t.log_prob, ops.transition_terms(x, x, x, a, b, s, backend="reference").log_prob)
try:
    ops.transition_terms(x, x, x, a, b, s, backend="fused")
except RuntimeError as exc:
    assert "missing op sources" in str(exc) and "backend='reference'" in str(exc), exc
    print("OK")
"""
    env = dict(os.environ, FLOWGRPO_OPS_SOURCES=str(tmp_path), FLOWGRPO_OPS_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT))
    env.pop("FLOWGRPO_OPS_BACKEND", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "OK", out.stderr[-2000:]


def test_only_flowgrpo_ops_touches_the_op():
    offenders = []
    for path in ROOT.rglob("*.py"):
        if any(part in (".venv", "build", ".git") for part in path.parts) or path.parent == ROOT / "flowgrpo" / "likelihood":
            continue
        if "tests" in path.relative_to(ROOT).parts:
            continue
        if re.search(r"torch\.ops\.flowgrpo|csrc/likelihood", path.read_text(errors="ignore")):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"only flowgrpo/likelihood/ may load or call the op: {offenders}"


# ---------------------------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------------------------

NVCC = shutil.which("nvcc") or (str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"))
HAS_NVCC = Path(NVCC).is_file()
# what torch.utils.cpp_extension passes to nvcc (its COMMON_NVCC_FLAGS)
NVCC_FLAGS = ["-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
              "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr"]


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not found")
def test_nvcc_compiles_the_device_code(tmp_path):
    """The __global__ kernels and likelihood.h compile to sm_90 machine code (ptxas included; no
    torch headers needed): the cubin is a CUDA ELF with a code section for every kernel."""
    cubin = tmp_path / "kernels.cubin"
    cmd = [NVCC, "-cubin", "-std=c++17", "-O3", "-arch=sm_90", "-DFLOWGRPO_KERNELS_ONLY", *NVCC_FLAGS,
           f"-I{ROOT / 'csrc'}", str(ROOT / "csrc" / "likelihood_cuda.cu"), "-o", str(cubin)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    data = cubin.read_bytes()
    assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 190  # EM_CUDA
    for kernel in (b"14forward_kernelIf", b"14forward_kernelId", b"15finalize_kernelIf",
                   b"15backward_kernelIf", b"15backward_kernelId"):
        assert b".text._ZN8flowgrpo3gpu" + kernel in data, kernel


@pytest.mark.slow
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not found")
def test_nvcc_compiles_the_torch_glue(tmp_path):
    """The whole .cu, torch glue included, against this torch's headers (a CPU wheel lacks one
    generated CUDA config header; a one-line stand-in is supplied when it is missing)."""
    from torch.utils.cpp_extension import include_paths

    includes = [f"-I{p}" for p in include_paths()] + [f"-I{ROOT / 'csrc'}"]
    if not any((Path(p) / "c10/cuda/impl/cuda_cmake_macros.h").is_file() for p in include_paths()):
        shim = tmp_path / "shim" / "c10" / "cuda" / "impl"
        shim.mkdir(parents=True)
        (shim / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes.append(f"-I{tmp_path / 'shim'}")
    cmd = [NVCC, "-c", "-std=c++20", "-O3", "-arch=sm_90", *NVCC_FLAGS, *includes, "-w",
           "--compiler-options", "-fPIC",
           str(ROOT / "csrc" / "likelihood_cuda.cu"), "-o", str(tmp_path / "full.o")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel", SDE_KERNELS)
def test_cuda_matches_the_reference(kernel, dtype):
    if not ops.fused_available("cuda"):
        pytest.fail(f"CUDA op unavailable: {ops.fused_unavailable_reason('cuda')}")
    case, _ = make_case(kernel, dtype, n=4, latent=(4, 33, 65), seed=14, device="cuda")
    f, fin = run(case, "fused", grad=True)
    r, rin = run(case, "reference", grad=True)
    assert torch.equal(f.mean, case["mu"])
    exact = float64_terms(case["mu"], case["x_next"], case["mu_old"], case["mu_ref"], case["std"], "mean")
    for name, want in exact.items():
        ulp = torch.finfo(torch.float32).eps * want.abs()
        assert ((getattr(f, name).double() - want).abs() <= ulp + 1e-30).all(), name
    names = ("x", "v", "x_next", "mu_old", "mu_ref")
    g_f = torch.autograd.grad(weighted_loss(f), [fin[k] for k in names])
    g_r = torch.autograd.grad(weighted_loss(r), [rin[k] for k in names])
    for name, gf, gr in zip(names, g_f, g_r):
        scale = float(gr.abs().max())
        tol = dict(rtol=2 ** -7, atol=1e-6 * scale) if dtype == torch.bfloat16 else dict(rtol=0, atol=5e-6 * scale)
        torch.testing.assert_close(gf.float(), gr.float(), msg=name, **tol)
    again, _ = run(case, "fused")
    assert torch.equal(again.log_prob, f.log_prob)  # no atomics: bit-reproducible
    cpu = {k: t.cpu() for k, t in case.items()}
    c, _ = run(cpu, "fused")
    torch.testing.assert_close(c.log_prob, f.log_prob.cpu(), rtol=2.5e-7, atol=0)


def test_squared_error_form_drops_the_variance_from_log_prob_and_log_ratio_only():
    """Flow-GRPO's CPS score: log-prob and exact log-ratio without 1/(2s²) (lp_θ − lp_old exactly, 0 at the old
    policy), guard and KL with the step's s as in the Gaussian form; the fused op is refused by name."""
    g = torch.Generator().manual_seed(11)
    x, v, v_old, v_ref = (torch.randn(3, 2, 4, 4, generator=g) for _ in range(4))
    a, b, std = ops.transition_coefficients("cps", 0.6, 0.5, 0.8, n=3)
    mu_old, _ = get_kernel("cps")(x, v_old, 0.6, 0.5, 0.8)
    x_next = mu_old + std.float().view(-1, 1, 1, 1) * torch.randn(x.shape, generator=g)
    gauss = ops.transition_terms(x, v, x_next, a, b, std, mu_old=mu_old, v_ref=v_ref, backend="reference")
    sq = ops.transition_terms(x, v, x_next, a, b, std, mu_old=mu_old, v_ref=v_ref, backend="reference",
                                     form="squared_error")
    mean, _ = get_kernel("cps")(x, v, 0.6, 0.5, 0.8)
    expected = -(x_next.double() - mean.double()).square().flatten(1).mean(1)
    torch.testing.assert_close(sq.log_prob.double(), expected, rtol=8 * torch.finfo(torch.float32).eps, atol=0)
    old_lp = -(x_next.double() - mu_old.double()).square().flatten(1).mean(1)
    assert_close_ulps(sq.log_ratio.double(), expected - old_lp, ulps=64, dtype=torch.float32)
    assert torch.equal(sq.guard, gauss.guard) and torch.equal(sq.kl, gauss.kl)
    at_old = ops.transition_terms(x, v_old, x_next, a, b, std, mu_old=mu_old, form="squared_error")
    assert bool((at_old.log_ratio == 0).all())
    with pytest.raises(ValueError, match="likelihood_backend=reference"):
        ops.transition_terms(x, v, x_next, a, b, std, backend="fused", form="squared_error")
