"""What a rollout hands to the learner: the trajectory record, the endpoints record, NFE counters.

``Trajectory`` holds only *trained* transitions (untrained ODE states are never kept), the leaves the
rewards score, and the per-prompt tree (parent, depth, group of every node; identical for every
prompt of the batch). Rows of transitions and leaves are sorted by (prompt, node id), so the record
of a batch is the concatenation of the records of its prompts, whatever the batch split.

The record's latents (``LATENT_FIELDS``) may be kept in another dtype or place than the rollout computed them in
(``latent_storage``: bfloat16, or host memory); every reader takes them through ``Trajectory.latents``, which hands
them back where and as the rollout computed them (``latent_device``, ``latent_dtype``).

``score_transitions`` recomputes the log-probs of stored transitions with a velocity callable and the
very kernel and log-prob functions the rollout used (ratio == 1 contract; the learner's recompute
does the same with gradients). ``node_values`` turns leaf rewards into BranchGRPO's node values
(mean over descendant leaves).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import torch

from samplers.kernels import KERNEL_NAMES, compute_dtype, get_kernel, log_prob

NFE_KINDS = ("rollout", "probe", "eval", "train_forward", "train_backward")


class NFECounter:
    """Per-sample model forwards (and backwards) by category; checkpointable."""

    def __init__(self):
        self.counts: Counter = Counter()

    def add(self, category: str, n: int = 1) -> None:
        if category not in NFE_KINDS:
            raise ValueError(f"unknown NFE category {category!r}; use one of {NFE_KINDS}")
        self.counts[category] += int(n)

    def __getitem__(self, category: str) -> int:
        return self.counts[category]

    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        return dict(self.counts)

    def reset(self) -> None:
        self.counts.clear()

    def state_dict(self) -> dict[str, int]:
        return self.as_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.counts = Counter({k: int(v) for k, v in state.items()})

    def __repr__(self) -> str:
        return f"NFECounter({self.as_dict()})"


# what a rollout record may keep of its latents: float32 (as sampled, in the rollout's dtype) | bfloat16 (the trained
# steps' states rounded in the walk itself, so their log-probs are those of the stored states) | host (CPU memory,
# pinned where the rollout ran on CUDA; the same numbers)
LATENT_STORAGE = ("float32", "bfloat16", "host")
# the record's [rows, *latent] fields: the states, μ_old, the leaves and the roots
LATENT_FIELDS = ("state", "next_state", "mean", "leaf_state", "root_state")

# the record's integer bookkeeping: which prompt, node, group and kernel each row belongs to
_INDEX_FIELDS = ("kernel", "step", "prompt", "cond_index", "parent", "node", "group", "leaf_prompt", "leaf_node",
                 "leaf_group", "leaf_root", "node_parent", "node_depth", "node_group", "prompt_ids", "prompt_cond")


@dataclass
class Trajectory:
    """Trained transitions (M rows), leaves (L rows) and the per-prompt tree of one rollout.

    Node ids are per prompt (0..Nn−1); ``node_parent[node]`` etc. describe every prompt's tree.
    ``group`` ids are unique within the record: prompt · groups_per_prompt + local group."""

    sigmas: torch.Tensor  # [T + 1] float64, the plan's grid (the rollout used its float32 cast)
    reduce: str  # "mean" | "sum", the log-prob reduction used for log_prob
    # --- trained transitions, sorted by (prompt, node) ---
    state: torch.Tensor  # [M, *latent] storage dtype, x before the step
    next_state: torch.Tensor  # [M, *latent] storage dtype, x' exactly as stored (scored after rounding)
    log_prob: torch.Tensor  # [M] float32 (float64 for float64 latents), lp_old of next_state
    mean: torch.Tensor | None  # [M, *latent] like log_prob, μ_old (only when the rollout was asked)
    sigma: torch.Tensor  # [M] float32, σ of the step
    sigma_next: torch.Tensor  # [M] float32, σ' of the step
    eta: torch.Tensor  # [M] float32, η of the kernel
    kernel: torch.Tensor  # [M] int64, index into KERNEL_NAMES
    step: torch.Tensor  # [M] int64, step index in the plan
    prompt: torch.Tensor  # [M] int64, prompt row of the batch (0..P−1)
    cond_index: torch.Tensor  # [M] int64, conditioning row the velocity was called with
    parent: torch.Tensor  # [M] int64, node id of x
    node: torch.Tensor  # [M] int64, node id of x'
    group: torch.Tensor  # [M] int64, advantage group of the transition
    loss_weight: torch.Tensor  # [M] float32, step weight from the plan (TempFlow noise-aware, ...)
    # --- leaves (level T), sorted by (prompt, node) ---
    leaf_state: torch.Tensor  # [L, *latent] storage dtype, x_0 for the rewards
    leaf_prompt: torch.Tensor  # [L] int64, prompt row
    leaf_node: torch.Tensor  # [L] int64, node id
    leaf_group: torch.Tensor  # [L] int64, advantage group
    leaf_root: torch.Tensor  # [L] int64, row of root_state the leaf descends from
    root_state: torch.Tensor  # [P·R, *latent] storage dtype, x_T of every root (prompt-major)
    # --- per-prompt tree, shared by every prompt ---
    node_parent: torch.Tensor  # [Nn] int64, parent node id, −1 for roots
    node_depth: torch.Tensor  # [Nn] int64, level (0 = x_T, T = leaf)
    node_group: torch.Tensor  # [Nn] int64, local advantage group
    prompt_ids: torch.Tensor  # [P] int64, global prompt index of each row (the seed part)
    prompt_cond: torch.Tensor  # [P] int64, conditioning row of each prompt
    groups_per_prompt: int
    nfe: dict  # category -> per-sample forwards of this rollout
    log_prob_form: str = "gaussian"  # samplers.kernels.LOG_PROB_FORMS: how log_prob was scored
    # where and in what dtype the rollout computed its states (None: as stored); the latents may be stored otherwise
    latent_device: torch.device | None = None
    latent_dtype: torch.dtype | None = None
    # [Nn] int64, the lanes whose z-scores a node's advantage sums (a side child finished at several strides, G²RPO's
    # granularities); None: one each
    node_lanes: torch.Tensor | None = None

    def latents(self, name: str, rows=None) -> torch.Tensor | None:
        """A latent field (``LATENT_FIELDS``: state, next_state, mean, leaf_state, root_state), rows ``rows``
        (an index, a slice or an index tensor; default all), where and as the rollout computed it: on
        ``latent_device``, the states in ``latent_dtype`` (μ_old keeps its compute dtype). Every reader of the
        record's latents goes through here, so a record stored in bfloat16 or in host memory reads back as the
        likelihood math needs it (None for μ_old when the rollout did not keep it)."""
        if name not in LATENT_FIELDS:
            raise ValueError(f"{name!r} is not a latent field of the record; use one of {LATENT_FIELDS}")
        stored = getattr(self, name)
        if stored is None:
            return None
        if rows is not None:
            if isinstance(rows, torch.Tensor) and rows.device != stored.device:
                rows = rows.to(stored.device)
            stored = stored[rows]
        dtype = stored.dtype if name == "mean" or self.latent_dtype is None else self.latent_dtype
        device = stored.device if self.latent_device is None else self.latent_device
        return stored.to(device=device, dtype=dtype, non_blocking=stored.is_pinned())

    def latent_bytes(self) -> int:
        """Bytes the record's latents (LATENT_FIELDS) hold, wherever they are stored."""
        return sum(t.numel() * t.element_size() for t in (getattr(self, f) for f in LATENT_FIELDS) if t is not None)

    @property
    def num_transitions(self) -> int:
        return self.log_prob.shape[0]

    @property
    def num_leaves(self) -> int:
        return self.leaf_state.shape[0]

    @property
    def num_prompts(self) -> int:
        return self.prompt_ids.shape[0]

    def kernel_names(self) -> list[str]:
        return [KERNEL_NAMES[k] for k in self.kernel.tolist()]

    def bookkeeping_on_cpu(self) -> "Trajectory":
        """This record with its index fields and log-probs on the CPU, latents and σ's where they are.

        A rollout on a GPU keeps its record there; rewards, groups and advantages are CPU tensors
        (the reward runner scores on the host), and indexing a CPU tensor with GPU indices fails.
        The advantage arithmetic (``node_values``, ``transition_values``, best-of-N, BranchGRPO's
        path weights) runs on this view; CPU indices still index the GPU latents."""
        return replace(self, log_prob=self.log_prob.cpu(), **{f: getattr(self, f).cpu() for f in _INDEX_FIELDS})

    def node_values(self, leaf_values: torch.Tensor) -> torch.Tensor:
        """Mean of descendant leaf values for every node: [L] or [L, K] → [P, Nn] or [P, Nn, K]
        (leaf rows in record order). BranchGRPO's r̄(n); for a chain it is the chain's reward.
        NaN leaves are left out of the means; a node with no valid leaf below it is NaN."""
        if leaf_values.shape[0] != self.num_leaves:
            raise ValueError(f"need one value per leaf ({self.num_leaves}), got {leaf_values.shape[0]}")
        P, Nn = self.num_prompts, self.node_parent.numel()
        extra = tuple(leaf_values.shape[1:])
        total = torch.zeros((P, Nn) + extra, dtype=torch.float64, device=leaf_values.device)
        count = torch.zeros((P, Nn), dtype=torch.float64, device=leaf_values.device)
        valid = ~torch.isnan(leaf_values.to(torch.float64))
        if extra:  # a leaf counts for a node's mean only where all its values are valid
            valid = valid.flatten(1).all(1)
        filled = torch.where(valid.view((-1,) + (1,) * len(extra)), leaf_values.to(torch.float64), 0.0)
        total[self.leaf_prompt, self.leaf_node] = filled
        count[self.leaf_prompt, self.leaf_node] = valid.to(torch.float64)
        parents = self.node_parent.tolist()
        for node in range(Nn - 1, -1, -1):  # children have larger ids than their parents
            par = parents[node]
            if par >= 0:
                total[:, par] += total[:, node]
                count[:, par] += count[:, node]
        count = count.view((P, Nn) + (1,) * len(extra))
        # NaN (not applicable / failed) leaves are left out; a node with no valid leaf below is NaN
        return torch.where(count > 0, total / count.clamp(min=1), float("nan")).to(leaf_values.dtype)

    def transition_values(self, leaf_values: torch.Tensor) -> torch.Tensor:
        """node_values at each transition's x' ([M] or [M, K]): the value the edge is credited with."""
        return self.node_values(leaf_values)[self.prompt, self.node]


