"""The per-prompt rollout tree of a plan: nodes, levels and edge groups (built once, cached).

A plan (samplers/plans.py) asks for its tree here; this module reads the plan's fields and imports nothing
of plans.py, so the two never import each other.

Every prompt's tree has the same shape (the plan is shared by the batch), so the executor builds it
once per plan and tiles it over prompts. Node ids are per prompt and enumerate nodes level by level:
roots 0..R−1, then each level's children in parent order, a parent's main children before its side
children. They are the node part of every seed, so they never depend on the batch.

Edge groups are the transitions of one step that share a kernel: ``main`` (main-lane parents →
K main children), ``side`` (main-lane parents → side children, TempFlow's branch points) and ``tail``
(side-lane parents → one ODE child). Advantage groups are per prompt: group 0 holds the main lane
(all roots of a prompt, hence the whole chain group or BranchGRPO tree); each (parent, step) that
spawns side children opens a new group (TempFlow's siblings of one branch point).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch



@dataclass(frozen=True)
class EdgeGroup:
    """Transitions of one step that share a kernel, as local indices into a prompt's levels."""

    kind: str  # "main" | "side" | "tail"
    parents: torch.Tensor  # [E] int64, parent positions in level i (per prompt)
    first_child: torch.Tensor  # [E] int64, position in level i + 1 of each parent's first child
    fanout: int  # children per parent in this group
    kernel: str
    eta: float
    solver: str
    trained: bool
    loss_weight: float
    split_noise: str  # only used when kind == "main" and fanout > 1
    split_noise_scale: float


@dataclass(frozen=True)
class Level:
    """The nodes of one level (all at the same σ), per prompt."""

    node_id: torch.Tensor  # [n] int64, per-prompt node ids (increasing)
    root: torch.Tensor  # [n] int64, root index (0..R−1) of each node
    parent_pos: torch.Tensor  # [n] int64, position of each node's parent in the previous level
    category: dict  # NFE category -> number of nodes of that category at this level


@dataclass(frozen=True)
class Template:
    levels: tuple[Level, ...]  # T + 1 levels
    edges: tuple[tuple[EdgeGroup, ...], ...]  # T steps, each a tuple of edge groups
    node_parent: torch.Tensor  # [Nn] int64, parent node id, −1 for roots
    node_depth: torch.Tensor  # [Nn] int64, level of the node (0 = x_T, T = leaf)
    node_group: torch.Tensor  # [Nn] int64, advantage group within the prompt
    node_root: torch.Tensor  # [Nn] int64, root index of the node
    groups_per_prompt: int
    needs_history: tuple[int, ...]  # [T] x̂0 points step i + 1 needs: 1 (dpmpp_2m), 2 (sa_solver, with step i's), 0
    counts: dict  # closed-form per-prompt costs (see Plan.counts)
    batch_cache: dict = field(default_factory=dict, repr=False)  # executor's tiled row indices


def _as_float32(value: float) -> float:
    return float(torch.tensor(float(value), dtype=torch.float32))


class _NodeTable:
    """The per-prompt node table while it grows; a node's id is its row."""

    def __init__(self):
        self.parent, self.depth, self.group, self.root, self.side, self.category = [], [], [], [], [], []

    def add(self, parent: int, depth: int, group: int, root: int, side: bool, category: str) -> int:
        for column, value in zip(
            (self.parent, self.depth, self.group, self.root, self.side, self.category),
            (parent, depth, group, root, side, category),
        ):
            column.append(value)
        return len(self.parent) - 1

    def level(self, ids: list[int], parent_pos: list[int]) -> Level:
        counts: dict = {}
        for nid in ids:
            counts[self.category[nid]] = counts.get(self.category[nid], 0) + 1
        as_long = lambda values: torch.tensor(values, dtype=torch.long)  # noqa: E731
        return Level(as_long(ids), as_long([self.root[n] for n in ids]), as_long(parent_pos), counts)


