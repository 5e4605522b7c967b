"""Learners: the update rules a preset chooses with ``learner.name`` (see base.py).

    transition      the denoising-MDP GRPO loss on stored SDE transitions (docs/math.md §3)
    diffusion_nft   DiffusionNFT, forward-process negative-aware fine-tuning (docs/math.md §5)
    awm             Advantage Weighted Matching (docs/math.md §5)
    dgpo            Direct Group Preference Optimization (docs/math.md §5)
    crd             Centered Reward Distillation (docs/math.md §5)

Their names and classes are one registry, ``flowgrpo.config.schema.LEARNERS`` (the config checks a run's learner
before anything loads).

A learner is built with the run's config and the policy (flowgrpo/engine/policy.py), never with the loop.
"""

from __future__ import annotations

import importlib

from flowgrpo.config.schema import LEARNERS
from flowgrpo.engine.learners.base import Learner, Rollouts


def build_learner(cfg, policy) -> Learner:
    module, name = LEARNERS[cfg.learner.name].split(":")
    return getattr(importlib.import_module(module), name)(cfg, policy)


__all__ = ["LEARNERS", "Learner", "Rollouts", "build_learner"]
