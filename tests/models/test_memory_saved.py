"""The memory plan's activations counted by autograd (flowgrpo/memory/saved.py): the real transformer classes at real
width on the meta device under saved_tensors_hooks. The count against the hand inventory (SD3, FLUX.1, Wan) and
against an H100's measurements, one block of each kind against every block, the GPU kernels it models, the families
without a hand inventory, and the options that make a video fit: context parallelism, the rollout's chunk, where the
latents live, the text encoders' and the activations' offloading."""

import pytest
import torch

from flowgrpo.memory import (GIB, call_grid, chunk_that_fits, count_saved, format_plan, gpu_kernels, lora_targets, plan,
                             planned_families, rank_tokens, read_architecture, sample_activations)
from flowgrpo.models.config import validate_model_config
from flowgrpo.models.families import FAMILIES

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(name: str, **changes):
    from omegaconf import OmegaConf

    from flowgrpo.run.paths import configs_dir

    return validate_model_config({**OmegaConf.to_container(OmegaConf.load(configs_dir() / "models" / f"{name}.yaml")),
                                  **changes})


_ARCH: dict = {}


def _arch(name: str, cfg):
    if name not in _ARCH:
        _ARCH[name] = read_architecture(cfg, name)
    return _ARCH[name]


def _counts(name: str, finetune: str, **changes):
    """(autograd's count, the hand inventory's) of one sample of the model config ``name``."""
    cfg = _config(name, **changes)
    arch = _arch(name, cfg)
    full = finetune == "full"
    targets = [] if full else lora_targets(cfg, arch)
    return (sample_activations(arch, cfg, full, targets, source="autograd"),
            sample_activations(arch, cfg, full, targets, source="inventory"))


# ----------------------------------------------------------------------------- the count against the inventory


AGREEMENT = 0.02  # autograd's count and the hand inventory agree within 2 % (measured: 0.1 to 0.6 %; checkpointed 1.9 %)


@pytest.mark.parametrize("finetune", ["lora", "full"])
@pytest.mark.parametrize("model", ["sd3_5_medium", "flux_dev", "wan2_1_t2v_14b"])
def test_the_autograd_count_agrees_with_the_hand_inventory(model, finetune):
    """At each model config's own size (SD3.5-Medium and FLUX.1 at 512 px, Wan2.1-14B at 720p x 81 frames: 75,600
    video tokens), every saved tensor and the checkpointed peak, counted by autograd and by the hand inventory."""
    autograd, inventory = _counts(model, finetune)
    assert autograd.source == "autograd" and inventory.source == "inventory" and autograd.tokens == inventory.tokens
    for checkpointing in (False, True):
        ratio = autograd.total(checkpointing) / inventory.total(checkpointing)
        assert abs(ratio - 1) < AGREEMENT, (model, finetune, checkpointing, ratio)


# the saved tensors an NVIDIA H100 measured (benchmarks/check_plan_activations.py; docs/memory.md), GiB: one sample,
# no checkpointing, bf16 without autocast, at these sizes (Wan2.1-1.3B: 480p, 21 frames)
H100 = {("sd3_5_medium", "full"): 3.249, ("sd3_5_medium", "lora"): 2.609, ("flux_dev", "full"): 10.073,
        ("flux_dev", "lora"): 9.081, ("wan2_1_t2v_1_3b", "full"): 29.778, ("wan2_1_t2v_1_3b", "lora"): 26.935}


@pytest.mark.parametrize("model, finetune", list(H100))
def test_the_autograd_count_is_what_an_h100_saved(model, finetune):
    """The meta count models CUDA's flash attention and fused RMSNorm; against what the GPU really kept it is within
    0.1 % (the hand inventory, without the per-token statistics, was 0.1 to 0.5 % under)."""
    size = dict(resolution=480, width=832, num_frames=21) if model.startswith("wan") else {}
    autograd, _ = _counts(model, finetune, **size)
    measured = H100[model, finetune] * GIB
    assert abs(autograd.total(False) / measured - 1) < 0.001, autograd.total(False) / GIB


@pytest.mark.parametrize("model, finetune", [("sd3_5_medium", "lora"), ("z_image", "full")])
def test_one_block_of_each_kind_counts_what_every_block_saves(model, finetune):
    """SD3.5-Medium's blocks are of four kinds for LoRA (the first, with its untrained inputs; those with the second,
    image-only attention; those without; the last, whose text stream stops); Z-Image has three block lists. Running one
    block of each kind gives every block's count, byte for byte, with and without checkpointing."""
    cfg = _config(model)
    arch = _arch(model, cfg)
    full = finetune == "full"
    targets = () if full else tuple(lora_targets(cfg, arch))
    grid = call_grid(arch.geometry, cfg)
    n_txt = rank_tokens(arch.geometry, cfg)[1]
    args = (arch.transformer_config, grid, n_txt, cfg.dtype, full, targets, cfg.lora_rank, cfg.lora_alpha)
    kinds, every = count_saved(*args), count_saved(*args, every_block=True)
    assert len(kinds.ran) < len(every.ran) == len(every.names) == len(kinds.names)
    assert kinds.names == every.names
    for checkpointing in (False, True):
        assert kinds.total(checkpointing) == every.total(checkpointing)
    assert kinds.by_dtype() == every.by_dtype()


