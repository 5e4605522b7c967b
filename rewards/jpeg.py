"""JPEG compressibility and incompressibility (DDPO's rewards, Flow-GRPO's scaling).

    size_kB = bytes of the image saved by PIL as JPEG at quality 95, / 1000
    jpeg_compressibility     score = -size_kB / 500
    jpeg_incompressibility   score = +size_kB / 500

DDPO returns -size_kB and +size_kB; Flow-GRPO divides compressibility by 500. Both use /500 here
(set `divide_by=1` for DDPO's raw kB). Run: JpegCompressibility()(images, prompts).
"""

from __future__ import annotations

import io

import torch

from rewards.base import Reward, RewardOutput


def jpeg_size_kb(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """images: uint8 [B, 3, H, W] -> JPEG sizes in kB (1000 bytes) [B] float32."""
    from PIL import Image

    sizes = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image.permute(1, 2, 0).cpu().numpy()).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000)
    return torch.tensor(sizes, dtype=torch.float32)


class JpegCompressibility(Reward):
    name = "jpeg_compressibility"
    modality = "image"
    sign = -1.0

    def __init__(self, quality: int = 95, divide_by: float = 500.0):
        self.quality, self.divide_by = int(quality), float(divide_by)

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        size_kb = jpeg_size_kb(images, self.quality)
        return RewardOutput(scores=(self.sign * size_kb / self.divide_by).float(), info={"size_kb": size_kb})


class JpegIncompressibility(JpegCompressibility):
    name = "jpeg_incompressibility"
    sign = 1.0
