"""Image-statistic rewards: what a reward model should never be, kept as the tiny world's reproducible hacks.

The measures themselves (brightness, saturation, high-frequency energy, flicker, diversity) live here and are the
reward-hacking watch's image guards (flowgrpo/engine/watch.py). ``MeanBrightness`` pays for mean luminance and
``MeanSaturation`` for mean colour saturation, ``MeanRedness`` for
how much redder than green and blue the pixels are. Trained on, they climb in tens of iterations by erasing or
recolouring the objects the prompts ask for, while the held-out ``toy`` reward falls: benchmarks/bench_hacking.py
uses them to check that the reward-hacking watch fires (docs/hacking.md). Load them by dotted path:
``rewards=[{name: 'rewards.stats:MeanBrightness'}]``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rewards.base import Reward, RewardOutput

LUMA = (0.299, 0.587, 0.114)


def _frames(media: torch.Tensor) -> torch.Tensor:
    """[N, 3, H, W] or [N, F, 3, H, W] float in [0, 1] -> [N, F, 3, H, W] float32."""
    media = media.float()
    if media.dim() == 4:
        media = media.unsqueeze(1)
    if media.dim() != 5 or media.shape[2] != 3:
        raise ValueError(f"guards take images [N, 3, H, W] or videos [N, F, 3, H, W], got {tuple(media.shape)}")
    return media


def brightness(media: torch.Tensor) -> torch.Tensor:
    x = _frames(media)
    luma = torch.tensor(LUMA, dtype=x.dtype, device=x.device).view(1, 1, 3, 1, 1)
    return (x * luma).sum(2).mean((1, 2, 3))


def saturation(media: torch.Tensor) -> torch.Tensor:
    x = _frames(media)
    high, low = x.amax(2), x.amin(2)
    sat = torch.where(high > 0, (high - low) / high.clamp(min=1e-12), torch.zeros_like(high))
    return sat.mean((1, 2, 3))


def high_frequency(media: torch.Tensor) -> torch.Tensor:
    """Mean squared discrete Laplacian (4 neighbours, interior pixels) over channels and frames."""
    x = _frames(media)
    lap = (4 * x[..., 1:-1, 1:-1] - x[..., :-2, 1:-1] - x[..., 2:, 1:-1] - x[..., 1:-1, :-2] - x[..., 1:-1, 2:])
    return lap.square().mean((1, 2, 3, 4))


def flicker(media: torch.Tensor) -> torch.Tensor:
    x = _frames(media)
    if x.shape[1] < 2:
        return torch.full((x.shape[0],), math.nan)
    return (x[:, 1:] - x[:, :-1]).abs().mean((1, 2, 3, 4))


def pixel_features(media: torch.Tensor, size: int = 16) -> torch.Tensor:
    """[N, F·3·size²]: every frame area-downsampled to ``size``×``size``, in [0, 1] (a feature space any run has)."""
    x = _frames(media)
    n = x.shape[0]
    return F.interpolate(x.flatten(0, 1), size=(size, size), mode="area").reshape(n, -1)


def diversity(media: torch.Tensor, prompts: list[str], size: int = 16, features: torch.Tensor | None = None) -> torch.Tensor:
    """Each sample's prompt's mean pairwise RMS distance between its samples (NaN alone): in ``features`` [N, D] when
    given (a reward model's embedding), else the samples' pixels at ``size``×``size``."""
    small = pixel_features(media, size) if features is None else features.float().flatten(1)
    n = small.shape[0]
    out = torch.full((n,), math.nan)
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p, []).append(i)
    for rows in groups.values():
        if len(rows) < 2:
            continue
        d = torch.cdist(small[rows].double(), small[rows].double()) / math.sqrt(small.shape[1])
        k = len(rows)
        out[rows] = float(d.sum() / (k * (k - 1)))
    return out




class MeanBrightness(Reward):
    name = "mean_brightness"
    modality = "both"

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        return RewardOutput(brightness(images.float() / 255.0).float())


class MeanSaturation(Reward):
    name = "mean_saturation"
    modality = "both"

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        return RewardOutput(saturation(images.float() / 255.0).float())


def redness(media: torch.Tensor) -> torch.Tensor:
    """Mean over pixels and frames of max(R − max(G, B), 0): 0 on greys, 1 on pure red."""
    x = _frames(media)
    return (x[:, :, 0] - x[:, :, 1:].amax(2)).clamp(min=0).mean((1, 2, 3))


class MeanRedness(Reward):
    name = "mean_redness"
    modality = "both"

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        return RewardOutput(redness(images.float() / 255.0).float())

