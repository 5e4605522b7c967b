"""The tensors autograd saves, counted: the real transformer class at real width on the meta device.

The hand inventory (inventory.py) reads the saved tensors off the architecture for the blocks it was written for.
This module asks autograd instead. It builds the transformer from its configuration on the ``meta`` device (shapes,
no memory, no weights), keeps one block of each kind of every block list (the first block, and the first of each
distinct block after it: two for most models, four for SD3.5-Medium), sets up what trains as flowgrpo does (full
fine-tuning: every weight; LoRA: peft adapters on the targeted Linears, cast to float32) and runs one sample's
forward with meta inputs of the real token counts under ``torch.autograd.graph.saved_tensors_hooks``. Every tensor
the hooks see is counted once per storage (a tensor saved twice, or views of one storage, count once; weights and
buffers are not counted), with its dtype's bytes, and attributed to the block that saved it ("head": outside the
blocks). A block stands for every block of its list with the same signature (class, parameter shapes, which of its
Linears train); the tensors it saves are its own unless another block, the head or the blocks' shared inputs saw the
same storage (rotary tables, the time embedding, Wan's text states: counted once). The inputs each block is called
with are what gradient checkpointing keeps of it (``torch.utils.checkpoint`` saves its tensor arguments).

Two kernels save different tensors on the meta device (and the CPU) than on a GPU, and the count models the GPU's:

  attention   the meta device runs the math path of ``scaled_dot_product_attention``, which keeps the tokens x tokens
              probabilities. flowgrpo trains with flash / memory-efficient SDPA, which keeps q, k, v, its output (laid
              out like q) and a float32 log-sum-exp of heads x tokens (plus the mask, when there is one): what the
              count's FlashAttention function saves while it runs.
  RMSNorm     ``torch.nn.RMSNorm`` (F.rms_norm) runs a composite that keeps float32 copies; CUDA runs a fused kernel
              that keeps its input and the float32 per-token reciprocal RMS: the count's FusedRMSNorm function.

Both are real autograd functions (their backward recomputes with PyTorch's own kernels), swapped in for
``torch.nn.functional.scaled_dot_product_attention`` and ``torch.nn.functional.rms_norm`` only while a count runs
(:func:`gpu_kernels`). Everything else (LayerNorm, Linear, GELU, peft's float32 casts, diffusers' own RMSNorm, the
rotary embeddings) saves the same tensors on every device.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from typing import Optional

from flowgrpo.memory.inventory import ActivationCount, Saved

HEAD = "head"


class CountError(RuntimeError):
    """The transformer did not run on the meta inputs (a size it cannot take: a position table too small, ...)."""


# ----------------------------------------------------------------------------- the GPU's kernels


def _attention_lse(q, k, attn_mask, is_causal: bool, scale: Optional[float], enable_gqa: bool):
    """log Σ_k exp(q·k·scale + mask) in float32, heads x tokens: what flash / memory-efficient SDPA keeps."""
    import torch

    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
    if is_causal:
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = (scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                  else scores + attn_mask.float())
    return torch.logsumexp(scores, dim=-1)


@functools.lru_cache(maxsize=None)
def _flash_attention_function():
    import torch

    class FlashAttention(torch.autograd.Function):
        """SDPA saving what CUDA's flash / memory-efficient kernels save: q, k, v, the output (allocated like q, as
        those kernels allocate it: a view of it reads back without a copy exactly when it would on the GPU), the
        float32 log-sum-exp and the mask."""

        @staticmethod
        def forward(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
            with torch.no_grad():
                result = _ORIGINAL["sdpa"](q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                           scale=scale, enable_gqa=enable_gqa)
                out = torch.empty_like(q) if result.shape == q.shape else result.new_empty(result.shape)
                out.copy_(result)
                lse = _attention_lse(q, k, attn_mask, is_causal, scale, enable_gqa)
            ctx.options = (dropout_p, is_causal, scale, enable_gqa, attn_mask is not None)
            ctx.save_for_backward(q, k, v, out, lse, *([attn_mask] if attn_mask is not None else []))
            return out

        @staticmethod
        def backward(ctx, grad_out):
            dropout_p, is_causal, scale, enable_gqa, masked = ctx.options
            q, k, v, _, _, *mask = ctx.saved_tensors
            with torch.enable_grad():
                inputs = [t.detach().requires_grad_(True) for t in (q, k, v)]
                out = _ORIGINAL["sdpa"](*inputs, attn_mask=mask[0] if masked else None, dropout_p=dropout_p,
                                        is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
                grads = torch.autograd.grad(out, inputs, grad_out)
            return (*grads, None, None, None, None, None)

    return FlashAttention


@functools.lru_cache(maxsize=None)
def _fused_rms_norm_function():
    import torch

    class FusedRMSNorm(torch.autograd.Function):
        """F.rms_norm saving what CUDA's fused kernel saves: its input and the float32 reciprocal RMS per token
        (and the weight, a parameter)."""

        @staticmethod
        def forward(ctx, x, normalized_shape, weight, eps):
            dims = tuple(range(-len(normalized_shape), 0))
            with torch.no_grad():
                out = _ORIGINAL["rms_norm"](x, normalized_shape, weight, eps)
                epsilon = eps if eps is not None else torch.finfo(x.dtype).eps
                rstd = torch.rsqrt(x.float().pow(2).mean(dim=dims, keepdim=True) + epsilon)
            ctx.options = (tuple(normalized_shape), eps, weight is not None)
            ctx.save_for_backward(x, rstd, *([weight] if weight is not None else []))
            return out

        @staticmethod
        def backward(ctx, grad_out):
            normalized_shape, eps, weighted = ctx.options
            x, _, *weight = ctx.saved_tensors
            with torch.enable_grad():
                inputs = [x.detach().requires_grad_(True)]
                inputs += [weight[0].detach().requires_grad_(True)] if weighted else []
                out = _ORIGINAL["rms_norm"](inputs[0], normalized_shape, inputs[1] if weighted else None, eps)
                grads = torch.autograd.grad(out, inputs, grad_out, allow_unused=True)
            return grads[0], None, (grads[1] if weighted else None), None

    return FusedRMSNorm


_ORIGINAL: dict = {}  # PyTorch's own functions, captured the first time the count's kernels are swapped in


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return _flash_attention_function().apply(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _rms_norm(input, normalized_shape, weight=None, eps=None):  # noqa: A002 (torch's argument names)
    return _fused_rms_norm_function().apply(input, list(normalized_shape), weight, eps)


@contextlib.contextmanager
def gpu_kernels():
    """While it is open, ``F.scaled_dot_product_attention`` and ``F.rms_norm`` save what CUDA's flash attention and
    fused RMSNorm save (the module docstring); their backward (run whenever) is PyTorch's own."""
    import torch.nn.functional as F

    if F.scaled_dot_product_attention is _sdpa:  # already open (nested): nothing more to swap
        yield
        return
    if not _ORIGINAL:
        _ORIGINAL.update(sdpa=F.scaled_dot_product_attention, rms_norm=F.rms_norm)
    F.scaled_dot_product_attention, F.rms_norm = _sdpa, _rms_norm
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.rms_norm = _ORIGINAL["sdpa"], _ORIGINAL["rms_norm"]


