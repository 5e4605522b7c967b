"""Credit assignment: from an iteration's rewards to the advantage of every trained transition and sample.

One module holds every rule (docs/math.md §3 "Advantages", §2 BranchGRPO and TempFlow):

- ``combine_rewards``: several rewards become one signal per leaf (GDPO's per-reward group z-scores, or
  the weighted sum of raw rewards); one reward is scaled by its weight (−1 minimises it);
- ``group_zscore``: A = (r − group mean)/(group or global std + eps), or r − group mean (Dr. GRPO);
- ``tree_advantages`` / ``path_weighted_values``: BranchGRPO's depth-wise advantages of node values; with
  ``tree_norm="leaves"`` TreeGRPO's instead: the leaves' group z-scores carried up the tree (a node's advantage is
  the mean, or path-weighted mean, of its descendant leaves' advantages), never normalised again per depth;
- ``_bounded``: V-GRPO's soft clip η·tanh(A/η) (``advantage.soft_clip``), then the clip to ±``advantage.clip``;
- ``best_of_n_mask``: DanceGRPO's best-of-N filter (Pref-GRPO's pairwise win rates are the VLM judge's, rewards/vlm.py);
- ``assign``: the iteration's rule, applied to the rollout records: gather every process's rewards,
  combine, z-score, take tree values where the plan branches, filter best-of-N, clip, and hand each
  trained transition the advantage of its x' node (``Trajectory.transition_values``: for a chain its
  leaf's, for a TempFlow side child its sibling group's — summed over its lanes where it is finished at several
  strides, G²RPO's multi-granularity advantage — for a BranchGRPO edge its child node's).

NaN rewards (a reward that did not apply or failed) stay NaN: they never enter a mean or std, and
their transitions and samples are masked out of the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rewards.stats import pixel_features


@dataclass
class Advantages:
    """An iteration's advantages, per rollout batch of this process (NaN = masked, clipped to ±clip)."""

    transitions: list[torch.Tensor]  # [M_b] per stored transition: the advantage of its x' node
    leaves: list[torch.Tensor]  # [L_b] per leaf (sample): group z-score (tree plans: the leaf node's depth-wise one)
    # advantage.tied_groups=skip: bool masks of the transitions and leaves of tied groups (A = 0). The learners leave
    # them out of every model call and keep them in the loss's normaliser, so the learning rate means what it does
    # with every group trained; None: nothing is skipped
    tied_transitions: list[torch.Tensor] | None = None
    tied_leaves: list[torch.Tensor] | None = None


