"""The SAMPLE phase: an iteration's prompts, rolled out by its plan, decoded, and sent to the rewards.

Each process samples whole prompts (with their groups): the iteration's P global prompt slots are
split into ``sampling.batches_per_iteration`` rollout batches and dealt round-robin to the processes
(``iteration_slots``); which prompt fills a slot is a pure function of (seed, iteration, slot)
(``flowgrpo.data.draw_prompt``: uniform passes, or balanced over ``train.balance_by``). The plan's
tree executor (``samplers.rollout``) runs each batch with the weights the learner samples with; the
leaves are decoded in chunks and each chunk goes to the rewards' worker thread at once, so scoring
overlaps the next chunk's decode and the next batch's sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import samplers
from flowgrpo.conditions import images_of
from flowgrpo.data import draw_batch_prompts, draw_prompt


@dataclass
class Batch:
    """One rollout batch of this process: its record, conditioning and prompts."""

    record: samplers.Trajectory
    cond: object  # Conditioning rows of this batch's prompts (record.cond_index points into it)
    slots: list[int]  # global prompt slot of each prompt row in the iteration
    keys: list[int]  # each prompt row's group key for the advantages (PromptDraws.group_keys)
    texts: list[str]
    metadata: list[dict]
    images: torch.Tensor  # [L, 3, H, W] leaves decoded, in [0, 1] ([L, F, 3, H, W] for video models)
    rewards: list = None  # Futures of RewardResult, one per decoded chunk of leaves, in leaf order


class PromptDraws:
    """Which prompts an iteration samples on this process (whole prompts per rank)."""

    def __init__(self, prompts: list[str], metadata: list[dict], strata: dict | None, train, batches: int,
                 rank: int, world: int):
        self.prompts, self.metadata = prompts, metadata
        self.groups = strata and list(strata.values())
        self.per_iteration, self.seed, self.batches = train.prompts_per_iteration, train.seed, batches
        self.rank, self.world = rank, world
        self.per_batch_draw = train.prompt_draw == "batch"
        self._batch_draws: dict = {}  # (iteration, batch) -> its prompt indices (prompt_draw=batch)

    def iteration_slots(self, iteration: int) -> list[list[int]]:
        """Global prompt slots of each rollout batch for this process."""
        per = self.per_iteration // self.batches
        return [list(range(b * per, (b + 1) * per))[self.rank :: self.world] for b in range(self.batches)]

    def dataset_index(self, iteration: int, slot: int) -> int:
        """Which prompt fills a slot (train.prompt_draw: data.draw_prompt's uniform passes, or balanced over
        train.balance_by; or each batch's own random choice, data.draw_batch_prompts)."""
        if not self.per_batch_draw:
            return draw_prompt(iteration * self.per_iteration + slot, len(self.prompts), self.seed, self.groups)
        batch, offset = divmod(slot, self.per_iteration // self.batches)
        if (iteration, batch) not in self._batch_draws:
            self._batch_draws = {key: v for key, v in self._batch_draws.items() if key[0] >= iteration}
            self._batch_draws[iteration, batch] = draw_batch_prompts(iteration, batch, self.per_iteration // self.batches,
                                                                     len(self.prompts), self.seed)
        return self._batch_draws[iteration, batch][offset]

    def group_keys(self, slots: list[int], indices: list[int]) -> list[int]:
        """What makes a group for the advantages, per slot (``indices``: the prompts ``dataset_index`` put in them): the
        slot itself (each slot its own group), or with train.prompt_draw=batch the prompt drawn into it, so a prompt
        drawn into two batches of an iteration is one group (the official stat trackers key their groups by prompt)."""
        return list(indices) if self.per_batch_draw else list(slots)


@torch.no_grad()
def sample(iteration: int, plan, draws: PromptDraws, policy, learner, scoring, cfg, modality: str) -> list[Batch]:
    """Roll out, decode and submit for scoring every batch of ``iteration`` on this process.

    ``learner`` says which weights sample (``sampling_copy``) and what the record keeps
    (``needs_transitions``, ``store_mean``); ``cfg`` is the run's config (its sampling.chunk resolved by the trainer:
    ``chunk_of``; 0 here is the whole level in one call)."""
    model, sampling = policy.model, cfg.sampling
    batches = []
    for slots in draws.iteration_slots(iteration):
        idx = [draws.dataset_index(iteration, s) for s in slots]
        keys = draws.group_keys(slots, idx)
        texts, metadata = [draws.prompts[i] for i in idx], [draws.metadata[i] for i in idx]
        cond = model.encode_prompts(texts, images=images_of(metadata))  # with an edit's source, where rows carry one
        with policy.sampling_with(learner.sampling_copy), model.integer_timesteps(sampling.integer_timesteps):
            record = samplers.rollout(
                policy.velocity_fn(cond, sampling.guidance_scale), plan, prompt_ids=slots,
                latent_shape=model.latent_shape(), seed=cfg.train.seed, iteration=iteration, dtype=model.dtype,
                device=model.device, max_batch=sampling.chunk or None,
                store_mean=learner.store_mean, reduce=sampling.reduce, log_prob_form=sampling.log_prob, nfe=policy.nfe,
                transitions=learner.needs_transitions, latent_storage=sampling.latent_storage,
            )
        if not bool(torch.isfinite(record.leaf_state).all()):
            with policy.sampling_with(learner.sampling_copy), model.integer_timesteps(sampling.integer_timesteps):
                cause = nonfinite_cause(record, plan, policy.velocity_fn(cond, sampling.guidance_scale), model)
            raise RuntimeError(f"the policy's samples are NaN or inf at iteration {iteration}: {cause}")
        chunk = 64 if modality == "image" else 8  # a decoded video weighs F images
        leaf_texts = [texts[p] for p in record.leaf_prompt.tolist()]
        leaf_meta = [metadata[p] for p in record.leaf_prompt.tolist()]
        # each decoded chunk goes to the rewards (a worker thread) at once, so scoring overlaps the next
        # chunk's decode (measured on 2 cores: the reward wait of TempFlow's 400-odd leaves and of the video
        # default's 64 clips falls from 0.2-0.3 s to one chunk's scoring, benchmarks/bench_overhead.py)
        media, scores = [], []
        if not policy.layout.leader:  # context parallelism: the group's first process decodes and scores
            batches.append(Batch(record, cond, slots, keys, texts, metadata, torch.empty(0), []))
            continue
        for i in range(0, record.num_leaves, chunk):
            media.append(model.decode(record.latents("leaf_state", slice(i, i + chunk))).cpu())
            scores.append(scoring.submit(media[-1], leaf_texts[i : i + chunk], leaf_meta[i : i + chunk]))
        batches.append(Batch(record, cond, slots, keys, texts, metadata, torch.cat(media), scores))
    return batches


def chunk_of(cfg, model, processes: int, sharded: bool) -> int:
    """Samples per rollout network call, resolved once at start-up (the trainer writes it into the run's config, as
    it does model.device=auto): sampling.chunk, or where it is 0 the memory plan's choice for this model, device and
    layout (flowgrpo.memory.rollout_chunk)."""
    if cfg.sampling.chunk:
        return cfg.sampling.chunk
    from flowgrpo.memory import rollout_chunk  # on use: only a run that leaves the chunk to the plan asks it

    return rollout_chunk(cfg, model, processes, sharded)


def nonfinite_cause(record, plan, velocity, model) -> str:
    """What became NaN or inf first in a rollout whose samples are not finite, and the advice that fits it: the
    initial noise, the network's velocity at the first step (its weights, or its arithmetic on finite inputs and
    weights), or the states of a later step (the first such step named, with its kernel and η)."""
    lr = "lower train.learning_rate or keep train.grad_clip on, and restart from a checkpoint (or with resume=false)"
    x = record.latents("root_state", slice(0, 8))
    if not bool(torch.isfinite(x).all()):
        return "the initial noise x_T is not finite (the sampler's draws; report this as a bug)"
    sigma = torch.full((x.shape[0],), float(plan.sigmas[0]), dtype=torch.float32, device=x.device)
    rows = torch.div(torch.arange(x.shape[0], device=x.device), plan.roots_per_prompt, rounding_mode="floor")
    with torch.no_grad():
        v = velocity(x, sigma, rows)
    if not bool(torch.isfinite(v).all()):
        bad = [n for n, p in model.transformer.named_parameters() if not bool(torch.isfinite(p).all())] \
            if hasattr(model, "transformer") else []
        if bad:
            return f"the network's weights hold NaN or inf ({len(bad)} tensors, e.g. {bad[0]}): training diverged; {lr}"
        return (f"the network's velocity at the first step (σ {float(plan.sigmas[0]):.4g}) is NaN or inf on finite "
                f"inputs and weights: its arithmetic overflows in {model.dtype} (try model.dtype=bfloat16 or float32, or "
                f"a smaller sampling.guidance_scale); if it began after some iterations: {lr}")
    stored = set(record.step.unique().tolist()) if record.step.numel() else set()
    if stored:
        finite = torch.isfinite(record.next_state.flatten(1)).all(1).to(record.step.device)  # (host storage)
        if not bool(finite.all()):
            return _after_steps([int(record.step[~finite].min())], plan, lr)
    # the stored states are finite: the first non-finite one is after the last of them, in a step the record drops
    return _after_steps([i for i in range(plan.num_steps) if i not in stored and i > max(stored, default=-1)], plan, lr)


def _after_steps(steps: list[int], plan, lr: str) -> str:
    """The cause of NaN states that first appear after one of ``steps`` (one: named with its σ, kernel and η)."""
    def named(i):
        step = plan.steps[i]
        return (f"step {i} (σ {float(plan.sigmas[i]):.4g} → {float(plan.sigmas[i + 1]):.4g}, {step.kernel}"
                + (f", η={step.eta:g})" if step.stochastic else f", {step.solver})"))

    where = named(steps[0]) if len(steps) == 1 else f"one of steps {steps[0]}–{steps[-1]} (whose states the record does not keep)"
    advice = "lower sampling.plan.eta, or " if any(plan.steps[i].stochastic for i in steps) else ""
    return (f"the velocity at the first step is finite, and the states first became NaN or inf after {where}: "
            f"{advice}if it began after some iterations, {lr}")


def plan_schedule(cfg, model):
    """The run's plan schedule (samplers.build_schedule): the plan of every iteration, built with the time shift
    of sampling.plan.shift, else sampling.shift, else the model's for the plan's number of steps
    (``model.shift_for``), and the model scheduler's terminal stretch (``model.shift_terminal``; Qwen-Image)."""
    arguments = dict(cfg.sampling.plan)
    shift = arguments.get("shift", cfg.sampling.shift or model.shift_for(int(arguments["num_steps"])))
    plan = {**cfg.sampling.plan, "shift": shift, "shift_terminal": getattr(model, "shift_terminal", None)}
    return samplers.build_schedule(plan, dict(cfg.sampling.window) or None, seed=cfg.train.seed)


def describe_batches(cfg, world_size: int, leaves_per_prompt: int, learner_lines: str) -> str:
    """The derived batch arithmetic, printed at start-up; ``learner_lines``: what the learner trains per
    iteration and in how many steps (the learner's ``describe``)."""
    t = cfg.train
    context = t.context_parallel
    ranks = world_size // context
    per_rank = t.prompts_per_iteration // ranks
    where = ("per process" if context == 1 else
             f"per data-parallel rank: {ranks} ranks x context groups of {context} processes, each sample's tokens "
             f"split over its group")
    lines = [
        f"processes: {world_size}; prompts per iteration: {t.prompts_per_iteration} ({per_rank} {where}, "
        f"{cfg.sampling.batches_per_iteration} rollout batches)",
        f"samples (leaves) per prompt: {leaves_per_prompt}; per iteration: {t.prompts_per_iteration * leaves_per_prompt}",
        learner_lines,
    ]
    return "\n".join(lines)

__all__ = ["Batch", "PromptDraws", "chunk_of", "describe_batches", "nonfinite_cause", "plan_schedule", "sample"]
