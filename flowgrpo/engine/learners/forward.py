"""What the forward-process learners share (docs/math.md §5): they train on the clean samples a rollout made.

A rollout of any plan (ODE with any solver, SDE or CPS kernels for exploration, trees) hands the
learner its leaves: clean latents x0 [L, *latent], their conditioning rows and their advantages (the
rules of flowgrpo/engine/credit.py: group z-scores, GDPO, BranchGRPO's depth-wise values at the leaves,
best-of-N). For every inner epoch each sample gets K training draws (``learner.train_times``):

- a time t from ``learner.time_sampler``: ``plan`` (K distinct points of the rollout's own grid
  σ_0 … σ_{T−1}, as DiffusionNFT, AWM and DGPO train), ``uniform`` on [time_min, time_max], or
  ``logit_normal`` (sigmoid of N(logit_mean, logit_std), then the rollout's time shift, truncated);
  ``time_min`` / ``time_max`` bound every sampler (DGPO trains only high-noise t);
- fresh noise ε ~ N(0, I), and x_t = (1 − t)·x0 + t·ε, whose target velocity is u = ε − x0.

Draws are a pure function of (seed, iteration, epoch, prompt slot, leaf node) — of the group instead
of the node with ``share_draws=group`` (DGPO compares a group's members on the same t and ε) — so a
resumed run, a different micro-batch size or another number of processes draw the same numbers.
The velocity is conditional (CFG-free, the papers' default) or the rollout's CFG
(``learner.train_guidance``). Optimizer steps split whole groups as the transition learner does
(``train.updates_per_epoch``). A micro-batch holds at most ``train.micro_batch`` training rows: a
learner whose loss is a sum over rows (NFT, AWM) splits a group, even a sample's K draws, where the limit
falls; DGPO's loss compares a group's members on each draw, so its unit is (group, draw) (``unit``). An
81-frame Wan video is ~33k tokens per row: whole groups of 24 samples × 9 draws would be one forward of
7M tokens. Every model call is counted as a training forward (the policy's, the old policy's, the
reference's, an EMA's) and its backward.

NFT's sampling policy θ_old, AWM's EMA and DGPO's ema_ref are copies of the weights the policy keeps
(``soft_copy``): θ_c ← λ·θ_c + (1 − λ)·θ with λ = min(rate·(n − delay), max) after n optimizer steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import samplers
from flowgrpo.models.copies import WeightCopy, soft_keep
from flowgrpo.engine.learners.base import Learner, Rollouts, Step, deal_samples, seeded_permutation
from samplers.grids import STREAM_FORWARD_UPDATE_ORDER, STREAM_TRAIN_DRAWS



def optimality_probability(advantages: torch.Tensor, adv_max: float) -> torch.Tensor:
    """r = clamp(½ + ½·A/A_max, 0, 1): how likely a sample is to come from the better policy (NFT's r, CRD's a)."""
    return (0.5 + 0.5 * advantages / adv_max).clamp(0.0, 1.0)


def soft_copy(policy, name: str, cfg, follows: str) -> WeightCopy:
    """A copy of the weights on the soft schedule of ``cfg`` (a SoftCopyConfig: rate, max, delay)."""
    return policy.copy(name, soft_keep(cfg.rate, cfg.max, cfg.delay, cfg.start), follows)


@dataclass
class Sample:
    """One clean sample of the iteration that trains (its advantage is not NaN)."""

    batch: int  # rollout batch index
    leaf: int  # row of the batch's record leaves
    advantage: float  # clipped to ±adv_max
    group: int  # global advantage group (prompt slot · groups per prompt + local group)
    key: tuple  # seed parts of its draws: (slot, node) or, with share_draws=group, (slot, group)
    tied: bool = False  # of a tied group (advantage.tied_groups=skip): in the normaliser, never computed


@dataclass(frozen=True)
class Member:
    """A sample in a micro-batch, with the draws (indices into its K) whose rows this micro-batch trains."""

    sample: Sample
    draws: tuple[int, ...]

    @property
    def slot(self) -> int:
        """The prompt slot of the iteration the sample answers."""
        return self.sample.key[0]


@dataclass(frozen=True)
class DrawSpace:
    """Where an iteration's training draws come from: the rollout's grid and time shift, the latent shape."""

    iteration: int
    grid: torch.Tensor  # [T] float32, σ_0 … σ_{T−1} of the rollout's plan before grid_ends edits (no clean endpoint)
    shift: float | None  # the plan's time shift (logit_normal draws are shifted by it)
    latent: tuple[int, ...]  # the model's latent shape

    @classmethod
    def of(cls, rollouts: Rollouts, latent: tuple[int, ...]) -> "DrawSpace":
        plan = rollouts.plan
        grid = plan.sigmas if plan.unedited_sigmas is None else plan.unedited_sigmas  # AWM's t = 1 at index 0
        return cls(rollouts.iteration, grid[:-1].to(torch.float32), plan.shift, tuple(latent))


@dataclass
class ForwardWork:
    """An iteration's trained samples (``ForwardLearner.prepare``)."""

    iteration: int
    batches: list  # the rollout batches
    samples: list[Sample]
    by_group: dict  # {group: indices into samples}
    group_ids: list[int]
    space: DrawSpace
    trained: int  # samples trained (not tied)


