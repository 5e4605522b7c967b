"""The executor and the trajectory record (samplers/executor.py, samplers/trajectory.py).

Invariances (batch composition, chunk size, process split), the ratio == 1 contract (re-scoring
stored transitions gives the stored log-probs bit for bit), the seed contract (draws replayed from
the documented seed derivation), split-noise formulas, and the record's tree helpers.
The velocity here uses only + and × so that each row's output is exact whatever the batch.
Run: pytest tests/samplers/test_executor.py -q
"""

import math

import pytest
import torch

from samplers import (
    NFECounter,
    compose_plan,
    kernel_coefficients,
    log_prob,
    build_schedule,
    make_generator,
    rollout,
    sample_endpoints,
    score_transitions,
)
from flowgrpo.config import preset_plan
from samplers.grids import STREAM_INITIAL_NOISE, STREAM_STEP_NOISE


def velocity_for(prompt_ids):
    """A model conditioned on its prompts: cond_index rows pick a per-prompt embedding."""
    embedding = torch.tensor([0.05 * (p % 7 + 1) for p in prompt_ids])

    def velocity(x, sigma, cond_index):
        s = sigma.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
        c = embedding[cond_index].to(x.dtype).view_as(s)
        return x * (0.5 + s * s) - 0.1 * s * x * x + c

    return velocity


velocity = velocity_for(range(100))  # prompt ids double as conditioning rows


PLANS = {
    "flow_grpo": lambda: compose_plan(6, kernel="flow_sde", group_size=3, train_fraction=0.99),
    "dance_subset": lambda: compose_plan(8, kernel="dance_sde", group_size=4, train_subset_fraction=0.6),
    "mixgrpo_flash": lambda: compose_plan(10, group_size=2, window=(2, 3), post_window_ratio=0.4),
    "branch_mix": lambda: compose_plan(8, kernel="dance_sde", splits=(0, 2, 4), window=(5, 2)),
    "sage_tree": lambda: compose_plan(6, kernel="sage_sde", splits=(1, 3), branch_factor=3),
    "tempflow": lambda: compose_plan(6, kernel="ode", side_steps=(0, 2, 4), side_children=3, solver="dpmpp_2m"),
    "cps_independent": lambda: compose_plan(6, kernel="cps", group_size=2, initial_noise="independent"),
    # SA-Solver (noisy, corrected) around an SDE window, and between the split steps of a tree
    "sa_window": lambda: compose_plan(8, kernel="flow_sde", group_size=2, window=(2, 2), solver="sa_solver",
                                      sa_tau=0.5, grid_ends="awm"),
    "sa_tree": lambda: compose_plan(8, kernel="dance_sde", splits=(1, 4), window=(0, 1), solver="sa_solver",
                                    sa_tau=0.5),
}
TRANSITION_FIELDS = (
    "state", "next_state", "log_prob", "mean", "sigma", "sigma_next", "eta", "kernel", "step",
    "parent", "node", "loss_weight",
)


def run(plan, ids, **kwargs):
    kwargs.setdefault("latent_shape", (2, 3, 2))
    kwargs.setdefault("seed", 7)
    kwargs.setdefault("iteration", 3)
    return rollout(velocity_for(ids), plan, prompt_ids=ids, store_mean=True, **kwargs)


def assert_concatenation(whole, parts):
    """whole's rows equal the parts' rows one after the other (prompt-relative fields shifted)."""
    gpp, R = whole.groups_per_prompt, whole.root_state.shape[0] // whole.num_prompts
    offset = 0
    cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
    for name in TRANSITION_FIELDS + ("leaf_state", "leaf_node", "root_state"):
        assert torch.equal(getattr(whole, name), cat(name)), name
    prompts, groups, leaf_groups, leaf_roots = [], [], [], []
    for part in parts:
        prompts.append(part.prompt + offset)
        groups.append(part.group + offset * gpp)
        leaf_groups.append(part.leaf_group + offset * gpp)
        leaf_roots.append(part.leaf_root + offset * R)
        offset += part.num_prompts
    assert torch.equal(whole.prompt, torch.cat(prompts))
    assert torch.equal(whole.group, torch.cat(groups))
    assert torch.equal(whole.leaf_group, torch.cat(leaf_groups))
    assert torch.equal(whole.leaf_root, torch.cat(leaf_roots))


@pytest.mark.parametrize("name", sorted(PLANS))
def test_batched_equals_one_by_one(name):
    plan, ids = PLANS[name](), [5, 9, 2]
    whole = run(plan, ids)
    assert whole.num_transitions == 3 * plan.counts()["trained"]
    assert_concatenation(whole, [run(plan, [i]) for i in ids])


