"""The papers' benchmark protocols: GenEval, OCR and PickScore (``flowgrpo eval --benchmark NAME``).

A protocol (configs/evaluation/<name>.yaml) is a shipped prompt set, a number of images per prompt, a seed, a
scorer (a reward plug-in: the same class that trains) and a report in the papers' table format. The inference
settings are the model's (:func:`sampling_settings`): a model config samples as the papers evaluate that model, and
a checkpoint as its run evaluated itself. :func:`run_protocol` samples the prompts in blocks (prompt i's image j from the noise
of (seed + j, i), so a block size or process count never changes an image), scores every image, keeps the images
in the gallery's format (``samples/eval_<label>/``: ``flowgrpo gallery OUT`` compares models prompt by prompt) and
returns the report; :func:`write_report` adds it to ``OUT/reports.jsonl`` (one row per evaluated model) and
renders every row as ``report.md`` and ``report.json``. docs/evaluation.md has each protocol, its source and what
may differ from the official numbers.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

PROTOCOLS = ("geneval", "ocr", "pickscore")
GENEVAL_COLUMNS = {"single_object": "Single object", "two_object": "Two objects", "counting": "Counting",
                   "colors": "Colors", "position": "Position", "color_attr": "Color attribution"}


@dataclass
class Protocol:
    """One benchmark's settings (the fields of configs/evaluation/<name>.yaml)."""

    name: str
    title: str
    prompts: str
    images_per_prompt: int
    seed: int
    reward: dict  # name and constructor keywords of the scorer
    report: str  # "geneval" (the six tasks and their mean) or "mean" (the mean score, as `column`)
    column: str = ""
    source: Path = field(default_factory=Path)


def load_protocol(name: str) -> Protocol:
    """The protocol ``name`` (one of PROTOCOLS) from configs/evaluation/."""
    import yaml

    from flowgrpo.run.errors import UserError
    from flowgrpo.run.paths import configs_dir

    if name not in PROTOCOLS:
        raise UserError(f"--benchmark {name!r} is not one of {', '.join(PROTOCOLS)} (configs/evaluation/)")
    path = configs_dir() / "evaluation" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    return Protocol(name=name, source=path, **data)


SETTINGS = ("steps", "guidance_scale", "resolution")


def sampling_settings(model_config: dict, run_config: dict | None = None, **given) -> dict:
    """The steps, guidance scale and resolution an evaluation samples with, and where each comes from.

    In order: ``given`` (the command line's; None = not given); then, for a checkpoint, its run's held-out
    evaluation (``run_config``: the run's eval.steps, and eval.guidance_scale or else its rollout's
    sampling.guidance_scale: a run trained CFG-free is evaluated CFG-free, as Flow-GRPO's and DiffusionNFT's
    evaluations sample at their rollout's guidance); then the model config's own (sample_steps, guidance_scale,
    resolution: for each model a paper evaluates, the paper's settings, checked by tests/cli/test_protocols.py).
    Returns {key: value} for SETTINGS and ``from``: {key: "command line" | "the run's" | "the model config's"}."""
    run = run_config or {}
    ev, sampling = run.get("eval") or {}, run.get("sampling") or {}
    from_run = {"steps": ev.get("steps"),
                "guidance_scale": next((v for v in (ev.get("guidance_scale"), sampling.get("guidance_scale"))
                                        if v is not None), None),
                "resolution": None}  # the run's model section is the model config when no --model is given
    own = {"steps": model_config.get("sample_steps"), "guidance_scale": model_config.get("guidance_scale"),
           "resolution": model_config.get("resolution")}
    settings, origin = dict.fromkeys(SETTINGS), {}  # None: the model has none (the analytic world's resolution)
    for key in SETTINGS:
        for where, value in (("command line", given.get(key)), ("the run's", from_run[key]),
                             ("the model config's", own[key])):
            if value is not None:
                settings[key], origin[key] = value, where
                break
    return {**settings, "from": origin}


def label_of(model_name: str, checkpoint: str | None) -> str:
    """The row label of an evaluation: the model config's name, or ``<run>/step_<n>`` for a checkpoint."""
    if not checkpoint:
        return model_name
    path = Path(checkpoint).resolve()
    if path.name == "model":
        path = path.parent
    run = path.parent.parent.name if path.parent.name == "checkpoints" else path.parent.name
    return f"{run}/{path.name}"


