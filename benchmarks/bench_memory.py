"""GPU memory of a training step of a real-size transformer with random weights, against ``flowgrpo plan``.

    python benchmarks/bench_memory.py --model sd3_5_medium [--finetune lora|full] [--micro-batches 1 2]
        [--out docs/results/memory_check.json]

Builds the model config's transformer from its architecture file (configs/models/architectures/<model>/
transformer.json: the published configuration numbers, no weights downloaded) directly on the GPU in the
model's dtype, adds the config's LoRA (float32, as flowgrpo trains it) or trains every weight, and measures
with ``torch.cuda.max_memory_allocated``:

  weights       allocated after building (and adding LoRA)
  activations   per sample: (peak of a forward + backward of b samples − allocated before it, gradients
                included) / b, at the
                config's resolution (and frames) and text length, with and without gradient checkpointing
  optimizer     allocated after an AdamW step − weights: gradients + the two moments

and prints each next to what the memory plan (flowgrpo/memory/) computes for one process, with the
ratio measured / planned (``--compare FILE`` prints a saved measurement beside the plan, without a GPU).
benchmarks/check_plan_activations.py checks the plan's activation inventory itself (the tensors autograd saves). Inputs are random tensors of the shapes the family's pipeline feeds its
transformer (flowgrpo/models/<family>.py). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 1024**3


def build(model_cfg, arch_file: Path, device: str):
    """The transformer of ``arch_file`` on ``device`` in the model dtype, random weights, with the config's LoRA."""
    from flowgrpo.models.random_init import diffusers_model

    dtype = getattr(torch, model_cfg.dtype)  # initialised in bf16 on the GPU: no float32 copy of 12B weights
    transformer = diffusers_model(json.loads(arch_file.read_text()), torch.device(device), dtype)
    transformer.train()
    if model_cfg.finetune == "lora":
        from peft import LoraConfig

        from flowgrpo.memory import lora_targets

        targets = lora_targets(model_cfg)
        transformer.requires_grad_(False)
        transformer.add_adapter(LoraConfig(r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha,
                                           init_lora_weights="gaussian", target_modules=targets))
        for p in transformer.parameters():
            if p.requires_grad:
                p.data = p.data.float()
    return transformer, dtype


