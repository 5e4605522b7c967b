"""Image-statistic rewards: what a reward model should never be, kept as the tiny world's reproducible hacks.

``MeanBrightness`` pays for mean luminance and ``MeanSaturation`` for mean colour saturation (the same measures
as the watch's guards, flowgrpo/engine/watch.py). Trained on, they climb in tens of iterations by erasing or
recolouring the objects the prompts ask for, while the held-out ``toy`` reward falls: benchmarks/bench_hacking.py
uses them to check that the reward-hacking watch fires (docs/hacking.md). Load them by dotted path:
``rewards=[{name: 'rewards.stats:MeanBrightness'}]``.
"""

from __future__ import annotations

from rewards.base import Reward, RewardOutput


class MeanBrightness(Reward):
    name = "mean_brightness"
    modality = "both"

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        from flowgrpo.engine.watch import brightness

        return RewardOutput(brightness(images.float() / 255.0).float())


class MeanSaturation(Reward):
    name = "mean_saturation"
    modality = "both"

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        from flowgrpo.engine.watch import saturation

        return RewardOutput(saturation(images.float() / 255.0).float())
