"""The memory plan (flowgrpo/memory/, ``flowgrpo plan``): hand-computed cases, exact parameter counts
from configurations alone, the activation inventory against what autograd really saves, the command, and the
published sizes of the real models."""

import json

import pytest
import torch

from flowgrpo.models.config import validate_model_config
from flowgrpo.memory import (
    Architecture,
    Block,
    Component,
    Geometry,
    Linear,
    activation_bytes,
    architecture_from_configs,
    backward_transient_bytes,
    format_plan,
    is_target,
    lora_parameters,
    lora_targets,
    plan,
    read_architecture,
    token_counts,
)
from flowgrpo.run.paths import ASSETS_DIR

pytestmark = pytest.mark.usefixtures("one_thread")

# ----------------------------------------------------------------------------- by hand

# a made-up FLUX-like transformer: 1000 parameters and 10 buffer elements, one single-stream block of width 4
# (inner 4, 2 heads, MLP 16), three Linears of which the LoRA targets (to_q, to_k) adapt two
HAND = Architecture(
    components=(Component("transformer", "Made", 1000, 10), Component("text_encoder", "T", 100),
                Component("vae", "V", 50)),
    linears=(Linear("single.0.attn.to_q", 4, 4), Linear("single.0.attn.to_k", 4, 4), Linear("single.0.proj_mlp", 4, 16)),
    blocks=(Block("single.0", "single", params=600, dim=4, inner=4, mlp=16, heads=2),),
    geometry=Geometry("flux", latent_channels=4, vae_spatial=8, patch=(1, 2, 2), text_width=8, in_width=16),
)
# bf16 (b = 2 bytes), 32 px -> 4 x 4 latent -> 2 x 2 = 4 image tokens, 6 text tokens, rank 2, 5 steps
HAND_CONFIG = dict(family="flux", pretrained="made-up", dtype="bfloat16", resolution=32, max_sequence_length=6,
                   lora_rank=2, lora_target_modules=["to_q", "to_k"], sample_steps=5, guidance_scale=3.5)
GIB = 1024**3


def _hand(finetune, processes, fsdp, **kw):
    return plan(HAND, HAND_CONFIG, processes, fsdp, finetune, 30000 / GIB, margin=0.0, checkpointing=False,
                group=3, micro_batch=2, **kw)


