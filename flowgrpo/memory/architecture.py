"""The architecture, as numbers: a model's components, its transformer's Linears and blocks, and the geometry that
turns a resolution into tokens and latents, read from the component configurations alone (no weights).

A LoRA parameter count is r·(in + out) for every ``nn.Linear`` whose qualified name is a target or ends with
"." + target (peft's rule), the targets resolved as ``FlowModel._lora_targets`` resolves them. Every count is
exact: each component is built from its configuration on the ``meta`` device (no memory, no download) and its
parameters and floating-point buffers summed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from flowgrpo.models.architectures import _config_files, architecture_dir
from flowgrpo.models.families import FAMILIES

SD3_CLIP_TOKENS = 77  # SD3 puts the CLIP encoders' 77 tokens before T5's in its text sequence


# ----------------------------------------------------------------------------- the architecture, as numbers


@dataclass(frozen=True)
class Component:
    """A model component's size: parameters and buffers (elements), as built from its configuration."""

    name: str  # transformer, text_encoder, ..., vae (the pipeline's names)
    class_name: str
    params: int
    buffers: int = 0  # floating-point buffer elements (held in the component's dtype, never sharded)


@dataclass(frozen=True)
class Linear:
    name: str  # qualified name in the transformer, e.g. transformer_blocks.0.attn.to_q
    in_features: int
    out_features: int


@dataclass(frozen=True)
class Block:
    """One transformer block (one FSDP unit): its kind, qualified name, parameters and widths."""

    name: str  # e.g. transformer_blocks.3
    # "joint" (SD3 / FLUX double-stream), "single" (FLUX single-stream), "wan" (the hand inventory's kinds);
    # "qwen_image", "flux2_joint", "flux2_single", "z_image" (counted by autograd alone: saved.py)
    kind: str
    params: int
    dim: int  # width of the residual stream D
    inner: int  # heads · head_dim of the attention
    mlp: int  # hidden width M of the feed-forward
    heads: int = 1
    qk_norm: bool = True
    dual: bool = False  # SD3.5's second, image-only attention (attn2)
    context_pre_only: bool = False  # SD3's last block: the text stream stops after the attention's projections
    cross_attn_norm: bool = True  # Wan's norm2 before the cross-attention
    heads_first: bool = False  # the joint attention concatenates q heads-first (SD3's JointAttnProcessor2_0)
    torch_rms: bool = False  # the q/k norms are torch.nn.RMSNorm (FLUX, Wan), not diffusers' RMSNorm (SD3)


@dataclass(frozen=True)
class Geometry:
    """What turns a resolution into tokens and latents."""

    family: str  # sd3 | flux | wan | qwen_image | flux2 | z_image
    latent_channels: int  # channels of the (unpacked) latent the samplers see
    vae_spatial: int  # pixels per latent pixel
    vae_temporal: int = 1  # frames per latent frame (video)
    # latent (frames, rows, columns) per token (FLUX, Qwen-Image: the adapter's 2x2 packing; FLUX.2: 1, its latent is
    # patchified already)
    patch: tuple[int, int, int] = (1, 2, 2)
    text_tokens_extra: int = 0  # text tokens besides max_sequence_length (SD3: CLIP's 77)
    text_width: int = 4096  # width of the text encoder's output the transformer reads
    in_width: int = 64  # width of a token's latent input (the patch embedding's input)
    # condition images whose tokens each call appends after the latent's (an edit's source: 1), each the latent's size
    references: int = 0


@dataclass(frozen=True)
class Architecture:
    components: tuple[Component, ...]  # the transformer first
    linears: tuple[Linear, ...]  # the transformer's nn.Linear modules (LoRA's candidates)
    blocks: tuple[Block, ...]
    geometry: Geometry
    source: str = ""  # where the configurations were read
    # the transformer's configuration (JSON, sorted keys): what autograd's count of its saved tensors builds
    transformer_config: str = field(default="", compare=False, repr=False)

    @property
    def transformer(self) -> Component:
        return self.components[0]

    def frozen(self) -> tuple[Component, ...]:
        return self.components[1:]


# ----------------------------------------------------------------------------- reading it without weights


