"""How much GPU memory one training process needs: the arithmetic behind ``flowgrpo plan``.

Counts, per process (GPU), with P the transformer's parameters, T the trainable ones, N the processes
and s = N under FSDP (``--fsdp``: FSDP2 shards every parameter of the transformer, its gradient, its
optimizer state and every copy cloned from it evenly over the processes), s = 1 otherwise:

  transformer weights   (P·b + T_lora·4) / s + buffers·b    b = bytes of the model dtype; LoRA adds T_lora
                                                            float32 weights; buffers are never sharded
  gradients             T·g / s                             g = bytes of a trainable weight: 4 for LoRA,
                                                            b for full fine-tuning (4 with float32 master weights)
  AdamW state           2·T·g / s                           two moments, each shaped and typed like its weight
  each weight copy      T·g / s                             the evaluation EMA, DiffusionNFT's θ_old, ... (named)
  reference policy      0 for LoRA (the adapter is disabled), P·b / s for full fine-tuning's frozen copy
  text encoders, VAE    params·b (text encoders), params·4 (VAE): frozen, whole on every process
  FSDP buffers          2·(B + B_lora)·b + B_T·4 (--fsdp): the largest block all-gathered whole twice (the next
                        one is prefetched) and its trainable part's float32 gradient before the reduce-scatter
  rollout latents       G·(2S + 2)·L·4    one group of G samples keeps float32 latents of L elements: the state
                        before and after each of its S steps (the transitions a learner trains on), x_T and x_0
  rollout forward       G·c·t·(3D + 2M)·b    the no-grad rollout call of the group: c = 2 passes with CFG, t
                        tokens, the residual stream, a normalised copy and the MLP hidden twice (an estimate)
  training activations  m·A per micro-batch of m samples, A below

  total = fixed (every line above the rollout) + rollout latents + max(rollout forward, training activations)

A LoRA parameter count is r·(in + out) for every ``nn.Linear`` whose qualified name is a target or ends with
"." + target (peft's rule), the targets resolved as ``FlowModel._lora_targets`` resolves them. Every count is
exact: each component is built from its configuration on the ``meta`` device (no memory, no download) and its
parameters and floating-point buffers summed.

A, one sample's activations, is an inventory of the tensors autograd saves for the backward, block by block.
For a stream of n tokens of width D: a LayerNorm keeps its input (n·D); the AdaLN modulation x·(1 + scale)
keeps x when the scale trains (full fine-tuning); a Linear keeps its input when its weight trains, or when it
carries a LoRA adapter (peft casts the input to the adapter's float32: one copy per adapted Linear, the input
itself in a float32 model), plus the adapter's n·r hidden; a GELU keeps its input (n·M); diffusers' RMSNorm
(SD3's q/k norms) keeps its input, a float32 copy of it (bf16 models) and, training its weight, its output;
torch.nn.RMSNorm (FLUX, Wan) keeps its input alone (CUDA's fused kernel); attention keeps q, k, v and its
output (flash or memory-efficient SDPA: no tokens × tokens matrix), and its output is read back as a view
except in SD3's joint attention (its q is concatenated heads-first: one more copy); a gate keeps the gated
tensor when it trains. Tokens are image tokens + text tokens in the joint (MM-DiT) attention of SD3 and FLUX;
Wan has f·(h/2)·(w/2) video tokens with cross-attention to the text. With LoRA nothing before the first
block trains, so that block keeps neither its inputs' norms nor SD3.5's un-adapted second attention.
Per-token statistics (norm means, RMS factors, the attention's log-sum-exp) are left out: ~2 % of a block.
With gradient checkpointing the block inputs are kept and each block's tensors exist only while it is
recomputed; the backward frees a block's inputs once it is done, so the peak is max over k of (inputs of
blocks 0..k + block k's tensors). A adds the backward's transient gradients: the MLP hidden's and the
block output's, n·(M + D)·b.

Checked: tests/models/test_memory.py measures what autograd saves in tiny models of the same classes on the
CPU; benchmarks/check_plan_activations.py does it for the real-size transformers on a GPU (docs/memory.md).
Assumptions (docs/memory.md): the transformer runs in the model dtype without autocast; full fine-tuning trains
the weights in that dtype, as flowgrpo loads them (``master_dtype="float32"``: float32 master weights), and
``torch.optim.AdamW`` keeps its moments in each weight's dtype; LoRA weights, gradients and moments are float32.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from flowgrpo.models.architectures import FAMILY_COMPONENTS, _config_files, architecture_dir  # noqa: F401

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_COPIES = ("ema", "old_policy")  # the evaluation EMA and DiffusionNFT's sampling policy θ_old
SD3_CLIP_TOKENS = 77  # SD3 puts the CLIP encoders' 77 tokens before T5's in its text sequence
SAFETY_MARGIN = 0.10  # of --gpu-memory, kept free: CUDA context, allocator fragmentation, NCCL, temporaries


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
    kind: str  # "joint" (SD3 / FLUX double-stream), "single" (FLUX single-stream), "wan"
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

    family: str  # sd3 | flux | wan
    latent_channels: int  # channels of the (unpacked) latent the samplers see
    vae_spatial: int  # pixels per latent pixel
    vae_temporal: int = 1  # frames per latent frame (video)
    patch: tuple[int, int, int] = (1, 2, 2)  # latent (frames, rows, columns) per token (FLUX: its 2x2 packing)
    text_tokens_extra: int = 0  # text tokens besides max_sequence_length (SD3: CLIP's 77)
    text_width: int = 4096  # width of the text encoder's output the transformer reads
    in_width: int = 64  # width of a token's latent input (the patch embedding's input)


@dataclass(frozen=True)
class Architecture:
    components: tuple[Component, ...]  # the transformer first
    linears: tuple[Linear, ...]  # the transformer's nn.Linear modules (LoRA's candidates)
    blocks: tuple[Block, ...]
    geometry: Geometry
    source: str = ""  # where the configurations were read

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
    """The :class:`Architecture` of component configurations {component: config dict}, counted on the meta device."""
    import torch

    transformer = build_on_meta(configs["transformer"])
    others = [_sizes(k, build_on_meta(configs[k])) for k in sorted(configs) if k != "transformer"]
    linears = tuple(Linear(n, m.in_features, m.out_features) for n, m in transformer.named_modules()
                    if isinstance(m, torch.nn.Linear))
    return Architecture(
        components=(_sizes("transformer", transformer), *others),
        linears=linears,
        blocks=_blocks(transformer),
        geometry=_geometry(family, transformer.config, configs.get("vae", {}), configs),
        source=source,
    )


def _blocks(transformer) -> tuple[Block, ...]:
    import torch

    c = transformer.config
    blocks = []
    for name, module in transformer.named_modules():
        kind = {"JointTransformerBlock": "joint", "FluxTransformerBlock": "joint", "FluxSingleTransformerBlock": "single",
                "WanTransformerBlock": "wan"}.get(type(module).__name__)
        if kind is None:
            continue
        params = sum(p.numel() for p in module.parameters())
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
    spatial = 2 ** (len(vae.get("block_out_channels", [0, 0, 0, 0])) - 1)
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


def lora_targets(model_config) -> list[str]:
    """The LoRA target suffixes a model config trains, resolved exactly as ``FlowModel._lora_targets`` does
    (a family may replace the SD3/FLUX default targets by its own, e.g. Wan's)."""
    from flowgrpo.models.base import FlowModel
    from flowgrpo.models.config import _family_class

    family = _family_class(model_config.family)
    return FlowModel._lora_targets(SimpleNamespace(config=model_config, default_lora_targets=family.default_lora_targets))


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
    return image, model_config.max_sequence_length + geometry.text_tokens_extra


# ----------------------------------------------------------------------------- activations: the inventory


@dataclass(frozen=True)
class Saved:
    """One tensor autograd keeps for the backward: elements x bytes; ``shared`` names one kept once per forward
    (the same tensor read by every block: Wan's text states, the rotary tables)."""

    what: str
    elements: int
    bytes_per: int
    shared: str = ""

    @property
    def bytes(self) -> int:
        return self.elements * self.bytes_per


@dataclass(frozen=True)
class _Rules:
    """What a saved tensor costs under one setting: model dtype bytes, full fine-tuning or LoRA (and which Linear
    carries an adapter)."""

    b: int  # bytes of the model dtype
    full: bool
    rank: int
    adapted: Callable[[str], bool]
    grad_in: bool = True  # the block's inputs require grad (false for LoRA's first block: no adapter before it)
    fused_rms: bool = True  # torch.nn.RMSNorm runs its fused kernel (CUDA); False: the composite of the CPU

    @property
    def up(self) -> int:  # a float32 copy the code makes of a tensor: free (the tensor itself) when already float32
        return 0 if self.b == 4 else 4

    def norm_input(self, what, n, width, nbytes=None) -> list[Saved]:
        return [Saved(f"{what} input", n * width, nbytes or self.b)]

    def modulated(self, what, n, width, nbytes=None) -> list[Saved]:
        """x·(1 + scale) + shift: x is kept for the scale's gradient when the scale is trained."""
        return [Saved(f"{what} normalised", n * width, nbytes or self.b)] if self.full else []

    def gate(self, what, n, width, nbytes=None) -> list[Saved]:
        return [Saved(f"{what} gated", n * width, nbytes or self.b)] if self.full else []

    def linears(self, what, names: Sequence[str], n, width, shared="", kept=False) -> list[Saved]:
        """The input of Linears reading one tensor (n x width): kept once when trained (full fine-tuning); with
        LoRA, each adapted Linear keeps its float32 cast of it (the tensor itself when the model is float32) and
        the adapter's n x rank hidden. ``kept``: the input is a tensor already counted (the attention's output)."""
        if self.full:
            return [] if kept else [Saved(f"{what} input", n * width, self.b, shared)]
        k = sum(self.adapted(name) for name in names)
        if k == 0:
            return []
        if self.b == 4:
            casts = [] if kept else [Saved(f"{what} input", n * width, 4, shared)]
        else:
            casts = [Saved(f"{what} input (float32 cast {i})", n * width, 4) for i in range(k)]
        return casts + [Saved(f"{what} LoRA hidden", k * n * self.rank, 4)]

    def rms(self, what, n, width, grad=True) -> list[Saved]:
        """diffusers' RMSNorm with a weight: its input, the float32 copy it squares (bf16 models), the normalised
        tensor (for the weight's gradient)."""
        if not grad:
            return []
        saved = [Saved(f"{what} input", n * width, self.b)]
        saved += [Saved(f"{what} float32 copy", n * width, self.up)] if self.up else []
        return saved + ([Saved(f"{what} normalised", n * width, self.b)] if self.full else [])

    def torch_rms(self, what, n, width, grad=True) -> list[Saved]:
        """``torch.nn.RMSNorm`` (FLUX's and Wan's q/k norms). Its fused CUDA kernel keeps its input alone (the
        weight's gradient is recomputed from it); the CPU composite keeps the input in float32 and, for a trained
        weight, the float32 normalised tensor."""
        if not grad:
            return []
        if self.fused_rms:
            return [Saved(f"{what} input", n * width, self.b)]
        return [Saved(f"{what} input (float32)", n * width, 4)] + (
            [Saved(f"{what} normalised (float32)", n * width, 4)] if self.full else [])

    def qk_norms(self, block: "Block", what, nq, nk, width, k_grad=True) -> list[Saved]:
        if not block.qk_norm:
            return []
        norm = self.torch_rms if block.torch_rms else self.rms
        return norm(f"{what} norm_q", nq, width) + norm(f"{what} norm_k", nk, width, grad=k_grad)

    def attention(self, what, nq, nkv, width) -> list[Saved]:
        """Flash / memory-efficient SDPA keeps q, k, v and its output (no tokens x tokens matrix)."""
        return [Saved(f"{what} q+out", 2 * nq * width, self.b), Saved(f"{what} k+v", 2 * nkv * width, self.b)]

    def gelu(self, what, n, width) -> list[Saved]:
        return [Saved(f"{what} GELU input", n * width, self.b)]


def _joint_block(block: Block, n_img: int, n_txt: int, r: _Rules) -> list[Saved]:
    """SD3's JointTransformerBlock and FLUX's double-stream block (MM-DiT): two streams, one joint attention."""
    p, D, inner, M = block.name + ".", block.dim, block.inner, block.mlp
    out: list[Saved] = []
    streams = (("image", n_img, "norm1", ("to_q", "to_k", "to_v"), ("norm_q", "norm_k"), "to_out.0", "norm2", "ff"),
               ("text", n_txt, "norm1_context", ("add_q_proj", "add_k_proj", "add_v_proj"),
                ("norm_added_q", "norm_added_k"), "to_add_out", "norm2_context", "ff_context"))
    for stream, n, norm1, qkv, _, _, norm2, ff in streams:
        out += (r.norm_input(f"{stream} {norm1}", n, D) if r.grad_in else []) + r.modulated(f"{stream} {norm1}", n, D)
        out += r.linears(f"{stream} q/k/v", [p + "attn." + q for q in qkv], n, D)
        out += r.qk_norms(block, stream, n, n, inner)
        if stream == "text" and block.context_pre_only:
            continue
        out += r.gate(f"{stream} attention", n, D)
        out += r.norm_input(f"{stream} {norm2}", n, D) + r.modulated(f"{stream} {norm2}", n, D)
        out += r.linears(f"{stream} {ff} in", [p + ff + ".net.0.proj"], n, D) + r.gelu(f"{stream} {ff}", n, M)
        out += r.linears(f"{stream} {ff} out", [p + ff + ".net.2"], n, M) + r.gate(f"{stream} {ff}", n, D)
    out += r.attention("joint attention", n_img + n_txt, n_img + n_txt, inner)
    parts = [(n_img, p + "attn.to_out.0")] + ([] if block.context_pre_only else [(n_txt, p + "attn.to_add_out")])
    out += _output_projections(parts, n_img + n_txt, inner, r, copied=block.heads_first)
    dual = [p + "attn2." + q for q in ("to_q", "to_k", "to_v")]
    if block.dual and (r.grad_in or any(map(r.adapted, dual))):  # SD3.5's second attention, over the image tokens
        out += r.linears("attn2 q/k/v", [p + "attn2." + q for q in ("to_q", "to_k", "to_v")], n_img, D)
        out += r.qk_norms(block, "attn2", n_img, n_img, inner)
        out += r.attention("attn2", n_img, n_img, inner)
        out += r.linears("attn2 out", [p + "attn2.to_out.0"], n_img, inner, kept=True) + r.gate("attn2", n_img, D)
    return out


def _output_projections(parts, n_all: int, inner: int, r: _Rules, copied: bool) -> list[Saved]:
    """The attention output read by the per-stream output Linears. The attention's output tensor has the layout of
    its q: tokens-first (FLUX, Wan) makes the read-back a view of the tensor the attention keeps; SD3's joint q is
    concatenated heads-first, so reading it back tokens-first copies it (``copied``): one more n_all x inner."""
    if copied and (r.full or (r.b == 4 and any(r.adapted(name) for _, name in parts))):
        saved = [Saved("attention output (copy)", n_all * inner, r.b if r.full else 4)]
        return saved + ([] if r.full else [Saved("attention output LoRA hidden",
                                                 sum(n for n, name in parts if r.adapted(name)) * r.rank, 4)])
    return [s for n, name in parts for s in r.linears("attention output", [name], n, inner, kept=not copied)]


def _single_block(block: Block, n_img: int, n_txt: int, r: _Rules) -> list[Saved]:
    """FLUX's single-stream block: text and image tokens as one sequence, attention and MLP side by side."""
    p, N, D, inner, M = block.name + ".", n_img + n_txt, block.dim, block.inner, block.mlp
    out = (r.norm_input("norm", N, D) if r.grad_in else []) + r.modulated("norm", N, D)
    out += r.linears("proj_mlp + q/k/v", [p + "proj_mlp"] + [p + "attn." + q for q in ("to_q", "to_k", "to_v")], N, D)
    out += r.gelu("mlp", N, M) + r.qk_norms(block, "attention", N, N, inner)
    out += r.attention("attention", N, N, inner)
    out += r.linears("proj_out", [p + "proj_out"], N, inner + M) + r.gate("proj_out", N, D)
    return out


def _wan_block(block: Block, n: int, n_txt: int, r: _Rules) -> list[Saved]:
    """Wan's block: self-attention over the video tokens, cross-attention to the text, FFN; its norms and
    modulations run in float32 (FP32LayerNorm, ``hidden_states.float()``)."""
    p, D, inner, M = block.name + ".", block.dim, block.inner, block.mlp
    out = (r.norm_input("norm1 (float32)", n, D, 4) if r.grad_in else []) + r.modulated("norm1 (float32)", n, D, 4)
    out += r.linears("attn1 q/k/v", [p + "attn1." + q for q in ("to_q", "to_k", "to_v")], n, D)
    out += r.qk_norms(block, "attn1", n, n, inner)
    out += r.attention("attn1", n, n, inner)
    out += r.linears("attn1 out", [p + "attn1.to_out.0"], n, inner, kept=True) + r.gate("attn1", n, D)
    if block.cross_attn_norm:
        out += r.norm_input("norm2 (float32)", n, D, 4)
    out += r.linears("attn2 q", [p + "attn2.to_q"], n, D)
    kv = [p + "attn2.to_k", p + "attn2.to_v"]
    out += r.linears("attn2 k/v (text)", kv, n_txt, D, shared="wan text states" if r.full or r.b == 4 else "")
    out += r.qk_norms(block, "attn2", n, n_txt, inner, k_grad=r.full or r.adapted(kv[0]))
    out += r.attention("attn2", n, n_txt, inner)
    out += r.linears("attn2 out", [p + "attn2.to_out.0"], n, inner, kept=True)
    out += r.norm_input("norm3 (float32)", n, D, 4) + r.modulated("norm3 (float32)", n, D, 4)
    out += r.linears("ffn in", [p + "ffn.net.0.proj"], n, D) + r.gelu("ffn", n, M)
    out += r.linears("ffn out", [p + "ffn.net.2"], n, M) + r.gate("ffn (float32)", n, D, 4)
    return out


BLOCK_INVENTORIES = {"joint": _joint_block, "single": _single_block, "wan": _wan_block}


def block_inputs(block: Block, n_img: int, n_txt: int, b: int) -> list[Saved]:
    """What gradient checkpointing keeps of a block: its inputs (the residual streams; Wan's one text tensor is read
    by every block)."""
    if block.kind == "wan":
        return [Saved("block input", n_img * block.dim, b), Saved("text states", n_txt * block.dim, b, "wan text states")]
    return [Saved("block input", (n_img + n_txt) * block.dim, b)]


def head_inventory(arch: Architecture, n_img: int, n_txt: int, r: _Rules) -> list[Saved]:
    """Outside the blocks: the embeddings of latents and text, the rotary tables and the output layers."""
    g = arch.geometry
    D, head_dim = (arch.blocks[0].dim, arch.blocks[0].inner // arch.blocks[0].heads) if arch.blocks else (0, 0)
    out: list[Saved] = []
    if g.family == "wan":
        out += r.linears("text embedder", ["condition_embedder.text_embedder.linear_1"], n_txt, g.text_width)
        if r.full:
            out += r.gelu("text embedder", n_txt, D)
            out += r.linears("text embedder", ["condition_embedder.text_embedder.linear_2"], n_txt, D)
        out += [Saved("rotary tables", 2 * n_img * head_dim, 4, "rotary")]
        out += r.norm_input("norm_out (float32)", n_img, D, 4) + r.modulated("norm_out (float32)", n_img, D, 4)
    else:
        embedder = "x_embedder" if g.family == "flux" else "pos_embed.proj"
        out += r.linears("latent embedding", [embedder], n_img, g.in_width)
        out += r.linears("text embedding", ["context_embedder"], n_txt, g.text_width)
        if g.family == "flux":
            out += [Saved("rotary tables", 2 * (n_img + n_txt) * head_dim, 4, "rotary")]
        out += r.norm_input("norm_out", n_img, D) + r.modulated("norm_out", n_img, D)
    return out + r.linears("proj_out", ["proj_out"], n_img, D)


def _total(saved: Sequence[Saved], seen: Optional[set] = None) -> int:
    seen = set() if seen is None else seen
    total = 0
    for s in saved:
        if s.shared:
            if s.shared in seen:
                continue
            seen.add(s.shared)
        total += s.bytes
    return total


def activation_inventory(arch: Architecture, model_config, full: bool, targets: Sequence[str],
                         fused_rms_norm: bool = True) -> tuple[list[Saved], list[list[Saved]]]:
    """(head, [per-block]) saved tensors of one sample's forward for the backward. ``fused_rms_norm``: whether
    ``torch.nn.RMSNorm`` runs its fused kernel (CUDA, what the plan is for) or the CPU's composite."""
    b = DTYPE_BYTES[model_config.dtype]
    rules = _Rules(b, full, model_config.lora_rank, lambda name: is_target(name, targets), fused_rms=fused_rms_norm)
    n_img, n_txt = token_counts(arch.geometry, model_config)
    first = rules if full else replace(rules, grad_in=False)  # LoRA: nothing before the first block trains
    blocks = [BLOCK_INVENTORIES[block.kind](block, n_img, n_txt, first if i == 0 else rules)
              for i, block in enumerate(arch.blocks)]
    return head_inventory(arch, n_img, n_txt, rules), blocks


def activation_bytes(arch: Architecture, model_config, full: bool, targets: Sequence[str], checkpointing: bool,
                     fused_rms_norm: bool = True) -> int:
    """Bytes autograd keeps for one sample's forward + backward of the transformer: every saved tensor, or with
    gradient checkpointing the kept block inputs and the largest recomputed block at the moment it is recomputed
    (the backward frees a block's inputs once it is done: max over k of the inputs of blocks 0..k + block k's)."""
    head, blocks = activation_inventory(arch, model_config, full, targets, fused_rms_norm)
    if not checkpointing:
        return _total(head + [s for block in blocks for s in block])
    b = DTYPE_BYTES[model_config.dtype]
    n_img, n_txt = token_counts(arch.geometry, model_config)
    seen: set = set()
    kept = _total(head, seen)
    best = 0
    for block, internals in zip(arch.blocks, blocks):
        kept += _total(block_inputs(block, n_img, n_txt, b), seen)
        best = max(best, kept + _total(internals, set(seen)))
    return max(best, kept)


def backward_transient_bytes(arch: Architecture, model_config) -> int:
    """Gradients that exist beside the saved tensors while a block runs its backward (an estimate): the gradient
    of its feed-forward hidden and of its output, for the largest block."""
    b = DTYPE_BYTES[model_config.dtype]
    n_img, n_txt = token_counts(arch.geometry, model_config)
    tokens = n_img if arch.geometry.family == "wan" else n_img + n_txt
    return max((tokens * (blk.mlp + blk.dim) * b for blk in arch.blocks), default=0)


def training_activation_bytes(arch: Architecture, model_config, full: bool, targets: Sequence[str],
                              checkpointing: bool) -> int:
    """One sample's activation memory at the peak of a training forward + backward: the saved tensors
    (:func:`activation_bytes`) and the backward's transient gradients."""
    return (activation_bytes(arch, model_config, full, targets, checkpointing)
            + backward_transient_bytes(arch, model_config))


def rollout_forward_bytes(arch: Architecture, model_config) -> int:
    """Working memory of one sample's no-grad transformer call (an estimate: the residual stream, a normalised
    copy and the feed-forward's hidden twice, as the largest block holds them at once)."""
    b = DTYPE_BYTES[model_config.dtype]
    n_img, n_txt = token_counts(arch.geometry, model_config)
    tokens = n_img if arch.geometry.family == "wan" else n_img + n_txt  # Wan's text is not in the residual stream
    width = max((3 * blk.dim + 2 * blk.mlp for blk in arch.blocks), default=0)
    return tokens * width * b


# ----------------------------------------------------------------------------- the plan


@dataclass
class MemoryPlan:
    """Every line of ``flowgrpo plan``: bytes per process (GPU) unless named otherwise."""

    model: str
    processes: int
    fsdp: bool
    finetune: str
    dtype: str
    trainable_dtype: str  # of the trainable weights, their gradients, moments and copies
    gpu_memory_gib: float
    margin: float
    params: dict[str, int]  # component -> parameters
    trainable_params: int
    experts: int  # denoising networks of the transformer's shape (Wan2.2 A14B: 2), each one call's network
    trained_experts: int  # how many of them train
    weights: int  # the transformer (and LoRA) weights held by this process, every expert
    buffers: int  # the transformer's floating-point buffers (never sharded)
    buffer_elements: int
    gradients: int
    optimizer: int
    copies: dict[str, int]  # name -> bytes
    reference: int
    reference_mode: str  # frozen_copy | adapter_disabled | none
    frozen: dict[str, int]  # text encoders and VAE -> bytes
    fsdp_buffers: int
    tokens: tuple[int, int]  # image/video tokens, text tokens of a sample
    latent_numel: int
    steps: int
    group: int
    micro_batch: int
    cfg: int  # rollout passes per sample (2 with classifier-free guidance)
    checkpointing: bool
    activations_per_sample: dict[str, int]  # "checkpointing" / "no checkpointing" -> bytes
    rollout_record: int  # latents of one group
    rollout_forward: int  # the rollout call of one group
    training_activations: int  # one micro-batch's
    max_group: int
    max_micro_batch: int
    optimizer_kind: str = "adamw"  # train.optimizer: adamw (2 moments a weight) | muon (1 float32 momentum)

    @property
    def fixed(self) -> int:
        """What stays allocated through the iteration: weights, gradients, optimizer, copies, frozen models."""
        return (self.weights + self.buffers + self.gradients + self.optimizer + sum(self.copies.values())
                + self.reference + sum(self.frozen.values()) + self.fsdp_buffers)

    @property
    def total(self) -> int:
        """The peak: fixed + the group's record + the larger of the rollout call and the training micro-batch."""
        return self.fixed + self.rollout_record + max(self.rollout_forward, self.training_activations)

    @property
    def usable(self) -> int:
        return int(self.gpu_memory_gib * GIB * (1 - self.margin))


def trainable_dtype(finetune: str, dtype: str, master_dtype: Optional[str]) -> str:
    """The dtype of the trainable weights (and of their gradients, AdamW moments and copies)."""
    return "float32" if finetune == "lora" else master_dtype or dtype


# the families whose blocks have an activation inventory here (_joint_block, _single_block, _wan_block); the others
# (Qwen-Image, FLUX.2, Z-Image) are measured on a GPU with benchmarks/bench_memory.py
PLANNED_FAMILIES = ("sd3", "flux", "wan")


def plan(arch: Architecture, model_config, processes: int = 1, fsdp: bool = False, finetune: Optional[str] = None,
         gpu_memory: float = 80.0, *, group: int = 8, micro_batch: int = 1, steps: Optional[int] = None,
         checkpointing: Optional[bool] = None, copies: Sequence[str] = DEFAULT_COPIES,
         master_dtype: Optional[str] = None, train_cfg: bool = False, margin: float = SAFETY_MARGIN,
         targets: Optional[Sequence[str]] = None, name: str = "", optimizer: str = "adamw") -> MemoryPlan:
    """The memory plan of training ``model_config`` (a ModelConfig or dict) with ``arch`` on ``processes`` GPUs.

    ``finetune``/``checkpointing``/``steps`` default to the model config's; ``copies`` names the extra copies
    of the trainable weights (each T·g bytes); ``targets`` overrides the LoRA targets (default: as the model
    resolves them); ``train_cfg``: the training forward is the CFG pair (two passes a sample); ``optimizer``:
    train.optimizer (Muon keeps one float32 momentum per weight of 2+ dimensions, nearly all of them, where AdamW
    keeps two moments in the weight's dtype)."""
    from flowgrpo.models.config import validate_model_config

    cfg = validate_model_config(model_config)
    if finetune is not None:
        cfg = replace(cfg, finetune=finetune)
    if processes < 1 or group < 1 or micro_batch < 1:
        raise ValueError("processes, group and micro_batch must be >= 1")
    full = cfg.finetune == "full"
    b = DTYPE_BYTES[cfg.dtype]
    targets = list(targets) if targets is not None else ([] if full else lora_targets(cfg))
    shard = processes if fsdp else 1
    base = arch.transformer.params
    lora = 0 if full else lora_parameters(arch.linears, targets, cfg.lora_rank)
    if not full and lora == 0:
        raise ValueError(f"no nn.Linear of {arch.transformer.class_name} matches the LoRA targets {targets}")
    # a second expert (Wan2.2 A14B's transformer_2) has the transformer's shape: held, sharded and trained like it
    experts = 1 + sum(c.name == "transformer_2" for c in arch.frozen())
    trained_n = len(cfg.trained_experts) if cfg.trained_experts else experts
    trainable = trained_n * (base if full else lora)
    trained = trainable_dtype(cfg.finetune, cfg.dtype, master_dtype)
    g = DTYPE_BYTES[trained]
    weights = (trained_n * (base * g if full else base * b + lora * 4) + (experts - trained_n) * base * b) / shard
    reference_mode = cfg.reference if cfg.reference != "auto" else ("frozen_copy" if full else "adapter_disabled")
    frozen = {c.name: c.params * (4 if c.name == "vae" else b) + c.buffers * (4 if c.name == "vae" else b)
              for c in arch.frozen() if c.name != "transformer_2"}
    fsdp_buffers = 0
    if fsdp and arch.blocks:
        largest = max(arch.blocks, key=lambda blk: blk.params)
        block_trainable = largest.params if full else lora_parameters(
            [m for m in arch.linears if m.name.startswith(largest.name + ".")], targets, cfg.lora_rank)
        fsdp_buffers = 2 * (largest.params + (0 if full else block_trainable)) * b + block_trainable * 4
    steps = steps or cfg.sample_steps
    checkpointing = cfg.gradient_checkpointing if checkpointing is None else checkpointing
    passes = 2 if train_cfg else 1
    per_sample = {label: passes * training_activation_bytes(arch, cfg, full, targets, ckpt)
                  for label, ckpt in (("checkpointing", True), ("no checkpointing", False))}
    act = per_sample["checkpointing" if checkpointing else "no checkpointing"]
    latent = latent_numel(arch.geometry, cfg)
    uses_cfg = _family_uses_cfg(cfg, arch)
    record_per_sample = (2 * steps + 2) * latent * 4
    forward_per_sample = (2 if uses_cfg else 1) * rollout_forward_bytes(arch, cfg)
    result = MemoryPlan(
        model=name or cfg.pretrained, processes=processes, fsdp=fsdp, finetune=cfg.finetune, dtype=cfg.dtype,
        trainable_dtype=trained, gpu_memory_gib=gpu_memory, margin=margin,
        params={c.name: c.params for c in arch.components}, trainable_params=trainable, experts=experts,
        trained_experts=trained_n,
        weights=math.ceil(weights), buffers=experts * arch.transformer.buffers * b,
        buffer_elements=experts * arch.transformer.buffers,
        gradients=math.ceil(trainable * g / shard), optimizer=math.ceil((4 if optimizer == "muon" else 2 * g) * trainable / shard),
        copies={c: math.ceil(trainable * g / shard) for c in copies},
        reference=math.ceil(trained_n * base * b / shard) if reference_mode == "frozen_copy" else 0,
        reference_mode=reference_mode,
        frozen=frozen, fsdp_buffers=fsdp_buffers,
        tokens=token_counts(arch.geometry, cfg), latent_numel=latent, steps=steps, group=group,
        micro_batch=micro_batch, cfg=2 if uses_cfg else 1, checkpointing=checkpointing,
        activations_per_sample=per_sample, rollout_record=group * record_per_sample,
        rollout_forward=group * forward_per_sample, training_activations=micro_batch * act,
        max_group=0, max_micro_batch=0, optimizer_kind=optimizer,
    )
    room = result.usable - result.fixed
    result.max_micro_batch = max(0, (room - result.rollout_record) // act) if act else 0
    result.max_group = max(0, min((room - micro_batch * act) // record_per_sample,
                                  room // (record_per_sample + forward_per_sample)))
    return result


def _family_uses_cfg(cfg, arch: Architecture) -> bool:
    """Whether the rollout runs the two CFG passes (the adapters' ``_uses_cfg``): guidance > 1, except for FLUX
    models that embed the guidance value (FLUX.1-dev: one pass)."""
    embedded = any(m.name.startswith("time_text_embed.guidance_embedder") for m in arch.linears)
    return cfg.guidance_scale > 1 and not (arch.geometry.family == "flux" and embedded)


# ----------------------------------------------------------------------------- the table


def gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def format_plan(p: MemoryPlan) -> str:
    """The plan as a table of GiB per process."""
    shard = f", FSDP over {p.processes}" if p.fsdp else (f", {p.processes} processes, unsharded" if p.processes > 1 else "")
    kind = f" + {p.trainable_params / 1e6:.1f} M LoRA float32" if p.finetune == "lora" else ""
    dtype = p.dtype if p.finetune == "lora" or p.trainable_dtype == p.dtype else f"{p.trainable_dtype} master weights"
    name = "transformer weights" if p.experts == 1 else f"{p.experts} experts' weights ({p.trained_experts} trained)"
    each = "" if p.experts == 1 else " each"
    rows = [(f"{name} ({p.params['transformer'] / 1e9:.3f} B params{each}, {dtype}{kind})", p.weights)]
    if p.buffers:
        rows.append((f"transformer buffers ({p.buffer_elements / 1e6:.1f} M elements, not sharded)", p.buffers))
    what = "LoRA float32" if p.finetune == "lora" else f"full, {p.trainable_dtype}"
    moments = ("Muon momentum (1 float32 per trainable weight)" if p.optimizer_kind == "muon"
               else "AdamW moments (2 per trainable weight)")
    rows += [(f"gradients ({what})", p.gradients), (moments, p.optimizer)]
    rows += [(f"copy: {name}", size) for name, size in p.copies.items()]
    reference = {"frozen_copy": "frozen copy", "adapter_disabled": "adapter disabled: none", "none": "none"}
    rows.append((f"reference policy ({reference[p.reference_mode]})", p.reference))
    if p.fsdp:
        rows.append(("FSDP all-gather / reduce buffers (largest block)", p.fsdp_buffers))
    rows += [(f"{name} ({p.params[name] / 1e9:.3f} B params, frozen, not sharded)", size)
             for name, size in p.frozen.items()]
    rows.append(("= fixed (weights, optimizer, copies, frozen models)", p.fixed))
    rows.append((f"rollout latents: group {p.group} x ({p.steps} steps x 2 + 2) x {p.latent_numel:,} float32",
                 p.rollout_record))
    rows.append((f"rollout forward (no grad, {p.group} x {p.cfg} passes, estimate)", p.rollout_forward))
    for label, value in p.activations_per_sample.items():
        rows.append((f"activations per sample, {label}", value))
    rows.append((f"training activations: micro-batch {p.micro_batch}"
                 f" ({'checkpointing' if p.checkpointing else 'no checkpointing'})", p.training_activations))
    rows.append(("= total (fixed + latents + max(rollout forward, training))", p.total))
    width = max(len(label) for label, _ in rows)
    head = (f"flowgrpo plan: {p.model}, {p.finetune}{shard}; {p.tokens[0]:,} image tokens + {p.tokens[1]} text tokens "
            f"a sample; GiB per process")
    lines = [head, "-" * (width + 10)] + [f"{label:<{width}}  {gib(value):>8}" for label, value in rows]
    usable = p.usable / GIB
    fits = "fits" if p.total <= p.usable else "does NOT fit"
    lines += ["-" * (width + 10),
              f"{fits} in {p.gpu_memory_gib:g} GiB with a {p.margin:.0%} safety margin ({usable:.2f} GiB usable); "
              f"largest group {p.max_group} (micro-batch {p.micro_batch}), largest micro-batch {p.max_micro_batch} "
              f"(group {p.group})"]
    return "\n".join(lines + [AUTOCAST_NOTE])


AUTOCAST_NOTE = ("activations: the tensors autograd keeps without autocast, flash / memory-efficient attention; under "
                 "train.mixed_precision=bf16 an H100 kept up to 1.27x that for full fine-tuning (docs/memory.md)")


def plan_for_bench(model_name: str, finetune: Optional[str] = None) -> dict:
    """The plan's line items for one process of ``configs/models/<model_name>.yaml`` (benchmarks/bench_memory.py
    prints them beside what it measures)."""
    from omegaconf import OmegaConf

    from flowgrpo.models.config import validate_model_config
    from flowgrpo.run.paths import configs_dir

    cfg = validate_model_config(OmegaConf.to_container(OmegaConf.load(configs_dir() / "models" / f"{model_name}.yaml")))
    p = plan(read_architecture(cfg, model_name), cfg, finetune=finetune, copies=(), name=model_name)
    return {"weights_bytes": p.weights + p.buffers, "grads_and_optimizer_bytes": p.gradients + p.optimizer,
            "activations": {"ckpt": p.activations_per_sample["checkpointing"],
                            "full": p.activations_per_sample["no checkpointing"]},
            "params": p.params["transformer"], "trainable": p.trainable_params}


# ----------------------------------------------------------------------------- before the first rollout
# the largest ratio of the plan to the measured peak on an H100 (docs/results/scaling.md): the plan errs on the
# safe side, so a run is refused only when even the plan divided by it does not fit
PLAN_OVER_MEASURED = 1.45


def pipeline_configs(pipeline) -> dict[str, dict]:
    """The component configurations of a loaded pipeline, as :func:`architecture_from_configs` reads them."""
    import torch

    configs = {}
    for name, module in pipeline.components.items():
        config = getattr(module, "config", None)
        if not isinstance(module, torch.nn.Module):  # schedulers, tokenizers
            continue
        if isinstance(config, dict) and "_class_name" in config:  # a diffusers model
            configs[name] = dict(config)
        elif hasattr(config, "to_dict"):  # a transformers model
            configs[name] = {**config.to_dict(), "architectures": [type(module).__name__]}
    return configs


def memory_verdict(planned: int, available: int) -> str:
    """'fits' (the plan fits), 'tight' (only the plan's measured overestimate makes it fit) or 'no'."""
    if planned <= available:
        return "fits"
    return "tight" if planned / PLAN_OVER_MEASURED <= available else "no"


def host_memory() -> tuple[int, int] | None:
    """(bytes the kernel says are available, bytes this process holds) on Linux; None elsewhere."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    available = next((int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemAvailable:")), None)
    resident = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return (available, resident) if available is not None else None


def check_before_rollout(cfg, model, processes: int, sharded: bool, group: int, steps: int, warn) -> str | None:
    """Compare the iteration's planned memory per device with what the device has (free, plus what this process
    holds already: the loaded model), before the first rollout: a GPU's memory, or on the CPU the host's (Linux).
    A run that cannot fit is refused (a UserError with the numbers and the keys to change); one that fits only by
    the plan's overestimate is a warning. Families without an activation inventory (PLANNED_FAMILIES) are not
    checked. Returns the verdict (None: unchecked)."""
    import torch

    device = torch.device(model.device)
    if device.type not in ("cuda", "cpu") or cfg.model.family not in PLANNED_FAMILIES or \
            getattr(model, "pipeline", None) is None:
        return None
    from flowgrpo.run.errors import UserError

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        available = free + torch.cuda.memory_allocated(device)
    else:
        host = host_memory()
        if host is None:
            return None
        available = host[0] + host[1]
    arch = architecture_from_configs(cfg.model.family, pipeline_configs(model.pipeline), "the loaded pipeline")
    result = plan(arch, cfg.model, processes, sharded, gpu_memory=available / GIB, group=group,
                  micro_batch=cfg.train.micro_batch, steps=steps, margin=0.0,
                  train_cfg=getattr(cfg.learner, "train_guidance", "conditional") != "conditional",
                  optimizer=cfg.train.optimizer)
    verdict = memory_verdict(result.total, available)
    where = "GPU" if device.type == "cuda" else "process"
    numbers = (f"the memory plan puts this iteration at {gib(result.total)} GiB per {where} (weights and optimizer "
               f"{gib(result.fixed)} GiB, the group's rollout {gib(result.rollout_record + result.rollout_forward)} GiB, a "
               f"training micro-batch {gib(result.training_activations)} GiB) and "
               f"{'this GPU has' if device.type == 'cuda' else 'the host has'} {gib(available)} GiB")
    fix = (f"lower sampling.plan.group_size (at most {result.max_group} fits) or train.micro_batch (at most "
           f"{result.max_micro_batch}), enable model.gradient_checkpointing, or shard over more GPUs (docs/memory.md)"
           + ("; or train a LoRA instead of every weight (model.finetune=lora model.reference=auto "
              "train.learning_rate=3e-4)" if cfg.model.finetune == "full" else ""))
    if verdict == "no":
        raise UserError(f"this run cannot fit: {numbers}, less than the plan's {gib(result.total / PLAN_OVER_MEASURED)} GiB "
                        f"lower bound; {fix}")
    if verdict == "tight":
        warn(f"memory is tight: {numbers}; it fits only if the plan overestimates (it has by up to "
             f"{PLAN_OVER_MEASURED}x); if it runs out of memory, {fix}")
    return verdict
