"""The reward contract, the registry, the formula rewards (JPEG, OCR), video wrappers and the async runner.

Run: .venv/bin/pytest tests/rewards/test_contract.py -q
"""

import io
import logging
import math
import sys
import threading
import time
import types

import pytest
import torch
from PIL import Image

from rewards import REGISTRY, Reward, RewardOutput, load_reward
from rewards.runner import RewardRunner, RewardSpec, build_rewards

torch.set_num_threads(1)


class MeanBrightness(Reward):
    """A test reward: mean pixel value in [0, 1]; NaN for prompts that start with 'skip'."""

    name = "brightness"

    def __init__(self, offset: float = 0.0):
        self.offset = offset
        self.calls = 0

    def score_uint8(self, images, prompts, metadata):
        self.calls += 1
        scores = images.float().mean(dim=tuple(range(1, images.ndim))) / 255 + self.offset
        scores[torch.tensor([p.startswith("skip") for p in prompts], dtype=torch.bool)] = math.nan
        return RewardOutput(scores=scores.float(), info={"calls": self.calls})


class Flaky(Reward):
    """Fails the first `failures` calls, then scores 1."""

    name = "flaky"

    def __init__(self, failures: int):
        self.failures, self.calls = failures, 0

    def score_uint8(self, images, prompts, metadata):
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"reward server away (call {self.calls})")
        return RewardOutput(scores=torch.ones(len(prompts)))


class WrongShape(Reward):
    name = "wrong_shape"

    def score_uint8(self, images, prompts, metadata):
        return RewardOutput(scores=torch.ones(len(prompts) + 1))


class VideoOnly(Reward):
    name = "video_only"
    modality = "video"

    def score_uint8(self, images, prompts, metadata):
        return RewardOutput(scores=images.float().mean(dim=(1, 2, 3, 4)) / 255)


def _batch(values, size=8) -> torch.Tensor:
    """float [B, 3, size, size] images of constant value v/255 each."""
    return torch.stack([torch.full((3, size, size), v / 255) for v in values])


# ----------------------------------------------------------------------------- contract


def test_shapes_are_validated_with_errors_naming_the_fix():
    reward = MeanBrightness()
    image, video = _batch([10, 20]), _batch([10, 20]).unsqueeze(1).repeat(1, 3, 1, 1, 1)
    with pytest.raises(ValueError, match=r"image reward but got a video batch.*PerFrame"):
        reward(video, ["a", "b"])
    with pytest.raises(ValueError, match=r"video reward and takes \[B, F, 3, H, W\].*unsqueeze\(1\)"):
        VideoOnly()(image, ["a", "b"])
    with pytest.raises(ValueError, match=r"videos must be \[B, F, 3, H, W\].*permute\(0, 1, 4, 2, 3\)"):
        VideoOnly()(video.permute(0, 1, 3, 4, 2), ["a", "b"])
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\].*permute\(0, 3, 1, 2\)"):
        reward(image.permute(0, 2, 3, 1), ["a", "b"])
    with pytest.raises(ValueError, match="got 2 images but a single string"):
        reward(image, "a")
    with pytest.raises(ValueError, match="2 images but 1 metadata"):
        reward(image, ["a", "b"], [{}])
    with pytest.raises(RuntimeError, match=r"returned scores \(3,\).*expected \(2,\) float32"):
        WrongShape()(image, ["a", "b"])
    with pytest.raises(TypeError, match="uint8"):
        reward.score(image, ["a", "b"])
    assert torch.allclose(VideoOnly()(video, ["a", "b"]).scores, torch.tensor([10, 20]) / 255)


def test_both_modality_takes_images_and_videos():
    class Both(MeanBrightness):
        modality = "both"

    out_image = Both()(_batch([30]), ["a"])
    out_video = Both()(_batch([30]).unsqueeze(1), ["a"])
    assert torch.allclose(out_image.scores, out_video.scores) and out_image.scores.dtype == torch.float32


