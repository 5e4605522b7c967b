"""CLIP-backbone rewards on transformers' CLIPModel: PickScore and CLIPScore, and the CLIP image
embedder shared with the LAION aesthetic predictor and video temporal consistency.

    PickScore  (yuvalkirstain/PickScore_v1, processor of laion/CLIP-ViT-H-14-laion2B-s32B-b79K)
               score = (exp(logit_scale) * cos(image, text) - offset) / divide_by
               (defaults offset 0, divide_by 1: the raw score, ~22 for a matching image; DiffusionNFT, Flow-GRPO,
               AWM and DGPO divide by 26; MixGRPO takes (x - 18) / 8)
    CLIPScore  (openai/clip-vit-large-patch14)
               score = s * max(cos(image, text), 0) / divide_by       (defaults: s = 100, clamp at 0, divide_by 1)
               logit_scale=True: s = the model's exp(logit_scale) (CLIPModel's logits, ~100 on the real model);
               clamp=False: cos unclamped. DiffusionNFT's ClipScorer: logit_scale, no clamp, ÷ 100 (÷ 30 in DGPO's)

Preprocessing (preprocess="pil", the default) is the original slow CLIPImageProcessor's, read from the processor
folder's preprocessor_config.json: PIL bicubic resize of the shortest side, centre crop (floor margins), /255, CLIP
mean/std, on the uint8 images. CLIPScore's preprocess="tensor" is DiffusionNFT's ClipScorer's instead: torchvision
Resize (bilinear, antialiased) + CenterCrop + Normalize on the float tensor, which with quantize=False is the
sampler's float output unrounded. Text: padded to the batch's longest prompt, truncated at 77 tokens.

Run: PickScore()(images [B, 3, H, W] in [0, 1], prompts) -> RewardOutput (downloads the weights);
tests build tiny random models with rewards.tiny.
"""

from __future__ import annotations

import torch

from rewards.base import Reward, RewardOutput
from rewards.common import (OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, downloading, l2_normalize, read_json, resize_center_crop,
                            tensor_resize_center_crop)

PREPROCESSING = ("pil", "tensor")


def processor_settings(pretrained: str) -> dict:
    """size, crop, mean, std from a CLIP preprocessor_config.json (transformers' format)."""
    try:
        cfg = read_json(pretrained, "preprocessor_config.json")
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"{pretrained}: no preprocessor_config.json (the CLIP processor's sizes, mean and std); pass "
            "processor=<folder or hub id that has one>"
        ) from exc
    size = cfg.get("size", 224)
    size = size.get("shortest_edge", size.get("height")) if isinstance(size, dict) else size
    crop = cfg.get("crop_size", size)
    crop = (crop["height"], crop["width"]) if isinstance(crop, dict) else (crop, crop)
    if cfg.get("resample", 3) != 3:
        raise ValueError(f"{pretrained}: resample={cfg['resample']} is not bicubic (3), which the CLIP rewards assume")
    if cfg.get("do_center_crop") is False:
        crop = (size, size)
    return {
        "size": int(size),
        "crop": tuple(int(c) for c in crop),
        "mean": tuple(cfg.get("image_mean", OPENAI_CLIP_MEAN)),
        "std": tuple(cfg.get("image_std", OPENAI_CLIP_STD)),
    }


