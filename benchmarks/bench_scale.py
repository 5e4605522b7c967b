"""Training at real size on one GPU: seconds per iteration by phase, images per second, peak memory and MFU.

    python benchmarks/bench_scale.py --model sd3_5_medium [--preset flow_grpo] [--iterations 2] [--warmup 1]
        [--weights random|pretrained] [--out FILE.json] [key=value ...]

Trains the model config (random weights of the real architecture by default: ``model.random_weights=true``, no
download) with the preset at the model config's own resolution, steps, guidance and the preset's group, with a
model-free reward (JPEG compressibility; per frame for video), no evaluation and no checkpoints, for
``--warmup`` iterations (compilation, allocator, cuDNN autotuning) and then ``--iterations`` measured ones.
For each measured iteration the training loop's own metrics give the phases:

  sample      rollout, text encoding and decoding included (time/sample), of which the transformer's calls
              (time/model_sample)
  score       waiting for the rewards and computing advantages (time/score_wait_and_advantage)
  update      the learner's optimizer steps (time/update), of which the transformer's forward and backward calls

and this script adds images per second per GPU (the iteration's samples on this process / its seconds), the peak
GPU memory (``torch.cuda.max_memory_allocated``) and the model-FLOP utilisation of the transformer calls:

  MFU = FLOPs / (seconds × peak)   FLOPs of one network pass on one sample, counted by
                                    ``torch.utils.flop_counter``, times the passes the model's call timer counted
                                    in the phase (a CFG call is two), and for the update twice more for the
                                    backward of the passes with gradient; gradient checkpointing's recompute is
                                    not counted; peak = this device's measured dense matmul rate in the dtype
                                    the calls run in (the trainer's own log.mfu code, flowgrpo/engine/throughput.py)

Prints one JSON row per measured iteration and a summary; ``--out`` writes them. Runs on the CPU too (the
tests run it on the tiny model), where the peak is the CPU's float32 matmul rate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from flowgrpo.engine.throughput import Throughput  # noqa: E402  (the trainer's log.mfu numbers)
from flowgrpo.memory.check import run_plan  # noqa: E402
from flowgrpo.memory.plan import planned_families  # noqa: E402


def configure(args) -> list[str]:
    settings = {
        "eval.every": 0, "eval.at_start": "false", "log.samples_every": 0, "log.save_every": 0, "log.progress": "false",
        "log.tensorboard": "false", "log.grad_noise_every": 0, "log.eval_samples": 0, "resume": "false",
        # more than are run (the loop is driven here, step by step): the last iteration's evaluation never starts
        "train.iterations": args.warmup + args.iterations + 1000, "output_dir": args.output_dir,
    }
    if args.weights == "random":
        settings["model.random_weights"] = "true"
    return [f"{k}={v}" for k, v in settings.items()] + list(args.overrides)


def run(args) -> dict:
    from flowgrpo.config import load_config
    from flowgrpo.engine.trainer import Trainer
    from flowgrpo.models.families import FAMILIES

    probe = load_config(args.preset, args.model, configure(args))
    video = FAMILIES[probe.model.family].modality == "video"
    reward = ({"rewards": [{"name": "per_frame", "kwargs": {"reward": "jpeg_compressibility"}}]} if video
              else {"rewards": [{"name": "jpeg_compressibility"}]})
    cfg = load_config(args.preset, args.model, configure(args) + ["allow_config_change=true"], base=reward,
                      default="default_t2v" if video else "default")
    trainer = Trainer(cfg)
    model, device = trainer.model, trainer.model.device
    # the trainer's own log.mfu numbers (flowgrpo/engine/throughput.py): one FLOP count and one peak for both; on the
    # CPU, where the trainer counts images only, measured here too (the peak is then the CPU's float32 matmul rate)
    throughput = trainer.throughput
    if throughput is None or not throughput.mfu:
        throughput = trainer.throughput = Throughput(model, cfg.train.mixed_precision, mfu=True)
    timer, rows, marks, warmup = model.call_timer, [], {}, []
    update = trainer.learner.update

    def marked_update(rollouts):  # the network rows of the update phase start here
        marks["update"] = timer.totals()
        return update(rollouts)

    trainer.learner.update = marked_update
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for iteration in range(args.warmup + args.iterations):
        before = timer.totals()
        metrics = trainer.step(iteration)
        if iteration < args.warmup:  # compilation (model.compile), allocator, autotuning
            warmup.append(metrics["time/iteration"])
            print(json.dumps({"warmup_iteration": iteration, "seconds": metrics["time/iteration"]}), flush=True)
            continue
        after = timer.totals()
        # network rows (a CFG call counts its two passes) by phase: sampling's before the update began, the update's
        # after (with gradient, and without: the old policy's, the reference's, an EMA's)
        mid = marks["update"]
        sampling, updating = timer.delta(mid, before), timer.delta(after, mid)
        leaves = trainer.schedule.plan(iteration).counts()["leaves"] * cfg.train.prompts_per_iteration // trainer.world
        perf = throughput.metrics(leaves, metrics["time/iteration"], sampling, updating)
        rows.append({
            "iteration": iteration, "seconds": metrics["time/iteration"],
            "sample_s": metrics["time/sample"], "sample_model_s": metrics["time/model_sample"],
            "score_s": metrics["time/score_wait_and_advantage"], "update_s": metrics["time/update"],
            "update_model_s": updating["total"], "images": leaves,
            "network_rows": {"sample": sampling["rows_no_grad"] + sampling["rows_grad"],
                             "update": updating["rows_grad"] + updating["rows_no_grad"], "grad": updating["rows_grad"]},
            "images_per_s_per_gpu": perf["perf/images_per_s_per_gpu"],
            "mfu_sample": perf["perf/mfu_sample"], "mfu_train": perf["perf/mfu_train"],
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
            # the rollout's log-probs against the first training pass's (0 unless a lever changes the arithmetic)
            **{k: metrics[k] for k in ("max_abs_ratio_minus_1_epoch0",) if k in metrics},
        })
        print(json.dumps(rows[-1]), flush=True)
    planned = None
    if cfg.model.family in planned_families():  # the memory plan of this very iteration, beside the measured peak
        first = trainer.schedule.plan(0)
        total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 80 * 2**30
        planned = run_plan(cfg, model, trainer.world, False, first.counts()["leaves"], first.num_steps, total).total / 2**30
    trainer.scoring.close()
    trainer.writer.close()
    summary = {"model": args.model, "preset": args.preset or "default", "device": torch.cuda.get_device_name() if
               device.type == "cuda" else "cpu", "dtype": str(model.dtype), "weights": args.weights,
               "matmul_peak_tflops": throughput.peak / 1e12,
               "levers": {"model.compile": cfg.model.compile, "model.compile_mode": cfg.model.compile_mode,
                          "sampling.merge_lora": cfg.sampling.merge_lora,
                          "model.attention_backend": cfg.model.attention_backend}, "flops_per_pass": throughput.flops, "leaves_per_prompt": trainer.schedule.plan(0).counts()["leaves"],
               "prompts_per_iteration": cfg.train.prompts_per_iteration, "planned_peak_gib": planned,
               "warmup_seconds": warmup, "iterations": rows}
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model config name (configs/models/)")
    parser.add_argument("--preset", default=None, help="a method preset (default: the default config's method)")
    parser.add_argument("--iterations", type=int, default=2, help="measured iterations (default 2)")
    parser.add_argument("--warmup", type=int, default=1, help="iterations before measuring (default 1)")
    parser.add_argument("--weights", choices=["random", "pretrained"], default="random",
                        help="random: the real architecture with random weights, no download (default)")
    parser.add_argument("--output-dir", default="runs/bench_scale", help="the run folder's parent (default runs/bench_scale)")
    parser.add_argument("--out", type=Path, default=None, help="write the summary JSON here")
    parser.add_argument("overrides", nargs="*", help="config overrides key=value")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.warmup < 1:
        parser.error("--iterations and --warmup must be >= 1 (the first measured iteration needs the counts before it)")
    summary = run(args)
    rows = summary["iterations"]
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in ("seconds", "images_per_s_per_gpu", "mfu_sample", "mfu_train")}
    print(f"{summary['model']} {summary['preset']} on {summary['device']}: {mean['seconds']:.2f} s/iteration, "
          f"{mean['images_per_s_per_gpu']:.2f} images/s/GPU, MFU sampling {mean['mfu_sample']:.1%}, training "
          f"{mean['mfu_train']:.1%} (peak {summary['matmul_peak_tflops']:.3g} TFLOP/s measured); warm-up "
          f"{sum(summary['warmup_seconds']):.1f} s; peak memory {rows[-1]['peak_memory_gib'] or 0:.1f} GiB, planned "
          f"{summary['planned_peak_gib'] or 0:.1f} GiB")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
