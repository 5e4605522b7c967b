"""Condition images: the source image of an edit (or the references of a multi-reference model) carried by a prompt.

One mechanism for every conditioned workload (image editing now, image-to-video next). A prompt set's row names its
images in a JSON-lines file::

    {"prompt": "make the sky orange", "image": "sources/0001.png"}
    {"prompt": "put the cat from the first picture on the sofa of the second", "images": ["cat.png", "sofa.png"]}

Paths are relative to the file's folder (or absolute). A row may also name a ``"mask"`` (white where the instruction
may change the image), which the preservation reward reads (rewards/preservation.py). :func:`resolve_row` checks every image when the set is read
(``flowgrpo.data.read_prompts``) and keeps their absolute paths in the row's metadata under ``"images"``; from there
the condition goes wherever the prompt goes, because the metadata does: rollouts and the training pass encode it
with the prompt (:func:`images_of` -> ``FlowModel.encode_prompts(texts, images=...)``), rewards that judge a result
against its source receive it (:func:`reward_conditions`; ``Reward.sees_condition``), the held-out evaluation and the
gallery show it beside the result. A model gets the images as PIL images, as a user hands them to the diffusers
pipeline, and preprocesses them the pipeline's way (its family adapter); a reward gets them as float tensors at the
result's size.

What is refused, each in one line naming the file, the line and the fix (:class:`ConditionImageError`): a missing
file, a file that is not a readable image, a mode that has no RGB meaning for a model (transparency, CMYK, 16-bit
or float pixels), an image over MAX_PIXELS, and rows that carry different numbers of images.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from flowgrpo.run.errors import UserError

KEY = "images"  # the metadata key that holds a row's condition images (absolute paths)
MAX_PIXELS = 4096 * 4096  # larger images are refused at load: every family resizes them to its resolution anyway
# modes whose pixels convert to RGB without a choice: 8-bit RGB, grey, palette images without transparency, bilevel
ACCEPTED_MODES = ("RGB", "L", "P", "1")


class ConditionImageError(UserError, ValueError):
    """A condition image that cannot be used; the message names the file, the line and the fix."""


def resolve_row(row: dict, metadata: dict, folder: Path, where: str) -> None:
    """Check the condition images a prompt-file row names (``"image"``: one path, or ``"images"``: a list) and keep
    their absolute paths in ``metadata[KEY]``; a row without either is left as it is. ``where``: "file:line"."""
    if "image" in row and "images" in row:
        raise ConditionImageError(f"{where} has both 'image' and 'images'; give one path as 'image' or a list as 'images'")
    value = row.get("image", row.get(KEY))
    if value is None:
        metadata.pop("image", None)
        return
    paths = [value] if "image" in row else value
    if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
        raise ConditionImageError(f"{where}: 'images' must be a non-empty list of image paths and 'image' one path, got "
                                  f"{value!r}")
    resolved = [str(check_image((folder / p) if not Path(p).is_absolute() else Path(p), where, p)) for p in paths]
    metadata.pop("image", None)
    metadata[KEY] = resolved
    mask = row.get("mask")  # where the edit may change the image (white): the preservation reward reads it
    if mask is not None:
        if not isinstance(mask, str) or not mask:
            raise ConditionImageError(f"{where}: 'mask' must be one image path, got {mask!r}")
        metadata["mask"] = str(check_image((folder / mask) if not Path(mask).is_absolute() else Path(mask), where, mask))


def check_image(path: Path, where: str, given: str) -> Path:
    """Raise ConditionImageError unless ``path`` is an image a model can take (module docstring); returns it absolute."""
    from PIL import Image, UnidentifiedImageError

    path = path.resolve()
    if not path.is_file():
        raise ConditionImageError(f"{where}: image {given!r} does not exist ({path}); image paths are relative to the "
                                  "prompt file's folder")
    try:
        with Image.open(path) as image:
            mode, (width, height) = image.mode, image.size
            if width * height > MAX_PIXELS:
                raise ConditionImageError(
                    f"{where}: image {given!r} is {width}x{height} ({width * height / 1e6:.0f} MP), more than the "
                    f"{MAX_PIXELS / 1e6:.1f} MP a condition image may be: downscale it (the model resizes it to its "
                    "resolution anyway)")
            transparent = mode == "P" and "transparency" in image.info
            if image.format == "JPEG":  # a JPEG's structure says little: decode it, at 1/8 scale (the DCT's own)
                image.draft("RGB", (max(1, width // 8), max(1, height // 8)))
                image.load()
            else:
                image.verify()  # the file's chunks and checksums (a truncated PNG), without decoding every pixel
    except ConditionImageError:
        raise
    except Image.DecompressionBombError:
        raise ConditionImageError(f"{where}: image {given!r} is larger than PIL opens safely; downscale it "
                                  f"(at most {MAX_PIXELS / 1e6:.1f} MP)") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ConditionImageError(f"{where}: image {given!r} cannot be read as an image ({exc}); give a PNG, JPEG or "
                                  "WebP file") from None
    if mode not in ACCEPTED_MODES or transparent:
        fix = ("flatten it onto a background (its transparent pixels have no colour a model sees)"
               if transparent or "A" in mode else "save it as 8-bit RGB")
        raise ConditionImageError(f"{where}: image {given!r} has mode {mode}; a condition image is RGB, grey or a "
                                  f"palette image: {fix}")
    return path


def check_counts(metadata: list[dict], spec: str) -> None:
    """Every row of a set carries the same number of condition images, or none does."""
    counts = {len(m.get(KEY) or ()) if isinstance(m, dict) else 0 for m in metadata}
    if len(counts) > 1:
        first = {c: next(i for i, m in enumerate(metadata, 1)
                         if (len(m.get(KEY) or ()) if isinstance(m, dict) else 0) == c) for c in sorted(counts)}
        shown = ", ".join(f"{c} (first on row {row})" for c, row in first.items())
        raise ConditionImageError(f"prompts {spec!r} mixes rows with different numbers of condition images: {shown}; "
                                  "give every row the same number (a set of edits: one 'image' per row)")


def count(metadata: list[dict] | None) -> int:
    """How many condition images each row of ``metadata`` carries (0: a text-only set)."""
    first = (metadata or [{}])[0]
    return len(first.get(KEY) or ()) if isinstance(first, dict) else 0


@functools.lru_cache(maxsize=4096)
def _load(path: str, mtime_ns: int):
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")


def load(path: str):
    """The RGB PIL image at ``path`` (cached by path and modification time: a prompt's source is read once)."""
    return _load(path, Path(path).stat().st_mtime_ns)


def images_of(metadata: list[dict] | None) -> list[list] | None:
    """Each row's condition images as RGB PIL images (what ``FlowModel.encode_prompts(images=...)`` takes), or None
    for rows without any."""
    if not metadata or not count(metadata):
        return None
    return [[load(p) for p in m[KEY]] for m in metadata]


def reward_conditions(metadata: list[dict] | None, size: tuple[int, int], rewards) -> torch.Tensor | None:
    """The rows' condition images as ``rewards`` take them: float32 [B, K, 3, H, W] in [0, 1], each resized to the
    result's ``size`` (H, W) with an antialiased bilinear filter; None for rows without any, or where no reward
    sees them (``Reward.sees_condition``: then nothing is loaded or resized)."""
    import numpy as np

    if not metadata or not count(metadata) or not any(getattr(r, "sees_condition", False) for r in rewards):
        return None
    height, width = int(size[0]), int(size[1])
    rows = []
    for m in metadata:
        pixels = [torch.from_numpy(np.asarray(load(p), dtype=np.uint8).copy()).permute(2, 0, 1).float() / 255
                  for p in m[KEY]]
        rows.append(torch.stack([torch.nn.functional.interpolate(
            x[None], size=(height, width), mode="bilinear", antialias=True, align_corners=False)[0]
            if x.shape[-2:] != (height, width) else x for x in pixels]))
    return torch.stack(rows).clamp(0, 1)


__all__ = ["ACCEPTED_MODES", "ConditionImageError", "KEY", "MAX_PIXELS", "check_counts", "check_image", "count",
           "images_of", "load", "resolve_row", "reward_conditions"]