class CLIPBackbone:
    """A transformers CLIPModel with its tokenizer and the original image preprocessing.

    pretrained: hub id or local folder of the CLIPModel (save_pretrained format); processor: the
    folder or hub id holding the tokenizer and preprocessor_config.json (default: `pretrained`).
    model / tokenizer: ready objects (tests), skipping from_pretrained; with processor=None the
    preprocessing sizes come from the model config. text=False: image features only (no tokenizer).
    preprocess: "pil" (the processor's PIL bicubic on uint8) or "tensor" (torchvision's bilinear tensor
    Resize + CenterCrop + Normalize on float images: ``rewards.common.tensor_resize_center_crop``).
    """

    def __init__(self, pretrained: str | None, processor: str | None = None, *, model=None, tokenizer=None,
                 text: bool = True, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 crop_rounding: str = "floor", max_length: int = 77, preprocess: str = "pil"):
        import transformers

        if preprocess not in PREPROCESSING:
            raise ValueError(f"preprocess={preprocess!r} is not one of {PREPROCESSING}")
        self.preprocess_mode = preprocess

        if model is None:
            processor = processor or pretrained
            if pretrained is None:
                raise ValueError("pass pretrained (hub id or folder) or a model")
            with downloading(pretrained, "the CLIP reward model"):
                model = transformers.CLIPModel.from_pretrained(pretrained, dtype=dtype)
        with downloading(processor, "the CLIP reward's tokenizer and preprocessing"):
            if tokenizer is None and text:
                if processor is None:
                    raise ValueError("pass processor (hub id or folder with the tokenizer) or a tokenizer")
                tokenizer = transformers.AutoTokenizer.from_pretrained(processor)
            self.settings = processor_settings(processor) if processor else processor_settings_from_model(model)
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.device, self.dtype = torch.device(device), dtype
        self.crop_rounding, self.max_length = crop_rounding, max_length

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 3, H, W] (preprocess "tensor": or float32 in [0, 1]) -> normalised float32 [B, 3, crop, crop]."""
        s = self.settings
        if self.preprocess_mode == "tensor":
            pixels = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
            return tensor_resize_center_crop(pixels, s["size"], s["crop"], s["mean"], s["std"])
        if images.dtype != torch.uint8:
            raise TypeError("the CLIP processor's PIL preprocessing takes uint8 images (preprocess='tensor' takes floats)")
        return resize_center_crop(images, s["size"], s["crop"], s["mean"], s["std"], self.crop_rounding)

    @torch.no_grad()
    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 3, H, W] (or float32, see ``preprocess``) -> projected image embeddings [B, D] (not normalised)."""
        pixels = self.preprocess(images).to(self.device, self.dtype)
        pooled = self.model.vision_model(pixel_values=pixels).pooler_output
        return self.model.visual_projection(pooled).float().cpu()

    @torch.no_grad()
    def text_features(self, prompts: list[str]) -> torch.Tensor:
        """B prompts -> projected text embeddings [B, D] (not normalised)."""
        if self.tokenizer is None:
            raise RuntimeError("this CLIP backbone was built with text=False")
        tokens = self.tokenizer(prompts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        out = self.model.text_model(
            input_ids=tokens["input_ids"].to(self.device), attention_mask=tokens["attention_mask"].to(self.device)
        )
        return self.model.text_projection(out.pooler_output).float().cpu()

    def cosine(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """cos(image_i, text_i) [B] float32."""
        return (l2_normalize(self.image_features(images)) * l2_normalize(self.text_features(prompts))).sum(-1)


def processor_settings_from_model(model) -> dict:
    size = model.config.vision_config.image_size
    return {"size": size, "crop": (size, size), "mean": OPENAI_CLIP_MEAN, "std": OPENAI_CLIP_STD}


class PickScore(Reward):
    """PickScore: (exp(logit_scale) * cos(image, text) - offset) / divide_by (defaults 0 and 1: the original's raw
    score; DiffusionNFT / Flow-GRPO / AWM / DGPO: divide_by=26; MixGRPO: offset=18, divide_by=8)."""

    name = "pickscore"
    modality = "image"

    def __init__(self, pretrained: str = "yuvalkirstain/PickScore_v1",
                 processor: str = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K", *, divide_by: float = 1.0,
                 offset: float = 0.0, device: str = "cpu", dtype: torch.dtype = torch.float32, model=None,
                 tokenizer=None):
        self.clip = CLIPBackbone(pretrained, processor, model=model, tokenizer=tokenizer, device=device, dtype=dtype)
        self.divide_by, self.offset = float(divide_by), float(offset)

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        cos = self.clip.cosine(images, prompts)
        scale = self.clip.model.logit_scale.exp().float()
        raw = scale * cos
        scores = raw if self.offset == 0 else raw - self.offset
        return RewardOutput(scores=(scores / self.divide_by).float(), info={"cosine": cos})


class CLIPScore(Reward):
    """CLIPScore: s * max(cos(image, text), 0) / divide_by, s = 100 (logit_scale=True: the model's exp(logit_scale));
    clamp=False drops the max(·, 0). quantize=False scores the float images unrounded (needs preprocess="tensor").
    DiffusionNFT's ClipScorer: quantize=False, preprocess="tensor", logit_scale=True, clamp=False, divide_by=100."""

    name = "clipscore"
    modality = "image"

    def __init__(self, pretrained: str = "openai/clip-vit-large-patch14", processor: str | None = None, *,
                 divide_by: float = 1.0, logit_scale: bool = False, clamp: bool = True, preprocess: str = "pil",
                 quantize: bool = True, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 model=None, tokenizer=None):
        if not quantize and preprocess != "tensor":
            raise ValueError("clipscore: quantize=False (float images) needs preprocess='tensor'; the CLIP "
                             "processor's PIL resize takes uint8 images")
        self.clip = CLIPBackbone(pretrained, processor, model=model, tokenizer=tokenizer, device=device, dtype=dtype,
                                 preprocess=preprocess)
        self.divide_by, self.logit_scale, self.clamp = float(divide_by), bool(logit_scale), bool(clamp)
        self.quantize = bool(quantize)

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        cos = self.clip.cosine(images, prompts)
        scale = self.clip.model.logit_scale.exp().float() if self.logit_scale else 100.0
        scores = scale * (cos.clamp_min(0) if self.clamp else cos) / self.divide_by
        return RewardOutput(scores=scores.float(), info={"cosine": cos})

    def score_float(self, images, prompts, metadata) -> RewardOutput:
        return self.score_uint8(images, prompts, metadata)  # the backbone's "tensor" preprocessing takes floats


class CLIPImageSimilarity(Reward):
    """How alike an edit's result and its source look to CLIP: the cosine of their unit image embeddings (the first
    condition image of each row; ``sees_condition``). Flow-GRPO's editing runs add it to GenEval's reward (weight 0.5
    for FLUX.1-Kontext, 0.2 for Qwen-Image-Edit) to keep the source; the defaults are its scorer's
    (flow_grpo/clip_scorer.py ``image_similarity``): openai/clip-vit-large-patch14, the float images unrounded
    (``quantize=False``) through torchvision's Resize + CenterCrop + Normalize (``preprocess="tensor"``)."""

    name = "clip_image_similarity"
    modality = "image"
    sees_condition = True

    def __init__(self, pretrained: str = "openai/clip-vit-large-patch14", processor: str | None = None, *,
                 preprocess: str = "tensor", quantize: bool = False, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, model=None):
        if not quantize and preprocess != "tensor":
            raise ValueError("clip_image_similarity: quantize=False (float images) needs preprocess='tensor'")
        self.clip = CLIPBackbone(pretrained, processor, model=model, text=False, device=device, dtype=dtype,
                                 preprocess=preprocess)
        self.quantize = bool(quantize)

    def score_uint8(self, images, prompts, metadata, conditions) -> RewardOutput:
        result = l2_normalize(self.clip.image_features(images))
        source = l2_normalize(self.clip.image_features(conditions[:, 0]))
        return RewardOutput(scores=(result * source).sum(-1).float(), info={})

    def score_float(self, images, prompts, metadata, conditions) -> RewardOutput:
        return self.score_uint8(images, prompts, metadata, conditions)  # the "tensor" preprocessing takes floats
