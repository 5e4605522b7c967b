"""The reward contract: every reward takes a float image (or video) batch and prompts and returns RewardOutput.

Rewards see images exactly as a user would save them: `Reward.to_uint8` rounds [0, 1] floats to
uint8 once, here, so no reward redoes (or forgets) the conversion. A score of NaN means "not
applicable to this sample", never a sentinel number.

Shapes by `modality`:

    "image"  images float [B, 3, H, W]
    "video"  videos float [B, F, 3, H, W] (F frames); lift an image reward with rewards.video.PerFrame
    "both"   either of the two
    "vector" samples float [B, d] that are not pictures (the analytic world, rewards/analytic.py):
             they reach the reward as float32, unrounded

A subclass sets `name` and `modality` and implements `score_uint8(images_uint8, prompts, metadata)`
(a "vector" reward: `score_vectors(x_float32, prompts, metadata)`); `Reward.score` is the same call
for batches that are already uint8 (used by wrappers and the server).

An image reward whose instance sets `quantize = False` skips the rounding: it gets the float32 images
in [0, 1] as they came (validated, clamped) in `score_float(images, prompts, metadata)`, and `score`
takes float32 batches. It is for rewards that must reproduce a scorer which reads the sampler's
float output unrounded (DiffusionNFT's CLIPScore and HPSv2: `quantize=False` on clipscore, hpsv2).

Conditioned generation (image editing): a reward that judges a result against its source sets
`sees_condition = True` and receives `conditions`, the prompts' condition images [B, K, 3, H, W] (K
references each, resized to the result's H x W, rounded like the images, or float32 with quantize=False),
as the keyword `conditions` of its scorer (`score_uint8(images, prompts, metadata, conditions=...)`).
Rewards without it never see them, so every text-to-image reward scores edits too (the result alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MODALITIES = ("image", "video", "both", "vector")


@dataclass
class RewardOutput:
    scores: torch.Tensor  # [B] float32; NaN = not applicable
    info: dict = field(default_factory=dict)  # per-sample lists/tensors of length B, and scalars


class Reward:
    """Base class. Subclasses set `name` (and `modality`) and implement `score_uint8`."""

    name: str = ""
    modality: str = "image"  # "image" | "video" | "both" | "vector"
    quantize: bool = True  # False: score_float gets the float32 [0, 1] images unrounded (module docstring)
    sees_condition: bool = False  # True: the scorer also takes the condition images (keyword ``conditions``)

    def __call__(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict] | None = None,
        conditions: torch.Tensor | None = None,
    ) -> RewardOutput:
        """images: float [B, 3, H, W] (image) or [B, F, 3, H, W] (video) RGB in [0, 1], or samples
        [B, d] (vector); prompts: B strings; metadata: None or B dicts; conditions: None or the prompts'
        condition images float [B, K, 3, H, W] in [0, 1] (passed on only to rewards with sees_condition)."""
        if self.modality == "vector":
            prepared = self.to_float32(images)
        else:
            prepared = self.to_uint8(images) if self.quantize else self.to_unit_float(images)
        if conditions is not None and self.sees_condition:
            conditions = self._prepare_conditions(conditions, images.shape[0])
        return self.score(prepared, prompts, metadata, conditions=conditions)

    def _prepare_conditions(self, conditions: torch.Tensor, batch: int) -> torch.Tensor:
        """Validate float condition images [B, K, 3, H, W] in [0, 1] and round them as the images are."""
        if not isinstance(conditions, torch.Tensor) or conditions.ndim != 5 or conditions.shape[2] != 3 \
                or conditions.shape[0] != batch:
            raise ValueError(f"{self.name}: conditions must be the condition images [B={batch}, K, 3, H, W], got "
                             f"{tuple(getattr(conditions, 'shape', ())) or type(conditions).__name__}")
        b, k = conditions.shape[:2]
        flat = self.to_unit_float(conditions.reshape(b * k, *conditions.shape[2:]))
        flat = (flat * 255).round().to(torch.uint8) if self.quantize else flat
        return flat.reshape(conditions.shape)

    def score(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict] | None = None,
        conditions: torch.Tensor | None = None,
    ) -> RewardOutput:
        """`__call__` for a batch already rounded to uint8 [B, 3, H, W] or [B, F, 3, H, W] (a vector
        reward: float32 [B, d]; a reward with quantize=False: float32 images in [0, 1]); ``conditions``
        prepared the same way (uint8 or float32 [B, K, 3, H, W]), or None."""
        vector = self.modality == "vector"
        unrounded = not vector and not self.quantize
        want = torch.float32 if vector or unrounded else torch.uint8
        if not isinstance(images, torch.Tensor) or images.dtype != want:
            what = ("a float32 tensor [B, d]" if vector else
                    "float32 images in [0, 1] (it was built with quantize=False)" if unrounded else
                    "a uint8 tensor; call the reward on float images in [0, 1] instead")
            raise TypeError(f"{self.name}: score() takes {what}")
        self._check_shape(images)
        batch = images.shape[0]
        if isinstance(prompts, str) or len(prompts) != batch:
            got = "a single string" if isinstance(prompts, str) else f"{len(prompts)} prompts"
            raise ValueError(f"{self.name}: got {batch} images but {got}; pass one prompt per image")
        if metadata is not None and len(metadata) != batch:
            raise ValueError(
                f"{self.name}: got {batch} images but {len(metadata)} metadata entries; pass one per image or None"
            )
        scorer = self.score_vectors if vector else self.score_float if unrounded else self.score_uint8
        extra = {}
        if self.sees_condition:
            if conditions is None:
                raise ValueError(f"{self.name}: judges a result against its source image and got none; train it on a "
                                 "prompt set whose rows carry \"image\" (docs/editing.md), or use a reward that scores "
                                 "the result alone")
            extra["conditions"] = conditions
        out = scorer(images, list(prompts), None if metadata is None else list(metadata), **extra)
        if not isinstance(out, RewardOutput):
            raise RuntimeError(f"{self.name}: score_uint8 returned {type(out).__name__}, expected RewardOutput")
        if out.scores.shape != (batch,) or out.scores.dtype != torch.float32:
            raise RuntimeError(
                f"{self.name}: returned scores {tuple(out.scores.shape)} {out.scores.dtype}, expected ({batch},) float32"
            )
        return out

    def score_uint8(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict] | None
    ) -> RewardOutput:
        """images: uint8 [B, 3, H, W] RGB (or [B, F, 3, H, W] for video rewards)."""
        raise NotImplementedError

    def score_float(self, images: torch.Tensor, prompts: list[str], metadata: list[dict] | None) -> RewardOutput:
        """images: float32 [B, 3, H, W] in [0, 1], not rounded (rewards built with quantize=False)."""
        raise NotImplementedError(f"{self.name}: this reward scores uint8 images only (quantize=False is not offered)")

    def score_vectors(self, x: torch.Tensor, prompts: list[str], metadata: list[dict] | None) -> RewardOutput:
        """x: float32 [B, d] samples (``modality = "vector"`` rewards)."""
        raise NotImplementedError

    def _check_shape(self, images: torch.Tensor) -> None:
        if self.modality not in MODALITIES:
            raise ValueError(f"{self.name}: modality {self.modality!r} is not one of {MODALITIES}")
        shape = tuple(images.shape)
        if self.modality == "vector":
            if images.ndim != 2:
                raise ValueError(f"{self.name}: scores samples [B, d] (the analytic world), got shape {shape}")
            return
        if images.ndim == 2:
            raise ValueError(f"{self.name}: is an {self.modality} reward but got samples {shape} that are not pictures; "
                             "use a vector reward such as analytic_hit")
        if images.ndim == 5 and shape[2] == 3:
            if self.modality == "image":
                raise ValueError(
                    f"{self.name}: is an image reward but got a video batch {shape}; wrap it as "
                    f"rewards.video.PerFrame(reward, reduce='mean') to score videos frame by frame"
                )
            return
        if images.ndim == 4 and shape[1] == 3:
            if self.modality == "video":
                raise ValueError(
                    f"{self.name}: is a video reward and takes [B, F, 3, H, W], got {shape}; "
                    "give single images a frame axis with images.unsqueeze(1)"
                )
            return
        if images.ndim == 5:
            raise ValueError(
                f"{self.name}: videos must be [B, F, 3, H, W] RGB, got shape {shape}; "
                "permute channels-last videos with videos.permute(0, 1, 4, 2, 3)"
            )
        raise ValueError(
            f"{self.name}: images must be [B, 3, H, W] RGB, got shape {shape}; "
            "permute channels-last images with images.permute(0, 3, 1, 2)"
        )

    def to_uint8(self, images: torch.Tensor) -> torch.Tensor:
        """Validate a float batch in [0, 1] ([B, 3, H, W] or, for video rewards, [B, F, 3, H, W]) and
        round it to uint8 of the same shape."""
        return (self.to_unit_float(images) * 255).round().to(torch.uint8)

    def to_unit_float(self, images: torch.Tensor) -> torch.Tensor:
        """Validate a float batch in [0, 1] (shapes as ``to_uint8``) and return it as float32 clamped to [0, 1]."""
        if not isinstance(images, torch.Tensor):
            raise TypeError(f"{self.name}: images must be a torch.Tensor [B, 3, H, W], got {type(images).__name__}")
        self._check_shape(images)
        if not images.is_floating_point():
            raise TypeError(f"{self.name}: images must be float in [0, 1], got {images.dtype}; use images.float() / 255")
        if images.numel():
            lo, hi = images.min().item(), images.max().item()
            if lo < -1e-3 or hi > 1 + 1e-3 or lo != lo or hi != hi:
                raise ValueError(
                    f"{self.name}: images must lie in [0, 1], got range [{lo:.4g}, {hi:.4g}]; "
                    "map [-1, 1] model output with (x / 2 + 0.5).clamp(0, 1)"
                )
        return images.detach().float().clamp(0, 1)

    def to_float32(self, x: torch.Tensor) -> torch.Tensor:
        """Validate samples [B, d] of a vector reward (finite floats) and return them as float32."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{self.name}: samples must be a float torch.Tensor [B, d], got "
                            f"{getattr(x, 'dtype', type(x).__name__)}")
        self._check_shape(x)
        if x.numel() and not bool(torch.isfinite(x).all()):
            raise ValueError(f"{self.name}: samples contain NaN or inf")
        return x.detach().float()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, modality={self.modality!r})"