def test_lora_and_weights_by_hand():
    # LoRA: 2 x (4 + 4) for to_q and for to_k = 32 float32 weights; the base's 1000 stay bf16
    assert lora_parameters(HAND.linears, ["to_q", "to_k"], 2) == 32
    one = _hand("lora", 1, False)
    assert (one.weights, one.buffers, one.gradients, one.optimizer) == (1000 * 2 + 32 * 4, 10 * 2, 32 * 4, 2 * 32 * 4)
    assert one.copies == {"ema": 128, "old_policy": 128} and one.reference == 0 and one.fsdp_buffers == 0
    assert one.frozen == {"text_encoder": 100 * 2, "vae": 50 * 4}  # text encoders in bf16, the VAE in float32
    assert _hand("lora", 2, False).weights == one.weights  # unsharded processes each hold everything
    two = _hand("lora", 2, True)
    assert (two.weights, two.buffers, two.gradients, two.optimizer) == (2128 // 2, 20, 64, 128)
    assert two.copies == {"ema": 64, "old_policy": 64} and two.frozen == one.frozen
    # the block (600 bf16 + its 32 LoRA weights, gathered in bf16) twice, and its LoRA gradient in float32
    assert two.fsdp_buffers == 2 * (600 + 32) * 2 + 32 * 4


def test_full_fine_tuning_by_hand():
    one = _hand("full", 1, False)
    assert (one.weights, one.gradients, one.optimizer, one.reference) == (2000, 2000, 4000, 2000)
    assert one.copies == {"ema": 2000, "old_policy": 2000}
    two = _hand("full", 2, True)
    assert (two.weights, two.gradients, two.optimizer, two.reference) == (1000, 1000, 2000, 1000)
    assert two.fsdp_buffers == 2 * 600 * 2 + 600 * 4  # the block gathered twice in bf16, its float32 gradient
    master = _hand("full", 1, False, master_dtype="float32", copies=("ema",))
    assert (master.weights, master.gradients, master.optimizer, master.copies, master.reference) == (
        4000, 4000, 8000, {"ema": 4000}, 2000)  # the frozen reference stays in the model dtype


def test_muon_keeps_one_float32_momentum_per_trainable_weight():
    """train.optimizer=muon (flowgrpo/engine/optim.py): a float32 momentum per weight where AdamW keeps two moments in
    the weight's dtype: full bf16 fine-tuning the same bytes (4 = 2 x 2), a LoRA half (4 against 2 x 4), sharded too."""
    assert _hand("full", 1, False, optimizer="muon").optimizer == 2000 * 4 // 2  # 1000 weights x 4 bytes
    assert _hand("lora", 1, False, optimizer="muon").optimizer == 32 * 4
    assert _hand("lora", 2, True, optimizer="muon").optimizer == 32 * 4 // 2
    assert "Muon momentum" in format_plan(_hand("lora", 1, False, optimizer="muon"))


def test_activations_and_fits_by_hand():
    cfg = validate_model_config(HAND_CONFIG)
    assert token_counts(HAND.geometry, cfg) == (4, 6)  # N = 10 tokens
    # full fine-tuning, bf16, the single block (N x width, 2 bytes unless float32):
    #   norm input 10x4, normalised 10x4, proj_mlp/q/k/v input 10x4         3 x 80 = 240
    #   GELU input 10x16                                                       320
    #   q and k RMS norms (diffusers'): input, float32 copy (4 B), normalised  2 x (80 + 160 + 80) = 640
    #   attention q, k, v, output 10x4 each                                     320
    #   proj_out input 10x(4 + 16), gate 10x4                                   400 + 80
    # the rest: latent embedding 4x16, text embedding 6x8, rotary tables 2 x 10 x 2 (float32),
    #   norm_out input and normalised 4x4, proj_out input 4x4                 128 + 96 + 160 + 32 + 32 + 32
    assert activation_bytes(HAND, cfg, True, [], checkpointing=False) == 2000 + 480
    # checkpointed: the rest, the block's input (10x4) and the block recomputed
    assert activation_bytes(HAND, cfg, True, [], checkpointing=True) == 480 + 80 + 2000
    # LoRA: the first block's input needs no grad (no norm input); q/k get float32 casts of their input
    # (2 x 10x4 x 4) and the 2 adapters' hidden (2 x 10x2 x 4); GELU 320; norms 2 x (80 + 160); attention 320;
    # the rest: rotary 160 and norm_out's input 32
    assert activation_bytes(HAND, cfg, False, ["to_q", "to_k"], checkpointing=False) == (320 + 160 + 320 + 480 + 320
                                                                                          + 160 + 32)
    assert backward_transient_bytes(HAND, cfg) == 10 * (16 + 4) * 2
    p = _hand("full", 1, False)
    act = 2480 + 400
    assert p.activations_per_sample["no checkpointing"] == act and p.training_activations == 2 * act
    record = (2 * 5 + 2) * (4 * 4 * 4) * 4  # per sample: 12 float32 latents of 64 elements
    forward = 2 * 10 * (3 * 4 + 2 * 16) * 2  # CFG (no guidance embedder): 2 passes of 10 tokens
    assert (p.rollout_record, p.rollout_forward) == (3 * record, 3 * forward)
    fixed = 2000 + 20 + 2000 + 4000 + 4000 + 2000 + 400
    assert p.fixed == fixed and p.total == fixed + 3 * record + max(3 * forward, 2 * act)
    room = 30000 - fixed
    assert p.max_micro_batch == (room - 3 * record) // act
    assert p.max_group == min((room - 2 * act) // record, room // (record + forward))


def test_lora_targets_follow_the_model_and_peft():
    assert lora_targets(validate_model_config({"family": "wan"})) == ["to_q", "to_k", "to_v", "to_out.0"]
    assert lora_targets(validate_model_config({"family": "sd3"}))[0] == "attn.to_q"
    assert is_target("blocks.0.attn1.to_out.0", ["to_out.0"]) and not is_target("blocks.0.attn2.to_q", ["attn.to_q"])


# ----------------------------------------------------------------------------- counts from configurations


def test_meta_counts_equal_the_real_tiny_models():
    """Built on the meta device from the shipped tiny models' configurations, every component has the parameter
    count of the real model loaded with its weights, and LoRA the count peft adds."""
    from diffusers import SD3Transformer2DModel, WanTransformer3DModel
    from peft import LoraConfig

    for name, cls in (("tiny-sd3", SD3Transformer2DModel), ("tiny-wan", WanTransformer3DModel)):
        cfg = validate_model_config({"family": name.split("-")[1], "pretrained": name})
        arch = read_architecture(cfg)
        real = cls.from_pretrained(ASSETS_DIR / name / "transformer")
        assert arch.transformer.params == sum(p.numel() for p in real.parameters())
        for component in arch.frozen():
            path = ASSETS_DIR / name / component.name
            if component.name == "vae":
                import diffusers

                module = getattr(diffusers, json.loads((path / "config.json").read_text())["_class_name"])
            else:
                import transformers

                module = getattr(transformers, json.loads((path / "config.json").read_text())["architectures"][0])
            loaded = module.from_pretrained(path)
            assert component.params == sum(p.numel() for p in loaded.parameters()), (name, component.name)
        targets = lora_targets(cfg)
        real.requires_grad_(False)
        real.add_adapter(LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=targets))
        trainable = sum(p.numel() for p in real.parameters() if p.requires_grad)
        assert lora_parameters(arch.linears, targets, cfg.lora_rank) == trainable


# ----------------------------------------------------------------------------- activations vs autograd

L = 24  # text tokens of the measured samples
SD3 = dict(_class_name="SD3Transformer2DModel", sample_size=32, patch_size=2, in_channels=4, out_channels=4,
           num_layers=3, attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32, caption_projection_dim=64,
           pooled_projection_dim=16, pos_embed_max_size=16, qk_norm="rms_norm", dual_attention_layers=[0, 1])
FLUX = dict(_class_name="FluxTransformer2DModel", patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
            attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32, pooled_projection_dim=16,
            axes_dims_rope=(4, 6, 6), guidance_embeds=True)
WAN = dict(_class_name="WanTransformer3DModel", patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16,
           in_channels=16, out_channels=16, text_dim=32, freq_dim=32, ffn_dim=160, num_layers=3, cross_attn_norm=True,
           qk_norm="rms_norm_across_heads", rope_max_seq_len=64)
VAE = {  # only their scale factors matter here: 8x in space (256 px -> 32 latent pixels), Wan 4x in time
    "sd3": dict(_class_name="AutoencoderKL", block_out_channels=[8] * 4, down_block_types=["DownEncoderBlock2D"] * 4,
                up_block_types=["UpDecoderBlock2D"] * 4, latent_channels=4, norm_num_groups=4),
    "wan": dict(_class_name="AutoencoderKLWan", base_dim=8, z_dim=16, num_res_blocks=1, temperal_downsample=[False, True, True]),
}
CASES = {  # family: (transformer, VAE, model config), 256 image tokens (Wan: 3 x 8 x 8 = 192 video tokens)
    "sd3": (SD3, VAE["sd3"], dict(family="sd3", resolution=256)),
    "flux": (FLUX, VAE["sd3"], dict(family="flux", resolution=256)),
    "wan": (WAN, VAE["wan"], dict(family="wan", resolution=128, num_frames=9)),
}
BLOCKS = ("transformer_blocks", "single_transformer_blocks", "blocks")


def _inputs(family: str, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    if family == "sd3":
        return dict(hidden_states=randn(1, 4, 32, 32), encoder_hidden_states=randn(1, L, 32),
                    pooled_projections=randn(1, 16), timestep=torch.tensor([500.0]))
    if family == "flux":
        from diffusers import FluxPipeline

        return dict(hidden_states=randn(1, 256, 16), encoder_hidden_states=randn(1, L, 32), pooled_projections=randn(1, 16),
                    timestep=torch.tensor([0.5], dtype=dtype), txt_ids=torch.zeros(L, 3, dtype=dtype),
                    img_ids=FluxPipeline._prepare_latent_image_ids(1, 16, 16, "cpu", dtype), guidance=torch.tensor([3.5]))
    return dict(hidden_states=randn(1, 16, 3, 16, 16), encoder_hidden_states=randn(1, L, 32), timestep=torch.tensor([500.0]))


def _model(family: str, finetune: str, dtype: str):
    """(architecture, model config, LoRA targets, the real tiny transformer set up to train as flowgrpo does)."""
    import diffusers
    from peft import LoraConfig

    transformer, vae, config = CASES[family]
    cfg = validate_model_config(dict(config, max_sequence_length=L, dtype=dtype, finetune=finetune, lora_rank=4))
    targets = [] if finetune == "full" else lora_targets(cfg)
    torch.manual_seed(0)
    model = getattr(diffusers, transformer["_class_name"]).from_config(transformer).to(getattr(torch, dtype))
    if finetune == "full":
        model.requires_grad_(True)
    else:
        model.requires_grad_(False)
        model.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets))
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.float()  # LoRA trains in float32 (flowgrpo/models/trainable.py, cast_training_params)
    model.train()
    return architecture_from_configs(family, {"transformer": transformer, "vae": vae}), cfg, targets, model


