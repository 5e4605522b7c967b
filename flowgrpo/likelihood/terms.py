"""The per-transition likelihood terms in PyTorch: the specification the fused op is tested against.

For a batch of transitions x → x' of kernels μ = a·x + b·v, x' ~ N(μ, s²·I) (docs/math.md §1, §3):
``transition_coefficients`` gives (a, b, s) per row from the step's kernel, σ, σ', η (a batch may mix
kernels), ``kernel_mean`` gives μ rounded exactly as the rollout rounded it, and ``reference_terms`` the
log-prob, GRPO-Guard's log-ratio, the exact log-ratio against μ_old and the KL to a reference mean. The
arithmetic is samplers.kernels' own (``affine``, ``log_prob``, ``per_sample``), so recomputing a stored
transition at the rollout's weights gives lp_θ − lp_old = 0 exactly (the ratio == 1 contract).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from samplers.kernels import KERNEL_NAMES, affine, column, compute_dtype, kernel_coefficients, log_prob, per_sample


class TransitionTerms(NamedTuple):
    """Per-sample terms of a batch of transitions (compute dtype: float32, float64 for float64 x)."""

    log_prob: torch.Tensor  # [N] log p(x' | x), reduce "mean" or "sum" over the D latent elements
    mean: torch.Tensor | None  # [N, *latent] μ = a·x + b·v (only with return_mean=True)
    guard: torch.Tensor | None  # [N] GRPO-Guard log ρ̂ = reduce_D(ε_s·δ), ε_s = (x' − μ_old)/s, δ = μ − μ_old
    log_ratio: torch.Tensor | None  # [N] lp_θ − lp_old as one difference = reduce_D(e_old·δ − δ²/2)/s²
    kl: torch.Tensor | None  # [N] reduce_D((μ − μ_ref)²)/(2s²) (only with mu_ref / v_ref)


def transition_coefficients(kernel, sigma, sigma_next, eta, n: int | None = None, device=None):
    """(a, b, std), float64 [N], of μ = a·x + b·v, x' = μ + std·ε for each row.

    ``kernel`` is a name from KERNEL_NAMES, or an int64 tensor [N] of indices into it (as
    ``Trajectory.kernel`` stores them), so one call covers a batch of mixed kernels. σ, σ', η are
    numbers or per-sample tensors [N] (``samplers.kernels.kernel_coefficients`` per kernel)."""
    if isinstance(kernel, str):
        return kernel_coefficients(kernel, sigma, sigma_next, eta, n, device)
    kernel = torch.as_tensor(kernel)
    n = kernel.shape[0]
    device = device if device is not None else kernel.device
    out = [torch.empty(n, dtype=torch.float64, device=device) for _ in range(3)]

    def rows(value, sel):
        return value[sel] if isinstance(value, torch.Tensor) and value.dim() > 0 else value

    for k in kernel.unique().tolist():
        sel = (kernel == k).nonzero().squeeze(1)
        coefs = kernel_coefficients(
            KERNEL_NAMES[k], rows(sigma, sel), rows(sigma_next, sel), rows(eta, sel), len(sel), device
        )
        for dst, src in zip(out, coefs):
            dst[sel.to(device)] = src
    return tuple(out)


def kernel_mean(x: torch.Tensor, v: torch.Tensor, a, b) -> torch.Tensor:
    """μ = a·x + b·v ([N, *latent], compute dtype) with a, b from ``transition_coefficients``,
    rounded exactly as ``samplers.kernels`` and ``transition_terms`` round a kernel mean."""
    n = x.shape[0]
    a, b = per_sample(a, n, x.device, "a"), per_sample(b, n, x.device, "b")
    return affine(x, v, a, b, compute_dtype(x.dtype))


def reference_terms(x, v, x_next, a, b, std, old, old_is_velocity, ref, ref_is_velocity, reduce, return_mean,
                    form="gaussian"):
    """The specification: samplers' kernel-mean arithmetic and log_prob, docs/math.md §3 in PyTorch. With
    ``form="squared_error"`` (Flow-GRPO's CPS score) the log-prob and the exact log-ratio drop the 1/(2s²); the
    guard and the KL keep the step's s."""
    dtype = compute_dtype(x.dtype)
    mean = affine(x, v, a, b, dtype)
    lp = log_prob(x_next, mean, std, reduce, form)

    def reduce_d(t):
        flat = t.flatten(1)
        return flat.mean(1) if reduce == "mean" else flat.sum(1)

    s = column(std, mean)
    guard = ratio = kl = None
    if old is not None:
        mu_old = affine(x, old, a, b, dtype) if old_is_velocity else old.to(dtype)
        e_old = x_next.to(dtype) - mu_old
        delta = mean - mu_old
        guard = reduce_d(e_old / s * delta)  # ε_s·δ, docs/math.md §3 GRPO-Guard
        ratio = reduce_d((2.0 * e_old - delta) * delta)
        ratio = ratio if form == "squared_error" else ratio / (2.0 * std.to(dtype).square())
    if ref is not None:
        mu_ref = affine(x, ref, a, b, dtype) if ref_is_velocity else ref.to(dtype)
        kl = reduce_d((mean - mu_ref).square()) / (2.0 * std.to(dtype).square())
    return TransitionTerms(lp, mean if return_mean else None, guard, ratio, kl)


__all__ = ["TransitionTerms", "kernel_mean", "reference_terms", "transition_coefficients"]
