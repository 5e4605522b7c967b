"""The plan: how much GPU memory one training process needs, line by line, and its table (``flowgrpo plan``).

Counts, per process (GPU), with P the transformer's parameters, T the trainable ones, N the processes
and s = N under FSDP (``--fsdp``: FSDP2 shards every parameter of the transformer, its gradient, its
optimizer state and every copy cloned from it evenly over the processes), s = 1 otherwise:

  transformer weights   (P·b + T_lora·4) / s + buffers·b    b = bytes of the model dtype; LoRA adds T_lora
                                                            float32 weights; buffers are never sharded
  gradients             T·g / s                             g = bytes of a trainable weight: 4 for LoRA,
                                                            b for full fine-tuning (4 with float32 master weights)
  AdamW state           2·T·g / s                           two moments, each shaped and typed like its weight
  each weight copy      T·g / s                             the evaluation EMA, DiffusionNFT's θ_old, ... (named)
  reference policy      0 for LoRA (the adapter is disabled), P·b / s for full fine-tuning's frozen copy
  text encoders, VAE    params·b (text encoders), params·4 (VAE): frozen, whole on every process
  FSDP buffers          2·(B + B_lora)·b + B_T·4 (--fsdp): the largest block all-gathered whole twice (the next
                        one is prefetched) and its trainable part's float32 gradient before the reduce-scatter
  rollout latents       G·(2S + 2)·L·l    one group of G samples keeps latents of L elements: the state before and
                        after each of its S steps (the transitions a learner trains on), x_T and x_0; l = 4 (float32),
                        2 (``latents="bfloat16"``), 0 on the GPU with ``latents="host"`` (then host memory)
  rollout forward       R·c·t·(3D + 2M)·b    the no-grad rollout call: R samples a call (``chunk``; default the
                        whole group G), c = 2 passes with CFG, t tokens, the residual stream, a normalised copy and
                        the MLP hidden twice (an estimate)
  training activations  m·A per micro-batch of m samples, A one sample's activations: the tensors autograd saves,
                        counted by autograd itself on the meta device (saved.py) or by the hand inventory
                        (inventory.py), and the backward's transient gradients

  total = fixed (every line above the rollout) + rollout latents + max(rollout forward, training activations)
          (and at least fixed + the text encoders while they encode, when they are offloaded after)

Context parallelism over C ranks (``context_parallel``): each rank holds 1/C of a sample's tokens (Wan: of its video
tokens; its text is whole on every rank), so t, A and the rollout forward are a rank's share; Ulysses' all-to-alls
add one block's q/k/v/output in flight. The latents, weights and frozen models are as without it (every rank of a
context group holds the same samples; FSDP shards over all N processes).

Assumptions (docs/memory.md): the transformer runs in the model dtype without autocast; full fine-tuning trains
the weights in that dtype, as flowgrpo loads them (``master_dtype="float32"``: float32 master weights), and
``torch.optim.AdamW`` keeps its moments in each weight's dtype; LoRA weights, gradients and moments are float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Optional

from flowgrpo.memory.architecture import (Architecture, call_grid, context_parallel_families,
                                          has_cp_plan, latent_numel, lora_parameters, lora_targets, rank_tokens,
                                          token_counts, transformer_classes)
from flowgrpo.memory.inventory import (DTYPE_BYTES, ActivationCount, attention_bytes, backward_transient_bytes,
                                       has_inventory, inventory_count, rollout_forward_bytes)
from flowgrpo.models.families import FAMILIES

LATENT_BYTES = {"float32": 4, "bfloat16": 2, "host": 0}  # a stored rollout latent's bytes on the GPU

GIB = 1024**3
DEFAULT_COPIES = ("ema", "old_policy")  # the evaluation EMA and DiffusionNFT's sampling policy θ_old
SAFETY_MARGIN = 0.10  # of --gpu-memory, kept free: CUDA context, allocator fragmentation, NCCL, temporaries


# ----------------------------------------------------------------------------- the plan


@dataclass
class MemoryPlan:
    """Every line of ``flowgrpo plan``: bytes per process (GPU) unless named otherwise."""

    model: str
    processes: int
    fsdp: bool
    finetune: str
    dtype: str
    trainable_dtype: str  # of the trainable weights, their gradients, moments and copies
    gpu_memory_gib: float
    margin: float
    params: dict[str, int]  # component -> parameters
    trainable_params: int
    experts: int  # denoising networks of the transformer's shape (Wan2.2 A14B: 2), each one call's network
    trained_experts: int  # how many of them train
    weights: int  # the transformer (and LoRA) weights held by this process, every expert
    buffers: int  # the transformer's floating-point buffers (never sharded)
    buffer_elements: int
    gradients: int
    optimizer: int
    copies: dict[str, int]  # name -> bytes
    reference: int
    reference_mode: str  # frozen_copy | adapter_disabled | none
    frozen: dict[str, int]  # text encoders and VAE -> bytes
    fsdp_buffers: int
    tokens: tuple[int, int]  # image/video tokens, text tokens of a sample
    latent_numel: int
    steps: int
    group: int
    micro_batch: int
    cfg: int  # rollout passes per sample (2 with classifier-free guidance)
    checkpointing: bool
    activations_per_sample: dict[str, int]  # "checkpointing" / "no checkpointing" -> bytes
    rollout_record: int  # latents of one group
    rollout_forward: int  # the rollout call of one group
    training_activations: int  # one micro-batch's
    max_group: Optional[int]  # None: the group does not bound the GPU memory (latents on the host, chunked rollout)
    max_micro_batch: int
    optimizer_kind: str = "adamw"  # train.optimizer: adamw (2 moments a weight) | muon (1 float32 momentum)
    activation_source: str = "inventory"  # "autograd" (saved_tensors_hooks on meta, saved.py) | "inventory"
    activation_note: str = ""  # why autograd's count did not run, where the hand inventory stood in
    context_parallel: int = 1  # ranks a sample's tokens are split over
    rank_tokens: tuple[int, int] = (0, 0)  # a rank's tokens of a sample (= tokens without context parallelism)
    context_buffers: int = 0  # Ulysses' all-to-all buffers: one block's q/k/v/output in flight
    chunk: Optional[int] = None  # samples per rollout call (None: the whole group in one call)
    rollout_forward_sample: int = 0  # one sample's rollout call (its CFG passes)
    latent_storage: str = "float32"  # float32 | bfloat16 | host
    offloaded: dict[str, int] = field(default_factory=dict)  # text encoders moved off the GPU after encoding -> bytes
    activation_offload: bool = False  # the training forward's saved tensors in host memory (save_on_cpu)
    host: dict[str, int] = field(default_factory=dict)  # what the options put in host memory -> bytes

    @property
    def fixed(self) -> int:
        """What stays allocated through the iteration: weights, gradients, optimizer, copies, frozen models."""
        return (self.weights + self.buffers + self.gradients + self.optimizer + sum(self.copies.values())
                + self.reference + sum(self.frozen.values()) + self.fsdp_buffers)

    @property
    def encoding(self) -> int:
        """While the prompts are encoded: the fixed memory and the offloaded text encoders back on the GPU (0 when
        none is offloaded)."""
        return self.fixed + sum(self.offloaded.values()) if self.offloaded else 0

    @property
    def total(self) -> int:
        """The peak: fixed + the group's record + the context-parallel buffers + the larger of the rollout call and
        the training micro-batch (or the encoding, if the offloaded text encoders need more)."""
        return max(self.fixed + self.rollout_record + self.context_buffers
                   + max(self.rollout_forward, self.training_activations), self.encoding)

    @property
    def usable(self) -> int:
        return int(self.gpu_memory_gib * GIB * (1 - self.margin))


def trainable_dtype(finetune: str, dtype: str, master_dtype: Optional[str]) -> str:
    """The dtype of the trainable weights (and of their gradients, AdamW moments and copies)."""
    return "float32" if finetune == "lora" else master_dtype or dtype


def planned_families() -> list[str]:
    """The families the plan covers: every family with a pipeline of components (its architecture numbers). Their
    activations are counted by autograd on the meta device (saved.py); SD3's, FLUX.1's and Wan's also have the hand
    inventory (inventory.py), which agrees (docs/memory.md). The analytic world has no architecture."""
    return sorted(name for name, family in FAMILIES.items() if family.components)


def sample_activations(arch: Architecture, model_config, full: bool, targets: Sequence[str], context_parallel: int = 1,
                       source: str = "auto") -> ActivationCount:
    """One sample's saved tensors (a context-parallel rank's share of them): counted by autograd on the meta device
    where the architecture carries its transformer's configuration and ``source`` is "auto" or "autograd", else by the
    hand inventory (SD3, FLUX.1, Wan). The count is at the rank's tokens (:func:`rank_tokens`)."""
    from flowgrpo.memory.saved import COUNTED_CLASSES, CountError, count_saved
    from flowgrpo.run.errors import UserError

    tokens = rank_tokens(arch.geometry, model_config, context_parallel)
    counted = bool(arch.transformer_config) and arch.transformer.class_name in COUNTED_CLASSES
    refused = ""
    if source == "autograd" or (source == "auto" and counted):
        if not arch.transformer_config:
            raise ValueError(f"{arch.source or 'this architecture'} carries no transformer configuration to count")
        try:
            count = count_saved(arch.transformer_config, call_grid(arch.geometry, model_config, context_parallel),
                                tokens[1], model_config.dtype, full, tuple(targets), model_config.lora_rank,
                                model_config.lora_alpha)
            return replace(count, tokens=tokens)
        except CountError as exc:  # a size the transformer cannot take: the hand inventory counts it still, if any
            if source == "autograd" or not has_inventory(arch):
                raise UserError(str(exc)) from None
            refused = str(exc)
    if not has_inventory(arch):
        raise UserError(f"{arch.transformer.class_name}: neither autograd's count (its configuration) nor the hand "
                        f"inventory (SD3, FLUX.1, Wan blocks) can count its activations; measure it on a GPU "
                        f"(benchmarks/bench_memory.py)")
    return replace(inventory_count(arch, model_config, full, targets, tokens=tokens), note=refused)


