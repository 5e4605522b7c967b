"""Tiny random FLUX.2 pipelines of the real classes (no downloads), for tests and training checks.

``build_tiny_flux2_klein_pipeline``: ``Flux2KleinPipeline`` with ``Flux2Transformer2DModel`` (one double-stream and
one single-stream block, no guidance embedder), ``AutoencoderKLFlux2`` (3 levels: 32 px -> 8 x 8 latents -> 4 x 4
patchified tokens), a tiny ``Qwen3ForCausalLM`` and a local ``Qwen2TokenizerFast`` with Qwen's chat template
(flowgrpo/models/tokenizers.py). ``build_tiny_flux2_pipeline``: ``Flux2Pipeline`` with a guidance-embedding
transformer, a tiny ``Mistral3ForConditionalGeneration`` (tiny Pixtral vision tower) and a local ``PixtralProcessor``
whose tokenizer is a byte-level BPE with Mistral's control tokens and a Mistral-Small-3 style chat template.

Sizes that matter: the pipelines read the text encoders' hidden states of fixed layers (klein 9, 18, 27; dev 10,
20, 30), so the tiny encoders keep that many layers (at width 32 they are still small). The VAE's BatchNorm
statistics get non-trivial random values, so the latent normalisation is exercised. Scheduler: FLUX.2's published
scheduler configuration (dynamic shifting; the pipelines compute ``mu`` themselves).
"""

from __future__ import annotations

from pathlib import Path

import torch

from flowgrpo.models.tokenizers import build_mistral_processor, build_qwen_tokenizer  # noqa: F401  (re-exported)

from flowgrpo.tiny.builders import FLUX_DEV_SCHEDULER

# FLUX.2's scheduler_config.json: FLUX.1-dev's, with its (default) exponential time shift written out
FLUX2_SCHEDULER = dict(FLUX_DEV_SCHEDULER, time_shift_type="exponential")
TEXT_WIDTH = 32  # each text encoder's hidden size; the transformer's joint_attention_dim is 3 x this
KLEIN_TEXT_LAYERS = 28  # hidden_states[27] is read: 28 layers keep it an intermediate layer, as in Qwen3 (36)
DEV_TEXT_LAYERS = 31  # hidden_states[30] is read (Mistral-Small-3 has 40)


def _tiny_vae(image_size: int, latent_channels: int = 4):
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(16, 32, 32),  # 3 levels: factor 4, so 32 px -> 8 x 8 latents -> 4 x 4 after the 2x2 patchify
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=16,
        sample_size=image_size,
    )
    with torch.no_grad():  # BatchNorm statistics of a trained VAE are not 0 / 1: make the normalisation matter
        vae.bn.running_mean.copy_(0.3 * torch.randn_like(vae.bn.running_mean))
        vae.bn.running_var.copy_(torch.empty_like(vae.bn.running_var).uniform_(0.5, 2.0))
    return vae


def _tiny_transformer(latent_channels: int, guidance_embeds: bool):
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=4 * latent_channels,  # the 2x2-patchified VAE latent
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=3 * TEXT_WIDTH,  # three stacked text-encoder layers
        timestep_guidance_channels=32,
        mlp_ratio=3.0,
        axes_dims_rope=(4, 4, 4, 4),  # (T, H, W, L), summing to the head dim
        guidance_embeds=guidance_embeds,
    )


def _scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**FLUX2_SCHEDULER)


# ----------------------------------------------------------------------------- klein (Qwen3)

# the text Flux2KleinPipeline renders around a prompt (chat template, thinking disabled): in the tokenizer's corpus
KLEIN_TEMPLATE = "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def build_klein_tokenizer(corpus: list[str], max_length: int = 16):
    """A local Qwen2TokenizerFast (Qwen's specials and chat template) for the corpus and klein's prompt template."""
    return build_qwen_tokenizer(list(corpus) + [KLEIN_TEMPLATE], max_length=max_length)


def build_tiny_flux2_klein_pipeline(tokenizer, seed: int = 0, image_size: int = 32, is_distilled: bool = False):
    """A randomly initialised ``Flux2KleinPipeline`` (base, CFG when ``guidance_scale > 1``; ``is_distilled=True``:
    the step-distilled kind, CFG-free)."""
    from diffusers import Flux2KleinPipeline
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    vae = _tiny_vae(image_size)
    text_encoder = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=TEXT_WIDTH,
            intermediate_size=2 * TEXT_WIDTH,
            num_hidden_layers=KLEIN_TEXT_LAYERS,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=256,
            tie_word_embeddings=True,  # as Qwen3-4B
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )
    transformer = _tiny_transformer(vae.config.latent_channels, guidance_embeds=False)
    for module in (vae, text_encoder, transformer):
        module.eval()
    return Flux2KleinPipeline(scheduler=_scheduler(), vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                              transformer=transformer, is_distilled=is_distilled)


def save_tiny_flux2_klein(folder, corpus: list[str], is_distilled: bool = False) -> str:
    """Build the tiny klein pipeline with a tokenizer of ``corpus`` (+ klein's template), save it, return the folder."""
    build_tiny_flux2_klein_pipeline(build_klein_tokenizer(corpus), is_distilled=is_distilled).save_pretrained(folder)
    return str(folder)


# ----------------------------------------------------------------------------- dev (Mistral-Small-3)

def build_tiny_flux2_pipeline(processor, seed: int = 0, image_size: int = 32):
    """A randomly initialised ``Flux2Pipeline`` (FLUX.2 [dev]: embedded guidance) with a tiny Mistral3 encoder."""
    from diffusers import Flux2Pipeline
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, MistralConfig, PixtralVisionConfig

    torch.manual_seed(seed)
    tokenizer = processor.tokenizer
    vae = _tiny_vae(image_size)
    config = Mistral3Config(
        text_config=MistralConfig(
            vocab_size=len(tokenizer),
            hidden_size=TEXT_WIDTH,
            intermediate_size=2 * TEXT_WIDTH,
            num_hidden_layers=DEV_TEXT_LAYERS,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=256,
            sliding_window=None,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        vision_config=PixtralVisionConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=1, head_dim=16,
            image_size=32, patch_size=8,
        ),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=2,
        multimodal_projector_bias=False,
    )
    text_encoder = Mistral3ForConditionalGeneration(config)
    transformer = _tiny_transformer(vae.config.latent_channels, guidance_embeds=True)
    for module in (vae, text_encoder, transformer):
        module.eval()
    return Flux2Pipeline(scheduler=_scheduler(), vae=vae, text_encoder=text_encoder, tokenizer=processor,
                         transformer=transformer)


def save_tiny_flux2(folder, corpus: list[str]) -> str:
    """Build the tiny FLUX.2 [dev] pipeline with a processor of ``corpus`` (+ the system message), save it, return
    the folder."""
    build_tiny_flux2_pipeline(build_mistral_processor(corpus)).save_pretrained(folder)
    return str(Path(folder))


__all__ = ["FLUX2_SCHEDULER", "KLEIN_TEMPLATE", "build_klein_tokenizer", "build_mistral_processor",
           "build_tiny_flux2_klein_pipeline", "build_tiny_flux2_pipeline", "save_tiny_flux2", "save_tiny_flux2_klein"]
