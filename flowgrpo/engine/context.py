"""Context (sequence) parallelism: one sample's tokens split over a group of processes (``train.context_parallel``).

FSDP2 (flowgrpo/engine/sharding.py) shards the weights; a video sample's activations are its sequence's, and only a
split sequence shrinks them. diffusers has this built in: ``ContextParallelConfig`` and ``enable_parallelism`` split
the hidden states where the transformer class's ``_cp_plan`` says (Wan, FLUX.1, FLUX.2, Qwen-Image), run attention
as Ulysses all-to-alls over the heads (or ring attention, with a backend that returns its log-sum-exp: flash or cuDNN
on GPUs) and gather the output, with backward passes for all of it. flowgrpo uses that engine; what it adds is the
layout around it.

The launch's N processes form a 2-D mesh: ``N / C`` data-parallel ranks × ``C`` context ranks (C =
``train.context_parallel``; of it ``train.context_parallel_ring`` ranks form rings, the rest Ulysses: C = ring ×
ulysses). Process p is data rank ``p // C``, context rank ``p % C``. What follows from the split:

  the same calls in a context group   its C processes draw the same prompts, noise and SDE draws (every draw is a pure
                                      function of (seed, iteration, prompt slot, node): they share the data rank) and
                                      see the same, gathered velocity, so every log-prob and loss, a mean over the
                                      whole sample's tokens, is the same on each of them
  rewards once per data rank          the context group's first process decodes and scores; the others receive its
                                      rewards (``from_leader``); advantages and the learners' global counts gather
                                      over data ranks only (``gather``), so each sample counts once
  gradients                           the gather's backward hands each rank its own tokens' gradient, so a weight's
                                      gradient summed over the group is the whole sample's: the policy's sum over all
                                      processes (an all-reduce, or FSDP2's reduce-scatter over every process) is the
                                      data-parallel sum, and the optimizer sees each sample once

FSDP2 composes with it unchanged: it shards over all N processes (the flattened data × context mesh) and sums over
them, which is what the gradients need. A family whose transformer class has no ``_cp_plan`` (SD3, Z-Image) is
refused in one line. docs/scaling.md says when to use it and how to launch it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from flowgrpo.run.errors import ConfigError


@dataclass
class Layout:
    """Where this process sits: data-parallel rank and size, context rank and size, and the mesh behind them."""

    data_rank: int
    data_world: int
    context_rank: int = 0
    context_size: int = 1
    ring: int = 1
    mesh: object = None  # torch's DeviceMesh ("data", "ring", "ulysses"); None without context parallelism
    group: object = None  # the process group of this process's context group (the mesh's ring x ulysses, flattened)

    @classmethod
    def of_launch(cls, accelerator, context: int = 1, ring: int = 1) -> "Layout":
        """The layout of ``accelerator``'s processes with context groups of ``context`` processes."""
        world, rank = accelerator.num_processes, accelerator.process_index
        if context == 1:
            return cls(rank, world)
        if world % context:
            raise ConfigError(f"train.context_parallel={context} must divide the launch's {world} processes (each "
                              f"context group is {context} of them); launch a multiple of {context} processes")
        if context % ring:
            raise ConfigError(f"train.context_parallel_ring={ring} must divide train.context_parallel={context} "
                              "(a group is ring x ulysses processes)")
        from torch.distributed.device_mesh import init_device_mesh

        device = "cpu" if dist.get_backend() == "gloo" else accelerator.device.type
        mesh = init_device_mesh(device, (world // context, ring, context // ring),
                                mesh_dim_names=("data", "ring", "ulysses"))
        return cls(rank // context, world // context, rank % context, context, ring, mesh,
                   mesh["ring", "ulysses"]._flatten().get_group())

    @property
    def leader(self) -> bool:
        """Whether this process decodes and scores for its context group (its first process)."""
        return self.context_rank == 0

    # ---------------------------------------------------------------- collectives
    def gather(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """``tensor`` of every data rank, concatenated in data-rank order (itself with one); on the CPU. Each context
        group's processes hold the same tensor: one copy of each group is kept."""
        if self.data_world == 1:
            return tensor
        work = tensor.to(device).contiguous()
        parts = [torch.empty_like(work) for _ in range(self.data_world)]
        dist.all_gather(parts, work, group=None if self.mesh is None else self.mesh.get_group("data"))
        return torch.cat(parts).cpu()

    def context_sum(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """``tensors`` summed over this process's context group (in place; returned)."""
        for t in tensors:
            dist.all_reduce(t, group=self.group)
        return tensors

    def from_leader(self, compute):
        """``compute()`` run by the context group's first process alone, its result (any picklable object) on every
        process of the group."""
        if self.context_size == 1:
            return compute()
        box = [compute() if self.leader else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0), group=self.group)
        return box[0]


def enable(model, layout: Layout) -> None:
    """Split every denoising network's sequence over ``layout``'s context groups with diffusers' context parallelism
    (each network's own ``_cp_plan``). Refused in one line for a network without a plan."""
    if layout.context_size == 1:
        return
    from diffusers.models._modeling_parallel import ContextParallelConfig

    for name, network in model.experts.items():
        if not getattr(network, "_cp_plan", None):
            from flowgrpo.memory import context_parallel_families

            raise ConfigError(f"train.context_parallel={layout.context_size}: {type(network).__name__} ({name}) has no "
                              f"context-parallel plan in diffusers (the families that have one: "
                              f"{', '.join(context_parallel_families())}); set train.context_parallel=1 and shard with "
                              "FSDP2 alone")
        heads = int(getattr(network.config, "num_attention_heads", 0) or 0)
        ulysses = layout.context_size // layout.ring
        if heads and heads % ulysses:
            raise ConfigError(f"train.context_parallel={layout.context_size}: Ulysses splits {type(network).__name__}'s "
                              f"{heads} attention heads over {ulysses} processes, which must divide them; choose a "
                              f"divisor of {heads}, or make more of the group rings (train.context_parallel_ring)")
        config = ContextParallelConfig(ring_degree=layout.ring, ulysses_degree=ulysses, mesh=layout.mesh)
        with _one_device_at_least():
            network.enable_parallelism(config=config)
    model.sequence_multiple = layout.context_size


@contextlib.contextmanager
def _one_device_at_least():
    """diffusers 0.42.1 places a rank on ``rank % torch.accelerator.device_count()``, which is 0 on a CPU (gloo): it
    counts 1 device there while parallelism is enabled (the mesh, not that device, is what it uses)."""
    count = torch.accelerator.device_count
    if count() > 0:
        yield
        return
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = count


__all__ = ["Layout", "enable"]
