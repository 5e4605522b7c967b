"""HPSv2 / HPSv2.1 (Human Preference Score v2): an open_clip ViT-H-14 fine-tuned on human preferences.

    score = cos(image, text)   (unit open_clip features, no logit scale)

As the original (hpsv2.img_score with create_model_and_transforms(..., light_augmentation=True)):
the checkpoint is {'state_dict': ...} for open_clip's CLIP with the ViT-H-14 config; the image goes
to float [0, 1] first, its longest side is resized to 224 with torch bicubic (antialiased, as
torchvision's tensor Resize), it is zero-padded to a square (before normalisation) and normalised
with the CLIP mean/std; prompts use open_clip's CLIP BPE tokenizer (77 tokens).

quantize=False scores the float images as they come, unrounded (DiffusionNFT's HPSv2Scorer: its rewards.py hands
the sampler's float tensor to the same resize); the default rounds to uint8 first, as every PIL-based caller of the
original does (DanceGRPO, MixGRPO, Flow-GRPO: the VAE's PIL output).

Deviations: the original builds ViT-H-14 with the laion2B weights before overwriting every tensor
with the HPS state dict; here the architecture is built empty (no second download). The original
runs under CUDA autocast (fp16); here the model runs in `dtype` (default float32). A non-square
image whose longest side already equals 224 is padded to a square here (the original would pass a
non-square tensor and fail).

Run: HPSv2()(images [B, 3, H, W] in [0, 1], prompts)  (downloads xswu/HPSv2/HPS_v2.1_compressed.pt).
"""

from __future__ import annotations

import copy

import torch

from rewards.base import Reward, RewardOutput
from rewards.common import load_exact, require, resize_longest_pad, resolve_file, torch_load_weights

HPS_FILES = {"v2.0": "HPS_v2_compressed.pt", "v2.1": "HPS_v2.1_compressed.pt"}


class HPSv2(Reward):
    """pretrained: the HPS checkpoint (.pt file, folder holding it, hub 'owner/repo' or 'owner/repo/file');
    version picks the file name in a folder or repo; arch: an open_clip model name or a config dict
    {"embed_dim", "vision_cfg", "text_cfg"} (tiny test models); quantize=False: score the float images unrounded."""

    name = "hpsv2"
    modality = "image"

    def __init__(self, pretrained: str = "xswu/HPSv2", version: str = "v2.1", arch: str | dict = "ViT-H-14", *,
                 quantize: bool = True, device: str = "cpu", dtype: torch.dtype = torch.float32, model=None):
        open_clip = require("open_clip", "clip", "the HPSv2 reward")
        self.quantize = bool(quantize)
        if version not in HPS_FILES:
            raise ValueError(f"HPS version {version!r} is not one of {sorted(HPS_FILES)}")
        cfg = open_clip.get_model_config(arch) if isinstance(arch, str) else copy.deepcopy(arch)
        if cfg is None:
            raise ValueError(f"open_clip has no model config {arch!r}; pass a name from open_clip.list_models() or a dict")
        if model is None:
            # the checkpoint first: a missing one is refused before ViT-H-14 (~1B parameters) is built
            path = resolve_file(pretrained, HPS_FILES[version])
            model = open_clip.CLIP(**cfg)
            load_exact(model, torch_load_weights(path), f"HPS checkpoint {path}")
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        context_length = cfg.get("text_cfg", {}).get("context_length", 77)
        if isinstance(arch, str):
            self.tokenizer = open_clip.get_tokenizer(arch)
        else:
            self.tokenizer = open_clip.SimpleTokenizer(context_length=context_length)
        vision = cfg["vision_cfg"]
        size = vision.get("image_size", 224)
        self.image_size = size if isinstance(size, int) else size[0]
        visual = self.model.visual
        self.mean = getattr(visual, "image_mean", None) or open_clip.OPENAI_DATASET_MEAN
        self.std = getattr(visual, "image_std", None) or open_clip.OPENAI_DATASET_STD
        self.device, self.dtype = torch.device(device), dtype

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (or float32 in [0, 1]) [B, 3, H, W] -> float32 [B, 3, S, S] (S = the model's image size)."""
        return resize_longest_pad(images, self.image_size, self.mean, self.std)

    def score_float(self, images, prompts, metadata) -> RewardOutput:
        return self.score_uint8(images, prompts, metadata)  # the preprocessing takes float images as they are

    @torch.no_grad()
    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        pixels = self.preprocess(images).to(self.device, self.dtype)
        tokens = self.tokenizer(prompts).to(self.device)
        image_features = self.model.encode_image(pixels, normalize=True).float()
        text_features = self.model.encode_text(tokens, normalize=True).float()
        return RewardOutput(scores=(image_features * text_features).sum(-1).cpu(), info={})
