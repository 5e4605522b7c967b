"""Reward plug-ins: a reward is a small class (see ``rewards.base.Reward``), found by name or path.

``load_reward("pickscore", divide_by=26)`` builds a registered reward; ``load_reward("my_pkg.my_mod:MyReward")``
(or ``my_pkg.my_mod.MyReward``) loads any out-of-tree class with the same contract. Several weighted
rewards, scored asynchronously with retries: ``rewards.runner.RewardRunner``. See docs/rewards.md.
"""

from __future__ import annotations

from rewards.base import Reward, RewardOutput
from rewards.common import import_object

# name -> "module:Class"; imported lazily so optional dependencies load only when used
REGISTRY: dict[str, str] = {
    "toy": "rewards.toy.scorer:ToyScorer",
    "toy_video": "rewards.toy.video_scorer:ToyVideoScorer",
    "toy_dense": "rewards.toy.dense:ToyDense",
    "analytic_hit": "rewards.analytic:AnalyticHit",
    "analytic_smooth": "rewards.analytic:AnalyticSmooth",
    "pickscore": "rewards.clip_rewards:PickScore",
    "clipscore": "rewards.clip_rewards:CLIPScore",
    "hpsv2": "rewards.hps:HPSv2",
    "imagereward": "rewards.image_reward:ImageReward",
    "aesthetic": "rewards.aesthetic:LaionAesthetic",
    "jpeg_compressibility": "rewards.jpeg:JpegCompressibility",
    "jpeg_incompressibility": "rewards.jpeg:JpegIncompressibility",
    "ocr": "rewards.ocr:OCRReward",
    "per_frame": "rewards.video:PerFrame",
    "temporal_consistency": "rewards.video:TemporalConsistency",
    "videoalign": "rewards.video:VideoAlign",
    "remote": "rewards.remote:RemoteReward",
    "vlm_judge": "rewards.vlm:VLMJudge",
}


def load_reward(name: str, **kwargs) -> Reward:
    """Instantiate a reward by registered name or by dotted path ``package.module:Class``."""
    target = REGISTRY.get(name, name)
    if ":" not in target and "." not in target:
        raise ValueError(
            f"unknown reward {name!r}; use one of {sorted(REGISTRY)} or a dotted path such as "
            "'my_package.my_module:MyReward'"
        )
    try:
        cls = import_object(target)
    except ValueError as exc:
        raise ValueError(f"cannot load reward {name!r} from {target!r}: {exc.__cause__ or exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Reward)):
        raise TypeError(f"{target} is not a rewards.base.Reward subclass")
    return cls(**kwargs)


__all__ = ["REGISTRY", "Reward", "RewardOutput", "load_reward"]
