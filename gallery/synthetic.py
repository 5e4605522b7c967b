"""Synthetic run directories in the run-directory format, for the gallery's tests, benchmark and docs.

    from gallery.synthetic import write_run
    write_run("/tmp/run", steps=5, prompts_per_step=8, per_prompt=4)     # 160 samples

Writes config.yaml, metrics.jsonl and samples/step_<n>/manifest.jsonl with PNGs (coloured shapes
whose reward rises with the step, so charts and sorting have something to show); optionally tree
groups (shared parents, as BranchGRPO writes them), an evaluation step, large images (thumbnails)
and MP4 videos (needs imageio-ffmpeg). Imports nothing from the training code.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

COLORS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 40),
          "purple": (140, 60, 190), "orange": (240, 140, 30)}
SHAPES = ("circle", "square", "triangle")
TASKS = ("single_object", "two_objects", "counting", "colors", "position", "color_attr")


def prompt_for(i: int) -> tuple[str, dict]:
    """A toy-world-like prompt and its metadata (task, clauses) for prompt number ``i``."""
    color, shape = list(COLORS)[i % len(COLORS)], SHAPES[i // len(COLORS) % len(SHAPES)]
    task = TASKS[i % len(TASKS)]
    count = 1 + i % 4
    text = {"counting": f"a photo of {count} {shape}s", "colors": f"a photo of a {color} {shape}",
            "position": f"a photo of a {color} {shape} left of a blue square",
            "two_objects": f"a photo of a {shape} and a square", "color_attr": f"a photo of a {color} {shape} and a green circle",
            }.get(task, f"a photo of a {shape}")
    return text, {"task": task, "clauses": [{"shape": shape, "color": color, "count": count}], "novel": i % 5 == 0}


def draw(size: int, color: tuple, shape: str, count: int, seed: int) -> bytes:
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    im = Image.new("RGB", (size, size), (245, 245, 240))
    d = ImageDraw.Draw(im)
    r = size // 8
    for _ in range(count):
        x, y = rng.randint(r, size - r), rng.randint(r, size - r)
        box = (x - r, y - r, x + r, y + r)
        if shape == "circle":
            d.ellipse(box, fill=color)
        elif shape == "square":
            d.rectangle(box, fill=color)
        else:
            d.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=color)
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def write_mp4(path: Path, size: int = 64, frames: int = 12, seed: int = 0) -> None:
    """A short H.264 (yuv420p) clip of a moving square: plays in Chromium."""
    import imageio.v2 as imageio
    import numpy as np

    rng = np.random.default_rng(seed)
    color = rng.integers(40, 230, 3)
    with imageio.get_writer(path, fps=8, codec="libx264", macro_block_size=16,
                            ffmpeg_params=["-pix_fmt", "yuv420p"], ffmpeg_log_level="error") as w:
        for t in range(frames):
            frame = np.full((size, size, 3), 240, np.uint8)
            x = int(t * (size - 16) / max(frames - 1, 1))
            frame[size // 2 - 8: size // 2 + 8, x: x + 16] = color
            w.append_data(frame)


def write_run(run_dir, steps: int = 3, prompts_per_step: int = 4, per_prompt: int = 4, image_size: int = 64,
              every: int = 10, tree: bool = False, eval_step: bool = False, video: bool = False,
              distinct_images: int | None = None, prompts: list[tuple[str, dict]] | None = None,
              group_size: int | None = None, alarm_from: int | None = None) -> Path:
    """Write a run directory; returns it. ``distinct_images`` reuses that many PNGs' bytes (fast for big runs).
    ``alarm_from``: from this iteration on, each evaluation logs the held-out guard and one watch alarm (the
    synthetic held-out reward falls while the training reward rises: a hack's shape).
    ``group_size`` (default ``per_prompt``): samples per training group, of which the first ``per_prompt`` are
    saved; the manifest's group_size and group_rewards cover all of them, as flowgrpo.run.run_dir writes them."""
    group_size = group_size or per_prompt
    run = Path(run_dir)
    (run / "samples").mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text("run_name: synthetic\nsampling:\n  method: " + ("branchgrpo" if tree else "flow_grpo") + "\n")
    pool: dict[int, bytes] = {}
    with open(run / "metrics.jsonl", "w") as f:
        for it in range(1, steps * every + 1):
            mean = 0.3 + 0.4 * it / (steps * every)
            row = {"iteration": it, "loss": 0.01 / it, "approx_kl": 1e-4 * it, "grad_norm": 0.01, "lr": 3e-4,
                   "reward/toy_mean": mean, "reward/toy_std": 0.2, "advantage/abs_mean": 0.8, "time/iteration": 11.0,
                   "eval/mean_score": None}
            if it % every == 0:
                row["eval/mean_score"] = mean - 0.05 * it / (steps * every)
                row["eval/per_task/counting"] = mean - 0.1
                if alarm_from is not None:
                    row["guard/held_out"] = row["eval/mean_score"]
                    row["watch/alarms"] = int(it >= alarm_from)
            f.write(json.dumps(row) + "\n")
    folders = [(f"step_{(k + 1) * every}", (k + 1) * every) for k in range(steps)]
    if eval_step:
        folders.insert(0, ("eval_0", 0))
    for name, it in folders:
        folder = run / "samples" / name
        folder.mkdir(exist_ok=True)
        lines = []
        for p in range(prompts_per_step):
            slot = p if name.startswith("eval") else (it // every * 7 + p) % 97
            text, meta = prompts[slot % len(prompts)] if prompts else prompt_for(slot)
            clause = meta["clauses"][0] if meta.get("clauses") else {"color": "red", "shape": "circle", "count": 1}
            rewards = [round(min(1.0, max(0.0, 0.3 + 0.4 * it / (steps * every) + 0.3 * ((j * 37 + p * 11) % 10 / 10 - 0.5))), 4)
                       for j in range(max(group_size, per_prompt))]
            whole = {}
            if not name.startswith("eval"):  # an evaluation group is one prompt's samples, no advantage
                mean = sum(rewards[:group_size]) / group_size
                std = (sum((r - mean) ** 2 for r in rewards[:group_size]) / group_size) ** 0.5
                whole = {"group_size": group_size,
                         "group_rewards": {"toy": {"mean": mean, "std": std, "n": group_size},
                                           "aesthetic": {"mean": 5 + mean, "std": std, "n": group_size}}}
            for j in range(per_prompt):
                node = (per_prompt // 2 + 1 + j) if tree else (j + 1) * 10
                parent = (1 + j // 2) if tree else node - 1
                seed = it * 1000 + p * 10 + j
                reward = rewards[j]
                file = f"s{slot:04d}_n{node:04d}" + (".mp4" if video else ".png")
                if name.startswith("eval"):  # as RunWriter.write_eval_samples: one root per sample, no tree
                    node, parent, file = 0, -1, f"e{p * per_prompt + j:04d}" + (".mp4" if video else ".png")
                if video:
                    write_mp4(folder / file, size=image_size, seed=seed)
                else:
                    key = seed % distinct_images if distinct_images else seed
                    if key not in pool:
                        pool[key] = draw(image_size, COLORS[clause.get("color") or "red"], clause.get("shape") or "circle",
                                         int(clause.get("count") or 1), seed)
                    (folder / file).write_bytes(pool[key])
                lines.append(json.dumps({
                    "prompt": text, "metadata": meta, "seed": 0, "noise_seed": seed, "iteration": it,
                    "prompt_slot": slot, "group": p, **whole,
                    "node": node, "parent": parent, "rewards": {"toy": reward, "aesthetic": round(5 + reward, 3)},
                    "advantage": round((reward - 0.5) * 3, 4), "file": file}))
        (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return run
