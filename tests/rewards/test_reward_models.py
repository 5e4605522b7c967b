"""Model rewards on tiny random-weight models of the original architectures (no downloads):
PickScore, CLIPScore, LAION aesthetic, HPSv2.1, ImageReward.

For each: the preprocessing equals the original's reference implementation (transformers'
CLIPImageProcessor with the PIL backend, torchvision transforms), the score formula recomputed from the
model's parts, batch independence, determinism, and the loading path from a checkpoint saved in the
original's file format.

Run: .venv/bin/pytest tests/rewards/test_reward_models.py -q
"""

import json
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from rewards.common import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, resize_center_crop, resize_longest_pad
from tolerance import assert_close_ulps

pytest.importorskip("transformers")
torch.set_num_threads(1)
warnings.filterwarnings("ignore", message=".*bos_token_id.*")

PROMPTS = ["a photo of a cat", "a red circle left of a blue square", 'a sign that says "hello"', "two dogs"]


@pytest.fixture(scope="module", autouse=True)
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _images(n=4, height=40, width=52, seed=0) -> torch.Tensor:
    """float [n, 3, H, W] in [0, 1] on the uint8 grid, smooth enough that resizing matters."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, height // 4, width // 4, generator=g)
    return (torch.nn.functional.interpolate(coarse, size=(height, width), mode="bilinear") * 255).round() / 255


def _uint8(images: torch.Tensor) -> torch.Tensor:
    return (images * 255).round().to(torch.uint8)


def _pil(image_uint8: torch.Tensor) -> Image.Image:
    return Image.fromarray(image_uint8.permute(1, 2, 0).numpy())


def _check_batch_independence_and_determinism(reward, images, prompts):
    together = reward(images, prompts).scores
    again = reward(images, prompts).scores
    assert torch.equal(together, again), "same input, different scores"
    alone = torch.cat([reward(images[i:i + 1], prompts[i:i + 1]).scores for i in range(len(prompts))])
    # a batch and single rows round differently: measured up to 3.4 ulps of the scores' magnitude here
    # (1 and 2 threads), 3.2 on another x86; a prompt or image leaking across rows moves a score by far more
    assert_close_ulps(alone, together, ulps=16, msg="batch vs one at a time")
    flipped = reward(images.flip(0), prompts[::-1]).scores
    assert_close_ulps(flipped, together.flip(0), ulps=16, msg="batch order")
    assert together.std() > 0, "the tiny model does not tell the samples apart; the test would be vacuous"


# ----------------------------------------------------------------------------- preprocessing


def test_clip_processor_preprocessing_equals_transformers_pil_processor():
    from transformers import CLIPImageProcessorPil

    images = _uint8(_images(height=45, width=61))  # odd margins: floor vs round crop differ
    processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    reference = processor(images=[_pil(x) for x in images], return_tensors="pt")["pixel_values"]
    ours = resize_center_crop(images, 32, 32, rounding="floor")
    assert_close_ulps(ours, reference, ulps=8)  # one uint8 level is 0.0145 after normalising: ~57,000 ulps
    assert not torch.allclose(resize_center_crop(images, 32, 32, rounding="round"), reference)


def test_torchvision_style_preprocessing_equals_torchvision_transforms():
    import torchvision.transforms as T

    images = _uint8(_images(height=45, width=61))
    original = T.Compose([T.Resize(32, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(32), T.ToTensor(),
                          T.Normalize(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)])  # openai/clip, BLIP, ImageReward
    reference = torch.stack([original(_pil(x)) for x in images])
    assert_close_ulps(resize_center_crop(images, 32, 32, rounding="round"), reference, ulps=8)


def test_independent_numpy_resize_crop_normalise():
    images = _uint8(_images(n=1, height=48, width=64))
    pil = _pil(images[0]).resize((42, 32), Image.BICUBIC)  # shortest side 48 -> 32, long side int(32 * 64 / 48)
    arr = np.asarray(pil)[:, 5:37].astype(np.float64) / 255  # centre crop 32 of 42: margin 5
    expected = (arr - np.array(OPENAI_CLIP_MEAN)) / np.array(OPENAI_CLIP_STD)
    ours = resize_center_crop(images, 32, 32, rounding="floor")[0].permute(1, 2, 0).double().numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-5)


@pytest.mark.parametrize("shape", [(40, 52), (52, 40), (32, 32), (16, 24)])
def test_hps_preprocessing_equals_torchvision_tensor_transforms(shape):
    """HPSv2's val transform: ToTensor, ResizeMaxSize(224) (bicubic tensor resize, zero pad), normalise."""
    import torchvision.transforms.functional as TF

    images = _uint8(_images(n=2, height=shape[0], width=shape[1]))
    for image, ours in zip(images, resize_longest_pad(images, 32)):
        x = TF.to_tensor(_pil(image))
        height, width = x.shape[1:]
        scale = 32 / max(height, width)
        if scale != 1.0:
            new = [round(height * scale), round(width * scale)]
            x = TF.resize(x, new, TF.InterpolationMode.BICUBIC, antialias=True)
            pad_h, pad_w = 32 - new[0], 32 - new[1]
            x = TF.pad(x, [pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2], fill=0)
        assert_close_ulps(ours, TF.normalize(x, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD), ulps=8)
        assert ours.shape == (3, 32, 32)