@dataclass
class Endpoints:
    """A log-prob-free rollout: only x_T and x_0 of every leaf (rows sorted by (prompt, node))."""

    initial: torch.Tensor  # [L, *latent] storage dtype, x_T of the leaf's root
    final: torch.Tensor  # [L, *latent] storage dtype, x_0
    prompt: torch.Tensor  # [L] int64, prompt row
    node: torch.Tensor  # [L] int64, leaf node id
    group: torch.Tensor  # [L] int64, advantage group
    nfe: dict  # category -> per-sample forwards


def score_transitions(
    velocity,
    record: Trajectory,
    rows: torch.Tensor | None = None,
    *,
    max_batch: int | None = None,
    reduce: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recompute (log_prob [R], mean [R, *latent]) of stored transitions ``rows`` (default all) with
    ``velocity``: same σ (float32), same conditioning rows, same kernel and log-prob functions, so an
    unchanged velocity reproduces ``record.log_prob`` exactly (the ratio == 1 contract)."""
    rows = torch.arange(record.num_transitions) if rows is None else torch.as_tensor(rows)
    rows = rows.to(record.log_prob.device)
    x = record.latents("state", rows)
    sigma, cond = record.sigma[rows], record.cond_index[rows]
    step = max(1, x.shape[0] if not max_batch else max_batch)
    chunks = [
        velocity(x[i : i + step], sigma[i : i + step], cond[i : i + step]) for i in range(0, len(x), step)
    ]
    v = torch.cat(chunks) if chunks else torch.empty_like(x)
    dtype = compute_dtype(x.dtype)
    lp = torch.empty(len(rows), dtype=dtype, device=x.device)
    mean = torch.empty(x.shape, dtype=dtype, device=x.device)
    kernels, x_next = record.kernel[rows], record.latents("next_state", rows)
    for k in kernels.unique().tolist():
        sel = (kernels == k).nonzero().squeeze(1)
        mu, std = get_kernel(KERNEL_NAMES[k])(
            x[sel], v[sel], sigma[sel], record.sigma_next[rows][sel], record.eta[rows][sel]
        )
        mean[sel] = mu
        lp[sel] = log_prob(x_next[sel], mu, std, reduce or record.reduce, record.log_prob_form)
    return lp, mean


__all__ = ["Endpoints", "LATENT_FIELDS", "LATENT_STORAGE", "NFECounter", "NFE_KINDS", "Trajectory", "score_transitions"]
