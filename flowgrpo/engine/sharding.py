"""Sharding the policy over processes with FSDP2 (``accelerate launch --config_file configs/accelerate/fsdp2.yaml``).

With accelerate's FSDP plugin at ``fsdp_version: 2`` the policy (flowgrpo/engine/policy.py) shards its
networks with ``torch.distributed.fsdp.fully_shard``: each transformer block (accelerate's transformer-based
wrap policy, the classes the diffusers model lists in ``_no_split_modules``) is one FSDP unit, and the root
holds the rest. Every parameter is then a DTensor holding 1/N of its rows on each of N processes; its
gradient, its AdamW moments and every ``WeightCopy`` made from it (the EMA, NFT's θ_old, AWM's copies,
DGPO's ema_ref, SAGE's anchor) are DTensors with the same rows, so nothing is whole on one process. A
forward all-gathers one block at a time; a backward reduce-scatters its gradients (summed over processes,
as the unsharded all-reduce sums them). Full fine-tuning's frozen reference is a WeightCopy of the trained weights
too (taken again once they are sharded); LoRA's reference is the base weights with the adapter disabled.

What sharding asks of the rest of the engine, and where it is done:
  every process makes the same model calls   a forward and a backward are collectives: the learners run
                                             ``Policy.matched`` micro-batches (padding with zero-loss repeats)
                                             and the held-out evaluation splits its prompts over processes
  checkpoints are written by every process   each writes its rows (flowgrpo/run/checkpoint.py, DCP)
  norms and exports gather                   ``full``: a DTensor made whole (one tensor at a time)

Mixed precision follows FSDP2's policy: parameters are all-gathered in the model's dtype (bf16 on GPUs)
and gradients reduced in float32. accelerate's plugin only exists on GPUs; on a CPU (gloo, the tests)
the same launch variables (``ACCELERATE_USE_FSDP``, ``FSDP_VERSION``...) build it here.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def fsdp_plugin(accelerator):
    """accelerate's FullyShardedDataParallelPlugin of this launch, or None when the launch does not shard."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None) if accelerator.distributed_type == "FSDP" else None
    launched = dist.is_available() and dist.is_initialized()  # a process group to shard over (even of 1 process)
    if plugin is None and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and launched:
        from accelerate.utils import FullyShardedDataParallelPlugin

        plugin = FullyShardedDataParallelPlugin()  # from the launch's FSDP_* variables (a CPU launch)
    if plugin is not None and plugin.fsdp_version != 2:
        from flowgrpo.run.errors import ConfigError

        raise ConfigError(f"the accelerate config asks for FSDP version {plugin.fsdp_version}; flowgrpo shards with "
                          f"FSDP2: set fsdp_version: 2 under fsdp_config (configs/accelerate/fsdp2.yaml)")
    return plugin


class Sharding:
    """FSDP2 over every process of the launch (see the module docstring)."""

    def __init__(self, plugin, accelerator):
        self.plugin, self.world = plugin, accelerator.num_processes
        self.device = accelerator.device

    def shard(self, module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
        """Shard ``module`` in place: its blocks, then itself (the parameters become DTensors)."""
        from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        # all-gather in the network's dtype (LoRA's float32 weights join the bf16 base), reduce in float32; the
        # inputs stay as the model adapter made them (a bf16 timestep near 1000 would be rounded to steps of 4)
        mixed = (MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
                 if dtype != torch.float32 else self.plugin.mixed_precision_policy or MixedPrecisionPolicy())
        kwargs = {"reshard_after_forward": self.plugin.reshard_after_forward, "mp_policy": mixed}
        if self.plugin.cpu_offload:
            kwargs["offload_policy"] = self.plugin.cpu_offload
        wrap = fsdp2_prepare_auto_wrap_policy(self.plugin, module)  # None: the root alone
        if wrap is not None:
            blocks = [m for m in module.modules() if m is not module and wrap(m)]
            for block in reversed(blocks):  # bottom-up, as fully_shard wants nested units
                fully_shard(block, **kwargs)
        fully_shard(module, **{k: v for k, v in kwargs.items() if k != "reshard_after_forward"})
        for unit in module.modules():
            if isinstance(unit, FSDPModule):
                # gradients are summed over processes (the learners' coefficients are normalised globally);
                # plain sums, as gloo has no pre-scaled reduction
                unit.set_gradient_divide_factor(1.0)
                unit.set_force_sum_reduction_for_comms(True)
        return module

    # ---------------------------------------------------------------- collectives
    def most(self, count: int) -> int:
        """The largest ``count`` over processes."""
        value = torch.tensor([count], dtype=torch.int64, device=self._collective_device())
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value)

    def total(self, value: float) -> float:
        """``value`` summed over processes (float64)."""
        t = torch.tensor([value], dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(t)
        return float(t)

    def _collective_device(self) -> torch.device:
        return torch.device("cpu") if dist.get_backend() == "gloo" else self.device


def is_sharded(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a collective for a DTensor: every process must call it)."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor


__all__ = ["Sharding", "fsdp_plugin", "full", "is_sharded"]