def _saved(model, kwargs, checkpointing: bool = False, without_inputs: bool = False) -> dict[str, int]:
    """Bytes of the distinct storages autograd saves in one forward (parameters and buffers excluded), by the block
    that saved them ("rest" outside the blocks). With checkpointing, the inputs a checkpoint keeps go to its block.
    ``without_inputs``: a block's own input tensors left out of what it saves (in a checkpointed backward they are
    the inputs the checkpoint kept: one storage, counted with those)."""
    names = {m: n for n, m in model.named_modules() if n.count(".") == 1 and n.split(".")[0] in BLOCKS}
    stack = ["rest"]
    block_inputs: dict[str, set] = {}

    def enter(module, args, kwargs_):
        stack.append(names[module])
        block_inputs[names[module]] = {t.untyped_storage().data_ptr() for t in [*args, *kwargs_.values()]
                                       if isinstance(t, torch.Tensor)}

    hooks = [m.register_forward_pre_hook(enter, with_kwargs=True) for m in names]
    hooks += [m.register_forward_hook(lambda m, a, o: stack.pop() and None) for m in names]
    if checkpointing:
        model.enable_gradient_checkpointing()
        checkpoint = model._gradient_checkpointing_func

        def labelled(block, *args, **kw):
            stack.append(names[block])
            try:
                return checkpoint(block, *args, **kw)
            finally:
                stack.pop()

        model._gradient_checkpointing_func = labelled
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, tuple[str, int]] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if without_inputs and ptr in block_inputs.get(stack[-1], ()):
            return t.detach()
        if ptr not in skip and ptr not in seen:
            seen[ptr] = (stack[-1], t.untyped_storage().nbytes())
        return t.detach()  # the storage without its graph (keeping ``t`` would keep the graph alive)

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(**kwargs, return_dict=False)
    finally:
        for hook in hooks:
            hook.remove()
        if checkpointing:
            model.disable_gradient_checkpointing()
    by_block: dict[str, int] = {}
    for where, nbytes in seen.values():
        by_block[where] = by_block.get(where, 0) + nbytes
    return by_block


