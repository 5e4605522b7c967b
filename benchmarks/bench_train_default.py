"""The embedded default, run as a newcomer runs it: held-out score against training time, over seeds.

    python benchmarks/bench_train_default.py [--minutes 15] [--seeds 0,1,2] [--jobs 1] [key=value ...]   # images
    python benchmarks/bench_train_default.py --video [--minutes 20] [--seeds 0,1] [key=value ...]        # video
    python benchmarks/bench_train_default.py --edit [--minutes 15] [--seeds 0,1] [key=value ...]         # editing

For each seed, trains the embedded default (configs/default.yaml, or configs/default_t2v.yaml with
--video, or the editing world's configs/edit.yaml with --edit) with a held-out evaluation every ``--eval-every`` iterations (evaluation time is not
counted) for its train.iterations or ``--minutes`` of training time, whichever ends first, and
prints the held-out mean at start and end with standard errors, the paired change (same prompts and
seeds at every evaluation), whether it reached the target rise (+0.15 images, +0.10 video and editing), and the
level the run held: the change of the per-sample mean over its second half's evaluations
(``flowgrpo.evaluate.second_half_level``; one evaluation scatters by about its standard error).
Writes into runs/bench-default[-t2v|-edit]/: curve.json (every evaluation and every iteration's training
reward, per seed), curve.png (held-out score per seed, blue; training reward, grey) and
before_after.png (images: the first held-out prompts from the first evaluation, top, and the last,
bottom; editing: their sources above them) or before_after.gif (video).
``--jobs 2`` trains two seeds at once, one torch thread each (this 2-core machine's two cores).
``--control`` is the negative control: the same runs with every reward weight negated (the learner
then minimises the training reward; runs/bench-default[-t2v]<TAG>-control-s<seed>). A rise that is
learned from the reward turns into a fall under it; a rise that the control shares is drift.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from parallel import map_jobs

TARGET = {"image": 0.15, "video": 0.10, "edit": 0.10}
SUFFIX = {"image": "", "video": "-t2v", "edit": "-edit"}


def run_seed(job: tuple) -> dict:
    seed, kind, minutes, eval_every, overrides, threads, preset, tag, control = job
    video = kind == "video"
    import torch

    if threads:
        torch.set_num_threads(threads)
    from flowgrpo.config import load_config
    from flowgrpo.evaluate import before_after, second_half_level
    from flowgrpo.engine.trainer import Trainer

    name = f"bench-default{SUFFIX[kind]}{tag}-s{seed}"
    from flowgrpo.run.paths import configs_dir

    cfg = load_config(preset, None, [f"run_name={name}", "resume=false", f"eval.every={eval_every}", f"train.seed={seed}",
                                   "log.progress=false", *overrides], default="default_t2v" if video else "default",
                      base=str(configs_dir() / "edit.yaml") if kind == "edit" else None)
    if control:  # every advantage's sign flipped (flowgrpo.engine.credit.combine_rewards: weight -1 minimises)
        for spec in cfg.rewards:
            spec.weight = -spec.weight
    # the config's iterations (its learning-rate schedule spans them) or the time budget, whichever ends first
    shutil.rmtree(cfg.run_dir, ignore_errors=True)  # a benchmark run starts clean: no old logs, no run-identity clash
    trainer = Trainer(cfg)
    evaluations = [{"minutes": 0.0, "iteration": 0, **trainer.evaluate()}]
    rewards, trained = [], 0.0
    reward_key = f"reward/{trainer.scoring.names[0]}_mean"
    for iteration in range(cfg.train.iterations):
        started = time.time()
        metrics = trainer.step(iteration)
        trained += time.time() - started - metrics.get("eval/seconds", 0.0)
        rewards.append({"minutes": trained / 60, "iteration": iteration + 1, "reward": metrics.get(reward_key)})
        if "eval/mean_score" in metrics:
            evaluations.append({"minutes": trained / 60, "iteration": iteration + 1, **metrics})
            print(f"seed {seed}  iteration {iteration + 1:4d}  {trained / 60:6.1f} min  held-out {metrics['eval/mean_score']:.3f}",
                  flush=True)
        if trained / 60 > minutes:
            break
    if "eval/mean_score" not in metrics:  # end on an evaluation
        evaluations.append({"minutes": trained / 60, "iteration": iteration + 1, **trainer.evaluate()})
    trainer.scoring.close()
    scores = trainer.writer.read_eval_scores()
    stats = before_after(scores[0]["scores"], scores[-1]["scores"], scores[0].get("tasks"))
    stats["second_half"] = second_half_level(scores)  # the level the run holds, steadier than its last evaluation
    return {"seed": seed, "run_dir": str(cfg.run_dir), "evaluations": evaluations, "rewards": rewards, "stats": stats,
            "reward_name": trainer.scoring.names[0], "reward_weights": [float(w) for w in trainer.scoring.weights],
            "eval_reward": cfg.eval.reward, "fps": cfg.log.video_fps}


def plot(results: list[dict], path: Path, target: float) -> None:
    """Held-out score per seed (blue), the training reward per seed (grey, 5-iteration means), the target (red)."""
    from PIL import Image, ImageDraw

    w, h, pad = 720, 400, 44
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    d.rectangle([pad, pad // 2, w - pad // 2, h - pad], outline="black")
    t_max = max(e["minutes"] for r in results for e in r["evaluations"]) or 1
    lo = min(min(e["eval/mean_score"] for e in r["evaluations"]) for r in results)
    values = [x["reward"] for r in results for x in r["rewards"] if x["reward"] is not None]
    lo, hi = min([lo] + values) - 0.02, max([lo + target + 0.05] + values + [e["eval/mean_score"] for r in results
                                                                             for e in r["evaluations"]]) + 0.02

    def xy(t, s):
        return pad + (w - 1.5 * pad) * t / t_max, (h - pad) - (h - 1.5 * pad) * (s - lo) / (hi - lo)

    for r in results:
        points = [x for x in r["rewards"] if x["reward"] is not None]
        smooth = [(points[i]["minutes"], sum(p["reward"] for p in points[max(0, i - 4): i + 1]) / len(points[max(0, i - 4): i + 1]))
                  for i in range(len(points))]
        if len(smooth) > 1:
            d.line([xy(t, s) for t, s in smooth], fill=(170, 170, 170), width=1)
        line = [xy(e["minutes"], e["eval/mean_score"]) for e in r["evaluations"]]
        d.line(line, fill=(30, 90, 200), width=3)
        for x, y in line:
            d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=(30, 90, 200))
    start = sum(r["evaluations"][0]["eval/mean_score"] for r in results) / len(results)
    y_target = xy(0, start + target)[1]
    d.line([(pad, y_target), (w - pad // 2, y_target)], fill=(200, 60, 60), width=1)
    d.text((pad + 4, y_target - 12), f"target: start + {target:.2f}", fill=(200, 60, 60))
    d.text((pad, h - pad + 8), f"training minutes 0 .. {t_max:.1f}", fill="black")
    d.text((4, 4), f"held-out {results[0]['eval_reward']} (blue, per seed); training reward {results[0]['reward_name']} (grey)",
           fill="black")
    d.text((4, pad // 2), f"{hi:.2f}", fill="black")
    d.text((4, h - pad - 10), f"{lo:.2f}", fill="black")
    img.save(path)


def image_grid(run_dir: Path, path: Path, count: int = 8, shown: int = 128) -> None:
    """The first ``count`` held-out images of the first evaluation (top row) and of the last (bottom row),
    each enlarged (nearest neighbour) to about ``shown`` pixels."""
    from PIL import Image

    evals = sorted((p for p in (run_dir / "samples").glob("eval_*") if (p / "manifest.jsonl").is_file()),
                   key=lambda p: int(p.name.split("_")[1]))
    rows = []
    for folder in (evals[0], evals[-1]):
        lines = [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()[:count]]
        if not rows and all(m.get("sources") for m in lines):  # an edit: its sources on top
            rows.append([Image.open(folder / m["sources"][0]).convert("RGB") for m in lines])
        rows.append([Image.open(folder / m["file"]).convert("RGB") for m in lines])
    size = rows[0][0].size[0] * max(1, shown // rows[0][0].size[0])
    grid = Image.new("RGB", (size * count + 4 * (count - 1), size * len(rows) + 4 * (len(rows) - 1)), "white")
    for r, row in enumerate(rows):
        for c, image in enumerate(row):
            grid.paste(image.resize((size, size), Image.NEAREST), (c * (size + 4), r * (size + 4)))
    grid.save(path)
    print(f"before/after images: {path} ({'sources, ' if len(rows) > 2 else ''}{evals[0].name}, {evals[-1].name}, "
          "top to bottom)")


def before_after_gif(run_dir: Path, path: Path, fps: int, count: int = 6) -> None:
    """A GIF of the first ``count`` held-out clips: the first evaluation (top row) and the last (bottom)."""
    import imageio.v3 as iio
    import numpy as np

    evals = sorted((p for p in (run_dir / "samples").glob("eval_*") if (p / "manifest.jsonl").is_file()),
                   key=lambda p: int(p.name.split("_")[1]))
    rows = []
    for folder in (evals[0], evals[-1]):
        lines = [json.loads(line) for line in (folder / "manifest.jsonl").read_text().splitlines()[:count]]
        rows.append(np.concatenate([iio.imread(folder / m["file"]) for m in lines], axis=2))  # [F, H, W*count, 3]
    frames = np.concatenate(rows, axis=1).repeat(4, axis=1).repeat(4, axis=2)  # 32-pixel clips are too small to see
    iio.imwrite(path, frames, duration=int(1000 / fps), loop=0)
    print(f"before/after clips: {path} ({evals[0].name} top, {evals[-1].name} bottom)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=None, help="training-time budget per seed (default 15, video 20)")
    parser.add_argument("--video", action="store_true", help="the text-to-video default (configs/default_t2v.yaml)")
    parser.add_argument("--edit", action="store_true", help="the editing world's default (configs/edit.yaml)")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2; video 0,1)")
    parser.add_argument("--eval-every", type=int, default=5, help="iterations between held-out evaluations")
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at once (then one torch thread each)")
    parser.add_argument("--preset", default=None, help="a method preset on top of the default (configs/presets/)")
    parser.add_argument("--tag", default="", help="suffix for the run directories (runs/bench-default<TAG>-s<seed>)")
    parser.add_argument("--control", action="store_true",
                        help="the sign-flip control: every reward weight negated (a learned rise must become a fall)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args()
    if args.control:
        args.tag += "-control"
    kind = "video" if args.video else "edit" if args.edit else "image"
    minutes = args.minutes or (20.0 if args.video else 15.0)
    seeds = [int(s) for s in (args.seeds or ("0,1" if args.video or args.edit else "0,1,2")).split(",")]
    jobs = [(s, kind, minutes, args.eval_every, args.overrides, 1 if args.jobs > 1 else 0,
             args.preset, args.tag, args.control) for s in seeds]
    results = map_jobs(run_seed, jobs, args.jobs)
    out = Path(results[0]["run_dir"]).parent / f"bench-default{SUFFIX[kind]}{args.tag}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "curve.json").write_text(json.dumps([{k: v for k, v in r.items()} for r in results], indent=1))
    target = TARGET[kind]
    plot(results, out / "curve.png", target)
    if args.video:
        before_after_gif(Path(results[0]["run_dir"]), out / "before_after.gif", results[0]["fps"])
    else:
        image_grid(Path(results[0]["run_dir"]), out / "before_after.png")
    if args.control:
        print("\nSIGN-FLIP CONTROL: every reward weight negated, so the learner minimises its training reward")
    print(f"\n{kind} default, {minutes:g} training minutes per seed; held-out {results[0]['eval_reward']} over "
          f"{results[0]['stats']['n']} samples (mean ± standard error; change: paired, same prompts and seeds)")
    print("| seed | iterations | start | end | change | rose by the target (+%.2f)? | second half: evaluations, change of their mean |"
          % target)
    print("|---|---|---|---|---|---|---|")
    for r in results:
        (s, s_se), (e, e_se), (c, c_se) = r["stats"]["start"], r["stats"]["end"], r["stats"]["change"]
        late = r["stats"]["second_half"]
        print(f"| {r['seed']} | {r['evaluations'][-1]['iteration']} | {s:.3f} ± {s_se:.3f} | {e:.3f} ± {e_se:.3f} | "
              f"{c:+.3f} ± {c_se:.3f} | {'yes' if c >= target else 'no'} | {late['evaluations']}, "
              f"{late['change'][0]:+.3f} ± {late['change'][1]:.3f} |")
    for r in results:
        if r["stats"].get("per_task"):
            print(f"seed {r['seed']} per task: " + ", ".join(f"{t} {a:.3f} -> {b:.3f}" for t, (a, b) in r["stats"]["per_task"].items()))
    print(f"files: {out}/curve.json, curve.png, {'before_after.gif' if args.video else 'before_after.png'}")


if __name__ == "__main__":
    main()