# ----------------------------------------------------------------------------- the GPU's kernels


def _saved_during(fn):
    saved = []

    def pack(t):
        saved.append(t.detach())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


def test_attention_saves_what_flash_attention_saves_and_computes_sdpa():
    """Under gpu_kernels, SDPA keeps q, k, v, its output laid out like q (tokens-first: it reads back as a view) and the
    float32 log-sum-exp, and no tokens x tokens matrix; its output and gradients are PyTorch's own."""
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(1, 7, 2, 4, generator=g, requires_grad=True) for _ in range(3)]  # tokens-first, as diffusers
    q, k, v = (t.transpose(1, 2) for t in x)  # heads-first views
    mask = torch.rand(1, 1, 7, 7, generator=g) > 0.3
    mask[..., 0] = True
    with gpu_kernels():
        out, saved = _saved_during(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(out, reference, atol=1e-6)
    assert [tuple(t.shape) for t in saved] == [(1, 2, 7, 4)] * 4 + [(1, 2, 7), (1, 1, 7, 7)]
    assert saved[4].dtype == torch.float32 and out.transpose(1, 2).is_contiguous()
    scores = (q @ k.transpose(-2, -1) / 2).masked_fill(~mask, float("-inf"))  # scale 1/sqrt(4)
    assert torch.allclose(saved[4], torch.logsumexp(scores, dim=-1), atol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), x)
    expected = torch.autograd.grad(reference.square().sum(), x)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, expected))


def test_rms_norm_saves_what_the_fused_kernel_saves_and_computes_rms_norm():
    g = torch.Generator().manual_seed(1)
    original = torch.nn.functional.rms_norm, torch.nn.functional.scaled_dot_product_attention
    x = torch.randn(3, 5, 8, generator=g, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(8, generator=g, dtype=torch.bfloat16, requires_grad=True)
    with gpu_kernels():
        out, saved = _saved_during(lambda: torch.nn.functional.rms_norm(x, (8,), weight, 1e-6))
    reference = torch.nn.functional.rms_norm(x, (8,), weight, 1e-6)
    assert torch.allclose(out.float(), reference.float(), atol=1e-2)
    assert [(tuple(t.shape), t.dtype) for t in saved] == [((3, 5, 8), torch.bfloat16), ((3, 5, 1), torch.float32),
                                                          ((8,), torch.bfloat16)]
    assert torch.allclose(saved[1], torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6), rtol=1e-5)
    grads = torch.autograd.grad(out.float().square().sum(), (x, weight))
    expected = torch.autograd.grad(reference.float().square().sum(), (x, weight))
    assert all(torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2) for a, b in zip(grads, expected))
    # the kernels are PyTorch's own again once the count is done
    assert (torch.nn.functional.rms_norm, torch.nn.functional.scaled_dot_product_attention) == original


# ----------------------------------------------------------------------------- the families without a hand inventory


def test_every_family_with_a_pipeline_is_planned():
    assert planned_families() == sorted(name for name in FAMILIES if name != "analytic")


@pytest.mark.parametrize("model", ["qwen_image", "flux2_dev", "z_image"])
def test_families_without_a_hand_inventory_get_plans_that_scale_with_tokens(model):
    """Qwen-Image, FLUX.2 and Z-Image are planned from autograd's count: positive, above the fixed memory, and their
    activations grow with the tokens (twice the side: four times the image tokens, the text the same)."""
    small = _config(model)
    large = _config(model, resolution=2 * small.resolution)
    arch = _arch(model, small)
    p, q = plan(arch, small, 8, True), plan(arch, large, 8, True)
    assert p.activation_source == q.activation_source == "autograd"
    assert p.total > p.fixed > 0 and all(a > 0 for a in p.activations_per_sample.values())
    assert q.tokens == (4 * p.tokens[0], p.tokens[1])
    tokens = (q.tokens[0] + q.tokens[1]) / (p.tokens[0] + p.tokens[1])
    for label, value in p.activations_per_sample.items():  # the joint sequence's activations: linear in its tokens
        assert abs(q.activations_per_sample[label] / value / tokens - 1) < 0.05, label
    assert "counted by autograd on the meta device" in format_plan(p)


# ----------------------------------------------------------------------------- context parallelism


