"""The launch as input: how many processes the launcher started, and whether accelerate put them in one run.

``accelerate launch --num_processes N`` (or ``torchrun``) starts N processes and tells each the launch's size
(WORLD_SIZE). On a machine without a GPU, accelerate joins them into one process group (gloo) only when told they
run on the CPU (``--cpu``, ACCELERATE_USE_CPU, ``train.cpu``); without, each process would train alone, into the same
run folder, while the sharding saw N ranks. The trainer therefore runs such a launch on the CPU
(``launched_without_accelerator``) and refuses any launch whose processes it cannot put in one run (``check_launch``).
"""

from __future__ import annotations

import os

import torch

from flowgrpo.run.errors import ConfigError


def launched_processes() -> int:
    """The processes the launcher started (its WORLD_SIZE; 1 without a launcher)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


def launched_without_accelerator() -> bool:
    """Several processes launched on a machine with no GPU (or other accelerator): accelerate forms their process
    group (gloo) only when told they run on the CPU (``--cpu``, ACCELERATE_USE_CPU, train.cpu); without, each would
    train alone, all into one run folder. So such a launch runs on the CPU."""
    available = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    return launched_processes() > 1 and not available


def check_launch(acc, cfg) -> None:
    """The launch, the accelerator and the process group agree on the number of processes; else refuse (every process
    would see another world: each training alone into the same run folder, or a sharding mesh over ranks the data
    split does not know)."""
    import torch.distributed as dist

    launched = launched_processes()
    group = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if launched != acc.num_processes or group != acc.num_processes:
        raise ConfigError(
            f"the launch started {launched} processes (WORLD_SIZE) but accelerate put this one in a run of "
            f"{acc.num_processes} (process group of {group}): they would train apart into {cfg.run_dir}; launch with "
            "accelerate launch --num_processes N with one GPU per process, or on CPUs add --cpu (train.cpu=true)")


__all__ = ["check_launch", "launched_processes", "launched_without_accelerator"]
