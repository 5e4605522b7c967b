"""The per-transition likelihood terms: a PyTorch reference and a fused C++/CUDA op (``csrc/``); docs/ops.md.

For every trained transition the learner needs the kernel mean μ = a·x + b·v, the Gaussian
log-prob of x', and for GRPO-Guard / KL terms further reductions against a stored μ_old and a
reference μ_ref (docs/math.md §1, §3). ``transition_terms`` computes them all, per sample, either with
the fused C++/CUDA op (one read of each input, float64 accumulation for any input dtype, one
elementwise backward pass) or with the pure-PyTorch reference built on ``samplers.kernels`` (the
specification). Laid out as pytorch/extension-cpp lays out an op: ``terms.py`` (the reference math),
``fused.py`` (the op's registrations and autograd), ``build.py`` (building, loading, choosing the backend).

    from flowgrpo import likelihood
    a, b, std = likelihood.transition_coefficients(kernel, sigma, sigma_next, eta)   # float64 [N]
    terms = likelihood.transition_terms(x, v, x_next, a, b, std, mu_old=mu_old, reduce="mean",
                                        backend=config.likelihood_backend)    # "auto"|"fused"|"reference"
    terms.log_prob, terms.guard, terms.log_ratio, terms.kl                     # [N] each

Backends ("auto", "fused", "reference") and the op's build cache: build.py.
"""

from __future__ import annotations

import torch

from flowgrpo.likelihood.build import (
    BACKENDS,
    build,
    build_directory,
    fused_available,
    fused_unavailable_reason,
    resolve_backend,
    set_backend_override,
    use_backend,
)
from flowgrpo.likelihood.fused import fused_terms
from flowgrpo.likelihood.terms import TransitionTerms, kernel_mean, reference_terms, transition_coefficients
from samplers.kernels import LOG_PROB_FORMS, per_sample


def transition_terms(
    x: torch.Tensor,
    v: torch.Tensor,
    x_next: torch.Tensor,
    a,
    b,
    std,
    *,
    mu_old: torch.Tensor | None = None,
    v_old: torch.Tensor | None = None,
    mu_ref: torch.Tensor | None = None,
    v_ref: torch.Tensor | None = None,
    reduce: str = "mean",
    return_mean: bool = False,
    backend: str | None = None,
    form: str = "gaussian",
) -> TransitionTerms:
    """log-prob (and GRPO-Guard, exact log-ratio, KL terms) of transitions x → x' under μ = a·x + b·v.

    x, v, x_next (and mu_old / v_old / mu_ref / v_ref): [N, *latent], any float dtypes, any
    strides. a, b, std: float64 [N] from ``transition_coefficients`` (numbers broadcast).
    The old policy's mean is given either as ``mu_old`` or as its velocity ``v_old``
    (μ_old = a·x + b·v_old, bit-identical to the stored mean, half the bytes for bf16 models); the
    reference policy's likewise (``mu_ref`` / ``v_ref``). Gradients flow to every latent input
    (the learner needs v; x where the state itself is differentiated). ``backend``: see module doc. ``form``: the
    log-prob's form (samplers.kernels.LOG_PROB_FORMS); "squared_error" (Flow-GRPO's CPS score) runs on the reference
    backend, the fused op scoring the Gaussian form only.
    """
    if reduce not in ("mean", "sum"):
        raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}")
    if form not in LOG_PROB_FORMS:
        raise ValueError(f"form must be one of {LOG_PROB_FORMS}, got {form!r}")
    if form != "gaussian" and backend == "fused":
        raise ValueError(f"the fused likelihood op scores the Gaussian log-prob only; sampling.log_prob={form} runs on "
                         "loss.likelihood_backend=reference (or auto)")
    if mu_old is not None and v_old is not None:
        raise ValueError("pass the old policy as mu_old (its mean) or v_old (its velocity), not both")
    if mu_ref is not None and v_ref is not None:
        raise ValueError("pass the reference policy as mu_ref (its mean) or v_ref (its velocity), not both")
    if x.dim() < 2:
        raise ValueError(f"x must be [N, *latent], got shape {tuple(x.shape)}")
    for name, t in (("v", v), ("x_next", x_next), ("mu_old", mu_old), ("v_old", v_old),
                    ("mu_ref", mu_ref), ("v_ref", v_ref)):
        if t is not None and t.shape != x.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but x has {tuple(x.shape)}")
    n = x.shape[0]
    a, b, std = (per_sample(t, n, x.device, name) for t, name in ((a, "a"), (b, "b"), (std, "std")))
    old = mu_old if mu_old is not None else v_old
    ref = mu_ref if mu_ref is not None else v_ref
    old_is_velocity, ref_is_velocity = v_old is not None, v_ref is not None
    chosen = resolve_backend(backend, x.device) if form == "gaussian" else "reference"
    # the reference's log_prob and the CPU op check std > 0 themselves; the CUDA op cannot cheaply
    if chosen == "fused" and x.device.type != "cpu" and not torch.compiler.is_compiling():
        if n and bool((std <= 0).any()):
            raise ValueError(
                "transition_terms needs std > 0: ODE steps, η = 0 and cps at σ' = 0 have no density; "
                "do not train those steps (plans never do)"
            )
    if chosen == "reference":
        return reference_terms(x, v, x_next, a, b, std, old, old_is_velocity, ref, ref_is_velocity,
                               reduce, return_mean, form)
    mean, lp, guard, ratio, kl = fused_terms(x, v, x_next, a, b, std, old, ref, old_is_velocity, ref_is_velocity,
                                             reduce, return_mean)
    return TransitionTerms(
        lp,
        mean if return_mean else None,
        guard if old is not None else None,
        ratio if old is not None else None,
        kl if ref is not None else None,
    )


__all__ = [
    "BACKENDS",
    "TransitionTerms",
    "build",
    "build_directory",
    "fused_available",
    "fused_unavailable_reason",
    "kernel_mean",
    "resolve_backend",
    "set_backend_override",
    "transition_coefficients",
    "transition_terms",
    "use_backend",
]
