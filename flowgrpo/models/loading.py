"""Loading a model's components: the device a config names, the attention backend of its networks (diffusers' own
switch, with install hints), and one-line errors for a pretrained model diffusers cannot load."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


_BACKEND_INSTALL_HINTS = {
    "xformers": "pip install flowgrpo[gpu]  (xformers; CUDA only)",
    "flash": "pip install flash-attn",
    "flash_varlen": "pip install flash-attn",
    "sage": "pip install sageattention",
    "sage_varlen": "pip install sageattention",
}


def set_attention_backend(transformer: torch.nn.Module, backend: str) -> None:
    """Switch ``transformer`` to a diffusers attention backend with diffusers' own switch.

    ``transformer.set_attention_backend`` checks that the backend's package is installed; we add the
    install hint. Some processors (SD3's joint attention in diffusers 0.42) call PyTorch SDPA
    directly instead of the dispatcher; for those only "native" and "xformers" (through
    ``enable_xformers_memory_efficient_attention``) exist, and anything else is refused.
    """
    hint = _BACKEND_INSTALL_HINTS.get(backend, "pip install kernels" if backend.endswith("_hub") else None)

    def unusable(err: Exception) -> RuntimeError:
        install = f"install it ({hint}) or " if hint else ""
        return RuntimeError(
            f"attention_backend={backend!r} is not usable here: {err} Fix: {install}set "
            f"attention_backend: native (PyTorch SDPA, always available)."
        )

    routed = any(hasattr(getattr(m, "processor", None), "_attention_backend") for m in transformer.modules())
    if not routed and backend not in ("native", "xformers"):
        raise ValueError(
            f"{type(transformer).__name__}'s attention processors do not go through diffusers' attention "
            f"dispatcher, so attention_backend={backend!r} cannot apply; use 'native' (PyTorch SDPA, which "
            f"picks flash / memory-efficient kernels itself on GPU) or 'xformers'"
        )
    if backend == "native" and torch.cuda.is_available():
        # PyTorch SDPA without its cuDNN kernel (flash and memory-efficient stay): on an NVIDIA H100 with torch 2.11,
        # FLUX.1-dev's backward through cuDNN attention stopped with "illegal memory access"; without it, it ran
        # (benchmarks/bench_memory.py, docs/results/scaling.md)
        torch.backends.cuda.enable_cudnn_sdp(False)
    from diffusers.utils import logging as diffusers_logging

    logger = diffusers_logging.get_logger("diffusers.models.modeling_utils")
    level = logger.level
    logger.setLevel(diffusers_logging.ERROR)  # silence "attention backends are experimental" on every load
    try:
        transformer.set_attention_backend(backend)  # checks the backend's package is installed
        if not routed and backend == "xformers":
            transformer.enable_xformers_memory_efficient_attention()
    except (RuntimeError, ImportError, ValueError) as err:
        raise unusable(err) from err
    finally:
        logger.setLevel(level)


def _missing_components(folder: str) -> list[str]:
    """The components model_index.json names ([library, class], not null) whose folder (or its config) is absent."""
    import json

    try:
        index = json.loads(Path(folder, "model_index.json").read_text())
    except (OSError, ValueError):
        return []
    named = [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[0]]
    return [f"{k}/" for k in named if not Path(folder, k).is_dir() or not any(Path(folder, k).iterdir())]


def _unloadable(pretrained: str, source: str, err: OSError) -> Exception:
    """One line for a model that diffusers could not load (its OSError runs to several lines)."""
    from flowgrpo.run.errors import UserError

    first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    if os.path.isdir(source):
        missing = _missing_components(source)
        if missing:
            return UserError(f"model.pretrained={pretrained!r} lacks {', '.join(missing)}: its model_index.json names "
                             f"{'these components' if len(missing) > 1 else 'this component'} but the folder is not "
                             "there (an interrupted download or copy?); download or copy the whole model again")
        return UserError(f"model.pretrained={pretrained!r} is a folder diffusers cannot load as a pipeline ({first}); "
                         "it needs model_index.json and a folder per component, as save_pretrained writes them")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    how = ("it is not in the local hub cache and HF_HUB_OFFLINE is set: download it first with "
           f"`hf download {pretrained}` (or unset HF_HUB_OFFLINE)" if offline else
           f"check the hub id (and your access to it: `hf auth login`), or download it with "
           f"`hf download {pretrained}`")
    return UserError(f"model.pretrained={pretrained!r} could not be loaded ({first}); {how}")
