"""The activation inventory: what autograd keeps of one sample's forward for the backward, block by block.

The plan counts these tensors with autograd itself where it can (saved.py: the real transformer class at real width
on the meta device, every family); this hand inventory of SD3's, FLUX.1's and Wan's blocks stands in where that
cannot run (an architecture without its transformer's configuration, a size the class refuses), and it agrees with
autograd's count within 0.6 % (tests/models/test_memory_saved.py, docs/memory.md). :class:`ActivationCount` holds
either count; gradient checkpointing's peak and the estimates beside the saved tensors (the backward's transient
gradients, the rollout's no-grad working memory, the context-parallel buffers) are here.

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
Per-token statistics (norm means, RMS factors, the attention's log-sum-exp) are left out: ~2 % of a block at the
tiny tests' widths, under 0.6 % at real width. With gradient checkpointing the block inputs are kept and each block's
tensors exist only while it is recomputed (a first norm that reads the kept input itself, SD3's and FLUX's streams,
Wan's in float32, saves that same storage: counted once); the backward frees a block's inputs once it is done, so the
peak is max over k of (inputs of blocks 0..k + block k's tensors). A adds the backward's transient gradients: the MLP hidden's and the
block output's, n·(M + D)·b.

Checked: tests/models/test_memory.py measures what autograd saves in tiny models of the same classes on the
CPU; benchmarks/check_plan_activations.py does it for the real-size transformers on a GPU (docs/memory.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Optional

from flowgrpo.memory.architecture import Architecture, Block, is_target, token_counts

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


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

    def norm_input(self, what, n, width, nbytes=None, shared="") -> list[Saved]:
        return [Saved(f"{what} input", n * width, nbytes or self.b, shared)]

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
        # the stream's first norm reads the block's input itself: the tensor gradient checkpointing keeps (one storage)
        kept = f"{block.name} {stream} input"
        out += (r.norm_input(f"{stream} {norm1}", n, D, shared=kept) if r.grad_in else [])
        out += r.modulated(f"{stream} {norm1}", n, D)
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
    # norm1 reads hidden_states.float(): in a float32 model the block's input itself (what checkpointing keeps)
    kept = f"{block.name} input" if r.b == 4 else ""
    out = (r.norm_input("norm1 (float32)", n, D, 4, shared=kept) if r.grad_in else [])
    out += r.modulated("norm1 (float32)", n, D, 4)
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
        return [Saved("block input", n_img * block.dim, b, f"{block.name} input"),
                Saved("text states", n_txt * block.dim, b, "wan text states")]
    if block.kind == "joint":  # two streams, each read by its first norm (the same storage: counted once)
        return [Saved("block image input", n_img * block.dim, b, f"{block.name} image input"),
                Saved("block text input", n_txt * block.dim, b, f"{block.name} text input")]
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


@dataclass(frozen=True)
class ActivationCount:
    """One sample's saved tensors, however they were counted: the hand inventory below, or autograd's own
    (saved.py, ``source="autograd"``). A :class:`Saved` with a ``shared`` key is one storage wherever it appears."""

    head: tuple[Saved, ...]  # outside the blocks: embeddings, rotary tables, output layers
    blocks: tuple[tuple[Saved, ...], ...]  # each block's tensors, in the order the blocks run
    inputs: tuple[tuple[Saved, ...], ...]  # each block's inputs: what gradient checkpointing keeps of it
    tokens: tuple[int, int] = (0, 0)  # (image or video tokens, text tokens) the count was made at
    source: str = "inventory"  # "inventory" (read off the architecture) | "autograd" (saved_tensors_hooks on meta)
    names: tuple[str, ...] = ()  # the blocks, in the order they run (autograd's count)
    ran: tuple[str, ...] = ()  # the blocks autograd's count ran; each other block is counted as the one it stands for
    note: str = ""  # why autograd's count did not run, where this is the hand inventory standing in

    def total(self, checkpointing: bool) -> int:
        """Bytes kept for one forward + backward: every saved tensor, or with gradient checkpointing the kept block
        inputs and the largest recomputed block at the moment it is recomputed (the backward frees a block's inputs
        once it is done: max over k of the inputs of blocks 0..k + block k's tensors)."""
        if not checkpointing:
            return _total(list(self.head) + [s for block in self.blocks for s in block])
        seen: set = set()
        kept = _total(self.head, seen)
        best = 0
        for inputs, internals in zip(self.inputs, self.blocks):
            kept += _total(inputs, seen)
            best = max(best, kept + _total(internals, set(seen)))
        return max(best, kept)

    def largest_block(self) -> int:
        """The largest block's own saved tensors: what one block's forward keeps (the working set of a forward
        whose saved tensors go to host memory, brought back block by block in the backward)."""
        return max((_total(block) for block in self.blocks), default=0)

    def by_dtype(self) -> dict[str, int]:
        """Bytes of the distinct saved tensors by dtype (checkpointing aside)."""
        names = {4: "float32", 2: "bfloat16", 1: "8-bit", 8: "complex64"}
        seen: set = set()
        out: dict[str, int] = {}
        for s in [*self.head, *(x for block in self.blocks for x in block)]:
            if s.shared:
                if s.shared in seen:
                    continue
                seen.add(s.shared)
            first = s.what.split(" ")[0]
            dtype = first if self.source == "autograd" else names.get(s.bytes_per, f"{s.bytes_per}-byte")
            out[dtype] = out.get(dtype, 0) + s.bytes
        return out


def activation_inventory(arch: Architecture, model_config, full: bool, targets: Sequence[str],
                         fused_rms_norm: bool = True, tokens: Optional[tuple[int, int]] = None
                         ) -> tuple[list[Saved], list[list[Saved]]]:
    """(head, [per-block]) saved tensors of one sample's forward for the backward. ``fused_rms_norm``: whether
    ``torch.nn.RMSNorm`` runs its fused kernel (CUDA, what the plan is for) or the CPU's composite; ``tokens``:
    (image, text) tokens instead of the model config's (a context-parallel rank's share)."""
    b = DTYPE_BYTES[model_config.dtype]
    rules = _Rules(b, full, model_config.lora_rank, lambda name: is_target(name, targets), fused_rms=fused_rms_norm)
    n_img, n_txt = tokens or token_counts(arch.geometry, model_config)
    first = rules if full else replace(rules, grad_in=False)  # LoRA: nothing before the first block trains
    blocks = [BLOCK_INVENTORIES[block.kind](block, n_img, n_txt, first if i == 0 else rules)
              for i, block in enumerate(arch.blocks)]
    return head_inventory(arch, n_img, n_txt, rules), blocks


def inventory_count(arch: Architecture, model_config, full: bool, targets: Sequence[str], fused_rms_norm: bool = True,
                    tokens: Optional[tuple[int, int]] = None) -> ActivationCount:
    """The hand inventory as an :class:`ActivationCount` (the blocks' inputs: :func:`block_inputs`)."""
    head, blocks = activation_inventory(arch, model_config, full, targets, fused_rms_norm, tokens)
    b = DTYPE_BYTES[model_config.dtype]
    n_img, n_txt = tokens or token_counts(arch.geometry, model_config)
    inputs = tuple(tuple(block_inputs(block, n_img, n_txt, b)) for block in arch.blocks)
    return ActivationCount(tuple(head), tuple(tuple(x) for x in blocks), inputs, (n_img, n_txt), "inventory")


def has_inventory(arch: Architecture) -> bool:
    """Whether the hand inventory knows every block of ``arch`` (SD3's, FLUX.1's and Wan's blocks)."""
    return bool(arch.blocks) and all(block.kind in BLOCK_INVENTORIES for block in arch.blocks) and \
        arch.geometry.family in ("sd3", "flux", "wan")


def activation_bytes(arch: Architecture, model_config, full: bool, targets: Sequence[str], checkpointing: bool,
                     fused_rms_norm: bool = True, tokens: Optional[tuple[int, int]] = None) -> int:
    """Bytes autograd keeps for one sample's forward + backward of the transformer, by the hand inventory: every
    saved tensor, or with gradient checkpointing the kept block inputs and the largest recomputed block at the moment
    it is recomputed (:meth:`ActivationCount.total`)."""
    return inventory_count(arch, model_config, full, targets, fused_rms_norm, tokens).total(checkpointing)


def _tokens_in_blocks(arch: Architecture, tokens: tuple[int, int]) -> int:
    """Tokens of a block's residual stream: Wan's text is not in it (cross-attention); the others' is."""
    n_img, n_txt = tokens
    return n_img if arch.geometry.family == "wan" else n_img + n_txt


def backward_transient_bytes(arch: Architecture, model_config, tokens: Optional[tuple[int, int]] = None) -> int:
    """Gradients that exist beside the saved tensors while a block runs its backward (an estimate): the gradient
    of its feed-forward hidden and of its output, for the largest block."""
    b = DTYPE_BYTES[model_config.dtype]
    n = _tokens_in_blocks(arch, tokens or token_counts(arch.geometry, model_config))
    return max((n * (blk.mlp + blk.dim) * b for blk in arch.blocks), default=0)


def training_activation_bytes(arch: Architecture, model_config, full: bool, targets: Sequence[str],
                              checkpointing: bool) -> int:
    """One sample's activation memory at the peak of a training forward + backward by the hand inventory: the saved
    tensors (:func:`activation_bytes`) and the backward's transient gradients."""
    return (activation_bytes(arch, model_config, full, targets, checkpointing)
            + backward_transient_bytes(arch, model_config))


def rollout_forward_bytes(arch: Architecture, model_config, tokens: Optional[tuple[int, int]] = None) -> int:
    """Working memory of one sample's no-grad transformer call (an estimate: the residual stream, a normalised
    copy and the feed-forward's hidden twice, as the largest block holds them at once)."""
    b = DTYPE_BYTES[model_config.dtype]
    n = _tokens_in_blocks(arch, tokens or token_counts(arch.geometry, model_config))
    width = max((3 * blk.dim + 2 * blk.mlp for blk in arch.blocks), default=0)
    return n * width * b


def attention_bytes(arch: Architecture, model_config, tokens: Optional[tuple[int, int]] = None) -> int:
    """One block's attention tensors, q, k, v and output over its self-attention's tokens (the largest block): what
    Ulysses context parallelism's all-to-alls hold in flight beside a block."""
    b = DTYPE_BYTES[model_config.dtype]
    n = _tokens_in_blocks(arch, tokens or token_counts(arch.geometry, model_config))
    return max((4 * n * blk.inner * b for blk in arch.blocks), default=0)
