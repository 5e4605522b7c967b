"""Pieces shared by the model rewards: lazy optional imports, weight-file lookup, the originals'
image preprocessing, and the linear MLP head of the LAION aesthetic predictor and ImageReward.

Preprocessing follows each original exactly, on uint8 images (the inputs the models were trained on):

    resize_center_crop    PIL bicubic resize of the shortest side, then a centre crop, /255, normalise.
                          crop="round" is torchvision's CenterCrop (openai/clip, BLIP, ImageReward);
                          crop="floor" is transformers' CLIPImageProcessor (PickScore, CLIPScore).
                          The two differ only for odd margins of non-square images.
    resize_longest_pad    HPSv2's val transform: to float first, torch bicubic (antialiased) resize of
                          the longest side, zero padding to a square, normalise.
    tensor_resize_center_crop  torchvision's Resize(size) (bilinear, antialiased) + CenterCrop + Normalize on a
                          float tensor: DiffusionNFT's / DGPO's ClipScorer (flow_grpo/clip_scorer.py), which
                          reads the sampler's float images unrounded.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def require(module: str, extra: str, what: str):
    """Import an optional dependency or raise an ImportError that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{what} needs the optional package {module!r}: pip install 'flowgrpo[{extra}]'"
        ) from exc


def first_line(exc: BaseException, limit: int = 160) -> str:
    """``Type: first line of the message`` (cut at ``limit`` characters): a cause inside a one-line error."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    first = first if len(first) <= limit else first[: limit - 3].rstrip() + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def not_downloaded(what: str, repo: str, exc: BaseException, command: str | None = None,
                   option: str = "a local folder") -> str:
    """The one line for weights that could not be loaded from the hub: the cause, the download command, the option."""
    return (f"{what} {repo!r} could not be loaded ({first_line(exc)}); download it with `{command or f'hf download {repo}'}`"
            f" (needs the network), or pass {option}")


@contextlib.contextmanager
def downloading(repo: str | None, what: str):
    """Load ``repo`` (a hub id or a local path) inside this block: a hub id that is not in the local cache and
    cannot be downloaded (offline, no network, no access) becomes one line naming the download command."""
    try:
        yield
    except OSError as exc:
        if repo is None or os.path.exists(os.path.expanduser(repo)):
            raise
        raise OSError(not_downloaded(what, repo, exc)) from None


def import_object(target: str):
    """The object at 'package.module:attr' (or 'package.module.attr')."""
    if ":" in target:
        module_name, attr = target.split(":", 1)
    elif "." in target:
        module_name, attr = target.rsplit(".", 1)
    else:
        raise ValueError(f"{target!r} is not a dotted path such as 'my_package.my_module:MyClass'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:  # a relative or empty module name too
        raise ValueError(f"cannot load {target!r}: {exc}") from exc


def resolve_file(pretrained: str, filename: str) -> str:
    """A weight file from a local file, a local folder holding `filename`, a hub repo id
    ('owner/repo', file `filename`) or a hub file ('owner/repo/path/in/repo.ext')."""
    path = Path(os.path.expanduser(pretrained))
    if path.is_file():
        return str(path)
    if path.is_dir():
        if not (path / filename).is_file():
            raise FileNotFoundError(f"{pretrained}: folder has no {filename!r}")
        return str(path / filename)
    if path.is_absolute() or pretrained.startswith("."):
        raise FileNotFoundError(f"no such file or folder: {pretrained}")
    parts = pretrained.split("/")
    if len(parts) < 2:
        raise FileNotFoundError(f"{pretrained!r} is neither a local path nor a hub id 'owner/repo'")
    repo_id, in_repo = "/".join(parts[:2]), "/".join(parts[2:]) or filename
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(repo_id, in_repo)
    except OSError as exc:  # not in the local cache and not downloadable (offline, no network, no access)
        raise OSError(not_downloaded("the file", f"{repo_id}/{in_repo}", exc, command=f"hf download {repo_id} {in_repo}",
                                     option="pretrained= a local file or folder")) from None


def torch_load_weights(path: str) -> dict:
    """torch.load with weights_only=True (never unpickles code); unwraps {'state_dict': ...} and
    strips a DistributedDataParallel 'module.' prefix."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001  (pickle errors have many types)
        raise RuntimeError(
            f"could not load {path} with torch.load(weights_only=True): {exc}. Only plain tensor "
            "checkpoints are accepted; re-save the state dict with torch.save(model.state_dict(), path)"
        ) from exc
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise RuntimeError(f"{path}: expected a state dict, got {type(state).__name__}")
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def load_exact(module: nn.Module, state: dict, what: str) -> None:
    """load_state_dict(strict=True) with an error that lists what is missing or unexpected."""
    result = module.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(
            f"{what}: checkpoint does not fit the architecture; missing {result.missing_keys[:8]} "
            f"({len(result.missing_keys)}), unexpected {result.unexpected_keys[:8]} ({len(result.unexpected_keys)}). "
            "Check the architecture arguments (e.g. a tiny config) against the checkpoint"
        )


