"""Side lanes that span several grid intervals (samplers/tree.py, samplers/executor.py): E-GRPO's merged SDE step and
the strided ODE lanes G²RPO and E-GRPO finish each side child with (their codes' ``granular_list``).

The reference here is the official codes' algorithm written out directly (bcmi/Granular-GRPO
fastvideo/train_g2rpo_hps.py, shengjun-zhang/VisualGRPO fastvideo/workers/sampler/flux_sampler.py): an ODE anchor
from x_T; at branch step e one flow-GRPO SDE step σ_e → σ_{e+m}; then for each granularity g the ODE over the points
e+m, e+m+1, e+m+1+g, … of the grid, the sample being the last step's x̂0. The rollout is run in float64 and compared
within a few float64 ulps of each value's size.
Run: pytest tests/samplers/test_lanes.py -q
"""

import math
from types import SimpleNamespace

import pytest
import torch

from samplers import compose_plan, rollout, score_transitions
from samplers.tree import template_for

T = 8


def velocity(x, sigma, cond_index):
    s = sigma.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
    c = (0.05 * (cond_index.to(x.dtype) % 7 + 1)).view_as(s)
    return x * (0.5 + s * s) - 0.1 * s * x * x + c


class Counting:
    """The velocity, counting the rows it is called on."""

    def __init__(self):
        self.rows = 0

    def __call__(self, x, sigma, cond_index):
        self.rows += x.shape[0]
        return velocity(x, sigma, cond_index)


def plan_for(leaf, merge=(3, 1), strides=(1, 2)):
    return compose_plan(T, kernel="ode", side_steps=(1, 3), side_merge=merge, side_children=3, side_eta=0.7,
                        side_strides=strides, leaf=leaf)


def run(plan, v=velocity, prompts=(4, 9)):
    return rollout(v, plan, prompt_ids=list(prompts), latent_shape=(2, 3), seed=5, iteration=2, dtype=torch.float64,
                   store_mean=True)


def close(actual, expected, ulps=64):
    actual, expected = torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64)
    scale = expected.abs().max().clamp(min=1.0)
    assert torch.allclose(actual, expected, rtol=0, atol=ulps * torch.finfo(torch.float64).eps * float(scale)), (
        (actual - expected).abs().max())


def lane_points(start, stride, leaf):
    """The official granular schedule after the SDE step: start, start + 1, then every ``stride`` points; it stops at
    the last point ≤ T (its sample is that step's x̂0). Under leaf="sample" it is finished to σ = 0."""
    points = [start, start + 1]
    while points[-1] + stride <= T:
        points.append(points[-1] + stride)
    if leaf == "sample" and points[-1] != T:
        points.append(T)
    return points


def ancestors(rec, node):
    chain = []
    while node >= 0:
        chain.append(node)
        node = int(rec.node_parent[node])
    return chain


@pytest.mark.parametrize("leaf", ["predicted", "sample"])
def test_merged_side_steps_and_strided_lanes_are_the_official_algorithm(leaf):
    """Every stored transition is one SDE step from the ODE anchor's state at its branch step e to σ_{e+m} (the
    merged span), with the flow-GRPO mean and std over that span and its log-prob the Gaussian's
    (torch.distributions); every sample of a side child is its lane's ODE from x' over the granular points, and the
    main lane's sample is the anchor's."""
    plan = plan_for(leaf)
    rec = run(plan)
    sig = [float(s) for s in plan.sigmas.to(torch.float32)]
    merge = {1: 3, 3: 1}
    assert sorted(set(rec.step.tolist())) == [1, 3] and rec.num_transitions == 2 * 2 * 3
    for p in range(2):
        cond = torch.tensor([rec.prompt_cond[p]])
        x = rec.root_state[p : p + 1]
        anchor = [x]
        for i in range(T):
            v = velocity(x, torch.tensor([sig[i]]), cond)
            x = x - sig[i] * v if (i == T - 1 and leaf == "predicted") else x + (sig[i + 1] - sig[i]) * v
            anchor.append(x)
        main_leaf = (rec.leaf_prompt == p) & (rec.leaf_group == p * rec.groups_per_prompt)
        close(rec.leaf_state[main_leaf], anchor[T])
        for t in ((rec.prompt == p).nonzero().squeeze(1).tolist()):
            e = int(rec.step[t])
            m = merge[e]
            close(rec.state[t], anchor[e][0])
            assert float(rec.sigma[t]) == sig[e] and float(rec.sigma_next[t]) == sig[e + m]
            sigma, to = sig[e], sig[e + m]
            v = velocity(anchor[e], torch.tensor([sigma]), cond)[0]
            std_t = math.sqrt(sigma / (1 - sigma)) * float(rec.eta[t])  # Flow-GRPO's σ_t; η = 0.7 as the record keeps it
            dt = to - sigma
            mean = anchor[e][0] * (1 + std_t**2 / (2 * sigma) * dt) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
            s = std_t * math.sqrt(-dt)
            close(rec.mean[t], mean)
            lp = torch.distributions.Normal(mean, s).log_prob(rec.next_state[t]).mean()
            close(rec.log_prob[t], lp)
            # the child's lanes: the leaves below it, one per stride, each in its own advantage group
            below = [k for k in range(rec.num_leaves) if int(rec.leaf_prompt[k]) == p
                     and int(rec.node[t]) in ancestors(rec, int(rec.leaf_node[k]))]
            assert len(below) == 2
            for k in below:
                lane = int(rec.leaf_group[k]) - int(rec.group[t])
                points = lane_points(e + m, (1, 2)[lane], leaf)
                z = rec.next_state[t].unsqueeze(0)
                for a, b in zip(points[:-1], points[1:]):
                    vz = velocity(z, torch.tensor([sig[a]]), cond)
                    last = b == points[-1]
                    z = z - sig[a] * vz if (last and leaf == "predicted") else z + (sig[b] - sig[a]) * vz
                close(rec.leaf_state[k], z[0])
    # re-scoring the stored transitions gives their log-probs (the ratio == 1 contract over merged spans)
    lp, _ = score_transitions(velocity, rec)
    assert torch.equal(lp, rec.log_prob)


