"""The wiring of the methods of the last year's mechanisms (docs/presets.md): each is a config option of the engine's
existing learners, plans and credit rules, and each test here fails when its piece is broken on purpose (the
injection is named in the docstring). Their formulas are pinned by hand in tests/engine/test_learner_formulas.py;
that each preset learns, with its controls, is tests/engine/test_learning.py's.
Run: pytest tests/engine/test_recent_methods.py -q"""

from __future__ import annotations

import pytest
import torch

from tolerance import assert_close_ulps
from train_fixtures import trainer_for

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def _two_step_run(tmp_path, *overrides):
    """Two iterations of Flow-GRPO's plan on the analytic world, two optimizer steps each (the second step's groups
    are scored by weights that have moved: ρ ≠ 1 there); returns the trained weights and the last metrics."""
    trainer = trainer_for(tmp_path, "flow_grpo", "train.iterations=2", "train.updates_per_epoch=2",
                          "train.learning_rate=3e-2", *overrides)
    last = trainer.train()
    return [p.detach().clone() for p in trainer.policy.params], last


def test_flow_dppo_mask_is_the_unclipped_loss_inside_the_region_and_drops_steps_outside_it(tmp_path):
    """loss.policy_loss=kl_mask with a threshold no step reaches trains exactly as the unclipped ratio (PPO with
    clip_range 1e9); with a threshold every moved step reaches, steps are dropped (clip_frac_*) and the weights end
    elsewhere. Injected: the KL taken between μ_θ and itself (never outside), the mask ignoring the threshold, the
    kl_mask option falling back to the clip."""
    unclipped, _ = _two_step_run(tmp_path / "a", "loss.clip_range=1e9")
    inside, metrics_in = _two_step_run(tmp_path / "b", "loss.policy_loss=kl_mask", "loss.kl_mask_threshold=1e9")
    for a, b in zip(inside, unclipped):
        assert_close_ulps(a, b, ulps=64)
    assert metrics_in["clip_frac_high"] == 0.0 and metrics_in["clip_frac_low"] == 0.0
    outside, metrics_out = _two_step_run(tmp_path / "c", "loss.policy_loss=kl_mask", "loss.kl_mask_threshold=1e-30")
    assert metrics_out["clip_frac_high"] + metrics_out["clip_frac_low"] > 0.0
    assert max(float((a - b).abs().max()) for a, b in zip(outside, inside)) > 1e-4
    # the clip at the small range of the tiny world acts differently from the mask (the option is read)
    clipped, _ = _two_step_run(tmp_path / "d", "loss.clip_range=1e-4")
    assert max(float((a - b).abs().max()) for a, b in zip(clipped, inside)) > 1e-4
