"""Qwen-Image-Edit adapter (Qwen-Image-Edit-2509 / 2511): ``QwenImageEditPlusPipeline``'s own components and methods.

Qwen-Image-Edit is Qwen-Image (flowgrpo/models/qwen_image.py: packing, timestep, true CFG with the norm rescale, time
shift, decoding, LoRA) that edits one to three condition images (a prompt's ``images``; flowgrpo/conditions.py) given
an instruction. What the Plus pipeline does with them, and how the adapter mirrors it:

- **Two sizes per condition image.** Each image is resized twice, both sizes from its own aspect ratio by the
  pipeline module's ``calculate_dimensions(area, width / height)`` (the side ``sqrt(area * ratio)``, each side
  rounded to a multiple of 32): to ``CONDITION_IMAGE_SIZE`` (384 x 384 px of area) for the VLM, and to
  ``VAE_IMAGE_SIZE`` (1024 x 1024) for the VAE. The adapter reads both constants and the rule from the pipeline's
  module when it encodes, so it follows them. The OUTPUT size is not the images': it stays ``model.resolution``
  (the pipeline's explicit ``height`` / ``width``).
- **Text: the VLM reads the images.** The prompt goes through the pipeline's edit template with one
  ``"Picture k: <|vision_start|><|image_pad|><|vision_end|>"`` per image before the instruction, the processor
  (``Qwen2VLProcessor``) expands every ``<|image_pad|>`` into the image's vision tokens, Qwen2.5-VL runs on text and
  pixels, and the pipeline keeps the last hidden state after its 64 template tokens. The adapter calls the
  pipeline's ``encode_prompt(prompt=[p], image=<the images at the condition size>)`` once per prompt, as the
  pipeline's own batches are one prompt (``batch_size > 1`` is refused), so the vision tokens of one prompt's
  images are never batched with another's. The text is padded to ``model.max_sequence_length`` with a mask, as
  Qwen-Image's; the pipeline does not truncate it (its ``max_sequence_length`` is not applied here), so a prompt
  whose text with its images' vision tokens is longer is refused, naming the length it needs (each 384 x 384 image
  is 196 vision tokens at the published processor's 14 px patches merged 2 x 2).
- **The negative reads the images too.** With CFG (``true_cfg_scale`` > 1 and a negative prompt: the model card's
  ``" "``) the pipeline encodes the negative prompt through the same template WITH the same images, so the
  unconditional row differs per prompt: the adapter gives one negative row per prompt
  (``Conditioning.negative_per_row``).
- **References.** Each image at its VAE size is ``image_processor.preprocess``-ed (to [-1, 1]), encoded by
  ``_encode_vae_image`` (the VAE's mode, normalised per channel by ``latents_mean`` / ``latents_std``) and kept
  UNPACKED [P, 16, h_k, w_k] (``Conditioning.references``, one tensor per image). Every transformer call packs each
  2x2 like the latent, puts their tokens after the latent's (in the images' order), passes ``img_shapes`` with the
  latent's shape then every reference's ``(1, h_k/2, w_k/2)`` (the RoPE gives reference k frame index k, the latent 0;
  Qwen-Image-Edit-2511's transformer, ``zero_cond_t``, also modulates the reference tokens with timestep 0 from
  ``img_shapes``), and keeps the output's first tokens (the latent's: ``noise_pred[:, : latents.size(1)]``). The
  CFG pass sees the same references. The time shift counts the latent's tokens only (``calculate_shift`` of
  ``latents.shape[1]``).
- **Batches.** One transformer call takes every row's references with the same shapes (the RoPE of a batch is the
  first row's ``img_shapes``), so the k-th images of the prompts encoded together must come to the same VAE size,
  i.e. share their aspect ratio; different ones are refused in one line.
- **Text-only prompts** (none of the editing sets; the throughput's FLOP count) run as the pipeline's methods do
  without an image: ``encode_prompt`` with the edit template and no picture, no reference tokens.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Optional

import torch
from diffusers import QwenImageEditPlusPipeline

from flowgrpo.models.conditioning import Conditioning
from flowgrpo.models.qwen_image import MAX_TEXT_TOKENS, QwenImageModel


class QwenImageEditModel(QwenImageModel):
    """Qwen-Image-Edit through ``QwenImageEditPlusPipeline`` (see the module docstring)."""

    pipeline_class = QwenImageEditPlusPipeline

    def _pipeline_module(self):
        return importlib.import_module(self.pipeline_class.__module__)

    # ---------------------------------------------------------------- prompts
    def _encode(self, prompts: list[str]):
        """Text-only prompts: the pipeline's ``encode_prompt`` without an image."""
        return self._encode_one_by_one(prompts, [None] * len(prompts))

    def _encode_with_images(self, prompts: list[str], images: list[list]):
        return self._encode_one_by_one(prompts, [self._condition_images(row) for row in images])

    def _condition_images(self, row: list) -> list:
        """A prompt's images resized for the VLM: ``CONDITION_IMAGE_SIZE`` of area at each image's aspect ratio."""
        module = self._pipeline_module()
        resized = []
        for image in row:
            width, height = module.calculate_dimensions(module.CONDITION_IMAGE_SIZE, image.size[0] / image.size[1])
            resized.append(self.pipeline.image_processor.resize(image, height, width))
        return resized

    def _encode_one_by_one(self, prompts: list[str], images: list[Optional[list]]):
        """Each prompt through ``encode_prompt`` alone (the pipeline's batch of one), padded to
        ``model.max_sequence_length`` with its mask."""
        length = self.config.max_sequence_length
        if length > MAX_TEXT_TOKENS:
            raise ValueError(f"Qwen-Image-Edit takes at most {MAX_TEXT_TOKENS} text tokens; set "
                             f"model.max_sequence_length <= {MAX_TEXT_TOKENS} (it is {length})")
        rows, masks = [], []
        for prompt, condition in zip(prompts, images):
            embeds, _ = self.pipeline.encode_prompt(prompt=[prompt], image=condition, device=self.device)
            tokens = embeds.shape[1]  # one prompt: every token is real (encode_prompt drops its all-ones mask)
            if tokens > length:
                pictures = f" with its {len(condition)} image(s)' vision tokens" if condition else ""
                raise ValueError(f"the prompt {prompt[:60]!r}{pictures} is {tokens} text tokens, more than "
                                 f"model.max_sequence_length={length}; QwenImageEditPlusPipeline does not truncate "
                                 f"it: set model.max_sequence_length >= {tokens} (at most {MAX_TEXT_TOKENS})")
            rows.append(torch.nn.functional.pad(embeds, (0, 0, 0, length - tokens)))
            masks.append(torch.nn.functional.pad(torch.ones(1, tokens, dtype=torch.long, device=embeds.device),
                                                 (0, length - tokens)))
        return torch.cat(rows), None, None, torch.cat(masks)

    def _encode_prompts(self, prompts: list[str], chunk_size: int, images: Optional[list[list]] = None) -> Conditioning:
        cond = super()._encode_prompts(prompts, chunk_size, images)
        if images is None or cond.negative_prompt_embeds is None:
            return cond
        # the pipeline's negative pass: the negative prompt through the template with each prompt's images
        embeds, _, _, mask = self._encode_with_images([self.negative_prompt] * len(prompts), images)
        return replace(cond, negative_prompt_embeds=embeds, negative_prompt_mask=mask, negative_per_row=True)

    # ---------------------------------------------------------------- references
    def _encode_references(self, images: list[list]) -> tuple[torch.Tensor, ...]:
        """Each image slot k as latents [P, 16, h_k, w_k]: resized to ``VAE_IMAGE_SIZE`` of area at its aspect ratio,
        preprocessed, and encoded by the pipeline's ``_encode_vae_image`` (mode, per-channel normalisation)."""
        module = self._pipeline_module()
        processor = self.pipeline.image_processor
        slots = []
        for k in range(len(images[0])):
            sizes = [module.calculate_dimensions(module.VAE_IMAGE_SIZE, row[k].size[0] / row[k].size[1]) for row in images]
            if len(set(sizes)) > 1:
                from flowgrpo.models.config import ModelConfigError

                raise ModelConfigError(
                    f"condition image {k + 1} of these prompts comes to {len(set(sizes))} different sizes "
                    f"({', '.join(f'{w}x{h}' for w, h in sorted(set(sizes)))}): QwenImageEditPlusPipeline sizes each "
                    "image from its own aspect ratio and one transformer call takes one size per image slot; give "
                    "the k-th images of a prompt set one aspect ratio")
            width, height = sizes[0]
            pixels = torch.cat([processor.preprocess(row[k], height, width) for row in images])
            pixels = pixels.unsqueeze(2).to(self.device, self.vae.dtype)  # one frame: [P, 3, 1, H, W]
            slots.append(self.pipeline._encode_vae_image(pixels, generator=None).squeeze(2).float())
        return tuple(slots)

    # ---------------------------------------------------------------- the transformer call
    def _transformer_velocity(self, transformer, x, sigma, cond, guidance_scale):
        """The Plus pipeline's call: the latent's packed tokens then every reference's, ``img_shapes`` listing them
        all, the output's first (the latent's) tokens unpacked."""
        if cond.references is None:
            return super()._transformer_velocity(transformer, x, sigma, cond, guidance_scale)
        n, channels, h, w = x.shape
        pack = QwenImageEditPlusPipeline._pack_latents
        tokens, shapes = [pack(x, n, channels, h, w)], [(1, h // 2, w // 2)]
        for ref in cond.references:
            hr, wr = ref.shape[-2:]
            tokens.append(pack(ref.to(self.device, self.dtype), n, channels, hr, wr))
            shapes.append((1, hr // 2, wr // 2))
        embeds, mask = self._trim_text(cond.prompt_embeds, cond.prompt_mask)
        out = transformer(
            hidden_states=torch.cat(tokens, dim=1),  # the pipeline's torch.cat([latents, image_latents], dim=1)
            timestep=self._model_time(sigma).to(self.dtype) / 1000,  # t.expand(...).to(latents.dtype) / 1000
            guidance=None,
            encoder_hidden_states_mask=mask,
            encoder_hidden_states=embeds.to(self.dtype),
            img_shapes=[shapes] * n,
            return_dict=False,
        )[0][:, : (h // 2) * (w // 2)]  # noise_pred[:, : latents.size(1)]
        return self._unpack(out, h, w)
