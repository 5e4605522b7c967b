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
  reference policy: LoRA disabled, or a frozen copy), ``save_trainable`` / ``load_trainable``;
- ``call_timer`` (:class:`CallTimer`): the time spent inside the network's calls (forwards and the
  backward through them), which the trainer logs per phase and ``benchmarks/bench_overhead.py`` reads.

Family files (``sd3.py``, ``flux.py``, ``flux2.py``, ``qwen_image.py``, ``z_image.py``, ``wan.py``) only say how
one transformer call is made and how prompts are encoded, using the pipeline's own methods; video families
(``modality == "video"``) take latents [N, C, f, h, w] and decode to videos [N, F, 3, H, W]. A pipeline with two
experts (Wan2.2 A14B: ``transformer`` for high noise, ``transformer_2`` for low) is routed here, row by row
(``experts``, ``_routes``; docs/models.md, "Two experts"). Run the tests with ``pytest tests/models``.
"""

from __future__ import annotations

import copy
import glob
import importlib
import math
import os
from pathlib import Path
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import ClassVar, Optional

import torch

from flowgrpo.run.paths import resolve_pretrained

from flowgrpo.models.config import (  # noqa: F401  (re-exported)
    EXPERT_COMPONENTS,
    ModelConfig,
    _family_class,
    validate_model_config,
    ADAPTER_NAME,
    DEFAULT_LORA_TARGETS,
    DTYPES,
)

@dataclass
class Conditioning:
    """Text conditioning for P prompts, computed once per prompt (rows are gathered per latent).

    ``negative_*`` is the unconditional embedding (the empty prompt, as the pipelines use) for
    classifier-free guidance: one row shared by every prompt, or None when the model runs no CFG.
    """

    prompt_embeds: torch.Tensor  # [P, L, D] text-token embeddings (SD3: CLIP-L|CLIP-G padded ++ T5 tokens; FLUX: T5)
    pooled_prompt_embeds: Optional[torch.Tensor] = None  # [P, Dp] pooled (SD3: CLIP-L ++ CLIP-G; FLUX: CLIP-L)
    negative_prompt_embeds: Optional[torch.Tensor] = None  # [1, L, D] unconditional ("" prompt) embeddings, or None
    negative_pooled_prompt_embeds: Optional[torch.Tensor] = None  # [1, Dp] unconditional pooled embedding, or None
    text_ids: Optional[torch.Tensor] = None  # [L, 3] FLUX text position ids (shared by all rows); None for SD3
    # [P, L] which text tokens are real (1) or padding (0), for families whose transformer masks the text
    # (Qwen-Image, Z-Image); None where the embeddings are used whole (SD3, FLUX, Wan)
    prompt_mask: Optional[torch.Tensor] = None
    negative_prompt_mask: Optional[torch.Tensor] = None  # [1, L] the unconditional row's mask, or None

    def __len__(self) -> int:
        return self.prompt_embeds.shape[0]

    def select(self, index: torch.Tensor) -> Conditioning:
        """Rows ``index`` ([N] long) for a batch of N latents; shared fields are kept as they are."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.prompt_embeds.device)
        pooled, mask = self.pooled_prompt_embeds, self.prompt_mask
        return replace(
            self,
            prompt_embeds=self.prompt_embeds.index_select(0, index),
            pooled_prompt_embeds=None if pooled is None else pooled.index_select(0, index),
            prompt_mask=None if mask is None else mask.index_select(0, index),
        )

    def to(self, device: torch.device | str) -> Conditioning:
        def move(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if t is None else t.to(device)

        return Conditioning(*(move(getattr(self, f.name)) for f in fields(self)))

    def unconditional(self) -> Conditioning:
        """The unconditional rows for this batch: the negative embedding repeated ``len(self)`` times."""
        if self.negative_prompt_embeds is None:
            raise ValueError(
                "this Conditioning has no unconditional embedding; encode prompts with a model whose "
                "guidance uses classifier-free guidance (SD3, or FLUX without guidance embeddings)"
            )
        n = len(self)
        neg_pooled, neg_mask = self.negative_pooled_prompt_embeds, self.negative_prompt_mask
        return Conditioning(
            prompt_embeds=self.negative_prompt_embeds.expand(n, -1, -1),
            pooled_prompt_embeds=None if neg_pooled is None else neg_pooled.expand(n, -1),
            text_ids=self.text_ids,
            prompt_mask=None if neg_mask is None else neg_mask.expand(n, -1),
        )

    def concat(self, other: Conditioning) -> Conditioning:
        """Rows of ``self`` then rows of ``other`` (the CFG batch ``[uncond; cond]``)."""
        pooled, mask = None, None
        if self.pooled_prompt_embeds is not None:
            pooled = torch.cat([self.pooled_prompt_embeds, other.pooled_prompt_embeds])
        if self.prompt_mask is not None:
            mask = torch.cat([self.prompt_mask, other.prompt_mask])
        return replace(
            self,
            prompt_embeds=torch.cat([self.prompt_embeds, other.prompt_embeds]),
            pooled_prompt_embeds=pooled,
            prompt_mask=mask,
        )


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


_BACKEND_INSTALL_HINTS = {
    "xformers": "pip install flowgrpo[gpu]  (xformers; CUDA only)",
    "flash": "pip install flash-attn",
    "flash_varlen": "pip install flash-attn",
    "sage": "pip install sageattention",
    "sage_varlen": "pip install sageattention",
}


def set_attention_backend(transformer: torch.nn.Module, backend: str) -> None:
    """Switch ``transformer`` to a diffusers attention backend with diffusers' own switch.

    ``transformer.set_attention_backend`` checks that the backend's package is installed; we add the
    install hint. Some processors (SD3's joint attention in diffusers 0.42) call PyTorch SDPA
    directly instead of the dispatcher; for those only "native" and "xformers" (through
    ``enable_xformers_memory_efficient_attention``) exist, and anything else is refused.
    """
    hint = _BACKEND_INSTALL_HINTS.get(backend, "pip install kernels" if backend.endswith("_hub") else None)

    def unusable(err: Exception) -> RuntimeError:
        install = f"install it ({hint}) or " if hint else ""
        return RuntimeError(
            f"attention_backend={backend!r} is not usable here: {err} Fix: {install}set "
            f"attention_backend: native (PyTorch SDPA, always available)."
        )

    routed = any(hasattr(getattr(m, "processor", None), "_attention_backend") for m in transformer.modules())
    if not routed and backend not in ("native", "xformers"):
        raise ValueError(
            f"{type(transformer).__name__}'s attention processors do not go through diffusers' attention "
            f"dispatcher, so attention_backend={backend!r} cannot apply; use 'native' (PyTorch SDPA, which "
            f"picks flash / memory-efficient kernels itself on GPU) or 'xformers'"
        )
    if backend == "native" and torch.cuda.is_available():
        # PyTorch SDPA without its cuDNN kernel (flash and memory-efficient stay): on an NVIDIA H100 with torch 2.11,
        # FLUX.1-dev's backward through cuDNN attention stopped with "illegal memory access"; without it, it ran
        # (benchmarks/bench_memory.py, docs/results/scaling.md)
        torch.backends.cuda.enable_cudnn_sdp(False)
    from diffusers.utils import logging as diffusers_logging

    logger = diffusers_logging.get_logger("diffusers.models.modeling_utils")
    level = logger.level
    logger.setLevel(diffusers_logging.ERROR)  # silence "attention backends are experimental" on every load
    try:
        transformer.set_attention_backend(backend)  # checks the backend's package is installed
        if not routed and backend == "xformers":
            transformer.enable_xformers_memory_efficient_attention()
    except (RuntimeError, ImportError, ValueError) as err:
        raise unusable(err) from err
    finally:
        logger.setLevel(level)


class CallTimer:
    """Time spent inside the model's network: every transformer call ``FlowModel.velocity`` makes
    (rollout, training, reference, evaluation; a CFG call ``[uncond; cond]`` is one call of two
    passes) and the backward through those calls.

    - forward: wall time around each network call, split by whether autograd records it
      (``grad``: training forwards; ``no_grad``: rollout, old-policy, reference and evaluation ones).
      On CUDA the times come from events recorded on the current stream (read, with one
      synchronisation, by ``totals()``), so timing never stalls the GPU; elsewhere from the host
      clock, which is the device's on CPU (other devices are synchronised around the call).
    - backward: a gradient hook on each network output that requires grad marks the moment the
      backward pass reaches the network; the time from the first such mark to the end of the
      enclosing ``backward()`` block (the learner's ``loss.backward``) is the network's backward.
      What the backward does before it reaches a network output (the loss and kernel math above
      it) is not counted; what little it does between two network calls of one loss is.
      A backward pass outside a ``backward()`` block is counted in ``unattributed_backwards``.

    ``totals()`` returns running sums; subtract two of them to get a span's (``CallTimer.delta``).
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._events = self.device.type == "cuda"
        self.forward_calls = {"grad": 0, "no_grad": 0}
        self.forward_rows = {"grad": 0, "no_grad": 0}  # network batch rows (a CFG call counts 2 per latent)
        self.cfg_calls = 0  # calls that ran the two CFG passes as one batch
        self.backward_calls = 0
        self.unattributed_backwards = 0
        self._seconds = {"forward_grad": 0.0, "forward_no_grad": 0.0, "backward": 0.0}
        self._pending: list[tuple[str, object, object]] = []  # CUDA: (key, start event, end event)
        self._in_backward = False
        self._backward_mark = None  # time or event at which the open backward reached a network output

    # -- clocks ------------------------------------------------------------------------------
    def _now(self):
        if self._events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        if self.device.type not in ("cpu", "meta"):
            getattr(torch, self.device.type).synchronize()
        return time.perf_counter()

    def _add(self, key: str, start, end) -> None:
        if self._events:
            self._pending.append((key, start, end))
        else:
            self._seconds[key] += end - start

    # -- the two measurements ----------------------------------------------------------------
    @contextmanager
    def forward(self, rows: int, cfg: bool) -> Iterator[Callable[[torch.Tensor], None]]:
        """Around one network call of ``rows`` batch rows; yields ``watch(output)``, which arms the
        backward mark on an output that requires grad."""
        kind = "grad" if torch.is_grad_enabled() else "no_grad"
        start = self._now()
        try:
            yield self._watch
        finally:
            self._add(f"forward_{kind}", start, self._now())
            self.forward_calls[kind] += 1
            self.forward_rows[kind] += rows
            self.cfg_calls += int(cfg)

    def _watch(self, output: torch.Tensor) -> None:
        if output.requires_grad:
            output.register_hook(self._reached)

    def _reached(self, grad: torch.Tensor) -> None:
        if not self._in_backward:
            self.unattributed_backwards += 1
        elif self._backward_mark is None:
            self._backward_mark = self._now()

    @contextmanager
    def backward(self) -> Iterator[None]:
        """Around a backward pass (``loss.backward()``): the network's share of it is counted."""
        self._in_backward, self._backward_mark = True, None
        try:
            yield
        finally:
            self._in_backward = False
            if self._backward_mark is not None:
                self._add("backward", self._backward_mark, self._now())
                self.backward_calls += 1
            self._backward_mark = None

    # -- reading -----------------------------------------------------------------------------
    def totals(self) -> dict[str, float]:
        """Running sums: seconds (forward_grad, forward_no_grad, forward, backward, total) and counts."""
        if self._pending:
            torch.cuda.synchronize(self.device)
            for key, start, end in self._pending:
                self._seconds[key] += start.elapsed_time(end) / 1000.0
            self._pending.clear()
        s = dict(self._seconds)
        s["forward"] = s["forward_grad"] + s["forward_no_grad"]
        s["total"] = s["forward"] + s["backward"]
        s.update({f"calls_{k}": float(v) for k, v in self.forward_calls.items()})
        s.update({f"rows_{k}": float(v) for k, v in self.forward_rows.items()})
        s["cfg_calls"] = float(self.cfg_calls)
        s["backward_calls"] = float(self.backward_calls)
        s["unattributed_backwards"] = float(self.unattributed_backwards)
        return s

    @staticmethod
    def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
        """What happened between two ``totals()``."""
        return {k: after[k] - before.get(k, 0.0) for k in after}


def _missing_components(folder: str) -> list[str]:
    """The components model_index.json names ([library, class], not null) whose folder (or its config) is absent."""
    import json

    try:
        index = json.loads(Path(folder, "model_index.json").read_text())
    except (OSError, ValueError):
        return []
    named = [k for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and len(v) == 2 and v[0]]
    return [f"{k}/" for k in named if not Path(folder, k).is_dir() or not any(Path(folder, k).iterdir())]


def _unloadable(pretrained: str, source: str, err: OSError) -> Exception:
    """One line for a model that diffusers could not load (its OSError runs to several lines)."""
    from flowgrpo.run.errors import UserError

    first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    if os.path.isdir(source):
        missing = _missing_components(source)
        if missing:
            return UserError(f"model.pretrained={pretrained!r} lacks {', '.join(missing)}: its model_index.json names "
                             f"{'these components' if len(missing) > 1 else 'this component'} but the folder is not "
                             "there (an interrupted download or copy?); download or copy the whole model again")
        return UserError(f"model.pretrained={pretrained!r} is a folder diffusers cannot load as a pipeline ({first}); "
                         "it needs model_index.json and a folder per component, as save_pretrained writes them")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    how = ("it is not in the local hub cache and HF_HUB_OFFLINE is set: download it first with "
           f"`huggingface-cli download {pretrained}` (or unset HF_HUB_OFFLINE)" if offline else
           f"check the hub id (and your access to it: `huggingface-cli login`), or download it with "
           f"`huggingface-cli download {pretrained}`")
    return UserError(f"model.pretrained={pretrained!r} could not be loaded ({first}); {how}")


class FlowModel:
    """A flow-matching text-to-image (or text-to-video) model as functions of tensors (see the module docstring).

    Subclasses set ``pipeline_class`` and implement ``_encode``, ``_transformer_velocity``,
    ``latent_shape`` and ``_image_seq_len`` (and ``_uses_cfg`` where CFG is not scale > 1).
    """

    pipeline_class: ClassVar[type]  # the diffusers pipeline whose components and methods we use
    modality: ClassVar[str] = "image"  # "image": decode -> [N, 3, H, W]; "video": decode -> [N, F, 3, H, W]
    # LoRA targets used when the config leaves lora_target_modules at the SD3/FLUX default
    default_lora_targets: ClassVar[tuple[str, ...]] = DEFAULT_LORA_TARGETS
    _default_max_shift: ClassVar[float] = 1.15  # the pipeline's default for dynamic shifting
    negative_prompt: ClassVar[str] = ""  # CFG's unconditional row: the pipeline's default negative (Qwen-Image: " ")

    def __init__(self, config: ModelConfig | dict):
        self.config = validate_model_config(config)
        cfg = self.config
        self.device = resolve_device(cfg.device)
        self.dtype = DTYPES[cfg.dtype]
        self.call_timer = CallTimer(self.device)  # time inside the network's calls (benchmarks, metrics)
        self._load_components()
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
        self._references: dict[str, torch.nn.Module] = {}  # frozen copies of the trained experts (frozen_copy)
        # a sharded run sets this: every call runs every expert (an expert without rows on one row, its output
        # times 0), so every process makes the same collective calls whatever its rows' times (engine/policy.py)
        self.call_every_expert = False
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

    def _setup_finetune(self) -> None:
        cfg = self.config
        mode = cfg.reference
        if mode == "auto":
            mode = "adapter_disabled" if cfg.finetune == "lora" else "frozen_copy"
        self.reference_mode = mode
        trained = cfg.trained_experts or list(self.experts)
        unknown = [name for name in trained if name not in self.experts]
        if unknown:
            from flowgrpo.models.config import ModelConfigError

            raise ModelConfigError(f"model.trained_experts names {unknown}, which this model does not have; its "
                                   f"denoising networks are {list(self.experts)}: list some of them, or null for all")
        self.trained_experts = [name for name in self.experts if name in trained]
        self.transformer = self.experts[self.trained_experts[0]]  # the (first) trained network
        for name in self.trained_experts:
            network = self.experts[name]
            if mode == "frozen_copy":  # before the adapter is added: the copy is the base model
                self._references[name] = copy.deepcopy(network).requires_grad_(False).eval()
            if cfg.finetune == "lora":
                from diffusers.training_utils import cast_training_params
                from peft import LoraConfig

                lora = LoraConfig(
                    r=cfg.lora_rank,
                    lora_alpha=cfg.lora_alpha,
                    init_lora_weights="gaussian",  # A ~ N(0, 1/r), B = 0: the adapter starts as the identity
                    target_modules=self._lora_targets(),
                )
                network.add_adapter(lora, adapter_name=ADAPTER_NAME)
                cast_training_params(network, torch.float32)  # LoRA weights train in fp32
            else:
                network.requires_grad_(True)
            if cfg.gradient_checkpointing:
                network.enable_gradient_checkpointing()
        self._trainable_names = [(name, n) for name in self.trained_experts
                                 for n, p in self.experts[name].named_parameters() if p.requires_grad]

    @property
    def _reference_transformer(self) -> Optional[torch.nn.Module]:
        """The frozen reference copy of the (first) trained network, or None."""
        return self._references.get(self.trained_experts[0])

    def _lora_targets(self) -> list[str]:
        targets = list(self.config.lora_target_modules)
        return list(self.default_lora_targets) if tuple(targets) == DEFAULT_LORA_TARGETS else targets

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

    # ---------------------------------------------------------------- the interface
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], chunk_size: int = 64) -> Conditioning:
        """Encode prompts once (text encoders are frozen); rows follow the order of ``prompts``."""
        if isinstance(prompts, str) or not prompts:
            raise ValueError("encode_prompts takes a non-empty list of prompt strings")
        parts = [self._encode(list(prompts[i : i + chunk_size])) for i in range(0, len(prompts), chunk_size)]
        def cat(i: int) -> Optional[torch.Tensor]:
            return None if len(parts[0]) <= i or parts[0][i] is None else torch.cat([p[i] for p in parts])

        negative = (None, None, None)
        if self._cfg_possible():
            if self._negative is None:
                neg = self._encode([self.negative_prompt])
                self._negative = (neg[0], neg[1], neg[3] if len(neg) > 3 else None)
            negative = self._negative
        return Conditioning(cat(0), cat(1), negative[0], negative[1], parts[0][2], prompt_mask=cat(3),
                            negative_prompt_mask=negative[2])

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
        if self._in_reference and name in self._references:
            transformer = self._references[name]
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

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates: LoRA weights (fp32), or every transformer weight."""
        named = {name: dict(self.experts[name].named_parameters()) for name in self.trained_experts}
        return [named[e][n] for e, n in self._trainable_names]  # looked up by name: survives in-place FSDP2 sharding

    @contextmanager
    def reference(self) -> Iterator[None]:
        """Inside, ``velocity`` is the reference policy, without gradients (LoRA disabled, or a frozen copy)."""
        if self.reference_mode == "none":
            raise RuntimeError(
                "this model was loaded with reference='none', so it has no reference policy; set "
                "model.reference: auto to use a KL term against the base model"
            )
        if self._in_reference:
            raise RuntimeError("reference() contexts do not nest")
        trainable = self.trainable_parameters()
        requires_grad = [p.requires_grad for p in trainable]
        self._in_reference = True
        if self.reference_mode == "adapter_disabled":
            for name in self.trained_experts:
                self.experts[name].disable_adapters()
        try:
            with torch.no_grad():
                yield
        finally:
            self._in_reference = False
            if self.reference_mode == "adapter_disabled":
                for name in self.trained_experts:
                    self.experts[name].enable_adapters()
                # peft's enable_adapters sets requires_grad on the adapter; restore what it was
                for p, flag in zip(trainable, requires_grad):
                    p.requires_grad_(flag)

    def networks(self) -> list[torch.nn.Module]:
        """The networks a sharded run shards: every expert (the trained ones and a frozen one) and the frozen
        reference copies when kept."""
        return list(self.experts.values()) + list(self._references.values())

    def trained_state(self) -> dict[str, torch.Tensor]:
        """What ``save_trainable`` writes, as ``"<expert>.<state-dict name>"``: the LoRA weights, or the whole state
        of each trained expert."""
        state = {}
        names = {(e, n) for e, n in self._trainable_names}
        for expert in self.trained_experts:
            own = self.experts[expert].state_dict()
            state.update({f"{expert}.{n}": t for n, t in own.items() if self.config.finetune == "full" or (expert, n) in names})
        return state

    def _saved_file(self, expert: str) -> Optional[str]:
        """The LoRA file of ``expert`` in a saved folder: diffusers' default name for the first network, a file named
        after the component for the second (loaded with ``load_lora_weights(folder, weight_name=...,
        load_into_transformer_2=True)``), and for full fine-tuning a subfolder per expert beyond the first."""
        return None if expert == next(iter(self.experts)) else f"pytorch_lora_weights_{expert}.safetensors"

    def save_trainable(self, folder: str | os.PathLike, state: Optional[dict[str, torch.Tensor]] = None) -> None:
        """LoRA: diffusers' LoRA file (loads with ``pipe.load_lora_weights``, alpha kept); full: the transformer
        folder (``from_pretrained``). ``state``: ``trained_state()``'s tensors to write instead of the modules' own
        (a sharded run gathers them whole first). A second trained expert (Wan2.2's ``transformer_2``) is written
        beside the first: ``pytorch_lora_weights_transformer_2.safetensors``, or the folder ``transformer_2/``."""
        os.makedirs(folder, exist_ok=True)
        for expert in self.trained_experts:
            own = None if state is None else {k.removeprefix(f"{expert}."): v for k, v in state.items()
                                              if k.startswith(f"{expert}.")}
            self._save_expert(expert, folder, own)

    def _save_expert(self, expert: str, folder: str | os.PathLike, state: Optional[dict[str, torch.Tensor]]) -> None:
        network = self.experts[expert]
        if self.config.finetune == "full":
            if expert != next(iter(self.experts)):
                folder = os.path.join(folder, expert)
            if state is None:
                network.save_pretrained(folder, safe_serialization=True)
                return
            from huggingface_hub import save_torch_state_dict

            network.save_config(folder)
            save_torch_state_dict(state, folder, filename_pattern="diffusion_pytorch_model{suffix}.safetensors",
                                  max_shard_size="10GB")
            return
        from peft.utils import get_peft_model_state_dict

        metadata = network.peft_config[ADAPTER_NAME].to_dict()
        metadata = {k: sorted(v) if isinstance(v, set) else v for k, v in metadata.items()}
        self.pipeline_class.save_lora_weights(
            folder,
            transformer_lora_layers=get_peft_model_state_dict(network, state_dict=state, adapter_name=ADAPTER_NAME),
            transformer_lora_adapter_metadata=metadata,
            safe_serialization=True,
            **({"weight_name": self._saved_file(expert)} if self._saved_file(expert) else {}),
        )

    def load_trainable(self, folder: str | os.PathLike) -> None:
        """Load what ``save_trainable`` wrote, in place (the optimizer's parameters stay the same objects)."""
        for expert in self.trained_experts:
            self._load_expert(expert, folder)

    def _load_expert(self, expert: str, folder: str | os.PathLike) -> None:
        network = self.experts[expert]
        if self.config.finetune == "full":
            from safetensors.torch import load_file

            if expert != next(iter(self.experts)):
                folder = os.path.join(folder, expert)
            files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
            if not files:
                raise FileNotFoundError(f"no *.safetensors transformer weights in {folder}")
            state = {k: v for f in files for k, v in load_file(f).items()}
            network.load_state_dict(state, strict=True)
            return
        from peft.utils import set_peft_model_state_dict

        name = self._saved_file(expert)
        if name is not None and not os.path.isfile(os.path.join(folder, name)):
            raise FileNotFoundError(f"{folder} has no {name}: the LoRA of {expert} (this model trains "
                                    f"{', '.join(self.trained_experts)}; set model.trained_experts to what was saved)")
        state, metadata = self.pipeline_class.lora_state_dict(folder, return_lora_metadata=True,
                                                              **({"weight_name": name} if name else {}))
        prefix = "transformer."  # diffusers' LoRA files prefix keys and metadata with the component name
        metadata = {k.removeprefix(prefix): v for k, v in (metadata or {}).items()}
        for key, want in (("r", self.config.lora_rank), ("lora_alpha", self.config.lora_alpha)):
            got = metadata.get(key)
            if got is None or float(got) != float(want):
                raise ValueError(
                    f"the LoRA in {folder} has {key}={got} but this model has {key}={want}; set model.lora_rank "
                    f"and model.lora_alpha to match the saved adapter (or save it with save_trainable)"
                )
        state = {k.removeprefix(prefix): v for k, v in state.items()}
        result = set_peft_model_state_dict(network, state, adapter_name=ADAPTER_NAME)
        if result.unexpected_keys:
            raise ValueError(f"LoRA in {folder} has weights this model does not: {result.unexpected_keys[:5]}")
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing:
            raise ValueError(f"LoRA in {folder} lacks weights of this model's adapter: {missing[:5]}")


def load_model(cfg: ModelConfig | dict) -> FlowModel:
    """Load the adapter of ``cfg.family`` (components via ``from_pretrained``)."""
    config = validate_model_config(cfg)
    return _family_class(config.family)(config)