@pytest.mark.parametrize("leaf, per_child", [("predicted", 5), ("sample", 6)])
def test_waiting_nodes_take_no_forward(leaf, per_child):
    """Per prompt: the anchor's 8 forwards, and per side child one at the point its lanes start (shared by both
    strides), then the stride-1 lane's 3 and the stride-2 lane's 1 (predicted: points 4, 5, 7) or 2 (sample: 4, 5, 7,
    8). The velocity sees exactly those rows and the record counts them; the closed-form node count is the tree's."""
    plan = plan_for(leaf)
    counting = Counting()
    rec = run(plan, counting)
    expected = 2 * (T + 6 * per_child)
    assert counting.rows == expected and rec.nfe["rollout"] == expected
    assert plan.counts()["rollout"] == T + 6 * per_child
    assert plan.node_count() == template_for(plan).node_parent.numel()
    assert plan.counts()["groups"] == 1 + 2 * 2 and plan.counts()["leaves"] == 1 + 6 * 2


def test_one_stride_and_no_merge_is_the_plain_side_branch():
    """side_merge 1 and side_strides [1] are TempFlow's side branches exactly: the same tree, draws and samples."""
    plain = compose_plan(T, kernel="ode", side_steps=(1, 3), side_children=3)
    same = compose_plan(T, kernel="ode", side_steps=(1, 3), side_children=3, side_merge=(1, 1), side_strides=(1,))
    a, b = run(plain), run(same)
    for field in ("state", "next_state", "log_prob", "leaf_state", "leaf_group", "node_parent", "node_group"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert a.node_lanes is None and b.node_lanes is None


def test_a_side_childs_advantage_is_the_sum_of_its_lanes_z_scores():
    """G²RPO's multi-granularity advantage: each stride's samples are z-scored among the siblings (torch.std + 1e-8,
    its code's), and a child's advantage is the sum over strides, clipped after the sum."""
    from flowgrpo.engine import credit

    plan = plan_for("predicted")
    rec = run(plan, prompts=(4,)).bookkeeping_on_cpu()
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(rec.num_leaves, 1, generator=g, dtype=torch.float64).float()
    cfg = SimpleNamespace(multi_reward="gdpo", eps=1e-8, std_correction=1, std="group", diversity=False,
                          tree_value="mean", tree_beta=1.0, tree_norm="depth", best_of_n=0, clip=5.0,
                          tied_groups="train", soft_clip=0.0)
    adv, _ = credit.assign([rec], [[0]], rewards, torch.ones(1), cfg, False, lambda t: t, 0)
    r = rewards[:, 0].double()
    for t in range(rec.num_transitions):
        total = 0.0
        for k in range(rec.num_leaves):
            if int(rec.node[t]) in ancestors(rec, int(rec.leaf_node[k])):
                peers = r[rec.leaf_group == rec.leaf_group[k]]
                total += float((r[k] - peers.mean()) / (peers.std() + 1e-8))
        close(adv.transitions[0][t], max(-5.0, min(5.0, total)), ulps=2**28)  # float32 result


def test_lanes_refuse_what_they_cannot_be():
    with pytest.raises(ValueError, match="past the last"):
        compose_plan(T, kernel="ode", side_steps=(6,), side_merge=(3,))
    with pytest.raises(ValueError, match="one per side step"):
        compose_plan(T, kernel="ode", side_steps=(1, 3), side_merge=(2,))
    with pytest.raises(ValueError, match="use solver euler"):
        compose_plan(T, kernel="ode", side_steps=(1,), side_strides=(1, 2), solver="dpmpp_2m")
    with pytest.raises(ValueError, match="distinct integers"):
        compose_plan(T, kernel="ode", side_steps=(1,), side_strides=(2, 2))