def test_inputs_are_rounded_to_uint8_once():
    from rewards.jpeg import JpegCompressibility

    reward = JpegCompressibility()
    images = _images()
    jitter = (torch.rand(images.shape, generator=torch.Generator().manual_seed(1)) - 0.5) * 0.9 / 255
    assert torch.equal(reward(images, PROMPTS).scores, reward((images + jitter).clamp(0, 1), PROMPTS).scores)


# ----------------------------------------------------------------------------- CLIP rewards


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    from rewards.tiny import tiny_clip_folder

    return tiny_clip_folder(tmp_path_factory.mktemp("pickscore") / "PickScore_v1", image_size=32)


def _reference_logits(folder, images, prompts):
    """exp(logit_scale) * cos via CLIPModel.forward on the reference processor's pixels."""
    from transformers import AutoTokenizer, CLIPImageProcessorPil, CLIPModel

    model = CLIPModel.from_pretrained(folder).eval()
    processor = CLIPImageProcessorPil.from_pretrained(folder)
    pixels = processor(images=[_pil(x) for x in _uint8(images)], return_tensors="pt")["pixel_values"]
    tokens = AutoTokenizer.from_pretrained(folder)(prompts, padding=True, truncation=True, max_length=77,
                                                    return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"], pixel_values=pixels)
    return out.logits_per_image.diagonal(), model.logit_scale.exp().item(), model


def test_pickscore_loads_a_pickscore_folder_and_matches_the_formula(clip_folder):
    from rewards.clip_rewards import PickScore

    images = _images()
    reward = PickScore(str(clip_folder), str(clip_folder))
    logits, _, model = _reference_logits(clip_folder, images, PROMPTS)
    scores = reward(images, PROMPTS).scores
    torch.testing.assert_close(scores, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(PickScore(str(clip_folder), str(clip_folder), divide_by=26)(images, PROMPTS).scores,
                               logits / 26, rtol=1e-5, atol=1e-5)
    for name, tensor in model.state_dict().items():  # every saved tensor came back
        assert torch.equal(reward.clip.model.state_dict()[name], tensor), name
    _check_batch_independence_and_determinism(reward, images, PROMPTS)
    injected = PickScore(model=model, tokenizer=reward.clip.tokenizer, processor=None)  # sizes from the config
    assert torch.equal(injected(images, PROMPTS).scores, scores)


def test_clipscore_formula_both_branches(clip_folder):
    from rewards.clip_rewards import CLIPScore

    images = _images()
    reward = CLIPScore(str(clip_folder))
    logits, scale, _ = _reference_logits(clip_folder, images, PROMPTS)
    cosine = logits / scale
    torch.testing.assert_close(reward(images, PROMPTS).scores, 100 * cosine.clamp_min(0), rtol=1e-5, atol=1e-4)
    reward.clip.model.visual_projection.weight.data.neg_()  # flips every cosine's sign
    flipped = reward(images, PROMPTS).scores
    torch.testing.assert_close(flipped, 100 * (-cosine).clamp_min(0), rtol=1e-5, atol=1e-4)
    assert ((flipped > 0) | (100 * cosine.clamp_min(0) > 0)).all(), "both branches of max(cos, 0) exercised"
    _check_batch_independence_and_determinism(reward, images, PROMPTS)
    torch.testing.assert_close(CLIPScore(str(clip_folder), divide_by=30)(images, PROMPTS).scores,
                               100 * cosine.clamp_min(0) / 30, rtol=1e-5, atol=1e-4)


def test_aesthetic_loads_the_original_pth_and_matches_the_formula(clip_folder, tmp_path):
    from transformers import CLIPModel

    from rewards.aesthetic import LaionAesthetic
    from rewards.tiny import tiny_aesthetic_pth

    pth = tiny_aesthetic_pth(tmp_path / "sac+logos+ava1-l14-linearMSE.pth", in_dim=16)
    state = torch.load(pth, weights_only=True)
    assert sorted(state) == sorted(f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias"))
    reward = LaionAesthetic(str(pth), clip=str(clip_folder))
    images = _images()
    scores = reward(images, PROMPTS).scores
    # formula by hand: L2-normalised image embedding through five affine maps (no activations)
    model = CLIPModel.from_pretrained(clip_folder).eval()
    import torchvision.transforms as T

    original = T.Compose([T.Resize(32, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(32), T.ToTensor(),
                          T.Normalize(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)])
    pixels = torch.stack([original(_pil(x)) for x in _uint8(images)])
    with torch.no_grad():
        x = model.visual_projection(model.vision_model(pixel_values=pixels).pooler_output).double()
    x = x / (x**2).sum(-1, keepdim=True).sqrt()
    for i in (0, 2, 4, 6, 7):
        x = x @ state[f"layers.{i}.weight"].double().T + state[f"layers.{i}.bias"].double()
    torch.testing.assert_close(scores.double(), x.squeeze(-1), rtol=1e-5, atol=1e-5)
    _check_batch_independence_and_determinism(reward, images, PROMPTS)


def test_aesthetic_rejects_a_head_of_the_wrong_width(clip_folder, tmp_path):
    from rewards.aesthetic import LaionAesthetic
    from rewards.tiny import tiny_aesthetic_pth

    pth = tiny_aesthetic_pth(tmp_path / "head.pth", in_dim=24)
    with pytest.raises(ValueError, match="24-d embeddings but the CLIP projects to 16"):
        LaionAesthetic(str(pth), clip=str(clip_folder))


# ----------------------------------------------------------------------------- HPSv2


@pytest.fixture(scope="module")
def hps_checkpoint(tmp_path_factory):
    pytest.importorskip("open_clip")
    from rewards.tiny import tiny_hps_checkpoint

    return tiny_hps_checkpoint(tmp_path_factory.mktemp("hps") / "HPS_v2.1_compressed.pt")


def test_hps_loads_the_original_checkpoint_and_matches_the_formula(hps_checkpoint):
    import open_clip

    from rewards.hps import HPSv2
    from rewards.tiny import TINY_HPS_ARCH, tiny_hps_model

    assert list(torch.load(hps_checkpoint, weights_only=True)) == ["state_dict"]
    reward = HPSv2(str(hps_checkpoint.parent), version="v2.1", arch=TINY_HPS_ARCH)  # folder -> the v2.1 file
    images = _images()
    scores = reward(images, PROMPTS).scores
    reference = tiny_hps_model()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(reward.model.state_dict()[name], tensor), name
    # formula through open_clip's own forward (unit features) and tokenizer
    pixels = resize_longest_pad(_uint8(images), 32)
    tokens = open_clip.SimpleTokenizer(context_length=77)(PROMPTS)
    with torch.no_grad():
        image_features, text_features, _ = reference(pixels, tokens)
    torch.testing.assert_close(scores, (image_features * text_features).sum(-1), rtol=1e-5, atol=1e-6)
    _check_batch_independence_and_determinism(reward, images, PROMPTS)


def test_hps_reports_a_checkpoint_that_does_not_fit(hps_checkpoint):
    from rewards.hps import HPSv2
    from rewards.tiny import TINY_HPS_ARCH

    wider = json.loads(json.dumps(TINY_HPS_ARCH))
    wider["vision_cfg"]["layers"] = 3
    with pytest.raises(RuntimeError, match="missing .*visual.transformer.resblocks.2"):
        HPSv2(str(hps_checkpoint), arch=wider)


# ----------------------------------------------------------------------------- ImageReward

# original BLIP / ImageReward names, written out here independently of rewards.image_reward's table
_TO_ORIGINAL = [
    ("visual_encoder.embeddings.class_embedding", "blip.visual_encoder.cls_token"),
    ("visual_encoder.embeddings.position_embedding", "blip.visual_encoder.pos_embed"),
    ("visual_encoder.embeddings.patch_embedding.", "blip.visual_encoder.patch_embed.proj."),
    ("visual_encoder.post_layernorm.", "blip.visual_encoder.norm."),
    ("visual_encoder.encoder.layers.", "blip.visual_encoder.blocks."),
    ("text_encoder.", "blip.text_encoder."),
]
_BLOCK = [(".layer_norm1.", ".norm1."), (".layer_norm2.", ".norm2."), (".self_attn.qkv.", ".attn.qkv."),
          (".self_attn.projection.", ".attn.proj.")]


def _original_state_dict(model) -> dict:
    out = {}
    for key, value in model.state_dict().items():
        new = key
        for ours, theirs in _TO_ORIGINAL:
            if new.startswith(ours):
                new = theirs + new[len(ours):]
                break
        if new.startswith("blip.visual_encoder.blocks."):
            for ours, theirs in _BLOCK:
                new = new.replace(ours, theirs)
        out[new] = value
    out["blip.text_encoder.embeddings.position_ids"] = torch.arange(64)[None]  # old transformers saved this buffer
    out["blip.vision_proj.weight"] = torch.zeros(8, 32)  # unused by the score
    out["blip.text_proj.weight"] = torch.zeros(8, 32)
    return out


@pytest.fixture(scope="module")
def imagereward_folder(tmp_path_factory):
    from rewards.tiny import tiny_imagereward_parts

    model, tokenizer, vision, med = tiny_imagereward_parts()
    folder = tmp_path_factory.mktemp("ImageReward")
    torch.save(_original_state_dict(model), folder / "ImageReward.pt")
    (folder / "med_config.json").write_text(json.dumps(med))
    tokenizer.save_pretrained(folder / "bert-base-uncased")
    return folder, model, vision


def test_imagereward_checkpoint_has_the_original_layout(imagereward_folder):
    folder, _, _ = imagereward_folder
    keys = set(torch.load(folder / "ImageReward.pt", weights_only=True))
    for key in ["blip.visual_encoder.cls_token", "blip.visual_encoder.pos_embed",
                "blip.visual_encoder.patch_embed.proj.weight", "blip.visual_encoder.blocks.1.attn.qkv.weight",
                "blip.visual_encoder.blocks.1.attn.proj.bias", "blip.visual_encoder.blocks.0.norm1.weight",
                "blip.visual_encoder.blocks.0.mlp.fc2.weight", "blip.visual_encoder.norm.weight",
                "blip.text_encoder.embeddings.word_embeddings.weight",
                "blip.text_encoder.encoder.layer.1.crossattention.self.key.weight",
                "blip.text_encoder.encoder.layer.0.attention.output.LayerNorm.bias", "mlp.layers.7.weight"]:
        assert key in keys, key


def test_imagereward_loads_the_original_checkpoint_and_matches_the_formula(imagereward_folder):
    from transformers import BertTokenizer

    from rewards.image_reward import SCORE_MEAN, SCORE_STD, ImageReward

    folder, model, vision = imagereward_folder
    reward = ImageReward(str(folder), tokenizer=str(folder / "bert-base-uncased"), vision_config=vision)
    assert sorted(reward.dropped_keys) == ["blip.text_encoder.embeddings.position_ids", "blip.text_proj.weight",
                                           "blip.vision_proj.weight"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(reward.model.state_dict()[name], tensor), name
    images = _images()
    scores = reward(images, PROMPTS).scores
    # by hand: torchvision preprocessing, BERT tokens padded to 35, text [CLS] state, affine MLP, normalise
    import torchvision.transforms as T

    original = T.Compose([T.Resize(32, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(32), T.ToTensor(),
                          T.Normalize(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)])
    pixels = torch.stack([original(_pil(x)) for x in _uint8(images)])
    tokens = BertTokenizer.from_pretrained(folder / "bert-base-uncased")(
        PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    assert tokens["input_ids"].shape == (4, 35)
    with torch.no_grad():
        image_embeds = model.visual_encoder(pixel_values=pixels).last_hidden_state
        text = model.text_encoder(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"],
                                  encoder_hidden_states=image_embeds,
                                  encoder_attention_mask=torch.ones(image_embeds.shape[:2], dtype=torch.long))
    x = text.last_hidden_state[:, 0].double()
    for i in (0, 2, 4, 6, 7):
        x = x @ model.mlp.layers[i].weight.double().T + model.mlp.layers[i].bias.double()
    expected = (x.squeeze(-1) - 0.16717362830052426) / 1.0333394966054072
    assert (SCORE_MEAN, SCORE_STD) == (0.16717362830052426, 1.0333394966054072)
    torch.testing.assert_close(scores.double(), expected, rtol=1e-5, atol=1e-5)
    _check_batch_independence_and_determinism(reward, images, PROMPTS)


def test_imagereward_image_changes_the_score_through_cross_attention(imagereward_folder):
    from rewards.image_reward import ImageReward
    from rewards.tiny import tiny_bert_tokenizer

    _, model, _ = imagereward_folder
    reward = ImageReward(model=model, tokenizer_obj=tiny_bert_tokenizer())  # injection path: no checkpoint
    images = _images(n=2)
    scores = reward(images, [PROMPTS[0]] * 2).scores  # same prompt, different images
    assert abs(scores[0] - scores[1]) > 1e-4
