"""The reward options that reproduce the official scorers' scales and preprocessing (docs/rewards.md, measured against
the official code by reproduce/scorers/: docs/results/scorer_parity.md), each against a hand formula, no checkout:

    quantize=False            (base: clipscore, hpsv2)  the float images scored unrounded
    clipscore preprocess      "tensor": torchvision Resize (bilinear) + CenterCrop + Normalize on the float tensor
    clipscore logit_scale     exp(logit_scale)·cos instead of 100·cos;  clamp=False: no max(·, 0)
    pickscore offset          (exp(logit_scale)·cos − offset) / divide_by
    vlm_judge parse="first"   the first 'Final Score: [1-5]...', 0 when none
"""

import math

import pytest
import torch

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["a photo of a cat", "a red circle", 'a sign that says "hi"']


def _float_images(n=3, size=40, seed=0) -> torch.Tensor:
    """float [n, 3, size, size] in [0, 1], off the uint8 grid (as a VAE decode hands them)."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, 5, 5, generator=g)
    return torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear").clamp(0, 1)


@pytest.fixture(scope="module")
def tiny_clip():
    from rewards.tiny import byte_clip_tokenizer, tiny_clip_model

    tokenizer = byte_clip_tokenizer()
    model = tiny_clip_model(tokenizer, image_size=32)
    with torch.no_grad():
        model.logit_scale.fill_(1.5)  # exp = 4.48: a scale that is not 100, so the two scales differ
    return model, tokenizer


def _logits(model, tokenizer, pixels, prompts):
    """CLIPModel's own logits_per_image (exp(logit_scale)·cos) on ready pixels."""
    tokens = tokenizer(prompts, padding="max_length", truncation=True, max_length=77, return_tensors="pt")
    with torch.no_grad():
        out = model(pixel_values=pixels, input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
    return out.logits_per_image.diagonal()


def _tensor_pixels(x, size):
    import torchvision.transforms as T

    from rewards.common import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    return T.Compose([T.Resize(size), T.CenterCrop((size, size)), T.Normalize(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)])(x)


def test_clipscore_official_scale_options_against_clipmodel_logits(tiny_clip):
    """quantize=False, preprocess='tensor', logit_scale=True, clamp=False, divide_by=100: CLIPModel's
    logits_per_image / 100 on torchvision's tensor transform of the float images (DiffusionNFT's ClipScorer)."""
    from rewards.clip_rewards import CLIPScore

    model, tokenizer = tiny_clip
    x = _float_images()
    reward = CLIPScore(model=model, tokenizer=tokenizer, quantize=False, preprocess="tensor", logit_scale=True,
                       clamp=False, divide_by=100)
    expected = _logits(model, tokenizer, _tensor_pixels(x, 32), PROMPTS) / 100
    torch.testing.assert_close(reward(x, PROMPTS).scores, expected, rtol=0, atol=1e-6)


def test_clipscore_logit_scale_and_clamp_each_alone(tiny_clip):
    from rewards.clip_rewards import CLIPScore

    model, tokenizer = tiny_clip
    x = _float_images()
    base = CLIPScore(model=model, tokenizer=tokenizer, clamp=False)
    cos = base(x, PROMPTS).info["cosine"]
    torch.testing.assert_close(base(x, PROMPTS).scores, 100 * cos)
    scaled = CLIPScore(model=model, tokenizer=tokenizer, logit_scale=True, clamp=False, divide_by=30)
    torch.testing.assert_close(scaled(x, PROMPTS).scores, math.exp(1.5) * cos / 30)
    clamped = CLIPScore(model=model, tokenizer=tokenizer)  # the defaults: 100·max(cos, 0)
    torch.testing.assert_close(clamped(x, PROMPTS).scores, 100 * cos.clamp_min(0))


def test_quantize_false_scores_the_float_images_and_true_rounds_them(tiny_clip):
    from rewards.clip_rewards import CLIPScore

    model, tokenizer = tiny_clip
    x = _float_images()
    rounded = (x * 255).round() / 255
    floats = CLIPScore(model=model, tokenizer=tokenizer, quantize=False, preprocess="tensor", clamp=False)
    rounds = CLIPScore(model=model, tokenizer=tokenizer, preprocess="tensor", clamp=False)
    assert torch.equal(rounds(x, PROMPTS).scores, rounds(rounded, PROMPTS).scores)
    assert torch.equal(rounds(x, PROMPTS).scores, floats(rounded, PROMPTS).scores)  # uint8/255 == the grid floats
    assert not torch.equal(floats(x, PROMPTS).scores, floats(rounded, PROMPTS).scores)
    with pytest.raises(TypeError, match="quantize=False"):
        floats.score((x * 255).round().to(torch.uint8), PROMPTS)
    assert floats.score(x, PROMPTS).scores.shape == (3,)


def test_quantize_false_needs_the_tensor_preprocessing(tiny_clip):
    from rewards.clip_rewards import CLIPScore

    model, tokenizer = tiny_clip
    with pytest.raises(ValueError, match="preprocess='tensor'"):
        CLIPScore(model=model, tokenizer=tokenizer, quantize=False)
    with pytest.raises(ValueError, match="preprocess"):
        CLIPScore(model=model, tokenizer=tokenizer, preprocess="bilinear")


def test_a_reward_without_a_float_path_says_so():
    from rewards.jpeg import JpegCompressibility

    reward = JpegCompressibility()
    reward.quantize = False
    with pytest.raises(NotImplementedError, match="uint8 images only"):
        reward(_float_images(), PROMPTS)


def test_pickscore_offset_and_divide_by(tiny_clip):
    from rewards.clip_rewards import PickScore

    model, tokenizer = tiny_clip
    x = _float_images()
    raw = PickScore(model=model, tokenizer=tokenizer, processor=None)(x, PROMPTS).scores
    torch.testing.assert_close(raw, math.exp(1.5) * PickScore(model=model, tokenizer=tokenizer, processor=None)(
        x, PROMPTS).info["cosine"])
    mix = PickScore(model=model, tokenizer=tokenizer, processor=None, offset=18, divide_by=8)(x, PROMPTS).scores
    torch.testing.assert_close(mix, (raw - 18) / 8)
    nft = PickScore(model=model, tokenizer=tokenizer, processor=None, divide_by=26)(x, PROMPTS).scores
    torch.testing.assert_close(nft, raw / 26)


def test_hpsv2_quantize_false_against_the_hand_formula():
    pytest.importorskip("open_clip")
    from rewards.common import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
    from rewards.hps import HPSv2
    from rewards.tiny import TINY_HPS_ARCH, tiny_hps_model

    model = tiny_hps_model()
    x = _float_images(size=48)
    reward = HPSv2(arch=TINY_HPS_ARCH, model=model, quantize=False)
    pixels = torch.nn.functional.interpolate(x, size=(32, 32), mode="bicubic", align_corners=False, antialias=True)
    mean, std = torch.tensor(OPENAI_CLIP_MEAN).view(3, 1, 1), torch.tensor(OPENAI_CLIP_STD).view(3, 1, 1)
    with torch.no_grad():
        image = model.encode_image((pixels - mean) / std, normalize=True)
        text = model.encode_text(reward.tokenizer(PROMPTS), normalize=True)
    torch.testing.assert_close(reward(x, PROMPTS).scores, (image * text).sum(-1), rtol=0, atol=1e-6)
    rounded = HPSv2(arch=TINY_HPS_ARCH, model=model)  # the default: rounded to uint8 first
    assert torch.equal(rounded(x, PROMPTS).scores, reward((x * 255).round() / 255, PROMPTS).scores)


@pytest.mark.parametrize("text, last, first", [
    ("ok.\nFinal Score: 4", 0.8, 0.8),
    ("Final Score: 5\nlater Final Score: 2", 0.4, 1.0),
    ("Final Score: 7", math.nan, 0.0),
    ("Final Score: 45", math.nan, 0.8),  # the official pattern reads the first digit
    ("final score: 4", 0.8, 0.0),  # the official pattern is case-sensitive
    ("Final Score: **3**", 0.6, 0.0),
    ("Final Score: 4.25", 0.85, 0.85),
    ("no score", math.nan, 0.0),
])
def test_vlm_parse_first_is_the_unifiedreward_rule(text, last, first):
    from rewards.vlm import parse_score

    got_last, got_first = parse_score(text), parse_score(text, parse="first")
    assert (math.isnan(got_last) and math.isnan(last)) or got_last == pytest.approx(last)
    assert got_first == pytest.approx(first)


def test_vlm_parse_is_checked():
    from rewards.vlm import VLMJudge, parse_score

    with pytest.raises(ValueError, match="parse"):
        VLMJudge("http://127.0.0.1:9/v1", "m", parse="middle")
    with pytest.raises(ValueError, match="parse"):
        parse_score("Final Score: 3", parse="middle")
