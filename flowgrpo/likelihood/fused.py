"""The fused op as a PyTorch operator: its fake (torch.compile) and autograd registrations, and the call.

``torch.ops.flowgrpo.transition_terms`` (csrc/likelihood.cpp, csrc/likelihood_cuda.cu) reads each input
once, accumulates in float64 for any input dtype, and returns the kernel mean, the log-prob, GRPO-Guard's
and the exact log-ratio, and the KL to a reference, per sample; its backward is one elementwise pass
(``transition_terms_backward``). This module is the only caller of ``torch.ops.flowgrpo``; build.py loads
the library and then calls ``register_python_parts``.
"""

from __future__ import annotations

import torch

from samplers.kernels import compute_dtype


def register_python_parts() -> None:
    """Register the op's fake (torch.compile) and autograd implementations, once the library is loaded."""
    @torch.library.register_fake("flowgrpo::transition_terms")
    def _fake(x, v, x_next, a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce, return_mean):
        dtype = compute_dtype(x.dtype)
        n = x.shape[0]
        mean = x.new_empty(x.shape if return_mean else (0,), dtype=dtype)
        lp = x.new_empty((n,), dtype=dtype)
        guard = x.new_empty((n if old is not None else 0,), dtype=dtype)
        ratio = x.new_empty((n if old is not None else 0,), dtype=dtype)
        kl = x.new_empty((n if ref is not None else 0,), dtype=dtype)
        return mean, lp, guard, ratio, kl

    @torch.library.register_fake("flowgrpo::transition_terms_backward")
    def _fake_backward(grad_mean, grad_log_prob, grad_guard, grad_log_ratio, grad_kl, x, v, x_next,
                       a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce, output_mask):
        likes = (x, v, x_next, old, ref)
        return tuple(
            t.new_empty(t.shape) if (want and t is not None) else (t if t is not None else x).new_empty((0,))
            for want, t in zip(output_mask, likes)
        )

    torch.library.register_autograd("flowgrpo::transition_terms", _backward, setup_context=_setup_context)


def _setup_context(ctx, inputs, output):
    x, v, x_next, a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce, _ = inputs
    ctx.save_for_backward(x, v, x_next, a, b, std, old, ref)
    ctx.flags = (old_is_velocity, ref_is_velocity, reduce)
    ctx.set_materialize_grads(False)  # an unused μ output must not cost a zero [N, *latent] gradient


def _backward(ctx, grad_mean, grad_log_prob, grad_guard, grad_log_ratio, grad_kl):
    """One elementwise pass (the backward op) for every input that needs a gradient."""
    x, v, x_next, a, b, std, old, ref = ctx.saved_tensors
    need = ctx.needs_input_grad
    mask = [need[0], need[1], need[2], need[6] and old is not None, need[7] and ref is not None]
    if not any(mask):
        return (None,) * 12

    def given(g):
        return None if g is None or g.numel() == 0 else g

    grads = torch.ops.flowgrpo.transition_terms_backward(
        given(grad_mean), given(grad_log_prob), given(grad_guard), given(grad_log_ratio),
        given(grad_kl), x, v, x_next, a, b, std, old, ref, *ctx.flags, mask,
    )
    gx, gv, gxn, gold, gref = (g if want else None for g, want in zip(grads, mask))
    return gx, gv, gxn, None, None, None, gold, gref, None, None, None, None


class _FusedTerms(torch.autograd.Function):
    """The op with the same backward as its registered autograd, for eager calls: Function.apply
    costs ~15 µs a call where the op's registered (torch.library) autograd costs ~80 µs, which
    dominates at tiny latent sizes. torch.compile traces either."""

    @staticmethod
    def forward(ctx, *inputs):
        output = torch.ops.flowgrpo.transition_terms(*inputs)
        _setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(_backward)


def fused_terms(x, v, x_next, a, b, std, old, ref, old_is_velocity: bool, ref_is_velocity: bool, reduce: str,
                return_mean: bool):
    """(mean, log_prob, guard, log_ratio, kl) of the op; empty tensors for the terms not asked for."""
    return _FusedTerms.apply(x, v, x_next, a, b, std, old, ref, old_is_velocity, ref_is_velocity, reduce, return_mean)


__all__ = ["fused_terms", "register_python_parts"]
