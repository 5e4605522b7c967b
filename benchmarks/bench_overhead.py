"""Overhead per preset: one training iteration's wall time against the time spent inside the model's calls.

    python benchmarks/bench_overhead.py [--presets flow_grpo,mixgrpo,...] [--video default|all|none|P,Q]
                                        [--warmup 1] [--iterations 1] [--threads 1] [--out rows.jsonl] [key=value ...]

For the image default itself (configs/default.yaml, read at run time: whatever tiny SD3 it names) and every
preset (configs/presets/*.yaml, the forward-process ones included) on it, and, with ``--video``, on the video
default (configs/default_t2v.yaml, the tiny Wan; ``default`` = the video default itself, ``all`` = every
preset on it too), it builds the trainer, runs ``--warmup`` iterations untimed, then ``--iterations``
timed ones, and prints per configuration:

- the model-call time: every transformer call the iteration makes (rollout forwards, training forwards
  with and without gradient, CFG calls as one call of two passes) and the backward through them, as the
  adapter times them (``FlowModel.call_timer``, flowgrpo/models/base.py);
- the ratio  iteration wall time / model-call time  (target ≤ 1.10; "ratio with VAE, text" also counts the
  VAE decoder's and the text encoders' time as model time), where the iteration's sample
  writing and checkpoint are amortised over ``log.samples_every`` and ``log.save_every`` (each is timed
  once per measured iteration, then divided; evaluation is not part of an iteration and is off);
- where the rest goes: text encoding, VAE decode, rollout kernel math / noise draws / record building /
  executor loop, reward wait + advantages, loss math, backward outside the model, optimizer step
  (+ EMA, soft copies), learner bookkeeping, logging, sample writing, checkpoint, and what is left.

As ``benchmarks/bench_methods.py``, chains run group 8 and tree plans one tree per prompt (override with
``sampling.plan.group_size=...``); every other key is the default's, and key=value overrides apply to every
configuration. Run folders are runs/bench-overhead-<model>-<preset>/, cleared first. One JSON row per
configuration is printed as it finishes (and appended to ``--out``), then the full table and a short one
(the three largest items of the rest).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRESETS = sorted(p.stem for p in (ROOT / "configs" / "presets").glob("*.yaml"))
DEFAULTS = {"sd3": "default", "wan": "default_t2v"}

# the columns of "where the rest goes", in the order printed
REST = ("encode", "decode", "kernel_math", "noise", "records", "rollout_loop", "reward_advantage", "loss_math",
        "backward_other", "optimizer", "learner_other", "logging", "samples", "checkpoint", "other")


def ratio(wall: float, model: float) -> float:
    """Iteration wall time / model-call time (inf when the iteration made no timed model call)."""
    return wall / model if model > 0 else float("inf")


def amortised(wall: float, samples: float, samples_every: int, checkpoint: float, save_every: int) -> float:
    """An iteration's wall time with its sample writing (``samples`` s, done every iteration while measuring)
    and a checkpoint (``checkpoint`` s) counted at the rate the config does them (0 = never)."""
    per_iteration = wall - samples
    if samples_every:
        per_iteration += samples / samples_every
    if save_every:
        per_iteration += checkpoint / save_every
    return per_iteration


def breakdown(spans: dict[str, float], model_in: dict[str, float], phases: dict[str, float],
              model: dict[str, float], wall: float) -> dict[str, float]:
    """Seconds per column of REST (plus "model") from the timed spans of one iteration.

    ``spans``: wall seconds inside each wrapped function (encode, decode, rollout, apply, step_noise, records,
    advantages, micro, backward, optimizer, log, samples, checkpoint); ``model_in``: model-call seconds inside
    the same spans; ``phases``: the trainer's own sample / update seconds; ``model``: the iteration's
    model-call delta (forward, backward, total); ``wall``: the amortised iteration seconds."""
    g = defaultdict(float, spans)
    m = defaultdict(float, model_in)
    out = {
        "model": model["total"],
        "encode": g["encode"] - m["encode"],
        "decode": g["decode"] - m["decode"],
        "noise": g["step_noise"],
        "kernel_math": g["apply"] - g["step_noise"] - m["apply"],
        "records": g["records"],
        "rollout_loop": g["rollout"] - m["rollout"] - g["apply"] - g["records"] + m["apply"],
        "reward_advantage": g["advantages"],
        "loss_math": g["micro"] - m["micro"],
        "backward_other": g["backward"] - m["backward"],
        "optimizer": g["optimizer"],
        "learner_other": phases["update"] - g["micro"] - g["backward"] - g["optimizer"]
        - (model["forward_update"] - m["micro"]),
        "logging": g["log"],
        "samples": g["samples"],
        "checkpoint": g["checkpoint"],
    }
    out["other"] = wall - sum(v for k, v in out.items())
    return out


class Spans:
    """Wall seconds spent inside wrapped functions, and the model-call seconds inside them."""

    def __init__(self, timer, device):
        self.timer, self.cuda = timer, device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)
        self.model: dict[str, float] = defaultdict(float)
        self._restore: list = []

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def wrap(self, key: str, fn):
        def timed(*args, **kwargs):
            self._sync()
            before, start = self.timer.totals()["total"], time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._sync()
                self.seconds[key] += time.perf_counter() - start
                self.model[key] += self.timer.totals()["total"] - before

        return timed

    def patch(self, owner, name: str, key: str) -> None:
        """Time ``owner.name`` (an instance's or a class's attribute) under ``key`` until ``restore``."""
        had = name in vars(owner)  # a class's or module's own function; an instance's bound method is not
        original = vars(owner)[name] if had else getattr(owner, name)
        setattr(owner, name, self.wrap(key, original))
        self._restore.append((owner, name, had, original))

    def restore(self) -> None:
        for owner, name, had, value in reversed(self._restore):
            if had:
                setattr(owner, name, value)
            else:
                delattr(owner, name)
        self._restore.clear()

    def reset(self) -> None:
        self.seconds.clear()
        self.model.clear()


def instrument(trainer, spans: Spans) -> None:
    """Wrap the functions whose time the table reports (instance attributes; the executor's class methods)."""
    import samplers
    import samplers.executor as executor

    spans.patch(trainer.model, "encode_prompts", "encode")
    spans.patch(trainer.model, "decode", "decode")
    spans.patch(samplers, "rollout", "rollout")  # the trainer calls samplers.rollout
    spans.patch(executor._Run, "apply", "apply")
    spans.patch(executor._Run, "step_noise", "step_noise")
    spans.patch(executor._Run, "records", "records")
    spans.patch(trainer, "assign_credit", "advantages")
    spans.patch(trainer.policy, "backward", "backward")
    spans.patch(trainer.policy, "step", "optimizer")
    spans.patch(trainer.writer, "log", "log")
    spans.patch(trainer.writer, "write_samples", "samples")
    for name in ("micro_loss", "_micro_step"):  # forward-process learners / the transition learner
        if hasattr(trainer.learner, name):
            spans.patch(trainer.learner, name, "micro")


def config_for(model: str, preset: str | None, overrides: list[str]):
    from flowgrpo.config import load_config

    name = f"bench-overhead-{model}-{preset or 'default'}"
    group = [] if preset is None else [f"sampling.plan.group_size={1 if preset.startswith(('branch', 'tempflow')) else 8}"]
    return load_config(preset, None, [f"run_name={name}", "resume=false", "train.iterations=100000", "eval.every=0",
                                      "eval.at_start=false", "log.gallery=false", "log.progress=false",
                                      "log.tensorboard=false", *group, *overrides], default=DEFAULTS[model])


def run(model: str, preset: str | None, overrides: list[str], warmup: int, iterations: int) -> dict:
    from flowgrpo.engine.trainer import Trainer

    cfg = config_for(model, preset, overrides)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)  # a benchmark run starts clean
    samples_every, save_every = cfg.log.samples_every, cfg.log.save_every
    trainer = Trainer(cfg)
    trainer.writer.info(f"bench_overhead: {model} {preset or 'default'}")
    for i in range(warmup):
        trainer.step(i)
    timer = trainer.model.call_timer
    spans = Spans(timer, trainer.model.device)
    instrument(trainer, spans)
    # every measured iteration writes its samples (timed, then amortised over the config's log.samples_every)
    trainer.cfg.log.samples_every = 1 if samples_every else 0
    totals = defaultdict(float)
    try:
        for i in range(warmup, warmup + iterations):
            before = timer.totals()
            start = time.perf_counter()
            metrics = trainer.step(i)
            wall = time.perf_counter() - start
            delta = timer.delta(timer.totals(), before)
            totals["wall"] += wall
            totals["sample"] += metrics["time/sample"]
            totals["update"] += metrics["time/update"]
            totals["model"] += delta["total"]
            totals["forward"] += delta["forward"]
            totals["backward"] += delta["backward"]
            totals["forward_update"] += metrics["time/model_update_forward"]
            for key in ("calls_grad", "calls_no_grad", "rows_grad", "rows_no_grad", "cfg_calls", "backward_calls"):
                totals[key] += delta[key]
        start = time.perf_counter()
        trainer.save()  # one checkpoint, amortised over log.save_every
        checkpoint = time.perf_counter() - start
    finally:
        spans.restore()
        trainer.scoring.close()
        trainer.writer.close()
    n = iterations
    per = {k: v / n for k, v in spans.seconds.items()}
    samples = per.pop("samples", 0.0)  # written in every measured iteration
    wall = amortised(totals["wall"] / n, samples, samples_every, checkpoint, save_every)
    per["samples"] = samples / samples_every if samples_every else 0.0
    per["checkpoint"] = checkpoint / save_every if save_every else 0.0
    model_in = {k: v / n for k, v in spans.model.items()}
    model_time = {"total": totals["model"] / n, "forward": totals["forward"] / n, "backward": totals["backward"] / n,
                  "forward_update": totals["forward_update"] / n}
    rest = breakdown(per, model_in, {"sample": totals["sample"] / n, "update": totals["update"] / n}, model_time, wall)
    return {
        "model": model, "preset": preset or "default", "pretrained": cfg.model.pretrained,
        "resolution": cfg.model.resolution, "method": rollout_label(cfg), "learner": cfg.learner.name,
        "group_size": cfg.sampling.plan.get("group_size"), "prompts": cfg.train.prompts_per_iteration,
        "iterations": n, "wall_s": wall, "model_s": model_time["total"], "ratio": ratio(wall, model_time["total"]),
        # every network the iteration runs: the transformer, and the VAE decoder and text encoders too
        "ratio_all_networks": ratio(wall, model_time["total"] + rest["decode"] + rest["encode"]),
        "model_forward_s": model_time["forward"], "model_backward_s": model_time["backward"],
        "calls": {k: totals[k] / n for k in ("calls_no_grad", "calls_grad", "rows_no_grad", "rows_grad", "cfg_calls",
                                               "backward_calls")},
        "samples_every": samples_every, "save_every": save_every,
        "rest_s": {k: rest[k] for k in REST},
    }


