"""Off-policy replay (OP-GRPO; flowgrpo/engine/learners/replay.py, learner.replay): which samples are kept, how a
replayed one trains (its log-probs under θ_old, ρ = 1 at the first step, its sequence-level importance weight), that
its buffer goes through the checkpoint, and what it refuses. Its learning test and sign-flipped control are in
tests/engine/test_learning.py (RECIPE_MECHANISMS "flow_grpo-replay").
Run: pytest tests/engine/test_replay.py -q
"""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from samplers import compose_plan, rollout, score_transitions
from flowgrpo.engine.learners.replay import ReplayBuffer
from flowgrpo.engine.learners.transition import TransitionRow
from train_fixtures import trainer_for

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def test_the_best_positive_samples_are_kept_truncated_and_aged_out():
    """Per group the ``per_group`` samples with the highest positive advantage are kept (none of a group whose
    advantages are all ≤ 0), each with its transitions of the first ⌊steps·T⌋ steps only, its behaviour log-probs and
    its prompt; an entry is replayed for ``age`` iterations, then dropped."""
    plan = compose_plan(6, kernel="flow_sde", group_size=4, train_fraction=1.0)
    rec = rollout(lambda x, s, c: 0.3 * x, plan, prompt_ids=[0, 1], latent_shape=(3,), seed=2)
    batch = SimpleNamespace(record=rec, texts=["a cat", "a dog"], metadata=[{}, {}])
    roots = {}
    parents = rec.node_parent.tolist()
    for node in range(len(parents)):
        roots[node] = node if parents[node] < 0 else roots[parents[node]]
    adv = {(0, 0): 1.5, (0, 1): 0.2, (0, 2): -1.0, (0, 3): -0.7, (1, 0): -0.1, (1, 1): -0.2, (1, 2): 0.0, (1, 3): -0.3}
    rows, chains = [], []
    for r in range(rec.num_transitions):
        p, root = int(rec.prompt[r]), roots[int(rec.node[r])]
        rows.append(TransitionRow(0, r, adv[(p, root)], 1.0, p, p))
        chains.append((0, p, root))
    cfg = SimpleNamespace(per_group=1, age=2, steps=0.5, max_weight=2.0)
    buffer = ReplayBuffer(cfg)
    buffer.keep(7, [batch], rows, chains, plan.num_steps)
    assert len(buffer.entries) == 1  # group 1 has no positive sample
    e = buffer.entries[0]
    assert (e.origin, e.group, e.text, e.advantage) == (7, 0, "a cat", 1.5)
    assert e.step.tolist() == [0, 1, 2]  # ⌊0.5 · 6⌋ = 3 steps kept of the 6 trained
    mine = [r for r in range(rec.num_transitions) if int(rec.prompt[r]) == 0 and roots[int(rec.node[r])] == 0][:3]
    assert torch.equal(e.log_prob, rec.log_prob[mine]) and torch.equal(e.next_state, rec.next_state[mine])
    cfg.per_group = 2
    buffer.keep(8, [batch], rows, chains, plan.num_steps)  # iteration 8 keeps two; 7's entry is in its second iteration
    assert [(x.origin, x.advantage) for x in buffer.entries] == [(7, 1.5), (8, 1.5), (8, 0.2)]
    buffer.keep(9, [batch], [], [], plan.num_steps)  # 7's entry has been replayed in 8 and 9: dropped
    assert [x.origin for x in buffer.entries] == [8, 8]
    meta, tensors = buffer.state()
    again = ReplayBuffer(cfg)
    again.load(meta, tensors, world_then=1)
    assert [(x.origin, x.text) for x in again.entries] == [(8, "a cat"), (8, "a cat")]
    assert all(torch.equal(a.state, b.state) for a, b in zip(buffer.entries, again.entries))
    lp_now = torch.cat([x.log_prob + 0.1 for x in buffer.entries])  # 3 kept steps, each 0.1 more likely now
    spans = [range(0, 3), range(3, 6)]
    assert buffer.weights(lp_now, spans) == [pytest.approx(math.exp(0.3), rel=1e-6)] * 2  # float32 log-probs
    assert buffer.weights(lp_now + 1.0, spans) == [2.0, 2.0]  # capped at max_weight


