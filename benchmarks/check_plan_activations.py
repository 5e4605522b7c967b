"""The memory plan's activation inventory against a real-size transformer on a CUDA GPU (random weights, no download).

    python benchmarks/check_plan_activations.py [--models sd3_5_medium flux_dev wan2_1_t2v_1_3b] [--finetune lora full]
        [--frames 21] [--out FILE.json]

For each model config, builds its transformer from configs/models/architectures/<model>/transformer.json on the GPU in
the model dtype with random weights, adds the config's LoRA (float32, as flowgrpo trains it) or trains every weight,
and for one sample at the config's resolution and text length (Wan: ``--frames`` frames, to keep the saved tensors
within one GPU) measures, without autocast:

  saved       bytes autograd keeps for the backward of one forward: distinct storages seen by
              torch.autograd.graph.saved_tensors_hooks, parameters and buffers excluded
  ckpt_peak   (LoRA) with gradient checkpointing: the peak allocated during forward + backward above what was
              allocated before; it holds some of the LoRA gradients (``lora_gradients`` when all exist), so the
              activations at the peak lie between ckpt_peak - lora_gradients and ckpt_peak

each without autocast (the plan's assumption) and under ``torch.autocast`` in the model dtype
(``train.mixed_precision=bf16``), and prints them beside ``flowgrpo.memory.activation_bytes`` (the plan's
per-sample activations: ``activation_bytes`` for ``saved``, ``training_activation_bytes`` for the peak), with the
ratio measured / planned. tests/models/test_memory.py makes the same comparison on
tiny models on the CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def inputs(geometry, c, cfg, n_txt: int, dtype: torch.dtype) -> dict:
    """One sample's transformer inputs, shaped as the family's pipeline makes them (flowgrpo/models/<family>.py)."""
    family, s = geometry.family, geometry.vae_spatial
    h, w = cfg.resolution // s, (cfg.width or cfg.resolution) // s
    randn = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype)  # noqa: E731
    t = torch.rand(1, device="cuda") * 1000
    if family == "sd3":
        return {"hidden_states": randn(1, c.in_channels, h, w), "encoder_hidden_states": randn(1, n_txt, c.joint_attention_dim),
                "pooled_projections": randn(1, c.pooled_projection_dim), "timestep": t}
    if family == "flux":
        from diffusers import FluxPipeline

        return {"hidden_states": randn(1, (h // 2) * (w // 2), c.in_channels),
                "encoder_hidden_states": randn(1, n_txt, c.joint_attention_dim),
                "pooled_projections": randn(1, c.pooled_projection_dim), "timestep": (t / 1000).to(dtype),
                "img_ids": FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, "cuda", dtype),
                "txt_ids": torch.zeros(n_txt, 3, device="cuda", dtype=dtype),
                "guidance": torch.full([1], 3.5, device="cuda") if c.guidance_embeds else None}
    frames = (cfg.num_frames - 1) // geometry.vae_temporal + 1
    return {"hidden_states": randn(1, c.in_channels, frames, h, w), "encoder_hidden_states": randn(1, n_txt, c.text_dim),
            "timestep": t}


def saved_bytes(model, kwargs) -> int:
    skip = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = t.untyped_storage().nbytes()
        return t.detach()  # the same storage without its graph: keeping ``t`` would keep its graph alive (a cycle)

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(**kwargs, return_dict=False)[0]
    del out
    return sum(seen.values())


def build(name: str, frames: int):
    """(model config, architecture, transformer on the GPU in the model dtype with random weights)."""
    from omegaconf import OmegaConf

    from flowgrpo.memory import read_architecture
    from flowgrpo.models.architectures import _config_files, architecture_dir
    from flowgrpo.models.config import validate_model_config
    from flowgrpo.models.random_init import diffusers_model
    from flowgrpo.run.paths import configs_dir

    cfg = validate_model_config(OmegaConf.to_container(OmegaConf.load(configs_dir() / "models" / f"{name}.yaml")))
    if cfg.family == "wan" and frames:
        cfg.num_frames = frames
    config = json.loads(_config_files(architecture_dir(cfg, name))["transformer"].read_text())
    # initialised in bf16 on the GPU: no float32 copy of the weights
    model = diffusers_model(config, torch.device("cuda"), getattr(torch, cfg.dtype))
    return cfg, read_architecture(cfg, name), model


def measure(name: str, cfg, arch, model, finetune: str, autocast: bool) -> dict:
    from contextlib import nullcontext

    from flowgrpo.memory import activation_bytes, lora_targets, token_counts, training_activation_bytes

    full = finetune == "full"
    targets = [] if full else lora_targets(cfg)
    cfg.finetune = finetune
    dtype = getattr(torch, cfg.dtype)
    n_img, n_txt = token_counts(arch.geometry, cfg)
    kwargs = inputs(arch.geometry, model.config, cfg, n_txt, dtype)
    context = (lambda: torch.autocast("cuda", dtype=dtype)) if autocast else nullcontext
    row = {"model": name, "finetune": finetune, "autocast": autocast, "gpu": torch.cuda.get_device_name(),
           "tokens": [n_img, n_txt]}
    with context():
        row["saved"] = saved_bytes(model, kwargs)
    row["planned"] = activation_bytes(arch, cfg, full, targets, checkpointing=False)
    row["ratio"] = round(row["saved"] / row["planned"], 3)
    if not full:
        torch.cuda.empty_cache()
        model.enable_gradient_checkpointing()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with context():
            out = model(**kwargs, return_dict=False)[0]
        out.float().square().mean().backward()
        del out
        torch.cuda.synchronize()
        grads = 0
        for p in model.parameters():
            if p.grad is not None:
                grads += p.grad.numel() * p.grad.element_size()
                p.grad = None
        row["ckpt_peak"] = torch.cuda.max_memory_allocated() - before
        row["lora_gradients"] = grads
        row["ckpt_planned"] = training_activation_bytes(arch, cfg, full, targets, checkpointing=True)
        row["ckpt_ratio"] = [round((row["ckpt_peak"] - grads) / row["ckpt_planned"], 3),
                             round(row["ckpt_peak"] / row["ckpt_planned"], 3)]
        model.disable_gradient_checkpointing()
    torch.cuda.empty_cache()
    return row


def run_model(name: str, finetunes, frames: int, autocasts) -> list[dict]:
    """Full fine-tuning first (every weight trains), then the config's LoRA on the same weights."""
    cfg, arch, model = build(name, frames)
    rows = []
    for finetune in sorted(finetunes):  # "full" before "lora"
        if finetune == "full":
            model.requires_grad_(True)
        else:
            from peft import LoraConfig

            from flowgrpo.memory import lora_targets

            model.requires_grad_(False)
            model.add_adapter(LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, init_lora_weights="gaussian",
                                         target_modules=lora_targets(cfg)))
            for p in model.parameters():
                if p.requires_grad:
                    p.data = p.data.float()  # LoRA trains in float32 (cast_training_params)
        model.train()
        for autocast in autocasts:
            rows.append(measure(name, cfg, arch, model, finetune, autocast))
            print(json.dumps(rows[-1]), flush=True)
    del model
    torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["sd3_5_medium", "flux_dev", "wan2_1_t2v_1_3b"])
    parser.add_argument("--finetune", nargs="+", default=["lora", "full"], choices=["lora", "full"])
    parser.add_argument("--frames", type=int, default=21, help="Wan: frames of the clip (4k + 1; the config's 81 "
                        "needs ~110 GiB of saved tensors without checkpointing)")
    parser.add_argument("--autocast", nargs="+", default=["no", "bf16"], choices=["no", "bf16"],
                        help="measure without autocast (the plan's assumption) and/or under torch.autocast in the "
                             "model dtype (train.mixed_precision=bf16)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("check_plan_activations needs a CUDA GPU", file=sys.stderr)
        return 2
    # as flowgrpo on CUDA (flowgrpo/models/loading.py): PyTorch SDPA without its cuDNN kernel (FLUX.1-dev's backward
    # through it stopped with an illegal memory access on an H100, torch 2.11); flash / memory-efficient remain
    torch.backends.cuda.enable_cudnn_sdp(False)
    rows = []
    for name in args.models:
        rows += run_model(name, args.finetune, args.frames, [a == "bf16" for a in args.autocast])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
