"""The run directory (DESIGN.md: the contract between training and review).

runs/<name>/config.yaml                 the resolved config
runs/<name>/metrics.jsonl               one JSON line per logged iteration (+ TensorBoard events in tb/)
runs/<name>/train.log                   start-up arithmetic, warnings (e.g. failed reward calls)
runs/<name>/checkpoints/step_<n>/       written by flowgrpo.checkpoint
runs/<name>/samples/step_<n>/           PNGs and manifest.jsonl: one line per sample with prompt, seed,
                                        group, node/parent, every reward, advantage, file path
Only the main process writes.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch


def _clean(value):
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # NaN / inf as JSON null
    return value


class RunWriter:
    def __init__(self, run_dir: Path, enabled: bool = True, tensorboard: bool = True, wandb: bool = False):
        self.dir, self.enabled = Path(run_dir), enabled
        self.tb = self.wandb = None
        if not enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        if wandb:
            try:
                import wandb as wandb_lib
            except ImportError:
                raise ImportError("log.wandb=true needs the wandb package: pip install wandb (or set log.wandb=false)") from None
            self.wandb = wandb_lib.init(project="flowgrpo", name=self.dir.name, dir=str(self.dir))
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(self.dir / "tb"))
            except ImportError:
                self.warn("tensorboard is not installed: metrics go to metrics.jsonl only (pip install tensorboard)")

    def _line(self, text: str) -> None:
        if self.enabled:
            with open(self.dir / "train.log", "a") as f:
                f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

    def info(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stderr)
            self._line(text)

    def warn(self, text: str) -> None:
        if self.enabled:
            print(f"warning: {text}", file=sys.stderr)
            self._line(f"WARNING {text}")

    def write_config(self, yaml_text: str) -> None:
        if self.enabled:
            (self.dir / "config.yaml").write_text(yaml_text)

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"iteration": step, **{k: _clean(v) for k, v in metrics.items()}}
        with open(self.dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for key, value in row.items():
                if isinstance(value, (int, float)) and key != "iteration":
                    self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float)) and k != "iteration"}, step=step)

    def write_samples(self, step, batches, leaf_rewards, leaf_advantages, reward_names, per_prompt: int, seed: int) -> None:
        """PNGs of up to ``per_prompt`` leaves per prompt and one manifest line per written sample."""
        if not self.enabled:
            return
        from PIL import Image

        folder = self.dir / "samples" / f"step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        lines, offset = [], 0
        for b in batches:
            rec = b.record
            parents = rec.node_parent.tolist()
            written: dict[int, int] = {}
            for i in range(rec.num_leaves):
                p = int(rec.leaf_prompt[i])
                if written.get(p, 0) >= per_prompt:
                    continue
                written[p] = written.get(p, 0) + 1
                node = int(rec.leaf_node[i])
                name = f"s{b.slots[p]:04d}_n{node:04d}.png"
                array = (b.images[i].permute(1, 2, 0).clamp(0, 1) * 255).round().byte().numpy()
                Image.fromarray(array).save(folder / name)
                row = leaf_rewards[offset + i]
                lines.append(json.dumps({
                    "prompt": b.texts[p], "metadata": b.metadata[p], "seed": seed, "iteration": step,
                    "prompt_slot": b.slots[p], "group": int(rec.leaf_group[i]), "node": node, "parent": parents[node],
                    "rewards": {n: _clean(float(row[k])) for k, n in enumerate(reward_names)},
                    "advantage": _clean(float(leaf_advantages[offset + i])), "file": name,
                }))
            offset += rec.num_leaves
        (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
