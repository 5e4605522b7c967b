"""Tiny models in the real diffusers architectures, built from configs (no downloads).

Two uses:
- the embedded default: ``flowgrpo pretrain-toy`` builds a tiny ``StableDiffusion3Pipeline`` with
  :func:`build_tiny_sd3_pipeline`, trains it on toy scenes and ships it in ``flowgrpo/tiny/assets``;
- the tests: random-weight tiny pipelines of the real classes (SD3, FLUX) to check adapters against.

Every component is the real class (``SD3Transformer2DModel``, ``AutoencoderKL``,
``CLIPTextModelWithProjection``, ``CLIPTokenizer``, ...); only the sizes are small. Tokenizers are
CLIP-format byte-level BPE vocabularies learned locally from a word list (flowgrpo/models/tokenizers.py), so they save and load with ``save_pretrained`` / ``from_pretrained`` like the real ones.
The size rules are in docs/environment.md (e.g. ``joint_attention_dim >= 2 x`` the CLIP width,
``AutoencoderKL.shift_factor`` must be set for SD3/FLUX decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# the tokenizers (built locally from a word list) live beside the models, which random-weight builds use too
from flowgrpo.models.tokenizers import build_clip_tokenizer, build_t5_tokenizer  # noqa: F401

# FLUX.1-dev's scheduler_config.json: a time shift that depends on the number of image tokens (FLUX.2 ships the same,
# as diffusers' scripts/convert_flux2_to_diffusers.py loads it)
FLUX_DEV_SCHEDULER = dict(
    num_train_timesteps=1000,
    shift=3.0,
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=4096,
)


@dataclass(frozen=True)
class TinySD3Sizes:
    """Sizes of a tiny SD3. Defaults: the shipped toy model (32x32 images, 4x8x8 latents, 16 image tokens)."""

    image_size: int = 32
    vae_channels: tuple[int, ...] = (16, 32, 32)  # 3 blocks: 32 px -> 8 latent px
    latent_channels: int = 4
    text_width: int = 64  # each of the two CLIP encoders
    text_layers: int = 3  # SD3 reads the penultimate hidden state
    text_projection: int = 32
    num_layers: int = 4
    num_heads: int = 4
    head_dim: int = 32
    patch_size: int = 2
    shift: float = 3.0  # SD3 time shift of the scheduler


def _clip_text_encoder(tokenizer, sizes: TinySD3Sizes):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=sizes.text_width,
        intermediate_size=2 * sizes.text_width,
        num_hidden_layers=sizes.text_layers,
        num_attention_heads=max(1, sizes.text_width // 32),
        max_position_embeddings=tokenizer.model_max_length,
        projection_dim=sizes.text_projection,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return CLIPTextModelWithProjection(config)


def _eval_mode(*modules: torch.nn.Module) -> None:
    """Built models start in eval mode, as ``from_pretrained`` leaves them."""
    for module in modules:
        module.eval()


def _t5_encoder(tokenizer, width: int, layers: int):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer),
            d_model=width,
            d_kv=width // 4,
            d_ff=2 * width,
            num_layers=layers,
            num_heads=4,
            dropout_rate=0.0,  # deterministic forward passes; the pretraining has data enough
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    )


def build_tiny_sd3_pipeline(tokenizer, sizes: TinySD3Sizes = TinySD3Sizes(), seed: int = 0):
    """A randomly initialised ``StableDiffusion3Pipeline`` of the real classes.

    All three text encoders are present (two CLIPs and a small T5 sharing the locally trained
    tokenizer), so ``StableDiffusion3Pipeline.from_pretrained(folder)`` needs no extra arguments.
    Pass ``max_sequence_length=tokenizer.model_max_length`` when calling the pipeline directly.
    """
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )

    torch.manual_seed(seed)
    n_blocks = len(sizes.vae_channels)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * n_blocks,
        up_block_types=("UpDecoderBlock2D",) * n_blocks,
        block_out_channels=sizes.vae_channels,
        layers_per_block=1,
        latent_channels=sizes.latent_channels,
        norm_num_groups=16,
        sample_size=sizes.image_size,
        scaling_factor=1.0,
        shift_factor=0.0,  # set from data statistics after VAE training
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    text_encoder = _clip_text_encoder(tokenizer, sizes)
    text_encoder_2 = _clip_text_encoder(tokenizer, sizes)
    latent_size = sizes.image_size // 2 ** (n_blocks - 1)
    inner = sizes.num_heads * sizes.head_dim
    transformer = SD3Transformer2DModel(
        sample_size=latent_size,
        patch_size=sizes.patch_size,
        in_channels=sizes.latent_channels,
        out_channels=sizes.latent_channels,
        num_layers=sizes.num_layers,
        attention_head_dim=sizes.head_dim,
        num_attention_heads=sizes.num_heads,
        joint_attention_dim=2 * sizes.text_width,  # the T5 width = the two CLIP widths side by side
        caption_projection_dim=inner,
        pooled_projection_dim=2 * sizes.text_projection,
        pos_embed_max_size=latent_size // sizes.patch_size,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=sizes.shift)
    _eval_mode(vae, text_encoder, text_encoder_2, transformer)
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer,
        text_encoder_3=_t5_encoder(tokenizer, 2 * sizes.text_width, sizes.text_layers - 1).eval(),
        tokenizer_3=tokenizer,
    )


def build_tiny_flux_pipeline(tokenizer, seed: int = 0, image_size: int = 32):
    """A randomly initialised ``FluxPipeline`` of the real classes, with a tiny T5 (for tests)."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        FluxPipeline,
        FluxTransformer2DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(16, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=16,
        sample_size=image_size,
        scaling_factor=1.0,
        shift_factor=0.0,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    clip = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=tokenizer.model_max_length,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    t5 = _t5_encoder(tokenizer, 32, 2)
    _eval_mode(vae, clip, t5)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,  # 4 x latent channels: FLUX packs 2x2 latent patches
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=(4, 6, 6),
        guidance_embeds=True,
    )
    return FluxPipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0),
        vae=vae,
        text_encoder=clip,
        tokenizer=tokenizer,
        text_encoder_2=t5,
        tokenizer_2=tokenizer,
    )