def test_registry_names_resolve_to_reward_classes():
    from rewards.common import import_object

    expected = {"toy", "pickscore", "clipscore", "hpsv2", "imagereward", "aesthetic", "jpeg_compressibility",
                "jpeg_incompressibility", "ocr", "per_frame", "temporal_consistency", "videoalign", "remote",
                "vlm_judge", "analytic_hit", "analytic_smooth"}
    assert expected <= set(REGISTRY)
    for name, target in REGISTRY.items():
        cls = import_object(target)
        assert issubclass(cls, Reward), name
        assert cls.modality in ("image", "video", "both", "vector"), name
    assert load_reward("toy").name == "toy"
    assert load_reward("jpeg_compressibility", quality=80).quality == 80


def test_out_of_tree_plugin_by_dotted_path(monkeypatch):
    module = types.ModuleType("my_plugins")
    module.Bright = MeanBrightness
    module.NotAReward = dict
    monkeypatch.setitem(sys.modules, "my_plugins", module)
    for path in ("my_plugins:Bright", "my_plugins.Bright"):
        reward = load_reward(path, offset=1.0)
        assert isinstance(reward, MeanBrightness) and reward.offset == 1.0
    with pytest.raises(ValueError, match="is not a reward: name a rewards.base.Reward subclass"):
        load_reward("my_plugins:NotAReward")
    with pytest.raises(ValueError, match="cannot import reward 'my_plugins:Missing'"):
        load_reward("my_plugins:Missing")
    with pytest.raises(ValueError, match="unknown reward 'nope'.*dotted path"):
        load_reward("nope")


def test_missing_optional_dependency_names_the_extra(monkeypatch):
    from rewards.common import require

    monkeypatch.setitem(sys.modules, "paddleocr", None)  # import paddleocr -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'flowgrpo\[ocr\]'"):
        load_reward("ocr")
    with pytest.raises(ImportError, match=r"'definitely_absent_pkg'.*flowgrpo\[video\]"):
        require("definitely_absent_pkg", "video", "MP4 decoding")


# ----------------------------------------------------------------------------- JPEG


def test_jpeg_rewards_are_minus_and_plus_size_kb_over_500():
    g = torch.Generator().manual_seed(0)
    images = torch.cat([_batch([128], 32), torch.rand(1, 3, 32, 32, generator=g)])  # flat vs noise
    compress = load_reward("jpeg_compressibility")(images, ["a", "b"])
    incompress = load_reward("jpeg_incompressibility")(images, ["a", "b"])
    sizes = []
    for image in (images * 255).round().to(torch.uint8):
        buffer = io.BytesIO()
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(buffer, format="JPEG", quality=95)
        sizes.append(len(buffer.getvalue()) / 1000)
    assert torch.allclose(compress.scores, -torch.tensor(sizes) / 500)
    assert torch.allclose(incompress.scores, torch.tensor(sizes) / 500)
    assert compress.scores[0] > compress.scores[1]  # the flat image compresses better


# ----------------------------------------------------------------------------- OCR


def test_ocr_formula_and_normalisation():
    from rewards.ocr import levenshtein, ocr_score

    assert levenshtein("kitten", "sitting") == 3 and levenshtein("", "abc") == 3 and levenshtein("abc", "abc") == 0
    assert ocr_score("Hello World", "hello world") == 1.0  # spaces and case ignored
    assert ocr_score("hello", "hallo") == pytest.approx(1 - 1 / 5)
    assert ocr_score("hello", "") == 0.0  # distance capped at len(target)
    assert ocr_score("hi", "a much longer text") == 0.0
    assert ocr_score("hello", "say hello there") == 0.0  # Lev = 8 > 5: capped, so no credit...
    assert ocr_score("hello", "sayhello", full_credit_if_contained=True) == 1.0
    assert math.isnan(ocr_score("  ", "x"))