@pytest.mark.parametrize("finetune", ["lora", "full"])
@pytest.mark.parametrize("model", ["flux_dev", "wan2_1_t2v_14b"])
def test_context_parallelism_splits_a_samples_sequence_activations(model, finetune):
    """Over 2 ranks a rank holds half the tokens (Wan: half its video tokens, the text whole) and half the rollout
    call; a line is its share of the tokens plus what does not grow with them (the time embedding's modulations,
    Wan's unsplit text), so 2·A(2) − A(1) = 2·A(4) − A(2) exactly: the token-proportional part halves exactly."""
    cfg = _config(model)
    arch = _arch(model, cfg)
    p = {n: plan(arch, cfg, 4, True, finetune, context_parallel=n) for n in (1, 2, 4)}
    n_img, n_txt = p[1].tokens
    assert p[2].rank_tokens == (n_img // 2, n_txt if model.startswith("wan") else n_txt // 2)
    assert p[2].rollout_forward * 2 == p[1].rollout_forward and p[1].context_buffers == 0 < p[2].context_buffers
    block = max(arch.blocks, key=lambda b: b.inner)
    in_blocks = p[2].rank_tokens[0] + (0 if model.startswith("wan") else p[2].rank_tokens[1])
    assert p[2].context_buffers == 4 * in_blocks * block.inner * 2  # one block's q, k, v and output in bf16
    for label in p[1].activations_per_sample:
        a = {n: p[n].activations_per_sample[label] for n in p}
        constant = 2 * a[2] - a[1]
        assert constant == 2 * a[4] - a[2], label
        assert 0 <= constant < (0.002 if model.startswith("wan") else 0.0005) * a[1], (label, constant / a[1])
    assert (p[1].weights, p[1].fixed, p[1].rollout_record) == (p[2].weights, p[2].fixed, p[2].rollout_record)


def test_a_rank_holds_its_share_of_the_token_grid():
    wan = _config("wan2_1_t2v_14b")
    geometry = _arch("wan2_1_t2v_14b", wan).geometry
    assert call_grid(geometry, wan) == (21, 90, 160)  # latent frames x rows x columns; tokens 21 x 45 x 80
    assert call_grid(geometry, wan, 8) == (21, 90, 20) and rank_tokens(geometry, wan, 8) == (9450, 512)
    assert rank_tokens(geometry, wan, 3) == (21 * 45 * 27, 512)  # 80 columns over 3 ranks: 27 each (rounded up)
    flux = _config("flux_dev")
    assert call_grid(_arch("flux_dev", flux).geometry, flux) == (1, 32, 32)  # 2x2-packed tokens
    assert rank_tokens(_arch("flux_dev", flux).geometry, flux, 4) == (256, 128)


@pytest.mark.parametrize("model, family", [("sd3_5_medium", "sd3"), ("z_image", "z_image")])
def test_a_family_without_a_cp_plan_is_refused_in_one_line(model, family, capsys):
    from flowgrpo.cli.tools import UserExit, main

    with pytest.raises(UserExit, match=rf"context parallelism 2: \w+ \(the {family} family\) has no _cp_plan, so "
                                       r"diffusers cannot split its sequence; the families that have one: flux, flux2, "
                                       r"flux2_klein, flux_kontext, qwen_image, qwen_image_edit, wan$"):
        main(["plan", "--model", model, "--processes", "2", "--context-parallel", "2"])
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- the rollout's chunk, latents, offloading


def test_the_chunk_caps_the_rollout_call():
    cfg = _config("wan2_1_t2v_14b")
    arch = _arch("wan2_1_t2v_14b", cfg)
    whole = plan(arch, cfg, 8, True, group=8)
    row = whole.rollout_forward_sample
    assert whole.chunk is None and whole.rollout_forward == 8 * row and row > 0
    for chunk, rows in ((1, 1), (3, 3), (8, 8), (20, 8)):
        p = plan(arch, cfg, 8, True, group=8, chunk=chunk)
        assert p.rollout_forward == rows * row and p.rollout_record == whole.rollout_record
    one = plan(arch, cfg, 8, True, group=8, chunk=1)
    assert one.total == one.fixed + one.rollout_record + max(row, one.training_activations) < whole.total
    assert "chunks of 1 of 8 samples x 2 passes" in format_plan(one)


def test_the_chunk_that_fits_is_the_largest_beside_the_rest():
    """The pure arithmetic under rollout_chunk: the largest R <= the group whose rollout call fits in the bytes
    available beside the fixed memory, the group's latents and the context-parallel buffers; at least 1."""
    cfg = _config("wan2_1_t2v_14b")
    p = plan(_arch("wan2_1_t2v_14b", cfg), cfg, 8, True, group=8, context_parallel=8)
    rest = p.fixed + p.rollout_record + p.context_buffers
    row = p.rollout_forward_sample
    assert chunk_that_fits(p, 80 * GIB) == 8  # 30 GiB + 8 calls of 1.5 GiB fit
    assert chunk_that_fits(p, rest + 3.5 * row) == 3
    assert chunk_that_fits(p, rest + 3 * row) == 3 and chunk_that_fits(p, rest + 3 * row - 1) == 2
    assert chunk_that_fits(p, rest) == 1 and chunk_that_fits(p, 0) == 1  # never less than one sample a call


def test_where_the_latents_live():
    cfg = _config("wan2_1_t2v_14b")
    arch = _arch("wan2_1_t2v_14b", cfg)
    p = {where: plan(arch, cfg, 8, True, group=8, latents=where) for where in ("float32", "bfloat16", "host")}
    record = 8 * (2 * 50 + 2) * p["float32"].latent_numel * 4
    assert p["float32"].rollout_record == record == 2 * p["bfloat16"].rollout_record
    assert p["host"].rollout_record == 0 and p["host"].host == {"rollout latents": record}
    assert "host memory: rollout latents" in format_plan(p["host"]) and p["float32"].host == {}


def test_offloaded_text_encoders_come_back_only_to_encode():
    cfg = _config("wan2_1_t2v_14b")
    arch = _arch("wan2_1_t2v_14b", cfg)
    kept, off = plan(arch, cfg, 8, True), plan(arch, cfg, 8, True, offload_text_encoders=True)
    encoder = kept.frozen["text_encoder"]
    assert off.frozen["text_encoder"] == 0 and off.frozen["vae"] == kept.frozen["vae"] and encoder > 5 * GIB
    assert off.fixed == kept.fixed - encoder and off.encoding == kept.fixed and off.offloaded == {"text_encoder": encoder}
    assert off.total == max(kept.total - encoder, kept.fixed) and off.host == {"text_encoder (offloaded)": encoder}


def test_activation_offload_keeps_one_blocks_tensors_on_the_gpu():
    cfg = _config("wan2_1_t2v_14b")
    arch = _arch("wan2_1_t2v_14b", cfg)
    kept, off = plan(arch, cfg, 8, True), plan(arch, cfg, 8, True, activation_offload=True)
    count = sample_activations(arch, cfg, False, lora_targets(cfg, arch))
    transient = kept.activations_per_sample["checkpointing"] - count.total(True)
    assert off.training_activations == count.largest_block() + transient < kept.training_activations
    assert off.host == {"training activations (saved tensors)": count.total(True)}
    assert off.activations_per_sample == kept.activations_per_sample  # what a sample keeps, wherever it lives


# ----------------------------------------------------------------------------- the command


def test_the_command_plans_a_video_at_its_real_size(capsys):
    from flowgrpo.cli import main

    assert main(["plan", "--model", "wan2_2_t2v_a14b", "--height", "720", "--width", "1280", "--frames", "81",
                 "--processes", "8", "--fsdp", "--finetune", "full", "--context-parallel", "8", "--chunk", "1",
                 "--offload-text-encoders"]) == 0
    out = capsys.readouterr().out
    assert "75,600 image tokens + 512 text tokens a sample; context parallel over 8: 9,450 + 512 tokens a rank" in out
    assert "chunks of 1 of 8 samples" in out and "text encoders while encoding" in out and "\nfits in 80 GiB" in out
    assert main(["plan", "--model", "wan2_1_t2v_14b", "--processes", "8", "--fsdp", "--context-parallel", "8",
                 "--chunk", "0", "--latents", "host", "--activation-offload"]) == 0
    out = capsys.readouterr().out
    assert "chunks of 8 of 8 samples" in out and "host memory: rollout latents" in out
    assert "largest group not bounded by the GPU's memory" in out and "saved tensors on the host" in out


def test_an_editing_plan_counts_the_sources_tokens():
    """FLUX.1-Kontext's calls append the source's tokens to the latent's: its plan counts twice the image tokens (the
    text the same), activations that grow with the joint sequence as FLUX.1's do, the rollout latents unchanged; with
    ``references=0`` it is FLUX.1-dev's plan."""
    flux = _config("flux_dev")
    kontext = _config("flux_dev", family="flux_kontext")
    arch = _arch("flux_dev", flux)
    p, e = plan(arch, flux, 8, True), plan(arch, kontext, 8, True)
    assert e.tokens == (2 * p.tokens[0], p.tokens[1]) and e.latent_numel == p.latent_numel
    tokens = (e.tokens[0] + e.tokens[1]) / (p.tokens[0] + p.tokens[1])
    for label, value in p.activations_per_sample.items():
        assert 1 < e.activations_per_sample[label] / value < tokens * 1.05, label
    assert plan(arch, kontext, 8, True, references=0).activations_per_sample == p.activations_per_sample