# ----------------------------------------------------------------------------- one sample's inputs, on meta


def _meta_inputs(model, grid: tuple[int, int, int], n_txt: int, dtype) -> dict:
    """The keyword arguments of one sample's transformer call as flowgrpo's adapters make it, on the meta device:
    ``grid`` the latent (frames, rows, columns) as the transformer reads it, ``n_txt`` text tokens."""
    import torch

    c = model.config
    frames, h, w = grid

    def meta(*shape, dt=dtype):
        return torch.empty(*shape, device="meta", dtype=dt)

    name = type(model).__name__
    if name == "SD3Transformer2DModel":
        return dict(hidden_states=meta(1, c.in_channels, h, w),
                    encoder_hidden_states=meta(1, n_txt, c.joint_attention_dim),
                    pooled_projections=meta(1, c.pooled_projection_dim), timestep=meta(1, dt=torch.float32))
    if name == "FluxTransformer2DModel":  # latents packed 2x2 by the adapter: grid is already the token grid (frames:
        n = frames * h * w  # the latent's, then an editing call's references, flux_kontext)
        return dict(hidden_states=meta(1, n, c.in_channels),
                    encoder_hidden_states=meta(1, n_txt, c.joint_attention_dim),
                    pooled_projections=meta(1, c.pooled_projection_dim), timestep=meta(1), img_ids=meta(n, 3),
                    txt_ids=meta(n_txt, 3), guidance=meta(1, dt=torch.float32) if c.guidance_embeds else None)
    if name == "WanTransformer3DModel":
        return dict(hidden_states=meta(1, c.in_channels, frames, h, w), timestep=meta(1, dt=torch.float32),
                    encoder_hidden_states=meta(1, n_txt, c.text_dim))
    if name == "QwenImageTransformer2DModel":  # packed 2x2 by the adapter; img_shapes in tokens (frames: the latent's,
        # then an editing call's references, each one more image of the same size)
        return dict(hidden_states=meta(1, frames * h * w, c.in_channels), timestep=meta(1), guidance=None,
                    encoder_hidden_states=meta(1, n_txt, c.joint_attention_dim), encoder_hidden_states_mask=None,
                    img_shapes=[[(1, h, w)] * frames])
    if name == "Flux2Transformer2DModel":  # patchified by the adapter: h x w tokens (x frames: its references)
        n = frames * h * w
        return dict(hidden_states=meta(1, n, c.in_channels),
                    encoder_hidden_states=meta(1, n_txt, c.joint_attention_dim), timestep=meta(1),
                    guidance=meta(1, dt=torch.float32) if c.guidance_embeds else None,
                    txt_ids=meta(1, n_txt, 4), img_ids=meta(1, n, 4))
    if name == "ZImageTransformer2DModel":  # a list of [C, 1, h, w] latents and of [tokens, width] captions
        return dict(x=[meta(c.in_channels, frames, h, w)], t=meta(1, dt=torch.float32),
                    cap_feats=[meta(n_txt, c.cap_feat_dim)], patch_size=2, f_patch_size=1)
    raise NotImplementedError(f"no meta inputs for {name}: the saved-tensor count knows the transformers of SD3, "
                              f"FLUX.1, FLUX.2, Qwen-Image, Z-Image and Wan")


