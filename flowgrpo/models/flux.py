"""FLUX.1 adapter: ``FluxPipeline``'s own components and static methods.

The interface takes UNPACKED latents [N, C, h, w]; each call packs them into 2x2 patches with
``FluxPipeline._pack_latents``, builds position ids with ``_prepare_latent_image_ids`` and unpacks
the output with ``_unpack_latents``, so samplers see the same shapes as for SD3.

Guidance. FLUX.1-dev is guidance-distilled: ``guidance_scale`` is fed to the transformer as an
embedding (``guidance_embeds=True``) and each step is ONE conditional pass. For a FLUX transformer
without guidance embeddings (FLUX.1-schnell, de-distilled variants) ``guidance_scale > 1`` is true
classifier-free guidance against the empty prompt, batched as ``[uncond; cond]`` like SD3 (the
pipeline's ``true_cfg_scale`` with ``negative_prompt=""`` computes the same in two calls).

Timesteps follow the pipeline exactly: it casts ``t = sigma * 1000`` to the latent dtype and passes
``t / 1000``; the transformer multiplies by 1000 again.
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import FluxPipeline

from flowgrpo.models.base import FlowModel


class FluxModel(FlowModel):
    pipeline_class = FluxPipeline
    _default_max_shift = 1.15  # FluxPipeline's default for dynamic shifting

    @property
    def guidance_embeds(self) -> bool:
        """Whether the transformer takes guidance as an input (FLUX.1-dev) instead of two-pass CFG."""
        return bool(self.transformer.config.guidance_embeds)

    def _encode(self, prompts: list[str]):
        if self.config.max_sequence_length > 512:  # FluxPipeline.check_inputs' limit
            raise ValueError("FLUX takes at most 512 T5 tokens; set model.max_sequence_length <= 512")
        embeds, pooled, text_ids = self.pipeline.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            device=self.device,
            max_sequence_length=self.config.max_sequence_length,
        )
        return embeds, pooled, text_ids

    def _uses_cfg(self, guidance_scale: float) -> bool:
        return not self.guidance_embeds and guidance_scale > 1.0

    def _transformer_velocity(self, transformer, x, sigma, cond, guidance_scale):
        """FluxPipeline's call: latents packed 2x2 into tokens with their image ids, timestep t/1000, and the
        guidance embedding of guidance-distilled models (FLUX.1-dev)."""
        n, channels, h, w = x.shape
        packed = FluxPipeline._pack_latents(x, n, channels, h, w)
        img_ids = FluxPipeline._prepare_latent_image_ids(n, h // 2, w // 2, self.device, self.dtype)
        t = self._model_time(sigma)  # the scheduler's timestep
        guidance = None
        if self.guidance_embeds:
            guidance = torch.full([n], guidance_scale, device=self.device, dtype=torch.float32)
        out = transformer(
            hidden_states=packed,
            timestep=t.to(self.dtype) / 1000,  # exactly as FluxPipeline: t.to(latents.dtype) / 1000
            guidance=guidance,
            pooled_projections=cond.pooled_prompt_embeds.to(self.dtype),
            encoder_hidden_states=cond.prompt_embeds.to(self.dtype),
            txt_ids=cond.text_ids.to(self.dtype),
            img_ids=img_ids,
            return_dict=False,
        )[0]
        factor = self.pipeline.vae_scale_factor
        return FluxPipeline._unpack_latents(out, h * factor, w * factor, factor)

    def latent_shape(self, height: Optional[int] = None, width: Optional[int] = None) -> tuple[int, ...]:
        height = height or self.config.resolution
        width = width or self.config.width or self.config.resolution
        factor = self.pipeline.vae_scale_factor
        self._check_resolution(height, width, factor * 2 * self.transformer.config.patch_size)
        return (int(self.transformer.config.in_channels) // 4, height // factor, width // factor)

    def _latent_multiple(self) -> int:
        return 2 * int(self.transformer.config.patch_size)  # 2x2 packing

    def _image_seq_len(self) -> int:
        _, h, w = self.latent_shape()
        return (h // 2) * (w // 2)  # packed tokens, as FluxPipeline passes latents.shape[1]