def context_parallel_refusal(arch: Architecture, context_parallel: int) -> Optional[str]:
    """The one-line reason a context-parallel plan is refused (its transformer class has no ``_cp_plan``), or None."""
    if context_parallel <= 1 or has_cp_plan(arch.transformer.class_name):
        return None
    families = [f for f, name in transformer_classes().items() if name == arch.transformer.class_name]
    which = f" (the {', '.join(families)} family)" if families else ""
    return (f"context parallelism {context_parallel}: {arch.transformer.class_name}{which} has no _cp_plan, so "
            f"diffusers cannot split its sequence; the families that have one: {', '.join(context_parallel_families())}")


def plan(arch: Architecture, model_config, processes: int = 1, fsdp: bool = False, finetune: Optional[str] = None,
         gpu_memory: float = 80.0, *, group: int = 8, micro_batch: int = 1, steps: Optional[int] = None,
         checkpointing: Optional[bool] = None, copies: Sequence[str] = DEFAULT_COPIES,
         master_dtype: Optional[str] = None, train_cfg: bool = False, margin: float = SAFETY_MARGIN,
         targets: Optional[Sequence[str]] = None, name: str = "", optimizer: str = "adamw",
         context_parallel: int = 1, chunk: Optional[int] = None, latents: str = "float32",
         offload_text_encoders: bool = False, activation_offload: bool = False,
         activations: str = "auto", references: Optional[int] = None) -> MemoryPlan:
    """The memory plan of training ``model_config`` (a ModelConfig or dict) with ``arch`` on ``processes`` GPUs.

    ``finetune``/``checkpointing``/``steps`` default to the model config's; ``copies`` names the extra copies
    of the trainable weights (each T·g bytes); ``targets`` overrides the LoRA targets (default: as the model
    resolves them); ``train_cfg``: the training forward is the CFG pair (two passes a sample); ``optimizer``:
    train.optimizer (Muon keeps one float32 momentum per weight of 2+ dimensions, nearly all of them, where AdamW
    keeps two moments in the weight's dtype).

    What makes a video fit: ``context_parallel`` C (a sample's tokens split over C ranks: the activations and the
    rollout call are a rank's share; refused for a transformer class without a ``_cp_plan``); ``chunk`` R (the
    rollout's no-grad call R samples at a time; None: the whole group); ``latents`` float32 | bfloat16 | host (the
    stored rollout latents; host: none on the GPU); ``offload_text_encoders`` (off the GPU once the prompts are
    encoded); ``activation_offload`` (the training forward's saved tensors in host memory: the GPU keeps one block's).
    ``activations``: "auto" (autograd's count where it can run, else the hand inventory), "autograd" or
    "inventory". ``references``: the condition images each prompt carries (an edit's source), whose tokens every call
    appends to the latent's (None: the family's ``plan_references``, 1 for an editing family)."""
    from flowgrpo.models.config import validate_model_config
    from flowgrpo.models.families import FAMILIES

    cfg = validate_model_config(model_config)
    if references is None:
        references = FAMILIES[cfg.family].plan_references if cfg.family in FAMILIES else 0
    arch = replace(arch, geometry=replace(arch.geometry, references=int(references)))
    if finetune is not None:
        cfg = replace(cfg, finetune=finetune)
    if processes < 1 or group < 1 or micro_batch < 1 or context_parallel < 1 or (chunk is not None and chunk < 1):
        raise ValueError("processes, group, micro_batch, context_parallel and chunk must be >= 1")
    if latents not in LATENT_BYTES:
        raise ValueError(f"latents must be one of {', '.join(LATENT_BYTES)}, got {latents!r}")
    refusal = context_parallel_refusal(arch, context_parallel)
    if refusal:
        from flowgrpo.run.errors import UserError

        raise UserError(refusal)
    if processes % context_parallel:
        raise ValueError(f"context parallelism {context_parallel} needs a multiple of it in processes, got {processes}")
    full = cfg.finetune == "full"
    b = DTYPE_BYTES[cfg.dtype]
    targets = list(targets) if targets is not None else ([] if full else lora_targets(cfg, arch))
    shard = processes if fsdp else 1
    base = arch.transformer.params
    lora = 0 if full else lora_parameters(arch.linears, targets, cfg.lora_rank)
    if not full and lora == 0:
        raise ValueError(f"no nn.Linear of {arch.transformer.class_name} matches the LoRA targets {targets}")
    # a second expert (Wan2.2 A14B's transformer_2) has the transformer's shape: held, sharded and trained like it
    experts = 1 + sum(c.name == "transformer_2" for c in arch.frozen())
    trained_n = len(cfg.trained_experts) if cfg.trained_experts else experts
    trainable = trained_n * (base if full else lora)
    trained = trainable_dtype(cfg.finetune, cfg.dtype, master_dtype)
    g = DTYPE_BYTES[trained]
    weights = (trained_n * (base * g if full else base * b + lora * 4) + (experts - trained_n) * base * b) / shard
    reference_mode = cfg.reference if cfg.reference != "auto" else ("frozen_copy" if full else "adapter_disabled")
    frozen = {c.name: c.params * (4 if c.name == "vae" else b) + c.buffers * (4 if c.name == "vae" else b)
              for c in arch.frozen() if c.name != "transformer_2"}
    offloaded = {k: v for k, v in frozen.items() if k.startswith("text_encoder")} if offload_text_encoders else {}
    frozen = {k: (0 if k in offloaded else v) for k, v in frozen.items()}
    fsdp_buffers = 0
    if fsdp and arch.blocks:
        largest = max(arch.blocks, key=lambda blk: blk.params)
        block_trainable = largest.params if full else lora_parameters(
            [m for m in arch.linears if m.name.startswith(largest.name + ".")], targets, cfg.lora_rank)
        fsdp_buffers = 2 * (largest.params + (0 if full else block_trainable)) * b + block_trainable * 4
    steps = steps or cfg.sample_steps
    checkpointing = cfg.gradient_checkpointing if checkpointing is None else checkpointing
    passes = 2 if train_cfg else 1
    count = sample_activations(arch, cfg, full, targets, context_parallel, activations)
    tokens = count.tokens
    transient = backward_transient_bytes(arch, cfg, tokens)
    per_sample = {label: passes * (count.total(ckpt) + transient)
                  for label, ckpt in (("checkpointing", True), ("no checkpointing", False))}
    act = per_sample["checkpointing" if checkpointing else "no checkpointing"]
    host: dict[str, int] = {}
    if activation_offload:  # saved tensors to the host as the forward saves them; back block by block in the backward
        host["training activations (saved tensors)"] = micro_batch * passes * count.total(checkpointing)
        act = passes * (count.largest_block() + transient)
    latent = latent_numel(arch.geometry, cfg)
    uses_cfg = _family_uses_cfg(cfg, arch)
    record_per_sample = (2 * steps + 2) * latent * LATENT_BYTES[latents]
    if latents == "host":
        host["rollout latents"] = group * (2 * steps + 2) * latent * 4
    if offloaded:
        host.update({f"{k} (offloaded)": v for k, v in offloaded.items()})
    forward_per_sample = (2 if uses_cfg else 1) * rollout_forward_bytes(arch, cfg, tokens)
    rows = group if chunk is None else min(chunk, group)
    context_buffers = attention_bytes(arch, cfg, tokens) if context_parallel > 1 else 0
    result = MemoryPlan(
        model=name or cfg.pretrained, processes=processes, fsdp=fsdp, finetune=cfg.finetune, dtype=cfg.dtype,
        trainable_dtype=trained, gpu_memory_gib=gpu_memory, margin=margin,
        params={c.name: c.params for c in arch.components}, trainable_params=trainable, experts=experts,
        trained_experts=trained_n,
        weights=math.ceil(weights), buffers=experts * arch.transformer.buffers * b,
        buffer_elements=experts * arch.transformer.buffers,
        gradients=math.ceil(trainable * g / shard), optimizer=math.ceil((4 if optimizer == "muon" else 2 * g) * trainable / shard),
        copies={c: math.ceil(trainable * g / shard) for c in copies},
        reference=math.ceil(trained_n * base * b / shard) if reference_mode == "frozen_copy" else 0,
        reference_mode=reference_mode,
        frozen=frozen, fsdp_buffers=fsdp_buffers,
        tokens=token_counts(arch.geometry, cfg), latent_numel=latent, steps=steps, group=group,
        micro_batch=micro_batch, cfg=2 if uses_cfg else 1, checkpointing=checkpointing,
        activations_per_sample=per_sample, rollout_record=group * record_per_sample,
        rollout_forward=rows * forward_per_sample, training_activations=micro_batch * act,
        max_group=0, max_micro_batch=0, optimizer_kind=optimizer, activation_source=count.source,
        activation_note=count.note,
        context_parallel=context_parallel, rank_tokens=tokens, context_buffers=context_buffers, chunk=chunk,
        rollout_forward_sample=forward_per_sample, latent_storage=latents, offloaded=offloaded,
        activation_offload=activation_offload, host=host,
    )
    room = result.usable - result.fixed - context_buffers
    result.max_micro_batch = max(0, (room - result.rollout_record) // act) if act else 0
    if chunk is None:  # the whole group in one call: the call grows with the group
        bounds = [room // (record_per_sample + forward_per_sample)] if record_per_sample + forward_per_sample else []
        bounds += [(room - micro_batch * act) // record_per_sample] if record_per_sample else []
    else:
        beside = room - max(min(chunk, group) * forward_per_sample, micro_batch * act)
        bounds = [beside // record_per_sample] if record_per_sample else ([] if beside >= 0 else [0])
    result.max_group = max(0, min(bounds)) if bounds else None
    return result


def chunk_that_fits(p: MemoryPlan, available: float) -> int:
    """The largest number of samples R <= the plan's group whose rollout call fits in ``available`` bytes beside the
    rest of the rollout (the fixed memory, the group's latents, the context-parallel buffers); at least 1."""
    room = available - p.fixed - p.rollout_record - p.context_buffers
    if p.rollout_forward_sample <= 0:
        return p.group
    return int(max(1, min(p.group, room // p.rollout_forward_sample)))


def _family_uses_cfg(cfg, arch: Architecture) -> bool:
    """Whether the rollout runs the two CFG passes (the adapters' ``_uses_cfg``): guidance > 1, except for FLUX
    models that embed the guidance value (FLUX.1-dev: one pass), FLUX.2 [dev] (guidance-distilled: never) and Z-Image
    (its pipeline's convention: CFG whenever guidance > 0)."""
    if cfg.family == "flux2":
        return False
    if cfg.family == "z_image":
        return cfg.guidance_scale > 0
    embedded = any(m.name.startswith("time_text_embed.guidance_embedder") for m in arch.linears)
    return cfg.guidance_scale > 1 and not (arch.geometry.family == "flux" and embedded)


# ----------------------------------------------------------------------------- the table


def gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def format_plan(p: MemoryPlan) -> str:
    """The plan as a table of GiB per process."""
    shard = f", FSDP over {p.processes}" if p.fsdp else (f", {p.processes} processes, unsharded" if p.processes > 1 else "")
    kind = f" + {p.trainable_params / 1e6:.1f} M LoRA float32" if p.finetune == "lora" else ""
    dtype = p.dtype if p.finetune == "lora" or p.trainable_dtype == p.dtype else f"{p.trainable_dtype} master weights"
    name = "transformer weights" if p.experts == 1 else f"{p.experts} experts' weights ({p.trained_experts} trained)"
    each = "" if p.experts == 1 else " each"
    rows = [(f"{name} ({p.params['transformer'] / 1e9:.3f} B params{each}, {dtype}{kind})", p.weights)]
    if p.buffers:
        rows.append((f"transformer buffers ({p.buffer_elements / 1e6:.1f} M elements, not sharded)", p.buffers))
    what = "LoRA float32" if p.finetune == "lora" else f"full, {p.trainable_dtype}"
    moments = ("Muon momentum (1 float32 per trainable weight)" if p.optimizer_kind == "muon"
               else "AdamW moments (2 per trainable weight)")
    rows += [(f"gradients ({what})", p.gradients), (moments, p.optimizer)]
    rows += [(f"copy: {name}", size) for name, size in p.copies.items()]
    reference = {"frozen_copy": "frozen copy", "adapter_disabled": "adapter disabled: none", "none": "none"}
    rows.append((f"reference policy ({reference[p.reference_mode]})", p.reference))
    if p.fsdp:
        rows.append(("FSDP all-gather / reduce buffers (largest block)", p.fsdp_buffers))
    rows += [(f"{name} ({p.params[name] / 1e9:.3f} B params, frozen, "
              f"{'off the GPU after encoding' if name in p.offloaded else 'not sharded'})", size)
             for name, size in p.frozen.items()]
    rows.append(("= fixed (weights, optimizer, copies, frozen models)", p.fixed))
    if p.offloaded:
        rows.append((f"text encoders while encoding ({', '.join(p.offloaded)}: back on the GPU, then off)", p.encoding))
    stored = {"float32": "float32", "bfloat16": "bfloat16", "host": "on the host: 0 on the GPU"}[p.latent_storage]
    rows.append((f"rollout latents: group {p.group} x ({p.steps} steps x 2 + 2) x {p.latent_numel:,} {stored}",
                 p.rollout_record))
    samples = f"{p.group}" if p.chunk is None else f"chunks of {min(p.chunk, p.group)} of {p.group}"
    rows.append((f"rollout forward (no grad, {samples} samples x {p.cfg} passes, estimate)", p.rollout_forward))
    if p.context_parallel > 1:
        rows.append(("context parallel: all-to-all buffers (one block's q/k/v/out)", p.context_buffers))
    for label, value in p.activations_per_sample.items():
        rows.append((f"activations per sample, {label}", value))
    offload = ", saved tensors on the host: one block's on the GPU" if p.activation_offload else ""
    rows.append((f"training activations: micro-batch {p.micro_batch}"
                 f" ({'checkpointing' if p.checkpointing else 'no checkpointing'}{offload})", p.training_activations))
    rows.append(("= total (fixed + latents + max(rollout forward, training)"
                 + (", or the encoding if larger)" if p.offloaded else ")"), p.total))
    rows += [(f"host memory: {what}", size) for what, size in p.host.items()]
    width = max(len(label) for label, _ in rows)
    split = (f"; context parallel over {p.context_parallel}: {p.rank_tokens[0]:,} + {p.rank_tokens[1]} tokens a rank"
             if p.context_parallel > 1 else "")
    head = (f"flowgrpo plan: {p.model}, {p.finetune}{shard}; {p.tokens[0]:,} image tokens + {p.tokens[1]} text tokens "
            f"a sample{split}; GiB per process")
    lines = [head, "-" * (width + 10)] + [f"{label:<{width}}  {gib(value):>8}" for label, value in rows]
    usable = p.usable / GIB
    fits = "fits" if p.total <= p.usable else "does NOT fit"
    largest = "not bounded by the GPU's memory" if p.max_group is None else str(p.max_group)
    lines += ["-" * (width + 10),
              f"{fits} in {p.gpu_memory_gib:g} GiB with a {p.margin:.0%} safety margin ({usable:.2f} GiB usable); "
              f"largest group {largest} (micro-batch {p.micro_batch}), largest micro-batch {p.max_micro_batch} "
              f"(group {p.group})"]
    source = {"autograd": "counted by autograd on the meta device at real width",
              "inventory": "the hand inventory"}[p.activation_source]
    source += f" ({p.activation_note})" if p.activation_note else ""
    return "\n".join(lines + [f"activations: {source}; " + AUTOCAST_NOTE.split("activations: ", 1)[1]])


AUTOCAST_NOTE = ("activations: the tensors autograd keeps without autocast, flash / memory-efficient attention; under "
                 "train.mixed_precision=bf16 an H100 kept up to 1.27x that for full fine-tuning (docs/memory.md)")
