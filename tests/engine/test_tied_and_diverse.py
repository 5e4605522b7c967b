"""Credit assignment on real rollouts: tied groups are not trained on, GARDO's diversity shaping scales the
positive advantages (flowgrpo/engine/credit.py: assign, tied_groups, diversity_scale)."""

from __future__ import annotations

import math

import pytest
import torch

from flowgrpo.config import load_config
from flowgrpo.engine import credit
from flowgrpo.engine.trainer import Trainer
from flowgrpo.run.paths import configs_dir
from train_fixtures import analytic_rollout as rollout


def leaf_groups(batches, records):
    gpp = records[0].groups_per_prompt
    return torch.cat([torch.tensor(b.slots)[rec.leaf_prompt] * gpp + rec.leaf_group % gpp
                      for b, rec in zip(batches, records)])


def assign(trainer, plan, batches, records, rewards, features=None, **changes):
    cfg = trainer.cfg.advantage
    for key, value in changes.items():
        setattr(cfg, key, value)
    weights = torch.ones(rewards.shape[1])
    return credit.assign(records, [b.slots for b in batches], rewards, weights, cfg, plan.branches,
                         lambda t: t, 0, features)


@pytest.mark.parametrize("preset", [None, "branchgrpo", "diffusion_nft"])
@pytest.mark.parametrize("rewards,multi", [(1, "gdpo"), (2, "sum"), (2, "gdpo")])
def test_a_tied_group_is_not_trained_on_and_the_others_are_unchanged(tmp_path, preset, rewards, multi):
    """A tied group gets A = 0 (also under GDPO, whose batch z-score of the summed group z-scores would shift it);
    skipped, its leaves and transitions are masked for the learners, the other groups' advantages unchanged."""
    trainer, plan, batches, records = rollout(tmp_path, preset, "train.prompts_per_iteration=4")
    groups = leaf_groups(batches, records)
    gen = torch.Generator().manual_seed(0)
    r = torch.rand(len(groups), rewards, generator=gen)
    tied_group = int(groups[0])
    r[groups == tied_group] = 0.5  # every reward tied in this group
    skipped, stats = assign(trainer, plan, batches, records, r.clone(), tied_groups="skip", multi_reward=multi)
    trained, _ = assign(trainer, plan, batches, records, r.clone(), tied_groups="train", multi_reward=multi)
    tied = groups == tied_group
    assert stats["zero_std_group_fraction"] == pytest.approx(1 / len(groups.unique()))
    leaves_s, leaves_t = torch.cat(skipped.leaves), torch.cat(trained.leaves)
    assert torch.equal(leaves_s, leaves_t) and trained.tied_leaves is None and trained.tied_transitions is None
    assert torch.equal(torch.cat(skipped.tied_leaves), tied)
    assert torch.equal(leaves_t[tied], torch.zeros(int(tied.sum()))) and not torch.isnan(leaves_t).any()
    assert (leaves_t[~tied] != 0).all()
    if not trainer.learner.needs_transitions:
        return
    offset = 0
    for rec, ts, tt, mask in zip(records, skipped.transitions, trained.transitions, skipped.tied_transitions):
        mine = tied[offset : offset + rec.num_leaves]
        of_tied = rec.transition_values(mine.float()) > 0.5
        assert of_tied.any() and torch.equal(mask, of_tied) and torch.equal(ts, tt)
        assert torch.equal(tt[of_tied], torch.zeros(int(of_tied.sum())))
        offset += rec.num_leaves


def test_the_forward_learners_never_compute_a_tied_sample_and_normalise_as_if_they_did(tmp_path):
    trainer, plan, batches, records = rollout(tmp_path, "diffusion_nft", "train.prompts_per_iteration=4")
    groups = leaf_groups(batches, records)
    r = torch.rand(len(groups), 1, generator=torch.Generator().manual_seed(1))
    r[groups == int(groups[0])] = 1.0
    from flowgrpo.engine.learners import Rollouts
    skipped, _ = assign(trainer, plan, batches, records, r, tied_groups="skip")
    samples = trainer.learner.samples(Rollouts(0, plan, batches, skipped))
    assert {s.group for s in samples if s.tied} == {int(groups[0])} and len(samples) == len(groups)
    by_group, trained = {}, {}
    for i, s in enumerate(samples):
        by_group.setdefault(s.group, []).append(i)
        if not s.tied:
            trained.setdefault(s.group, []).append(i)
    chunk = sorted(by_group)
    # the learner's own steps and micro-batches (Learner.update's): the tied group is never computed
    learner = trainer.learner
    work = learner.prepare(Rollouts(0, plan, batches, skipped))
    steps = list(learner.steps(work, 0))
    parts = [part for step in steps for part in learner.micro_batches(work, step, False)]
    computed = {m.sample.group for part in parts for m in part}
    assert int(groups[0]) not in computed and len(computed) == len(chunk) - 1
    K = trainer.cfg.learner.train_times
    assert [step.normaliser for step in steps] == [len(samples) * K]  # one update: tied rows counted
    assert learner.normalisation(samples, chunk, by_group) == len(samples) * K