def _edge_group(kind: str, step, parents: list[int], first_child: list[int]) -> EdgeGroup:
    if kind == "main":
        spec = (step.branch, step.kernel, step.eta, step.trained, step.loss_weight, step.split_noise)
    elif kind == "side":
        spec = (step.side, step.side_kernel, step.side_eta, step.side_trained, step.side_loss_weight,
                "independent")
    else:  # tail: a side-lane node follows the ODE, untrained
        spec = (1, "ode", 0.0, False, 1.0, "independent")
    fanout, kernel, eta, trained, weight, noise = spec
    return EdgeGroup(
        kind=kind,
        parents=torch.tensor(parents, dtype=torch.long),
        first_child=torch.tensor(first_child, dtype=torch.long),
        fanout=fanout,
        kernel=kernel,
        eta=_as_float32(eta),  # the record stores η in float32: the rollout uses that very value
        solver=step.solver,
        trained=bool(trained),
        loss_weight=float(weight),
        split_noise=noise,
        split_noise_scale=float(step.split_noise_scale),
    )


def _build(plan) -> Template:
    """The tree of ``plan`` (a samplers.plans.Plan: its steps, roots per prompt and train subset)."""
    nodes = _NodeTable()
    R = plan.roots_per_prompt
    level_ids = [nodes.add(-1, 0, 0, r, False, "rollout") for r in range(R)]
    parent_pos = [-1] * R
    levels, edges, groups = [], [], 1  # group 0: the main lane of the prompt
    for i, step in enumerate(plan.steps):
        levels.append(nodes.level(level_ids, parent_pos))
        nxt, lists = [], {"main": ([], []), "side": ([], []), "tail": ([], [])}
        for k, nid in enumerate(level_ids):
            group, root = nodes.group[nid], nodes.root[nid]
            if nodes.side[nid]:
                lists["tail"][0].append(k), lists["tail"][1].append(len(nxt))
                nxt.append(nodes.add(nid, i + 1, group, root, True, nodes.category[nid]))
                continue
            lists["main"][0].append(k), lists["main"][1].append(len(nxt))
            nxt += [nodes.add(nid, i + 1, group, root, False, "rollout") for _ in range(step.branch)]
            if step.side:  # a branch point: its side children form a new advantage group
                lists["side"][0].append(k), lists["side"][1].append(len(nxt))
                for _ in range(step.side):
                    nxt.append(nodes.add(nid, i + 1, groups, root, True, step.side_category))
                groups += 1
        edges.append(tuple(_edge_group(kind, step, *lists[kind]) for kind in lists if lists[kind][0]))
        position = {nid: k for k, nid in enumerate(level_ids)}
        parent_pos = [position[nodes.parent[c]] for c in nxt]
        level_ids = nxt
    levels.append(nodes.level(level_ids, parent_pos))

    def depth(step_edges) -> int:
        solvers = {e.solver for e in step_edges if e.kernel == "ode"}
        return 2 if "sa_solver" in solvers else 1 if "dpmpp_2m" in solvers else 0

    needs_history = tuple(depth(edges[i + 1]) if i + 1 < len(edges) else 0 for i in range(len(edges)))
    counts = {"rollout": 0, "probe": 0}
    for lvl in levels[:-1]:
        for cat, n in lvl.category.items():
            counts[cat] += n
    if plan.train_subset is not None:
        trained = R * plan.train_subset
    else:
        trained = sum(len(e.parents) * e.fanout for step in edges for e in step if e.trained)
    counts.update(
        nfe=counts["rollout"] + counts["probe"],
        leaves=len(level_ids),
        trained=trained,
        nodes=len(nodes.parent),
        groups=groups,
    )
    return Template(
        levels=tuple(levels),
        edges=tuple(edges),
        node_parent=torch.tensor(nodes.parent, dtype=torch.long),
        node_depth=torch.tensor(nodes.depth, dtype=torch.long),
        node_group=torch.tensor(nodes.group, dtype=torch.long),
        node_root=torch.tensor(nodes.root, dtype=torch.long),
        groups_per_prompt=groups,
        needs_history=needs_history,
        counts=counts,
    )


def template_for(plan) -> Template:
    """The (cached) tree template of ``plan`` (a samplers.plans.Plan)."""
    if "template" not in plan._cache:
        plan._cache["template"] = _build(plan)
    return plan._cache["template"]


__all__ = ["EdgeGroup", "Level", "Template", "template_for"]
