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
  rollout latents       G·(2S + 2)·L·4    one group of G samples keeps float32 latents of L elements: the state
                        before and after each of its S steps (the transitions a learner trains on), x_T and x_0
  rollout forward       G·c·t·(3D + 2M)·b    the no-grad rollout call of the group: c = 2 passes with CFG, t
                        tokens, the residual stream, a normalised copy and the MLP hidden twice (an estimate)
  training activations  m·A per micro-batch of m samples, A one sample's activations (inventory.py)

  total = fixed (every line above the rollout) + rollout latents + max(rollout forward, training activations)

Assumptions (docs/memory.md): the transformer runs in the model dtype without autocast; full fine-tuning trains
the weights in that dtype, as flowgrpo loads them (``master_dtype="float32"``: float32 master weights), and
``torch.optim.AdamW`` keeps its moments in each weight's dtype; LoRA weights, gradients and moments are float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Optional

from flowgrpo.memory.architecture import Architecture, latent_numel, lora_parameters, lora_targets, token_counts
from flowgrpo.memory.inventory import DTYPE_BYTES, rollout_forward_bytes, training_activation_bytes
from flowgrpo.models.families import FAMILIES

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
    max_group: int
    max_micro_batch: int
    optimizer_kind: str = "adamw"  # train.optimizer: adamw (2 moments a weight) | muon (1 float32 momentum)

    @property
    def fixed(self) -> int:
        """What stays allocated through the iteration: weights, gradients, optimizer, copies, frozen models."""
        return (self.weights + self.buffers + self.gradients + self.optimizer + sum(self.copies.values())
                + self.reference + sum(self.frozen.values()) + self.fsdp_buffers)

    @property
    def total(self) -> int:
        """The peak: fixed + the group's record + the larger of the rollout call and the training micro-batch."""
        return self.fixed + self.rollout_record + max(self.rollout_forward, self.training_activations)

    @property
    def usable(self) -> int:
        return int(self.gpu_memory_gib * GIB * (1 - self.margin))


def trainable_dtype(finetune: str, dtype: str, master_dtype: Optional[str]) -> str:
    """The dtype of the trainable weights (and of their gradients, AdamW moments and copies)."""
    return "float32" if finetune == "lora" else master_dtype or dtype


def planned_families() -> list[str]:
    """The families whose blocks have an activation inventory here (their record's memory_inventory: _joint_block,
    _single_block, _wan_block); the others (Qwen-Image, FLUX.2, Z-Image) are measured on a GPU with
    benchmarks/bench_memory.py."""
    return sorted(name for name, family in FAMILIES.items() if family.memory_inventory)


