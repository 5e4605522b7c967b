"""Wan2.1 text-to-video adapter: ``WanPipeline``'s own components and methods.

- latents are 5-D, ``[N, C, f, h, w]`` with ``f = (num_frames - 1) / t + 1`` and ``h, w = H / s, W / s``,
  where ``t`` and ``s`` are the VAE's ``scale_factor_temporal`` / ``scale_factor_spatial`` (Wan2.1:
  4 and 8; 81 frames of 480x832 -> 16 x 21 x 60 x 104), exactly as ``WanPipeline.prepare_latents``;
- prompts: ``pipeline.encode_prompt`` (UMT5, padded to ``max_sequence_length`` with zeros past
  each prompt's tokens); the unconditional row is the empty prompt, the pipeline's default negative;
- velocity: ``transformer(hidden_states, timestep=sigma * num_train_timesteps, encoder_hidden_states)``
  as the pipeline calls it; CFG when ``guidance_scale > 1``. The pipeline makes the conditional and
  unconditional passes as two calls; here they are one batched ``[uncond; cond]`` call (the same
  numbers up to float rounding, tested), identical in rollout and training;
- decode: ``latents * latents_std + latents_mean`` per channel, ``vae.decode``, then the pipeline's
  ``video_processor.postprocess_video`` -> float32 ``[N, F, 3, H, W]`` in [0, 1], the layout of the
  video reward contract (``rewards/base.py``).

Wan2.2. The A14B models are two experts of the Wan2.1-14B shape: ``transformer`` denoises the high-noise
timesteps (t >= ``boundary_ratio`` x 1000, 0.875 for text-to-video), ``transformer_2`` the rest, each with its own
CFG scale (``guidance_scale``, ``guidance_scale_2``). ``FlowModel`` routes every velocity call row by row
(``_routes``), so a rollout and every learner's recompute of a step use the same expert; ``model.trained_experts``
picks which of the two train. TI2V-5B is one network with ``expand_timesteps``: the timestep is given per latent
token, as the pipeline does for text-to-video (every token at t).

Wan ships a ``UniPCMultistepScheduler`` with ``flow_shift`` (3.0 at 480p, 5.0 at 720p); the
adapter reads that shift, and the samplers own the sigma grid. UniPC rounds its timesteps to
integers; the adapter passes ``sigma * 1000`` unrounded (as ``FlowMatchEulerDiscreteScheduler``),
which the transformer's sinusoidal embedding takes as it is.
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import WanPipeline

from flowgrpo.models.base import FlowModel


class WanModel(FlowModel):
    pipeline_class = WanPipeline

    def _encode(self, prompts: list[str]):
        embeds, _ = self.pipeline.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.config.max_sequence_length,
            device=self.device,
        )
        return embeds, None, None

    def _transformer_velocity(self, transformer, x, sigma, cond, guidance_scale):
        """The DiT call; for pipelines with ``expand_timesteps`` (Wan2.2 TI2V-5B) the timestep is one per token,
        ``[B, f * h/2 * w/2]``, every token at the step's t, as WanPipeline builds it for text-to-video."""
        if not self.pipeline.config.get("expand_timesteps", False):
            return super()._transformer_velocity(transformer, x, sigma, cond, guidance_scale)
        _, ph, pw = transformer.config.patch_size
        tokens = x.shape[2] * (x.shape[3] // ph) * (x.shape[4] // pw)
        timestep = self._model_time(sigma)[:, None].expand(-1, tokens)
        return transformer(hidden_states=x, timestep=timestep, encoder_hidden_states=cond.prompt_embeds.to(self.dtype),
                           return_dict=False)[0]

    def latent_shape(
        self, height: Optional[int] = None, width: Optional[int] = None, num_frames: Optional[int] = None
    ) -> tuple[int, ...]:
        """Per-sample (C, f, h, w) of the latent of a num_frames x height x width video."""
        height = height or self.config.resolution
        width = width or self.config.width or self.config.resolution
        num_frames = num_frames or self.config.num_frames
        spatial = self.pipeline.vae_scale_factor_spatial
        temporal = self.pipeline.vae_scale_factor_temporal
        self._check_resolution(height, width, spatial * self._latent_multiple())
        if (num_frames - 1) % temporal:
            raise ValueError(
                f"num_frames={num_frames} does not fit {type(self).__name__}: its VAE compresses time "
                f"{temporal}x, so num_frames must be {temporal}k + 1; change model.num_frames"
            )
        return (
            int(self.transformer.config.in_channels),
            (num_frames - 1) // temporal + 1,
            height // spatial,
            width // spatial,
        )

    def _latent_multiple(self) -> int:
        return int(self.transformer.config.patch_size[1])  # patch (t, h, w) = (1, 2, 2) in Wan2.1

    def _image_seq_len(self) -> int:
        _, f, h, w = self.latent_shape()
        pt, ph, pw = self.transformer.config.patch_size
        return (f // pt) * (h // ph) * (w // pw)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [N, C, f, h, w] -> videos float32 [N, F, 3, H, W] in [0, 1] (as WanPipeline decodes)."""
        latents = latents.to(self.device, self.vae.dtype)
        mean, std = self._latent_stats(latents.dtype)
        video = self.vae.decode(latents / (1.0 / std) + mean, return_dict=False)[0]  # the pipeline's arithmetic
        return self.pipeline.video_processor.postprocess_video(video, output_type="pt").float()

    def encode_videos(self, videos: torch.Tensor) -> torch.Tensor:
        """Videos [N, F, 3, H, W] in [0, 1] -> latents float32 [N, C, f, h, w] (VAE mean, normalised per channel)."""
        if videos.ndim != 5 or videos.shape[2] != 3:
            raise ValueError(f"encode_videos takes videos [N, F, 3, H, W] in [0, 1], got {tuple(videos.shape)}")
        pixels = videos.to(self.device, self.vae.dtype).permute(0, 2, 1, 3, 4) * 2 - 1  # [N, 3, F, H, W] in [-1, 1]
        latents = self.vae.encode(pixels).latent_dist.mean
        mean, std = self._latent_stats(latents.dtype)
        return ((latents - mean) / std).float()

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Videos [N, F, 3, H, W] (or images [N, 3, H, W] as one-frame videos) -> latents [N, C, f, h, w]."""
        return self.encode_videos(images.unsqueeze(1) if images.ndim == 4 else images)