def inputs(model_cfg, transformer, batch: int, device: str, dtype: torch.dtype) -> dict:
    """Random inputs of the shapes the family's pipeline feeds its transformer."""
    c = transformer.config
    height = model_cfg.resolution
    width = model_cfg.width or model_cfg.resolution
    text = model_cfg.max_sequence_length
    t = torch.rand(batch, device=device) * 1000
    if model_cfg.family == "sd3":  # CLIP's 77 tokens + T5's, as the pipeline concatenates them
        return {"hidden_states": torch.randn(batch, c.in_channels, height // 8, width // 8, device=device, dtype=dtype),
                "encoder_hidden_states": torch.randn(batch, 77 + text, c.joint_attention_dim, device=device, dtype=dtype),
                "pooled_projections": torch.randn(batch, c.pooled_projection_dim, device=device, dtype=dtype),
                "timestep": t}
    if model_cfg.family == "flux":  # 2x2-packed latents: (H/16)(W/16) tokens of 4 x 16 channels
        h, w = height // 16, width // 16
        img_ids = torch.zeros(h * w, 3, device=device, dtype=dtype)
        return {"hidden_states": torch.randn(batch, h * w, c.in_channels, device=device, dtype=dtype),
                "encoder_hidden_states": torch.randn(batch, text, c.joint_attention_dim, device=device, dtype=dtype),
                "pooled_projections": torch.randn(batch, c.pooled_projection_dim, device=device, dtype=dtype),
                "timestep": t / 1000, "img_ids": img_ids, "txt_ids": torch.zeros(text, 3, device=device, dtype=dtype),
                "guidance": torch.full([batch], 3.5, device=device) if c.guidance_embeds else None}
    if model_cfg.family == "wan":  # latent frames (F - 1)/4 + 1 of (H/8, W/8)
        frames = (model_cfg.num_frames - 1) // 4 + 1
        return {"hidden_states": torch.randn(batch, c.in_channels, frames, height // 8, width // 8, device=device, dtype=dtype),
                "encoder_hidden_states": torch.randn(batch, text, c.text_dim, device=device, dtype=dtype),
                "timestep": t}
    raise ValueError(f"no input shapes for family {model_cfg.family!r}")


def measure(model_name: str, finetune: str | None, micro_batches: list[int], device: str = "cuda") -> dict:
    from omegaconf import OmegaConf

    from flowgrpo.models.config import validate_model_config
    from flowgrpo.run.paths import configs_dir

    model_cfg = validate_model_config(OmegaConf.to_container(OmegaConf.load(configs_dir() / "models" / f"{model_name}.yaml")))
    if finetune:
        model_cfg.finetune = finetune
    arch = ROOT / "configs" / "models" / "architectures" / model_name / "transformer.json"
    torch.cuda.reset_peak_memory_stats()
    started = time.time()
    transformer, dtype = build(model_cfg, arch, device)
    torch.cuda.synchronize()
    out = {"model": model_name, "finetune": model_cfg.finetune, "gpu": torch.cuda.get_device_name(),
           "params": sum(p.numel() for p in transformer.parameters()),
           "trainable": sum(p.numel() for p in transformer.parameters() if p.requires_grad),
           "build_s": round(time.time() - started, 1), "weights_bytes": torch.cuda.memory_allocated(),
           "activations": {}}
    trainable = [p for p in transformer.parameters() if p.requires_grad]
    for checkpointing in (True, False):
        if checkpointing:
            transformer.enable_gradient_checkpointing()
        else:
            transformer.disable_gradient_checkpointing()
        for b in micro_batches:
            kwargs = inputs(model_cfg, transformer, b, device, dtype)
            for p in trainable:  # the gradients exist before: the peak is the activations' alone
                p.grad = torch.zeros_like(p)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            try:
                with torch.autocast("cuda", dtype=dtype):
                    result = transformer(**kwargs, return_dict=False)[0]
                result.float().square().mean().backward()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - before
                out["activations"][f"{'ckpt' if checkpointing else 'full'}_b{b}"] = peak / b
            except torch.OutOfMemoryError:
                out["activations"][f"{'ckpt' if checkpointing else 'full'}_b{b}"] = "out of memory"
            del kwargs
            result = None
            for p in trainable:
                p.grad = None
            torch.cuda.empty_cache()
    # gradients + AdamW moments: one step on gradients of the trainable parameters' dtype
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer = torch.optim.AdamW(trainable, lr=1e-6)
    optimizer.step()
    torch.cuda.synchronize()
    out["grads_and_optimizer_bytes"] = torch.cuda.memory_allocated() - out["weights_bytes"]
    return out


def plan_for_bench(model_name: str, finetune: str | None = None) -> dict:
    """The plan's line items for one process of ``configs/models/<model_name>.yaml`` (printed beside what
    :func:`measure` measures)."""
    from omegaconf import OmegaConf

    from flowgrpo.memory import plan, read_architecture
    from flowgrpo.models.config import validate_model_config
    from flowgrpo.run.paths import configs_dir

    cfg = validate_model_config(OmegaConf.to_container(OmegaConf.load(configs_dir() / "models" / f"{model_name}.yaml")))
    p = plan(read_architecture(cfg, model_name), cfg, finetune=finetune, copies=(), name=model_name)
    return {"weights_bytes": p.weights + p.buffers, "grads_and_optimizer_bytes": p.gradients + p.optimizer,
            "activations": {"ckpt": p.activations_per_sample["checkpointing"],
                            "full": p.activations_per_sample["no checkpointing"]},
            "params": p.params["transformer"], "trainable": p.trainable_params}


def compare(row: dict) -> list[str]:
    """Lines of measured / planned for one measured row (the plan of flowgrpo/memory/, one process)."""
    from omegaconf import OmegaConf

    from flowgrpo.memory import planned_families
    from flowgrpo.run.paths import configs_dir

    family = OmegaConf.load(configs_dir() / "models" / f"{row['model']}.yaml").family
    if family not in planned_families():  # measured only: the plan has no activation inventory for this family
        return [f"{row['model']} ({row['finetune']}), GiB measured (no plan for the {family} family): weights "
                f"{row['weights_bytes'] / GIB:.2f}, gradients and optimizer {row['grads_and_optimizer_bytes'] / GIB:.2f}, "
                "activations " + ", ".join(f"{k} {v if isinstance(v, str) else f'{v / GIB:.2f}'}"
                                           for k, v in row["activations"].items())]
    plan = plan_for_bench(row["model"], row["finetune"])
    lines = [f"{row['model']} ({row['finetune']}), GiB measured / planned:"]
    for key in ("weights_bytes", "grads_and_optimizer_bytes"):
        lines.append(f"  {key.removesuffix('_bytes'):<22} {row[key] / GIB:7.2f} / {plan[key] / GIB:7.2f} = {row[key] / plan[key]:.2f}")
    for key, measured in row["activations"].items():
        planned = plan["activations"][key.split("_")[0]]
        if isinstance(measured, str):
            lines.append(f"  activations {key:<10} {measured} / {planned / GIB:7.2f}")
        else:
            lines.append(f"  activations {key:<10} {measured / GIB:7.2f} / {planned / GIB:7.2f} = {measured / planned:.2f}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", nargs="+", default=["sd3_5_medium"])
    parser.add_argument("--finetune", default=None, choices=["lora", "full"])
    parser.add_argument("--micro-batches", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--attention", default="auto", choices=["auto", "no-cudnn"],
                        help="no-cudnn: PyTorch SDPA without its cuDNN kernel (flash / memory-efficient only)")
    parser.add_argument("--compare", type=Path, default=None,
                        help="print a measured JSON file (--out) beside the memory plan; no GPU needed")
    args = parser.parse_args(argv)
    if args.compare:
        for row in json.loads(args.compare.read_text()):
            print("\n".join(compare(row)))
        return 0
    if args.attention == "no-cudnn":
        torch.backends.cuda.enable_cudnn_sdp(False)
    if not torch.cuda.is_available():
        print("bench_memory needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for name in args.model:
        row = measure(name, args.finetune, args.micro_batches)
        rows.append(row)
        print(json.dumps(row), flush=True)
        print("\n".join(compare(row)), flush=True)
        torch.cuda.empty_cache()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
