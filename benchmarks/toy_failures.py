"""Where a toy-world policy loses its score: per task, each clause type's credit and the scene sizes.

    flowgrpo eval --seed 12345 [--checkpoint runs/<name>/checkpoints/step_<n>] --save-images DIR
    python benchmarks/toy_failures.py DIR [DIR ...]

Reads the PNGs and manifest.jsonl that ``flowgrpo eval --save-images`` writes (one folder per model,
or the seed_* folders of ``--samples-per-prompt``, pooled), scores them with the `toy` scorer and
prints one table per folder: per task, the mean score, the mean credit of each clause type
(object: the count of each named shape; color; position) and how many detected components the
images hold against the objects the prompt names (fewer, exactly, more; mean extra). A policy that
fills scenes with extra objects shows it in the last columns; one that draws the right objects in
the wrong places, in the position credit (measured: docs/results/toy_failures.md).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from rewards.toy.scorer import ToyScorer
from worlds.toy.scenes import TASKS

CLAUSE_TYPES = ("object", "color", "position")


def read_folder(folder: Path) -> tuple[torch.Tensor, list[str]]:
    """uint8 images [N, 3, H, W] and their prompts from a ``--save-images`` folder (its manifest.jsonl)."""
    from PIL import Image

    manifest = folder / "manifest.jsonl"
    if not manifest.is_file():
        raise SystemExit(f"{folder} has no manifest.jsonl: pass a folder written by flowgrpo eval --save-images")
    rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{manifest} lists no images: save an evaluation into {folder} first")
    missing = [r["file"] for r in rows if not (folder / r["file"]).is_file()]
    if missing:
        raise SystemExit(f"{folder} lacks {len(missing)} of the images its manifest lists (first: {missing[0]}); "
                         "save the evaluation again with flowgrpo eval --save-images")
    if any(not r["file"].endswith(".png") for r in rows):
        raise SystemExit(f"{folder} holds clips, not images: toy_failures reads the image world's evaluations")
    images = [torch.from_numpy(np.array(Image.open(folder / r["file"]).convert("RGB"))).permute(2, 0, 1) for r in rows]
    return torch.stack(images), [r["prompt"] for r in rows]


def failure_table(images: torch.Tensor, prompts: list[str]) -> dict[str, dict]:
    """Per task: {"images", "score", "credit": {clause type: mean}, "fewer", "exact", "more", "extra"}
    (shares of images with fewer / exactly / more components than the prompt names; mean extra)."""
    out = ToyScorer().score_uint8(images, prompts, None)
    rows: dict[str, dict] = defaultdict(lambda: {"scores": [], "credits": defaultdict(list), "extra": []})
    for task, score, clauses, found in zip(out.info["task"], out.scores.tolist(), out.info["clauses"],
                                           out.info["num_detected"]):
        row = rows[task]
        row["scores"].append(score)
        for clause in clauses:
            row["credits"][clause["type"]].append(clause["credit"])
        named = sum(c["count"] for c in clauses if c["type"] == "object")
        row["extra"].append(found - named)
    table = {}
    for task in [t for t in TASKS if t in rows] + sorted(set(rows) - set(TASKS)):
        row, extra = rows[task], np.array(rows[task]["extra"])
        table[task] = {
            "images": len(row["scores"]),
            "score": float(np.mean(row["scores"])),
            "credit": {k: float(np.mean(v)) for k, v in row["credits"].items()},
            "fewer": float((extra < 0).mean()),
            "exact": float((extra == 0).mean()),
            "more": float((extra > 0).mean()),
            "extra": float(extra.mean()),
        }
    return table


def print_table(name: str, table: dict[str, dict]) -> None:
    n = sum(r["images"] for r in table.values())
    mean = sum(r["score"] * r["images"] for r in table.values()) / n
    print(f"\n{name}: {n} images, toy mean {mean:.3f}")
    print("| task | images | score | object | color | position | fewer | exact | more | mean extra components |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for task, r in table.items():
        credit = " | ".join(f"{r['credit'][k]:.2f}" if k in r["credit"] else "–" for k in CLAUSE_TYPES)
        print(f"| {task} | {r['images']} | {r['score']:.3f} | {credit} | {r['fewer']:.0%} | {r['exact']:.0%} | "
              f"{r['more']:.0%} | {r['extra']:+.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders written by flowgrpo eval --save-images")
    args = parser.parse_args()
    for folder in args.folders:
        parts = sorted(folder.glob("seed_*")) if not (folder / "manifest.jsonl").is_file() else [folder]
        if not parts:
            raise SystemExit(f"{folder} has no manifest.jsonl and no seed_* folders: pass a flowgrpo eval --save-images folder")
        loaded = [read_folder(p) for p in parts]
        images = torch.cat([i for i, _ in loaded])
        prompts = [p for _, ps in loaded for p in ps]
        print_table(str(folder), failure_table(images, prompts))


if __name__ == "__main__":
    main()
