"""Transition kernels: one denoising step x → x' ~ N(μ, s²·I), as pure functions (docs/math.md §1).

Every kernel has the signature ``kernel(x, v, sigma, sigma_next, eta) -> (mean, std)``:
x and v are [N, *latent] (any rank, any float dtype), sigma / sigma_next / eta are python numbers or
per-sample tensors [N]. ``mean`` is [N, *latent] and ``std`` is [N], both in the compute dtype:
float32 for every input dtype except float64 (which stays float64, for reference computations).

How the arithmetic is arranged (and why):
- Each kernel's mean is affine in (x, v): μ = a·x + b·v. The per-sample scalars a, b, s are computed
  in float64 from σ, σ', η and rounded to the compute dtype; the latents then see only two products
  and one sum. That is cheap, keeps bf16 out of the arithmetic (bf16 overflows near σ → 0 and
  σ → 1), and makes a row's result independent of the batch it sits in: products and sums are
  exactly rounded, and the only transcendental functions (sin, log1p, log) act on float64
  per-sample scalars whose last-bit differences between vectorised and scalar code paths vanish
  when rounded to float32.
- At η = 0 every stochastic kernel has a = 1 and b = −Δ exactly, so it *is* the ODE step bit for bit.
- ``b`` is ∂μ/∂v, the analytic gain SAGE-GRPO's gradient-norm equaliser needs
  (``kernel_coefficients`` exposes it).

``log_prob`` is the one Gaussian log-density used by the rollout and by the training recompute:
reduce_D[−(x' − μ)²/(2s²) − log s − ½·log 2π] with reduce = mean (default, as every public repo) or
sum (the true density); ``form="squared_error"`` scores −reduce_D[(x' − μ)²] instead, without 1/(2s²) and the
constants, as Flow-GRPO's code scores its CPS steps (their ratios differ from the Gaussian's by the factor 2s² in
the exponent, so a clip range binds where that code's does; docs/math.md §1). ``transition`` is the ddpo-style step that either draws x' (given noise) or
scores a given x', and refuses both at once; it rounds a drawn x' through its storage dtype before
scoring it (the ratio == 1 contract).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch

KERNEL_NAMES = ("ode", "flow_sde", "dance_sde", "cps", "sage_sde")
# the paper defaults (docs/math.md §1); Flow-GRPO uses 0.9 on FLUX
DEFAULT_ETA = {"ode": 0.0, "flow_sde": 0.7, "dance_sde": 0.3, "cps": 0.8, "sage_sde": 0.5}
SAGE_SIGMA_CAP = 1.0 - 3e-3  # sage_sde evaluates ln(1 − σ) at min(σ, 1 − 3e-3)
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
# the log-prob's form: the Gaussian log-density, or Flow-GRPO's CPS score −(x' − μ)² (no 1/(2s²), no constants)
LOG_PROB_FORMS = ("gaussian", "squared_error")

Scalar = float | int | torch.Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype kernel math runs in: float64 stays float64, everything else runs in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def per_sample(value: Scalar, n: int, device, name: str) -> torch.Tensor:
    """``value`` as a float64 tensor [n] on ``device``: a number, a 0-d tensor, [n] or [n, 1, ..., 1].

    Per-sample coefficients are constants of a step (σ, σ', η and what they give: a, b, std), so a
    tensor that requires grad is refused. The one helper every per-sample scalar goes through (the
    kernels here, the likelihood terms of flowgrpo/likelihood/)."""
    if not isinstance(value, torch.Tensor):
        return torch.full((n,), float(value), dtype=torch.float64, device=device)
    if value.requires_grad:
        raise ValueError(
            f"{name} requires grad: the per-sample coefficients are constants of a step "
            "(compute them from sigma, sigma_next, eta under no_grad)"
        )
    value = value.to(device=device, dtype=torch.float64)
    if value.dim() == 0:
        return value.expand(n)
    if value.shape[0] != n or math.prod(value.shape[1:]) != 1:
        raise ValueError(
            f"{name} must be a number or a per-sample tensor [{n}], got shape {tuple(value.shape)}"
        )
    return value.reshape(n)


def column(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[N] → [N, 1, ..., 1] in like's dtype, broadcastable against like ([N, *latent])."""
    return values.to(like.dtype).view((-1,) + (1,) * (like.dim() - 1))


def affine(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a·x + b·w per row in ``dtype``, rounded the one way every kernel mean is: x·a, then += w·b.

    a, b: float64 [N]; x, w: [N, *latent]. A row's result depends only on that row (products and the
    sum are exactly rounded), which is what makes the ratio == 1 contract exact."""
    xc = x.to(dtype)
    out = xc * column(a, xc)
    out += w.to(dtype) * column(b, xc)
    return out


def _score_corrected(var, delta, sigma):
    """a, b of μ = x − Δ·v − var/(2σ)·(x + (1 − σ)·v), the form shared by flow/dance/sage_sde."""
    k = var / (2.0 * sigma)
    return 1.0 - k, -delta - k * (1.0 - sigma)


def _batch_size(values, n, device):
    """n (default: the length of the first per-sample tensor, else 1) and the device to use."""
    tensors = [v for v in values if isinstance(v, torch.Tensor) and v.dim() > 0]
    if n is None:
        n = tensors[0].shape[0] if tensors else 1
    if device is None:
        device = tensors[0].device if tensors else torch.device("cpu")
    return n, device


def kernel_coefficients(
    name: str, sigma: Scalar, sigma_next: Scalar, eta: Scalar, n: int | None = None, device=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a, b, std), each float64 [n], with μ = a·x + b·v and x' = μ + std·ε for kernel ``name``.

    ``b`` = ∂μ/∂v (SAGE-GRPO's equaliser uses |b|/std). n defaults to the length of a per-sample
    argument. Raises on an unknown kernel, on σ' ≥ σ, on σ outside [0, 1] and on η < 0."""
    if name not in KERNEL_NAMES:
        raise ValueError(f"unknown kernel {name!r}; use one of {KERNEL_NAMES}")
    n, device = _batch_size((sigma, sigma_next, eta), n, device)
    sigma = per_sample(sigma, n, device, "sigma")
    sigma_next = per_sample(sigma_next, n, device, "sigma_next")
    eta = per_sample(eta, n, device, "eta")
    delta = sigma - sigma_next
    if bool((delta <= 0).any()) or bool((sigma > 1).any()) or bool((sigma_next < 0).any()):
        raise ValueError(
            "a step needs 1 ≥ sigma > sigma_next ≥ 0 (flow time runs from 1 = noise to 0 = data); "
            f"got sigma={sigma.tolist()[:4]}, sigma_next={sigma_next.tolist()[:4]}"
        )
    if bool((eta < 0).any()):
        raise ValueError(f"eta must be ≥ 0, got {eta.tolist()[:4]}")
    zero = torch.zeros_like(sigma)
    if name == "ode":
        return torch.ones_like(sigma), -delta, zero
    if name == "flow_sde":
        # σ_t = η·√(σ/(1−σ)); at σ = 1 the denominator uses σ_1 (= σ' of the first step)
        denom = 1.0 - torch.where(sigma >= 1.0, sigma_next, sigma)
        var = eta.square() * sigma / denom * delta
        return (*_score_corrected(var, delta, sigma), var.sqrt())
    if name == "dance_sde":
        var = eta.square() * delta
        return (*_score_corrected(var, delta, sigma), var.sqrt())
    if name == "sage_sde":
        # ∫_{σ'}^{σ} u/(1−u) du = ln((1−σ')/(1−σ)) − Δ, σ capped at 1 − 3e-3 inside the log;
        # log1p keeps the small-Δ cancellation accurate. Clamped at 0 (only reachable if σ' > cap).
        capped = torch.clamp(sigma, max=SAGE_SIGMA_CAP)
        integral = torch.log1p((capped - sigma_next) / (1.0 - capped)) - delta
        var = eta.square() * torch.clamp(integral, min=0.0)
        return (*_score_corrected(var, delta, sigma), var.sqrt())
    # cps: s = σ'·sin(ηπ/2), μ = (1−σ')·x̂0 + √(σ'² − s²)·x̂1 with √(σ'² − s²) = σ'·cos(ηπ/2).
    # Expanded: a = 1 − σ'(1−c), b = −Δ − (1−σ)σ'(1−c), 1 − c = 2·sin²(ηπ/4) (exact 0 at η = 0).
    if bool((eta > 1).any()):
        raise ValueError(f"cps needs eta in [0, 1] (s = σ'·sin(ηπ/2) ≤ σ'), got {eta.tolist()[:4]}")
    one_minus_cos = 2.0 * torch.sin(eta * (math.pi / 4.0)).square()
    std = sigma_next * torch.sin(eta * (math.pi / 2.0))
    a = 1.0 - sigma_next * one_minus_cos
    b = -delta - (1.0 - sigma) * sigma_next * one_minus_cos
    return a, b, std


def _apply(name: str, x, v, sigma, sigma_next, eta) -> tuple[torch.Tensor, torch.Tensor]:
    if x.shape != v.shape or x.dim() < 2:
        raise ValueError(
            f"x and v must both be [N, *latent] with the same shape, got {tuple(x.shape)} and "
            f"{tuple(v.shape)}"
        )
    dtype = compute_dtype(x.dtype)
    a, b, std = kernel_coefficients(name, sigma, sigma_next, eta, x.shape[0], x.device)
    return affine(x, v, a, b, dtype), std.to(dtype)


def ode(x, v, sigma, sigma_next, eta=0.0):
    """Euler ODE step: μ = x − Δ·v, s = 0 (η is ignored)."""
    return _apply("ode", x, v, sigma, sigma_next, 0.0)


def flow_sde(x, v, sigma, sigma_next, eta=DEFAULT_ETA["flow_sde"]):
    """Flow-GRPO: s = σ_t·√Δ, σ_t = η·√(σ/(1−σ)); μ = x − Δ·[v + σ_t²/(2σ)·(x + (1−σ)·v)]."""
    return _apply("flow_sde", x, v, sigma, sigma_next, eta)


def dance_sde(x, v, sigma, sigma_next, eta=DEFAULT_ETA["dance_sde"]):
    """DanceGRPO: s = η·√Δ; μ = x − Δ·[v + η²/(2σ)·(x + (1−σ)·v)]."""
    return _apply("dance_sde", x, v, sigma, sigma_next, eta)


def cps(x, v, sigma, sigma_next, eta=DEFAULT_ETA["cps"]):
    """Coefficients-Preserving Sampling: s = σ'·sin(ηπ/2); μ = (1−σ')·x̂0 + √(σ'² − s²)·x̂1."""
    return _apply("cps", x, v, sigma, sigma_next, eta)


def sage_sde(x, v, sigma, sigma_next, eta=DEFAULT_ETA["sage_sde"]):
    """SAGE-GRPO: s² = η²·[ln((1−σ')/(1−min(σ, 1−3e-3))) − Δ]; μ = x − Δ·v − ½·s²·(x + (1−σ)·v)/σ."""
    return _apply("sage_sde", x, v, sigma, sigma_next, eta)


KERNELS: dict[str, Callable] = {
    "ode": ode,
    "flow_sde": flow_sde,
    "dance_sde": dance_sde,
    "cps": cps,
    "sage_sde": sage_sde,
}


def get_kernel(name: str) -> Callable:
    """The kernel function called ``name`` (one of ``KERNEL_NAMES``)."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; use one of {KERNEL_NAMES}") from None


def log_prob(x_next: torch.Tensor, mean: torch.Tensor, std: Scalar, reduce: str = "mean", form: str = "gaussian"):
    """Per-sample Gaussian log-density [N] of x_next under N(mean, std²), reduced over all non-batch
    dims: ``"mean"`` = mean over the D latent elements (the public repos' convention, clip ranges
    ~1e-4), ``"sum"`` = the true density. ``form="squared_error"``: −reduce_D[(x' − μ)²] (Flow-GRPO's CPS
    score; std must still be > 0: only stochastic steps are scored). Math in float32 (float64 stays float64)."""
    if reduce not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}")
    if form not in LOG_PROB_FORMS:
        raise ValueError(f"log-prob form must be one of {LOG_PROB_FORMS}, got {form!r}")
    if x_next.shape != mean.shape:
        raise ValueError(f"x_next {tuple(x_next.shape)} and mean {tuple(mean.shape)} differ in shape")
    dtype = compute_dtype(mean.dtype)
    n, d = mean.shape[0], math.prod(mean.shape[1:])
    std64 = per_sample(std, n, mean.device, "std")
    if bool((std64 <= 0).any()):
        raise ValueError(
            "log_prob needs std > 0: ODE steps, η = 0 and cps at σ' = 0 have no density; "
            "do not train those steps (plans never do)"
        )
    var = std64.to(dtype).square()
    log_std = torch.log(std64).to(dtype)  # float64 log, then cast: identical for any batch size
    sq = (x_next.to(dtype) - mean.to(dtype)).square().flatten(1).sum(1)
    if form == "squared_error":
        return -sq / d if reduce == "mean" else -sq
    if reduce == "mean":
        return -sq / (2.0 * var) / d - log_std - HALF_LOG_2PI
    return -sq / (2.0 * var) - d * log_std - d * HALF_LOG_2PI


class Transition(NamedTuple):
    """One kernel step. next_state [N, *latent] storage dtype; log_prob [N] or None (ODE);
    mean [N, *latent] compute dtype; std [N] compute dtype."""

    next_state: torch.Tensor
    log_prob: torch.Tensor | None
    mean: torch.Tensor
    std: torch.Tensor


def transition(
    kernel: str,
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: Scalar,
    sigma_next: Scalar,
    eta: Scalar,
    *,
    noise: torch.Tensor | None = None,
    next_state: torch.Tensor | None = None,
    reduce: str = "mean",
    form: str = "gaussian",
) -> Transition:
    """Draw x' = μ + s·noise (pass ``noise``) or score a given x' (pass ``next_state``), never both.

    A drawn x' is rounded to x's dtype (its storage dtype) *before* its log-prob is computed, so that
    scoring the stored x' later gives the same number (ratio == 1). ODE steps take neither argument
    and return log_prob None."""
    if noise is not None and next_state is not None:
        raise ValueError("pass noise (to draw x') or next_state (to score it), not both")
    mean, std = get_kernel(kernel)(x, v, sigma, sigma_next, eta)
    if kernel == "ode":
        if noise is not None or next_state is not None:
            raise ValueError("the ode kernel is deterministic: pass neither noise nor next_state")
        return Transition(mean.to(x.dtype), None, mean, std)
    if noise is None and next_state is None:
        raise ValueError(f"{kernel} is stochastic: pass noise (to draw x') or next_state (to score)")
    if noise is not None:
        if noise.shape != mean.shape:
            raise ValueError(f"noise {tuple(noise.shape)} must match x {tuple(mean.shape)}")
        next_state = (mean + column(std, mean) * noise.to(mean.dtype)).to(x.dtype)
    return Transition(next_state, log_prob(next_state, mean, std, reduce, form), mean, std)


__all__ = [
    "DEFAULT_ETA",
    "KERNELS",
    "KERNEL_NAMES",
    "LOG_PROB_FORMS",
    "SAGE_SIGMA_CAP",
    "Transition",
    "affine",
    "column",
    "compute_dtype",
    "cps",
    "dance_sde",
    "flow_sde",
    "get_kernel",
    "kernel_coefficients",
    "log_prob",
    "ode",
    "per_sample",
    "sage_sde",
    "transition",
]