def build_on_meta(config: dict):
    """The module a component configuration describes, built on the meta device (no memory): a diffusers
    model (``_class_name``) through ``from_config``, a transformers model (``architectures``) from its config class."""
    import torch

    with torch.device("meta"):
        if "_class_name" in config:
            import diffusers

            return getattr(diffusers, config["_class_name"]).from_config(config)
        import transformers

        config_class = transformers.CONFIG_MAPPING[config["model_type"]]
        return getattr(transformers, config["architectures"][0])(config_class.from_dict(dict(config)))


def _sizes(name: str, module) -> Component:
    params = sum(p.numel() for p in module.parameters())
    buffers = sum(b.numel() for b in module.buffers() if b.is_floating_point())
    return Component(name, type(module).__name__, params, buffers)


def read_architecture(model_config, name: Optional[str] = None, folder: Optional[Path] = None) -> Architecture:
    """The :class:`Architecture` of a model config (a ModelConfig or dict), read from its component configurations
    (:func:`architecture_dir`) and counted on the meta device."""
    from flowgrpo.models.config import validate_model_config

    model_config = validate_model_config(model_config)
    folder = Path(folder) if folder is not None else architecture_dir(model_config, name)
    files = _config_files(folder)
    if "transformer" not in files:
        from flowgrpo.run.errors import UserError

        raise UserError(f"{folder} holds no transformer configuration (transformer.json or transformer/config.json)")
    configs = {k: json.loads(v.read_text()) for k, v in files.items()}
    return architecture_from_configs(model_config.family, configs, str(folder))


def architecture_from_configs(family: str, configs: dict[str, dict], source: str = "") -> Architecture:
    """The :class:`Architecture` of component configurations {component: config dict}, counted on the meta device
    (once per process for the same configurations: every trainer start plans its run, and a test process starts
    hundreds)."""
    return _architecture(family, json.dumps(configs, sort_keys=True, default=str), source)


@functools.lru_cache(maxsize=16)
def _architecture(family: str, configs_json: str, source: str) -> Architecture:
    import torch

    configs = json.loads(configs_json)
    transformer = build_on_meta(configs["transformer"])
    others = [_sizes(k, build_on_meta(configs[k])) for k in sorted(configs) if k != "transformer"]
    linears = tuple(Linear(n, m.in_features, m.out_features) for n, m in transformer.named_modules()
                    if isinstance(m, torch.nn.Linear))
    return Architecture(
        components=(_sizes("transformer", transformer), *others),
        linears=linears,
        blocks=_blocks(transformer),
        # the blocks' geometry of the family's activation inventory (its record's memory_inventory)
        geometry=_geometry(_geometry_family(family), transformer.config, configs.get("vae", {}), configs),
        source=source,
        transformer_config=json.dumps(configs["transformer"], sort_keys=True, default=str),
    )


def _geometry_family(family: str) -> str:
    """The geometry a family's latents and tokens have: its own, another's (its record's ``geometry``: FLUX.2 klein
    has FLUX.2's), or its record's memory_inventory (a registered family whose blocks are SD3's, FLUX.1's or Wan's)."""
    record = FAMILIES.get(family)
    return getattr(record, "geometry", None) or getattr(record, "memory_inventory", None) or family


def transformer_classes() -> dict[str, str]:
    """family -> the diffusers class of its denoising network, for every family whose record names one."""
    return {name: f.transformer_class for name, f in sorted(FAMILIES.items()) if f.transformer_class}


def has_cp_plan(class_name: str) -> bool:
    """Whether the diffusers transformer class splits its sequence for context parallelism (a ``_cp_plan``)."""
    import diffusers

    return getattr(getattr(diffusers, class_name, None), "_cp_plan", None) is not None


def context_parallel_families() -> list[str]:
    """The families whose transformer class has a ``_cp_plan`` (Ulysses / ring attention in diffusers)."""
    return sorted(family for family, name in transformer_classes().items() if has_cp_plan(name))


