"""The learner interface: how an iteration's rollouts and advantages become optimizer steps.

Two families train on the same rollouts (any plan: chains, windows, trees, ODE or SDE kernels):

- the **transition learner** (``transition.py``, docs/math.md §3): the denoising-MDP GRPO loss on the
  stored SDE transitions and their per-step log-probs (Flow-GRPO, DanceGRPO, MixGRPO, BranchGRPO,
  TempFlow, GRPO-Guard, SAGE: every preset whose method is a rollout plan);
- the **forward-process learners** (``forward.py`` and one module per paper, docs/math.md §5): they take
  only the clean samples x0 a rollout produced, noise them again with the forward process and
  regress the velocity, weighted or contrasted by advantage (DiffusionNFT, AWM, DGPO).

A learner is chosen by ``learner.name`` (a preset sets it) and built with the run's config and the
``Policy`` (flowgrpo/engine/policy.py): the model, every copy of its weights and the services a learner
uses (velocity calls, backward, optimizer step, gather). A learner asks the policy for the copies it needs
(SAGE's anchor, NFT's sampling policy θ_old, AWM's EMA, DGPO's ema_ref) and names the one the rollout
samples with (``sampling_copy``); the policy keeps, follows and checkpoints them. Each iteration the loop
hands the learner a ``Rollouts`` record and logs the metrics ``update`` returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import samplers
from flowgrpo.engine.credit import Advantages


@dataclass
class Rollouts:
    """What one iteration hands the learner."""

    iteration: int
    plan: object  # samplers.Plan of the iteration: its grid (plan.sigmas) and time shift (plan.shift)
    batches: list  # flowgrpo.engine.rollout.Batch per rollout batch of this process
    advantages: Advantages  # per batch: [M_b] per stored transition, [L_b] per leaf (NaN = masked)


def seeded_permutation(n: int, *parts: int) -> torch.Tensor:
    """A permutation of range(n) drawn from the stream ``parts`` (samplers.make_generator)."""
    return torch.randperm(n, generator=samplers.make_generator(*parts))


def deal_samples(by_group: dict, updates: int, *parts: int) -> list[dict]:
    """train.update_split=samples: each group's samples in a seeded order (``parts`` and the group id), dealt out
    round-robin to the ``updates`` optimizer steps of a pass, so every step trains about 1/updates of every group (as
    the reference codes step every few samples of each process's batch). {group: [sample, ...]} -> one such mapping
    per update, groups and their samples in the order dealt."""
    out: list[dict] = [{} for _ in range(updates)]
    for g in sorted(by_group):
        members = by_group[g]
        for k, i in enumerate(seeded_permutation(len(members), *parts, g).tolist()):
            out[k % updates].setdefault(g, []).append(members[i])
    return out


class Learner:
    """Base class. Subclasses implement ``update``; the rest has defaults."""

    name = ""
    needs_transitions = True  # the rollout stores per-step transitions (states, log-probs)
    sampling_copy = None  # the WeightCopy the rollout samples with (None: the current weights)

    def __init__(self, cfg, policy):
        self.cfg, self.policy = cfg, policy

    @property
    def store_mean(self) -> bool:
        """Whether the rollout stores μ_old per trained transition."""
        return False

    def update(self, rollouts: Rollouts) -> dict:
        """Optimizer steps on this iteration's rollouts; returns the metrics to log."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        """What the learner carries across iterations besides the policy's tensors (saved in a checkpoint's state)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Put back what ``state_dict`` gave."""

    def describe(self, leaves_per_prompt: int, trained_per_prompt: int) -> str:
        """The start-up line that says what this learner trains per sample and per iteration."""
        raise NotImplementedError