def test_the_transition_learner_weighs_each_group_alike_and_each_step_by_its_share(tmp_path):
    """loss.normalize=group: each group's trained transitions share 1/G of the iteration's loss whatever their number,
    and a step's rows carry updates_per_epoch times their share (a step trains about 1/U of the groups); a sharded
    process's filler carries none. Catches: the group count dropped from the normaliser, the factor U dropped, a
    filler with weight."""
    from flowgrpo.engine.learners import Rollouts

    trainer, plan, batches, records = rollout(tmp_path, "flow_grpo", "train.prompts_per_iteration=4",
                                              "train.updates_per_epoch=2")
    groups = leaf_groups(batches, records)
    r = torch.rand(len(groups), 1, generator=torch.Generator().manual_seed(1))
    advantages, _ = assign(trainer, plan, batches, records, r)
    learner = trainer.learner
    work = learner.prepare(Rollouts(0, plan, batches, advantages))
    share: dict[int, float] = {}
    for row in work.rows:
        share[row.group] = share.get(row.group, 0.0) + row.coef
    assert len(share) == 4 and all(v == pytest.approx(0.25, rel=1e-12) for v in share.values())
    part = learner.micro_batches(work, next(iter(learner.steps(work, 0))), False)[0]
    seen = []
    learner._micro_step = lambda rows, coefs, batches, report=True: seen.append(coefs) or (None, {})
    learner.micro_loss(work, part, 0, True, True)
    learner.micro_loss(work, part, 0, True, False)
    assert seen[0] == [row.coef * 2 for row in part] and seen[1] == [0.0] * len(part)


def test_diversity_scale_hand_cases():
    # group 0: two identical samples and one orthogonal one; group 1: identical samples; group 2: one sample
    f = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [1.0, 1.0], [3.0, -1.0]])
    g = torch.tensor([0, 0, 0, 1, 1, 2])
    scale = credit.diversity_scale(f, g)
    # nearest cosine distances in group 0: 0, 0, 1 -> mean 1/3 -> 0, 0, 3
    assert scale[:3].tolist() == pytest.approx([0.0, 0.0, 3.0], abs=1e-6)
    assert scale[3:].tolist() == [1.0, 1.0, 1.0]  # no spread, or alone: unchanged
    assert float(scale[:3].mean()) == pytest.approx(1.0, abs=1e-6)


def test_diversity_shaping_scales_only_the_positive_advantages(tmp_path):
    trainer, plan, batches, records = rollout(tmp_path, "diffusion_nft", "train.prompts_per_iteration=2")
    groups = leaf_groups(batches, records)
    r = torch.rand(len(groups), 1, generator=torch.Generator().manual_seed(2))
    feats = torch.randn(len(groups), 5, generator=torch.Generator().manual_seed(3))
    plain, _ = assign(trainer, plan, batches, records, r.clone(), diversity=False)
    shaped, stats = assign(trainer, plan, batches, records, r.clone(), feats, diversity=True)
    a, b = torch.cat(plain.leaves), torch.cat(shaped.leaves)
    clip = trainer.cfg.advantage.clip
    expected = torch.where(a > 0, (a * credit.diversity_scale(feats, groups)).clamp(-clip, clip), a)
    assert torch.allclose(b, expected, rtol=1e-6, atol=1e-6 * float(a.abs().max()))
    assert torch.equal(b[a <= 0], a[a <= 0]) and not torch.equal(b[a > 0], a[a > 0])
    assert math.isfinite(stats["advantage/diversity_scale_min"])


def test_a_run_whose_groups_stay_tied_says_so_once(tmp_path, capsys):
    prompts = tmp_path / "all.txt"
    prompts.write_text("modes 0, 1, 2 and 3\n")  # every sample hits: every group tied
    cfg = load_config(None, None, [f"output_dir={tmp_path}", "resume=false", "log.progress=false", "log.gallery=false",
                                   "log.samples_every=0", "log.save_every=0", "eval.every=0", "eval.at_start=false",
                                   f"prompts={prompts}", "train.iterations=7"], base=str(configs_dir() / "analytic.yaml"))
    Trainer(cfg).train()
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if "had equal rewards" in line]
    assert len(lines) == 1, lines
    assert "100% of the groups had equal rewards over iterations 1-5" in lines[0]
    assert "not trained on" in lines[0] and "sampling.plan.group_size" in lines[0]


@pytest.mark.parametrize("preset", ["flow_grpo", "diffusion_nft", "dgpo"])
def test_skipping_tied_groups_takes_the_step_training_them_at_zero_takes(tmp_path, preset):
    """One iteration with some groups tied (a prompt every sample hits) and some not: skipping the tied groups leaves
    them out of every model call but in the normaliser, so the first step (θ_old = θ, no KL) equals the step that
    trains them at A = 0. Normalising by the untied groups alone would scale it up by their fraction's inverse."""
    prompts = tmp_path / "mixed.txt"
    prompts.write_text("modes 0, 1, 2 and 3\nmode 0\nmode 1\nmodes 0, 1, 2 and 3\n")
    deltas, fractions, norms = {}, {}, {}
    for tied in ("skip", "train"):
        cfg = load_config(preset, None, [f"output_dir={tmp_path / tied}", "resume=false", "log.progress=false",
                                         "log.gallery=false", "log.samples_every=0", "eval.every=0", "eval.at_start=false",
                                         "log.save_every=0", f"prompts={prompts}", "train.prompts_per_iteration=4",
                                         "train.iterations=1", f"advantage.tied_groups={tied}", "loss.kl_coef=0",
                                         "learner.kl_coef=0"], base=str(configs_dir() / "analytic.yaml"))
        trainer = Trainer(cfg)
        before = [p.detach().clone() for p in trainer.policy.params]
        last = trainer.train()
        deltas[tied] = torch.cat([(p.detach() - b).flatten() for p, b in zip(trainer.policy.params, before)])
        fractions[tied], norms[tied] = last["zero_std_group_fraction"], last["grad_norm"]
    assert 0 < fractions["skip"] < 1 and fractions["skip"] == fractions["train"]
    assert norms["skip"] == pytest.approx(norms["train"], rel=1e-4) and norms["train"] > 0  # Adam's step hides a scale
    scale = float(deltas["train"].abs().max())
    assert scale > 0 and torch.allclose(deltas["skip"], deltas["train"], rtol=1e-4, atol=1e-4 * scale)
