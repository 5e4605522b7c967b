"""Video rewards on a tiny random CLIP: temporal consistency and per-frame model rewards.

Run: .venv/bin/pytest tests/rewards/test_video_rewards.py -q
"""

import pytest
import torch
from tolerance import assert_close_ulps

pytest.importorskip("transformers")
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    from transformers.utils import logging as hf_logging

    from rewards.tiny import tiny_clip_folder

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    return tiny_clip_folder(tmp_path_factory.mktemp("clip") / "clip", image_size=32)


def _videos(batch=2, frames=4, size=32, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(batch, frames, 3, size, size, generator=g) * 255).round() / 255


def test_temporal_consistency_formula(clip_folder):
    from rewards.common import l2_normalize
    from rewards.video import TemporalConsistency

    reward = TemporalConsistency(str(clip_folder))
    videos = _videos()
    out = reward(videos, ["a", "b"])
    uint8 = (videos * 255).round().to(torch.uint8)
    feats = torch.stack([l2_normalize(reward.clip.image_features(v)) for v in uint8])  # [B, F, D]
    expected = torch.stack([torch.stack([feats[b, t] @ feats[b, t + 1] for t in range(3)]).mean() for b in range(2)])
    assert_close_ulps(out.scores, expected, ulps=16)
    expected_motion = (uint8[:, 1:].float() - uint8[:, :-1].float()).abs().mean(dim=(1, 2, 3, 4)) / 255
    torch.testing.assert_close(out.info["motion"], expected_motion)
    static = videos[:, :1].repeat(1, 4, 1, 1, 1)
    still = reward(static, ["a", "b"])
    torch.testing.assert_close(still.scores, torch.ones(2), rtol=0, atol=1e-5)  # a static video is perfectly consistent
    assert (still.info["motion"] == 0).all() and (out.scores < still.scores).all()
    alone = torch.cat([reward(videos[i:i + 1], ["a"]).scores for i in range(2)])
    torch.testing.assert_close(alone, out.scores, rtol=0, atol=1e-5)
    assert torch.isnan(reward(videos[:, :1], ["a", "b"]).scores).all()  # one frame: not applicable


def test_per_frame_pickscore_equals_the_mean_of_frame_scores(clip_folder):
    from rewards.clip_rewards import PickScore
    from rewards.video import PerFrame

    pick = PickScore(str(clip_folder), str(clip_folder))
    videos = _videos(frames=5)
    prompts = ["a photo of a cat", "two dogs"]
    per_frame = PerFrame(pick, "every_k", k=2)(videos, prompts)
    expected = torch.stack([pick(videos[b, [0, 2, 4]], [prompts[b]] * 3).scores.mean() for b in range(2)])
    assert_close_ulps(per_frame.scores, expected, ulps=16)  # frames in one batch vs three per video
    assert per_frame.info["frame_scores"].shape == (2, 3)