# ----------------------------------------------------------------------------- Wan (text-to-video)


@dataclass(frozen=True)
class TinyWanSizes:
    """Sizes of a tiny Wan2.1. Defaults: the toy video model (9 frames of 32x32 -> latents 16x3x8x8,
    one token per latent pixel: 192 tokens; Wan2.1's 2x2 patches left 48, and that model plateaued at
    a held-out score of 0.12).

    The VAE compresses 4x in time (as Wan's) and 4x in space (Wan: 8x), so 32 px frames still give
    an 8x8 latent; ``AutoencoderKLWan`` gets ``scale_factor_spatial=4`` because the pipeline reads
    it from the config instead of deriving it (docs/environment.md, "Tiny diffusers models built from configs").
    """

    num_frames: int = 9  # 4k + 1
    image_size: int = 32
    vae_base_dim: int = 16
    vae_dim_mult: tuple[int, ...] = (1, 2, 2)  # 3 levels: 2 spatial downsamplings (4x)
    vae_temporal_downsample: tuple[bool, ...] = (True, True)  # both downsamplings also halve time (4x)
    latent_channels: int = 16  # z_dim, as Wan2.1
    patch_size: tuple[int, int, int] = (1, 1, 1)  # (t, h, w) latent patch per token (Wan2.1: (1, 2, 2)); 1 keeps 4 px tokens
    text_width: int = 64  # UMT5 d_model = the transformer's text_dim
    text_layers: int = 2
    num_layers: int = 4
    num_heads: int = 4
    head_dim: int = 24  # rotary split t/h/w = 8/8/8
    ffn_dim: int = 256
    freq_dim: int = 64  # sinusoidal timestep embedding width
    shift: float = 3.0  # time shift of the scheduler (Wan2.1 uses 3.0 at 480p)


