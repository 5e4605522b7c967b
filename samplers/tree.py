"""The per-prompt rollout tree of a plan: nodes, levels and edge groups (built once, cached).

A plan (samplers/plans.py) asks for its tree here; this module reads the plan's fields and imports nothing
of plans.py, so the two never import each other.

Every prompt's tree has the same shape (the plan is shared by the batch), so the executor builds it
once per plan and tiles it over prompts. Node ids are per prompt and enumerate nodes level by level:
roots 0..R−1, then each level's children in parent order, a parent's main children before its side
children. They are the node part of every seed, so they never depend on the batch.

Edge groups are the transitions of one step that share a kernel and a span: ``main`` (main-lane parents →
K main children), ``side`` (main-lane parents → side children, TempFlow's branch points), ``tail``
(side-lane parents → one ODE child, or one per stride where a side child's lanes start) and ``wait`` (a copy,
no forward). Advantage groups are per prompt: group 0 holds the main lane (all roots of a prompt, hence the
whole chain group or BranchGRPO tree); each (parent, step) that spawns side children opens a new group
(TempFlow's siblings of one branch point), one per stride when its children are finished at several.

A node's *clock* is the level whose σ its state is at. It equals its level but on a side lane that spans
several grid intervals in one step (E-GRPO's merged SDE step; a stride > 1): there the child is ahead, and
it waits, copied level to level without a forward, until the levels catch up. A lane that ends before σ = 0
(a stride that passes over the last point under ``leaf="predicted"``) keeps its last step's x̂0 and waits to
the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch



@dataclass(frozen=True)
class EdgeGroup:
    """Transitions of one step that share a kernel, as local indices into a prompt's levels."""

    kind: str  # "main" | "side" | "tail" | "wait"
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
    span: int = 1  # grid intervals the edge spans: it steps σ_i → σ_{i+span}
    final_x0: bool = False  # the child is its lane's last point before the last level: it keeps the step's x̂0


@dataclass(frozen=True)
class Level:
    """The nodes of one level (all at the same σ), per prompt."""

    node_id: torch.Tensor  # [n] int64, per-prompt node ids (increasing)
    root: torch.Tensor  # [n] int64, root index (0..R−1) of each node
    parent_pos: torch.Tensor  # [n] int64, position of each node's parent in the previous level
    category: dict  # NFE category -> number of nodes of that category at this level that take a forward
    active: torch.Tensor | None = None  # [a] int64, positions of the nodes that take a forward (None: all)


@dataclass(frozen=True)
class Template:
    levels: tuple[Level, ...]  # T + 1 levels
    edges: tuple[tuple[EdgeGroup, ...], ...]  # T steps, each a tuple of edge groups
    node_parent: torch.Tensor  # [Nn] int64, parent node id, −1 for roots
    node_depth: torch.Tensor  # [Nn] int64, level of the node (0 = x_T, T = leaf)
    node_group: torch.Tensor  # [Nn] int64, advantage group within the prompt
    node_root: torch.Tensor  # [Nn] int64, root index of the node
    # [Nn] int64, the lanes whose z-scores a node's advantage sums (a side child finished at G strides: G); None: 1
    node_lanes: torch.Tensor | None
    groups_per_prompt: int
    needs_history: tuple[int, ...]  # [T] x̂0 points step i + 1 needs: 1 (dpmpp_2m), 2 (sa_solver, with step i's), 0
    counts: dict  # closed-form per-prompt costs (see Plan.counts)
    batch_cache: dict = field(default_factory=dict, repr=False)  # executor's tiled row indices


def _as_float32(value: float) -> float:
    return float(torch.tensor(float(value), dtype=torch.float32))


class _NodeTable:
    """The per-prompt node table while it grows; a node's id is its row. Side-lane nodes also carry their clock (the
    level their state is at), their lane's stride (0 before their tails start) and the strides they start."""

    def __init__(self):
        self.parent, self.depth, self.group, self.root, self.side, self.category = [], [], [], [], [], []
        self.clock, self.stride, self.strides, self.lanes = [], [], [], []

    def add(self, parent: int, depth: int, group: int, root: int, side: bool, category: str, clock: int | None = None,
            stride: int = 1, strides: tuple = (1,), lanes: int = 1) -> int:
        for column, value in zip(
            (self.parent, self.depth, self.group, self.root, self.side, self.category, self.clock, self.stride,
             self.strides, self.lanes),
            (parent, depth, group, root, side, category, depth if clock is None else clock, stride, strides, lanes),
        ):
            column.append(value)
        return len(self.parent) - 1

    def level(self, ids: list[int], parent_pos: list[int], depth: int) -> Level:
        counts: dict = {}
        active = [k for k, nid in enumerate(ids) if self.clock[nid] == depth]
        for k in active:
            counts[self.category[ids[k]]] = counts.get(self.category[ids[k]], 0) + 1
        as_long = lambda values: torch.tensor(values, dtype=torch.long)  # noqa: E731
        return Level(as_long(ids), as_long([self.root[n] for n in ids]), as_long(parent_pos), counts,
                     None if len(active) == len(ids) else as_long(active))