COUNTED_CLASSES = ("SD3Transformer2DModel", "FluxTransformer2DModel", "WanTransformer3DModel",
                   "QwenImageTransformer2DModel", "Flux2Transformer2DModel", "ZImageTransformer2DModel")


# ----------------------------------------------------------------------------- the count


def _block_lists(model) -> list[str]:
    """The transformer's block lists: its direct ``nn.ModuleList`` children whose elements hold parameters."""
    import torch

    return [name for name, child in model.named_children()
            if isinstance(child, torch.nn.ModuleList) and len(child) and any(True for _ in child[0].parameters())]


def _signature(block, prefix: str, targets) -> tuple:
    import torch

    from flowgrpo.memory.architecture import is_target

    params = tuple((n, tuple(p.shape)) for n, p in block.named_parameters())
    trained = tuple(n for n, m in block.named_modules()
                    if isinstance(m, torch.nn.Linear) and targets is not None and is_target(f"{prefix}.{n}", targets))
    return type(block).__name__, params, trained


def _keep_float32(model, dtype) -> None:
    """The modules a diffusers class keeps in float32 when loaded in a lower precision (``_keep_in_fp32_modules``),
    as ``from_pretrained(torch_dtype=...)`` keeps them."""
    import torch

    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    if dtype == torch.float32 or not keep:
        return
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if any(k in name.split(".") for k in keep) and tensor.is_floating_point():
            tensor.data = tensor.data.float()


def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def count_saved(transformer_config: str, grid: tuple[int, int, int], n_txt: int, dtype: str, full: bool,
                targets: tuple[str, ...], rank: int, alpha: Optional[float] = None,
                every_block: bool = False) -> ActivationCount:
    """The tensors autograd saves in one sample's training forward of the transformer ``transformer_config`` (its
    JSON), at latent ``grid`` (frames, rows, columns, as the transformer call reads them: FLUX's and Qwen-Image's
    2x2-packed token grid, FLUX.2's patchified one) and ``n_txt`` text tokens, in ``dtype``; ``full``: every weight
    trains, else a rank-``rank`` LoRA (alpha ``alpha``) on the Linears ``targets`` names (peft's rule).
    ``every_block``: run every block instead of one of each kind (slower; the check that one of each kind counts the
    same). Cached: the same arguments count once per process."""
    return _count(transformer_config, tuple(grid), int(n_txt), dtype, bool(full), tuple(targets), int(rank),
                  float(alpha if alpha is not None else rank), bool(every_block))


