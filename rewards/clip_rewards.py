"""CLIP-backbone rewards on transformers' CLIPModel: PickScore and CLIPScore, and the CLIP image
embedder shared with the LAION aesthetic predictor and video temporal consistency.

    PickScore  (yuvalkirstain/PickScore_v1, processor of laion/CLIP-ViT-H-14-laion2B-s32B-b79K)
               score = exp(logit_scale) * cos(image, text)            (÷ divide_by; Flow-GRPO uses 26)
    CLIPScore  (openai/clip-vit-large-patch14)
               score = 100 * max(cos(image, text), 0)                 (÷ divide_by; Flow-GRPO uses 30)

Preprocessing is the original slow CLIPImageProcessor's, read from the processor folder's
preprocessor_config.json: PIL bicubic resize of the shortest side, centre crop (floor margins),
/255, CLIP mean/std; text padded to the batch's longest prompt, truncated at 77 tokens.

Run: PickScore()(images [B, 3, H, W] in [0, 1], prompts) -> RewardOutput (downloads the weights);
tests build tiny random models with rewards.tiny.
"""

from __future__ import annotations

import torch

from rewards.base import Reward, RewardOutput
from rewards.common import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, downloading, l2_normalize, read_json, resize_center_crop


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
    """

    def __init__(self, pretrained: str | None, processor: str | None = None, *, model=None, tokenizer=None,
                 text: bool = True, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 crop_rounding: str = "floor", max_length: int = 77):
        import transformers

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
        """uint8 [B, 3, H, W] -> normalised float32 [B, 3, crop, crop]."""
        s = self.settings
        return resize_center_crop(images, s["size"], s["crop"], s["mean"], s["std"], self.crop_rounding)

    @torch.no_grad()
    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 3, H, W] -> projected image embeddings [B, D] (not normalised)."""
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
    """PickScore: exp(logit_scale) * cos(image, text), ÷ divide_by (1 = the original's raw score)."""

    name = "pickscore"
    modality = "image"

    def __init__(self, pretrained: str = "yuvalkirstain/PickScore_v1",
                 processor: str = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K", *, divide_by: float = 1.0,
                 device: str = "cpu", dtype: torch.dtype = torch.float32, model=None, tokenizer=None):
        self.clip = CLIPBackbone(pretrained, processor, model=model, tokenizer=tokenizer, device=device, dtype=dtype)
        self.divide_by = float(divide_by)

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        cos = self.clip.cosine(images, prompts)
        scale = self.clip.model.logit_scale.exp().float()
        return RewardOutput(scores=(scale * cos / self.divide_by).float(), info={"cosine": cos})


class CLIPScore(Reward):
    """CLIPScore: 100 * max(cos(image, text), 0), ÷ divide_by."""

    name = "clipscore"
    modality = "image"

    def __init__(self, pretrained: str = "openai/clip-vit-large-patch14", processor: str | None = None, *,
                 divide_by: float = 1.0, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 model=None, tokenizer=None):
        self.clip = CLIPBackbone(pretrained, processor, model=model, tokenizer=tokenizer, device=device, dtype=dtype)
        self.divide_by = float(divide_by)

    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        cos = self.clip.cosine(images, prompts)
        return RewardOutput(scores=(100.0 * cos.clamp_min(0) / self.divide_by).float(), info={"cosine": cos})
