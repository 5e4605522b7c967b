"""What a run gets out of its device (``log.mfu``): images per second per GPU, and on a GPU the model-FLOP
utilisation (MFU) of the denoising network's calls in sampling and in training.

    MFU = FLOPs / (seconds × peak)   FLOPs of one network pass on one sample, counted once per run by
                                      ``torch.utils.flop_counter`` (not estimated), times the network rows the
                                      model's call timer counted in the phase (a CFG call is two rows); in
                                      training the rows with gradient count three times (forward and backward);
                                      gradient checkpointing's recompute is not counted; seconds are the call
                                      timer's (inside the network's calls); peak = this device's dense matrix-
                                      product rate in the dtype the calls run in, measured once at the start

The trainer logs ``perf/images_per_s_per_gpu`` every iteration and, on a GPU, ``perf/mfu_sample`` and
``perf/mfu_train``; ``benchmarks/bench_scale.py`` reports the same numbers per phase.
"""

from __future__ import annotations

import time

import torch


def matmul_peak(device: torch.device, dtype: torch.dtype, size: int = 8192, repeats: int = 20) -> float:
    """The measured dense matrix-product FLOP/s of ``device`` in ``dtype`` (MFU's denominator); on the CPU a
    float32 product of 1024 (a rough figure: MFU is a GPU measure)."""
    if device.type == "cpu":
        size, repeats, dtype = 1024, 5, torch.float32
    generator = torch.Generator(device=device).manual_seed(0)  # the run's own random streams stay untouched
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    for _ in range(3):
        a @ b
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def flops_per_pass(model) -> float:
    """FLOPs of one network pass on one sample at the model's configured size, counted by torch.utils.flop_counter
    on one conditional call (a CFG call is two such passes). Outside the call timer's sums: the count is not a
    phase's work."""
    from torch.utils.flop_counter import FlopCounterMode

    cond = model.encode_prompts(["a photo of a cat"])
    x = torch.zeros((1, *model.latent_shape()), device=model.device)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), model.call_timer.paused(), counter:
        model.velocity(x, torch.tensor([0.5], device=model.device), cond, 1.0)  # guidance 1: one pass
    return float(counter.get_total_flops())


def compute_dtype(model, mixed_precision: str) -> torch.dtype:
    """The dtype the network's matrix products run in: accelerate's autocast dtype, else the weights'."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed_precision, model.dtype)


class Throughput:
    """``log.mfu``'s per-iteration numbers (see the module docstring). On a GPU, building it counts one pass's
    FLOPs and measures the device's peak (well under a second); on the CPU it only counts images, unless ``mfu``."""

    def __init__(self, model, mixed_precision: str, mfu: bool | None = None):
        self.mfu = model.device.type == "cuda" if mfu is None else mfu  # mfu=True: on the CPU too (bench_scale)
        self.flops = flops_per_pass(model) if self.mfu else 0.0
        self.peak = matmul_peak(model.device, compute_dtype(model, mixed_precision)) if self.mfu else 0.0

    def metrics(self, images: int, seconds: float, sampling: dict, updating: dict) -> dict:
        """The iteration's ``perf/`` metrics from its images on this process, its seconds and the call timer's
        deltas of its sampling and update phases (``CallTimer.delta``)."""
        out = {"perf/images_per_s_per_gpu": images / max(seconds, 1e-9)}
        if self.mfu:
            sampled = sampling["rows_grad"] + sampling["rows_no_grad"]
            trained = updating["rows_no_grad"] + 3 * updating["rows_grad"]
            out["perf/mfu_sample"] = self.flops * sampled / max(sampling["total"], 1e-9) / self.peak
            out["perf/mfu_train"] = self.flops * trained / max(updating["total"], 1e-9) / self.peak
        return out


__all__ = ["Throughput", "compute_dtype", "flops_per_pass", "matmul_peak"]
