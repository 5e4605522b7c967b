"""A tiny random ``QwenImagePipeline`` of the real classes (for tests; no downloads).

Every component is the class Qwen-Image ships: ``QwenImageTransformer2DModel`` (2 dual-stream blocks),
``AutoencoderKLQwenImage`` (the causal 3-D VAE, here 4x spatial compression, with non-trivial per-channel
``latents_mean`` / ``latents_std`` so the normalisation is exercised), ``Qwen2_5_VLForConditionalGeneration``
(a 2-layer text model and a 1-block vision tower, built from ``Qwen2_5_VLConfig``), a local ``Qwen2TokenizerFast``
(flowgrpo/models/tokenizers.py) whose corpus holds the pipeline's system prompt, so the 34 template tokens the
pipeline drops are exactly the template, and Qwen-Image's published scheduler configuration
(configs/models/architectures/qwen_image/scheduler.json: dynamic shifting, ``shift_terminal`` 0.02).

At 32 px: latents [16, 8, 8] per image (unpacked), 16 packed image tokens of 64 channels.
"""

from __future__ import annotations

import json

import torch

LATENT_CHANNELS = 16  # Qwen-Image's z_dim (the transformer takes 4 x 16 = 64 packed channels)
TEXT_WIDTH = 32  # the tiny Qwen2.5-VL hidden size = the transformer's joint_attention_dim


def qwen_image_scheduler_config() -> dict:
    """Qwen-Image's published scheduler configuration (configs/models/architectures/qwen_image/scheduler.json)."""
    from flowgrpo.run.paths import configs_dir

    config = json.loads((configs_dir() / "models" / "architectures" / "qwen_image" / "scheduler.json").read_text())
    return {k: v for k, v in config.items() if not k.startswith("_")}


def _text_encoder(tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=TEXT_WIDTH,
            intermediate_size=2 * TEXT_WIDTH,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=2048,
            # Qwen2.5-VL's multimodal RoPE: the sections (temporal, height, width) split the head_dim / 2 = 8 frequencies
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]},
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
        ),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=TEXT_WIDTH,
                           fullatt_block_indexes=[0]),
    )
    return Qwen2_5_VLForConditionalGeneration(config)


def build_tiny_qwen_image_pipeline(tokenizer, seed: int = 0, image_size: int = 32):
    """A randomly initialised ``QwenImagePipeline`` of the real classes (see the module docstring).

    ``image_size`` is the side the tests generate at; it must fit the VAE's 4x compression and the 2x2 packing
    (a multiple of 8). Call the pipeline with ``max_sequence_length`` <= the text you want kept (16 in the tests).
    """
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    temporal_downsample = [False, True]  # two spatial downsamplings: vae_scale_factor 4
    multiple = 2 ** len(temporal_downsample) * 2
    if image_size % multiple:
        raise ValueError(f"image_size={image_size} does not fit the tiny Qwen-Image: it must be a multiple of "
                         f"{multiple} (VAE factor 4 x 2x2 packing)")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    vae = AutoencoderKLQwenImage(
        base_dim=16,
        z_dim=LATENT_CHANNELS,
        dim_mult=[1, 2, 2],
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=temporal_downsample,
        # per-channel statistics away from (0, 1), so decoding and encoding must apply them as the pipeline does
        latents_mean=(0.5 * torch.randn(LATENT_CHANNELS, generator=gen)).tolist(),
        latents_std=(0.5 + torch.rand(LATENT_CHANNELS, generator=gen)).tolist(),
    )
    head_dim = 16
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=4 * LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        num_layers=2,
        attention_head_dim=head_dim,
        num_attention_heads=2,
        joint_attention_dim=TEXT_WIDTH,
        axes_dims_rope=(4, 6, 6),  # frame, height, width rotary dims: they sum to head_dim
    )
    text_encoder = _text_encoder(tokenizer)
    for module in (vae, transformer, text_encoder):
        module.eval()  # as from_pretrained leaves them
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**qwen_image_scheduler_config()),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )


def build_tiny_qwen_tokenizer(corpus: list[str]):
    """The local Qwen tokenizer of ``corpus`` plus Qwen-Image's system prompt (one token per template word)."""
    from flowgrpo.models.random_init import PROMPT_TEMPLATES
    from flowgrpo.models.tokenizers import build_qwen_tokenizer

    return build_qwen_tokenizer(list(corpus) + list(PROMPT_TEMPLATES), max_length=64)


def save_tiny_qwen_image(folder, corpus: list[str]) -> str:
    """Build the tiny Qwen-Image with a tokenizer of ``corpus`` and ``save_pretrained`` it to ``folder``."""
    build_tiny_qwen_image_pipeline(build_tiny_qwen_tokenizer(corpus), seed=0).save_pretrained(folder)
    return str(folder)


__all__ = ["build_tiny_qwen_image_pipeline", "build_tiny_qwen_tokenizer", "qwen_image_scheduler_config",
           "save_tiny_qwen_image"]
