"""The model-adapter interface shared by every family (SD3, FLUX, Wan), and its config.

An adapter wraps the real diffusers pipeline of its family (loaded with ``from_pretrained`` from a
hub id, a local folder or a built-in name) and exposes what the samplers and the learner need, as
plain functions of tensors:

- ``encode_prompts`` once per prompt -> :class:`Conditioning` (rows gathered per latent later);
- ``velocity(x, sigma, cond, guidance_scale)``: v ~ noise - data (sigma=1 noise, sigma=0 data),
  with classifier-free guidance as one batched call ``[uncond; cond]`` exactly as the pipelines do;
  the same code path serves rollout and training;
- ``decode`` / ``encode_images`` between latents and images in [0, 1];
- ``trainable_parameters`` (LoRA through peft, or the whole transformer), ``reference()`` (the
  reference policy: LoRA disabled, or a frozen copy), ``save_trainable`` / ``load_trainable``: the
  trained weights' mixin, :class:`~flowgrpo.models.trainable.TrainableWeights` (trainable.py);
- ``call_timer`` (:class:`~flowgrpo.run.timing.CallTimer`): the time spent inside the network's calls (forwards and
  the backward through them), which the trainer logs per phase and ``benchmarks/bench_overhead.py`` reads.

The conditioning rows are conditioning.py's; the device, attention backend and load errors loading.py's.

Family files (``sd3.py``, ``flux.py``, ``flux2.py``, ``qwen_image.py``, ``z_image.py``, ``wan.py``) only say how
one transformer call is made and how prompts are encoded, using the pipeline's own methods; video families
(``modality == "video"``) take latents [N, C, f, h, w] and decode to videos [N, F, 3, H, W]. A pipeline with two
experts (Wan2.2 A14B: ``transformer`` for high noise, ``transformer_2`` for low) is routed here, row by row
(``experts``, ``_routes``; docs/models.md, "Two experts"). Run the tests with ``pytest tests/models``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar, Optional

import torch

from flowgrpo.run.paths import resolve_pretrained
from flowgrpo.run.timing import CallTimer

from flowgrpo.models.conditioning import Conditioning
from flowgrpo.models.config import DTYPES, EXPERT_COMPONENTS, ModelConfig, validate_model_config
from flowgrpo.models.families import FAMILIES
from flowgrpo.models.loading import _unloadable, resolve_device, set_attention_backend
from flowgrpo.models.trainable import TrainableWeights


class FlowModel(TrainableWeights):
    """A flow-matching text-to-image (or text-to-video) model as functions of tensors (see the module docstring).

    Subclasses set ``pipeline_class`` and implement ``_encode``, ``_transformer_velocity``,
    ``latent_shape`` and ``_image_seq_len`` (and ``_uses_cfg`` where CFG is not scale > 1). What trains (LoRA or
    the whole network), the reference policy and saving / loading it are :class:`TrainableWeights`' (trainable.py).
    """

    pipeline_class: ClassVar[type]  # the diffusers pipeline whose components and methods we use
    _default_max_shift: ClassVar[float] = 1.15  # the pipeline's default for dynamic shifting
    negative_prompt: ClassVar[str] = ""  # CFG's unconditional row: the pipeline's default negative (Qwen-Image: " ")

    def __init__(self, config: ModelConfig | dict):
        self.config = validate_model_config(config)
        cfg = self.config
        self.device = resolve_device(cfg.device)
        self.dtype = DTYPES[cfg.dtype]
        self.call_timer = CallTimer(self.device)  # time inside the network's calls (benchmarks, metrics)
        self._load_components()
        self.text_encoders_device = self.device  # where the text encoders are (model.offload_text_encoders moves them)
        if cfg.offload_text_encoders:  # model.offload_text_encoders: on the CPU until an encoding needs them
            self._place_text_encoders(torch.device("cpu"))
        self.latent_shape()  # fail now if the resolution does not fit the model
        self.shift: float = float(cfg.shift) if cfg.shift is not None else self._scheduler_shift()
        # the scheduler's terminal stretch of its sigma grid (Qwen-Image: the last sigma before 0 is 0.02), or None
        pipeline = getattr(self, "pipeline", None)
        terminal = pipeline.scheduler.config.get("shift_terminal") if pipeline is not None else None
        self.shift_terminal: Optional[float] = float(terminal) if terminal else None
        self._negative: Optional[tuple] = None  # cached unconditional embedding
        # the denoising networks by the pipeline's component name: one ("transformer"), or two experts switched at a
        # boundary timestep (Wan2.2 A14B: "transformer" for high noise, "transformer_2" for low noise)
        self.experts: dict[str, torch.nn.Module] = self._find_experts()
        self.boundary: Optional[float] = self._find_boundary()
        # a sharded run sets this: every call runs every expert (an expert without rows on one row, its output
        # times 0), so every process makes the same collective calls whatever its rows' times (engine/policy.py)
        self.call_every_expert = False
        # context parallelism (flowgrpo/engine/context.py) splits the token sequence over a group of processes: a
        # family whose text length varies pads it to a multiple of this (the group's size)
        self.sequence_multiple = 1
        self._in_reference = False
        self._integer_time = None  # inside integer_timesteps(): "floor" or "nearest", the networks told an integer
        self._setup_finetune()

    # ---------------------------------------------------------------- set-up
    def _load_components(self) -> None:
        """Load the family's components onto ``self.device``, frozen and in eval mode, and set
        ``self.transformer``: the network fine-tuning trains. Diffusers families load their pipeline
        with ``from_pretrained``; a family without one (the analytic world) overrides this."""
        cfg = self.config
        if cfg.random_weights:  # the real architecture from its published numbers, random weights, on the device
            from flowgrpo.models.architectures import architecture_dir
            from flowgrpo.models.random_init import random_pipeline

            self.pipeline = random_pipeline(self.pipeline_class, architecture_dir(cfg), device=self.device,
                                            dtype=self.dtype, max_sequence_length=cfg.max_sequence_length,
                                            depth=cfg.depth)
        else:
            source = resolve_pretrained(cfg.pretrained)
            try:
                self.pipeline = self.pipeline_class.from_pretrained(
                    source,
                    revision=cfg.revision,
                    # the VAE stays float32: decoding in bf16 costs image quality, and the VAE is small
                    dtype={"vae": torch.float32, "default": self.dtype},
                )
            except OSError as err:  # a hub id not in the cache while offline, one that does not exist, a broken folder
                raise _unloadable(cfg.pretrained, source, err) from None
        self.pipeline.set_progress_bar_config(disable=True)
        self.pipeline.to(self.device)
        for component in self.pipeline.components.values():
            if isinstance(component, torch.nn.Module):
                component.requires_grad_(False).eval()
        self.transformer = self.pipeline.transformer  # the unwrapped diffusers model
        self.vae = self.pipeline.vae
        self._num_train_timesteps = int(self.pipeline.scheduler.config.num_train_timesteps)
        for name in EXPERT_COMPONENTS:
            if getattr(self.pipeline, name, None) is not None:
                set_attention_backend(getattr(self.pipeline, name), cfg.attention_backend)

    def _find_experts(self) -> dict[str, torch.nn.Module]:
        """The pipeline's denoising networks, in its order: ``transformer`` and, for two-expert models, ``transformer_2``."""
        pipeline = getattr(self, "pipeline", None)
        found = {name: getattr(pipeline, name, None) for name in EXPERT_COMPONENTS} if pipeline is not None else {}
        found = {name: module for name, module in found.items() if module is not None}
        return found or {"transformer": self.transformer}

    def _find_boundary(self) -> Optional[float]:
        """For two experts, the timestep at which sampling switches from the first (high noise) to the second (low
        noise): the pipeline's ``boundary_ratio`` times the scheduler's train timesteps, as WanPipeline computes it."""
        if len(self.experts) < 2:
            return None
        ratio = getattr(self.pipeline.config, "boundary_ratio", None)
        if ratio is None:
            raise ValueError(f"{type(self.pipeline).__name__} has two transformers but no boundary_ratio in its "
                             "model_index.json: it cannot say which expert denoises which timesteps")
        return float(ratio) * self._num_train_timesteps

    @property
    def max_references(self) -> int:
        """How many condition images a prompt may carry (its family record's; 0: a text-only family)."""
        return FAMILIES[self.config.family].max_references

    @property
    def modality(self) -> str:
        """"image": decode -> [N, 3, H, W]; "video": decode -> [N, F, 3, H, W]; "vector" (its family's record)."""
        return FAMILIES[self.config.family].modality


    def shift_for(self, num_steps: int) -> float:
        """The time shift of a grid of ``num_steps`` steps: ``model.shift`` (the config's, else the scheduler's at the
        configured size). A family whose pipeline makes the shift depend on the step count (FLUX.2) overrides it."""
        return self.shift

    def _scheduler_shift(self) -> float:
        """The time shift the pipeline's scheduler applies at the configured size."""
        sched = self.pipeline.scheduler.config
        if not sched.get("use_dynamic_shifting", False):
            # FlowMatchEulerDiscreteScheduler calls it `shift`; UniPC with flow sigmas (Wan) `flow_shift`
            return float(sched["shift"] if "shift" in sched else sched.get("flow_shift", 1.0))
        # resolution-dependent shift, as the pipelines compute `mu` (their own calculate_shift)
        calculate_shift = importlib.import_module(self.pipeline_class.__module__).calculate_shift
        mu = calculate_shift(
            self._image_seq_len(),
            sched.get("base_image_seq_len", 256),
            sched.get("max_image_seq_len", 4096),
            sched.get("base_shift", 0.5),
            sched.get("max_shift", self._default_max_shift),
        )
        return math.exp(mu) if sched.get("time_shift_type", "exponential") == "exponential" else mu

    def compile_blocks(self) -> int:
        """Regional compilation (``model.compile``): ``torch.compile`` each repeated block of every denoising network,
        i.e. every element of the networks' block lists (``transformer_blocks``, ``single_transformer_blocks``,
        Wan's ``blocks``), in place, so sampling and training run the compiled blocks and the code between them
        (embeddings, the final layer) eagerly. Blocks of one kind share their compiled code (their weights are the
        graph's inputs); a second batch size compiles once more, with the batch dimension dynamic, and no later
        shape does. Call it after sharding (the blocks' FSDP2 hooks stay outside the compiled code). Returns the
        number of blocks compiled."""
        cfg = self.config
        options = {"backend": cfg.compile_backend}
        if cfg.compile_backend == "inductor":  # the config allows another mode only with inductor
            options["mode"] = cfg.compile_mode
        import torch._dynamo

        # one block class's compiled code serves every block of that class; its variants (a block with a second
        # attention, the last block, with and without gradient or adapter, two batch sizes) may outnumber
        # torch._dynamo's default of 8 compiled versions per function, past which it would run the blocks eagerly
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        compiled = 0
        for network in self.experts.values():
            for child in network.children():
                if isinstance(child, torch.nn.ModuleList):
                    for block in child:
                        block.compile(**options)
                        compiled += 1
        if not compiled:
            from flowgrpo.models.config import ModelConfigError

            raise ModelConfigError(f"model.compile: {type(self.transformer).__name__} has no list of blocks to compile; "
                                   "set model.compile=false")
        return compiled

    # ---------------------------------------------------------------- family hooks
    def _encode(self, prompts: list[str]) -> tuple[Optional[torch.Tensor], ...]:
        """(prompt_embeds [P, L, D], pooled [P, Dp] or None, text_ids [L, 3] or None) for the prompts, and
        optionally a fourth item, the token mask [P, L] (families whose transformer masks padded text; L must
        then be the same for every call, e.g. padded to ``max_sequence_length``)."""
        raise NotImplementedError

    def _uses_cfg(self, guidance_scale: float) -> bool:
        """Whether ``velocity`` at this scale is the two-pass (batched) classifier-free guidance
        (the pipelines' do_classifier_free_guidance; FLUX's guidance-distilled models differ)."""
        return guidance_scale > 1.0

    def _model_time(self, sigma: torch.Tensor) -> torch.Tensor:
        """The scheduler's timestep the network is told at σ [B] fp32: σ·T (T = its train timesteps, 1000), or inside
        ``integer_timesteps()`` ⌊σ·T⌋ with the product in float32, as codes that hand the network integer timesteps
        compute it (DiffusionNFT's and DGPO's SD3 rollouts, DanceGRPO's, MixGRPO's and BranchGRPO's FLUX steps)."""
        t = sigma * self._num_train_timesteps
        mode = getattr(self, "_integer_time", None)
        if not mode:
            return t
        return (torch.floor(t.float()) if mode == "floor" else torch.round(t.float())).to(t.dtype)

    @contextmanager
    def integer_timesteps(self, on: bool = True, rounding: str = "floor") -> Iterator[None]:
        """Inside (when ``on``), every network call is told an integer timestep instead of σ·T: ⌊σ·T⌋ (``floor``: the
        rollouts of sampling.integer_timesteps, the kernels still stepping the exact σ), or the nearest integer
        (``nearest``: learner.integer_times, whose σ are already multiples of 1/T, which float32 σ·T can miss by an
        ulp either way)."""
        if rounding not in ("floor", "nearest"):
            raise ValueError(f"rounding must be 'floor' or 'nearest', got {rounding!r}")
        previous, self._integer_time = getattr(self, "_integer_time", None), (rounding if on else None)
        try:
            yield
        finally:
            self._integer_time = previous

    def _transformer_velocity(self, transformer, x, sigma, cond, guidance_scale):
        """One transformer call: x [B, C, ...] (model dtype), sigma [B] fp32, the conditioning rows ``cond`` ->
        velocity shaped like x. The default is the diffusers DiT call SD3 and Wan share (timestep = σ times the
        scheduler's train timesteps, ``_model_time``); a family adds its inputs with ``_extra_inputs`` or replaces
        the call (FLUX packs its latents)."""
        return transformer(hidden_states=x, timestep=self._model_time(sigma),
                           encoder_hidden_states=cond.prompt_embeds.to(self.dtype), return_dict=False,
                           **self._extra_inputs(cond))[0]

    def _extra_inputs(self, cond: Conditioning) -> dict:
        """Inputs of the default transformer call beyond the text embeddings (SD3: its pooled projection)."""
        return {}

    def _image_seq_len(self) -> int:
        raise NotImplementedError

    def latent_shape(self, height: Optional[int] = None, width: Optional[int] = None) -> tuple[int, ...]:
        """Per-sample (C, h, w) of the unpacked latent for an image of height x width pixels."""
        raise NotImplementedError

    def _check_resolution(self, height: int, width: int, multiple: int) -> None:
        if height % multiple or width % multiple:
            from flowgrpo.models.config import ModelConfigError

            raise ModelConfigError(
                f"image size {height}x{width} does not fit {type(self).__name__}: height and width must be "
                f"multiples of {multiple} (VAE factor x patch size); change model.resolution (and model.width)"
            )

    def text_encoders(self) -> dict[str, torch.nn.Module]:
        """The pipeline's text encoders by component name (SD3: text_encoder, text_encoder_2, text_encoder_3; FLUX.1:
        two; Wan: its T5; Qwen-Image: its VLM; FLUX.2, Z-Image: one): what model.offload_text_encoders moves."""
        pipeline = getattr(self, "pipeline", None)
        components = pipeline.components if pipeline is not None else {}
        return {name: module for name, module in components.items()
                if name.startswith("text_encoder") and isinstance(module, torch.nn.Module)}

    def _place_text_encoders(self, device: torch.device) -> None:
        """Move every text encoder to ``device``; ``text_encoders_device`` says where they are."""
        for module in self.text_encoders().values():
            module.to(device)
        self.text_encoders_device = device

    @contextmanager
    def _text_encoders_ready(self) -> Iterator[None]:
        """Inside, the text encoders are on the model's device; with model.offload_text_encoders they are brought
        there for the encoding and moved back to the CPU after it (also when it raises)."""
        if not self.config.offload_text_encoders:
            yield
            return
        self._place_text_encoders(self.device)
        try:
            yield
        finally:
            self._place_text_encoders(torch.device("cpu"))

    # ---------------------------------------------------------------- the interface
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], chunk_size: int = 64, images: Optional[list[list]] = None
                       ) -> Conditioning:
        """Encode prompts once (text encoders are frozen); rows follow the order of ``prompts``. With
        model.offload_text_encoders the encoders come to the device for this call and go back to the CPU after.
        ``images``: each prompt's condition images (RGB PIL images, the same number for every prompt; an edit's
        source), for a family that takes them (``max_references``), preprocessed and encoded as its pipeline does
        (``_encode_references``); None for text-only prompts."""
        if isinstance(prompts, str) or not prompts:
            raise ValueError("encode_prompts takes a non-empty list of prompt strings")
        if images is not None:
            self._check_condition_images(prompts, images)
        with self._text_encoders_ready():
            return self._encode_prompts(prompts, chunk_size, images)

    def _check_condition_images(self, prompts: list[str], images: list[list]) -> None:
        from flowgrpo.models.config import ModelConfigError

        family = self.config.family
        if not self.max_references:
            editing = ", ".join(sorted(name for name, f in FAMILIES.items() if f.max_references))
            raise ModelConfigError(f"the prompts carry condition images (an editing set) but model.family={family} "
                                   f"generates from text alone; train an editing family ({editing}) or use a prompt "
                                   "set without 'image'")
        if len(images) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(images)} rows of condition images; give one list per prompt")
        counts = {len(row) for row in images}
        if len(counts) != 1 or not 1 <= next(iter(counts)) <= self.max_references:
            raise ModelConfigError(f"model.family={family} takes 1 to {self.max_references} condition image(s) per "
                                   f"prompt; the prompts carry {sorted(counts)}")

    def _encode_prompts(self, prompts: list[str], chunk_size: int, images: Optional[list[list]] = None) -> Conditioning:
        spans = range(0, len(prompts), chunk_size)
        if images is None:
            parts = [self._encode(list(prompts[i : i + chunk_size])) for i in spans]
            references = None
        else:
            parts = [self._encode_with_images(list(prompts[i : i + chunk_size]), images[i : i + chunk_size]) for i in spans]
            chunks = [self._encode_references(images[i : i + chunk_size]) for i in spans]
            references = tuple(torch.cat([c[k] for c in chunks]) for k in range(len(chunks[0])))

        def cat(i: int) -> Optional[torch.Tensor]:
            return None if len(parts[0]) <= i or parts[0][i] is None else torch.cat([p[i] for p in parts])

        negative = (None, None, None)
        if self._cfg_possible():
            if self._negative is None:
                neg = self._encode([self.negative_prompt])
                self._negative = (neg[0], neg[1], neg[3] if len(neg) > 3 else None)
            negative = self._negative
        return Conditioning(cat(0), cat(1), negative[0], negative[1], parts[0][2], prompt_mask=cat(3),
                            negative_prompt_mask=negative[2], references=references)

    def _encode_with_images(self, prompts: list[str], images: list[list]) -> tuple[Optional[torch.Tensor], ...]:
        """``_encode`` for prompts that carry condition images: a family whose text encoder reads the images too
        (Qwen-Image-Edit's VLM) overrides it; by default the text is encoded alone."""
        return self._encode(prompts)

    def _encode_references(self, images: list[list]) -> tuple[torch.Tensor, ...]:
        """Each prompt's condition images as latents, one tensor per reference [P, C, h, w]: the editing family's
        pipeline preprocessing and VAE encoding (``max_references`` > 0)."""
        raise NotImplementedError

    def _cfg_possible(self) -> bool:
        """Whether some guidance scale turns CFG on (then prompts carry the unconditional row)."""
        return self._uses_cfg(2.0)

    def velocity(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor | float,
        cond: Conditioning,
        guidance_scale: Optional[float] = None,
    ) -> torch.Tensor:
        """Velocity v ~ noise - data, float32 shaped like x, for latents x [N, C, h, w] at sigma [N]
        (video families: x [N, C, f, h, w]).

        With CFG on (SD3, Wan and FLUX-without-guidance-embeds when guidance_scale > 1) the unconditional
        and conditional passes are one batched call ``[uncond; cond]``, combined in float32 as
        ``v_u + g * (v_c - v_u)``. ``cond`` has one row per latent (``Conditioning.select``). A two-expert model
        (Wan2.2) sends each row to the expert its σ belongs to (``_routes``), with that expert's guidance scale.
        """
        n = x.shape[0]
        self._check_latents(x)
        sigma = torch.as_tensor(sigma, dtype=torch.float32, device=self.device)
        sigma = sigma.expand(n) if sigma.ndim == 0 else sigma.float()
        if sigma.shape != (n,):
            raise ValueError(f"sigma must be a float or a tensor [N]={n}, got shape {tuple(sigma.shape)}")
        if len(cond) != n:
            raise ValueError(
                f"conditioning has {len(cond)} rows for {n} latents; gather one row per latent with "
                f"cond.select(index) or use velocity_fn"
            )
        cond = cond.to(self.device)
        x = x.to(self.device, self.dtype)
        routes = self._routes(sigma)
        if len(routes) == 1:  # every row on one network (always, for one-network models): no gathering
            v = self._network_velocity(routes[0][1], x, sigma, cond, self._expert_scale(routes[0][1], guidance_scale))
        else:
            parts, order = [], []
            for rows, name in routes:
                parts.append(self._network_velocity(name, x[rows], sigma[rows], cond.select(rows),
                                                    self._expert_scale(name, guidance_scale)))
                order.append(rows)
            v = torch.cat(parts)[torch.argsort(torch.cat(order))]
        if self.call_every_expert:
            first = torch.zeros(1, dtype=torch.long, device=self.device)
            for name in self.experts.keys() - {name for _, name in routes}:
                idle = self._network_velocity(name, x[:1], sigma[:1], cond.select(first),
                                              self._expert_scale(name, guidance_scale))
                v = v + 0.0 * idle.sum()  # in the graph, so its backward (a collective when sharded) runs too
        return v

    def _routes(self, sigma: torch.Tensor) -> list[tuple[Optional[torch.Tensor], str]]:
        """Which network denoises which rows: [(row indices, expert name)], one entry per expert with rows. With a
        boundary, rows whose timestep σ·T is at or above it go to the first expert (high noise), the others to the
        second, WanPipeline's rule (``t >= boundary_timestep``), so rollout and every training pass agree on the
        network of each step."""
        names = list(self.experts)
        if self.boundary is None:
            return [(None, names[0])]
        high = sigma * self._num_train_timesteps >= self.boundary
        routes = [(torch.nonzero(mask).squeeze(1), name) for mask, name in ((high, names[0]), (~high, names[1]))]
        routes = [(rows, name) for rows, name in routes if rows.numel()]
        return [(None, routes[0][1])] if len(routes) == 1 else routes

    def _expert_scale(self, name: str, guidance_scale: Optional[float]) -> float:
        """The guidance scale of ``name``'s steps: the caller's, else the config's, except that the second expert of
        a two-expert model takes ``guidance_scale_2`` when it is set (Wan2.2's low-noise stage)."""
        if guidance_scale is not None:
            return float(guidance_scale)
        if name != next(iter(self.experts)) and self.config.guidance_scale_2 is not None:
            return float(self.config.guidance_scale_2)
        return float(self.config.guidance_scale)

    def _network_velocity(self, name: str, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning,
                          scale: float) -> torch.Tensor:
        """The velocity of expert ``name`` (the policy, or inside ``reference()`` the reference) at these rows."""
        n = x.shape[0]
        transformer = self.experts[name]
        if self._uses_cfg(scale):
            both = cond.unconditional().concat(cond)
            x2, sigma2 = torch.cat([x, x]), torch.cat([sigma, sigma])
            with self.call_timer.forward(2 * n, cfg=True) as watch:
                out = self._transformer_velocity(transformer, x2, sigma2, both, scale)
                watch(out)
            v_uncond, v_cond = out.float().chunk(2)
            return self._guide(v_uncond, v_cond, scale)
        with self.call_timer.forward(n, cfg=False) as watch:
            out = self._transformer_velocity(transformer, x, sigma, cond, scale)
            watch(out)
        return out.float()

    def _guide(self, v_uncond: torch.Tensor, v_cond: torch.Tensor, scale: float) -> torch.Tensor:
        """Classifier-free guidance's combination of the two passes (float32): ``v_u + g (v_c - v_u)``, as SD3,
        FLUX and Wan combine them; a family whose pipeline combines otherwise (Qwen-Image rescales the norm)
        overrides it."""
        return v_uncond + scale * (v_cond - v_uncond)

    def _latent_multiple(self) -> int:
        """h and w of a latent must be multiples of this (the transformer's patch size)."""
        return int(self.transformer.config.patch_size)

    def _check_latents(self, x: torch.Tensor) -> None:
        """Raise unless x is a batch of latents this model takes: [N, C, h, w] (video families: [N, C, f, h, w])."""
        channels, multiple = self.latent_shape()[0], self._latent_multiple()
        spatial = "f, h, w" if self.modality == "video" else "h, w"
        ndim = 2 + len(spatial.split(", "))
        if x.ndim != ndim or x.shape[1] != channels or x.shape[-2] % multiple or x.shape[-1] % multiple:
            raise ValueError(
                f"latents of shape {tuple(x.shape)} do not fit {type(self).__name__}: expected "
                f"[N, {channels}, {spatial}] with h and w multiples of {multiple}; use latent_shape() for (C, {spatial})"
            )

    def velocity_fn(self, cond: Conditioning, guidance_scale: Optional[float] = None) -> Callable:
        """The samplers' convention: ``f(x [N, ...], sigma [N] fp32, cond_index [N] long) -> v``."""

        def f(x: torch.Tensor, sigma: torch.Tensor, cond_index: torch.Tensor) -> torch.Tensor:
            return self.velocity(x, sigma, cond.select(cond_index), guidance_scale)

        return f

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents [N, C, h, w] -> images float32 [N, 3, H, W] in [0, 1] (as the pipelines decode)."""
        vae_config = self.vae.config
        latents = latents.to(self.device, self.vae.dtype) / vae_config.scaling_factor + vae_config.shift_factor
        images = self.vae.decode(latents, return_dict=False)[0]
        return self.pipeline.image_processor.postprocess(images, output_type="pt").float()

    def _latent_stats(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """A per-channel normalised VAE's latent mean and std (``latents_mean`` / ``latents_std`` of its config: Wan's
        and Qwen-Image's), shaped [1, C, 1, 1, 1] for their 5-D latents."""
        cfg = self.vae.config
        shape = (1, cfg.z_dim, 1, 1, 1)
        mean = torch.tensor(cfg.latents_mean, device=self.device, dtype=dtype).view(shape)
        std = torch.tensor(cfg.latents_std, device=self.device, dtype=dtype).view(shape)
        return mean, std

    def preview(self, media: torch.Tensor, groups: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        """What the run directory (and so the gallery) shows of N decoded samples: pixel families
        show their images [N, 3, H, W] or videos [N, F, 3, H, W] as they are; a family whose samples
        are not pictures draws them (the analytic world: a scatter plot per sample, among the
        other samples of its group ``groups`` [N])."""
        return media

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images [N, 3, H, W] in [0, 1] -> latents float32 [N, C, h, w] (VAE mean, scaled for the transformer)."""
        vae_config = self.vae.config
        pixels = self.pipeline.image_processor.normalize(images.to(self.device, self.vae.dtype))
        latents = self.vae.encode(pixels).latent_dist.mean
        return ((latents - vae_config.shift_factor) * vae_config.scaling_factor).float()

def load_model(cfg: ModelConfig | dict) -> FlowModel:
    """Load the adapter of ``cfg.family`` (components via ``from_pretrained``)."""
    config = validate_model_config(cfg)
    return FAMILIES[config.family].adapter_class()(config)