def rollout_label(cfg) -> str:
    """The rollout in a word or two (the row's "method"; the preset names the method): the plan's kernel, and its
    tree, side branches or moving SDE window."""
    plan = cfg.sampling.plan
    label = str(plan.get("kernel", "flow_sde"))
    label += " tree" if plan.get("splits") else ""
    label += f" + {plan.get('side_kernel', 'flow_sde')} branches" if plan.get("side_steps") else ""
    return label + (" window" if cfg.sampling.window else "")


def configurations(presets: list[str | None], video: str, every: list[str] = PRESETS) -> list[tuple[str, str | None]]:
    """(model, preset) pairs: ``presets`` on the tiny SD3 (None = the image default itself), then the tiny Wan's
    by ``video``: default (the video default alone), all (it and ``every`` preset), none, or "p,q"."""
    out = [("sd3", p) for p in presets]
    if video == "default":
        out.append(("wan", None))
    elif video == "all":
        out += [("wan", None)] + [("wan", p) for p in every]
    elif video != "none":
        out += [("wan", p) for p in video.split(",")]
    return out


def table(rows: list[dict]) -> str:
    head = "| model | preset | iteration s | model s | ratio | ratio with VAE, text | " + " | ".join(REST) + " |"
    lines = [head, "|" + "---|" * (6 + len(REST))]
    for r in rows:
        rest = " | ".join(f"{r['rest_s'][k]:.2f}" for k in REST)
        lines.append(f"| {r['model']} | {r['preset']} | {r['wall_s']:.2f} | {r['model_s']:.2f} | {r['ratio']:.3f} | "
                     f"{r['ratio_all_networks']:.3f} | {rest} |")
    return "\n".join(lines)


