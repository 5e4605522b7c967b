"""FLUX.2 adapters: ``Flux2Pipeline`` (FLUX.2 [dev]) and ``Flux2KleinPipeline`` (FLUX.2 [klein] 4B / 9B, distilled
and base), with the pipelines' own components and static methods.

What the two pipelines do, and how the adapter mirrors it:

- **Latents.** The VAE (``AutoencoderKLFlux2``) encodes to C = 32 channels at 1/8 of the image size; the pipeline
  folds 2x2 latent patches into channels (``_patchify_latents``: [B, 4C, H/16, W/16]) and normalises every one of
  those 4C channels with the VAE's BatchNorm running statistics (``vae.bn.running_mean`` and
  ``sqrt(running_var + batch_norm_eps)``). The flow runs in that patchified, normalised space: the pipeline draws
  its noise there (``prepare_latents``: shape [B, in_channels, H/16, W/16]), and its ``latents=`` argument takes it
  there. That is the adapter's UNPACKED latent ``[N, in_channels, h, w]`` (128 x 64 x 64 at 1024 px). Each call
  packs it into tokens with ``_pack_latents`` ([N, h*w, C]), builds the 4-D position ids (T, H, W, L) with
  ``_prepare_latent_ids``, and scatters the output back by those ids with ``_unpack_latents_with_ids``.
- **Text.** Prompts are rendered with the chat template and run through the text encoder; the hidden states of
  three layers are stacked along the width ([B, L, 3 x hidden]), every prompt padded to ``max_sequence_length``
  tokens (the transformer takes no text mask: padding tokens are attended, as in the pipeline). dev: Mistral-Small-3
  (``Mistral3ForConditionalGeneration``) through its processor, with the pipeline's system message, layers
  (10, 20, 30); klein: Qwen3 (``Qwen3ForCausalLM``), the user turn with thinking disabled, layers (9, 18, 27). Text
  ids are ``_prepare_text_ids`` (T=H=W=0, L=token index), the same for every row: the Conditioning keeps one [L, 4].
- **Timestep.** As both pipelines: ``t = sigma * 1000`` cast to the latent dtype, passed as ``t / 1000``; the
  transformer multiplies by 1000 again.
- **Guidance.** dev is guidance-distilled: ``guidance_scale`` goes to the transformer as the float32 ``guidance``
  input (embedded guidance; the pipeline's default 4.0), one conditional pass per step, no CFG ever. klein never
  passes guidance (its transformer has no guidance embedder); the pipeline runs classifier-free guidance against the
  empty prompt when ``guidance_scale > 1`` and the pipeline is not step-distilled (``model_index.json``'s
  ``is_distilled``: true for FLUX.2-klein-4B / 9B, false for the -base checkpoints), combined as
  ``v_u + g (v_c - v_u)``; the pipeline makes the two passes as two calls, the adapter as one batched
  ``[uncond; cond]`` call (tested equal).
- **Time shift.** FLUX.2 does not use ``calculate_shift``: it computes ``mu`` with ``compute_empirical_mu(
  image_seq_len, num_steps)``, an empirical fit that depends on the number of image tokens AND the number of
  steps, and the scheduler shifts ``sigma -> e^mu sigma / (1 + (e^mu - 1) sigma)`` (exponential time shift). So
  ``model.shift = exp(mu(image tokens at config.resolution, config.sample_steps))``, and ``shift_for(T)`` gives it
  for a grid of T steps: the trainer builds each plan's grid with the shift of the plan's own number of steps
  (``sampling.plan.num_steps``) and the evaluation with that of ``eval.steps``, the shift the pipeline would use
  for those step counts. ``model.shift`` (or ``sampling.shift``) set in the config fixes one shift for every grid.
  For large images (more than 4300 tokens, above ~1050 x 1050 px) ``mu`` no longer depends on the step count.
- **Decoding** as the pipelines: de-normalise with the BatchNorm statistics, ``_unpatchify_latents``,
  ``vae.decode``, ``image_processor.postprocess``; ``encode_images`` is the pipeline's ``_encode_vae_image``
  (VAE mean, patchified, normalised).
- **Reference images** (a prompt's condition images, flowgrpo/conditions.py; both pipelines' ``image=``): each image
  at its own size, checked by ``image_processor.check_image_input`` (sides of at least 64 px, aspect ratio at most
  8), scaled down to 1024 x 1024 px of area when larger (``_resize_to_target_area``), its sides floored to
  multiples of 16 and center-cropped to them (``preprocess(..., resize_mode="crop")``), then ``_encode_vae_image``
  (the VAE's mode, patchified, BatchNorm-normalised): the flow's own space, kept as [P, 4C, h_k, w_k]
  (``Conditioning.references``). The output size stays ``model.resolution`` (the pipelines' explicit height and
  width). Every transformer call puts the references' tokens (``_pack_latents``, in the images' order) after the
  latent's with the ids of ``_prepare_image_ids`` (T = 10, 20, ... for references 1, 2, ..., H and W their own
  grid, L = 0; the latent's T is 0), and keeps the output's first h*w tokens (the latent's). The text encoder does not
  see the images (the pipelines' ``encode_prompt`` reads text only), the unconditional pass of klein's CFG sees the
  same references, and the time shift counts the latent's tokens only (``latents.shape[1]``). The k-th references
  of the prompts encoded together must come to one size (one transformer call); different ones are refused.
  Text-only prompts run exactly as without references.
"""

