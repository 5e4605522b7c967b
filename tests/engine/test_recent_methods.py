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


def _trained(tmp_path, preset, *overrides):
    trainer = trainer_for(tmp_path, preset, "train.iterations=2", "train.updates_per_epoch=2",
                          "train.learning_rate=3e-2", "train.prompts_per_iteration=4", *overrides)
    last = trainer.train()
    return [p.detach().clone() for p in trainer.policy.params], last


def _far(a, b) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("preset", ["vgrpo", "crd"])
def test_a_sample_or_group_the_loss_reads_whole_is_never_split_by_micro_batches(tmp_path, preset):
    """V-GRPO's ratio is formed over a sample's K draws (awm.ratio=sample), CRD centres a group's members on each draw:
    both read a unit whole, so one row per micro-batch trains exactly as one micro-batch for everything. Injected: the
    learner's unit "row" (a micro-batch of one draw: V-GRPO's mean over one draw, CRD's centring of one row to 0):
    the weights then end 0.10-0.14 apart; CRD's centring over the micro-batch instead of the group (the large
    micro-batch mixes groups). Summed in another order the gradients differ by rounding, which Adam's first steps
    (g/√v) carry into the weights at up to ~2e-5 here: hence the 1e-3 bound on the weights, not a few ulps."""
    whole, _ = _trained(tmp_path / "whole", preset, "train.micro_batch=100000")
    rows, _ = _trained(tmp_path / "rows", preset, "train.micro_batch=1")
    assert _far(rows, whole) < 1e-3


def test_v_grpo_sample_ratio_is_read_and_differs_from_the_per_draw_ratio(tmp_path):
    """After the first step the weights moved: the per-sample ratio (mean ℓ inside the exp, clipped once) and AWM's
    per-draw ratios clip differently. Injected: awm.ratio ignored."""
    sample, metrics = _trained(tmp_path / "s", "vgrpo", "learner.awm.clip_range=1e-3")
    draw, _ = _trained(tmp_path / "d", "vgrpo", "learner.awm.clip_range=1e-3", "learner.awm.ratio=draw")
    assert metrics["awm/clip_frac"] > 0.0 and _far(sample, draw) > 1e-5


def test_crd_reward_adaptive_kl_and_its_anchor_scale_are_read(tmp_path):
    """The KL weight per sample (m + a·(1 − m)) and the anchor's CFG scale change the update; a zero KL coefficient
    leaves only the centred policy term. Injected: reward_adaptive_kl ignored, kl_cfg ignored."""
    base, _ = _trained(tmp_path / "a", "crd", "learner.kl_coef=1.0")
    flat, _ = _trained(tmp_path / "b", "crd", "learner.kl_coef=1.0", "learner.crd.reward_adaptive_kl=false")
    guided, _ = _trained(tmp_path / "c", "crd", "learner.kl_coef=1.0", "learner.crd.kl_cfg=3.0")
    assert _far(base, flat) > 1e-5 and _far(base, guided) > 1e-5