def read_json(pretrained: str, filename: str) -> dict:
    return json.loads(Path(resolve_file(pretrained, filename)).read_text())


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / ||x|| along the last axis; a zero vector stays zero (as the aesthetic predictor's `normalized`)."""
    norm = x.norm(dim=-1, keepdim=True)
    return x / torch.where(norm == 0, torch.ones_like(norm), norm)


def _normalize(pixels: torch.Tensor, mean, std) -> torch.Tensor:
    mean_t = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
    return (pixels - mean_t) / std_t


def resize_center_crop(
    images: torch.Tensor, size: int, crop: int | tuple[int, int], mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD,
    rounding: str = "round",
) -> torch.Tensor:
    """images: uint8 [B, 3, H, W]. PIL bicubic resize (shortest side -> size, long side truncated as
    int(size * long / short)), centre crop to `crop`, /255, normalise. Returns float32 [B, 3, ch, cw]."""
    from PIL import Image

    crop_h, crop_w = (crop, crop) if isinstance(crop, int) else crop
    out = []
    for image in images:
        height, width = image.shape[-2:]
        if width <= height:
            new_w, new_h = size, int(size * height / width)
        else:
            new_w, new_h = int(size * width / height), size
        pil = Image.fromarray(image.permute(1, 2, 0).cpu().numpy())
        if (new_w, new_h) != (width, height):
            pil = pil.resize((new_w, new_h), resample=Image.BICUBIC)
        arr = np.asarray(pil)  # [h, w, 3] uint8
        if rounding == "round":  # torchvision CenterCrop
            top, left = int(round((new_h - crop_h) / 2.0)), int(round((new_w - crop_w) / 2.0))
        elif rounding == "floor":  # transformers center_crop
            top, left = (new_h - crop_h) // 2, (new_w - crop_w) // 2
        else:
            raise ValueError(f"rounding must be 'round' or 'floor', got {rounding!r}")
        if top < 0 or left < 0:
            raise ValueError(f"crop {crop_h}x{crop_w} is larger than the resized image {new_h}x{new_w}")
        arr = arr[top:top + crop_h, left:left + crop_w]
        pixels = torch.from_numpy(np.array(arr, copy=True)).permute(2, 0, 1).float() / 255.0
        out.append(_normalize(pixels, mean, std))
    return torch.stack(out)


def resize_longest_pad(images: torch.Tensor, size: int, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD) -> torch.Tensor:
    """images: uint8 [B, 3, H, W] (or float32 in [0, 1], taken as they are) -> float32 [B, 3, size, size]: /255,
    bicubic antialiased resize of the longest side to `size` (other side round(dim * scale)), zero padding split as
    (d // 2, d - d // 2), normalise. Padding also applies when no resize is needed, so every output is square."""
    pixels = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    height, width = pixels.shape[-2:]
    scale = size / float(max(height, width))
    if scale != 1.0:
        new_h, new_w = round(height * scale), round(width * scale)
        pixels = torch.nn.functional.interpolate(
            pixels, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=True
        )
    pad_h, pad_w = size - pixels.shape[-2], size - pixels.shape[-1]
    if pad_h or pad_w:
        pixels = torch.nn.functional.pad(pixels, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
    return _normalize(pixels, mean, std)


def tensor_resize_center_crop(pixels: torch.Tensor, size: int, crop: int | tuple[int, int], mean=OPENAI_CLIP_MEAN,
                              std=OPENAI_CLIP_STD) -> torch.Tensor:
    """float32 [B, 3, H, W] in [0, 1] -> float32 [B, 3, ch, cw]: torchvision's tensor Resize of the shortest side to
    ``size`` (bilinear, antialiased: ``T.Resize(size)``'s defaults), CenterCrop(crop) (rounded margins), Normalize."""
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    crop_hw = [crop, crop] if isinstance(crop, int) else list(crop)
    pixels = TF.resize(pixels.float(), size, interpolation=InterpolationMode.BILINEAR, antialias=True)
    return TF.normalize(TF.center_crop(pixels, crop_hw), list(mean), list(std))


class LinearMLP(nn.Module):
    """The head of the LAION aesthetic predictor and of ImageReward: Linear layers with dropout after
    the first three and no activation (the originals comment their ReLUs out), so state-dict keys
    are layers.{0,2,4,6,7}.{weight,bias}. sizes: (in, 1024, 128, 64, 16, 1) in the originals."""

    def __init__(self, sizes: tuple[int, ...] = (768, 1024, 128, 64, 16, 1), dropouts=(0.2, 0.2, 0.1)):
        super().__init__()
        if len(sizes) != 6:
            raise ValueError(f"LinearMLP takes 6 sizes (in, h1, h2, h3, h4, 1), got {sizes}")
        layers: list[nn.Module] = []
        for i in range(5):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i < 3:
                layers.append(nn.Dropout(dropouts[i]))
        self.layers = nn.Sequential(*layers)

    @staticmethod
    def sizes_from_state_dict(state: dict, prefix: str = "layers.") -> tuple[int, ...]:
        keys = [f"{prefix}{i}.weight" for i in (0, 2, 4, 6, 7)]
        missing = [k for k in keys if k not in state]
        if missing:
            raise RuntimeError(f"MLP checkpoint lacks {missing}; expected keys {keys} (and biases)")
        return (state[keys[0]].shape[1], *(state[k].shape[0] for k in keys))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
