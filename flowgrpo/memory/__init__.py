"""The memory planner: how much GPU memory one training process needs, the arithmetic behind ``flowgrpo plan``.

It reads a model's architecture from its component configurations alone (no weights, no GPU), counts its LoRA,
counts the activations each transformer block keeps for the backward, and adds it all up per process:

  architecture.py  the architecture as numbers: components, Linears, blocks and geometry, built on the meta
                   device from the configurations; LoRA parameter counts; tokens and latents of a sample (and a
                   context-parallel rank's share)
  saved.py         the tensors autograd saves, counted by autograd: one block of each kind of the real transformer
                   class run at real width on the meta device under saved_tensors_hooks (every family)
  inventory.py     the hand inventory of the same tensors for SD3's, FLUX.1's and Wan's blocks (it agrees with
                   saved.py within 0.6 %), gradient checkpointing's peak, and the rollout's no-grad working memory
  plan.py          the plan (:class:`MemoryPlan`, :func:`plan`) and its table (:func:`format_plan`)
  check.py         the trainer's check before the first rollout (:func:`check_before_rollout`) and its choice of
                   the rollout's chunk (:func:`rollout_chunk`)

What it counts, what it assumes and how it was checked against measured peaks: docs/memory.md.
"""

from flowgrpo.memory.architecture import (
    Architecture,
    Block,
    Component,
    Geometry,
    Linear,
    architecture_from_configs,
    build_on_meta,
    call_grid,
    context_parallel_families,
    has_cp_plan,
    is_target,
    latent_numel,
    lora_parameters,
    lora_targets,
    rank_tokens,
    read_architecture,
    token_counts,
)
from flowgrpo.memory.check import (
    PLAN_OVER_MEASURED,
    check_before_rollout,
    host_memory,
    memory_verdict,
    pipeline_configs,
    rollout_chunk,
    run_plan,
)
from flowgrpo.memory.inventory import (
    DTYPE_BYTES,
    ActivationCount,
    Saved,
    activation_bytes,
    activation_inventory,
    backward_transient_bytes,
    inventory_count,
    rollout_forward_bytes,
    training_activation_bytes,
)
from flowgrpo.memory.plan import (
    AUTOCAST_NOTE,
    DEFAULT_COPIES,
    GIB,
    LATENT_BYTES,
    SAFETY_MARGIN,
    MemoryPlan,
    chunk_that_fits,
    context_parallel_refusal,
    format_plan,
    gib,
    plan,
    planned_families,
    sample_activations,
    trainable_dtype,
)
from flowgrpo.memory.saved import count_saved, gpu_kernels

__all__ = [
    "AUTOCAST_NOTE",
    "ActivationCount",
    "Architecture",
    "Block",
    "Component",
    "DEFAULT_COPIES",
    "DTYPE_BYTES",
    "GIB",
    "Geometry",
    "LATENT_BYTES",
    "Linear",
    "MemoryPlan",
    "PLAN_OVER_MEASURED",
    "SAFETY_MARGIN",
    "Saved",
    "activation_bytes",
    "activation_inventory",
    "architecture_from_configs",
    "backward_transient_bytes",
    "build_on_meta",
    "call_grid",
    "check_before_rollout",
    "chunk_that_fits",
    "context_parallel_families",
    "context_parallel_refusal",
    "count_saved",
    "format_plan",
    "gib",
    "gpu_kernels",
    "has_cp_plan",
    "host_memory",
    "inventory_count",
    "is_target",
    "latent_numel",
    "lora_parameters",
    "lora_targets",
    "memory_verdict",
    "pipeline_configs",
    "plan",
    "planned_families",
    "rank_tokens",
    "read_architecture",
    "rollout_chunk",
    "rollout_forward_bytes",
    "run_plan",
    "sample_activations",
    "token_counts",
    "trainable_dtype",
    "training_activation_bytes",
]
