"""The image-statistic rewards (rewards/stats.py): the watch's measures as rewards, by hand."""

import torch

from rewards.stats import MeanBrightness, MeanRedness, MeanSaturation


def test_brightness_and_saturation_rewards_by_hand():
    grey = torch.full((2, 3, 8, 8), 0.5)
    red = torch.zeros(1, 3, 8, 8)
    red[:, 0] = 1.0
    assert torch.allclose(MeanBrightness()(grey, ["a", "b"]).scores, torch.full((2,), 128 / 255), atol=1e-6)
    assert torch.allclose(MeanSaturation()(red, ["a"]).scores, torch.ones(1))
    assert torch.allclose(MeanSaturation()(grey, ["a", "b"]).scores, torch.zeros(2))
    video = torch.full((1, 3, 3, 8, 8), 1.0)
    assert torch.allclose(MeanBrightness()(video, ["a"]).scores, torch.ones(1), atol=1e-6)


def test_redness_reward_by_hand():
    img = torch.full((3, 3, 4, 4), 0.5)  # grey, then orange (1, 0.5, 0) on half the pixels, then magenta (1, 0, 1)
    img[1, 0, :2], img[1, 1, :2], img[1, 2, :2] = 1.0, 128 / 255, 0.0
    img[2, 0], img[2, 1], img[2, 2] = 1.0, 0.0, 1.0
    scores = MeanRedness()(img, ["a", "b", "c"]).scores
    assert torch.allclose(scores, torch.tensor([0.0, 0.5 * (1 - 128 / 255), 0.0]), atol=1e-6)

