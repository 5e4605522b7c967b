"""The image-statistic rewards (rewards/stats.py): the watch's measures as rewards, by hand."""

import torch

from rewards.stats import MeanBrightness, MeanSaturation


def test_brightness_and_saturation_rewards_by_hand():
    grey = torch.full((2, 3, 8, 8), 0.5)
    red = torch.zeros(1, 3, 8, 8)
    red[:, 0] = 1.0
    assert torch.allclose(MeanBrightness()(grey, ["a", "b"]).scores, torch.full((2,), 128 / 255), atol=1e-6)
    assert torch.allclose(MeanSaturation()(red, ["a"]).scores, torch.ones(1))
    assert torch.allclose(MeanSaturation()(grey, ["a", "b"]).scores, torch.zeros(2))
    video = torch.full((1, 3, 3, 8, 8), 1.0)
    assert torch.allclose(MeanBrightness()(video, ["a"]).scores, torch.ones(1), atol=1e-6)