def test_ocr_reward_with_a_pluggable_reader():
    reads = iter(["HELLO", "wrld", "unused"])
    reward = load_reward("ocr", reader=lambda image: next(reads))
    out = reward(_batch([0, 0, 0]), ['a sign that says "Hello"', 'a sign that says "world"', "no quoted text"],
                 [{}, {}, {}])
    assert out.scores[0] == 1.0 and out.scores[1] == pytest.approx(0.8) and math.isnan(out.scores[2])
    assert out.info["target"] == ["Hello", "world", None]
    meta = reward(_batch([0]), ["no quotes"], [{"ocr_text": "unused"}])  # metadata target wins
    assert meta.scores[0] == 1.0


# ----------------------------------------------------------------------------- video wrappers


def _video(values_per_frame: list[list[int]]) -> torch.Tensor:
    """float [B, F, 3, 8, 8]; values_per_frame[b][f] is frame f's constant value (0-255)."""
    return torch.stack([_batch(frames) for frames in values_per_frame])


def test_per_frame_reductions():
    from rewards.video import PerFrame

    video = _video([[0, 51, 102, 153, 204], [255, 0, 0, 0, 255]])
    bright = MeanBrightness()
    mean = PerFrame(bright, "mean")(video, ["a", "b"])
    assert torch.allclose(mean.scores, torch.tensor([0.4, 0.4]))
    assert mean.info["frame_scores"].shape == (2, 5)
    assert torch.allclose(PerFrame(bright, "first")(video, ["a", "b"]).scores, torch.tensor([0.0, 1.0]))
    every2 = PerFrame(bright, "every_k", k=2, chunk_size=3)(video, ["a", "b"])  # frames 0, 2, 4
    assert torch.allclose(every2.scores, torch.tensor([0.4, 2 / 3]))
    assert every2.info["frames"] == [[0, 2, 4], [0, 2, 4]]
    skipped = PerFrame(bright)(video, ["skip", "b"])
    assert math.isnan(skipped.scores[0]) and skipped.scores[1] == pytest.approx(0.4)
    assert PerFrame("jpeg_compressibility").name == "jpeg_compressibility_per_frame"
    with pytest.raises(ValueError, match="reduce must be one of"):
        PerFrame(bright, "max")
    with pytest.raises(ValueError, match="already takes videos"):
        PerFrame(VideoOnly())


def test_videoalign_hook_weights_the_heads():
    from rewards.video import VideoAlign

    def backend(videos, prompts):
        brightness = videos.float().mean(dim=(1, 2, 3, 4)) / 255
        return {"VQ": brightness, "MQ": 2 * brightness, "TA": torch.tensor([len(p) for p in prompts]).float()}

    video = _video([[51, 51], [102, 102]])
    out = VideoAlign(backend)(video, ["ab", "abc"])
    assert torch.allclose(out.scores, torch.tensor([0.6 + 2, 1.2 + 3]))
    out = VideoAlign(backend, weights={"VQ": 1.0, "TA": 0.5})(video, ["ab", "abc"])
    assert torch.allclose(out.scores, torch.tensor([0.2 + 1, 0.4 + 1.5])) and set(out.info) == {"VQ", "TA"}
    with pytest.raises(RuntimeError, match="missing \\['XX'\\]"):
        VideoAlign(backend, weights={"XX": 1.0})(video, ["a", "b"])


# ----------------------------------------------------------------------------- runner


