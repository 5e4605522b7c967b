"""The optimizers a run can train with (``train.optimizer``): AdamW, or Muon as SAGE-GRPO's code trains.

**Muon** (MomentUm Orthogonalized by Newton-Schulz; docs/math.md §3, "Muon"). For a weight W with two or more
dimensions (a LoRA factor, a linear or convolution weight; A×B its first two sizes), with gradient G:

    m ← μ·m + G,   U = G + μ·m (Nesterov),   O ≈ orthogonal factor of U (5 Newton-Schulz steps, in float32),
    W ← (1 − lr·λ)·W − lr·0.2·√max(A, B)·O

The Newton-Schulz iteration starts from X = U/(‖U‖_F + 1e-7) (transposed when it has more rows than columns) and
repeats X ← a·X + (b·XXᵀ + c·(XXᵀ)²)·X with (a, b, c) = (3.4445, −4.7750, 2.0315): the singular values of X move
toward 1 (into about [0.7, 1.2]), its singular vectors stay. The factor 0.2·√max(A, B) gives the update the RMS of
an AdamW update, so a learning rate means about what it means for AdamW. Weights of fewer dimensions (biases,
norms) take AdamW: m ← β1·m + (1 − β1)·g, v ← β2·v + (1 − β2)·g², W ← (1 − lr·λ)·W − lr·(√(1 − β2ⁿ)/(1 − β1ⁿ))·
m/(√v + ε). SAGE-GRPO trains with HunyuanVideo-1.5's version of this (μ = 0.95, β = (0.95, 0.95), ε = 1e-8, which
orthogonalises in bfloat16; here float32).

Sharded (FSDP2), a weight is a DTensor: its orthogonal factor needs the whole matrix, so every process gathers U,
computes the same O and keeps its own rows of it (no second collective).
"""

from __future__ import annotations

import math

import torch

NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)


def orthogonalize(update: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The Newton-Schulz approximation of the orthogonal factor of a matrix (2-D, float32; see the module docstring)."""
    a, b, c = NEWTON_SCHULZ
    tall = update.shape[0] > update.shape[1]
    x = update.mT if tall else update
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.mT if tall else x


def _whole(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``value`` (whole) laid out as ``param``: its rows of this process when ``param`` is a DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):
        return distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
    return value


class Muon(torch.optim.Optimizer):
    """Muon on the weights of two or more dimensions, AdamW on the rest (see the module docstring)."""

    def __init__(self, params, lr: float, weight_decay: float = 0.0, momentum: float = 0.95,
                 betas: tuple[float, float] = (0.95, 0.95), eps: float = 1e-8, ns_steps: int = 5):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, betas=tuple(betas), eps=eps,
                                      ns_steps=ns_steps))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    (self._muon if p.ndim >= 2 else self._adamw)(p, self.state[p], group)
        return None

    @staticmethod
    def _muon(p: torch.Tensor, state: dict, group: dict) -> None:
        lr, decay, mu = group["lr"], group["weight_decay"], group["momentum"]
        grad = p.grad.float()
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(grad)
        buf = state["momentum_buffer"]
        buf.mul_(mu).add_(grad)
        update = _whole(grad.add(buf, alpha=mu))
        shape = update.shape
        ortho = orthogonalize(update.reshape(shape[0], -1), group["ns_steps"]).reshape(shape)
        p.mul_(1 - lr * decay)
        p.add_(_like(ortho.to(p.dtype), p), alpha=-lr * 0.2 * math.sqrt(max(shape[0], shape[1])))

    @staticmethod
    def _adamw(p: torch.Tensor, state: dict, group: dict) -> None:
        lr, decay, (beta1, beta2), eps = group["lr"], group["weight_decay"], group["betas"], group["eps"]
        grad = p.grad.float()
        if "exp_avg" not in state:
            state["step"] = 0
            state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(grad), torch.zeros_like(grad)
        state["step"] += 1
        n = state["step"]
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].lerp_(grad.square(), 1 - beta2)
        p.mul_(1 - lr * decay)
        p.add_((state["exp_avg"] / (state["exp_avg_sq"].sqrt() + eps)).to(p.dtype),
               alpha=-lr * math.sqrt(1 - beta2**n) / (1 - beta1**n))


def build_optimizer(name: str, params, *, learning_rate: float, weight_decay: float, betas) -> torch.optim.Optimizer:
    """``train.optimizer``: adamw (torch's AdamW) or muon (``Muon``, its AdamW part with ``betas``)."""
    if name == "muon":
        return Muon(params, lr=learning_rate, weight_decay=weight_decay, betas=tuple(betas))
    return torch.optim.AdamW(params, lr=learning_rate, weight_decay=weight_decay, betas=tuple(betas))


def learning_rate_at(t, iteration: int) -> float:
    """train.learning_rate scaled by train.lr_schedule at ``iteration`` of train.iterations (0-based; the
    last iteration's rate is lr_final·learning_rate)."""
    if t.lr_schedule == "constant":
        return t.learning_rate
    progress = min(1.0, iteration / max(1, t.iterations - 1))
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if t.lr_schedule == "cosine" else 1.0 - progress
    return t.learning_rate * (t.lr_final + (1.0 - t.lr_final) * shape)

__all__ = ["Muon", "build_optimizer", "learning_rate_at", "orthogonalize"]
