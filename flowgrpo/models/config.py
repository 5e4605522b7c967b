"""The model config schema (``ModelConfig``) and its validation (the families: flowgrpo/models/families.py).

Keys of ``configs/models/*.yaml``; every field is commented. Errors name the key, the bad value and
the allowed values (unknown keys get a "did you mean").
"""

from __future__ import annotations
import copy
import difflib
import functools
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, List, Optional
import torch

from flowgrpo.models.families import DEFAULT_LORA_TARGETS, FAMILIES, families
from flowgrpo.run.errors import UserError

ADAPTER_NAME = "default"  # the peft adapter flowgrpo trains
# a pipeline's denoising networks: one, or two experts switched at a boundary timestep (Wan2.2 A14B)
EXPERT_COMPONENTS = ("transformer", "transformer_2")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FINETUNE_MODES = ("lora", "full")
COMPILE_BACKENDS = ("inductor", "aot_eager", "cudagraphs")  # torch.compile backends that need no extra package
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
REFERENCE_MODES = ("auto", "adapter_disabled", "frozen_copy", "none")
_DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")

@dataclass
class ModelConfig:
    """Which model to load and how to fine-tune it (the ``model:`` block of a run config)."""

    # adapter family: "sd3" (SD3 / SD3.5) | "flux" (FLUX.1) | "flux2" (FLUX.2 dev / klein) | "qwen_image" (Qwen-Image)
    # | "z_image" (Z-Image, Z-Image-Turbo) | "wan" (Wan2.1 / Wan2.2 T2V) | "analytic" (the Gaussian-mixture world
    # with an exact velocity, docs/analytic_world.md); flowgrpo/models/families.py registers them
    family: str = "sd3"
    pretrained: str = "tiny-sd3"  # hub id, local folder saved with save_pretrained, or built-in name
    revision: Optional[str] = None  # hub revision (branch, tag or commit) of `pretrained`
    dtype: str = "float32"  # weights dtype of transformer and text encoders: float32 | bfloat16 | float16
    device: str = "auto"  # "auto" (cuda if available else cpu) | "cpu" | "cuda" | "cuda:1" | "mps"
    resolution: int = 64  # image (video frame) height in pixels, and the width unless `width` is set
    width: Optional[int] = None  # width in pixels when it differs from `resolution` (Wan2.1: 480 x 832)
    # frames per video for video families (Wan: 4k + 1, e.g. 81; the toy model: 9); image families: 1
    num_frames: int = 1
    dim: int = 2  # the analytic family: dimension d of its samples (other families ignore it)
    guidance_scale: float = 4.5  # SD3: CFG scale (>1 batches [uncond; cond]); FLUX.1-dev: embedded guidance
    # two-expert models (Wan2.2 A14B): the CFG scale of the second, low-noise expert's steps; null = guidance_scale
    guidance_scale_2: Optional[float] = None
    # two-expert models: which experts train, by pipeline component: transformer (high noise), transformer_2 (low
    # noise); null = every expert. An expert left out is used as it is (frozen, no LoRA)
    trained_experts: Optional[List[str]] = None
    max_sequence_length: int = 16  # T5 text tokens (tiny model: 16; SD3.5: 256; FLUX: 512)
    sample_steps: int = 40  # default number of ODE steps for evaluation sampling
    shift: Optional[float] = None  # time shift sigma -> s*sigma/(1+(s-1)*sigma); None = from the scheduler config
    attention_backend: str = "native"  # diffusers attention backend; "native" = PyTorch SDPA (always works)
    finetune: str = "lora"  # "lora" (peft adapter on the transformer) | "full" (every transformer weight)
    lora_rank: int = 32  # LoRA rank r
    lora_alpha: float = 64.0  # LoRA alpha; the update is scaled by alpha / r
    # module-name suffixes; left at this (SD3/FLUX) default, a family with other names uses its own (its record's lora_targets)
    lora_target_modules: List[str] = field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    # reference policy: "auto" (adapter_disabled for LoRA, frozen_copy for full) | "adapter_disabled" |
    # "frozen_copy" (a WeightCopy of the trained weights as loaded) | "none" (no reference, no KL term)
    reference: str = "auto"
    gradient_checkpointing: bool = False  # recompute transformer activations in backward to save memory
    # move the text encoders (SD3's three, FLUX's two, Wan's T5, Qwen-Image's VLM, ...) to the CPU once prompts are
    # encoded, and back to the device for the next encoding (the rollout's and the held-out evaluation's): their
    # memory is free while sampling and training; the same conditioning, slower (docs/scaling.md)
    offload_text_encoders: bool = False
    # regional compilation: torch.compile each repeated block of the denoising networks (the elements of their
    # block lists), for sampling and training; the first calls compile (minutes at real size), later ones reuse it
    compile: bool = False
    compile_backend: str = "inductor"  # torch.compile's backend: inductor | aot_eager (traced, no code generated) | cudagraphs
    # inductor's mode: default | reduce-overhead (CUDA graphs of each block where shapes repeat) | max-autotune-no-cudagraphs
    compile_mode: str = "default"
    # build the real architecture from configs/models/architectures/<name>/ with random weights (no download):
    # for measuring speed and memory at real size (flowgrpo/models/random_init.py); its samples are noise
    random_weights: bool = False
    # with random_weights: keep this many transformer blocks of each kind and text-encoder layers (real widths)
    depth: Optional[int] = None