FACTOR = 1.05  # the plan is within 5 % of what autograd saves (measured here: 0.99 to 1.03)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("finetune", ["full", "lora"])
@pytest.mark.parametrize("family", ["sd3", "flux", "wan"])
def test_activation_inventory_matches_what_autograd_saves(family, finetune, dtype):
    """On a tiny transformer of the real class, the bytes autograd saves in one forward (distinct storages, weights
    excluded) match the plan's inventory. The CPU runs PyTorch's flash-attention kernel
    (``_scaled_dot_product_flash_attention_for_cpu``: q, k, v, its output and the log-sum-exp, no tokens x tokens
    matrix), so nothing is subtracted; torch.nn.RMSNorm runs its composite here (``fused_rms_norm=False``) where
    CUDA runs a fused kernel."""
    arch, cfg, targets, model = _model(family, finetune, dtype)
    measured = sum(_saved(model, _inputs(family, getattr(torch, dtype))).values())
    planned = activation_bytes(arch, cfg, finetune == "full", targets, checkpointing=False, fused_rms_norm=False)
    assert 1 / FACTOR < measured / planned < FACTOR, (measured, planned, measured / planned)


@pytest.mark.parametrize("finetune", ["full", "lora"])
@pytest.mark.parametrize("family", ["sd3", "flux", "wan"])
def test_checkpointed_activations_match(family, finetune):
    """With gradient checkpointing the forward saves the blocks' inputs (measured, by block) and each block's tensors
    come back while it is recomputed (measured without checkpointing, by block): the peak, max over k of the inputs
    of blocks 0..k + block k's tensors + what lies outside the blocks, matches the plan's."""
    arch, cfg, targets, model = _model(family, finetune, "float32")
    kwargs = _inputs(family, torch.float32)
    internals = _saved(model, kwargs, without_inputs=True)  # a recomputed block reads the kept inputs themselves
    kept = _saved(model, kwargs, checkpointing=True)
    names = [b.name for b in arch.blocks]
    peak = max(sum(kept.get(n, 0) for n in names[: k + 1]) + internals[names[k]] for k in range(len(names)))
    measured = kept.get("rest", 0) + peak
    planned = activation_bytes(arch, cfg, finetune == "full", targets, checkpointing=True, fused_rms_norm=False)
    assert 1 / FACTOR < measured / planned < FACTOR, (measured, planned, measured / planned)
    assert planned < activation_bytes(arch, cfg, finetune == "full", targets, checkpointing=False, fused_rms_norm=False)


