"""How the transition learner deals a pass's trained transitions out to its optimizer steps (train.update_split,
flowgrpo/engine/learners/transition.py: TransitionLearner._updates): whole groups or trees per step (the default),
or every transition shuffled across them (BranchGRPO's code steps every 12 shuffled transitions), or every group's
chains dealt out so each step trains a share of every group (Flow-GRPO's, DanceGRPO's, MixGRPO's codes)."""

from __future__ import annotations

import pytest

from flowgrpo.config import ConfigError
from train_fixtures import analytic_rollout, trainer_for


def rows_of(groups: list[int]) -> list:
    """Rows as the learner builds them, one per transition of the given groups (prompt slot = group)."""
    from flowgrpo.engine.learners.transition import TransitionRow

    return [TransitionRow(0, i, 1.0, 1.0, g, g) for i, g in enumerate(groups)]


@pytest.mark.parametrize("split", ["groups", "transitions"])
def test_every_trained_transition_is_in_exactly_one_step(tmp_path, split):
    """Each non-tied row lands in one step of the pass, tied rows in none; by groups a step holds whole groups, by
    transitions the U steps' sizes differ by at most one and a step mixes groups; the deal is seeded by (seed,
    iteration, epoch): the same again, another for the next epoch."""
    trainer = trainer_for(tmp_path, "branchgrpo", f"train.update_split={split}", "train.updates_per_epoch=3")
    learner = trainer.learner
    groups = [g for g in range(4) for _ in range(6)]  # 4 trees of 6 transitions
    rows, tied = rows_of(groups), {0, 7}
    steps = learner._updates(rows, tied, sorted(set(groups)), 5, 0)
    assert len(steps) == 3
    dealt = sorted(i for step in steps for i in step)
    assert dealt == [i for i in range(len(rows)) if i not in tied]
    if split == "groups":
        for step in steps:
            whole = {groups[i] for i in step}
            assert sorted(step) == [i for i in range(len(rows)) if groups[i] in whole and i not in tied]
    else:
        sizes = sorted(len(step) for step in steps)
        assert sizes[-1] - sizes[0] <= 1
        assert all(len({groups[i] for i in step}) > 1 for step in steps)
    assert steps == learner._updates(rows, tied, sorted(set(groups)), 5, 0)
    assert steps != learner._updates(rows, tied, sorted(set(groups)), 5, 1)