@pytest.mark.parametrize("name", ["flow_grpo", "branch_mix", "tempflow", "sa_tree"])
def test_process_split_and_chunk_size_change_nothing(name):
    plan = PLANS[name]()
    whole = run(plan, [10, 11, 12, 13])
    assert_concatenation(whole, [run(plan, [10, 11]), run(plan, [12, 13])])
    for max_batch in (1, 3, 5):
        chunked = run(plan, [10, 11, 12, 13], max_batch=max_batch)
        for field in TRANSITION_FIELDS + ("leaf_state", "group", "prompt"):
            assert torch.equal(getattr(chunked, field), getattr(whole, field)), (max_batch, field)


@pytest.mark.parametrize("name", sorted(PLANS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scoring_stored_transitions_reproduces_log_probs_exactly(name, dtype):
    record = run(PLANS[name](), [0, 1], dtype=dtype)
    assert record.state.dtype == record.next_state.dtype == dtype
    assert record.log_prob.dtype == record.mean.dtype == torch.float32
    lp, mean = score_transitions(velocity_for([0, 1]), record)
    assert torch.equal(lp, record.log_prob) and torch.equal(mean, record.mean)
    lp_chunked, _ = score_transitions(velocity_for([0, 1]), record, max_batch=4)
    assert torch.equal(lp_chunked, record.log_prob)


def test_log_prob_reduction_and_optional_mean():
    plan = PLANS["flow_grpo"]()
    mean_red = rollout(velocity, plan, prompt_ids=[1], latent_shape=(2, 3, 2), seed=0)
    sum_red = rollout(velocity, plan, prompt_ids=[1], latent_shape=(2, 3, 2), seed=0, reduce="sum")
    assert mean_red.mean is None and mean_red.reduce == "mean"
    torch.testing.assert_close(sum_red.log_prob, 12 * mean_red.log_prob)
    assert torch.equal(score_transitions(velocity, sum_red)[0], sum_red.log_prob)
    squared = rollout(velocity, plan, prompt_ids=[1], latent_shape=(2, 3, 2), seed=0, log_prob_form="squared_error")
    assert squared.log_prob_form == "squared_error" and torch.equal(squared.next_state, mean_red.next_state)
    assert torch.equal(score_transitions(velocity, squared)[0], squared.log_prob)  # ratio == 1 in that form too
    assert not torch.equal(squared.log_prob, mean_red.log_prob)


def test_rollouts_are_pure_functions_of_the_seed_parts():
    plan = PLANS["branch_mix"]()
    a, b = run(plan, [4, 8]), run(plan, [4, 8])
    assert all(torch.equal(getattr(a, f), getattr(b, f)) for f in TRANSITION_FIELDS)
    for change in ({"iteration": 4}, {"seed": 8}):
        c = run(plan, [4, 8], **change)
        assert not torch.equal(c.root_state, a.root_state) and not torch.equal(c.next_state, a.next_state)


def test_initial_noise_shared_or_independent_follows_the_seed_contract():
    shared = run(compose_plan(4, group_size=3), [6, 2], seed=1, iteration=9)
    for p, pid in enumerate([6, 2]):
        expected = torch.randn((2, 3, 2), generator=make_generator(STREAM_INITIAL_NOISE, 1, 9, pid, 0))
        for r in range(3):
            assert torch.equal(shared.root_state[3 * p + r], expected)
    independent = run(compose_plan(4, group_size=3, initial_noise="independent"), [6], seed=1, iteration=9)
    for r in range(3):
        expected = torch.randn((2, 3, 2), generator=make_generator(STREAM_INITIAL_NOISE, 1, 9, 6, r))
        assert torch.equal(independent.root_state[r], expected)
    # shared x_T, independent step noise: the group members still diverge
    assert len({tuple(x.flatten().tolist()) for x in shared.leaf_state[:3]}) == 3


@pytest.mark.parametrize("mode", ["correlated", "independent", "scaled_compat"])
def test_split_noise_formulas(mode):
    K, c, L = 3, 2.0, (4, 5)
    plan = compose_plan(
        4, kernel="dance_sde", splits=(1,), branch_factor=K, split_noise=mode, split_noise_scale=c
    )
    record = run(plan, [3], latent_shape=L, seed=2, iteration=1)
    rows = record.step == 1
    assert rows.sum() == K and record.parent[rows].tolist() == [1] * K  # node 1 is the level-1 node
    mean, nxt = record.mean[rows], record.next_state[rows]
    assert all(torch.equal(mean[0], mean[b]) for b in range(K))  # siblings share μ
    draws = K + 1 if mode == "correlated" else K
    raw = torch.randn((draws,) + L, generator=make_generator(STREAM_STEP_NOISE, 2, 1, 3, 1))
    if mode == "correlated":
        xi = (raw[:1] + c * raw[1:]) / math.sqrt(1 + c * c)
    elif mode == "scaled_compat":
        xi = c * raw
    else:
        xi = raw
    sig = plan.sigmas.to(torch.float32).tolist()
    std = float(kernel_coefficients("dance_sde", sig[1], sig[2], plan.steps[1].eta)[2])
    torch.testing.assert_close(nxt, mean + std * xi, rtol=1e-6, atol=1e-6)
    # every mode scores x' with the kernel's own std (scaled_compat is therefore not a density)
    torch.testing.assert_close(record.log_prob[rows], log_prob(nxt, mean, torch.full((K,), std)))


def test_correlated_split_children_have_the_paper_correlation():
    """ξ_b = (ξ_0 + c·η_b)/√(1+c²): unit variance, pairwise correlation 1/(1+c²)."""
    c, L = 1.0, (64,)
    plan = compose_plan(2, kernel="dance_sde", splits=(0,), branch_factor=2, split_noise_scale=c)
    record = run(plan, list(range(60)), latent_shape=L)
    rows = record.step == 0
    mean, nxt = record.mean[rows].view(60, 2, -1), record.next_state[rows].view(60, 2, -1)
    std = float(kernel_coefficients("dance_sde", *plan.sigmas.to(torch.float32)[:2].tolist(), 0.3)[2])
    xi = ((nxt - mean) / std).double()
    assert abs(xi.var().item() - 1) < 0.06
    corr = torch.corrcoef(torch.stack([xi[:, 0].flatten(), xi[:, 1].flatten()]))[0, 1].item()
    assert abs(corr - 1 / (1 + c * c)) < 0.06  # 3840 pairs: standard error ≈ 0.014


def test_record_holds_only_trained_transitions_and_the_tree():
    plan = compose_plan(10, group_size=2, window=(3, 4))
    record = run(plan, [0, 1])
    assert sorted(set(record.step.tolist())) == [3, 4, 5, 6]
    assert record.num_transitions == 2 * 2 * 4 and record.num_leaves == 4
    # parent/depth are consistent: x' of a transition at step i is a node at depth i + 1
    assert torch.equal(record.node_depth[record.node], record.step + 1)
    assert torch.equal(record.node_parent[record.node], record.parent)
    assert torch.equal(record.cond_index, record.prompt)  # default conditioning rows


def test_sample_endpoints_matches_the_full_rollout():
    plan = PLANS["tempflow"]()
    record = run(plan, [3, 1], dtype=torch.bfloat16)
    counter = NFECounter()
    ends = sample_endpoints(velocity_for([3, 1]), plan, prompt_ids=[3, 1], latent_shape=(2, 3, 2),
                            seed=7, iteration=3, dtype=torch.bfloat16, nfe=counter)
    assert torch.equal(ends.final, record.leaf_state)
    assert torch.equal(ends.initial, record.root_state[record.leaf_root])
    assert torch.equal(ends.group, record.leaf_group) and ends.nfe == record.nfe == counter.as_dict()


def test_video_latents_and_conditioning_rows():
    plan = build_schedule({**preset_plan("branchgrpo")[0], "num_steps": 6, "splits": (0, 2)}).plan(0)
    seen = []

    def spy(x, sigma, cond_index):
        seen.append(cond_index.unique().tolist())
        return velocity(x, sigma, cond_index)

    record = rollout(spy, plan, prompt_ids=[0, 1], cond_index=[4, 2], latent_shape=(2, 3, 4, 4), seed=0)
    assert record.state.shape[1:] == (2, 3, 4, 4) and record.leaf_state.shape == (8, 2, 3, 4, 4)
    assert all(s == [2, 4] for s in seen) and set(record.cond_index.tolist()) == {2, 4}


def test_node_values_average_descendant_leaves():
    plan = compose_plan(6, kernel="dance_sde", splits=(0, 2))
    record = run(plan, [0, 1])
    rewards = torch.arange(record.num_leaves, dtype=torch.float64) ** 2
    values = record.node_values(rewards)
    parents = record.node_parent.tolist()

    def ancestors(node):
        while node >= 0:
            yield node
            node = parents[node]

    for p in range(2):
        rows = zip(record.leaf_node.tolist(), record.leaf_prompt.tolist(), rewards.tolist())
        leaves = [(n, r) for n, q, r in rows if q == p]
        for node in range(len(parents)):
            below = [r for leaf, r in leaves if node in ancestors(leaf)]
            assert values[p, node].item() == pytest.approx(sum(below) / len(below))
    chain = run(compose_plan(4, group_size=3), [0])
    per_leaf = torch.tensor([1.0, 2.0, 3.0])
    credited = chain.transition_values(per_leaf)
    assert torch.equal(credited, per_leaf[chain.node % 3])  # a chain's edges get its own reward


def test_bookkeeping_view_moves_every_index_field_and_keeps_the_latents():
    """The trainer's advantage arithmetic runs on ``bookkeeping_on_cpu()`` (rewards are CPU tensors; a GPU
    record's indices cannot index them): every integer field must be in the view, latents stay put."""
    from dataclasses import fields

    record = run(compose_plan(6, kernel="dance_sde", splits=(0, 2)), [0, 1])
    view = record.bookkeeping_on_cpu()
    for f in fields(record):
        value, moved = getattr(record, f.name), getattr(view, f.name)
        if isinstance(value, torch.Tensor) and value.dtype == torch.int64:
            assert moved.device.type == "cpu" and torch.equal(moved, value), f.name
        elif isinstance(value, torch.Tensor) and value.ndim > 1:
            assert moved is value, f"{f.name}: latents are not copied"
    rewards = torch.arange(record.num_leaves, dtype=torch.float64)
    assert torch.equal(view.transition_values(rewards), record.transition_values(rewards))


def test_nfe_counter_accumulates_and_round_trips():
    counter = NFECounter()
    plan = PLANS["branch_mix"]()
    run(plan, [0], nfe=counter)
    run(plan, [1, 2], nfe=counter)
    assert counter["rollout"] == 3 * plan.counts()["nfe"]
    restored = NFECounter()
    restored.load_state_dict(counter.state_dict())
    assert restored.as_dict() == counter.as_dict()
    with pytest.raises(ValueError, match="unknown NFE category"):
        counter.add("forward", 1)


def test_bad_inputs_raise_with_the_fix():
    plan = PLANS["flow_grpo"]()
    with pytest.raises(ValueError, match="velocity returned"):
        rollout(lambda x, s, c: x[:, :1], plan, prompt_ids=[0], latent_shape=(2, 2), seed=0)
    with pytest.raises(ValueError, match="one conditioning row per prompt"):
        rollout(velocity, plan, prompt_ids=[0, 1], cond_index=[0], latent_shape=(2, 2), seed=0)
    with pytest.raises(ValueError, match="per-sample shape"):
        rollout(velocity, plan, prompt_ids=[0], latent_shape=(), seed=0)
    with pytest.raises(TypeError, match="samplers.Plan"):
        rollout(velocity, build_schedule(preset_plan("flow_grpo")[0]), prompt_ids=[0], latent_shape=(2,), seed=0)


@pytest.mark.parametrize("plan", ["chain", "tree"])
def test_predicted_leaves_are_the_last_steps_data_prediction(plan):
    """leaf="predicted" (DanceGRPO's, BranchGRPO's codes reward it): every sample is x̂0 = x − σ·v at the last step's
    start, by hand from the stored last transition; the draws, the transitions and their log-probs are those of the
    plain rollout, whose samples are the last x' (a noisy step: they differ)."""
    kwargs = dict(kernel="dance_sde", eta=0.3, train_fraction=1.0, train_last=True)
    kwargs.update(group_size=3) if plan == "chain" else kwargs.update(splits=(0, 2), branch_factor=2)
    plain = rollout(velocity, compose_plan(6, **kwargs), prompt_ids=[3, 4], latent_shape=(2, 3, 2), seed=1)
    pred = rollout(velocity, compose_plan(6, leaf="predicted", **kwargs), prompt_ids=[3, 4], latent_shape=(2, 3, 2),
                   seed=1)
    for field in TRANSITION_FIELDS:
        a, b = getattr(plain, field), getattr(pred, field)
        assert (a is None and b is None) or torch.equal(a, b), field
    last = (plain.step == 5).nonzero().squeeze(1)  # the last step's transitions, one per leaf, in (prompt, node) order
    assert torch.equal(plain.node[last], plain.leaf_node) and torch.equal(plain.next_state[last], plain.leaf_state)
    x, sigma = plain.state[last], plain.sigma[last]
    by_hand = x - sigma.view(-1, 1, 1, 1) * velocity(x, sigma, plain.cond_index[last])
    assert torch.equal(pred.leaf_state, by_hand)
    assert not torch.equal(pred.leaf_state, plain.leaf_state)
    with pytest.raises(ValueError, match="leaf must be one of"):
        compose_plan(6, leaf="mean")