def assign(records: list, slots: list[list[int]], local_rewards: torch.Tensor, weights: torch.Tensor, cfg,
           tree: bool, gather: Callable[[torch.Tensor], torch.Tensor], rank: int,
           local_features: torch.Tensor | None = None) -> tuple[Advantages, dict]:
    """Advantages of this process's rollout batches and the iteration's statistics.

    ``records``: each batch's ``Trajectory`` (its bookkeeping on the CPU); ``slots``: each batch's group key per
    prompt row (its global prompt slot; with train.prompt_draw=batch the prompt's index, so that a prompt drawn into
    two batches is one group: rollout.PromptDraws.group_keys); ``local_rewards`` [L, K]: this process's leaves' rewards in batch and leaf order;
    ``weights`` [K]; ``cfg``: the advantage section of the config; ``tree``: whether the plan branches
    (BranchGRPO's depth-wise values); ``gather``: concatenates a tensor over processes in rank order.
    Statistics are over every process's leaves (identical on 1 or N processes); ``leaf_rewards`` and
    ``leaf_advantages`` are this process's, for the sample manifests.

    A group whose signal is the same for every member (``tied``) carries no preference: with
    A = 0 for each member; with ``cfg.tied_groups="skip"`` the masks ``tied_*`` tell the learners to compute none
    of it while keeping it in their normalisers; with ``"train"`` it is computed at A = 0 (the reference codes':
    NFT's r = ½ term still pulls toward θ_old, a KL still acts).
    ``local_features`` [L, D] (this process's leaves' features, with ``cfg.diversity``) scale the positive
    advantages by each sample's diversity in its group (``diversity_scale``, GARDO)."""
    gpp = records[0].groups_per_prompt
    local_g = torch.cat([torch.tensor(s)[rec.leaf_prompt] * gpp + rec.leaf_group % gpp for s, rec in zip(slots, records)])
    all_r, all_g = gather(local_rewards), gather(local_g)
    signal_all = combine_rewards(all_r, weights, all_g, cfg.multi_reward, cfg.eps, cfg.std_correction)
    leaf_adv_all, stats = group_zscore(signal_all, all_g, cfg.std, cfg.eps, cfg.std_correction)
    stats["valid_reward_fraction"] = float(torch.isfinite(signal_all).float().mean())  # over every process's leaves
    if all_r.shape[1] > 1 and cfg.multi_reward in ("gdpo", "zsum"):
        leaf_adv_all = signal_all.float()  # the (z-scored) sum of the group z-scores is the advantage itself
    if cfg.diversity and local_features is not None:
        scale = diversity_scale(gather(local_features.float()), all_g)
        leaf_adv_all = torch.where(leaf_adv_all > 0, leaf_adv_all * scale, leaf_adv_all)
        stats["advantage/diversity_scale_min"] = float(scale.min()) if scale.numel() else float("nan")
    tied_all = tied_groups(signal_all, all_g) & ~torch.isnan(signal_all)
    start = rank * local_rewards.shape[0]
    leaf_adv = leaf_adv_all[start : start + local_rewards.shape[0]]
    signal = signal_all[start : start + local_rewards.shape[0]]
    tied = tied_all[start : start + local_rewards.shape[0]]
    out, leaves, tied_t, tied_l, offset = [], [], [], [], 0
    for rec in records:
        n = rec.num_leaves
        if tree:  # BranchGRPO: depth-wise advantages of node values; TreeGRPO: the leaves' advantages carried up
            leaves_first = cfg.tree_norm == "leaves"
            below = leaf_adv[offset : offset + n] if leaves_first else signal[offset : offset + n]
            if cfg.tree_value == "path_weighted":
                values = path_weighted_values(rec, below, cfg.tree_beta)
            else:
                values = rec.node_values(below)
            node_adv = values.float() if leaves_first else tree_advantages(values, rec.node_depth, cfg.eps,
                                                                           cfg.std_correction)
            t_adv, l_adv = node_adv[rec.prompt, rec.node], node_adv[rec.leaf_prompt, rec.leaf_node]
        else:  # chains and TempFlow siblings: the advantage of the leaf below x'
            t_adv, l_adv = rec.transition_values(leaf_adv[offset : offset + n]), leaf_adv[offset : offset + n]
            if rec.node_lanes is not None:  # a side child finished at G strides: the sum of its lanes' z-scores
                t_adv = t_adv * rec.node_lanes[rec.node].to(t_adv.dtype)
        if cfg.best_of_n:
            keep = best_of_n_mask(leaf_adv[offset : offset + n], rec.leaf_group, cfg.best_of_n)
            t_adv = torch.where(rec.transition_values(keep.float()) > 0.5, t_adv, torch.full_like(t_adv, float("nan")))
            l_adv = torch.where(keep, l_adv, torch.full_like(l_adv, float("nan")))
        # a tied group (a tree: all its node values equal) has A = 0 everywhere: its transitions' mask
        mine = tied[offset : offset + n]
        tied_l.append(mine)
        tied_t.append(rec.transition_values(mine.float()) > 0.5)
        l_adv = torch.where(mine & ~torch.isnan(l_adv), torch.zeros_like(l_adv), l_adv)
        t_adv = torch.where(tied_t[-1] & ~torch.isnan(t_adv), torch.zeros_like(t_adv), t_adv)
        out.append(_bounded(t_adv, cfg))
        leaves.append(_bounded(l_adv, cfg))
        offset += n
    stats.update({"advantage/mean": float(torch.nanmean(leaf_adv_all)),
                  "advantage/abs_mean": float(torch.nanmean(leaf_adv_all.abs())),
                  "all_rewards": all_r, "leaf_rewards": local_rewards, "leaf_advantages": leaf_adv})
    skip = cfg.tied_groups == "skip"
    return Advantages(out, leaves, tied_t if skip else None, tied_l if skip else None), stats