def test_runner_weights_and_per_reward_scores():
    specs = [{"name": "jpeg_compressibility", "weight": 2.0}, {"name": "jpeg_incompressibility", "weight": 0.5},
             {"name": "jpeg_compressibility", "weight": 0.0, "key": "logged_only"}]
    with RewardRunner(specs) as runner:
        result = runner.score(_batch([0, 100]), ["a", "b"])
    c, i = result.scores["jpeg_compressibility"], result.scores["jpeg_incompressibility"]
    assert torch.allclose(c, -i) and result.weights == {"jpeg_compressibility": 2.0, "jpeg_incompressibility": 0.5,
                                                        "logged_only": 0.0}
    assert torch.allclose(result.total, 2.0 * c + 0.5 * i) and result.valid.all() and result.matrix().shape == (2, 3)
    with pytest.raises(ValueError, match="appears twice"):
        build_rewards(["toy", "toy"])
    with pytest.raises(ValueError, match="unknown keys \\['wieght'\\]"):
        RewardSpec.parse({"name": "toy", "wieght": 1})


def test_runner_accepts_config_dataclasses():
    from dataclasses import dataclass, field

    @dataclass
    class ConfigSpec:  # the shape of flowgrpo.config.RewardSpec
        name: str = "jpeg_compressibility"
        weight: float = 3.0
        kwargs: dict = field(default_factory=lambda: {"quality": 90})

    reward, weight = build_rewards([ConfigSpec()])["jpeg_compressibility"]
    assert weight == 3.0 and reward.quality == 90


def test_runner_retries_then_succeeds():
    flaky = Flaky(failures=2)
    with RewardRunner({"flaky": (flaky, 1.0)}, retries=2, backoff_s=0.001) as runner:
        result = runner.score(_batch([0, 0]), ["a", "b"])
    assert flaky.calls == 3 and result.errors == {} and torch.equal(result.total, torch.ones(2))


def test_runner_marks_a_failed_reward_nan_logs_it_and_keeps_going(caplog):
    flaky, bright = Flaky(failures=10), MeanBrightness()
    rewards = {"flaky": (flaky, 1.0), "brightness": (bright, 1.0), "wrong": (WrongShape(), 0.0)}
    with caplog.at_level(logging.WARNING, logger="rewards.runner"), RewardRunner(rewards, retries=1,
                                                                                   backoff_s=0.001) as runner:
        result = runner.score(_batch([51, 102]), ["a", "b"])
        again = runner.score(_batch([51]), ["skip me"])  # the runner still works afterwards
    assert flaky.calls == 4  # 2 attempts for each of the two batches
    assert torch.isnan(result.scores["flaky"]).all() and "ConnectionError" in result.errors["flaky"]
    assert torch.allclose(result.scores["brightness"], torch.tensor([0.2, 0.4]))
    assert torch.isnan(result.total).all() and not result.valid.any()  # never trained on
    assert "returned scores (3,)" in result.errors["wrong"]  # a malformed output counts as a failure
    assert "failed after 2 attempts" in caplog.text
    assert not again.valid.any() and math.isnan(again.scores["brightness"][0])  # NaN = not applicable
    skip = RewardRunner({"flaky": (Flaky(100), 1.0), "brightness": (MeanBrightness(), 1.0)}, retries=0,
                        nan_policy="skip").score(_batch([51]), ["a"])
    assert skip.valid.all() and skip.total[0] == pytest.approx(0.2)


def test_runner_overlaps_scoring_with_the_caller_and_snapshots_inputs():
    release = threading.Event()

    class Slow(MeanBrightness):
        def score_uint8(self, images, prompts, metadata):
            release.wait(5)
            return super().score_uint8(images, prompts, metadata)

    with RewardRunner({"slow": (Slow(), 1.0)}, max_workers=2) as runner:
        images = _batch([51, 51])
        started = time.perf_counter()
        first = runner.submit(images, ["a", "b"])
        second = runner.submit(images * 0, ["a", "b"])
        images.fill_(1.0)  # the sampler reuses its buffer: the runner scored a copy
        assert time.perf_counter() - started < 1.0 and not first.done()
        release.set()
        assert torch.allclose(first.result(timeout=5).total, torch.tensor([0.2, 0.2]))
        assert torch.allclose(second.result(timeout=5).total, torch.zeros(2))