def _blocks(transformer) -> tuple[Block, ...]:
    import torch

    c = transformer.config
    blocks = []
    for name, module in transformer.named_modules():
        kind = {"JointTransformerBlock": "joint", "FluxTransformerBlock": "joint",
                "FluxSingleTransformerBlock": "single", "WanTransformerBlock": "wan",
                "QwenImageTransformerBlock": "qwen_image",
                "Flux2TransformerBlock": "flux2_joint", "Flux2SingleTransformerBlock": "flux2_single",
                "ZImageTransformerBlock": "z_image"}.get(type(module).__name__)
        if kind is None:
            continue
        params = sum(p.numel() for p in module.parameters())
        if kind in ("qwen_image", "flux2_joint", "flux2_single", "z_image"):  # widths for the estimates only
            attn = module.attention if kind == "z_image" else module.attn
            mlp = {"qwen_image": lambda: module.img_mlp.net[0].proj.out_features,
                   "flux2_joint": lambda: module.mlp_hidden_dim, "flux2_single": lambda: attn.mlp_hidden_dim,
                   "z_image": lambda: module.feed_forward.w1.out_features}[kind]()
            blocks.append(Block(name, kind, params, attn.query_dim, attn.inner_dim, mlp, attn.heads,
                                qk_norm=getattr(attn, "norm_q", None) is not None))
            continue
        if kind == "wan":
            inner = c.num_attention_heads * c.attention_head_dim
            blocks.append(Block(name, kind, params, inner, inner, c.ffn_dim, c.num_attention_heads,
                                qk_norm=c.qk_norm is not None, cross_attn_norm=bool(c.cross_attn_norm),
                                torch_rms=isinstance(module.attn1.norm_q, torch.nn.RMSNorm)))
            continue
        attn = module.attn
        dim = attn.to_q.in_features
        inner = attn.to_q.out_features
        mlp = module.proj_mlp.out_features if kind == "single" else module.ff.net[0].proj.out_features
        blocks.append(Block(name, kind, params, dim, inner, mlp, attn.heads, qk_norm=attn.norm_q is not None,
                            dual=getattr(module, "attn2", None) is not None,
                            context_pre_only=bool(getattr(module, "context_pre_only", False)),
                            heads_first=type(module).__name__ == "JointTransformerBlock",
                            torch_rms=isinstance(attn.norm_q, torch.nn.RMSNorm)))
    return tuple(blocks)


def _geometry(family: str, c, vae: dict, configs: dict) -> Geometry:
    if family == "wan":
        temporal = vae.get("scale_factor_temporal") or 2 ** sum(vae.get("temperal_downsample", [False, True, True]))
        spatial = vae.get("scale_factor_spatial") or 2 ** len(vae.get("temperal_downsample", [False, True, True]))
        pt, ph, pw = c.patch_size
        return Geometry("wan", int(c.in_channels), int(spatial), int(temporal), (pt, ph, pw), 0, int(c.text_dim),
                        int(c.in_channels) * pt * ph * pw)
    if family == "qwen_image":  # a Wan-style VAE (8x in space), latents packed 2x2 into tokens by the adapter
        spatial = 2 ** len(vae.get("temperal_downsample", [False, True, True]))
        return Geometry("qwen_image", int(c.in_channels) // 4, spatial, 1, (1, 2, 2), 0, int(c.joint_attention_dim),
                        int(c.in_channels))
    spatial = 2 ** (len(vae.get("block_out_channels", [0, 0, 0, 0])) - 1)
    if family == "flux2":  # the adapter's latent is the VAE's patchified 2x2 (4C channels at 1/16): a token a pixel
        return Geometry("flux2", int(c.in_channels), 2 * spatial, 1, (1, 1, 1), 0, int(c.joint_attention_dim),
                        int(c.in_channels))
    if family == "z_image":  # the transformer patchifies 2x2 itself
        p = int(c.all_patch_size[0])
        return Geometry("z_image", int(c.in_channels), spatial, 1, (1, p, p), 0, int(c.cap_feat_dim),
                        int(c.in_channels) * p * p)
    if family == "flux":
        p = int(c.patch_size)
        return Geometry("flux", int(c.in_channels) // 4, spatial, 1, (1, 2 * p, 2 * p), 0, int(c.joint_attention_dim),
                        int(c.in_channels))
    p = int(c.patch_size)
    # the pipeline pads CLIP's tokens to its tokenizer's length (77; the tiny model's 16) before T5's
    extra = int(configs["text_encoder"].get("max_position_embeddings", SD3_CLIP_TOKENS)) if "text_encoder" in configs else 0
    return Geometry("sd3", int(c.in_channels), spatial, 1, (1, p, p), extra, int(c.joint_attention_dim),
                    int(c.in_channels) * p * p)


# ----------------------------------------------------------------------------- LoRA