def attention_backends() -> list[str]:
    """The backend names diffusers' attention dispatcher knows (availability is checked at load)."""
    from diffusers.models.attention_dispatch import AttentionBackendName

    return sorted(b.value for b in AttentionBackendName)


class ModelConfigError(UserError, ValueError):
    """A bad model config value; the message names the key, the allowed values and the fix."""


@functools.lru_cache(maxsize=1)
def _schema_node():
    from omegaconf import OmegaConf

    return OmegaConf.structured(ModelConfig)


def validate_model_config(cfg: Any = None) -> ModelConfig:
    """Merge a dict / DictConfig / ModelConfig onto the schema and check every value.

    Unknown keys and bad values raise ``ModelConfigError`` (a ``ValueError``) naming the key, the allowed
    values and the fix.
    """
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if cfg is None:
        cfg = {}
    if isinstance(cfg, ModelConfig):
        cfg = OmegaConf.structured(cfg)
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    if not isinstance(cfg, dict):
        raise TypeError(f"a model config must be a dict, DictConfig or ModelConfig, got {type(cfg).__name__}")
    known = [f.name for f in fields(ModelConfig)]
    for key in cfg:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ModelConfigError(
                f"unknown model config key '{key}': {hint}remove it or use one of: {', '.join(known)}"
            )
    try:
        merged = OmegaConf.unsafe_merge(copy.deepcopy(_schema_node()), cfg)  # the schema's node, built once
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or getattr(err, "key", None)
        raise ModelConfigError(f"bad model config value for '{key}': {err.msg if hasattr(err, 'msg') else err}") from None
    return check_model_config(OmegaConf.to_object(merged))


def _loadable(pretrained: str) -> bool:
    """Whether ``pretrained`` can name weights: a path (whether it exists is resolve_pretrained's to say, naming the
    fix) or a name the hub accepts (built-in names are such names); not '-1', '[1]' or 'a=b'."""
    if not pretrained:
        return False
    if pretrained.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(pretrained)):
        return True
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(pretrained)
    except ValueError:  # HFValidationError
        return False
    return True


