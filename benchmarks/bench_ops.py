"""Benchmark of the fused transition op against the eager PyTorch reference and torch.compile.

    python benchmarks/bench_ops.py                  # CPU, 1 thread, every size, with torch.compile
    python benchmarks/bench_ops.py --threads 2 --no-compile --device cuda

Workloads (per batch of N transitions, latents [N, *latent]):
  lp        log_prob of x' under μ = a·x + b·v                        (inputs x, v, x')
  guard+kl  log_prob, GRPO-Guard log ρ̂, exact log-ratio and KL      (+ μ_old float32, μ_ref float32)
Modes: "fwd" under no_grad; "fwd+bwd" with the gradient to v (the learner's case).
Backends: "eager" = ops.transition_terms(backend="reference"), the PyTorch specification as the
learner would run it; "compile" = the same function under torch.compile (compile time excluded;
the reference's data-dependent std > 0 check splits it into two graphs); "fused" = the C++/CUDA
op. Printed: best-of-repetitions milliseconds and the ratios eager/fused and compile/fused. On
CUDA, also the fused op's kernel time (the CUDA kernels' own time per call, from the profiler, over a
burst of calls) and its achieved bandwidth (bytes it must move / kernel time) as a share of the
device-to-device copy bandwidth measured at the start (bytes read and written by a 1 GiB copy). The
millisecond columns are wall time per call, host launch included: on an H200 every size up to an
image micro-batch of 64 took ~0.1-0.7 ms of wall time for ~10 µs of data movement (2026-11-27,
docs/results/real_size_gpu.md), so the kernel column is the one that measures the kernels.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flowgrpo import likelihood as ops  # noqa: E402

SIZES = {  # name: (latent shape, batch sizes)
    "tiny 4x16x16": ((4, 16, 16), (8, 64)),
    "image 16x64x64": ((16, 64, 64), (1, 8, 32, 64)),  # 64: the presets' train.micro_batch at 512 px
    "video 16x13x60x104": ((16, 13, 60, 104), (1, 2)),
}


def make_inputs(latent, n, dtype, device, workload, grad):
    g = torch.Generator().manual_seed(0)

    def randn():
        return torch.randn((n, *latent), generator=g).to(device)

    sigma = torch.linspace(0.9, 0.3, n)
    a, b, std = ops.transition_coefficients("flow_sde", sigma, sigma - 0.1, 0.7, device=device)
    x, v = randn().to(dtype), randn().to(dtype)
    x_next = randn().to(dtype)
    kw = {}
    if workload == "guard+kl":
        kw = dict(mu_old=randn(), mu_ref=randn())  # stored means: float32
    if grad:
        v.requires_grad_()
    return (x, v, x_next, a, b, std), kw


def terms_fn(backend):
    def fn(x, v, x_next, a, b, std, **kw):
        t = ops.transition_terms(x, v, x_next, a, b, std, backend=backend, **kw)
        out = t.log_prob.sum()
        if t.guard is not None:
            out = out + t.guard.sum() + t.log_ratio.sum() + t.kl.sum()
        return out

    return fn


def timeit(fn, args, kw, grad, device, min_time=0.5, max_reps=200):
    """Best of the repetitions (≥ 5, ≥ min_time s): this machine shares its memory bus with other
    jobs, and the best time is the reproducible one; every backend is measured the same way."""
    def once():
        if grad:
            out = fn(*args, **kw)
            (g,) = torch.autograd.grad(out, args[1])
            return g
        with torch.no_grad():
            return fn(*args, **kw)

    for _ in range(2):
        once()
    times = []
    start = time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < min_time and len(times) < max_reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        once()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def copy_bandwidth(device, gib: float = 1.0) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + written), best of 10 copies of ``gib`` GiB."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e-3)
    return 2 * src.numel() / best


def kernel_ms(fn, args, kw, grad, calls: int = 20) -> float:
    """The CUDA kernels' own time per call (ms), summed over the kernels a burst of ``calls`` launched."""
    from torch.profiler import ProfilerActivity, profile

    def once():
        if grad:
            out = fn(*args, **kw)
            return torch.autograd.grad(out, args[1])
        with torch.no_grad():
            return fn(*args, **kw)

    once()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            once()
        torch.cuda.synchronize()
    total_us = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0 and e.device_type.name == "CUDA")
    return total_us / calls * 1e-3


