"""Z-Image adapter (Z-Image and its few-step Turbo): ``ZImagePipeline``'s own components and methods.

What the pipeline does, and how the adapter mirrors it:

- **Prompts.** ``ZImagePipeline.encode_prompt`` wraps each prompt in the tokenizer's chat template
  (``<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n``, ``enable_thinking=True``), pads to
  ``max_sequence_length``, runs the Qwen3 text encoder and keeps the penultimate hidden state of each prompt's
  real tokens only: a LIST of variable-length tensors [len_i, D]. The adapter calls that method and stores the
  rows padded with zeros to ``model.max_sequence_length`` with ``Conditioning.prompt_mask`` marking the real
  tokens, so prompt chunks and the unconditional row concatenate; each transformer call hands the transformer
  every row's real tokens again (``prompt_embeds[i][mask[i]]``), exactly the list the pipeline passes.
- **Latents.** ``prepare_latents`` makes unpacked latents [N, C, h, w] (h = H / 8); the pipeline gives the
  transformer a list of [C, 1, h, w] tensors (a frame axis of one) and the transformer patchifies 2x2 itself.
  The adapter does the same per call and stacks the returned list back to [N, C, h, w].
- **Time.** The scheduler's timestep is ``t = sigma * 1000``; the pipeline feeds the transformer
  ``(1000 - t) / 1000`` (= 1 - sigma: Z-Image's time runs from 0 at noise to 1 at data), which the transformer
  multiplies by its ``t_scale`` (1000) before the sinusoidal embedding. Mirrored exactly.
- **Sign.** The transformer predicts data - noise; the pipeline negates it (``noise_pred = -noise_pred``) before
  the Euler step, so the adapter's velocity (noise - data, flowgrpo's convention) is the negated output.
- **Guidance.** ``do_classifier_free_guidance`` is ``guidance_scale > 0`` (not > 1), and the combination is
  ``pos + g (pos - neg)`` = ``v_c + g (v_c - v_u)``: guidance 1 here is guidance 2 in SD3's convention. Both
  hooks (``_uses_cfg``, ``_guide``) say so; the two passes run as one batched call ``[uncond; cond]`` (the pipeline
  concatenates ``[cond; uncond]``; each sample's numbers are its own). The unconditional row is the empty prompt,
  the pipeline's default negative. The pipeline's ``cfg_normalization`` (off) and ``cfg_truncation`` (1.0: never
  truncates, since ``1 - sigma <= 1``) are left at their defaults, which make neither do anything.
  Z-Image-Turbo is CFG-free (``guidance_scale: 0``, 8-9 steps): one conditional pass per step, no negative row.
- **Shift.** Both models ship a static ``shift`` (Turbo: 3.0, ``use_dynamic_shifting: false``), which
  ``FlowModel._scheduler_shift`` reads; a dynamic-shifting scheduler would get ``mu`` from the pipeline's own
  ``calculate_shift`` on ``(h / 2) * (w / 2)`` tokens, as the pipeline computes it.
- **VAE.** The FLUX.1 VAE (16 channels, ``scaling_factor`` 0.3611, ``shift_factor`` 0.1159): decoding is
  ``latents / scaling + shift``, ``vae.decode``, ``image_processor.postprocess`` (the base class), as the pipeline.
- **LoRA.** diffusers' ``train_dreambooth_lora_z_image.py`` default targets, ``to_q, to_k, to_v, to_out.0``: the
  attention of every block (the 30 main layers, the noise and context refiners); the file loads with
  ``ZImagePipeline.load_lora_weights``.

Tests: tests/models/test_z_image.py (the ODE and decoding against ``ZImagePipeline`` with and without CFG, a
broken-convention control, LoRA into the pipeline, training end to end).
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import ZImagePipeline

from flowgrpo.models.base import FlowModel

PATCH_SIZE = 2  # ZImagePipeline calls the transformer with its default patch_size=2, f_patch_size=1


class ZImageModel(FlowModel):
    pipeline_class = ZImagePipeline

    def _encode(self, prompts: list[str]):
        """The pipeline's per-prompt embeddings (real tokens only), padded to max_sequence_length, and their mask."""
        length = int(self.config.max_sequence_length)
        # encode_prompt rewrites the list it is given in place (the chat template): hand it a copy
        embeds, _ = self.pipeline.encode_prompt(prompt=list(prompts), device=self.device,
                                                do_classifier_free_guidance=False, max_sequence_length=length)
        width = embeds[0].shape[-1]
        padded = embeds[0].new_zeros(len(embeds), length, width)
        mask = torch.zeros(len(embeds), length, dtype=torch.bool, device=padded.device)
        for i, e in enumerate(embeds):  # the tokenizer pads on the right: the real tokens are a prefix
            padded[i, : e.shape[0]] = e
            mask[i, : e.shape[0]] = True
        return padded, None, None, mask

    def _uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 0.0  # ZImagePipeline.do_classifier_free_guidance

    def _guide(self, v_uncond: torch.Tensor, v_cond: torch.Tensor, scale: float) -> torch.Tensor:
        """ZImagePipeline's combination, ``pos + g (pos - neg)`` (float32), on velocities: negating both passes
        first (the adapter's sign) commutes with it exactly."""
        return v_cond + scale * (v_cond - v_uncond)

    def _transformer_velocity(self, transformer, x, sigma, cond, guidance_scale):
        """ZImagePipeline's call: a list of [C, 1, h, w] latents, timestep (1000 - t) / 1000 with t = sigma * 1000,
        each row's real text tokens as a list; the output list is stacked and negated (data - noise -> velocity)."""
        if cond.prompt_mask is None:
            raise ValueError("Z-Image conditioning needs prompt_mask (each row's real tokens); encode prompts with "
                             "ZImageModel.encode_prompts")
        t = self._model_time(sigma)  # the scheduler's timestep
        timestep = (1000 - t) / 1000  # exactly the pipeline's arithmetic
        embeds = cond.prompt_embeds.to(self.dtype)
        mask = cond.prompt_mask.to(embeds.device, torch.bool)
        captions = [embeds[i][mask[i]] for i in range(embeds.shape[0])]
        latents = list(x.unsqueeze(2).unbind(dim=0))
        out = transformer(latents, timestep, captions, patch_size=PATCH_SIZE, f_patch_size=1, return_dict=False)[0]
        return -torch.stack(out, dim=0).squeeze(2)

    def latent_shape(self, height: Optional[int] = None, width: Optional[int] = None) -> tuple[int, ...]:
        height = height or self.config.resolution
        width = width or self.config.width or self.config.resolution
        factor = self.pipeline.vae_scale_factor
        self._check_resolution(height, width, factor * PATCH_SIZE)  # the pipeline's "divisible by vae_scale * 2"
        return (int(self.transformer.config.in_channels), height // factor, width // factor)

    def _latent_multiple(self) -> int:
        return PATCH_SIZE

    def _image_seq_len(self) -> int:
        _, h, w = self.latent_shape()
        return (h // PATCH_SIZE) * (w // PATCH_SIZE)  # as ZImagePipeline computes image_seq_len for mu
