"""Atomic, pickle-free training checkpoints (docs/design.md, "The run folder").

``checkpoints/step_<n>/`` holds
  tensors.safetensors   every tensor: trainable weights (``weights.*``), optimizer state
                        (``optim.<param>.<name>``), EMA (``ema.*``), anchor (``anchor.*``)
  state.json            everything else: iteration, optimizer hyper-parameters, plan-schedule state,
                        NFE counters, metrics history needed to continue, the resolved config
A checkpoint is written to ``step_<n>.tmp`` and renamed into place, so a crash never leaves a
half-written one; loading reads only safetensors and JSON (no pickle anywhere).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


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


def save_checkpoint(folder: Path, tensors: dict[str, torch.Tensor], state: dict, extra=None) -> None:
    """Write ``folder`` atomically (temp folder, then rename); ``extra(tmp)`` adds more files to it."""

    def build(tmp: Path) -> None:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp / "tensors.safetensors")
        (tmp / "state.json").write_text(json.dumps(state, indent=1, default=str))
        if extra is not None:
            extra(tmp)

    write_folder_atomically(folder, build)


def load_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    folder = Path(folder)
    if not (folder / "state.json").is_file() or not (folder / "tensors.safetensors").is_file():
        raise FileNotFoundError(
            f"{folder} is not a complete flowgrpo checkpoint (needs tensors.safetensors and state.json)"
        )
    return load_file(folder / "tensors.safetensors"), json.loads((folder / "state.json").read_text())


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