def short_table(rows: list[dict]) -> str:
    lines = ["| model | preset | rollout / learner | iteration s | model calls s | ratio | largest of the rest, s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        top = sorted(((v, k) for k, v in r["rest_s"].items() if k != "other"), reverse=True)[:3]
        rest = ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for v, k in top)
        lines.append(f"| {r['model']} | {r['preset']} | {r['method']} / {r['learner']} | {r['wall_s']:.2f} | "
                     f"{r['model_s']:.2f} | {r['ratio']:.3f} | {rest} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default=",".join(["default", *PRESETS]), help="comma-separated presets on the image "
                        "default ('default' = the image default itself; default: it and every file in configs/presets; '' = none)")
    parser.add_argument("--video", default="default", help="default (the video default alone), all (it and every preset "
                        "on the tiny Wan), none, or comma-separated presets on the tiny Wan")
    parser.add_argument("--warmup", type=int, default=1, help="untimed iterations first")
    parser.add_argument("--iterations", type=int, default=1, help="timed iterations (averaged)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0 = leave torch's choice)")
    parser.add_argument("--out", default=None, help="append the JSON rows to this file")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every configuration")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    presets = [None if p == "default" else p for p in args.presets.split(",") if p]
    rows = []
    for model, preset in configurations(presets, args.video):
        rows.append(run(model, preset, args.overrides, args.warmup, args.iterations))
        line = json.dumps(rows[-1])
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
    print(f"\nseconds per iteration (torch threads: {torch.get_num_threads()}); ratio = iteration / model calls; "
          "the rest by where it goes")
    print(table(rows))
    print()
    print(short_table(rows))
    return rows


if __name__ == "__main__":
    main()
