"""Where flowgrpo finds its shipped files: built-in models, YAML configs and C++/CUDA sources.

An installed wheel carries ``configs/`` and ``csrc/`` inside the package (``flowgrpo/_data``); a
source checkout (editable install) has them at the repository root. Built-in models ship in
``flowgrpo/tiny/assets/<name>`` and are named by ``<name>`` in a model config's ``pretrained`` field.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # flowgrpo/
ASSETS_DIR = PACKAGE_DIR / "tiny" / "assets"
# built-in models and the command that (re)builds each one
BUILTIN_RECIPES = {"tiny-sd3": "flowgrpo pretrain-toy", "tiny-wan": "flowgrpo pretrain-toy-video",
                   "tiny-kontext": "flowgrpo pretrain-toy-edit"}


def _data_dir(name: str) -> Path:
    for candidate in (PACKAGE_DIR / "_data" / name, PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"flowgrpo cannot find its '{name}/' folder (looked in {PACKAGE_DIR / '_data'} and "
        f"{PACKAGE_DIR.parent}); reinstall the package with `pip install -e .` from a checkout."
    )


def configs_dir() -> Path:
    return _data_dir("configs")


def csrc_dir() -> Path:
    return _data_dir("csrc")


def builtin_models() -> list[str]:
    """Names of the models shipped inside the package (e.g. ``tiny-sd3``)."""
    if not ASSETS_DIR.is_dir():
        return []
    return sorted(p.name for p in ASSETS_DIR.iterdir() if (p / "model_index.json").is_file())


def resolve_pretrained(name_or_path: str) -> str:
    """A local folder, a built-in model name, or a hub id (returned unchanged for diffusers).

    Local folders win over built-in names, which win over hub ids. A string that looks like a
    local path (starts with '.', '/' or '~') but does not exist is an error, not a hub lookup.
    """
    expanded = os.path.expanduser(name_or_path)
    if os.path.isdir(expanded):
        return expanded
    if (ASSETS_DIR / name_or_path / "model_index.json").is_file():
        return str(ASSETS_DIR / name_or_path)
    if name_or_path in BUILTIN_RECIPES:
        raise FileNotFoundError(
            f"built-in model {name_or_path!r} is not in {ASSETS_DIR}; build it with "
            f"`{BUILTIN_RECIPES[name_or_path]}` (or reinstall flowgrpo from a full checkout)"
        )
    if name_or_path.startswith((".", "/", "~")):
        raise FileNotFoundError(
            f"model folder {name_or_path!r} does not exist; pass an existing folder saved with "
            f"save_pretrained, a hub id such as 'stabilityai/stable-diffusion-3.5-medium', or a "
            f"built-in model ({', '.join(builtin_models()) or 'none shipped'})."
        )
    return name_or_path