def _edge_group(kind: str, step, parents: list[int], first_child: list[int], span: int = 1, fanout: int = 1,
                final_x0: bool = False) -> EdgeGroup:
    if kind == "main":
        spec = (step.branch, step.kernel, step.eta, step.trained, step.loss_weight, step.split_noise)
    elif kind == "side":
        spec = (step.side, step.side_kernel, step.side_eta, step.side_trained, step.side_loss_weight,
                "independent")
    else:  # tail: a side-lane node follows the ODE, untrained (one child per stride where its lanes start); wait: a copy
        spec = (fanout, "ode", 0.0, False, 1.0, "independent")
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
        span=span,
        final_x0=final_x0,
    )


def _build(plan) -> Template:
    """The tree of ``plan`` (a samplers.plans.Plan: its steps, roots per prompt and train subset)."""
    nodes = _NodeTable()
    R = plan.roots_per_prompt
    level_ids = [nodes.add(-1, 0, 0, r, False, "rollout") for r in range(R)]
    parent_pos = [-1] * R
    levels, edges, groups = [], [], 1  # group 0: the main lane of the prompt
    T, predicted = len(plan.steps), plan.leaf == "predicted"

    def lane_end(stride: int, to: int) -> bool:
        """Whether a lane of ``stride`` that reaches point ``to`` has ended (it keeps waiting from there)."""
        return to >= T or (predicted and to + stride > T)

    for i, step in enumerate(plan.steps):
        levels.append(nodes.level(level_ids, parent_pos, i))
        nxt, lists = [], {}

        def edge(key, k):
            lists.setdefault(key, ([], []))
            lists[key][0].append(k), lists[key][1].append(len(nxt))

        for k, nid in enumerate(level_ids):
            group, root, clock = nodes.group[nid], nodes.root[nid], nodes.clock[nid]
            if nodes.side[nid] and clock > i:  # ahead of the levels (or its lane has ended): wait
                edge(("wait", 1, 1, False), k)
                nxt.append(nodes.add(nid, i + 1, group, root, True, nodes.category[nid], clock, nodes.stride[nid],
                                     nodes.strides[nid]))
                continue
            if nodes.side[nid]:
                if nodes.stride[nid] == 0:  # a side child at the point its tails start: one lane per stride, σ_c → σ_c+1
                    lanes = nodes.strides[nid]
                    ends = [lane_end(g, i + 1) for g in lanes]
                    if len(set(ends)) > 1:
                        raise ValueError(f"step {i}: the strided lanes of one side child end at different levels; "
                                         "merge or branch earlier")
                    edge(("tail", 1, len(lanes), ends[0] and predicted and i + 1 < T), k)
                    for j, g in enumerate(lanes):
                        nxt.append(nodes.add(nid, i + 1, group + j, root, True, nodes.category[nid],
                                             T if ends[0] else i + 1, g))
                    continue
                g = nodes.stride[nid]
                to = min(i + g, T)
                end = lane_end(g, to)
                edge(("tail", to - i, 1, end and predicted and to < T), k)
                nxt.append(nodes.add(nid, i + 1, group, root, True, nodes.category[nid], T if end else to, g))
                continue
            edge(("main", 1, step.branch, False), k)
            nxt += [nodes.add(nid, i + 1, group, root, False, "rollout") for _ in range(step.branch)]
            if step.side:  # a branch point: its side children form a new advantage group (one per stride)
                to = i + step.side_span
                end = to >= T
                lanes = 1 if end else len(step.side_strides)
                edge(("side", step.side_span, step.side, end and predicted and to < T), k)
                for _ in range(step.side):
                    nxt.append(nodes.add(nid, i + 1, groups, root, True, step.side_category, T if end else to,
                                         0, tuple(step.side_strides), lanes))
                groups += lanes
        edges.append(tuple(_edge_group(kind, step, *lists[key], span=span, fanout=fanout, final_x0=final)
                           for key in lists for kind, span, fanout, final in [key]))
        position = {nid: k for k, nid in enumerate(level_ids)}
        parent_pos = [position[nodes.parent[c]] for c in nxt]
        level_ids = nxt
    levels.append(nodes.level(level_ids, parent_pos, T))

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
        node_lanes=torch.tensor(nodes.lanes, dtype=torch.long) if max(nodes.lanes) > 1 else None,
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
