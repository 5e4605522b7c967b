"""ImageReward (THUDM): BLIP ViT-L image encoder, BERT text encoder with cross-attention to the
image tokens, and a linear MLP head on the text [CLS] state.

    score = (MLP(text_encoder(prompt | image)[:, 0]) - 0.16717362830052426) / 1.0333394966054072

As the original ImageReward.score: image -> PIL bicubic resize of the shortest side to 224, centre
crop (torchvision), CLIP mean/std; prompt -> BERT tokenizer (bert-base-uncased), padded to 35
tokens and truncated there; the text encoder runs in BLIP's "multimodal" mode (bidirectional self-
attention, cross-attention to all image tokens).

Built on transformers' BLIP classes, which implement the same layers: BlipVisionModel (BLIP's ViT:
pre-norm blocks, fused qkv, final LayerNorm; eps 1e-6 as BLIP) and BlipTextModel with cross-attention
(BLIP's med.py BertModel). The original checkpoint ImageReward.pt (a state dict of the ImageReward
module, keys blip.visual_encoder.*, blip.text_encoder.*, mlp.layers.*) is renamed key by key on load
(`convert_original_state_dict`); blip.vision_proj / blip.text_proj (unused by the score) are dropped.
The text config comes from the checkpoint's med_config.json, encoder width = the ViT width.
Deviation: none in the computation; the original loads with strict=False, here every tensor the
model uses must be present (a missing one is an error, not a silent random init).

Run: ImageReward()(images [B, 3, H, W] in [0, 1], prompts)  (downloads THUDM/ImageReward).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from rewards.base import Reward, RewardOutput
from rewards.common import (LinearMLP, downloading, load_exact, read_json, resize_center_crop, resolve_file,
                            torch_load_weights)

SCORE_MEAN = 0.16717362830052426
SCORE_STD = 1.0333394966054072
MAX_TEXT_LENGTH = 35
# BLIP ViT-L/16 at 224 (ImageReward: BLIP_Pretrain(image_size=224, vit='large'))
VIT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
             "image_size": 224, "patch_size": 16, "layer_norm_eps": 1e-6, "hidden_act": "gelu"}

# original BLIP ViT names -> transformers BlipVisionModel names (after the "blip.visual_encoder." prefix)
_VISION_RENAMES = [
    (r"^cls_token$", "embeddings.class_embedding"),
    (r"^pos_embed$", "embeddings.position_embedding"),
    (r"^patch_embed\.proj\.", "embeddings.patch_embedding."),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.layers.\1.layer_norm1."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.layers.\1.layer_norm2."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", r"encoder.layers.\1.self_attn.qkv."),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"encoder.layers.\1.self_attn.projection."),
    (r"^blocks\.(\d+)\.mlp\.", r"encoder.layers.\1.mlp."),
    (r"^norm\.", "post_layernorm."),
]


def convert_original_state_dict(state: dict) -> tuple[dict, list[str]]:
    """ImageReward.pt keys -> ImageRewardModel keys. Returns (converted, dropped keys)."""
    out, dropped = {}, []
    for key, value in state.items():
        if key.startswith("blip.visual_encoder."):
            name = key[len("blip.visual_encoder."):]
            for pattern, repl in _VISION_RENAMES:
                if re.match(pattern, name):
                    out["visual_encoder." + re.sub(pattern, repl, name)] = value
                    break
            else:
                dropped.append(key)
        elif key.startswith("blip.text_encoder.") and not key.endswith("position_ids"):
            out["text_encoder." + key[len("blip.text_encoder."):]] = value
        elif key.startswith("mlp."):
            out[key] = value
        else:
            dropped.append(key)
    return out, dropped


class ImageRewardModel(nn.Module):
    """visual_encoder (BlipVisionModel), text_encoder (BlipTextModel with cross-attention, no pooler), mlp."""

    def __init__(self, vision_config: dict, text_config: dict, mlp_sizes: tuple[int, ...] | None = None):
        super().__init__()
        import transformers
        vision = transformers.BlipVisionConfig(**vision_config)
        text = transformers.BlipTextConfig(**{**text_config, "encoder_hidden_size": vision.hidden_size,
                                               "is_decoder": True})  # is_decoder: builds the cross-attention layers
        self.visual_encoder = transformers.BlipVisionModel(vision)
        self.text_encoder = transformers.BlipTextModel(text, add_pooling_layer=False)
        self.mlp = LinearMLP(mlp_sizes or (text.hidden_size, 1024, 128, 64, 16, 1))

    def text_cls(self, pixels: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        image_embeds = self.visual_encoder(pixel_values=pixels).last_hidden_state
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=image_embeds.device)
        out = self.text_encoder(input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=image_embeds,
                                encoder_attention_mask=image_atts, is_decoder=False)  # BLIP mode="multimodal"
        return out.last_hidden_state[:, 0, :]

    def forward(self, pixels, input_ids, attention_mask) -> torch.Tensor:
        features = self.text_cls(pixels, input_ids, attention_mask).to(self.mlp.layers[0].weight.dtype)
        return ((self.mlp(features).float() - SCORE_MEAN) / SCORE_STD).squeeze(-1)


def text_config_from_med(med: dict) -> dict:
    """BlipTextConfig kwargs from the original med_config.json (a BertConfig)."""
    keys = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
            "layer_norm_eps", "pad_token_id", "initializer_range"]
    config = {k: med[k] for k in keys if k in med}
    # BLIP's [DEC] / [SEP] ids only matter for generation; unset them so a small vocabulary stays valid
    return {**config, "bos_token_id": None, "eos_token_id": None, "sep_token_id": None}


class ImageReward(Reward):
    """pretrained: folder or hub repo holding ImageReward.pt and med_config.json (or the .pt file with
    med_config.json beside it); tokenizer: BERT tokenizer id or folder; vision_config: BlipVisionConfig
    kwargs (default BLIP ViT-L; tiny tests pass their own)."""

    name = "imagereward"
    modality = "image"

    def __init__(self, pretrained: str = "THUDM/ImageReward", tokenizer: str = "bert-base-uncased", *,
                 vision_config: dict | None = None, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 model: ImageRewardModel | None = None, tokenizer_obj=None):
        import transformers
        self.dropped_keys: list[str] = []  # checkpoint tensors the score does not use (vision_proj, text_proj)
        if model is None:
            from pathlib import Path

            weights = resolve_file(pretrained, "ImageReward.pt")
            med_source = str(Path(weights).parent) if Path(pretrained).is_file() else pretrained
            med = read_json(med_source, "med_config.json")
            state, self.dropped_keys = convert_original_state_dict(torch_load_weights(weights))
            model = ImageRewardModel({**VIT_LARGE, **(vision_config or {})}, text_config_from_med(med),
                                     LinearMLP.sizes_from_state_dict(state, "mlp.layers."))
            load_exact(model, state, f"ImageReward checkpoint {weights}")
        self.model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        if tokenizer_obj is None:
            with downloading(tokenizer, "the BERT tokenizer"):
                tokenizer_obj = transformers.AutoTokenizer.from_pretrained(tokenizer)
        self.tokenizer = tokenizer_obj
        self.image_size = self.model.visual_encoder.config.image_size
        self.device, self.dtype = torch.device(device), dtype

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 3, H, W] -> float32 [B, 3, S, S]: torchvision Resize(S, bicubic) + CenterCrop(S) on PIL."""
        return resize_center_crop(images, self.image_size, self.image_size, rounding="round")

    @torch.no_grad()
    def score_uint8(self, images, prompts, metadata) -> RewardOutput:
        tokens = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=MAX_TEXT_LENGTH,
                                return_tensors="pt")
        pixels = self.preprocess(images).to(self.device, self.dtype)
        scores = self.model(pixels, tokens["input_ids"].to(self.device), tokens["attention_mask"].to(self.device))
        return RewardOutput(scores=scores.float().cpu(), info={})