def iteration_of(checkpoint: str | None) -> int | None:
    """The training step an evaluation is of: 0 for the base model, n for a checkpoint step_<n>, else None."""
    if not checkpoint:
        return 0
    path = Path(checkpoint).resolve()
    match = re.fullmatch(r"step_(\d+)", (path.parent if path.name == "model" else path).name)
    return int(match.group(1)) if match else None


def _folder_name(label: str) -> str:
    return "eval_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", label)


def geneval_report(correct: torch.Tensor, tasks: list[str]) -> dict:
    """GenEval's summary (its summary_scores.py): ``correct`` [K images, N prompts] of 0/1 (NaN: not scored);
    each task's accuracy over its images, overall = the mean of the task accuracies, and the share of correct
    images and of prompts with at least one correct image."""
    per_task = {}
    for task in GENEVAL_COLUMNS:
        columns = [i for i, t in enumerate(tasks) if t == task]
        if columns:
            values = correct[:, columns]
            per_task[task] = float(values[~values.isnan()].mean()) if (~values.isnan()).any() else math.nan
    valid = ~correct.isnan()
    return {
        "tasks": per_task,
        "overall": sum(per_task.values()) / len(per_task) if per_task else math.nan,
        "correct_images": float(correct[valid].mean()) if valid.any() else math.nan,
        "correct_prompts": float((correct.nan_to_num(0) > 0).any(0).float().mean()),
    }


def mean_report(scores: torch.Tensor, column: str) -> dict:
    """The mean score over every scored image (``scores`` [K, N]; NaN: not applicable), with its standard error."""
    valid = scores[~scores.isnan()].double()
    n = valid.numel()
    return {"metric": column, column: float(valid.mean()) if n else math.nan,
            "standard_error": float(valid.std() / n ** 0.5) if n > 1 else math.nan, "not_applicable": int(scores.numel() - n)}


def run_protocol(model, protocol: Protocol, reward, *, label: str, limit: int | None = None, block: int = 64,
                 batch_size: int = 16, out: Path | None = None, processes=None, progress: bool = True,
                 steps: int | None = None, guidance_scale: float | None = None, iteration: int | None = 0) -> dict:
    """Sample and score the protocol's prompts with ``model`` and return its report (see the module docstring).
    ``block``: prompts sampled and scored at a time (memory); ``processes``: (rank, world, gather), every process
    calls this and takes its share of each block; only rank 0 writes the images (to ``out``), each with
    ``iteration`` (the training step of the weights: the gallery orders the models by it)."""
    from flowgrpo.data import read_prompts
    from flowgrpo.evaluate import evaluate

    started = time.time()
    prompts, metadata = read_prompts(protocol.prompts)
    of_prompts = len(prompts)
    prompts, metadata = prompts[: limit or None], metadata[: limit or None]
    n, k = len(prompts), protocol.images_per_prompt
    scores = torch.full((k, n), math.nan)
    rank = processes[0] if processes else 0
    writer = (_SampleWriter(out / "samples" / _folder_name(label), label, protocol.name, k, iteration)
              if out is not None and rank == 0 else None)
    for start in range(0, n, block):
        chunk, meta = prompts[start : start + block], metadata[start : start + block]
        for j in range(k):
            _, images, chunk_scores = evaluate(
                model, chunk, reward, meta, seed=protocol.seed + j, steps=steps, guidance_scale=guidance_scale,
                batch_size=batch_size, progress=progress, processes=processes, first_index=start,
                desc=f"{protocol.title}: prompts {start + 1}-{start + len(chunk)} of {n}, image {j + 1} of {k}")
            scores[j, start : start + len(chunk)] = chunk_scores.float()
            if writer is not None:
                writer.add(images, chunk, meta, chunk_scores, start, j, protocol.seed + j)
    tasks = [m.get("task", "") for m in metadata]
    body = geneval_report(scores, tasks) if protocol.report == "geneval" else mean_report(scores, protocol.column)
    return {
        "benchmark": protocol.name, "label": label, "prompts": n, "of_prompts": of_prompts,
        "images_per_prompt": k, "images": n * k, "seed": protocol.seed,
        "steps": steps or model.config.sample_steps,
        "guidance_scale": guidance_scale if guidance_scale is not None else model.config.guidance_scale,
        "resolution": model.config.resolution, "scorer": dict(protocol.reward), **body,
        "seconds": round(time.time() - started, 1),
    }


