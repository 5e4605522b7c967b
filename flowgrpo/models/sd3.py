"""SD3 / SD3.5 adapter: ``StableDiffusion3Pipeline``'s own components and methods.

- prompts: ``pipeline.encode_prompt`` (CLIP-L, CLIP-G, T5); the unconditional row is the empty
  prompt, as the pipeline's default negative prompt;
- velocity: ``transformer(hidden_states, timestep=sigma * num_train_timesteps, ...)`` as the
  pipeline calls it (its timesteps are ``scheduler.sigmas * num_train_timesteps``), with CFG when
  ``guidance_scale > 1`` as one batched ``[uncond; cond]`` call.
"""

from __future__ import annotations

from typing import Optional

from diffusers import StableDiffusion3Pipeline

from flowgrpo.models.base import FlowModel
from flowgrpo.models.conditioning import Conditioning


class SD3Model(FlowModel):
    pipeline_class = StableDiffusion3Pipeline
    _default_max_shift = 1.16  # StableDiffusion3Pipeline's default for dynamic shifting

    def _encode(self, prompts: list[str]):
        embeds, _, pooled, _ = self.pipeline.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.config.max_sequence_length,
        )
        return embeds, pooled, None

    def _extra_inputs(self, cond: Conditioning) -> dict:
        return {"pooled_projections": cond.pooled_prompt_embeds.to(self.dtype)}

    def latent_shape(self, height: Optional[int] = None, width: Optional[int] = None) -> tuple[int, ...]:
        height = height or self.config.resolution
        width = width or self.config.width or self.config.resolution
        factor = self.pipeline.vae_scale_factor
        self._check_resolution(height, width, factor * self.transformer.config.patch_size)
        return (int(self.transformer.config.in_channels), height // factor, width // factor)

    def _image_seq_len(self) -> int:
        _, h, w = self.latent_shape()
        patch = self.transformer.config.patch_size
        return (h // patch) * (w // patch)
