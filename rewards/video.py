"""Video rewards. Videos are float [B, F, 3, H, W] in [0, 1] (uint8 of that shape inside score_uint8).

    PerFrame(reward, reduce="mean" | "first" | "every_k", k=4)
        an image reward on the chosen frames, reduced per video: mean over the frames' scores (NaN
        frames skipped; all NaN -> NaN), frame 0 only, or the mean over frames 0, k, 2k, ...
    TemporalConsistency(clip=...)
        mean over consecutive frame pairs of cos(e_t, e_t+1), e = CLIP image embedding. Alone it
        rewards a static video: pair it with a motion term (info["motion"] is the mean absolute
        pixel change between consecutive frames, in [0, 1]).
    VideoAlign(backend, weights={"VQ": 1, "MQ": 1, "TA": 1})
        the hook for VideoAlign-style reward models with visual-quality / motion-quality /
        text-alignment heads: `backend` (a callable or 'module:factory') maps (videos uint8
        [B, F, 3, H, W], prompts) to {head: scores [B]}; the score is the weighted sum of the heads
        (VideoAlign's "Overall" is VQ + MQ + TA). No weights are bundled: bring the model's runner.
"""

from __future__ import annotations

import torch

from rewards.base import Reward, RewardOutput
from rewards.common import import_object, l2_normalize

REDUCTIONS = ("mean", "first", "every_k")


def _nanmean(x: torch.Tensor, dim: int) -> torch.Tensor:
    valid = ~torch.isnan(x)
    total = torch.where(valid, x, torch.zeros_like(x)).sum(dim)
    count = valid.sum(dim)
    return torch.where(count > 0, total / count.clamp_min(1), torch.full_like(total, float("nan")))


class PerFrame(Reward):
    """Lift an image reward to videos. reward: a Reward or a registered name / dotted path
    (built with reward_kwargs); chunk_size: frames per inner call (memory cap)."""

    modality = "video"

    def __init__(self, reward: Reward | str, reduce: str = "mean", k: int = 4, chunk_size: int = 64,
                 reward_kwargs: dict | None = None):
        if isinstance(reward, str):
            from rewards import load_reward

            reward = load_reward(reward, **(reward_kwargs or {}))
        if reward.modality == "video":
            raise ValueError(f"PerFrame wraps image rewards; {reward.name!r} already takes videos")
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
        if int(k) < 1 or int(chunk_size) < 1:
            raise ValueError(f"k and chunk_size must be >= 1, got k={k}, chunk_size={chunk_size}")
        self.reward, self.reduce, self.k, self.chunk_size = reward, reduce, int(k), int(chunk_size)
        self.name = f"{reward.name}_per_frame"

    def frame_indices(self, num_frames: int) -> list[int]:
        if self.reduce == "first":
            return [0]
        if self.reduce == "every_k":
            return list(range(0, num_frames, self.k))
        return list(range(num_frames))

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        batch, num_frames = images.shape[:2]
        index = self.frame_indices(num_frames)
        frames = images[:, index].reshape(batch * len(index), *images.shape[2:])  # [B * F', 3, H, W]
        frame_prompts = [p for p in prompts for _ in index]
        frame_meta = None if metadata is None else [m for m in metadata for _ in index]
        chunks = []
        for start in range(0, len(frame_prompts), self.chunk_size):
            stop = start + self.chunk_size
            chunks.append(self.reward.score(frames[start:stop], frame_prompts[start:stop],
                                            None if frame_meta is None else frame_meta[start:stop]).scores)
        frame_scores = torch.cat(chunks).view(batch, len(index))  # [B, F']
        return RewardOutput(scores=_nanmean(frame_scores, 1).float(),
                            info={"frame_scores": frame_scores, "frames": [index] * batch})


class TemporalConsistency(Reward):
    """Mean cosine similarity of CLIP image embeddings of consecutive frames (see module docstring).
    clip: hub id or folder of a transformers CLIPModel; clip_model: a ready CLIPModel (tests)."""

    name = "temporal_consistency"
    modality = "video"

    def __init__(self, clip: str = "openai/clip-vit-large-patch14", *, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, clip_model=None, chunk_size: int = 64):
        from rewards.clip_rewards import CLIPBackbone

        source = None if clip_model is not None else clip
        self.clip = CLIPBackbone(source, source, model=clip_model, text=False, device=device, dtype=dtype,
                                 crop_rounding="round")
        self.chunk_size = int(chunk_size)

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        batch, num_frames = images.shape[:2]
        if num_frames < 2:
            nan = torch.full((batch,), float("nan"))
            return RewardOutput(scores=nan, info={"motion": nan.clone()})
        flat = images.reshape(batch * num_frames, *images.shape[2:])
        feats = torch.cat([self.clip.image_features(flat[i:i + self.chunk_size])
                           for i in range(0, len(flat), self.chunk_size)])
        feats = l2_normalize(feats).view(batch, num_frames, -1)
        cos = (feats[:, 1:] * feats[:, :-1]).sum(-1)  # [B, F-1]
        motion = (images[:, 1:].float() - images[:, :-1].float()).abs().mean(dim=(1, 2, 3, 4)) / 255.0
        return RewardOutput(scores=cos.mean(1).float(), info={"pair_cosine": cos, "motion": motion})


class VideoAlign(Reward):
    """Weighted sum of a VideoAlign-style model's heads (see module docstring)."""

    name = "videoalign"
    modality = "video"

    def __init__(self, backend, weights: dict[str, float] | None = None, **backend_kwargs):
        if isinstance(backend, str):
            backend = import_object(backend)(**backend_kwargs)
        if not callable(backend):
            raise TypeError("backend must be callable(videos uint8 [B, F, 3, H, W], prompts) -> {head: scores [B]}")
        self.backend = backend
        self.weights = dict(weights or {"VQ": 1.0, "MQ": 1.0, "TA": 1.0})

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        heads = self.backend(images, prompts)
        missing = [h for h in self.weights if h not in heads]
        if missing:
            raise RuntimeError(f"videoalign: backend returned heads {sorted(heads)}, missing {missing}")
        per_head = {h: torch.as_tensor(heads[h], dtype=torch.float32).reshape(-1).cpu() for h in self.weights}
        total = sum(w * per_head[h] for h, w in self.weights.items())
        return RewardOutput(scores=total.float(), info=per_head)