def check_model_config(config: ModelConfig) -> ModelConfig:
    """Check every value of a ModelConfig whose keys and types OmegaConf has checked (a structured merge's, as the
    run config's ``model``); ``validate_model_config`` does both for any input. Returns ``config``."""

    def bad(key: str, allowed: str) -> ValueError:
        return ModelConfigError(f"model config '{key}' is {getattr(config, key)!r}; allowed: {allowed}")

    if config.family not in FAMILIES:
        raise bad("family", ", ".join(families()))
    if not _loadable(config.pretrained):
        raise bad("pretrained", "a hub id 'owner/name', a local folder or a built-in model name")
    if config.dtype not in DTYPES:
        raise bad("dtype", ", ".join(DTYPES))
    if not _DEVICE_PATTERN.match(config.device):
        raise bad("device", "auto, cpu, cuda, cuda:<index>, mps")
    for key in ("resolution", "max_sequence_length", "sample_steps", "lora_rank", "num_frames", "dim"):
        if getattr(config, key) < 1:
            raise bad(key, "an integer >= 1")
    if config.depth is not None and (config.depth < 1 or not config.random_weights):
        raise bad("depth", "null, or an integer >= 1 together with random_weights: true")
    if config.width is not None and config.width < 1:
        raise bad("width", "null (= resolution) or an integer >= 1")
    factor = FAMILIES[config.family].temporal_factor
    if factor is None and config.num_frames != 1:
        video = sorted(name for name, f in FAMILIES.items() if f.temporal_factor)
        raise bad("num_frames", f"1 for the image family {config.family!r} (video families: {', '.join(video)})")
    if factor is not None and (config.num_frames - 1) % factor:
        lower = (config.num_frames - 1) // factor * factor + 1
        raise bad("num_frames", f"{factor}k + 1 for {config.family!r} (its VAE compresses time {factor}x), e.g. "
                  f"{lower} or {lower + factor}")
    if not config.guidance_scale >= 0:
        raise bad("guidance_scale", "a number >= 0 (<= 1 turns SD3's CFG off)")
    if config.guidance_scale_2 is not None and not config.guidance_scale_2 >= 0:
        raise bad("guidance_scale_2", "null (= guidance_scale) or a number >= 0")
    if config.trained_experts is not None and (not config.trained_experts
                                               or set(config.trained_experts) - set(EXPERT_COMPONENTS)):
        raise bad("trained_experts", f"null (every expert) or a non-empty list of {', '.join(EXPERT_COMPONENTS)}")
    if config.shift is not None and not config.shift > 0:
        raise bad("shift", "null (read from the scheduler config) or a number > 0")
    if not config.lora_alpha > 0:
        raise bad("lora_alpha", "a number > 0")
    if config.finetune not in FINETUNE_MODES:
        raise bad("finetune", ", ".join(FINETUNE_MODES))
    if config.finetune == "lora" and not config.lora_target_modules:
        raise bad("lora_target_modules", "a non-empty list of module-name suffixes such as 'attn.to_q'")
    if config.reference not in REFERENCE_MODES:
        raise bad("reference", ", ".join(REFERENCE_MODES))
    if config.reference == "adapter_disabled" and config.finetune != "lora":
        raise ModelConfigError(
            "model config reference='adapter_disabled' needs finetune='lora' (full fine-tuning has no adapter "
            "to disable); use reference: frozen_copy (or auto, or none)"
        )
    if not isinstance(config.offload_text_encoders, bool):
        raise bad("offload_text_encoders", "true or false")
    if config.compile_backend not in COMPILE_BACKENDS:
        raise bad("compile_backend", ", ".join(COMPILE_BACKENDS))
    if config.compile_mode not in COMPILE_MODES:
        raise bad("compile_mode", ", ".join(COMPILE_MODES))
    if config.compile_mode != "default" and config.compile_backend != "inductor":
        raise bad("compile_mode", f"default with compile_backend={config.compile_backend!r} (a mode is inductor's)")
    backends = attention_backends()
    if config.attention_backend not in backends:
        raise ModelConfigError(
            f"model config 'attention_backend' is {config.attention_backend!r}; use 'native' (PyTorch SDPA), "
            f"'xformers' or 'flash' where installed; diffusers knows: {', '.join(backends)}"
        )
    return config
