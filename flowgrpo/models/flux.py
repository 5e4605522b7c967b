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
from diffusers import FluxKontextPipeline, FluxPipeline

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


class FluxKontextModel(FluxModel):
    """FLUX.1-Kontext (``FluxKontextPipeline``): FLUX.1 that edits a source image given an instruction.

    The source is the prompt's condition image (flowgrpo/conditions.py). As the pipeline does, it is resized to the
    output size with the pipeline's image processor (the pipeline's ``_auto_resize=False`` path: flowgrpo trains at
    ``model.resolution``, not at Kontext's preferred resolutions), encoded by the VAE (its mode, then
    ``(z - shift_factor) * scaling_factor``) and packed 2x2 like the latents; every transformer call appends its
    tokens after the noisy latent's, with image ids whose first coordinate is 1 (the pipeline's ``image_ids``), and
    keeps the output's first tokens (the latent's). The time shift counts the latent's tokens only, as the pipeline's
    ``calculate_shift(latents.shape[1])``. A prompt without a source runs as FLUX.1 (the pipeline's text-to-image
    path). Guidance, timestep and text are FLUX.1's.
    """

    pipeline_class = FluxKontextPipeline

    def _encode_references(self, images: list[list]) -> tuple[torch.Tensor, ...]:
        """The sources [P, C, h, w]: the pipeline's resize and preprocess at the output size, the VAE's mode, shifted
        and scaled (``FluxKontextPipeline._encode_vae_image``)."""
        height, width = self.config.resolution, self.config.width or self.config.resolution
        processor = self.pipeline.image_processor
        pixels = torch.cat([processor.preprocess(processor.resize(row[0], height, width), height, width)
                            for row in images]).to(self.device, self.vae.dtype)
        return (self.pipeline._encode_vae_image(pixels, generator=None).float(),)

    def _transformer_velocity(self, transformer, x, sigma, cond, guidance_scale):
        if cond.references is None:
            return super()._transformer_velocity(transformer, x, sigma, cond, guidance_scale)
        guidance = None
        if self.guidance_embeds:
            guidance = torch.full([x.shape[0]], guidance_scale, device=self.device, dtype=torch.float32)
        return kontext_call(transformer, x, cond.references[0].to(self.device, self.dtype),
                            self._model_time(sigma).to(self.dtype) / 1000,  # as FLUX.1: t.to(latent dtype) / 1000
                            guidance, cond.pooled_prompt_embeds.to(self.dtype), cond.prompt_embeds.to(self.dtype),
                            cond.text_ids.to(self.dtype), self.pipeline.vae_scale_factor)


def kontext_call(transformer, x: torch.Tensor, source: torch.Tensor, timestep: torch.Tensor, guidance, pooled: torch.Tensor,
                 embeds: torch.Tensor, text_ids: torch.Tensor, vae_scale_factor: int) -> torch.Tensor:
    """One FLUX.1-Kontext transformer call on UNPACKED latents x [N, C, h, w] and sources [N, C, h', w']: both packed
    2x2, the source's tokens after the latent's with image ids whose first coordinate is 1 (the pipeline's
    ``image_ids``), the output's first tokens (the latent's) unpacked: ``FluxKontextPipeline``'s step. Also the tiny
    edit model's pretraining call (flowgrpo/tiny/pretrain_edit.py)."""
    n, channels, h, w = x.shape
    hs, ws = source.shape[-2:]
    tokens = torch.cat([FluxPipeline._pack_latents(x, n, channels, h, w),
                        FluxPipeline._pack_latents(source, n, channels, hs, ws)], dim=1)
    img_ids = FluxPipeline._prepare_latent_image_ids(n, h // 2, w // 2, x.device, x.dtype)
    source_ids = FluxPipeline._prepare_latent_image_ids(n, hs // 2, ws // 2, x.device, x.dtype)
    source_ids[..., 0] = 1  # the source is a second "frame"
    out = transformer(hidden_states=tokens, timestep=timestep, guidance=guidance, pooled_projections=pooled,
                      encoder_hidden_states=embeds, txt_ids=text_ids, img_ids=torch.cat([img_ids, source_ids]),
                      return_dict=False)[0][:, : (h // 2) * (w // 2)]  # the pipeline's noise_pred[:, : latents.size(1)]
    return FluxPipeline._unpack_latents(out, h * vae_scale_factor, w * vae_scale_factor, vae_scale_factor)