def plan(arch: Architecture, model_config, processes: int = 1, fsdp: bool = False, finetune: Optional[str] = None,
         gpu_memory: float = 80.0, *, group: int = 8, micro_batch: int = 1, steps: Optional[int] = None,
         checkpointing: Optional[bool] = None, copies: Sequence[str] = DEFAULT_COPIES,
         master_dtype: Optional[str] = None, train_cfg: bool = False, margin: float = SAFETY_MARGIN,
         targets: Optional[Sequence[str]] = None, name: str = "", optimizer: str = "adamw") -> MemoryPlan:
    """The memory plan of training ``model_config`` (a ModelConfig or dict) with ``arch`` on ``processes`` GPUs.

    ``finetune``/``checkpointing``/``steps`` default to the model config's; ``copies`` names the extra copies
    of the trainable weights (each T·g bytes); ``targets`` overrides the LoRA targets (default: as the model
    resolves them); ``train_cfg``: the training forward is the CFG pair (two passes a sample); ``optimizer``:
    train.optimizer (Muon keeps one float32 momentum per weight of 2+ dimensions, nearly all of them, where AdamW
    keeps two moments in the weight's dtype)."""
    from flowgrpo.models.config import validate_model_config

    cfg = validate_model_config(model_config)
    if finetune is not None:
        cfg = replace(cfg, finetune=finetune)
    if processes < 1 or group < 1 or micro_batch < 1:
        raise ValueError("processes, group and micro_batch must be >= 1")
    full = cfg.finetune == "full"
    b = DTYPE_BYTES[cfg.dtype]
    targets = list(targets) if targets is not None else ([] if full else lora_targets(cfg))
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
    fsdp_buffers = 0
    if fsdp and arch.blocks:
        largest = max(arch.blocks, key=lambda blk: blk.params)
        block_trainable = largest.params if full else lora_parameters(
            [m for m in arch.linears if m.name.startswith(largest.name + ".")], targets, cfg.lora_rank)
        fsdp_buffers = 2 * (largest.params + (0 if full else block_trainable)) * b + block_trainable * 4
    steps = steps or cfg.sample_steps
    checkpointing = cfg.gradient_checkpointing if checkpointing is None else checkpointing
    passes = 2 if train_cfg else 1
    per_sample = {label: passes * training_activation_bytes(arch, cfg, full, targets, ckpt)
                  for label, ckpt in (("checkpointing", True), ("no checkpointing", False))}
    act = per_sample["checkpointing" if checkpointing else "no checkpointing"]
    latent = latent_numel(arch.geometry, cfg)
    uses_cfg = _family_uses_cfg(cfg, arch)
    record_per_sample = (2 * steps + 2) * latent * 4
    forward_per_sample = (2 if uses_cfg else 1) * rollout_forward_bytes(arch, cfg)
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
        rollout_forward=group * forward_per_sample, training_activations=micro_batch * act,
        max_group=0, max_micro_batch=0, optimizer_kind=optimizer,
    )
    room = result.usable - result.fixed
    result.max_micro_batch = max(0, (room - result.rollout_record) // act) if act else 0
    result.max_group = max(0, min((room - micro_batch * act) // record_per_sample,
                                  room // (record_per_sample + forward_per_sample)))
    return result


def _family_uses_cfg(cfg, arch: Architecture) -> bool:
    """Whether the rollout runs the two CFG passes (the adapters' ``_uses_cfg``): guidance > 1, except for FLUX
    models that embed the guidance value (FLUX.1-dev: one pass)."""
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
    rows += [(f"{name} ({p.params[name] / 1e9:.3f} B params, frozen, not sharded)", size)
             for name, size in p.frozen.items()]
    rows.append(("= fixed (weights, optimizer, copies, frozen models)", p.fixed))
    rows.append((f"rollout latents: group {p.group} x ({p.steps} steps x 2 + 2) x {p.latent_numel:,} float32",
                 p.rollout_record))
    rows.append((f"rollout forward (no grad, {p.group} x {p.cfg} passes, estimate)", p.rollout_forward))
    for label, value in p.activations_per_sample.items():
        rows.append((f"activations per sample, {label}", value))
    rows.append((f"training activations: micro-batch {p.micro_batch}"
                 f" ({'checkpointing' if p.checkpointing else 'no checkpointing'})", p.training_activations))
    rows.append(("= total (fixed + latents + max(rollout forward, training))", p.total))
    width = max(len(label) for label, _ in rows)
    head = (f"flowgrpo plan: {p.model}, {p.finetune}{shard}; {p.tokens[0]:,} image tokens + {p.tokens[1]} text tokens "
            f"a sample; GiB per process")
    lines = [head, "-" * (width + 10)] + [f"{label:<{width}}  {gib(value):>8}" for label, value in rows]
    usable = p.usable / GIB
    fits = "fits" if p.total <= p.usable else "does NOT fit"
    lines += ["-" * (width + 10),
              f"{fits} in {p.gpu_memory_gib:g} GiB with a {p.margin:.0%} safety margin ({usable:.2f} GiB usable); "
              f"largest group {p.max_group} (micro-batch {p.micro_batch}), largest micro-batch {p.max_micro_batch} "
              f"(group {p.group})"]
    return "\n".join(lines + [AUTOCAST_NOTE])


AUTOCAST_NOTE = ("activations: the tensors autograd keeps without autocast, flash / memory-efficient attention; under "
                 "train.mixed_precision=bf16 an H100 kept up to 1.27x that for full fine-tuning (docs/memory.md)")
