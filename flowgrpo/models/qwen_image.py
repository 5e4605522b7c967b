"""Qwen-Image adapter: ``QwenImagePipeline``'s own components and methods.

What the pipeline does, and how the adapter mirrors it:

- **Prompts.** ``encode_prompt`` wraps each prompt in Qwen-Image's system template, runs Qwen2.5-VL and keeps the
  last hidden state of the real tokens after dropping the template's first 34 tokens (the system prompt); the rows
  are zero-padded to the longest prompt and truncated to ``max_sequence_length``, with a token mask. The adapter
  calls it and pads every chunk to ``model.max_sequence_length`` tokens (``Conditioning.prompt_mask`` says which are
  real), so prompt rows and the negative row concatenate. Each transformer call drops the padding columns no row of
  its batch uses and passes no mask when every token left is real, as the pipeline's batches are (padded to their
  longest prompt; the mask dropped when all tokens are real). The transformer masks the padded text keys in its
  joint attention and gives the text tokens RoPE positions after the image's, so the padding changes nothing but
  rounding (tested against the pipeline).
- **Latents.** The VAE (``AutoencoderKLQwenImage``) is 3-D: ``[N, C, 1, H/8, W/8]`` with one frame. The interface
  takes UNPACKED 4-D latents ``[N, C, h, w]`` (16 channels) like the other image families; each call packs them 2x2
  into 64-channel tokens with ``QwenImagePipeline._pack_latents``, passes ``img_shapes = [(1, h/2, w/2)]`` per row
  for the transformer's RoPE, and unpacks the output with ``_unpack_latents`` (dropping the frame axis).
- **Timestep.** The pipeline casts the scheduler's ``t = sigma * 1000`` to the latent dtype and passes ``t / 1000``;
  the transformer's sinusoidal projection multiplies by 1000 again. Same here.
- **Guidance: true CFG with norm rescaling.** Qwen-Image is not guidance-distilled (``guidance_embeds`` false). The
  pipeline runs CFG when ``true_cfg_scale > 1`` and a negative prompt is given: ``comb = v_u + g (v_c - v_u)``,
  then ``comb * ||v_c|| / ||comb||`` with the norms per packed image token (over its 64 channels). The adapter
  batches the two passes as one call ``[uncond; cond]`` (the pipeline makes two calls; the same numbers up to
  rounding, tested) and overrides ``FlowModel._guide`` for the rescaled combination. The negative prompt is
  ``" "`` (one space), what the Qwen-Image model card passes (``negative_prompt=" "``, ``true_cfg_scale=4.0``);
  ``guidance_scale`` in the model config is the pipeline's ``true_cfg_scale``; <= 1 is one conditional pass.
- **Time shift.** Dynamic shifting: ``mu = calculate_shift(image tokens, ...)`` with the scheduler's
  ``base_image_seq_len`` 256, ``max_image_seq_len`` 8192, ``base_shift`` 0.5, ``max_shift`` 0.9 (Qwen-Image's
  scheduler config), ``shift = exp(mu)`` (the base class computes it with the pipeline module's ``calculate_shift``).
  Qwen-Image's scheduler also has ``shift_terminal: 0.02``: it stretches its sigmas so the last one before 0 is
  0.02. ``FlowModel`` reads it (``model.shift_terminal``) and the samplers' grids apply the same stretch
  (``samplers.grids.time_grid(T, shift, terminal)``), so rollouts and evaluation run on the pipeline's own grid.
- **Decoding.** ``latents / (1 / latents_std) + latents_mean`` per channel (the pipeline's arithmetic), the VAE on
  one frame, the first frame, ``image_processor.postprocess``.
- **LoRA.** Qwen-Image's dual-stream blocks name their attention projections as SD3 / FLUX do (``attn.to_q/k/v``,
  ``attn.to_out.0`` for the image stream, ``attn.add_q/k/v_proj``, ``attn.to_add_out`` for the text stream), so
  the default targets are flowgrpo's (every attention projection of both streams). ``save_trainable`` writes
  diffusers' LoRA file, which ``QwenImagePipeline.load_lora_weights`` loads (tested).
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import QwenImagePipeline

from flowgrpo.models.base import FlowModel

# the negative prompt of Qwen-Image's model card (an empty-looking prompt of one space): CFG's unconditional row
NEGATIVE_PROMPT = " "
MAX_TEXT_TOKENS = 1024  # QwenImagePipeline.check_inputs' limit on max_sequence_length


class QwenImageModel(FlowModel):
    pipeline_class = QwenImagePipeline
    _default_max_shift = 1.15  # QwenImagePipeline's fallback when the scheduler config has no max_shift
    negative_prompt = NEGATIVE_PROMPT

    def _load_components(self) -> None:
        super()._load_components()
        if self.transformer.config.guidance_embeds:
            raise ValueError(
                f"{self.config.pretrained} has a guidance-distilled Qwen-Image transformer (guidance_embeds=true); "
                "flowgrpo's qwen_image family runs Qwen-Image's true CFG only: use a checkpoint without guidance "
                "embeddings (Qwen/Qwen-Image)")

    # ---------------------------------------------------------------- prompts
    def _encode(self, prompts: list[str]):
        length = self.config.max_sequence_length
        if length > MAX_TEXT_TOKENS:
            raise ValueError(f"Qwen-Image takes at most {MAX_TEXT_TOKENS} text tokens; set model.max_sequence_length "
                             f"<= {MAX_TEXT_TOKENS} (it is {length})")
        embeds, mask = self.pipeline.encode_prompt(prompt=prompts, device=self.device, max_sequence_length=length)
        if mask is None:  # encode_prompt drops the mask when every token is real
            mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        pad = length - embeds.shape[1]  # to the fixed length, so every chunk and the negative row concatenate
        embeds = torch.nn.functional.pad(embeds, (0, 0, 0, pad))
        mask = torch.nn.functional.pad(mask, (0, pad))
        return embeds, None, None, mask

    # ---------------------------------------------------------------- the transformer call
    def _transformer_velocity(self, transformer, x, sigma, cond, guidance_scale):
        """QwenImagePipeline's call: latents packed 2x2 into tokens, ``img_shapes`` for the RoPE, timestep t/1000
        in the latent dtype, the text embeddings with their mask."""
        n, channels, h, w = x.shape
        packed = QwenImagePipeline._pack_latents(x, n, channels, h, w)
        t = self._model_time(sigma)  # the scheduler's timestep
        embeds, mask = self._trim_text(cond.prompt_embeds, cond.prompt_mask)
        out = transformer(
            hidden_states=packed,
            timestep=t.to(self.dtype) / 1000,  # exactly as the pipeline: t.expand(...).to(latents.dtype) / 1000
            guidance=None,
            encoder_hidden_states_mask=mask,
            encoder_hidden_states=embeds.to(self.dtype),
            img_shapes=[[(1, h // 2, w // 2)]] * n,  # the pipeline's img_shapes: one frame of (h/2) x (w/2) tokens
            return_dict=False,
        )[0]
        return self._unpack(out, h, w)

    def _trim_text(self, embeds: torch.Tensor, mask: Optional[torch.Tensor]) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The text of one call as the pipeline would pass it: padded only to the longest prompt of the batch (the
        columns no row uses are dropped, which saves attending over them), and no mask when every token left is real
        (encode_prompt's rule; unmasked attention can use the fastest kernels). With context parallelism the text
        tokens are split over the group too: their count is padded (masked) to a multiple of its size."""
        if mask is None:
            return embeds, None
        used = mask.bool().any(dim=0).nonzero()
        length = int(used.max()) + 1 if used.numel() else mask.shape[1]
        length = -(-length // self.sequence_multiple) * self.sequence_multiple
        if length > embeds.shape[1]:
            embeds = torch.nn.functional.pad(embeds, (0, 0, 0, length - embeds.shape[1]))
            mask = torch.nn.functional.pad(mask, (0, length - mask.shape[1]))
        embeds, mask = embeds[:, :length], mask[:, :length]
        return embeds, None if bool(mask.all()) else mask

    def _unpack(self, packed: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """Tokens [N, h/2 * w/2, 4C] -> unpacked latents [N, C, h, w] (the pipeline's _unpack_latents, one frame)."""
        factor = self.pipeline.vae_scale_factor
        return QwenImagePipeline._unpack_latents(packed, h * factor, w * factor, factor).squeeze(2)

    def _guide(self, v_uncond: torch.Tensor, v_cond: torch.Tensor, scale: float) -> torch.Tensor:
        """The pipeline's true CFG: ``comb = v_u + g (v_c - v_u)``, rescaled so each packed image token (64 values:
        16 channels x 2x2) has the norm of the conditional prediction's token."""
        n, channels, h, w = v_cond.shape
        cond = QwenImagePipeline._pack_latents(v_cond, n, channels, h, w)
        comb = QwenImagePipeline._pack_latents(v_uncond + scale * (v_cond - v_uncond), n, channels, h, w)
        cond_norm = torch.norm(cond, dim=-1, keepdim=True)
        noise_norm = torch.norm(comb, dim=-1, keepdim=True)
        return self._unpack(comb * (cond_norm / noise_norm), h, w)

    # ---------------------------------------------------------------- shapes
    def latent_shape(self, height: Optional[int] = None, width: Optional[int] = None) -> tuple[int, ...]:
        height = height or self.config.resolution
        width = width or self.config.width or self.config.resolution
        factor = self.pipeline.vae_scale_factor
        self._check_resolution(height, width, factor * 2)  # the VAE factor x the 2x2 packing (check_inputs' rule)
        return (int(self.transformer.config.in_channels) // 4, height // factor, width // factor)

    def _latent_multiple(self) -> int:
        return 2  # 2x2 packing

    def _image_seq_len(self) -> int:
        _, h, w = self.latent_shape()
        return (h // 2) * (w // 2)  # packed tokens, as the pipeline passes latents.shape[1] to calculate_shift

    # ---------------------------------------------------------------- VAE
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [N, C, h, w] -> images float32 [N, 3, H, W] in [0, 1], as QwenImagePipeline decodes."""
        latents = latents.to(self.device, self.vae.dtype).unsqueeze(2)  # one frame: [N, C, 1, h, w]
        mean, std = self._latent_stats(latents.dtype)
        images = self.vae.decode(latents / (1.0 / std) + mean, return_dict=False)[0][:, :, 0]
        return self.pipeline.image_processor.postprocess(images, output_type="pt").float()

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images [N, 3, H, W] in [0, 1] -> latents float32 [N, C, h, w] (VAE mean, normalised per channel)."""
        pixels = self.pipeline.image_processor.normalize(images.to(self.device, self.vae.dtype)).unsqueeze(2)
        latents = self.vae.encode(pixels).latent_dist.mean
        mean, std = self._latent_stats(latents.dtype)
        return ((latents - mean) / std).squeeze(2).float()
