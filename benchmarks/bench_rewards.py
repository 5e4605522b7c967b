"""Reward scoring throughput on CPU, local vs through the HTTP reward server (loopback).

    python benchmarks/bench_rewards.py [--batch 16] [--image-size 64] [--repeats 3] [--threads 1]

For each reward it prints images/s scored locally (reward(images, prompts)) and remotely
(RemoteReward -> RewardServer on 127.0.0.1 in this process: PNG encoding, HTTP, JSON, decoding,
scoring), best of --repeats after one warm-up. The model rewards are the tiny random-weight builds
of rewards.tiny (same architectures and preprocessing as the originals, ~0.1-2 M parameters), so the
numbers measure the framework's overhead around a model, not a real ViT-H.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rewards import load_reward  # noqa: E402
from rewards.remote import RemoteReward, RewardServer  # noqa: E402


def build_rewards(tmp: Path) -> dict:
    from transformers.utils import logging as hf_logging

    from rewards import tiny
    from rewards.aesthetic import LaionAesthetic
    from rewards.clip_rewards import PickScore
    from rewards.hps import HPSv2
    from rewards.image_reward import ImageReward

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    clip = tiny.tiny_clip_folder(tmp / "clip", image_size=32)
    model, tokenizer, _, _ = tiny.tiny_imagereward_parts()
    return {
        "jpeg_compressibility": load_reward("jpeg_compressibility"),
        "toy": load_reward("toy"),
        "pickscore (tiny)": PickScore(str(clip), str(clip)),
        "aesthetic (tiny)": LaionAesthetic(str(tiny.tiny_aesthetic_pth(tmp / "a.pth", 16)), clip=str(clip)),
        "hpsv2 (tiny)": HPSv2(str(tiny.tiny_hps_checkpoint(tmp / "hps.pt")), arch=tiny.TINY_HPS_ARCH),
        "imagereward (tiny)": ImageReward(model=model, tokenizer_obj=tokenizer),
    }


def best_rate(fn, images, prompts, repeats: int) -> float:
    fn(images, prompts)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(images, prompts)
        best = min(best, time.perf_counter() - start)
    return len(prompts) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from worlds.toy.scenes import eval_prompts, render_prompt

    toy = eval_prompts()[: args.batch]
    prompts = [p.text for p in toy]
    images = torch.stack([torch.from_numpy(render_prompt(p, i)) for i, p in enumerate(toy)]).permute(0, 3, 1, 2)
    images = torch.nn.functional.interpolate(images.float() / 255, size=args.image_size, mode="bilinear").clamp(0, 1)
    print(f"batch {args.batch}, images {args.image_size}x{args.image_size}, torch threads {args.threads}, "
          f"best of {args.repeats}")
    print(f"{'reward':24s} {'local img/s':>12s} {'remote img/s':>13s} {'remote/local':>13s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, reward in build_rewards(Path(tmp)).items():
            local = best_rate(reward, images, prompts, args.repeats)
            with RewardServer(reward, max_batch=args.batch) as server:
                remote = best_rate(RemoteReward(server.url), images, prompts, args.repeats)
            print(f"{name:24s} {local:12.1f} {remote:13.1f} {remote / local:13.2f}")


if __name__ == "__main__":
    main()
