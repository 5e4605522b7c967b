"""Off-policy replay for the transition learner (OP-GRPO, arXiv 2604.04142; docs/math.md §3 "Off-policy replay").

``learner.replay.per_group`` > 0 keeps, after every iteration, the ``per_group`` samples of each group with the
highest positive advantage (the "high-quality trajectories") for ``age`` iterations, and trains them again in those
iterations beside the fresh rollouts:

- each kept sample keeps only its transitions of the first ``steps`` × T steps of the plan (late steps give
  ill-conditioned off-policy ratios: the paper truncates them), with its advantage, its behaviour log-probs
  (the rollout's) and its plan weight, on the host;
- when it is replayed, its log-probs are recomputed under the current weights (θ_old of the iteration) with the
  learner's own likelihood path; the PPO ratio is formed against those, so the clip acts as on fresh transitions
  (ρ = 1 at the iteration's first step), and the policy term is multiplied by the sequence-level importance
  weight w = min(max_weight, exp Σ_k (lp_now,k − lp_behaviour,k)) over its kept steps, which corrects for the
  policy it was sampled from and fades a stale sample out;
- a replayed sample trains in a group of its own origin (iteration, group): each weighs as one group in the loss's
  normalisation, like a fresh one.

The paper's body could not be read here: the selection (the best ``per_group`` per group, A > 0), the buffer's age
limit, the truncation as a fraction of the steps and the weight's cap are flowgrpo's reading of its abstract
(docs/presets.md lists them). Chain plans only (a tree's transitions are shared by its leaves), unsharded runs only
(the buffer is saved whole in the checkpoint: every process's entries are gathered).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from flowgrpo.conditions import images_of

# each entry's tensors, saved as replay.<i>.<field>
TENSORS = ("state", "next_state", "log_prob", "sigma", "sigma_next", "eta", "kernel", "step", "weight")


@dataclass
class Entry:
    """One kept sample: its transitions of the kept steps (host tensors [k, ...]) and where it came from."""

    origin: int  # the iteration it was sampled in
    group: int  # its global group id then
    text: str  # its prompt (re-encoded when it is replayed)
    metadata: dict  # its prompt's row (its condition images are re-encoded with the text)
    advantage: float  # its advantage then (clipped)
    state: torch.Tensor
    next_state: torch.Tensor
    log_prob: torch.Tensor  # the behaviour policy's
    sigma: torch.Tensor
    sigma_next: torch.Tensor
    eta: torch.Tensor
    kernel: torch.Tensor
    step: torch.Tensor
    weight: torch.Tensor  # the plan's loss weight
    owner: int = 0  # the process that holds it


@dataclass
class ReplayBatch:
    """What the learner reads of a rollout batch, for the replayed entries: their record and conditioning."""

    record: object  # samplers.Trajectory of the replayed transitions
    cond: object  # their prompts' Conditioning (record.cond_index points into it)
    texts: list[str]


class ReplayBuffer:
    """The kept samples of one process (``entries``) and the rules that fill, age and replay them."""

    def __init__(self, cfg, rank: int = 0, world: int = 1):
        self.cfg, self.rank, self.world = cfg, rank, world
        self.entries: list[Entry] = []

    # ---------------------------------------------------------------- filling and ageing
    def keep(self, iteration: int, batches: list, rows: list, chains: list, plan_steps: int) -> None:
        """After the iteration's replay was built: keep the best ``per_group`` samples (A > 0) of each fresh group
        (``rows``: the iteration's TransitionRows, ``chains``: each row's sample key), then drop entries older than
        ``age`` iterations."""
        cut = max(1, math.floor(self.cfg.steps * plan_steps + 1e-9))
        samples: dict[tuple, list[int]] = {}
        for i, row in enumerate(rows):
            samples.setdefault(chains[i], []).append(i)
        by_group: dict[int, list[tuple]] = {}
        for key, members in samples.items():
            row = rows[members[0]]
            if row.advantage > 0:
                by_group.setdefault(row.group, []).append((-row.advantage, key))
        for group in sorted(by_group):
            for _, key in sorted(by_group[group])[: self.cfg.per_group]:
                members = [i for i in samples[key] if int(batches[rows[i].batch].record.step[rows[i].row]) < cut]
                if members:
                    self.entries.append(self._entry(iteration, batches, rows, members))
        self.entries = [e for e in self.entries if iteration + 1 - e.origin <= self.cfg.age]

    def _entry(self, iteration: int, batches: list, rows: list, members: list[int]) -> Entry:
        b = batches[rows[members[0]].batch]
        rec = b.record
        r = torch.tensor([rows[i].row for i in members])
        host = lambda t: t[r.to(t.device)].detach().cpu().clone()  # noqa: E731
        prompt = int(rec.prompt[r[0]])
        return Entry(iteration, rows[members[0]].group, b.texts[prompt], b.metadata[prompt], rows[members[0]].advantage,
                     rec.latents("state", r).cpu().clone(), rec.latents("next_state", r).cpu().clone(),
                     host(rec.log_prob), host(rec.sigma), host(rec.sigma_next), host(rec.eta), host(rec.kernel),
                     host(rec.step), host(rec.loss_weight), self.rank)

    # ---------------------------------------------------------------- replaying
    def record(self, model, device):
        """The replayed entries as one batch (``ReplayBatch``: a record of their transitions, the re-encoded prompts)
        and each entry's row range in it; None when the buffer is empty."""
        from samplers import Trajectory

        if not self.entries:
            return None, []
        spans, start = [], 0
        for e in self.entries:
            spans.append(range(start, start + len(e.step)))
            start += len(e.step)
        cat = lambda name: torch.cat([getattr(e, name) for e in self.entries]).to(device)  # noqa: E731
        prompt = torch.cat([torch.full((len(e.step),), k, dtype=torch.long) for k, e in enumerate(self.entries)])
        texts = [e.text for e in self.entries]
        none = torch.zeros(0, dtype=torch.long)
        state = cat("state")
        record = Trajectory(
            sigmas=torch.zeros(0, dtype=torch.float64), reduce="mean", state=state, next_state=cat("next_state"),
            log_prob=cat("log_prob"), mean=None, sigma=cat("sigma"), sigma_next=cat("sigma_next"), eta=cat("eta"),
            kernel=cat("kernel"), step=cat("step"), prompt=prompt.to(device), cond_index=prompt.to(device),
            parent=prompt.to(device), node=prompt.to(device), group=prompt.to(device), loss_weight=cat("weight"),
            leaf_state=state[:0], leaf_prompt=none, leaf_node=none, leaf_group=none, leaf_root=none, root_state=state[:0],
            node_parent=none, node_depth=none, node_group=none, prompt_ids=torch.arange(len(texts)),
            prompt_cond=torch.arange(len(texts)), groups_per_prompt=1, nfe={})
        cond = model.encode_prompts(texts, images=images_of([e.metadata for e in self.entries]))
        return ReplayBatch(record, cond, texts), spans

    def weights(self, lp_now: torch.Tensor, spans: list) -> list[float]:
        """Each entry's sequence-level importance weight min(max_weight, exp Σ (lp_now − lp_behaviour))."""
        out = []
        for e, span in zip(self.entries, spans):
            log_w = float((lp_now[span.start : span.stop].double().cpu() - e.log_prob.double()).sum())
            out.append(min(self.cfg.max_weight, math.exp(min(log_w, 700.0))))
        return out

    # ---------------------------------------------------------------- checkpoints
    def everyone(self) -> list[Entry]:
        """Every process's entries (gathered), in (owner, position) order."""
        if self.world == 1 or not dist.is_initialized():
            return list(self.entries)
        parts: list = [None] * self.world
        dist.all_gather_object(parts, self.entries)
        return [e for part in parts for e in part]

    def state(self) -> tuple[list[dict], dict[str, torch.Tensor]]:
        """(metadata per entry, tensors ``replay.<i>.<field>``) of every process's entries."""
        entries = self.everyone()
        meta = [{"origin": e.origin, "group": e.group, "text": e.text, "metadata": e.metadata, "advantage": e.advantage,
                 "owner": e.owner} for e in entries]
        tensors = {f"replay.{i}.{name}": getattr(e, name).contiguous() for i, e in enumerate(entries) for name in TENSORS}
        return meta, tensors

    def load(self, meta: list[dict], tensors: dict[str, torch.Tensor], world_then: int) -> None:
        """Put back ``state``'s entries: each with its owner when the run has as many processes as the one that saved
        them, else dealt out round-robin."""
        self.entries = []
        for i, m in enumerate(meta):
            owner = m["owner"] if world_then == self.world else i % self.world
            if owner == self.rank:
                fields = {name: tensors[f"replay.{i}.{name}"].cpu() for name in TENSORS}
                self.entries.append(Entry(m["origin"], m["group"], m["text"], m.get("metadata") or {}, m["advantage"],
                                          owner=owner, **fields))


__all__ = ["Entry", "ReplayBatch", "ReplayBuffer", "TENSORS"]
