"""The executor: runs a plan for a batch of prompts as a tree of states, level by level.

    record = rollout(velocity, plan, prompt_ids=[17, 42], latent_shape=(16, 8, 8), seed=0,
                     iteration=n)

Every node of a level sits at the same σ, so each level is **one** batched velocity call (split into
chunks of at most ``max_batch`` rows); a side-lane node that is ahead of its level (a merged side step, a strided
lane: tree.py) waits there without a forward, copied to the next level. Then each edge group of the step (tree.py) applies its kernel:
ODE groups use the step's solver (DPM-Solver++(2M) gets every node's previous x̂0, SDE steps
included; SA-Solver the previous two, and its noise comes from the node's step-noise stream); SDE groups draw x' = μ + s·ε, round it to the storage dtype, and — if the step is trained —
score the stored x' with ``log_prob`` (ratio == 1 contract). Only trained transitions are stored.

``latent_storage`` says what the record keeps of its latents (trajectory.LATENT_STORAGE): ``bfloat16`` rounds the
states of the trained steps to bfloat16 in the walk itself (a trained step's x before its velocity call, its x'
before it is scored), so the stored, rounded states are exactly those the log-probs were computed from and the
learner's recompute gives ρ = 1; untrained steps walk in the rollout's dtype. ``host`` moves each stored step to
host memory as soon as it is scored (pinned where the rollout runs on CUDA): the same numbers, off the device.

Determinism: initial noise, step noise and DanceGRPO's training subsets each come from their own
``torch.Generator`` seeded by (stream, run seed, iteration, global prompt id, node id) (grids.py), so
a trajectory does not depend on the batch composition, the chunk size, or how prompts are split
across processes (pass the global ``prompt_ids``). Noise is drawn on the CPU in float32 and moved to
the device, so CPU and GPU rollouts draw the same numbers.

``sample_endpoints`` runs the same plan without log-probs or stored transitions and returns only x_T
and x_0 of every leaf.
"""

from __future__ import annotations

import math

import torch

from samplers.grids import (
    STREAM_INITIAL_NOISE,
    STREAM_STEP_NOISE,
    STREAM_TRAIN_SUBSET,
    make_generator,
    seed_prefix,
)
from samplers.kernels import KERNEL_NAMES, LOG_PROB_FORMS, column, compute_dtype, get_kernel, log_prob
from samplers.plans import Plan
from samplers.solvers import Velocity, call_velocity, data_prediction, ode_step, sa_predictor_coefficients, sa_solver_step
from samplers.trajectory import LATENT_STORAGE, Endpoints, NFECounter, Trajectory
from samplers.tree import EdgeGroup, template_for

_RECORD_FIELDS = (
    "state", "next_state", "log_prob", "mean", "sigma", "sigma_next", "eta", "kernel", "step",
    "prompt", "parent", "node", "group", "loss_weight",
)


def _tile(local: torch.Tensor, width: int, num_prompts: int, device) -> torch.Tensor:
    """Per-prompt positions [E] → batch rows [P·E] for prompt-major levels of ``width`` nodes."""
    base = torch.arange(num_prompts, device=device).unsqueeze(1) * width
    return (base + local.to(device).unsqueeze(0)).reshape(-1)


