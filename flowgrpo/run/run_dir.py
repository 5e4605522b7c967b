"""The run directory (docs/design.md, "The run folder": the contract between training and review).

runs/<name>/config.yaml                 the resolved config of the run's first launch (never overwritten)
runs/<name>/config_history.jsonl        one line per later launch that changed the config: time, iteration,
                                        the changed keys (old, new) and the full config then in force
runs/<name>/metrics.jsonl               one JSON line per logged iteration (+ TensorBoard events in tb/)
runs/<name>/train.log                   start-up arithmetic, warnings (e.g. failed reward calls)
runs/<name>/eval_scores.jsonl           per-sample scores of every held-out evaluation (the before/after summary)
runs/<name>/checkpoints/step_<n>/       written by flowgrpo.run.checkpoint
runs/<name>/samples/step_<n>/           PNGs (images) or H.264 MP4s with a poster PNG (videos) and
                                        manifest.jsonl: one line per sample with prompt, seed, noise_seed,
                                        group (its size and reward mean/std over all its samples),
                                        node/parent, every reward, advantage, file path (and poster)
Only the main process writes.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch
import yaml
from tqdm.auto import tqdm

from flowgrpo.run.errors import ConfigError


def require_video_writer() -> None:
    """Fail early, naming the fix, when the MP4 writer (the ``video`` extra) is missing."""
    try:
        import imageio  # noqa: F401
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        raise ImportError(
            "writing video samples as MP4 needs imageio and imageio-ffmpeg: pip install 'flowgrpo[video]' "
            "(or write none: log.samples_every=0 log.eval_samples=0)"
        ) from None


def to_uint8(media: torch.Tensor):
    """An image [3, H, W] or video [F, 3, H, W] float in [0, 1] as uint8 numpy, channels last."""
    return (media.movedim(-3, -1).clamp(0, 1) * 255).round().byte().cpu().numpy()


def write_mp4(path: Path, video: torch.Tensor, fps: int) -> None:
    """A video float [F, 3, H, W] in [0, 1] as H.264 (yuv420p, plays in browsers), at its own size."""
    import imageio.v2 as imageio

    frames = to_uint8(video)  # [F, H, W, 3]
    # macro_block_size=2: frames keep their size unless it is odd (yuv420p needs even sizes; imageio then scales by 1 px)
    with imageio.get_writer(path, format="FFMPEG", mode="I", fps=fps, codec="libx264", quality=None,
                            macro_block_size=2, ffmpeg_log_level="error",
                            ffmpeg_params=["-pix_fmt", "yuv420p", "-crf", "12"]) as writer:
        for frame in frames:
            writer.append_data(frame)


def _clean(value):
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # NaN / inf as JSON null
    return value


def _group_rewards(leaf_group: torch.Tensor, rewards: torch.Tensor, names: list[str]) -> dict[int, tuple[int, dict]]:
    """{group id: (leaves in the group, {reward: {"mean", "std", "n"}})} over every leaf of each group
    (leaf_group [L], rewards [L, K]; NaN left out; std is the population std, as flowgrpo.engine.credit')."""
    out = {}
    for g in leaf_group.unique().tolist():
        rows = rewards[leaf_group == g].double()
        stats = {}
        for k, name in enumerate(names):
            valid = rows[:, k][~rows[:, k].isnan()]
            n = int(valid.numel())
            stats[name] = {"mean": _clean(float(valid.mean())) if n else None,
                           "std": _clean(float(valid.std(unbiased=False))) if n else None, "n": n}
        out[int(g)] = (int(rows.shape[0]), stats)
    return out


def _save_media(folder: Path, stem: str, media: torch.Tensor, fps: int) -> dict:
    """One sample's files: a PNG for an image [3, H, W]; for a video [F, 3, H, W] an MP4 at ``fps``
    (the sample) and its middle frame as a PNG (the poster). Returns the manifest's file keys."""
    from PIL import Image

    files = {"file": f"{stem}.png"}
    if media.ndim == 4:
        files = {"file": f"{stem}.mp4", "poster": f"{stem}.png"}
        write_mp4(folder / files["file"], media, fps)
        media = media[media.shape[0] // 2]
    Image.fromarray(to_uint8(media)).save(folder / (files.get("poster") or files["file"]))
    return files


def _save_sources(folder: Path, metadata) -> dict:
    """A conditioned sample's condition images (an edit's source) beside it in its step folder, each saved once
    per folder as ``src_<hash>.png``, so the gallery shows the source next to the result even when the prompt set
    moves; returns the manifest's ``sources`` key (file names, in the row's order), or nothing for a text prompt."""
    import hashlib

    from flowgrpo.conditions import KEY, load

    paths = (metadata or {}).get(KEY) if isinstance(metadata, dict) else None
    if not paths:
        return {}
    names = []
    for path in paths:
        name = f"src_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}.png"
        if not (folder / name).is_file():
            load(path).save(folder / name)
        names.append(name)
    return {"sources": names}


# ---------------------------------------------------------------- run identity: one experiment per folder
# Keys a rerun may change without changing the experiment: it resumes without asking (the change is still
# recorded in config_history.jsonl). Why each leaves the experiment alone:
#   run_name, output_dir                  where the folder is (the folder is what is being compared)
#   resume, allow_config_change           how this launch treats the folder, not what it trains
#   train.iterations                      extends (or ends early) the same run: every draw is a pure function of
#                                         (seed, iteration, prompt, node), so iteration n computes the same either way
#   log.*                                 what is written and how often: checkpoints, samples, TensorBoard, W&B,
#                                         progress bars, the gallery, gradient-noise probes
#   eval.every, eval.at_start, eval.batch_size   when, and in what chunks, the same held-out measurement runs
#                                         (its prompts, limit, steps and reward do change what is measured)
#   model.device, train.cpu, *.threads    the machine it runs on and how many CPU threads it uses: speed only
#   sampling.chunk, train.micro_batch     memory chunks of the same computation (samples per rollout call,
#                                         gradient accumulation); sampling.max_batch is sampling.chunk's old name
#   model.offload_text_encoders, train.activation_offload   where the same tensors wait between uses (host or
#                                         device memory); not sampling.latent_storage: its bfloat16 rounds states
#   loss.likelihood_backend               the same likelihood terms computed by PyTorch or by the fused op (ops.py)
#   train.context_parallel(_ring)         the same samples' tokens split over more or fewer processes (context.py)
# Everything else (model, rewards, method and plan, learner, learning rate, batch sizes, seed, prompts, the
# held-out set, mixed precision, ...) changes what the run computes: refused unless allow_config_change=true.
NEUTRAL_KEYS = ("run_name", "output_dir", "resume", "allow_config_change", "train.iterations", "log.", "eval.every",
                "eval.at_start", "eval.batch_size", "model.device", "train.cpu", "sampling.max_batch",
                "sampling.chunk", "train.micro_batch", "loss.likelihood_backend", "model.offload_text_encoders",
                "train.activation_offload", "train.context_parallel", "train.context_parallel_ring")
_UNSET = "(unset)"


class RunConfigChanged(ConfigError):
    """A rerun into a run folder whose config differs in keys that change the experiment."""


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested config as {dotted key: value}."""
    out = {}
    for key, value in (tree or {}).items():
        if isinstance(value, dict):  # an empty dict (e.g. sampling.plan: {}) leaves its keys unset
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(saved_yaml: str, new_yaml: str, defaults: dict | None = None) -> dict[str, tuple]:
    """Every key whose value differs between two resolved configs (YAML text), as {dotted key: (saved, new)}.
    A key one of them lacks (a config written before the key existed) counts as its value in ``defaults``
    (flowgrpo.config.schema_defaults()); lists (rewards) compare whole."""
    old, new, default = flatten(yaml.safe_load(saved_yaml)), flatten(yaml.safe_load(new_yaml)), defaults or {}
    changes = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, default.get(key, _UNSET)), new.get(key, default.get(key, _UNSET))
        if a != b:
            changes[key] = (a, b)
    return changes


def _neutral(key: str) -> bool:
    return key.rsplit(".", 1)[-1] == "threads" or any(
        key.startswith(n) if n.endswith(".") else key == n for n in NEUTRAL_KEYS)


def experiment_keys(changes: dict) -> list[str]:
    """The changed keys that change the experiment (all but NEUTRAL_KEYS), sorted."""
    return sorted(key for key in changes if not _neutral(key))


def recorded_config(run_dir: Path) -> str | None:
    """The run folder's config in force: the newest config_history.jsonl entry's, else config.yaml (None: new folder)."""
    run_dir = Path(run_dir)
    history = run_dir / "config_history.jsonl"
    lines = [line for line in history.read_text().splitlines() if line.strip()] if history.is_file() else []
    if lines:
        return json.loads(lines[-1])["config"]
    path = run_dir / "config.yaml"
    return path.read_text() if path.is_file() else None


def _shown(value) -> str:
    text = value if value == _UNSET else json.dumps(value, default=str)
    return text if len(text) <= 160 else text[:157] + "..."


def check_run_config(run_dir: Path, new_yaml: str, allow_change: bool, defaults: dict | None = None) -> None:
    """A rerun into ``run_dir`` must run the same experiment: refuse (naming the differing keys and both fixes)
    when its config changes a key outside NEUTRAL_KEYS, unless ``allow_change`` (allow_config_change=true).
    ``defaults``: the schema's defaults, for keys an older config lacks."""
    run_dir = Path(run_dir)
    saved = recorded_config(run_dir)
    if saved is None or allow_change:
        return
    changes = config_differences(saved, new_yaml, defaults)
    keys = experiment_keys(changes)
    if not keys:
        return
    free = next(f"{run_dir.name}-{k}" for k in range(2, 10_000) if not (run_dir.parent / f"{run_dir.name}-{k}").exists())
    differ = "; ".join(f"{key}: {_shown(changes[key][0])} -> {_shown(changes[key][1])}" for key in keys)
    raise RunConfigChanged(  # one line, as every user error (docs/errors.md)
        f"{run_dir} already holds a run with another configuration (the run's -> this command's: {differ}); to start "
        f"a new run, give it its own folder: run_name={free}; to continue this run with the change, add "
        f"allow_config_change=true (the change is appended to {run_dir / 'config_history.jsonl'}; config.yaml keeps "
        "the original)")


class RunWriter:
    def __init__(self, run_dir: Path, enabled: bool = True, tensorboard: bool = True, wandb: bool = False):
        self.dir, self.enabled = Path(run_dir), enabled
        self.tb = self.wandb = None
        self._repeats: dict[str, int] = {}  # warning text -> times repeated after its first (console) line
        if not enabled:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            from flowgrpo.run.errors import UserError

            raise UserError(f"the run folder {self.dir} cannot be created ({exc.strerror}); set output_dir= to a "
                            "folder you can write") from None
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

    def info(self, text: str, console: bool = True) -> None:
        """A line in train.log, and on the console unless ``console`` is false."""
        if self.enabled:
            if console:
                tqdm.write(text, file=sys.stderr)  # above the progress bars, which are redrawn below it
            self._line(text)

    def warn(self, text: str) -> None:
        """A warning on the console once: an identical one again goes to train.log only, and close() prints how
        many times it repeated (a reward failing on every batch gives one line, not one per batch)."""
        if not self.enabled:
            return
        self._line(f"WARNING {text}")
        if text in self._repeats:
            self._repeats[text] += 1
            return
        self._repeats[text] = 0
        tqdm.write(f"warning: {text}", file=sys.stderr)

    def write_config(self, yaml_text: str, iteration: int = 0, defaults: dict | None = None) -> None:
        """config.yaml on the first launch; later launches that change the config append the change to
        config_history.jsonl (``iteration``: where the run continues), so config.yaml is never overwritten.
        ``defaults``: the schema's defaults, for keys an older config lacks."""
        if not self.enabled:
            return
        saved = recorded_config(self.dir)
        if saved is None:
            (self.dir / "config.yaml").write_text(yaml_text)
            return
        changes = config_differences(saved, yaml_text, defaults)
        if not changes:
            return
        keys = experiment_keys(changes)
        if keys:
            self.warn(f"continuing with a changed configuration (allow_config_change=true): {', '.join(keys)}; "
                      f"recorded in {self.dir / 'config_history.jsonl'}")
        entry = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "iteration": iteration,
                 "changes": {key: list(pair) for key, pair in changes.items()}, "experiment_changes": keys,
                 "config": yaml_text}
        with open(self.dir / "config_history.jsonl", "a") as f:
            f.write(json.dumps(entry, default=str) + "\n")

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

    def write_samples(self, step, batches, leaf_rewards, leaf_advantages, reward_names, per_prompt: int, seed: int,
                      fps: int = 8, preview=None, *, sampled_iteration: int, shared_noise: bool) -> None:
        """Up to ``per_prompt`` leaves per prompt and one manifest line per written sample: a PNG per
        image ([3, H, W]); per video ([F, 3, H, W]) an MP4 at ``fps`` (``file``) and the middle frame
        as a PNG (``poster``). ``preview(media, groups, prompts)`` (the model's) turns samples that are
        not pictures into pictures first (the analytic world's scatter plots).

        Each line also holds what the saved subset alone cannot show: ``group_size`` (the group's leaves, saved
        or not) and ``group_rewards`` (each reward's mean, population std and count over all of them, NaN left
        out: the group z-score's baseline and scale), and ``noise_seed``, the seed of the generator that drew
        the sample's x_T in the rollout ``sampled_iteration`` (``shared_noise``: one x_T per prompt, the
        plan's initial_noise="shared"); SDE step noise is drawn per (seed, iteration, prompt slot, node)."""
        if not self.enabled:
            return
        from samplers.grids import STREAM_INITIAL_NOISE, derive_seed

        folder = self.dir / "samples" / f"step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        lines, offset = [], 0
        for b in batches:
            rec = b.record.bookkeeping_on_cpu()  # the rewards are CPU tensors
            parents = rec.node_parent.tolist()
            media = b.images if preview is None else preview(b.images, rec.leaf_group,
                                                             [b.texts[p] for p in rec.leaf_prompt.tolist()])
            written: dict[int, int] = {}
            groups = _group_rewards(rec.leaf_group, leaf_rewards[offset : offset + rec.num_leaves], reward_names)
            roots_per_prompt = rec.root_state.shape[0] // rec.num_prompts
            for i in range(rec.num_leaves):
                p = int(rec.leaf_prompt[i])
                if written.get(p, 0) >= per_prompt:
                    continue
                written[p] = written.get(p, 0) + 1
                node = int(rec.leaf_node[i])
                files = _save_media(folder, f"s{b.slots[p]:04d}_n{node:04d}", media[i], fps)
                row = leaf_rewards[offset + i]
                root = 0 if shared_noise else int(rec.leaf_root[i]) % roots_per_prompt
                size, stats = groups[int(rec.leaf_group[i])]
                lines.append(json.dumps({
                    "prompt": b.texts[p], "metadata": b.metadata[p], "seed": seed, "iteration": step,
                    "noise_seed": derive_seed(STREAM_INITIAL_NOISE, seed, sampled_iteration, int(rec.prompt_ids[p]), root),
                    "prompt_slot": b.slots[p], "group": int(rec.leaf_group[i]), "group_size": size,
                    "group_rewards": stats, "node": node, "parent": parents[node],
                    "rewards": {n: _clean(float(row[k])) for k, n in enumerate(reward_names)},
                    "advantage": _clean(float(leaf_advantages[offset + i])), **files,
                    **_save_sources(folder, b.metadata[p]),
                }))
            offset += rec.num_leaves
        (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")

    def write_eval_samples(self, step, media, prompts, metadata, scores, reward_name: str, seed: int,
                           fps: int = 8) -> None:
        """A held-out evaluation's samples as ``samples/eval_<step>/``: the same prompts and seeds at
        every evaluation, so the gallery compares the base model (eval_0) with every later step."""
        if not self.enabled:
            return
        from samplers.grids import eval_noise_seed

        folder = self.dir / "samples" / f"eval_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        lines = []
        for i, (text, item) in enumerate(zip(prompts, media)):
            lines.append(json.dumps({
                "prompt": text, "metadata": metadata[i] if metadata else {}, "seed": seed, "iteration": step,
                "noise_seed": eval_noise_seed(seed, i),  # samplers.eval_noise's generator for prompt i
                "prompt_slot": i, "group": i, "group_size": 1, "node": 0, "parent": -1,
                "rewards": {reward_name: _clean(float(scores[i]))}, "advantage": None,
                **_save_media(folder, f"e{i:04d}", item, fps), **_save_sources(folder, metadata[i] if metadata else None),
            }))
        (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")

    def write_eval_scores(self, step: int, scores: torch.Tensor, tasks: list[str] | None) -> None:
        """Every held-out evaluation's per-sample scores (``eval_scores.jsonl``): the end-of-run
        before/after summary reads its first and last line (also after a resume)."""
        if self.enabled:
            with open(self.dir / "eval_scores.jsonl", "a") as f:
                f.write(json.dumps({"iteration": step, "scores": [_clean(float(x)) for x in scores],
                                    "tasks": tasks}) + "\n")

    def read_eval_scores(self) -> list[dict]:
        path = self.dir / "eval_scores.jsonl"
        if not path.is_file():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for row in rows:
            row["scores"] = torch.tensor([float("nan") if x is None else x for x in row["scores"]])
        return rows

    def close(self) -> None:
        for text, count in self._repeats.items():
            if count:
                tqdm.write(f"warning: repeated {count} more time{'s' if count > 1 else ''}: {text}", file=sys.stderr)
                self._line(f"WARNING repeated {count} more times: {text}")
        self._repeats.clear()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