def test_a_replayed_sample_trains_at_ratio_one_with_its_importance_weight(tmp_path):
    """On the analytic world (flow_grpo, one kept sample per group, replayed for one iteration): iteration 2 trains
    the kept samples' transitions beside the fresh ones; the contract ρ − 1 = 0 at its first step holds for them too
    (their log-probs are recomputed under θ_old); each one's weight is exp Σ (lp_now − lp_behaviour) with lp_now the
    executor's own scoring of the stored transitions under the weights after iteration 1 (a second path), and the
    loss changes when the weight is ignored."""
    trainer = trainer_for(tmp_path, "flow_grpo", "train.iterations=2", "learner.replay.per_group=1",
                          "learner.replay.steps=0.5", "learner.replay.max_weight=100.0")
    trainer.train()
    rows = [json.loads(line) for line in (Path(trainer.cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if "loss" in r]
    assert updates[0]["replay/transitions"] == 0 and updates[1]["replay/transitions"] > 0
    assert updates[1]["max_abs_ratio_minus_1_epoch0"] < 1e-6
    learner = trainer.learner
    buffer = learner.replay
    kept_steps = math.floor(0.5 * trainer.schedule.plan(0).num_steps)
    assert all(len(e.step) == kept_steps and e.origin == 1 for e in buffer.entries)  # iteration 1's, after 2
    # the weights of iteration 2's entries (kept after iteration 1) under the weights after iteration 2, both ways
    rb, spans = buffer.record(trainer.policy.model, trainer.policy.device)
    lp_learner, _ = learner._score(rb)
    velocity = trainer.policy.velocity_fn(rb.cond, trainer.cfg.sampling.guidance_scale)
    with torch.no_grad():
        lp_executor, _ = score_transitions(velocity, rb.record)
    torch.testing.assert_close(lp_learner, lp_executor, rtol=0, atol=1e-6 * float(lp_executor.abs().max()))
    w = buffer.weights(lp_learner, spans)
    for e, span, wk in zip(buffer.entries, spans, w):
        assert wk == pytest.approx(math.exp(float((lp_executor[span.start:span.stop].double() - e.log_prob.double()).sum())),
                                   rel=1e-5)
    assert any(abs(wk - 1) > 1e-4 for wk in w)  # the policy moved: the weights are not all 1


def test_the_importance_weight_reaches_the_loss(tmp_path, monkeypatch):
    """Negative control of the wiring: the same two iterations with every weight forced to 1 train differently (the
    loss of iteration 2 changes), and with the weights kept they equal a rerun exactly."""
    from flowgrpo.engine.learners import replay

    def loss_of_iteration_2(folder):
        trainer = trainer_for(folder, "flow_grpo", "train.iterations=2", "learner.replay.per_group=1",
                              "learner.replay.max_weight=100.0")
        trainer.train()
        rows = [json.loads(line) for line in (Path(trainer.cfg.run_dir) / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if "loss" in r][1]["loss"]

    kept = loss_of_iteration_2(tmp_path / "a")
    assert loss_of_iteration_2(tmp_path / "b") == kept
    monkeypatch.setattr(replay.ReplayBuffer, "weights", lambda self, lp, spans: [1.0] * len(spans))
    assert loss_of_iteration_2(tmp_path / "c") != kept


def test_the_buffer_goes_through_the_checkpoint_and_a_resumed_run_is_bit_identical(tmp_path):
    """3 iterations straight equal 2, a stop, and a resume (the kept samples are saved as replay.* tensors)."""
    common = ("learner.replay.per_group=2", "learner.replay.age=2", "log.save_every=1")
    straight = trainer_for(tmp_path / "a", "flow_grpo", "train.iterations=3", *common)
    straight.train()
    first = trainer_for(tmp_path / "b", "flow_grpo", "train.iterations=2", *common)
    first.train()
    resumed = trainer_for(tmp_path / "b", "flow_grpo", "train.iterations=3", "resume=true", *common)
    resumed.train()
    wa = load_file(Path(straight.cfg.run_dir) / "checkpoints" / "step_3" / "tensors.safetensors")
    wb = load_file(Path(resumed.cfg.run_dir) / "checkpoints" / "step_3" / "tensors.safetensors")
    assert wa.keys() == wb.keys() and any(k.startswith("replay.") for k in wa)
    assert all(torch.equal(wa[k], wb[k]) for k in wa), [k for k in wa if not torch.equal(wa[k], wb[k])][:5]


@pytest.mark.parametrize("overrides, match", [
    (("--preset", "diffusion_nft"), "does not train on"),
    (("--preset", "branchgrpo"), "use a chain plan"),
])
def test_replay_refuses_what_it_cannot_replay(overrides, match, tmp_path):
    from flowgrpo.config import load_config
    from flowgrpo.run.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_config(overrides[1], None, [f"output_dir={tmp_path}", "learner.replay.per_group=1"])


def test_a_sharded_run_is_refused_at_set_up(tmp_path):
    """FSDP2's checkpoints write each process's rows; the buffer is saved whole, so a sharded policy is refused."""
    from flowgrpo.config import load_config
    from flowgrpo.engine.learners.transition import TransitionLearner
    from flowgrpo.run.errors import ConfigError

    cfg = load_config("flow_grpo", None, [f"output_dir={tmp_path}", "learner.replay.per_group=1"])
    with pytest.raises(ConfigError, match="sharded \\(FSDP2\\) run does not write yet"):
        TransitionLearner(cfg, SimpleNamespace(sharding=object(), rank=0, world=2))
    assert TransitionLearner(cfg, SimpleNamespace(sharding=None, rank=0, world=1)).replay is not None
