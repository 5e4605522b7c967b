"""Reward plug-ins: a reward is a small class (see ``rewards.base.Reward``), found by name or path.

``load_reward("pickscore", divide_by=26)`` builds a registered reward; ``load_reward("my_pkg.my_mod:MyReward")``
(or ``my_pkg.my_mod.MyReward``) loads any out-of-tree class with the same contract. Several weighted
rewards, scored asynchronously with retries: ``rewards.runner.RewardRunner``. See docs/rewards.md.
"""

from __future__ import annotations

import difflib

from rewards.base import Reward, RewardOutput
from rewards.common import import_object

# name -> "module:Class"; imported lazily so optional dependencies load only when used
REGISTRY: dict[str, str] = {
    "toy": "rewards.toy.scorer:ToyScorer",
    "toy_edit": "rewards.toy.edit_scorer:ToyEditScorer",
    "toy_edit_dense": "rewards.toy.edit_scorer:ToyEditDense",
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
    "geneval": "rewards.geneval:GenEval",
    "per_frame": "rewards.video:PerFrame",
    "temporal_consistency": "rewards.video:TemporalConsistency",
    "videoalign": "rewards.video:VideoAlign",
    "remote": "rewards.remote:RemoteReward",
    "vlm_judge": "rewards.vlm:VLMJudge",
    "vlm_edit_judge": "rewards.vlm:VLMEditJudge",
    "preservation": "rewards.preservation:Preservation",
    "clip_image_similarity": "rewards.clip_rewards:CLIPImageSimilarity",
}


class RewardLookupError(ValueError):
    """A reward name or path that names no reward class; the message names the fix."""


def reward_class(name: str, where: str = "") -> type:
    """The one resolver of a reward: the Reward subclass that ``name`` refers to (a registered name, or
    ``package.module:Class`` / ``package.module.Class``), imported, not built. ``where`` (a config key or option) is
    named in the error."""
    at = f" in {where}" if where else ""
    target = REGISTRY.get(name, name) if isinstance(name, str) else ""
    if ":" not in target and "." not in target:
        close = difflib.get_close_matches(str(name), list(REGISTRY), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise RewardLookupError(f"unknown reward {name!r}{at}; {hint}use a registered reward "
                                f"({', '.join(sorted(REGISTRY))}) or a dotted path such as 'my_package.my_module:MyReward'")
    try:
        cls = import_object(target)
    except ValueError as exc:
        cause = exc.__cause__ or exc
        raise RewardLookupError(f"cannot import reward {name!r}{f' ({where})' if where else ''}: {cause}; check the "
                                "module path and that its package is installed (docs/rewards.md)") from None
    if not (isinstance(cls, type) and issubclass(cls, Reward)):
        raise RewardLookupError(f"{name!r}{f' ({where})' if where else ''} is not a reward: name a rewards.base.Reward "
                                "subclass (docs/rewards.md)")
    return cls


def load_reward(name: str, **kwargs) -> Reward:
    """Instantiate a reward by registered name or by dotted path ``package.module:Class`` (``reward_class``)."""
    return reward_class(name)(**kwargs)


__all__ = ["REGISTRY", "Reward", "RewardLookupError", "RewardOutput", "load_reward", "reward_class"]