# ----------------------------------------------------------------------------- the command


@pytest.mark.parametrize("finetune", ["lora", "full"])
@pytest.mark.parametrize("processes", [["--processes", "1"], ["--processes", "8", "--fsdp"]], ids=["1", "8-fsdp"])
@pytest.mark.parametrize("model", ["sd3_5_medium", "flux_dev", "wan2_1_t2v_14b"])
def test_plan_command_prints_the_table(model, processes, finetune, capsys):
    from flowgrpo.cli import main

    assert main(["plan", "--model", model, *processes, "--finetune", finetune]) == 0
    out = capsys.readouterr().out
    for line in ("transformer weights", "gradients", "AdamW moments", "copy: ema", "copy: old_policy", "reference policy",
                 "text_encoder", "vae", "rollout latents", "activations per sample, checkpointing",
                 "activations per sample, no checkpointing", "= total", "largest group", "largest micro-batch"):
        assert line in out, line
    assert ("FSDP over 8" in out) == ("--fsdp" in processes) and f"{model}, {finetune}" in out


def test_plan_command_names_the_models_on_a_bad_name(capsys):
    from flowgrpo.cli import main

    with pytest.raises(SystemExit) as info:
        main(["plan", "--model", "sd3_medium"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'sd3_medium'" in err
    assert all(name in err for name in ("sd3_5_medium", "flux_dev", "wan2_1_t2v_14b", "tiny_sd3"))


def test_plan_shards_with_fsdp_and_fits_less_without(capsys):
    from flowgrpo.cli import main

    main(["plan", "--model", "flux_dev", "--finetune", "full", "--processes", "8"])
    assert "does NOT fit" in capsys.readouterr().out  # 12 B bf16 weights, gradients, moments, 3 copies: > 80 GiB
    main(["plan", "--model", "flux_dev", "--finetune", "full", "--processes", "8", "--fsdp"])
    assert "\nfits in 80 GiB" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the published sizes


@pytest.mark.parametrize("model, published", [("sd3_5_medium", 2.47e9), ("sd3_5_large", 8.1e9), ("flux_dev", 11.9e9),
                                              ("wan2_1_t2v_14b", 14.3e9)])
def test_published_transformer_sizes(model, published):
    """The architecture files give the published sizes within 3 %. SD3.5-Medium's 2.47 B counts its checkpoint's
    tensors: 2.24 B parameters and the 384 x 384 x 1536 position-embedding table, a (persistent) buffer."""
    from omegaconf import OmegaConf

    from flowgrpo.run.paths import configs_dir

    cfg = validate_model_config(OmegaConf.to_container(OmegaConf.load(configs_dir() / "models" / f"{model}.yaml")))
    transformer = read_architecture(cfg, model).transformer
    assert abs(transformer.params + transformer.buffers - published) / published < 0.03, transformer


# ----------------------------------------------------------------------------- two experts, the analytic world


def test_two_experts_hold_two_transformers_and_train_what_the_config_says():
    """Wan2.2 A14B is two Wan2.1-14B-shaped experts: twice the weights of Wan2.1-14B, LoRA on each trained one, and the
    activations of one call (one expert per call)."""
    from omegaconf import OmegaConf

    from flowgrpo.run.paths import configs_dir

    def config(name, **extra):
        return validate_model_config({**OmegaConf.to_container(OmegaConf.load(configs_dir() / "models" / f"{name}.yaml")),
                                      "resolution": 480, "width": 832, "num_frames": 81, **extra})

    one = plan(read_architecture(config("wan2_1_t2v_14b"), "wan2_1_t2v_14b"), config("wan2_1_t2v_14b"), steps=40)
    arch = read_architecture(config("wan2_2_t2v_a14b"), "wan2_2_t2v_a14b")
    both = plan(arch, config("wan2_2_t2v_a14b"), steps=40)
    low = plan(arch, config("wan2_2_t2v_a14b", trained_experts=["transformer_2"]), steps=40)
    assert both.experts == 2 and both.trained_experts == 2 and low.trained_experts == 1
    assert both.trainable_params == 2 * one.trainable_params == 2 * low.trainable_params
    assert both.weights == 2 * one.weights and low.weights == 2 * one.weights - one.trainable_params * 4
    assert "transformer_2" not in both.frozen and both.frozen == one.frozen
    assert both.activations_per_sample == one.activations_per_sample
    sharded = plan(arch, config("wan2_2_t2v_a14b"), processes=8, fsdp=True, steps=40)
    assert sharded.weights == pytest.approx(both.weights / 8, abs=1)
    assert "2 experts' weights (2 trained)" in format_plan(both)


def test_plan_refuses_the_analytic_world_in_one_line(capsys):
    """Every family with a pipeline is planned (tests/models/test_memory_saved.py); the analytic world has no
    architecture, and says so in one line naming the families that have one."""
    from flowgrpo.cli.tools import UserExit, main

    with pytest.raises(UserExit, match=r"'analytic' family, which has no architecture to plan; flowgrpo plan covers "
                                       r"the .*qwen_image.*z_image families"):
        main(["plan", "--model", "analytic"])
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
