"""The memory planner: how much GPU memory one training process needs, the arithmetic behind ``flowgrpo plan``.

It reads a model's architecture from its component configurations alone (no weights, no GPU), counts its LoRA,
inventories the activations each transformer block keeps for the backward, and adds it all up per process:

  architecture.py  the architecture as numbers: components, Linears, blocks and geometry, built on the meta
                   device from the configurations; LoRA parameter counts; tokens and latents of a sample
  inventory.py     the activation inventory: the tensors autograd saves, block by block, with and without
                   gradient checkpointing, and the rollout's no-grad working memory
  plan.py          the plan (:class:`MemoryPlan`, :func:`plan`) and its table (:func:`format_plan`)
  check.py         the trainer's check before the first rollout (:func:`check_before_rollout`)

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
    is_target,
    latent_numel,
    lora_parameters,
    lora_targets,
    read_architecture,
    token_counts,
)
from flowgrpo.memory.check import (
    PLAN_OVER_MEASURED,
    check_before_rollout,
    host_memory,
    memory_verdict,
    pipeline_configs,
)
from flowgrpo.memory.inventory import (
    DTYPE_BYTES,
    Saved,
    activation_bytes,
    activation_inventory,
    backward_transient_bytes,
    rollout_forward_bytes,
    training_activation_bytes,
)
from flowgrpo.memory.plan import (
    AUTOCAST_NOTE,
    DEFAULT_COPIES,
    GIB,
    SAFETY_MARGIN,
    MemoryPlan,
    format_plan,
    gib,
    plan,
    planned_families,
    trainable_dtype,
)

__all__ = [
    "AUTOCAST_NOTE",
    "Architecture",
    "Block",
    "Component",
    "DEFAULT_COPIES",
    "DTYPE_BYTES",
    "GIB",
    "Geometry",
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
    "check_before_rollout",
    "format_plan",
    "gib",
    "host_memory",
    "is_target",
    "latent_numel",
    "lora_parameters",
    "lora_targets",
    "memory_verdict",
    "pipeline_configs",
    "plan",
    "planned_families",
    "read_architecture",
    "rollout_forward_bytes",
    "token_counts",
    "trainable_dtype",
    "training_activation_bytes",
]