def test_splitting_by_samples_keeps_each_chain_whole_and_gives_every_step_a_share_of_every_group(tmp_path):
    """update_split=samples: a chain's transitions land in one step, each step trains one of every group's three
    chains (U = 3), tied rows in none, seeded by (seed, iteration, epoch); the forward learner deals its samples the
    same way (each step half of every group at U = 2)."""
    from flowgrpo.engine.learners.base import deal_samples

    trainer = trainer_for(tmp_path, "flow_grpo", "train.update_split=samples", "train.updates_per_epoch=3")
    learner = trainer.learner
    groups = [g for g in range(4) for _ in range(6)]  # 4 groups of 3 chains of 2 transitions
    chains = [(0, g, i // 2) for i, g in enumerate(groups)]
    rows, tied = rows_of(groups), set()
    steps = learner._updates(rows, tied, sorted(set(groups)), 5, 0, chains)
    assert sorted(i for step in steps for i in step) == list(range(len(rows)))
    for step in steps:
        assert sorted({groups[i] for i in step}) == [0, 1, 2, 3] and len(step) == 8
        assert all(chains[i ^ 1] == chains[i] and (i ^ 1) in step for i in step)  # both transitions of the chain
    assert steps == learner._updates(rows, tied, sorted(set(groups)), 5, 0, chains)
    assert steps != learner._updates(rows, tied, sorted(set(groups)), 5, 1, chains)
    dealt = deal_samples({7: list(range(5)), 9: [10, 11, 12, 13]}, 2, 0, 13, 1, 0)
    assert [sorted(d[7]) + sorted(d[9]) for d in dealt] != [[], []]
    assert sorted(dealt[0][7] + dealt[1][7]) == list(range(5)) and (len(dealt[0][7]), len(dealt[1][7])) == (3, 2)
    assert (len(dealt[0][9]), len(dealt[1][9])) == (2, 2)
    nft = trainer_for(tmp_path / "nft", "diffusion_nft", "train.update_split=samples", "train.updates_per_epoch=2")
    by_group = {g: list(range(4 * g, 4 * g + 4)) for g in range(3)}
    updates = nft.learner.updates(by_group, sorted(by_group), 2, 0)
    assert [sorted(u) for u in updates] == [[0, 1, 2], [0, 1, 2]] and all(len(v) == 2 for u in updates for v in u.values())


def test_splitting_by_samples_is_refused_where_it_cannot_apply(tmp_path):
    with pytest.raises(ConfigError, match="tree"):
        trainer_for(tmp_path, "branchgrpo", "train.update_split=samples")
    with pytest.raises(ConfigError, match="DGPO"):
        trainer_for(tmp_path / "d", "dgpo", "train.update_split=samples")
    with pytest.raises(ConfigError, match="lower updates_per_epoch"):
        trainer_for(tmp_path / "f", "flow_grpo", "train.update_split=samples", "train.updates_per_epoch=100",
                    "train.prompts_per_iteration=100")


def test_splitting_by_transitions_takes_that_many_steps_on_a_tree(tmp_path):
    """A BranchGRPO iteration on the analytic world with more optimizer steps than trees (refused when steps take
    whole trees) takes exactly updates_per_epoch steps, each with a gradient."""
    trainer = trainer_for(tmp_path, "branchgrpo", "train.update_split=transitions", "train.updates_per_epoch=12",
                          "train.iterations=1")  # 8 trees, 3 of them untied at iteration 0
    last = trainer.train()
    assert 0 < last["zero_std_group_fraction"] < 1
    assert trainer.policy.optimizer_steps == 12
    assert last["skipped_steps"] == 0 and last["grad_norm"] > 0
    with pytest.raises(ConfigError, match="update_split=transitions"):
        trainer_for(tmp_path / "groups", "branchgrpo", "train.updates_per_epoch=12")


def test_only_the_transition_learner_splits_by_transitions(tmp_path):
    with pytest.raises(ConfigError, match="update_split=groups"):
        trainer_for(tmp_path, "diffusion_nft", "train.update_split=transitions")


def test_the_step_weight_scales_the_policy_term_and_not_the_kl(tmp_path):
    """SAGE's code multiplies its equaliser into the policy loss only; its KL terms are averaged unweighted. A row's
    contribution is c·(w·ℓ + KL): with the anchor moved off θ, the step's total at w = 0 is the KL part alone (not 0),
    and it is affine in w with slope Σ c·ℓ (fails if w multiplies the KL too)."""
    import torch

    rollout = analytic_rollout

    trainer, _, batches, _ = rollout(tmp_path, "sage")
    learner = trainer.learner
    with torch.no_grad():
        for value in learner.anchor.values:
            value.add_(0.05 * torch.randn(value.shape, generator=torch.Generator().manual_seed(0)))
    rec = batches[0].record
    from flowgrpo.engine.learners.transition import TransitionRow

    n = min(6, rec.num_transitions)
    coefs = [1.0 / n] * n
    totals = {}
    for w in (0.0, 1.0, 2.0):
        rows = [TransitionRow(0, r, 1.0 + r, w, 0, 0) for r in range(n)]
        totals[w] = float(learner._micro_step(rows, coefs, batches)[0].detach())
    assert abs(totals[0.0]) > 0
    slope = totals[1.0] - totals[0.0]
    assert abs(slope) > 0 and totals[2.0] - totals[0.0] == pytest.approx(2 * slope, rel=1e-5, abs=1e-6 * abs(slope))


def test_sages_adaptive_kl_weight_by_hand():
    """SAGE-GRPO's AdaptiveKLController (grpo_commons.py) with its recipe's numbers (ceiling = target 1e-5, floor =
    start 1e-7): each report uses the weight before it; the first 99 reports ramp it linearly, then the mean of the
    last 10 KLs above 1.5e-5 multiplies it by 0.9, below 0.5e-5 by 1.1, within [1e-7, 1e-5]."""
    from flowgrpo.engine.loss import SageKLWeight

    high, low = 1e-5, 1e-7
    w = SageKLWeight(high, low)
    used = [w.next(0.0) for _ in range(99)]
    assert used[0] == low and used[1] == pytest.approx(low + (high - low) / 100, rel=1e-12)
    assert used[-1] == pytest.approx(low + (high - low) * 98 / 100, rel=1e-12)
    assert w.next(0.0) == pytest.approx(low + (high - low) * 99 / 100, rel=1e-12)  # report 100: adaptive from here
    assert w.weight == high  # 0.9901e-5 x 1.1, clamped to the ceiling
    w.next(1.0)  # one large KL: the mean of the last 10 is 0.1 > 1.5e-5
    assert w.weight == pytest.approx(0.9 * high, rel=1e-12)
    for _ in range(9):
        w.next(high)  # the window still holds the 1.0: still too large
    assert w.weight == pytest.approx(0.9**10 * high, rel=1e-12)
    before = w.weight
    w.next(high)  # the window is 10 x 1e-5 now: within the band, unchanged
    assert w.weight == before
    for _ in range(200):
        w.next(1.0)
    assert w.weight == low  # the floor
    state = w.state_dict()
    again = SageKLWeight(high, low)
    again.load_state_dict(state)
    assert again.next(0.0) == w.next(0.0) and again.state_dict() == w.state_dict()


def test_the_adaptive_weight_scales_both_kl_terms_and_counts_real_transitions(tmp_path):
    """With loss.anchor_kl_schedule=sage the weight replaces anchor_kl_coef and the rollout term keeps its ratio: the
    KL part of a step (the step weight at 0) is weight/anchor_kl_coef times the constant schedule's; every computed
    transition reports once, a sharded stand-in or a matched zero-weight call none."""
    import torch

    rollout = analytic_rollout

    trainer, _, batches, _ = rollout(tmp_path, "sage", "loss.anchor_kl_schedule=sage")
    learner = trainer.learner
    with torch.no_grad():
        for value in learner.anchor.values:
            value.add_(0.05 * torch.randn(value.shape, generator=torch.Generator().manual_seed(0)))
    from flowgrpo.engine.learners.transition import TransitionRow

    rows = [TransitionRow(0, r, 1.0 + r, 0.0, 0, 0) for r in range(6)]  # w = 0: the KL terms alone
    coefs = [1.0 / len(rows)] * len(rows)
    controller, learner.kl_weight = learner.kl_weight, None
    constant = float(learner._micro_step(rows, coefs, batches)[0].detach())
    learner.kl_weight = controller
    controller.load_state_dict({"weight": 2.5e-3, "calls": 10**6, "recent": [0.01] * 10})  # in the band: unchanged
    adaptive = float(learner._micro_step(rows, coefs, batches, report=False)[0].detach())
    assert constant > 0 and adaptive == pytest.approx(constant * 2.5e-3 / 0.01, rel=1e-5)
    assert controller.calls == 10**6  # report=False: no report
    learner._micro_step(rows, coefs, batches)
    assert controller.calls == 10**6 + len(rows)


def test_the_adaptive_weight_resumes_from_the_checkpoint(tmp_path):
    common = ["loss.anchor_kl_schedule=sage", "log.save_every=1", "train.prompts_per_iteration=2"]
    first = trainer_for(tmp_path, "sage", "train.iterations=2", *common)
    last = first.train()
    assert last["kl_weight"] == first.learner.kl_weight.weight and first.learner.kl_weight.calls > 0
    cfg = first.cfg
    again = trainer_for(tmp_path, "sage", "train.iterations=3", *common, "resume=true")
    assert cfg.run_dir == again.cfg.run_dir and again.resume()
    assert again.learner.kl_weight.state_dict() == first.learner.kl_weight.state_dict()
