"""How much of an edit's source survives outside what the instruction asks to change (reward "preservation").

An editing reward alone (a VLM judge, an instruction scorer) can be won by repainting the whole image; this reward
prices that: it compares the result with its source (the prompt's condition image, ``sees_condition``) pixel by pixel
and scores the share of the image left as it was, with partial credit:

    d_i        the RGB distance of pixel i between result and source, both in [0, 1], after a small blur (``blur``
               pixels: a one-pixel shift or resampling is not a change), at most ``size`` pixels on the long side
    credit_i   1 - min(1, d_i / tolerance)
    score      the mean credit over the pixels the edit may not touch

Which pixels the edit may touch: where the row's metadata names a mask (``"mask"``: an image file, white where the
instruction may change the image, relative paths as the prompt file's images), those and the blur's reach around them; otherwise the
``allow`` share of the pixels that changed most (an edit changes a region, not everything: with ``allow`` 0.25 a
result that recoloured a quarter of the image scores 1, one that repainted all of it about 0). A copy of the source
scores 1; pair it with a reward of the instruction's execution (a product or a weighted sum of both: the
``rewards`` list's weights).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rewards.base import Reward, RewardOutput


class Preservation(Reward):
    name = "preservation"
    modality = "image"
    sees_condition = True

    def __init__(self, allow: float = 0.25, tolerance: float = 0.25, blur: float = 1.0, size: int = 256):
        if not 0.0 <= allow < 1.0:
            raise ValueError(f"allow={allow} is not allowed; use the share of pixels an edit may change, in [0, 1)")
        if tolerance <= 0 or blur < 0 or size < 8:
            raise ValueError(f"tolerance={tolerance}, blur={blur}, size={size}: use tolerance > 0, blur >= 0, size >= 8")
        self.allow, self.tolerance, self.blur, self.size = float(allow), float(tolerance), float(blur), int(size)

    def _radius(self) -> int:
        """The blur kernel's radius in pixels (0: no blur)."""
        return max(1, int(round(2 * self.blur))) if self.blur > 0 else 0

    def _prepare(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 3, H, W] -> float [B, 3, h, w] at most ``size`` on the long side, blurred."""
        x = images.float() / 255
        scale = self.size / max(x.shape[-2:])
        if scale < 1:
            x = F.interpolate(x, scale_factor=scale, mode="bilinear", antialias=True, align_corners=False)
        if self.blur > 0:
            radius = self._radius()
            t = torch.arange(-radius, radius + 1, dtype=torch.float32)
            kernel = torch.exp(-0.5 * (t / self.blur) ** 2)
            kernel = (kernel / kernel.sum()).to(x)
            c = x.shape[1]
            x = F.pad(x, (radius,) * 4, mode="replicate")
            x = F.conv2d(x, kernel.view(1, 1, 1, -1).expand(c, 1, 1, -1), groups=c)
            x = F.conv2d(x, kernel.view(1, 1, -1, 1).expand(c, 1, -1, 1), groups=c)
        return x

    def score_uint8(self, images, prompts, metadata, conditions) -> RewardOutput:
        result, source = self._prepare(images), self._prepare(conditions[:, 0])
        distance = (result - source).pow(2).sum(1).sqrt()  # [B, h, w]
        credit = 1 - (distance / self.tolerance).clamp(max=1)
        scores, changed = [], []
        for i in range(images.shape[0]):
            mask = self._mask(metadata[i] if metadata else None, credit.shape[-2:], self._radius())
            if mask is not None:
                keep = credit[i][~mask]
            else:
                flat = credit[i].flatten()
                kept = flat.numel() - int(round(self.allow * flat.numel()))
                keep = flat.topk(kept).values  # the most-changed ``allow`` share is the edit's
            scores.append(float(keep.mean()) if keep.numel() else float("nan"))
            changed.append(float((credit[i] < 0.5).float().mean()))
        return RewardOutput(scores=torch.tensor(scores, dtype=torch.float32), info={"changed_share": changed})

    @staticmethod
    def _mask(meta: dict | None, size, radius: int) -> torch.Tensor | None:
        """The row's mask (``metadata["mask"]``: white where the edit may change the image) at ``size``, grown by the
        blur's ``radius`` (the blur carries an edit that far past its region), or None."""
        path = (meta or {}).get("mask") if isinstance(meta, dict) else None
        if not path:
            return None
        import numpy as np
        from PIL import Image

        with Image.open(path) as mask:  # checked when the prompt set was read (flowgrpo/conditions.py)
            pixels = torch.from_numpy(np.asarray(mask.convert("L"), dtype=np.float32) / 255)[None, None]
        mask = (F.interpolate(pixels, size=tuple(size), mode="bilinear", align_corners=False) > 0.5).float()
        if radius:
            mask = F.max_pool2d(mask, 2 * radius + 1, stride=1, padding=radius)
        return mask[0, 0] > 0.5
