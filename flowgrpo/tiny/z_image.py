"""A tiny random ``ZImagePipeline`` of the real classes (tests, training checks): no downloads, seconds on a CPU.

``ZImageTransformer2DModel`` (one main layer, one noise and one context refiner), a ``Qwen3Model`` text encoder from
``Qwen3Config`` (two layers: the pipeline reads the penultimate hidden state), an ``AutoencoderKL`` with the FLUX.1
VAE's 16 latent channels, ``scaling_factor`` and ``shift_factor`` (so decoding checks them), Z-Image-Turbo's
scheduler (static shift 3), and a local Qwen-format tokenizer with the chat template
(``flowgrpo.models.tokenizers.build_qwen_tokenizer``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from flowgrpo.models.tokenizers import build_qwen_tokenizer

# what ZImagePipeline's chat template renders around a prompt (enable_thinking=True adds no <think> block): in the
# tokenizer's corpus, so "user" and "assistant" are one token each, as in Qwen's vocabulary
Z_IMAGE_TEMPLATE = "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"
# Z-Image-Turbo's scheduler/scheduler_config.json (configs/models/architectures/z_image_turbo/scheduler.json)
TURBO_SCHEDULER = dict(num_train_timesteps=1000, use_dynamic_shifting=False, shift=3.0)


def build_tiny_z_image_pipeline(tokenizer, seed: int = 0, image_size: int = 32):
    """A randomly initialised ``ZImagePipeline``: latents 16 x image_size/4 x image_size/4 (a 3-block VAE, factor 4),
    2x2 patches; call the pipeline with ``max_sequence_length`` no longer than the tokenizer's corpus needs."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(seed)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 32),
        layers_per_block=1,
        latent_channels=16,  # the FLUX.1 VAE's
        norm_num_groups=16,
        sample_size=image_size,
        scaling_factor=0.3611,  # the FLUX.1 VAE's (Z-Image ships it): decoding divides, then shifts
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    text_encoder = Qwen3Model(
        Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,  # grouped-query attention, as Qwen3-4B (32 heads, 8 key/value heads)
            head_dim=16,
            max_position_embeddings=512,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=True,
        )
    )
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=32,
        n_layers=1,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        norm_eps=1e-5,
        qk_norm=True,
        cap_feat_dim=32,  # the text encoder's width
        rope_theta=256.0,
        t_scale=1000.0,
        axes_dims=[4, 6, 6],  # sums to the head dim 32 / 2
        axes_lens=[256, 32, 32],  # text positions (up to the padded length + image offset), h / 2, w / 2
    )
    for module in (vae, text_encoder, transformer):
        module.eval()  # as from_pretrained leaves them
    return ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**TURBO_SCHEDULER),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )


def build_z_image_tokenizer(corpus: list[str], max_length: int = 16):
    """The local Qwen-format tokenizer of the tiny pipeline: the corpus plus the chat template's words."""
    return build_qwen_tokenizer(list(corpus) + [Z_IMAGE_TEMPLATE], max_length=max_length)


def save_tiny_z_image(folder, corpus: list[str]) -> str:
    """Build the tiny pipeline with a tokenizer of ``corpus`` (+ the chat template), ``save_pretrained(folder)``."""
    build_tiny_z_image_pipeline(build_z_image_tokenizer(corpus), seed=0).save_pretrained(Path(folder))
    return str(folder)


__all__ = ["Z_IMAGE_TEMPLATE", "build_tiny_z_image_pipeline", "build_z_image_tokenizer", "save_tiny_z_image"]
