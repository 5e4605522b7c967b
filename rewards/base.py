"""The reward contract: every reward takes a float image batch and prompts and returns RewardOutput.

Rewards see images exactly as a user would save them: `Reward.to_uint8` rounds [0, 1] floats to
uint8 once, here, so no reward redoes (or forgets) the conversion. A score of NaN means "not
applicable to this sample", never a sentinel number.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RewardOutput:
    scores: torch.Tensor  # [B] float32; NaN = not applicable
    info: dict = field(default_factory=dict)  # per-sample lists/tensors of length B, and scalars


class Reward:
    """Base class. Subclasses set `name` (and `modality`) and implement `score_uint8`."""

    name: str = ""
    modality: str = "image"  # "image" | "video" | "both"

    def __call__(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict] | None = None
    ) -> RewardOutput:
        """images: float [B, 3, H, W] RGB in [0, 1]; prompts: B strings; metadata: None or B dicts."""
        images_uint8 = self.to_uint8(images)
        batch = images_uint8.shape[0]
        if len(prompts) != batch:
            raise ValueError(f"{self.name}: got {batch} images but {len(prompts)} prompts; pass one prompt per image")
        if metadata is not None and len(metadata) != batch:
            raise ValueError(
                f"{self.name}: got {batch} images but {len(metadata)} metadata entries; pass one per image or None"
            )
        out = self.score_uint8(images_uint8, list(prompts), metadata)
        if out.scores.shape != (batch,) or out.scores.dtype != torch.float32:
            raise RuntimeError(
                f"{self.name}: returned scores {tuple(out.scores.shape)} {out.scores.dtype}, expected ({batch},) float32"
            )
        return out

    def score_uint8(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict] | None
    ) -> RewardOutput:
        """images: uint8 [B, 3, H, W] RGB."""
        raise NotImplementedError

    def to_uint8(self, images: torch.Tensor) -> torch.Tensor:
        """Validate a float [B, 3, H, W] batch in [0, 1] and round it to uint8 [B, 3, H, W]."""
        if not isinstance(images, torch.Tensor):
            raise TypeError(f"{self.name}: images must be a torch.Tensor [B, 3, H, W], got {type(images).__name__}")
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(
                f"{self.name}: images must be [B, 3, H, W] RGB, got shape {tuple(images.shape)}; "
                "permute channels-last images with images.permute(0, 3, 1, 2)"
            )
        if not images.is_floating_point():
            raise TypeError(f"{self.name}: images must be float in [0, 1], got {images.dtype}; use images.float() / 255")
        if images.numel():
            lo, hi = images.min().item(), images.max().item()
            if lo < -1e-3 or hi > 1 + 1e-3 or lo != lo or hi != hi:
                raise ValueError(
                    f"{self.name}: images must lie in [0, 1], got range [{lo:.4g}, {hi:.4g}]; "
                    "map [-1, 1] model output with (x / 2 + 0.5).clamp(0, 1)"
                )
        return (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