class _Run:
    """State of one rollout; ``run()`` walks the levels."""

    def __init__(self, velocity, plan, prompt_ids, latent_shape, seed, iteration=0, cond_index=None,
                 dtype=torch.float32, device=None, max_batch=None, store_mean=False, reduce="mean", keep_record=True,
                 log_prob_form="gaussian", latent_storage="float32"):
        if not isinstance(plan, Plan):
            raise TypeError(f"plan must be a samplers.Plan, got {type(plan).__name__}")
        if not dtype.is_floating_point:
            raise ValueError(f"storage dtype must be floating point, got {dtype}")
        if reduce not in ("mean", "sum"):
            raise ValueError(f"reduce must be 'mean' or 'sum', got {reduce!r}")
        self.latent = tuple(int(d) for d in latent_shape)
        if not self.latent:
            raise ValueError("latent_shape must be the per-sample shape, e.g. (C, H, W) or (C, F, H, W)")
        self.ids = [int(p) for p in torch.as_tensor(prompt_ids).reshape(-1).tolist()]
        self.P = len(self.ids)
        if self.P == 0:
            raise ValueError("rollout needs at least one prompt")
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        cond = torch.arange(self.P) if cond_index is None else torch.as_tensor(cond_index)
        if cond.shape != (self.P,):
            raise ValueError(f"cond_index must give one conditioning row per prompt [{self.P}]")
        self.cond = cond.to(device=self.device, dtype=torch.long)
        self.velocity, self.plan, self.tpl = velocity, plan, template_for(plan)
        self.seed, self.iteration = int(seed), int(iteration)
        self.dtype, self.cdtype = dtype, compute_dtype(dtype)
        if log_prob_form not in LOG_PROB_FORMS:
            raise ValueError(f"log_prob_form must be one of {LOG_PROB_FORMS}, got {log_prob_form!r}")
        self.max_batch, self.store_mean, self.reduce = max_batch, store_mean, reduce
        self.log_prob_form = log_prob_form
        self.keep_record = keep_record
        if latent_storage not in LATENT_STORAGE:
            raise ValueError(f"latent_storage must be one of {LATENT_STORAGE}, got {latent_storage!r}")
        # bfloat16 storage: the trained steps' states are rounded to it in the walk (none to round if already bf16)
        self.rounded = torch.bfloat16 if latent_storage == "bfloat16" and dtype != torch.bfloat16 else None
        self.host = latent_storage == "host"  # (a CPU rollout's states are in host memory already)
        self.pinned = self.host and self.device.type == "cuda"
        self.sig = [float(s) for s in plan.sigmas.to(torch.float32)]
        self.nfe = NFECounter()
        self.rows: dict[str, list] = {k: [] for k in _RECORD_FIELDS}

    # -- random draws ------------------------------------------------------------------------
    def initial_noise(self) -> torch.Tensor:
        R, shared = self.plan.roots_per_prompt, self.plan.initial_noise == "shared"
        out = torch.empty((self.P * R,) + self.latent, dtype=torch.float32)
        for p, pid in enumerate(self.ids):
            for r in range(R):
                if shared and r > 0:
                    out[p * R + r] = out[p * R]
                    continue
                gen = make_generator(STREAM_INITIAL_NOISE, self.seed, self.iteration, pid, 0 if shared else r)
                torch.randn(self.latent, generator=gen, out=out[p * R + r])
        return out.to(device=self.device, dtype=self.dtype)

    def subset_mask(self) -> torch.Tensor | None:
        """[P, R, T] bool: DanceGRPO's per-root random subset of trained steps (None: no subset)."""
        m = self.plan.train_subset
        if m is None:
            return None
        R, T = self.plan.roots_per_prompt, self.plan.num_steps
        candidates = torch.tensor([i for i, s in enumerate(self.plan.steps) if s.trained])
        mask = torch.zeros((self.P, R, T), dtype=torch.bool)
        for p, pid in enumerate(self.ids):
            for r in range(R):
                gen = make_generator(STREAM_TRAIN_SUBSET, self.seed, self.iteration, pid, r)
                mask[p, r, candidates[torch.randperm(len(candidates), generator=gen)[:m]]] = True
        return mask.to(self.device)

    def step_noise(self, eg: EdgeGroup, node_ids: list[int], gens: dict) -> torch.Tensor:
        """ε [P·E, fanout, *latent] (compute dtype) for the parents of ``eg``; one generator per
        (prompt, node), shared by the node's main and side draws in that order."""
        correlated = eg.kind == "main" and eg.fanout > 1 and eg.split_noise == "correlated"
        draws = eg.fanout + 1 if correlated else eg.fanout
        parents = eg.parents.tolist()
        raw = torch.empty((self.P * len(parents), draws) + self.latent, dtype=torch.float32)
        row = 0
        for p, pid in enumerate(self.ids):
            prefix = seed_prefix(STREAM_STEP_NOISE, self.seed, self.iteration, pid)
            for k in parents:
                gen = gens.get((p, k))
                if gen is None:
                    gen = gens[(p, k)] = make_generator(node_ids[k], prefix=prefix)
                torch.randn((draws,) + self.latent, generator=gen, out=raw[row])
                row += 1
        raw = raw.to(device=self.device, dtype=self.cdtype)
        if eg.kind != "main" or eg.fanout == 1 or eg.split_noise == "independent":
            return raw
        c = eg.split_noise_scale
        if eg.split_noise == "scaled_compat":  # public BranchGRPO code: c·η_b, scored with s
            return raw * c
        return (raw[:, :1] + c * raw[:, 1:]) / math.sqrt(1.0 + c * c)

    # -- one edge group ----------------------------------------------------------------------
    def rows_of(self, i: int, g: int, eg: EdgeGroup) -> dict:
        """Batch-row indices of edge group g of step i for P prompts (cached on the template)."""
        key = (self.P, str(self.device), i, g)
        if key not in self.tpl.batch_cache:
            tpl, P, dev, F = self.tpl, self.P, self.device, eg.fanout
            n, n_next = len(tpl.levels[i].node_id), len(tpl.levels[i + 1].node_id)
            first = _tile(eg.first_child, n_next, P, dev)
            child_local = (eg.first_child.unsqueeze(1) + torch.arange(F)).reshape(-1)
            child_ids = tpl.levels[i + 1].node_id[child_local].repeat(P).to(dev)
            prompt = torch.arange(P, device=dev).repeat_interleave(len(eg.parents) * F)
            parents = _tile(eg.parents, n, P, dev)
            self.tpl.batch_cache[key] = dict(
                parents=parents,  # [P·E] rows of level i
                all_parents=len(eg.parents) == n,  # parents are the whole level, in order
                all_children=F == 1 and len(eg.parents) == n_next,  # children too (chains)
                children=(first.unsqueeze(1) + torch.arange(F, device=dev)).reshape(-1),  # [P·E·F]
                prompt=prompt,  # [P·E·F]
                parent_ids=tpl.levels[i].node_id[eg.parents].repeat_interleave(F).repeat(P).to(dev),
                child_ids=child_ids,
                group=prompt * tpl.groups_per_prompt + tpl.node_group[child_ids.cpu()].to(dev),
                roots=tpl.levels[i].root[eg.parents].repeat_interleave(F).repeat(P).to(dev),
            )
        return self.tpl.batch_cache[key]

    def sa_step(self, i, eg, xs, vs, hist, gens, par, all_parents):
        """An SA-Solver edge group of step i (main lane: side lanes never take it, plans.py)."""
        step, sigma, sigma_next = self.plan.steps[i], self.sig[i], self.sig[i + 1]
        pick = (lambda t: t) if all_parents else (lambda t: t.index_select(0, par))  # noqa: E731
        prev = None if hist[0] is None else (hist[1], pick(hist[0]))
        prev2 = None if hist[2] is None else (hist[3], pick(hist[2]))
        before = self.plan.steps[i - 1] if i >= 1 else None
        corrected = None
        if i >= 2 and before.kernel == "ode" and before.solver == "sa_solver":  # the previous step had history
            corrected = (before.sa_tau, before.sa_predictor_order, before.sa_corrector_order)
        noise = None
        if sigma_next > 0 and sa_predictor_coefficients(sigma, sigma_next, step.sa_tau)[3] > 0:
            noise = self.step_noise(eg, self.tpl.levels[i].node_id.tolist(), gens)[:, 0]
        return sa_solver_step(xs, vs, sigma, sigma_next, tau=step.sa_tau, noise=noise,
                              predictor_order=step.sa_predictor_order, prev=prev, prev2=prev2, corrected=corrected)

    def apply(self, i, g, eg, x, v, x_next, hist, gens, subset):
        rows = self.rows_of(i, g, eg)
        par = rows["parents"]
        if rows["all_parents"]:  # chains: no gather
            xs, vs = x, v
        else:
            xs, vs = x.index_select(0, par), v.index_select(0, par)
        sigma, sigma_next = self.sig[i], self.sig[i + eg.span]
        if eg.kind == "wait":  # ahead of its level: a copy, no forward
            return self.place(x_next, rows, xs)
        if eg.final_x0:  # the lane ends here, before the last level: its sample is this step's x̂0
            x0 = data_prediction(xs, vs, sigma).to(self.dtype)
            x0 = x0 if eg.fanout == 1 else x0.repeat_interleave(eg.fanout, 0)
            if eg.kernel == "ode":
                return self.place(x_next, rows, x0)
        if eg.kernel == "ode" and eg.solver == "sa_solver":
            out = self.sa_step(i, eg, xs, vs, hist, gens, par, rows["all_parents"])
            return self.place(x_next, rows, out.to(self.dtype))
        if eg.kernel == "ode":
            prev_data, prev_sigma = hist[0], hist[1]
            if prev_data is None:
                out = ode_step(eg.solver, xs, vs, sigma, sigma_next)
            else:
                out = ode_step(eg.solver, xs, vs, sigma, sigma_next, prev_sigma, prev_data.index_select(0, par))
            out = out if eg.fanout == 1 else out.repeat_interleave(eg.fanout, 0)  # a side child's lanes start alike
            return self.place(x_next, rows, out.to(self.dtype))
        mean, std = get_kernel(eg.kernel)(xs, vs, sigma, sigma_next, eg.eta)
        noise = self.step_noise(eg, self.tpl.levels[i].node_id.tolist(), gens)
        drawn = mean.unsqueeze(1) + column(std, mean).unsqueeze(1) * noise
        trained = self.keep_record and eg.trained
        if trained and self.rounded is not None:  # x' as the record keeps it, and so as it is scored and walked on
            drawn = drawn.to(self.rounded)
        stored = drawn.to(self.dtype).flatten(0, 1)  # [P·E·F, *latent], x' in its storage dtype
        x_next = self.place(x_next, rows, x0 if eg.final_x0 else stored)
        if not trained:
            return x_next
        F = eg.fanout
        per_child = (lambda t: t) if F == 1 else (lambda t: t.repeat_interleave(F, 0))  # noqa: E731
        mean_rows, std_rows = per_child(mean), per_child(std)
        cols = dict(
            state=per_child(xs),
            next_state=stored,
            mean=mean_rows if self.store_mean else None,
            prompt=rows["prompt"],
            parent=rows["parent_ids"],
            node=rows["child_ids"],
            group=rows["group"],
        )
        if subset is not None:  # chains only (F = 1): the root's random subset of steps
            keep = subset[rows["prompt"], rows["roots"], i]
            cols = {k: (c[keep] if c is not None else None) for k, c in cols.items()}
            mean_rows, std_rows = mean_rows[keep], std_rows[keep]
        m = cols["prompt"].shape[0]
        if m == 0:  # DanceGRPO: no root trains this step
            return x_next
        cols["log_prob"] = log_prob(cols["next_state"], mean_rows, std_rows, self.reduce, self.log_prob_form)
        for k in ("state", "next_state", "mean"):  # scored: now kept as latent_storage says
            cols[k] = self.kept(cols[k], rounded=k != "mean")
        full = lambda value, dt: torch.full((m,), value, dtype=dt, device=self.device)  # noqa: E731
        cols.update(
            sigma=full(sigma, torch.float32),
            sigma_next=full(sigma_next, torch.float32),
            eta=full(eg.eta, torch.float32),
            kernel=full(KERNEL_NAMES.index(eg.kernel), torch.long),
            step=full(i, torch.long),
            loss_weight=full(eg.loss_weight, torch.float32),
        )
        for k, c in cols.items():
            self.rows[k].append(c)
        return x_next

    def kept(self, t, rounded: bool = True):
        """A latent tensor as the record keeps it: in bfloat16 (``rounded``: states, which the walk has already
        rounded where they are stored, so nothing changes but the bytes), in host memory, or as it is."""
        if t is None:
            return None
        if rounded and self.rounded is not None:
            t = t.to(self.rounded)
        return t.cpu() if self.host else t

    def trains(self, i: int) -> bool:
        """Whether step i stores a transition (a trained edge group): its level is then rounded for bfloat16 storage."""
        return self.keep_record and any(eg.trained for eg in self.tpl.edges[i])

    def place(self, x_next, rows, values):
        """Write a group's children into the next level ([P·n_{i+1}, *latent]; None until first use)."""
        if rows["all_children"]:  # the group makes the whole next level, in order
            return values
        if x_next is None:
            x_next = values.new_empty((self.P * self.n_next,) + self.latent)
        return x_next.index_copy_(0, rows["children"], values)

    # -- the walk ----------------------------------------------------------------------------
    def run(self):
        tpl, P = self.tpl, self.P
        with torch.no_grad():
            roots = self.initial_noise()
            subset = self.subset_mask() if self.keep_record else None
            x, hist = roots, (None, None, None, None)  # (x̂0, σ) of the previous point, then of the one before
            for i in range(self.plan.num_steps):
                level, nxt = tpl.levels[i], tpl.levels[i + 1]
                n = len(level.node_id)
                cond_rows = self.cond.repeat_interleave(n)
                if self.rounded is not None and self.trains(i):  # the stored x, exactly as the velocity sees it
                    x = x.to(self.rounded).to(self.dtype)
                if level.active is None:
                    v = call_velocity(self.velocity, x, self.sig[i], cond_rows, self.max_batch)
                else:  # nodes ahead of the level wait: no forward, v = 0 (x̂0 = x keeps an ended lane's sample)
                    act = _tile(level.active, n, P, self.device)
                    va = call_velocity(self.velocity, x.index_select(0, act), self.sig[i], cond_rows[act], self.max_batch)
                    v = va.new_zeros((x.shape[0],) + tuple(va.shape[1:])).index_copy_(0, act, va)
                for category, count in level.category.items():
                    self.nfe.add(category, count * P)
                x_next, gens, self.n_next = None, {}, len(nxt.node_id)
                for g, eg in enumerate(tpl.edges[i]):
                    x_next = self.apply(i, g, eg, x, v, x_next, hist, gens, subset)
                if i == self.plan.num_steps - 1 and self.plan.leaf == "predicted":  # the samples: x̂0 of the last step
                    parent_rows = _tile(nxt.parent_pos, n, P, self.device)
                    x_next = data_prediction(x, v, self.sig[i]).index_select(0, parent_rows).to(self.dtype)
                if tpl.needs_history[i]:  # children inherit their parent's x̂0 (SDE steps too)
                    parent_rows = _tile(nxt.parent_pos, n, P, self.device)
                    older = (None, None)
                    if tpl.needs_history[i] > 1 and hist[0] is not None:  # SA-Solver: the point before too
                        older = (hist[0].index_select(0, parent_rows), hist[1])
                    hist = (data_prediction(x, v, self.sig[i]).index_select(0, parent_rows), self.sig[i], *older)
                else:
                    hist = (None, None, None, None)
                x = x_next
        return roots, x

    def leaves(self):
        tpl, P = self.tpl, self.P
        last = tpl.levels[-1]
        prompt = torch.arange(P, device=self.device).repeat_interleave(len(last.node_id))
        node = last.node_id.to(self.device).repeat(P)
        group = prompt * tpl.groups_per_prompt + tpl.node_group.to(self.device)[node]
        root = prompt * self.plan.roots_per_prompt + last.root.to(self.device).repeat(P)
        return prompt, node, group, root

    def records(self, roots, final) -> Trajectory:
        tpl = self.tpl
        if self.rows["log_prob"]:
            # rows are appended step by step and the record is sorted by (prompt, node): each chunk
            # is written once, straight into its sorted rows (cat + index_select copies twice)
            keys = torch.cat(self.rows["prompt"]) * tpl.node_parent.numel() + torch.cat(self.rows["node"])
            order = torch.argsort(keys, stable=True)
            positions = torch.arange(len(keys), device=keys.device)
            in_order = torch.equal(order, positions)  # e.g. P = 1: already sorted, a plain cat
            dest = torch.empty_like(order)
            dest[order] = positions
            cols = {}
            for k, chunks in self.rows.items():
                if chunks[0] is None:
                    cols[k] = None
                    continue
                # host storage: the latents are assembled straight into (pinned, on CUDA) host memory
                pin = self.pinned and chunks[0].device.type == "cpu"
                out = torch.empty((len(keys),) + tuple(chunks[0].shape[1:]), dtype=chunks[0].dtype,
                                  device=chunks[0].device, pin_memory=pin)
                if in_order:
                    cols[k] = torch.cat(chunks, out=out)
                    continue
                start, where = 0, dest.to(out.device)
                for chunk in chunks:
                    out.index_copy_(0, where[start : start + len(chunk)], chunk)
                    start += len(chunk)
                cols[k] = out
        else:  # nothing trained (e.g. an evaluation plan): empty, correctly shaped tensors
            empty = lambda dt, *shape: torch.empty((0,) + shape, dtype=dt, device=self.device)  # noqa: E731
            cols = {k: empty(torch.long) for k in _RECORD_FIELDS}
            cols.update(state=self.kept(empty(self.dtype, *self.latent)),
                        next_state=self.kept(empty(self.dtype, *self.latent)),
                        log_prob=empty(self.cdtype), sigma=empty(torch.float32),
                        sigma_next=empty(torch.float32), eta=empty(torch.float32),
                        loss_weight=empty(torch.float32),
                        mean=self.kept(empty(self.cdtype, *self.latent), rounded=False) if self.store_mean else None)
        prompt, node, group, root = self.leaves()
        return Trajectory(
            sigmas=self.plan.sigmas.clone(),
            reduce=self.reduce,
            log_prob_form=self.log_prob_form,
            cond_index=self.cond[cols["prompt"]],
            leaf_state=self.kept_whole(final),
            leaf_prompt=prompt,
            leaf_node=node,
            leaf_group=group,
            leaf_root=root,
            root_state=self.kept_whole(roots),
            node_parent=tpl.node_parent.clone(),
            node_depth=tpl.node_depth.clone(),
            node_group=tpl.node_group.clone(),
            node_lanes=None if tpl.node_lanes is None else tpl.node_lanes.clone(),
            prompt_ids=torch.tensor(self.ids, dtype=torch.long),
            prompt_cond=self.cond.clone(),
            groups_per_prompt=tpl.groups_per_prompt,
            nfe=self.nfe.as_dict(),
            latent_device=self.device,
            latent_dtype=self.dtype,
            **cols,
        )

    def kept_whole(self, t):
        """Roots and leaves as the record keeps them (``kept``), copied straight into pinned host memory where the
        rollout ran on CUDA."""
        if not self.pinned:
            return self.kept(t)
        return torch.empty(t.shape, dtype=self.rounded or t.dtype, pin_memory=True).copy_(t)


