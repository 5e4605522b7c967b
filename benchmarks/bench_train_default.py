"""An embedded default run: held-out toy score against wall time.

    python benchmarks/bench_train_default.py [--minutes 20] [key=value overrides ...]          # images
    python benchmarks/bench_train_default.py --video [--minutes 30] [key=value overrides ...]  # video

Trains the embedded default (configs/default.yaml, or configs/default_t2v.yaml with --video) with an
evaluation every few iterations, stops at the time budget, prints the curve (iteration, minutes,
held-out mean score, strict accuracy) and writes it to runs/bench-default[-t2v]/curve.json and
curve.png. With --video it also writes before_after.gif: the first held-out prompts' clips from the
starting model (top) and the final one (bottom), side by side.
"""

import argparse
import json
import time
from pathlib import Path

from flowgrpo.config import load_config
from flowgrpo.trainer import Trainer


def plot(points, path: Path, target: float, target_label: str) -> None:
    """A small line plot with PIL (no plotting dependency), with the target as a red line."""
    from PIL import Image, ImageDraw

    w, h, pad = 640, 360, 40
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    d.rectangle([pad, pad // 2, w - pad // 2, h - pad], outline="black")
    t_max = max(p[0] for p in points) or 1
    xy = [(pad + (w - 1.5 * pad) * t / t_max, (h - pad) - (h - 1.5 * pad) * s) for t, s in points]
    d.line(xy, fill=(30, 90, 200), width=3)
    for x, y in xy:
        d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=(30, 90, 200))
    y_target = (h - pad) - (h - 1.5 * pad) * target
    d.line([(pad, y_target), (w - pad // 2, y_target)], fill=(200, 60, 60), width=1)
    d.text((pad + 4, y_target - 12), target_label, fill=(200, 60, 60))
    d.text((pad, h - pad + 8), f"0 .. {t_max:.1f} minutes", fill="black")
    d.text((4, pad // 2), "held-out toy score (0..1)", fill="black")
    img.save(path)


def before_after(samples: Path, path: Path, fps: int, count: int = 6) -> None:
    """A GIF of the first ``count`` held-out clips: the first evaluation (top row) and the last (bottom)."""
    import imageio.v3 as iio
    import numpy as np

    evals = sorted((p for p in samples.glob("eval_*") if (p / "manifest.jsonl").is_file()),
                   key=lambda p: int(p.name.split("_")[1]))
    rows = []
    for folder in (evals[0], evals[-1]):
        lines = [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()[:count]]
        rows.append(np.concatenate([iio.imread(folder / m["file"]) for m in lines], axis=2))  # [F, H, W*count, 3]
    frames = np.concatenate(rows, axis=1)  # [F, 2H, W*count, 3]
    frames = frames.repeat(4, axis=1).repeat(4, axis=2)  # 32-pixel clips are too small to see
    iio.imwrite(path, frames, duration=int(1000 / fps), loop=0)
    print(f"before/after clips: {path} ({evals[0].name} top, {evals[-1].name} bottom)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=None, help="training-time budget (default 20, video 30)")
    parser.add_argument("--video", action="store_true", help="the text-to-video default (configs/default_t2v.yaml)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    args.minutes = args.minutes or (30.0 if args.video else 20.0)
    name = "bench-default-t2v" if args.video else "bench-default"
    cfg = load_config(None, None, [f"run_name={name}", "resume=false", "eval.every=5", *args.overrides],
                      default="default_t2v" if args.video else "default")
    cfg.train.iterations = 100000  # the time budget stops the run
    trainer = Trainer(cfg)
    curve = [(0.0, trainer.evaluate())]  # evaluation time is not counted in the budget
    trained = 0.0
    for iteration in range(cfg.train.iterations):
        started = time.time()
        metrics = trainer.step(iteration)
        trained += time.time() - started - sum(v for k, v in metrics.items() if k == "eval/seconds")
        if "eval/mean_score" in metrics:
            curve.append((trained / 60, metrics))
            print(f"iteration {iteration + 1:4d}  {trained / 60:6.1f} min  score {metrics['eval/mean_score']:.3f}", flush=True)
        if trained / 60 > args.minutes:
            break
    out = Path(cfg.run_dir)
    (out / "curve.json").write_text(json.dumps([{"minutes": m, **e} for m, e in curve], indent=1))
    start = curve[0][1]["eval/mean_score"]
    target = (start + 0.2, f"target: start + 0.2 = {start + 0.2:.3f}") if args.video else (0.85, "target: 0.85")
    plot([(m, e["eval/mean_score"]) for m, e in curve], out / "curve.png", *target)
    if args.video:
        before_after(out / "samples", out / "before_after.gif", fps=cfg.log.video_fps)
    print(f"{'minutes':>8} {'score':>6} {'strict':>6}")
    for m, e in curve:
        print(f"{m:8.1f} {e['eval/mean_score']:6.3f} {e.get('eval/strict_accuracy', float('nan')):6.3f}")


if __name__ == "__main__":
    main()