@functools.lru_cache(maxsize=64)
def _count(transformer_config: str, grid, n_txt, dtype_name, full, targets, rank, alpha,
           every_block) -> ActivationCount:
    import torch

    from flowgrpo.memory.architecture import build_on_meta, is_target

    dtype = getattr(torch, dtype_name)
    model = build_on_meta(json.loads(transformer_config))
    torch.nn.Module.to(model, dtype)  # (ModelMixin.to warns of _keep_in_fp32_modules: they are kept just below)
    _keep_float32(model, dtype)
    names: dict = {}  # representative block module -> its (list, index in the truncated list)
    plan: list[tuple[str, list[int], list[int]]] = []  # (list, original index -> representative's position, reps)
    adapted: list[str] = []
    for list_name in _block_lists(model):
        blocks = getattr(model, list_name)
        firsts: dict = {}
        kept: list[int] = []
        stand_in: list[int] = []
        for i, block in enumerate(blocks):
            sig = _signature(block, f"{list_name}.{i}", None if full else targets)
            key = ("first",) if i == 0 else (i,) if every_block else sig
            if key not in firsts:
                firsts[key] = len(kept)
                kept.append(i)
            stand_in.append(firsts[key])
        plan.append((list_name, stand_in, kept))
        setattr(model, list_name, torch.nn.ModuleList([blocks[i] for i in kept]))
        for position, i in enumerate(kept):
            names[getattr(model, list_name)[position]] = (list_name, position)
            if not full:
                adapted += [f"{list_name}.{position}.{n}" for n, m in blocks[i].named_modules()
                            if isinstance(m, torch.nn.Linear) and is_target(f"{list_name}.{i}.{n}", targets)]
    if not full:
        listed = set(n for n, _, _ in plan)
        adapted += [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                    and n.split(".")[0] not in listed and is_target(n, targets)]
        if not adapted:
            raise ValueError(f"no nn.Linear of {type(model).__name__} matches the LoRA targets {list(targets)}")
        from peft import LoraConfig

        model.requires_grad_(False)
        model.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, init_lora_weights="gaussian", target_modules=adapted))
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.float()  # flowgrpo's cast_training_params: LoRA trains in float32
    else:
        model.requires_grad_(True)
    model.train()

    weights = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}
    keep_alive: list = []  # every saved tensor and input, so no storage is freed and its identity reused
    stack = [HEAD]
    saved: dict[str, dict[int, tuple[str, int, int]]] = {}  # who -> storage -> (dtype, elements, bytes per)
    inputs: dict[str, dict[int, tuple[str, int, int]]] = {}
    order: list[str] = []

    def record(where: dict, t) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in weights:
            return
        keep_alive.append(t)
        size = t.element_size()
        where.setdefault(key, (str(t.dtype).replace("torch.", ""), storage.nbytes() // size, size))

    def pre(module, args, kwargs):
        label = "{}.{}".format(*names[module])
        stack.append(label)
        order.append(label)
        mine = inputs.setdefault(label, {})
        for t in _tensors(args) + _tensors(kwargs):
            record(mine, t)

    def post(module, args, kwargs, output):
        stack.pop()

    def pack(t):
        record(saved.setdefault(stack[-1], {}), t)
        return t.detach()

    hooks = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in names]
    hooks += [m.register_forward_hook(post, with_kwargs=True) for m in names]
    inputs_of_call = _meta_inputs(model, grid, n_txt, dtype)
    try:
        with gpu_kernels(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            output = model(**inputs_of_call, return_dict=False)
    except Exception as exc:  # the model's own refusal of this size, said as such
        raise CountError(f"{type(model).__name__} does not run on a latent of {grid} (frames, rows, columns) and "
                         f"{n_txt} text tokens: {exc}") from exc
    finally:
        for hook in hooks:
            hook.remove()
    keep_alive.append(output)

    # a storage is one per block unless the head saved it, or more than one block saw it (saved or as an input)
    seen_by: dict[int, set] = {}
    for label in order:
        for key in {*saved.get(label, {}), *inputs.get(label, {})}:
            seen_by.setdefault(key, set()).add(label)
    head_keys = set(saved.get(HEAD, {}))
    shared = {key for key, labels in seen_by.items() if len(labels) > 1 or key in head_keys}

    def entries(table: dict, block: str) -> tuple[Saved, ...]:
        return tuple(Saved(f"{dt} storage", n, size, f"s{key}" if key in shared else f"{block}:{key}")
                     for key, (dt, n, size) in table.items())

    head = tuple(Saved(f"{dt} storage", n, size, f"s{key}") for key, (dt, n, size) in saved.get(HEAD, {}).items())
    lists_in_order = sorted(plan, key=lambda p: order.index(f"{p[0]}.0"))
    blocks_out, inputs_out, block_names = [], [], []
    for list_name, stand_in, kept in lists_in_order:
        for i, position in enumerate(stand_in):
            label = f"{list_name}.{position}"
            name = f"{list_name}.{i}"
            blocks_out.append(entries(saved.get(label, {}), name))
            inputs_out.append(entries(inputs.get(label, {}), name))
            block_names.append(name)
    ran = tuple(f"{list_name}.{i}" for list_name, _, kept in lists_in_order for i in kept)
    return ActivationCount(head, tuple(blocks_out), tuple(inputs_out), (0, 0), "autograd", tuple(block_names), ran)


__all__ = ["COUNTED_CLASSES", "CountError", "count_saved", "gpu_kernels"]