from __future__ import annotations

import importlib
import inspect
import math
from typing import ClassVar, Optional

import torch
from diffusers import Flux2KleinPipeline, Flux2Pipeline

from flowgrpo.models.base import FlowModel
from flowgrpo.models.families import DEFAULT_LORA_TARGETS

# both pipelines' __call__: a reference image larger than this many pixels is scaled down to it (their literal 1024 * 1024)
REFERENCE_MAX_AREA = 1024 * 1024


class _Flux2Base(FlowModel):
    """What FLUX.2 dev and klein share: packing, ids, timestep, LoRA targets, shift, decoding."""

    pipeline_class: ClassVar[type]

    # ------------------------------------------------------------------ text
    def _text_encoder_out_layers(self) -> tuple[int, ...]:
        """The text-encoder layers whose hidden states the pipeline stacks (its ``encode_prompt`` default). Only a
        depth-cut random-weight model (``model.depth``, the real-size CPU check) has fewer layers than these; there
        the layers past the last one kept read the last one."""
        layers = tuple(inspect.signature(self.pipeline.encode_prompt).parameters["text_encoder_out_layers"].default)
        if self.config.depth is None:
            return layers
        available = self._text_encoder_layers()
        return tuple(min(k, available) for k in layers)

    def _text_encoder_layers(self) -> int:
        return int(self.pipeline.text_encoder.config.num_hidden_layers)

    def _encode(self, prompts: list[str]):
        limit = self.pipeline.tokenizer_max_length  # 512, the pipelines' text length
        if self.config.max_sequence_length > limit:
            raise ValueError(f"FLUX.2 takes at most {limit} text tokens; set model.max_sequence_length <= {limit}")
        embeds, text_ids = self.pipeline.encode_prompt(
            prompt=prompts,
            device=self.device,
            max_sequence_length=self.config.max_sequence_length,
            text_encoder_out_layers=self._text_encoder_out_layers(),
        )
        # text ids [P, L, 4] are the same for every prompt (token index in the L coordinate): keep one
        return embeds, None, text_ids[0]

    # ------------------------------------------------------------------ the transformer call
    def _guidance(self, n: int, guidance_scale: float) -> Optional[torch.Tensor]:
        """The transformer's ``guidance`` input: dev's embedded guidance; None for klein."""
        return None

    def _transformer_velocity(self, transformer, x, sigma, cond, guidance_scale):
        """The pipelines' call: the [N, C, h, w] latents packed into h*w tokens with their 4-D ids, the timestep
        ``t.to(latent dtype) / 1000``, text ids, and (dev) the guidance; the output tokens scattered back by id. With
        reference images, their tokens and ids follow the latent's and the output's first h*w tokens are kept."""
        n = x.shape[0]
        pipe = self.pipeline
        packed = pipe._pack_latents(x)  # [N, h*w, C], the pipeline's prepare_latents
        img_ids = pipe._prepare_latent_ids(x).to(self.device)  # [N, h*w, 4]: (T=0, H, W, L=0)
        hidden, ids = packed, img_ids
        if cond.references is not None:  # the pipelines' torch.cat([latents, image_latents], dim=1) and their ids
            refs = [r.to(self.device, self.dtype) for r in cond.references]
            ref_ids = pipe._prepare_image_ids([r[:1] for r in refs]).to(self.device)  # [1, sum h_k*w_k, 4]: T = 10(k+1)
            hidden = torch.cat([packed, *(pipe._pack_latents(r) for r in refs)], dim=1)
            ids = torch.cat([img_ids, ref_ids.expand(n, -1, -1)], dim=1)
        t = self._model_time(sigma)  # the scheduler's timestep
        out = transformer(
            hidden_states=hidden,
            timestep=t.to(self.dtype) / 1000,  # the pipelines: timestep = t.expand(B).to(latents.dtype); timestep / 1000
            guidance=self._guidance(n, guidance_scale),
            encoder_hidden_states=cond.prompt_embeds.to(self.dtype),
            txt_ids=cond.text_ids.expand(n, -1, -1),
            img_ids=ids,
            return_dict=False,
        )[0][:, : packed.shape[1]]  # noise_pred[:, : latents.size(1)]
        return pipe._unpack_latents_with_ids(out, img_ids)  # [N, C, h, w]

    def _encode_references(self, images: list[list]) -> tuple[torch.Tensor, ...]:
        """Each reference slot k as the flow's latents [P, 4C, h_k, w_k]: the pipelines' checks, size rule and crop,
        and ``_encode_vae_image`` (module docstring)."""
        pipe = self.pipeline
        processor, multiple = pipe.image_processor, pipe.vae_scale_factor * 2
        slots = []
        for k in range(len(images[0])):
            pixels, sizes = [], []
            for row in images:
                image = processor.check_image_input(row[k])
                width, height = image.size
                if width * height > REFERENCE_MAX_AREA:
                    image = processor._resize_to_target_area(image, REFERENCE_MAX_AREA)
                    width, height = image.size
                width, height = width // multiple * multiple, height // multiple * multiple
                pixels.append(processor.preprocess(image, height=height, width=width, resize_mode="crop"))
                sizes.append((width, height))
            if len(set(sizes)) > 1:
                from flowgrpo.models.config import ModelConfigError

                raise ModelConfigError(
                    f"reference image {k + 1} of these prompts comes to {len(set(sizes))} different sizes "
                    f"({', '.join(f'{w}x{h}' for w, h in sorted(set(sizes)))}): {type(pipe).__name__} encodes each "
                    "reference at its own size and one transformer call takes one size per reference slot; give the "
                    "k-th images of a prompt set one size")
            batch = torch.cat(pixels).to(self.device, self.vae.dtype)
            slots.append(pipe._encode_vae_image(batch, generator=None).float())
        return tuple(slots)

    # ------------------------------------------------------------------ shapes and the time shift
    def latent_shape(self, height: Optional[int] = None, width: Optional[int] = None) -> tuple[int, ...]:
        """(in_channels, H / 16, W / 16) at the real VAE: the patchified latent the pipeline draws its noise in."""
        height = height or self.config.resolution
        width = width or self.config.width or self.config.resolution
        multiple = self.pipeline.vae_scale_factor * 2  # VAE factor x the 2x2 patchify, as the pipelines' check
        self._check_resolution(height, width, multiple * self._latent_multiple())
        return (int(self.transformer.config.in_channels), height // multiple, width // multiple)

    def _image_seq_len(self) -> int:
        _, h, w = self.latent_shape()
        return h * w  # the packed tokens, as the pipelines pass latents.shape[1]

    def shift_for(self, num_steps: int) -> float:
        """The time shift for ``num_steps`` steps at ``config.resolution``: the config's ``shift`` when set, else the
        scheduler's, ``exp(mu)`` with ``mu`` from the pipeline's own ``compute_empirical_mu`` (the module docstring
        says why it depends on the step count)."""
        if self.config.shift is not None:
            return float(self.config.shift)
        return self._scheduler_shift_for(num_steps)

    def _scheduler_shift_for(self, num_steps: int) -> float:
        sched = self.pipeline.scheduler.config
        if not sched.get("use_dynamic_shifting", False):
            return float(sched.get("shift", 1.0))
        compute_empirical_mu = importlib.import_module(self.pipeline_class.__module__).compute_empirical_mu
        mu = compute_empirical_mu(image_seq_len=self._image_seq_len(), num_steps=int(num_steps))
        return math.exp(mu) if sched.get("time_shift_type", "exponential") == "exponential" else mu

    def _scheduler_shift(self) -> float:
        return self._scheduler_shift_for(self.config.sample_steps)

    # ------------------------------------------------------------------ LoRA
    def _lora_targets(self) -> list[str]:
        """Default: every attention projection of the double-stream blocks (``attn.to_q/k/v/to_out.0``, the text
        stream's ``attn.add_q/k/v_proj`` and ``attn.to_add_out``) and of the single-stream blocks (the fused
        ``attn.to_qkv_mlp_proj`` and ``attn.to_out``), as diffusers' train_dreambooth_lora_flux2*.py adds the single
        blocks. A single block's ``attn.to_out`` is named per block: the bare suffix would also match the double
        blocks' ``attn.to_out`` ModuleList, which peft cannot wrap."""
        targets = list(self.config.lora_target_modules)
        if tuple(targets) != DEFAULT_LORA_TARGETS:
            return targets
        singles = len(self.transformer.single_transformer_blocks)
        return [*DEFAULT_LORA_TARGETS, "attn.to_qkv_mlp_proj",
                *(f"single_transformer_blocks.{i}.attn.to_out" for i in range(singles))]

    # ------------------------------------------------------------------ VAE
    def _bn_stats(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's BatchNorm mean and std [1, 4C, 1, 1] that normalise the patchified latents (the pipelines')."""
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(self.device, dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps).to(self.device, dtype)
        return mean, std

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [N, C, h, w] -> images float32 [N, 3, H, W] in [0, 1], as the pipelines decode."""
        latents = latents.to(self.device, self.vae.dtype)
        mean, std = self._bn_stats(latents.dtype)
        latents = self.pipeline._unpatchify_latents(latents * std + mean)
        images = self.vae.decode(latents, return_dict=False)[0]
        return self.pipeline.image_processor.postprocess(images, output_type="pt").float()

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images [N, 3, H, W] in [0, 1] -> latents float32 [N, C, h, w]: the pipeline's ``_encode_vae_image``
        (VAE mean, patchified, BatchNorm-normalised)."""
        pixels = self.pipeline.image_processor.normalize(images.to(self.device, self.vae.dtype))
        return self.pipeline._encode_vae_image(pixels, generator=None).float()


class Flux2KleinModel(_Flux2Base):
    """FLUX.2 [klein] (4B / 9B): Qwen3 text encoder; CFG-free when step-distilled, else two-pass CFG when
    ``guidance_scale > 1`` (batched)."""

    pipeline_class = Flux2KleinPipeline

    @property
    def is_distilled(self) -> bool:
        """The pipeline's ``is_distilled`` (model_index.json): a step-distilled model ignores guidance_scale."""
        return bool(self.pipeline.config.get("is_distilled", False))

    def _uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0 and not self.is_distilled  # the pipeline's do_classifier_free_guidance


class Flux2Model(_Flux2Base):
    """FLUX.2 [dev]: Mistral-Small-3 text encoder with the pipeline's system message; embedded guidance."""

    pipeline_class = Flux2Pipeline

    def _text_encoder_layers(self) -> int:
        return int(self.pipeline.text_encoder.config.text_config.num_hidden_layers)

    def _uses_cfg(self, guidance_scale: float) -> bool:
        return False  # guidance-distilled: Flux2Pipeline never runs an unconditional pass

    def _guidance(self, n: int, guidance_scale: float) -> Optional[torch.Tensor]:
        # Flux2Pipeline: torch.full([1], guidance_scale, dtype=float32).expand(batch); always passed (a transformer
        # without a guidance embedder ignores it)
        return torch.full([n], guidance_scale, device=self.device, dtype=torch.float32)
