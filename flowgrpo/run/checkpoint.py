"""Atomic, pickle-free training checkpoints (docs/design.md, "The run folder").

``checkpoints/step_<n>/`` holds
  tensors.safetensors   every tensor: trainable weights (``weights.*``), optimizer state
                        (``optim.<param>.<name>``), EMA (``ema.*``), anchor (``anchor.*``)
  tensors/              instead, in a sharded run (FSDP2): one safetensors file per process holding its rows
                        of each tensor and where they sit in the whole (torch.distributed.checkpoint's
                        Hugging Face storage: safetensors with JSON headers)
  state.json            everything else: iteration, optimizer hyper-parameters, plan-schedule state,
                        NFE counters, metrics history needed to continue, the resolved config
A checkpoint is written to ``step_<n>.tmp`` and renamed into place, so a crash never leaves a
half-written one; loading reads only safetensors and JSON (no pickle anywhere). Both layouts load
through torch.distributed.checkpoint into tensors laid out as the loading run holds them, so a
checkpoint of N processes resumes at M (rows are read where they lie: resharding).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file


def optimizer_to_flat(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """Optimizer state as named tensors plus JSON-able hyper-parameters."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entries in state["state"].items():
        for name, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"optim.{index}.{name}"] = value.detach().clone().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def optimizer_from_flat(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            # a fresh, private copy: the loaded file's memory is read-only and shared
            state.setdefault(int(index), {})[name] = value.clone()
    for key, value in meta["scalars"].items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def write_folder_atomically(folder: Path, build) -> None:
    """``build(tmp)`` fills a temporary folder, which then replaces ``folder``: never half-written."""
    folder = Path(folder)
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    build(tmp)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


def _barrier() -> None:
    if _rank_world()[1] > 1:
        dist.barrier()


def _is_sharded(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def save_checkpoint(folder: Path, tensors: dict[str, torch.Tensor], state: dict, extra=None) -> None:
    """Write ``folder`` atomically (temp folder, then rename). Every process of a run calls it: sharded tensors
    (DTensors) are written by every process, its rows each (``tensors/``), whole ones by the main process
    (``tensors.safetensors``); ``extra(tmp)`` runs on every process and adds files (from the main process)."""
    folder = Path(folder)
    rank, _ = _rank_world()
    tmp, old = folder.with_name(folder.name + ".tmp"), folder.with_name(folder.name + ".old")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    if any(_is_sharded(v) for v in tensors.values()):
        import torch.distributed.checkpoint as dcp

        dcp.save({k: v.detach() for k, v in tensors.items()},
                 storage_writer=dcp.HuggingFaceStorageWriter(str(tmp / "tensors"), save_distributed=True))
    elif rank == 0:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp / "tensors.safetensors")
    if extra is not None:
        extra(tmp)
    _barrier()
    if rank == 0:
        (tmp / "state.json").write_text(json.dumps(state, indent=1, default=str))
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()


def _tensor_folder(folder: Path) -> Path:
    folder = Path(folder)
    if not (folder / "state.json").is_file() or not (
            (folder / "tensors.safetensors").is_file() or (folder / "tensors").is_dir()):
        raise FileNotFoundError(
            f"{folder} is not a complete flowgrpo checkpoint (needs state.json and tensors.safetensors or tensors/)"
        )
    return folder / "tensors" if (folder / "tensors").is_dir() else folder


def checkpoint_contents(folder: Path) -> tuple[dict[str, tuple[torch.Size, torch.dtype]], dict]:
    """A checkpoint's tensors as name -> (whole shape, dtype), without reading them, and its state.json."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.HuggingFaceStorageReader(str(_tensor_folder(folder))).read_metadata().state_dict_metadata
    saved = {name: (m.size, m.properties.dtype) for name, m in metadata.items()}
    return saved, json.loads((Path(folder) / "state.json").read_text())


def load_checkpoint(folder: Path, targets: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fill ``targets`` (tensors shaped as ``checkpoint_contents`` says; DTensors receive their rows) from a
    checkpoint of any number of processes. Every process of a run calls it."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # one process without a process group: DCP says so, and loads
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.load(targets, storage_reader=dcp.HuggingFaceStorageReader(str(_tensor_folder(folder))))
    return targets


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith("step_") and not p.name.endswith(".tmp")
             and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    for old in checkpoint_dirs(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
