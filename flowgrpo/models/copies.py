"""Copies of weights: the one mechanism behind every extra set of weights training keeps.

A ``WeightCopy`` holds one tensor per source tensor and follows its source by a rule of the number n
of optimizer steps taken so far:

    copy ← λ(n)·copy + (1 − λ(n))·source        λ = ``keep(n)``; λ = 0 copies the source exactly,
                                                 λ = 1 leaves the copy as it is

That one rule is every copy in flowgrpo (docs/design.md, "The policy and its copies"):

    the evaluation EMA (train.ema_decay)     λ = min(decay, (1 + n)/(10 + n)), after every optimizer step
    DiffusionNFT's sampling policy θ_old     λ = min(rate·(n − delay), max), after every iteration
    AWM's EMA, DGPO's ema_ref                the same soft schedule (after each iteration / step)
    SAGE's moving anchor                     λ = 0 every ``anchor_refresh`` steps, else 1
    AWM's rollout weights ℓ_old              set from θ (or the EMA) before each update
    full fine-tuning's frozen reference      λ = 1: taken from the base weights once, never followed
    pretraining's EMA (flowgrpo/tiny)        the same warmed decay, every step

It lives beside the model (flowgrpo/models/) because the model's own reference policy is one; the
engine's policy (flowgrpo/engine/policy.py) makes, follows and checkpoints the others.

``swapped_into(targets)`` exchanges the copy's values with the targets' for a ``with`` block and
exchanges them back after it (sampling or evaluating with a copy): in place, one tensor at a time, so
it needs memory for one tensor, not a second set of weights, and the targets stay the very tensors a
sharded network gathers from. Tensors that are not floating point (integer buffers of a state dict)
are always copied exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch

FOLLOWS = ("step", "iteration", "never")


def warmed_decay(decay: float) -> Callable[[int], float]:
    """λ(n) = min(decay, (1 + n)/(10 + n)): an EMA that follows its source closely over the first steps (λ = 2/11
    after the first step, 0.5 after the eighth) and settles at ``decay``, the warm-up of the EMA every official
    repository flowgrpo's presets follow uses for its evaluation weights."""
    return lambda n: min(decay, (1 + n) / (10 + n))


def soft_keep(rate: float, ceiling: float, delay: int = 0, start: float = 0.0) -> Callable[[int], float]:
    """λ(n) = min(start + rate·(n − delay), ceiling) for n > delay optimizer steps, else ``start`` (0: the copy
    follows exactly; CRD's old policy starts at λ = 0.25)."""

    def keep(n: int) -> float:
        after = n - delay
        return start if after <= 0 else min(start + rate * after, ceiling)

    return keep


def refresh_every(steps: int) -> Callable[[int], float]:
    """λ(n) = 0 (copy the source) every ``steps`` optimizer steps, else 1 (keep the copy)."""
    return lambda n: 0.0 if n % steps == 0 else 1.0


class WeightCopy:
    """One copy of a list of tensors, following them by ``keep`` (see the module docstring).

    ``follows``: when its owner calls ``follow``: after every optimizer step ("step"), once per
    iteration ("iteration"), or only when told (``assign``, "never"). ``saved``: whether checkpoints
    hold it (a copy rebuilt every iteration need not be saved)."""

    def __init__(self, name: str, sources: Sequence[torch.Tensor], keep: Callable[[int], float] | float = 0.0,
                 follows: str = "step", saved: bool = True):
        if follows not in FOLLOWS:
            raise ValueError(f"follows={follows!r}; use one of {FOLLOWS}")
        self.name, self.follows, self.saved = name, follows, saved
        self.keep = keep if callable(keep) else (lambda n, value=float(keep): value)
        self.values = [t.detach().clone() for t in sources]

    @torch.no_grad()
    def follow(self, sources: Sequence[torch.Tensor], n: int) -> None:
        """copy ← λ·copy + (1 − λ)·source with λ = keep(n)."""
        keep = self.keep(n)
        if keep == 1.0:
            return
        for value, source in zip(self.values, sources):
            if keep == 0.0 or not value.dtype.is_floating_point:
                value.copy_(source)
            else:
                value.lerp_(source.detach(), 1.0 - keep)

    @torch.no_grad()
    def assign(self, sources: Sequence[torch.Tensor]) -> None:
        """Copy ``sources`` exactly (e.g. the weights a rollout was made with)."""
        for value, source in zip(self.values, sources):
            value.copy_(source)

    @torch.no_grad()
    def _exchange(self, targets: Sequence[torch.Tensor]) -> None:
        for t, v in zip(targets, self.values):
            held = t.detach().clone()
            t.copy_(v)
            v.copy_(held)

    @contextmanager
    def swapped_into(self, targets: Sequence[torch.Tensor]):
        """Inside: ``targets`` hold this copy's values (and the copy theirs); after: each its own again, exactly."""
        self._exchange(targets)
        try:
            yield
        finally:
            self._exchange(targets)

    def named(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """The copy's tensors as ``{name.p0: ...}`` for a checkpoint."""
        return {f"{self.name}.{n}": v for n, v in zip(names, self.values)}

    def load_named(self, tensors: dict[str, torch.Tensor], names: Sequence[str]) -> None:
        self.assign([tensors[f"{self.name}.{n}"] for n in names])


__all__ = ["FOLLOWS", "WeightCopy", "refresh_every", "soft_keep", "warmed_decay"]