def build_tiny_wan_pipeline(tokenizer, sizes: TinyWanSizes = TinyWanSizes(), seed: int = 0, *,
                            boundary_ratio: float | None = None, expand_timesteps: bool = False):
    """A randomly initialised ``WanPipeline`` (Wan2.1 text-to-video) of the real classes.

    ``boundary_ratio`` makes it a Wan2.2 A14B-style pipeline: a second transformer (``transformer_2``, the
    low-noise expert, its own random weights) that denoises the timesteps below ``boundary_ratio x 1000``.
    ``expand_timesteps`` is Wan2.2 TI2V-5B's per-token timestep.

    ``WanTransformer3DModel``, ``AutoencoderKLWan``, ``UMT5EncoderModel`` and a T5 tokenizer
    (:func:`build_t5_tokenizer`), with a ``FlowMatchEulerDiscreteScheduler`` (Wan ships UniPC; the
    adapter only reads the shift). The VAE's ``latents_mean``/``latents_std`` start at 0/1; set
    them from data statistics after training the VAE. Saves with ``save_pretrained`` and loads with
    ``WanPipeline.from_pretrained``; call the pipeline with ``max_sequence_length=tokenizer.model_max_length``.
    """
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    if len(sizes.vae_temporal_downsample) != len(sizes.vae_dim_mult) - 1:
        raise ValueError("vae_temporal_downsample needs one flag per spatial downsampling (len(vae_dim_mult) - 1)")
    torch.manual_seed(seed)
    temporal = 2 ** sum(sizes.vae_temporal_downsample)
    spatial = 2 ** (len(sizes.vae_dim_mult) - 1)
    multiple = spatial * max(sizes.patch_size[1:])
    if (sizes.num_frames - 1) % temporal or sizes.image_size % multiple:
        raise ValueError(
            f"num_frames must be {temporal}k + 1 and image_size a multiple of {multiple}, got "
            f"{sizes.num_frames} frames of {sizes.image_size} px"
        )
    vae = AutoencoderKLWan(
        base_dim=sizes.vae_base_dim,
        z_dim=sizes.latent_channels,
        dim_mult=list(sizes.vae_dim_mult),
        num_res_blocks=1,
        attn_scales=[],
        temperal_downsample=list(sizes.vae_temporal_downsample),
        latents_mean=[0.0] * sizes.latent_channels,
        latents_std=[1.0] * sizes.latent_channels,
        scale_factor_temporal=temporal,
        scale_factor_spatial=spatial,
    )
    text_encoder = UMT5EncoderModel(
        UMT5Config(
            vocab_size=len(tokenizer),
            d_model=sizes.text_width,
            d_kv=sizes.text_width // 4,
            d_ff=2 * sizes.text_width,
            num_layers=sizes.text_layers,
            num_heads=4,
            dropout_rate=0.0,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    )
    latent_frames = (sizes.num_frames - 1) // temporal + 1
    transformer = WanTransformer3DModel(
        patch_size=tuple(sizes.patch_size),
        num_attention_heads=sizes.num_heads,
        attention_head_dim=sizes.head_dim,
        in_channels=sizes.latent_channels,
        out_channels=sizes.latent_channels,
        text_dim=sizes.text_width,
        freq_dim=sizes.freq_dim,
        ffn_dim=sizes.ffn_dim,
        num_layers=sizes.num_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=max(32, latent_frames, sizes.image_size // spatial),
    )
    _eval_mode(vae, text_encoder, transformer)
    experts = {}
    if boundary_ratio is not None:
        experts["transformer_2"] = WanTransformer3DModel.from_config(transformer.config).eval()
    return WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=sizes.shift),
        transformer=transformer,
        boundary_ratio=boundary_ratio,
        expand_timesteps=expand_timesteps,
        **experts,
    )


@dataclass(frozen=True)
class TinyKontextSizes:
    """Sizes of the tiny FLUX.1-Kontext, the embedded edit model (32x32 images, 4x8x8 latents: 16 latent tokens and 16
    source tokens of 2x2 patches). No guidance embedding: it runs true classifier-free guidance."""

    image_size: int = 32
    text_width: int = 64  # the CLIP text encoder (its pooled output) and the T5 encoder
    text_layers: int = 2
    num_layers: int = 3  # double-stream (joint) blocks
    num_single_layers: int = 3
    num_heads: int = 4
    head_dim: int = 32
    rope_axes: tuple[int, int, int] = (8, 12, 12)  # sums to head_dim: (frame, row, column) position ids
    shift: float = 3.0  # a fixed time shift, as the tiny SD3's (FLUX's dynamic shift would give 1.6 at 16 tokens)


def build_tiny_kontext_pipeline(tokenizer, sizes: TinyKontextSizes = TinyKontextSizes(), seed: int = 0, vae=None):
    """A ``FluxKontextPipeline`` of the real classes at ``sizes`` with random weights (``vae``: a trained
    ``AutoencoderKL`` to use instead of a random one: the edit model's pretraining takes the tiny SD3's)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    if vae is None:
        vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
                            up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(16, 32, 32), layers_per_block=1,
                            latent_channels=4, norm_num_groups=16, sample_size=sizes.image_size, scaling_factor=1.0,
                            shift_factor=0.0)
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=sizes.text_width, intermediate_size=2 * sizes.text_width,
        num_hidden_layers=sizes.text_layers, num_attention_heads=max(1, sizes.text_width // 32),
        max_position_embeddings=tokenizer.model_max_length, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    t5 = _t5_encoder(tokenizer, sizes.text_width, sizes.text_layers)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=4 * vae.config.latent_channels, num_layers=sizes.num_layers,
        num_single_layers=sizes.num_single_layers, attention_head_dim=sizes.head_dim, num_attention_heads=sizes.num_heads,
        joint_attention_dim=sizes.text_width, pooled_projection_dim=sizes.text_width, axes_dims_rope=sizes.rope_axes,
        guidance_embeds=False)
    _eval_mode(vae, clip, t5, transformer)
    return FluxKontextPipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=sizes.shift),
        vae=vae, text_encoder=clip, tokenizer=tokenizer, text_encoder_2=t5, tokenizer_2=tokenizer)


def save_tiny_kontext(folder, corpus: list[str]) -> str:
    """A random-weight tiny ``FluxKontextPipeline`` (the shipped edit model's architecture; its tokenizer learned from
    ``corpus`` and the editing world's instructions) saved in ``folder``: the tests' editing family."""
    from worlds.toy import edits

    words = list(corpus) + [edits.instruction(f) for task in edits.EDIT_TASKS for f in edits.all_instructions(task)]
    build_tiny_kontext_pipeline(build_clip_tokenizer(words, max_length=16)).save_pretrained(folder)
    return str(folder)
