"""Learners: the update rules a preset chooses with ``learner.name`` (see base.py).

    transition      the denoising-MDP GRPO loss on stored SDE transitions (MATH.md §3)
    diffusion_nft   DiffusionNFT, forward-process negative-aware fine-tuning (MATH.md §5)
    awm             Advantage Weighted Matching (MATH.md §5)
    dgpo            Direct Group Preference Optimization (MATH.md §5)
"""

from __future__ import annotations

import importlib

from flowgrpo.learners.base import Advantages, Learner

LEARNERS = {
    "transition": "flowgrpo.learners.transition:TransitionLearner",
    "diffusion_nft": "flowgrpo.learners.nft:NFTLearner",
    "awm": "flowgrpo.learners.awm:AWMLearner",
    "dgpo": "flowgrpo.learners.dgpo:DGPOLearner",
}


def build_learner(trainer) -> Learner:
    module, name = LEARNERS[trainer.cfg.learner.name].split(":")
    return getattr(importlib.import_module(module), name)(trainer)


__all__ = ["Advantages", "LEARNERS", "Learner", "build_learner"]