def peak_bandwidth(device) -> float | None:
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", None)
    bus_bits = getattr(props, "memory_bus_width", None)
    if clock_khz and bus_bits:
        return 2.0 * clock_khz * 1e3 * bus_bits / 8.0  # double data rate
    known = {"H100 80GB HBM3": 3.35e12, "H100 PCIe": 2.0e12, "H200": 4.8e12, "A100-SXM4-80GB": 2.04e12}
    return next((bw for name, bw in known.items() if name in props.name), None)


def bytes_moved(args, kw, grad):
    """What the fused op must read and write: each latent input once (forward), plus once more and
    the v gradient written (backward)."""
    x, v, x_next = args[:3]
    inputs = [x, v, x_next] + list(kw.values())
    read = sum(t.numel() * t.element_size() for t in inputs)
    return read + (read + v.numel() * v.element_size() if grad else 0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (torch.set_num_threads)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), help=f"subset of {list(SIZES)}")
    parser.add_argument("--dtypes", nargs="*", default=["fp32", "bf16"])
    parser.add_argument("--workloads", nargs="*", default=["lp", "guard+kl"])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch._dynamo.config.recompile_limit = 256  # one graph per shape and dtype (dynamic=False)
    # the reference's std > 0 check (samplers.kernels.log_prob) is a graph break; say it once here
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    device = torch.device(args.device)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    ops.build()
    print(f"# device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else f'{args.threads} thread(s)'}), torch {torch.__version__}")
    peak = copy_bandwidth(device) if device.type == "cuda" else None
    if peak:
        spec = peak_bandwidth(device)
        print(f"# device-to-device copy: {peak / 1e9:.0f} GB/s read + written"
              + (f" ({peak / spec:.0%} of the {spec / 1e9:.0f} GB/s the device reports)" if spec else ""))
    compiled = {}
    header = f"{'size':20s} {'N':>3s} {'dtype':5s} {'workload':9s} {'mode':8s} {'eager ms':>9s} {'compile ms':>10s} {'fused ms':>9s} {'eager/fused':>11s} {'compile/fused':>13s}"
    if peak:
        header += f" {'kernel ms':>9s} {'GB/s':>7s} {'of copy':>7s}"
    print(header)
    for size in args.sizes:
        latent, batches = SIZES[size]
        for n in batches:
            for dname in args.dtypes:
                for workload in args.workloads:
                    for grad in (False, True):
                        inputs, kw = make_inputs(latent, n, dtypes[dname], device, workload, grad)
                        eager = timeit(terms_fn("reference"), inputs, kw, grad, device)
                        fused = timeit(terms_fn("fused"), inputs, kw, grad, device)
                        comp = float("nan")
                        if not args.no_compile:
                            key = (workload, grad)
                            if key not in compiled:
                                compiled[key] = torch.compile(terms_fn("reference"), dynamic=False)
                            t0 = time.perf_counter()
                            timeit(compiled[key], inputs, kw, grad, device, min_time=0, max_reps=1)
                            first = time.perf_counter() - t0
                            comp = timeit(compiled[key], inputs, kw, grad, device)
                            if first > 2.0:
                                print(f"#   (torch.compile first calls: {first:.1f} s)")
                        line = (f"{size:20s} {n:3d} {dname:5s} {workload:9s} {'fwd+bwd' if grad else 'fwd':8s} "
                                f"{eager:9.3f} {comp:10.3f} {fused:9.3f} {eager / fused:10.2f}x {comp / fused:12.2f}x")
                        if peak:
                            kernel = kernel_ms(terms_fn("fused"), inputs, kw, grad)
                            bw = bytes_moved(inputs, kw, grad) / (kernel * 1e-3)
                            line += f" {kernel:9.4f} {bw / 1e9:7.0f} {bw / peak:6.0%}"
                        print(line, flush=True)


if __name__ == "__main__":
    main()