class ForwardLearner(Learner):
    """A learner on the clean samples (see the module docstring); subclasses implement ``micro_loss``."""

    needs_transitions = False
    trained_metric = "trained_samples"
    # what a micro-batch never splits: a row (sample, draw), "sample" (a sample's K draws), "group_draw" (a group on one
    # draw), "group"
    unit = "row"

    def describe(self, leaves_per_prompt: int, trained_per_prompt: int) -> str:
        t, K = self.cfg.train, self.cfg.learner.train_times
        rows = t.prompts_per_iteration * leaves_per_prompt * K
        epochs = f"{t.inner_epochs} inner epoch" + ("s" if t.inner_epochs != 1 else "")
        return (f"training draws (t, ε) per sample: {K} per inner epoch; per iteration: {rows * t.inner_epochs} "
                f"training rows (sample x draw) over {epochs}\n"
                f"optimizer steps per iteration: {t.inner_epochs} epochs x {t.updates_per_epoch} updates = "
                f"{t.inner_epochs * t.updates_per_epoch}; ~{rows // t.updates_per_epoch} training rows (sample x draw) "
                f"per update in micro-batches of at most {t.micro_batch} rows per process")

    # ---------------------------------------------------------------- the data
    def samples(self, rollouts: Rollouts) -> list[Sample]:
        clip = self.cfg.learner.adv_max
        out, masks = [], rollouts.advantages.tied_leaves
        for bi, (b, adv) in enumerate(zip(rollouts.batches, rollouts.advantages.leaves)):
            rec = b.record
            gpp = rec.groups_per_prompt
            for i in range(rec.num_leaves):
                a = float(adv[i])
                if math.isnan(a):
                    continue
                slot = b.slots[int(rec.leaf_prompt[i])]
                local_group = int(rec.leaf_group[i]) % gpp
                key = (slot, local_group) if self.cfg.learner.share_draws == "group" else (slot, 1_000_000 + int(rec.leaf_node[i]))
                out.append(Sample(bi, i, max(-clip, min(clip, a)), slot * gpp + local_group, key,
                                  masks is not None and bool(masks[bi][i])))
        return out

    def draws(self, sample: Sample, epoch: int, space: DrawSpace):
        """(t [K] float32, ε [K, *latent] float32) of one sample in one inner epoch (CPU draws)."""
        lc, t_cfg = self.cfg.learner, self.cfg.train
        own = samplers.make_generator(STREAM_TRAIN_DRAWS, t_cfg.seed, space.iteration, epoch, *sample.key)
        # the times from the draw's own stream, or (share_times=iteration) one stream for every sample of the epoch
        gen = own if lc.share_times == "draw" else samplers.make_generator(STREAM_TRAIN_DRAWS, t_cfg.seed,
                                                                            space.iteration, epoch, -1)
        K, grid = lc.train_times, space.grid
        if lc.time_sampler in ("plan", "stratified"):
            candidates = grid[(grid >= lc.time_min) & (grid <= lc.time_max)]
            n = candidates.numel()
            if n < K:
                raise ValueError(
                    f"learner.train_times={K} but only {n} points of the rollout grid lie in "
                    f"[time_min={lc.time_min}, time_max={lc.time_max}]; lower train_times or widen the range"
                )
            if lc.time_sampler == "plan":
                t = candidates[torch.randperm(n, generator=gen)[:K]]
            else:  # AWM's: the points (grid order) cut at ⌊n·k/K⌋, k = 0..K, one drawn uniformly from each run
                edges = [math.floor(n * k / K) for k in range(K + 1)]
                picks = [lo + int(torch.randint(hi - lo, (1,), generator=gen)) for lo, hi in zip(edges, edges[1:])]
                t = candidates[torch.tensor(picks)]
        elif lc.time_sampler == "uniform":
            t = lc.time_min + (lc.time_max - lc.time_min) * torch.rand(K, generator=gen, dtype=torch.float64)
        else:  # logit_normal with the rollout's time shift k, truncated to [time_min, time_max] by inverse CDF:
            # t = shift(sigmoid(z)), z ~ N(mean, std), is increasing in z, so u ~ U(F(time_min), F(time_max))
            if space.shift is None:
                raise ValueError("learner.time_sampler=logit_normal shifts its draws by the plan's time shift, and this "
                                 "plan has none (build it with compose_plan, or use time_sampler=plan or uniform)")
            k = float(space.shift)

            def cdf(time: float) -> torch.Tensor:  # P(t ≤ time): unshift, logit, standardise
                unshifted = torch.tensor(time / (k - (k - 1) * time), dtype=torch.float64)
                return torch.special.ndtr((torch.logit(unshifted) - lc.logit_mean) / lc.logit_std)

            lo, hi = cdf(lc.time_min), cdf(lc.time_max)
            u = lo + (hi - lo) * torch.rand(K, generator=gen, dtype=torch.float64)
            t = samplers.shift_sigmas(torch.sigmoid(lc.logit_mean + lc.logit_std * torch.special.ndtri(u)), k)
        noise = torch.randn((K,) + space.latent, generator=own)
        t = t.to(torch.float32)
        if lc.integer_times:  # DGPO's code trains at t/1000 of its scheduler's integer timesteps ⌊1000σ⌋
            t = torch.floor(t * 1000) / 1000
        return t, noise

    @property
    def guidance(self) -> float | None:
        """The guidance of training calls: conditional (1.0, CFG-free) or the rollout's CFG."""
        return 1.0 if self.cfg.learner.train_guidance == "conditional" else self.cfg.sampling.guidance_scale

    def velocity(self, x: torch.Tensor, t: torch.Tensor, cond, weights=None) -> torch.Tensor:
        """v at (x_t, t): the current weights with gradient, or without it a copy's or the reference's
        (``weights=flowgrpo.engine.policy.REFERENCE``); with learner.integer_times the network is told the integer
        timestep 1000·t exactly (t is a multiple of 1/1000 then)."""
        with self.policy.model.integer_timesteps(self.cfg.learner.integer_times, rounding="nearest"):
            return self.policy.velocity(x, t, cond, self.guidance, weights)

    def filler(self, work: ForwardWork) -> list[Member]:
        """A sample for a sharded process that trains none this step (its loss is multiplied by 0)."""
        return [Member(Sample(0, 0, 0.0, -1, (0, 0)), tuple(range(self.cfg.learner.train_times)))]

    def pack(self, chunk: list[int], by_group: dict, samples: list[Sample], limit: int,
                      unit: str | None = None) -> list[list[Member]]:
        """The update's rows in micro-batches of at most ``limit`` rows (one unit more only where a unit alone
        is larger): group by group, sample-major, each sample's draws in order (see the module docstring)."""
        K, unit = self.cfg.learner.train_times, unit or self.unit
        units = []  # (rows, [(sample index, draw)])
        for g in chunk:
            if unit == "group":
                units.append((len(by_group[g]) * K, [(i, k) for i in by_group[g] for k in range(K)]))
            elif unit == "group_draw":
                units += [(len(by_group[g]), [(i, k) for i in by_group[g]]) for k in range(K)]
            elif unit == "sample":
                units += [(K, [(i, k) for k in range(K)]) for i in by_group[g]]
            else:
                units += [(1, [(i, k)]) for i in by_group[g] for k in range(K)]
        parts, rows, cells = [], 0, []
        for n, unit in units:
            if cells and rows + n > limit:
                parts.append(cells)
                rows, cells = 0, []
            rows += n
            cells += unit
        if cells:
            parts.append(cells)
        out = []
        for cells in parts:  # one Member per sample, in the order its rows first appear
            draws: dict[int, list[int]] = {}
            for i, k in cells:
                draws.setdefault(i, []).append(k)
            out.append([Member(samples[i], tuple(sorted(ks))) for i, ks in draws.items()])
        return out

    # ---------------------------------------------------------------- the update
    def prepare(self, rollouts: Rollouts) -> ForwardWork:
        samples = self.samples(rollouts)
        self.begin_update(samples)
        by_group: dict[int, list[int]] = {}
        for i, s in enumerate(samples):
            by_group.setdefault(s.group, []).append(i)
        return ForwardWork(rollouts.iteration, rollouts.batches, samples, by_group, sorted(by_group),
                           DrawSpace.of(rollouts, self.policy.latent_shape), sum(not s.tied for s in samples))

    def steps(self, work: ForwardWork, epoch: int):
        samples = work.samples
        for chunk in self.updates(work.by_group, work.group_ids, work.iteration, epoch):
            normaliser = self.normalisation(samples, list(chunk), chunk)
            chosen = {g: [i for i in members if not samples[i].tied] for g, members in chunk.items()}
            yield Step(chosen, len({samples[i].key[0] for v in chosen.values() for i in v}), normaliser)

    def micro_batches(self, work: ForwardWork, step: Step, probe: bool) -> list[list[Member]]:
        """Micro-batches of at most train.micro_batch rows; a gradient-noise probe's hold whole groups (at least two,
        up to four), so that each is a small-batch gradient over its prompts."""
        chosen, limit, unit = step.units, self.cfg.train.micro_batch, None
        if probe:
            limit = min(limit, -(-sum(len(v) for v in chosen.values()) * self.cfg.learner.train_times // 4))
            unit = "group"
        return self.pack(list(chosen), chosen, work.samples, limit, unit)

    def report(self, diagnostics: dict) -> dict:
        return {f"{self.name}/{k}": float(v.mean()) for k, v in diagnostics.items()}

    def updates(self, by_group: dict, group_ids: list[int], iteration: int, epoch: int) -> list[dict]:
        """Each of the pass's train.updates_per_epoch optimizer steps as {group: its samples there}: whole groups dealt
        out in a seeded order, or (update_split=samples) every group's samples dealt out (``deal_samples``)."""
        t = self.cfg.train
        U = t.updates_per_epoch
        if t.update_split == "samples":
            return deal_samples(by_group, U, t.seed, STREAM_FORWARD_UPDATE_ORDER, iteration, epoch)
        order = seeded_permutation(len(group_ids), t.seed, STREAM_FORWARD_UPDATE_ORDER, iteration, epoch).tolist()
        return [{group_ids[i]: by_group[group_ids[i]] for i in order[u::U]} for u in range(U)]

    def normalisation(self, samples: list[Sample], chunk: list[int], by_group: dict) -> float:
        """The loss of one optimizer step is a mean over its training rows (sample × draw), over all processes."""
        rows = sum(len(by_group[g]) for g in chunk) * self.cfg.learner.train_times
        return float(self.policy.gather(torch.tensor([rows])).sum())

    def rows(self, members: list[Member], work: ForwardWork, epoch: int):
        """The micro-batch's training rows: x0, x_t, t, u = ε − x0, the conditioning rows, advantages [R],
        each row's index into ``members`` and its draw index in 0..K−1 (rows are member-major, each member's
        chosen draws in order). A draw's numbers do not depend on which of them a micro-batch holds."""
        batches, space = work.batches, work.space
        device, latent = self.policy.device, space.latent
        x0, ts, noise, conds, counts = [], [], [], [], []
        for m in members:
            s, pick = m.sample, torch.tensor(m.draws)
            rec = batches[s.batch].record
            t, eps = self.draws(s, epoch, space)
            x0.append(rec.latents("leaf_state", s.leaf).unsqueeze(0).expand((len(m.draws),) + latent))
            ts.append(t[pick])
            noise.append(eps[pick])
            conds.append(int(rec.prompt_cond[rec.leaf_prompt[s.leaf]]))
            counts.append(len(m.draws))
        x0 = torch.cat(x0).to(device, torch.float32)
        t = torch.cat(ts).to(device)
        eps = torch.cat(noise).to(device)
        column = t.view((-1,) + (1,) * len(latent))
        x_t = (1 - column) * x0 + column * eps
        per_row = torch.tensor(counts)
        adv = torch.tensor([m.sample.advantage for m in members]).repeat_interleave(per_row).to(device)
        index = torch.arange(len(members)).repeat_interleave(per_row).to(device)
        draw = torch.tensor([k for m in members for k in m.draws], device=device)
        cond = self._conditioning(members, batches, torch.tensor(conds).repeat_interleave(per_row), counts)
        return x0, x_t, t, eps - x0, cond, adv, index, draw

    @staticmethod
    def _conditioning(members: list[Member], batches, cond_rows, counts: list[int]):
        """Conditioning rows in member order (a micro-batch may hold groups of several rollout batches)."""
        out, start, row = None, 0, 0
        while start < len(members):
            end, rows = start, 0
            while end < len(members) and members[end].sample.batch == members[start].sample.batch:
                rows += counts[end]
                end += 1
            part = batches[members[start].sample.batch].cond.select(cond_rows[row : row + rows])
            out = part if out is None else out.concat(part)
            start, row = end, row + rows
        return out

    # ---------------------------------------------------------------- the method
    def begin_update(self, samples: list[Sample]) -> None:
        """Called once per iteration before the first optimizer step (e.g. snapshot the rollout weights)."""

    def micro_loss(self, work: ForwardWork, members: list[Member], epoch: int, first: bool,
                   real: bool) -> tuple[torch.Tensor, dict]:
        """The loss of a micro-batch's rows (``rows``) summed, and per-row diagnostics (see ``Learner``)."""
        raise NotImplementedError