def _bounded(adv: torch.Tensor, cfg) -> torch.Tensor:
    """The advantage as it trains: V-GRPO's soft clip η·tanh(A/η) (``advantage.soft_clip`` η > 0), then the clip to
    ±``advantage.clip`` (NaN stays NaN)."""
    if cfg.soft_clip > 0:
        adv = cfg.soft_clip * torch.tanh(adv / cfg.soft_clip)
    return adv.clamp(-cfg.clip, cfg.clip)


def _group_stats(values: torch.Tensor, groups: torch.Tensor,
                 correction: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group mean, group std and group count of the non-NaN values; the std divides by count − correction
    (0: the population std; 1: Bessel's, torch.std's default), a group of at most ``correction`` values has std 0."""
    valid = ~torch.isnan(values)
    ids, inverse = torch.unique(groups, return_inverse=True)
    filled = torch.where(valid, values, torch.zeros_like(values)).double()
    count = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, inverse, valid.double())
    total = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, inverse, filled)
    mean = total / count.clamp(min=1)
    sq = torch.where(valid, (values.double() - mean[inverse]) ** 2, torch.zeros_like(filled))
    var = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, inverse, sq) / (count - correction).clamp(min=1)
    return mean[inverse], var.sqrt()[inverse], count[inverse]


def group_zscore(
    rewards: torch.Tensor, groups: torch.Tensor, std: str = "group", eps: float = 1e-4, correction: int = 0
) -> tuple[torch.Tensor, dict]:
    """A_i = (r_i − mean_g)/(std + eps) with std per group or over the whole batch, or
    A_i = r_i − mean_g with std="none" (Dr. GRPO: the group-mean baseline alone, which keeps the
    reward's scale, so a KL weight β means what it says in E[r] − β·KL). Either std divides by n − correction
    (0: the population's, Flow-GRPO's np.std; 1: torch.std's, DanceGRPO's and MixGRPO's).

    rewards [L] (NaN = not applicable), groups [L] -> advantages [L] float32 (NaN where the reward
    is), plus stats: the fraction of groups with zero std (they carry no signal and get A = 0).
    """
    mean, group_std, count = _group_stats(rewards, groups, correction)
    valid = ~torch.isnan(rewards)
    if std == "global":
        denom = rewards[valid].double().std(correction=correction) if valid.sum() > correction else torch.tensor(0.0)
        denom = denom.expand_as(mean) + eps
    elif std == "group":
        denom = group_std + eps
    elif std == "none":
        denom = torch.ones_like(mean)
    else:
        raise ValueError(f"std={std!r}; use 'group', 'global' or 'none'")
    adv = (rewards.double() - mean) / denom
    zero = group_std < 1e-12
    adv = torch.where(zero & valid, torch.zeros_like(adv), adv)
    ids = torch.unique(groups)
    zero_groups = sum(bool(zero[groups == g].all()) for g in ids.tolist())
    stats = {"zero_std_group_fraction": zero_groups / max(1, len(ids)), "nan_reward_fraction": float((~valid).double().mean())}
    return adv.float(), stats


def leaf_features(media: list[torch.Tensor]) -> torch.Tensor:
    """Features of decoded leaves (one tensor per rollout batch) for ``diversity_scale``: images and videos
    area-downsampled to 16×16 and centred to [−1, 1]; the analytic world's vectors as they are. -> [L, D]"""
    return torch.cat([m.flatten(1).float() if m.dim() == 2 else pixel_features(m) * 2 - 1 for m in media])


def tied_groups(signal: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Bool [L]: the rows of groups whose non-NaN signal is all one value (population std < 1e-12), or that have
    fewer than two valid members: no member is preferred to another."""
    _, std, count = _group_stats(signal, groups)
    return (std < 1e-12) | (count < 2)


def diversity_scale(features: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """GARDO's diversity-aware shaping factor [L]: each sample's cosine distance to its nearest group member,
    d_i = min_{j≠i} (1 − cos(f_i, f_j)), divided by its group's mean d; 1 in a group of one or of identical
    samples. ``features`` [L, D]. The caller multiplies the positive advantages by it: a good sample that
    is also unlike its siblings counts for more, a good copy of a sibling for less (the mean factor is 1)."""
    f = torch.nn.functional.normalize(features.double().flatten(1), dim=1)
    scale = torch.ones(f.shape[0], dtype=torch.float64)
    for g in groups.unique().tolist():
        rows = (groups == g).nonzero().squeeze(1)
        if rows.numel() < 2:
            continue
        dist = (1 - f[rows] @ f[rows].T).clamp(min=0)
        dist.fill_diagonal_(float("inf"))
        nearest = dist.min(1).values
        if float(nearest.mean()) > 1e-12:
            scale[rows] = nearest / nearest.mean()
    return scale.float()


def gdpo(rewards: torch.Tensor, weights: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4,
         correction: int = 0) -> torch.Tensor:
    """GDPO multi-reward: z-score each reward inside its group, weighted sum, z-score the sum over
    the batch. rewards [L, K], weights [K] -> combined [L] (before the final advantage step)."""
    per_reward = torch.stack([group_zscore(rewards[:, k], groups, "group", eps, correction)[0]
                              for k in range(rewards.shape[1])], 1)
    combined = (per_reward * weights.to(per_reward)).sum(1)
    nan = torch.isnan(rewards).any(1)
    combined = torch.where(nan, torch.full_like(combined, float("nan")), combined)
    valid = ~nan
    if valid.sum() > 1:
        m, s = combined[valid].mean(), combined[valid].std(unbiased=False)
        combined = (combined - m) / (s + eps)
    return combined


def zsum(rewards: torch.Tensor, weights: torch.Tensor, groups: torch.Tensor, eps: float = 1e-4,
         correction: int = 0) -> torch.Tensor:
    """MixGRPO's multi-reward advantage (its code's ``advantage_aggr``): z-score each reward inside its group and take
    the weighted sum with the weights divided by Σ|w| (its code normalises them to sum 1), not normalised again
    (GDPO z-scores that sum over the batch). rewards [L, K] -> [L]."""
    per_reward = torch.stack([group_zscore(rewards[:, k], groups, "group", eps, correction)[0]
                              for k in range(rewards.shape[1])], 1)
    weights = weights.to(per_reward)
    combined = (per_reward * (weights / weights.abs().sum().clamp(min=1e-12))).sum(1)
    return torch.where(torch.isnan(rewards).any(1), torch.full_like(combined, float("nan")), combined)


def combine_rewards(rewards: torch.Tensor, weights: torch.Tensor, groups: torch.Tensor, mode: str, eps: float,
                    correction: int = 0) -> torch.Tensor:
    """[L, K] rewards -> [L] scalar signal: one reward is scaled by its weight (a negative weight
    minimises it: every advantage rule is odd in the signal, so weight −1 flips every advantage's
    sign); several combine by ``mode``."""
    if rewards.shape[1] == 1:
        return rewards[:, 0] * weights[0].to(rewards)
    if mode == "gdpo":
        return gdpo(rewards, weights, groups, eps, correction)
    if mode == "zsum":
        return zsum(rewards, weights, groups, eps, correction)
    if mode == "sum":
        return (rewards * weights.to(rewards)).sum(1)
    raise ValueError(f"multi_reward={mode!r}; use 'gdpo', 'zsum' or 'sum'")


def tree_advantages(node_values: torch.Tensor, node_depth: torch.Tensor, eps: float = 1e-4,
                    correction: int = 0) -> torch.Tensor:
    """BranchGRPO depth-wise advantages: for every node n at depth d of a prompt's tree,
    A(n) = (r̄(n) − mean_d)/(std_d + eps) over that prompt's nodes at depth d, the std dividing by the count less
    ``correction`` (1: torch.std's, BranchGRPO's code). node_values [P, Nn], node_depth [Nn] -> [P, Nn] (a single
    node at a depth gets 0)."""
    adv = torch.zeros_like(node_values, dtype=torch.float64)
    for depth in node_depth.unique().tolist():
        cols = (node_depth == depth).nonzero().squeeze(1)
        vals = node_values[:, cols].double()
        valid = ~torch.isnan(vals)
        n = valid.sum(1, keepdim=True)
        count = n.clamp(min=1)
        mean = torch.where(valid, vals, 0.0).sum(1, keepdim=True) / count
        std = (torch.where(valid, (vals - mean) ** 2, 0.0).sum(1, keepdim=True) / (n - correction).clamp(min=1)).sqrt()
        z = torch.where(std < 1e-12, torch.zeros_like(vals), (vals - mean) / (std + eps))
        adv[:, cols] = torch.where(valid, z, torch.full_like(vals, float("nan")))  # NaN nodes stay NaN
    return adv.float()


def path_weighted_values(record, leaf_rewards: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """BranchGRPO's path-probability weighted node values: for node n, the leaves ℓ below it weigh
    w_ℓ = softmax_ℓ(β·log p(path to ℓ)) with log p the sum of the stored transition log-probs on the
    path (ODE edges contribute 0). Returns [P, Nn]."""
    P, Nn = record.num_prompts, record.node_parent.numel()
    edge_lp = torch.zeros(P, Nn, dtype=torch.float64)
    edge_lp[record.prompt, record.node] = record.log_prob.double()
    parents = record.node_parent.tolist()
    path_lp = edge_lp.clone()
    for node in range(Nn):  # parents have smaller ids: accumulate from the root down
        if parents[node] >= 0:
            path_lp[:, node] += path_lp[:, parents[node]]
    values = torch.full((P, Nn), float("nan"), dtype=torch.float64)
    leaf_lp = path_lp[record.leaf_prompt, record.leaf_node]
    for node in range(Nn):
        below = _descendant_leaves(record, node)
        for p in range(P):
            rows = below & (record.leaf_prompt == p)
            if rows.any():
                w = torch.softmax(beta * leaf_lp[rows], 0)
                values[p, node] = (w * leaf_rewards[rows].double()).sum()
    return values.float()


def _descendant_leaves(record, node: int) -> torch.Tensor:
    """Bool [L]: leaves whose root-to-leaf path passes through ``node``."""
    parents = record.node_parent.tolist()
    marks = []
    for leaf in record.leaf_node.tolist():
        n = leaf
        while n >= 0 and n != node:
            n = parents[n]
        marks.append(n == node)
    return torch.tensor(marks, dtype=torch.bool)


def best_of_n_mask(advantages: torch.Tensor, groups: torch.Tensor, n: int) -> torch.Tensor:
    """DanceGRPO best-of-N: keep the n/2 highest and n/2 lowest advantages of each group. [L] bool."""
    keep = torch.zeros_like(advantages, dtype=torch.bool)
    if n <= 0:
        return ~keep
    half = max(1, n // 2)
    for g in groups.unique().tolist():
        rows = ((groups == g) & ~torch.isnan(advantages)).nonzero().squeeze(1)  # NaN rows are never picked
        if rows.numel() == 0:
            continue
        order = rows[torch.argsort(advantages[rows], stable=True)]
        keep[order[:half]] = True
        keep[order[-half:]] = True
    return keep