def _run(velocity, plan, keep_record, nfe, **kwargs):
    run = _Run(velocity, plan, keep_record=keep_record, **kwargs)
    roots, final = run.run()
    if nfe is not None:
        for category, count in run.nfe.as_dict().items():
            nfe.add(category, count)
    return run, roots, final


def rollout(
    velocity: Velocity,
    plan: Plan,
    *,
    prompt_ids,
    latent_shape,
    seed: int,
    iteration: int = 0,
    cond_index=None,
    dtype: torch.dtype = torch.float32,
    device=None,
    max_batch: int | None = None,
    store_mean: bool = False,
    reduce: str = "mean",
    log_prob_form: str = "gaussian",
    nfe: NFECounter | None = None,
    transitions: bool = True,
    latent_storage: str = "float32",
) -> Trajectory:
    """Run ``plan`` for prompts ``prompt_ids`` [P] (their global indices: a seed part) and return the
    trajectory record. ``velocity(x [N, *latent], sigma [N] float32, cond_index [N] long)`` gets
    ``cond_index[p]`` (default p) for rows of prompt p. ``dtype`` is the storage dtype of states;
    ``store_mean`` keeps μ_old per trained transition; ``nfe`` (optional) accumulates forwards; ``reduce`` and
    ``log_prob_form`` say how the stored log-probs are scored (``samplers.kernels.log_prob``).
    ``transitions=False`` stores no transitions (M = 0) but the same leaves, tree and draws: what a
    learner that trains on the clean samples alone needs (forward-process learners). ``latent_storage``
    (trajectory.LATENT_STORAGE) says what the record keeps of its latents: float32 (as computed, in ``dtype``),
    bfloat16 (the trained steps' states rounded in the walk, then stored rounded) or host (host memory); read them
    back with ``Trajectory.latents``."""
    run, roots, final = _run(
        velocity, plan, transitions, nfe, prompt_ids=prompt_ids, latent_shape=latent_shape, seed=seed,
        iteration=iteration, cond_index=cond_index, dtype=dtype, device=device,
        max_batch=max_batch, store_mean=store_mean, reduce=reduce, log_prob_form=log_prob_form,
        latent_storage=latent_storage,
    )
    return run.records(roots, final)


def sample_endpoints(velocity: Velocity, plan: Plan, *, nfe: NFECounter | None = None, **kwargs) -> Endpoints:
    """Log-prob-free rollout of ``plan``: x_T and x_0 of every leaf, nothing else. Takes ``rollout``'s keyword
    arguments (prompt_ids, latent_shape, seed, iteration, cond_index, dtype, device, max_batch) and makes the
    same draws, so the same x_0."""
    run, roots, final = _run(velocity, plan, False, nfe, store_mean=False, reduce="mean", **kwargs)
    prompt, node, group, root = run.leaves()
    return Endpoints(roots.index_select(0, root), final, prompt, node, group, run.nfe.as_dict())


__all__ = ["rollout", "sample_endpoints"]