class _SampleWriter:
    """The images of one evaluation in the gallery's format: one group per prompt (its K images are the group's
    samples), the score as the reward column."""

    def __init__(self, folder: Path, label: str, benchmark: str, k: int, iteration: int | None):
        self.folder, self.label, self.benchmark, self.k, self.iteration = folder, label, benchmark, k, iteration
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():  # a rerun of the same label replaces its images
            if old.is_file():
                old.unlink()
        self.lines: list[str] = []

    def add(self, images, prompts, metadata, scores, start: int, j: int, seed: int) -> None:
        from flowgrpo.run.run_dir import _save_media, _save_sources
        from samplers.grids import eval_noise_seed

        for i, (image, prompt) in enumerate(zip(images, prompts)):
            index = start + i
            score = float(scores[i])
            self.lines.append(json.dumps({
                "prompt": prompt, "metadata": metadata[i] or {}, "seed": seed, "noise_seed": eval_noise_seed(seed, index),
                **({"iteration": self.iteration} if self.iteration is not None else {}),
                "prompt_slot": index, "group": index, "group_size": self.k, "node": j, "parent": -1,
                "rewards": {self.benchmark: None if math.isnan(score) else score}, "advantage": None,
                "model": self.label, **_save_media(self.folder, f"p{index:05d}_{j}", image, 8),
                **_save_sources(self.folder, metadata[i]),
            }))
        # the manifest of every image so far: an evaluation stopped midway leaves its images viewable
        (self.folder / "manifest.jsonl").write_text("\n".join(self.lines) + "\n")


def markdown_table(reports: list[dict]) -> str:
    """The papers' table of one benchmark's reports, a row per evaluated model."""
    first = reports[0]
    if first["benchmark"] == "geneval":
        head = ["Model", *GENEVAL_COLUMNS.values(), "Overall"]
        rows = [[r["label"], *(_cell(r["tasks"].get(t)) for t in GENEVAL_COLUMNS), _cell(r["overall"])] for r in reports]
    else:
        column = first["metric"]
        head = ["Model", column]
        rows = [[r["label"], _cell(r[column], r.get("standard_error"))] for r in reports]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    notes = [f"- {r['label']}: {r['prompts']} of {r['of_prompts']} prompts x {r['images_per_prompt']} images, "
             f"{r['steps']} steps, CFG {r['guidance_scale']}{_origin(r, 'guidance_scale')}, {r['resolution']} px, "
             f"seed {r['seed']}" for r in reports]
    return "\n".join(lines + [""] + notes) + "\n"


def _origin(report: dict, key: str) -> str:
    """' (its run's)' where a checkpoint's setting came from its run (a CFG-free run is evaluated CFG-free)."""
    return " (its run's)" if report.get("settings_from", {}).get(key) == "the run's" else ""


def _cell(value, se=None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.2f}" if se is None or math.isnan(se) else f"{value:.2f} ± {se:.2f}"


def check_out(out: Path, benchmark: str) -> None:
    """Refuse, before anything is sampled, an --out folder that cannot be written or holds another benchmark's reports."""
    from flowgrpo.run.errors import UserError

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {str(out)!r} cannot be created ({exc.strerror}); pass a folder you can write") from None
    path = out / "reports.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    mixed = {r.get("benchmark") for r in rows} - {benchmark}
    if mixed:
        raise UserError(f"--out {str(out)!r} holds {', '.join(sorted(map(str, mixed)))} reports; give each benchmark "
                        f"its own folder (the default is evals/{benchmark})")


def write_report(out: Path, report: dict) -> str:
    """Add ``report`` to ``out/reports.jsonl`` (replacing an earlier row of its label) and write every row as
    ``report.json`` and the Markdown table ``report.md``; returns the table."""
    check_out(out, report["benchmark"])
    path = out / "reports.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    rows = [r for r in rows if r["label"] != report["label"]] + [report]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "report.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = markdown_table(rows)
    (out / "report.md").write_text(f"# {rows[0]['benchmark']}\n\n{table}")
    return table


__all__ = ["PROTOCOLS", "Protocol", "SETTINGS", "check_out", "geneval_report", "iteration_of", "label_of", "load_protocol",
           "markdown_table", "mean_report", "run_protocol", "sampling_settings", "write_report"]
