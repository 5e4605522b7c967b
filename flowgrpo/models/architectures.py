"""Where a model config's architecture is written down, without its weights.

A hub model's components are described by their published configuration numbers in
``configs/models/architectures/<model config name>/<component>.json`` (transformer, text_encoder*, vae, and the
scheduler); a local pipeline folder by its own ``<component>/config.json``. The memory plan
(flowgrpo/memory/) counts them and ``model.random_weights`` (flowgrpo/models/random_init.py) builds them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from flowgrpo.models.families import FAMILIES


def _config_files(folder: Path) -> dict[str, Path]:
    """component -> its config.json: ``<component>.json`` (an architecture folder) or ``<component>/config.json``
    (a pipeline folder saved with save_pretrained)."""
    files = {p.stem: p for p in sorted(folder.glob("*.json")) if p.stem != "model_index"}
    files.update({p.parent.name: p for p in sorted(folder.glob("*/config.json"))})
    return {k: v for k, v in files.items() if k.startswith(("transformer", "text_encoder")) or k == "vae"}


def architecture_dir(model_config, name: Optional[str] = None) -> Path:
    """Where the component configurations of ``model_config`` are, no weights read: a local pipeline folder
    (its ``<component>/config.json``), else ``configs/models/architectures/<name>/`` (the published numbers of a
    hub model), found by the model config's name or by its ``pretrained`` id; else the hub cache's copies."""
    from flowgrpo.run.errors import UserError
    from flowgrpo.run.paths import configs_dir, resolve_pretrained

    try:
        local = Path(resolve_pretrained(model_config.pretrained))
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    if local.is_dir():
        return local
    root = configs_dir() / "models" / "architectures"
    if name and (root / name).is_dir():
        return root / name
    for yaml in sorted((configs_dir() / "models").glob("*.yaml")):
        if (root / yaml.stem).is_dir() and _pretrained_of(yaml) == model_config.pretrained:
            return root / yaml.stem
    cached = _hub_cache_dir(model_config.pretrained, model_config.family)
    if cached is not None:
        return cached
    raise UserError(f"no architecture for {model_config.pretrained!r}: add its published component configurations "
                    f"as {root}/<name>/transformer.json, text_encoder*.json, vae.json (docs/memory.md)")


def _pretrained_of(yaml: Path) -> Optional[str]:
    for line in yaml.read_text().splitlines():
        if line.startswith("pretrained:"):
            return line.split(":", 1)[1].split("#")[0].strip()
    return None


def _hub_cache_dir(repo: str, family: str) -> Optional[Path]:
    """A folder of the component configurations found in the local hub cache (no download), or None."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover
        return None
    found = {}
    for component in FAMILIES[family].components if family in FAMILIES else ():
        try:
            path = try_to_load_from_cache(repo, f"{component}/config.json")
        except Exception:  # not a hub id the cache can hold (huggingface_hub validates it)
            return None
        if not isinstance(path, str):
            return None
        found[component] = Path(path)
    return Path(next(iter(found.values()))).parents[1] if found else None


__all__ = ["architecture_dir"]
