"""Atomic, pickle-free training checkpoints (docs/design.md, "The run folder").

``checkpoints/step_<n>/`` holds
  tensors.safetensors   every tensor: trainable weights (``weights.*``), optimizer state
                        (``optim.<param>.<name>``), EMA (``ema.*``), anchor (``anchor.*``)
  tensors/              instead, in a sharded run (FSDP2): one safetensors file per process holding its rows
                        of each tensor and where they sit in the whole (torch.distributed.checkpoint's
                        Hugging Face storage: safetensors with JSON headers)
  state.json            everything else: iteration, optimizer hyper-parameters, plan-schedule state,
                        NFE counters, metrics history needed to continue, the resolved config
A checkpoint is written to ``step_<n>.tmp`` and renamed into place, so a crash (a SIGKILL included) never
leaves a half-written one; a write that fails (a full disk) removes its temporary folder and stops the run
with one line, the checkpoints before it intact. A checkpoint that cannot be read (truncated, corrupted)
is named on resume, with the newest one that can (:func:`readable_checkpoint`). Loading reads only
safetensors and JSON (no pickle anywhere). Both layouts load
through torch.distributed.checkpoint into tensors laid out as the loading run holds them, so a
checkpoint of N processes resumes at M (rows are read where they lie: resharding).
"""

from __future__ import annotations

import errno
import json
import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from flowgrpo.run.errors import UserError


class CheckpointError(UserError):
    """A checkpoint that could not be written or read; the message names the file and what is intact."""


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
    try:
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
    except OSError as exc:  # a full disk, a quota, a folder gone: nothing half-written is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        before = [p.name for p in checkpoint_dirs(folder.parent.parent) if p != folder]
        what = errno.errorcode.get(exc.errno, "") if exc.errno else ""
        intact = f"the last complete checkpoint, {before[-1]}, is intact" if before else "no earlier checkpoint exists"
        raise CheckpointError(
            f"could not write checkpoint {folder} ({what + ': ' if what else ''}{exc.strerror or exc}); its partial "
            f"folder was removed and {intact}; free space in {folder.parent} (or lower log.keep_checkpoints) and run "
            "the same command again to resume") from None
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
    """Complete checkpoints of a run (``step_<n>`` with a state.json; never a ``.tmp`` or ``.old``), oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if re.fullmatch(r"step_\d+", p.name) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be resumed from (the file and the reason), or None when its state.json parses and
    every tensor file's header and size agree. Reads headers only: a flipped bit inside the tensor data is
    not detected (no checksums are kept)."""
    folder = Path(folder)
    try:
        json.loads((folder / "state.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{folder / 'state.json'}: {exc}"
    files = sorted((folder / "tensors").glob("*.safetensors")) if (folder / "tensors").is_dir() else \
        [folder / "tensors.safetensors"]
    if not files:
        return f"{folder}: no tensor files"
    for path in files:
        try:
            with path.open("rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    return f"{path}: truncated ({len(head)} bytes)"
                length = int.from_bytes(head, "little")
                if length > 100_000_000:
                    return f"{path}: not a safetensors file (header length {length})"
                header = json.loads(f.read(length))
            ends = [info["data_offsets"][1] for key, info in header.items() if key != "__metadata__"]
            expected = 8 + length + max(ends, default=0)
            size = path.stat().st_size
            if size != expected:
                return f"{path}: {size} bytes where its header says {expected} (truncated or padded)"
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, IndexError) as exc:
            return f"{path}: unreadable header ({type(exc).__name__}: {exc})"
    return None


def readable_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint of the run, after checking it can be read; None when there is none. A newest one that
    cannot be read is a :class:`CheckpointError` naming the file and the newest one that can."""
    found = checkpoint_dirs(run_dir)
    if not found:
        return None
    problem = checkpoint_problem(found[-1])
    if problem is None:
        return found[-1]
    good = next((p for p in reversed(found[:-1]) if checkpoint_problem(p) is None), None)
    offer = (f"the newest readable one is {good.name}: move {found[-1].name} aside (mv {found[-1]} {found[-1]}.bad) "
             "and run the same command again to resume from it" if good else
             "no earlier checkpoint can be read: start again with resume=false, or a new run_name")
    raise CheckpointError(f"checkpoint {found[-1].name} cannot be read ({problem}); {offer}")


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    for old in checkpoint_dirs(run_dir)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
