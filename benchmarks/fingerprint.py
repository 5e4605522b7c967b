"""Behaviour fingerprints: is a refactoring bit-identical? Run the same short trainings on two checkouts and compare.

    python benchmarks/fingerprint.py --out runs/fingerprint-before.json            # on the old commit
    python benchmarks/fingerprint.py --out runs/fingerprint-after.json             # on the new one
    python benchmarks/fingerprint.py --compare runs/fingerprint-before.json runs/fingerprint-after.json

Each case trains ``--iterations`` (5) iterations with its seed and one thread, then records every
``metrics.jsonl`` row with the clock's fields left out (``time/*``, ``perf/*``, ``eval/seconds``) and the SHA-256 of every
tensor of the last checkpoint's ``tensors.safetensors`` (the trained weights, the optimizer state and every
kept copy of the weights) and of every file of its ``model/`` folder (the exported LoRA or weights; a
safetensors file by its tensors and metadata, whose order in the header varies from one process to the next). The cases are
the image default (DiffusionNFT), a transition preset (flow_grpo), a tree preset (branchgrpo), the two other
forward-process learners (awm, dgpo) and the analytic world.
The script runs the training entry point as a subprocess and reads only the run folder, so it runs
unchanged on any checkout that has these entry points.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    "default": [],
    "flow_grpo": ["--preset", "flow_grpo", "sampling.plan.group_size=4", "train.prompts_per_iteration=4"],
    "branchgrpo": ["--preset", "branchgrpo", "train.prompts_per_iteration=4"],
    "awm": ["--preset", "awm", "sampling.plan.group_size=4", "train.prompts_per_iteration=4"],
    "dgpo": ["--preset", "dgpo", "sampling.plan.group_size=4", "train.prompts_per_iteration=4"],
    "analytic": ["--config", "configs/analytic.yaml"],
}


def tensor_hashes(path: Path) -> dict[str, str]:
    """SHA-256 of every tensor's bytes (with its dtype and shape) in a safetensors file."""
    import torch
    from safetensors.torch import load_file

    out = {}
    for name, value in sorted(load_file(path).items()):
        data = value.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        out[name] = hashlib.sha256(f"{value.dtype}{tuple(value.shape)}".encode() + data).hexdigest()
    return out


def file_hash(path: Path) -> str:
    """A file's SHA-256; a safetensors file's over its sorted metadata and its tensors' hashes."""
    if path.suffix != ".safetensors":
        return hashlib.sha256(path.read_bytes()).hexdigest()
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        metadata = json.dumps(f.metadata() or {}, sort_keys=True)
    return hashlib.sha256((metadata + json.dumps(tensor_hashes(path))).encode()).hexdigest()


def is_time_field(key: str) -> bool:
    """A field measured with the clock (wall times, and the throughput and MFU derived from them)."""
    return key.startswith(("time/", "perf/")) or key == "time" or key.endswith("/seconds")


def run_case(name: str, extra: list[str], iterations: int, root: Path, train: bool = True) -> dict:
    run_name = f"fingerprint-{name}"
    command = [sys.executable, "train_t2i.py", *extra, f"train.iterations={iterations}", f"run_name={run_name}",
               f"output_dir={root}", "log.progress=false", "log.gallery=false", "log.tensorboard=false",
               f"log.save_every={iterations}", "threads=1"]
    started = time.time()
    if train:
        shutil.rmtree(root / run_name, ignore_errors=True)
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if done.returncode != 0:
            raise SystemExit(f"{name}: {' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    run = root / run_name
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [{k: v for k, v in row.items() if not is_time_field(k)} for row in rows]
    step = run / "checkpoints" / f"step_{iterations}"
    files = {str(p.relative_to(step / "model")): file_hash(p) for p in sorted((step / "model").rglob("*")) if p.is_file()}
    print(f"{name}: {len(rows)} metric rows, {time.time() - started:.0f} s", flush=True)
    return {"command": command[1:], "metrics": rows, "tensors": tensor_hashes(step / "tensors.safetensors"),
            "model_files": files}


def compare(a: dict, b: dict) -> int:
    failures = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in one file")
            failures += 1
            continue
        x, y = a[name], b[name]
        strip = lambda rows: [{k: v for k, v in r.items() if not is_time_field(k)} for r in rows]  # noqa: E731
        x, y = {**x, "metrics": strip(x["metrics"])}, {**y, "metrics": strip(y["metrics"])}
        same_metrics = x["metrics"] == y["metrics"]
        same_tensors = x["tensors"] == y["tensors"]
        same_files = x["model_files"] == y["model_files"]
        keys = sum(len(r) for r in x["metrics"])
        print(f"{name}: metrics rows {len(x['metrics'])} ({keys} values) {'identical' if same_metrics else 'DIFFER'}; "
              f"checkpoint tensors {len(x['tensors'])} {'identical' if same_tensors else 'DIFFER'}; "
              f"model files {len(x['model_files'])} {'identical' if same_files else 'DIFFER'}")
        if not same_metrics:
            for i, (r, s) in enumerate(zip(x["metrics"], y["metrics"])):
                diff = sorted(k for k in set(r) | set(s) if r.get(k) != s.get(k))
                if diff:
                    print(f"  row {i}: " + ", ".join(f"{k}: {r.get(k)!r} -> {s.get(k)!r}" for k in diff[:8]))
        if not same_tensors:
            diff = sorted(k for k in set(x["tensors"]) | set(y["tensors"]) if x["tensors"].get(k) != y["tensors"].get(k))
            print(f"  tensors differing: {diff[:10]}")
        failures += not (same_metrics and same_tensors and same_files)
    print("bit-identical" if not failures else f"{failures} case(s) differ")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the fingerprints here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--output-dir", type=Path, default=ROOT / "runs")
    parser.add_argument("--read-only", action="store_true", help="read the run folders already in --output-dir, train nothing")
    args = parser.parse_args()
    if args.compare:
        return compare(*(json.loads(p.read_text()) for p in args.compare))
    if not args.out:
        parser.error("give --out FILE (or --compare BEFORE AFTER)")
    result = {name: run_case(name, CASES[name], args.iterations, args.output_dir.resolve(), not args.read_only)
              for name in args.cases.split(",")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
