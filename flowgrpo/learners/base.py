"""The learner interface: how an iteration's rollouts and advantages become optimizer steps.

Two families train on the same rollouts (any plan: chains, windows, trees, ODE or SDE kernels):

- the **transition learner** (``transition.py``, MATH.md §3): the denoising-MDP GRPO loss on the
  stored SDE transitions and their per-step log-probs (Flow-GRPO, DanceGRPO, MixGRPO, BranchGRPO,
  TempFlow, GRPO-Guard, SAGE: every preset whose method is a rollout plan);
- the **forward-process learners** (``forward.py`` and one module per paper, MATH.md §5): they take
  only the clean samples x0 a rollout produced, noise them again with the forward process and
  regress the velocity, weighted or contrasted by advantage (DiffusionNFT, AWM, DGPO).

A learner is chosen by ``learner.name`` (a preset sets it). The trainer runs the loop's phases and
owns the model, its trainable parameters, the optimizer and the held-out EMA; a learner owns what
only it needs (SAGE's anchor, NFT's sampling policy θ_old, AWM's EMA), checkpoints it through
``state_tensors`` / ``state_dict``, and may change the weights the rollout samples with
(``sampling_weights``).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch


@dataclass
class Advantages:
    """An iteration's advantages, per rollout batch of this process (NaN = masked, clipped to ±clip)."""

    transitions: list[torch.Tensor]  # [M_b] per stored transition: the advantage of its x' node
    leaves: list[torch.Tensor]  # [L_b] per leaf (sample): group z-score (tree plans: the leaf node's depth-wise one)


class Learner:
    """Base class. Subclasses implement ``update``; the rest has defaults."""

    name = ""
    needs_transitions = True  # the rollout stores per-step transitions (states, log-probs)

    def __init__(self, trainer):
        self.trainer = trainer
        self.cfg = trainer.cfg

    @property
    def store_mean(self) -> bool:
        """Whether the rollout stores μ_old per trained transition."""
        return False

    def sampling_weights(self):
        """A context in which the rollout samples (default: the current weights)."""
        return nullcontext()

    def update(self, batches: list, advantages: Advantages) -> dict:
        """Optimizer steps on this iteration's batches; returns the metrics to log."""
        raise NotImplementedError

    def after_optimizer_step(self) -> None:
        """Called after every optimizer step that was taken."""

    def after_iteration(self) -> None:
        """Called once per iteration, after the update."""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors to checkpoint (names must not clash with the trainer's: weights., optim., ema.)."""
        return {}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def copy_into(self, values: list[torch.Tensor], tensors: dict[str, torch.Tensor], prefix: str) -> None:
        """Load checkpointed copies of the trainable parameters (``prefix.p0`` ...) into ``values``."""
        with torch.no_grad():
            for name, value in zip(self.trainer.names, values):
                value.copy_(tensors[f"{prefix}.{name}"])

    def named(self, values: list[torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}.{name}": v for name, v in zip(self.trainer.names, values)}