def lora_targets(model_config, arch: Optional["Architecture"] = None) -> list[str]:
    """The LoRA target suffixes a model config trains, resolved exactly as ``FlowModel._lora_targets`` does
    (a family may replace the SD3/FLUX default targets by its own, e.g. Wan's). FLUX.2's adapter adds its
    single-stream blocks' projections, one name per block: with ``arch`` they are named as its adapter names them."""
    from flowgrpo.models.base import FlowModel

    targets = FlowModel._lora_targets(SimpleNamespace(config=model_config))
    if arch is not None and model_config.family in ("flux2", "flux2_klein"):
        adapter = FAMILIES[model_config.family].adapter_class()
        singles = sum(block.kind == "flux2_single" for block in arch.blocks)
        transformer = SimpleNamespace(single_transformer_blocks=range(singles))
        return adapter._lora_targets(SimpleNamespace(config=model_config, transformer=transformer))
    return targets


def is_target(name: str, targets: Sequence[str]) -> bool:
    """peft's rule for a list of target modules: the qualified name is a target or ends with "." + target."""
    return any(name == t or name.endswith("." + t) for t in targets)


def lora_parameters(linears: Sequence[Linear], targets: Sequence[str], rank: int) -> int:
    """LoRA's trainable parameters: rank · (in + out) for every targeted Linear (A is rank x in, B out x rank)."""
    return sum(rank * (m.in_features + m.out_features) for m in linears if is_target(m.name, targets))


# ----------------------------------------------------------------------------- tokens and latents


def _frames(geometry: Geometry, model_config) -> int:
    return (model_config.num_frames - 1) // geometry.vae_temporal + 1 if geometry.family == "wan" else 1


def latent_numel(geometry: Geometry, model_config) -> int:
    """Elements of one sample's latent (C x [f x] h x w) at the model config's size."""
    height = model_config.resolution
    width = model_config.width or model_config.resolution
    s = geometry.vae_spatial
    return geometry.latent_channels * _frames(geometry, model_config) * (height // s) * (width // s)


def token_counts(geometry: Geometry, model_config) -> tuple[int, int]:
    """(image or video tokens, text tokens) of one sample in the transformer."""
    height = model_config.resolution
    width = model_config.width or model_config.resolution
    s = geometry.vae_spatial
    pt, ph, pw = geometry.patch
    image = (_frames(geometry, model_config) // pt) * (height // s // ph) * (width // s // pw)
    return image * (1 + geometry.references), model_config.max_sequence_length + geometry.text_tokens_extra


# the families whose adapter packs the latent's 2x2 patches into tokens before the transformer call
PACKED = ("flux", "qwen_image")


def call_grid(geometry: Geometry, model_config, context_parallel: int = 1) -> tuple[int, int, int]:
    """The (frames, rows, columns) of the latent one transformer call reads (FLUX's and Qwen-Image's packed token
    grid), and with ``context_parallel`` N > 1 a rank's share: the token grid's longest axis split in N (rounded up)."""
    height = model_config.resolution
    width = model_config.width or model_config.resolution
    s = geometry.vae_spatial
    # an editing call's references follow the latent's tokens: as many more token grids, counted as frames
    grid = [_frames(geometry, model_config) * (1 + geometry.references), height // s, width // s]
    patch = list(geometry.patch)
    if geometry.family in PACKED:
        grid = [grid[0] // patch[0], grid[1] // patch[1], grid[2] // patch[2]]
        patch = [1, 1, 1]
    if context_parallel > 1:
        tokens = [g // p for g, p in zip(grid, patch)]
        axis = max(range(3), key=lambda i: (tokens[i], i))
        grid[axis] = -(-tokens[axis] // context_parallel) * patch[axis]
    return grid[0], grid[1], grid[2]


def rank_tokens(geometry: Geometry, model_config, context_parallel: int = 1) -> tuple[int, int]:
    """(image or video tokens, text tokens) a context-parallel rank holds of one sample: the tokens of its share of
    the grid (:func:`call_grid`); the text split too except Wan's (its ``_cp_plan`` splits the video tokens alone: the
    text enters through cross-attention, whole on every rank)."""
    n_img, n_txt = token_counts(geometry, model_config)
    if context_parallel <= 1:
        return n_img, n_txt
    grid = call_grid(geometry, model_config, context_parallel)
    patch = (1, 1, 1) if geometry.family in PACKED else geometry.patch
    image = (grid[0] // patch[0]) * (grid[1] // patch[1]) * (grid[2] // patch[2])
    return image, n_txt if geometry.family == "wan" else -(-n_txt // context_parallel)
