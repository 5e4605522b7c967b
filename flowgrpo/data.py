"""Prompt sets: the toy splits, the papers' evaluation sets and the official runs' training sets by name, or a user's .txt / .jsonl file, with
per-prompt metadata."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import samplers
from flowgrpo import conditions
from flowgrpo.prompt_sets import TRAINING_PROMPT_SETS, prompt_set_file
from flowgrpo.run.errors import UserError
from samplers.grids import STREAM_PROMPT_BATCH, STREAM_PROMPT_GROUPS, STREAM_PROMPT_IN_GROUP, STREAM_PROMPT_PASS
from worlds import analytic
from worlds.toy import clips, edits, scenes


class PromptFileError(UserError, ValueError):
    """A prompt set that cannot be read; the message names the fix."""


MAX_FILE_BYTES = 1 << 30  # a prompt set is read whole into memory
MAX_PROMPT_CHARS = 20_000  # far past every text encoder's window (77-512 tokens): a file without line breaks


def _check_prompt(text: str, where: str) -> None:
    """A prompt is text: no control characters but tabs (a binary file decodes as UTF-8 more often than one thinks),
    and not longer than MAX_PROMPT_CHARS."""
    bad = next((c for c in text if (ord(c) < 32 and c != "\t") or ord(c) == 127), None)
    if bad is not None:
        raise PromptFileError(f"{where} holds the control character U+{ord(bad):04X}: a prompts file is text (is it a "
                              "binary file?); one prompt a line (.txt) or JSON lines (.jsonl)")
    if len(text) > MAX_PROMPT_CHARS:
        raise PromptFileError(f"{where} is a prompt of {len(text):,} characters (at most {MAX_PROMPT_CHARS:,}; text "
                              "encoders read 77-512 tokens): put one prompt on each line")


# the built-in prompt sets: name -> the function of their world (worlds/) that lists them
BUILTIN_PROMPT_SETS = {
    "toy-train": scenes.train_prompts, "toy-eval": scenes.eval_prompts,
    "toy-video-train": clips.train_prompts, "toy-video-eval": clips.eval_prompts,
    "analytic-train": analytic.train_prompts, "analytic-eval": analytic.eval_prompts,
    "toy-edit-train": edits.train_edits, "toy-edit-eval": edits.eval_edits,
}
# the editing world's sets carry a source image per row: rendered once at this size (the tiny edit model's) into the
# cache, then read like a user's edit set (flowgrpo/conditions.py)
TOY_EDIT_SOURCE_SIZE = 32


def toy_edit_sources(items: list, spec: str) -> list[str]:
    """The source image files of the editing world's records ``items``: rendered once into
    ``$FLOWGRPO_CACHE/toy-edit/<spec>-<hash of the records>/`` (a change of the world renders a new folder)."""
    import hashlib

    from PIL import Image

    from flowgrpo.prompt_sets import cache_dir

    digest = hashlib.sha1(json.dumps([p.to_dict() for p in items], sort_keys=True).encode()).hexdigest()[:12]
    folder = cache_dir().parent / "toy-edit" / f"{spec}-{TOY_EDIT_SOURCE_SIZE}-{digest}"
    paths = [folder / f"{i:05d}.png" for i in range(len(items))]
    if not (folder / "complete").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        for item, path in zip(items, paths):
            Image.fromarray(edits.render_source(item, TOY_EDIT_SOURCE_SIZE)).save(path)
        (folder / "complete").write_text("")
    return [str(path) for path in paths]
# the papers' evaluation prompt sets, shipped in configs/evaluation/ (their sources and licences: SOURCES.md there)
EVALUATION_PROMPT_SETS = {
    "geneval": "geneval_prompts.jsonl",  # GenEval's 553 prompts with their tag, objects, counts, colours, positions
    "ocr-test": "ocr_test.txt",  # Flow-GRPO's 1,018 held-out text-rendering prompts
    "pickscore-test": "pickscore_test.txt",  # Flow-GRPO's 2,048 Pick-a-Pic test prompts
}


def evaluation_prompt_file(name: str) -> Path:
    """The shipped file of an evaluation prompt set (EVALUATION_PROMPT_SETS)."""
    from flowgrpo.run.paths import configs_dir

    return configs_dir() / "evaluation" / EVALUATION_PROMPT_SETS[name]


def read_prompts(spec: str, limit: int = 0) -> tuple[list[str], list[dict]]:
    """Prompts and metadata from a built-in set (BUILTIN_PROMPT_SETS: 'toy-train', 'toy-eval' (toy
    images), 'toy-video-train', 'toy-video-eval' (toy videos), 'analytic-train', 'analytic-eval' (the
    analytic world)), a papers' evaluation set (EVALUATION_PROMPT_SETS: 'geneval', 'ocr-test',
    'pickscore-test'; docs/evaluation.md), an official run's training set (flowgrpo/prompt_sets.py: 'geneval-train',
    'ocr-train', 'pickscore-train', 'hpd-train'; fetched on first use), a .txt file (one prompt a line) or a .jsonl file ({"prompt": ..., "metadata":
    {...}} a line; metadata optional; ``"image"`` or ``"images"``: the row's condition images, checked now and kept
    as absolute paths in its metadata's ``"images"``, flowgrpo/conditions.py)."""
    if spec in BUILTIN_PROMPT_SETS:
        items = BUILTIN_PROMPT_SETS[spec]()
        prompts, metadata = [p.text for p in items], [p.to_dict() for p in items]
        if spec.startswith("toy-edit-"):  # each row's source image, as a user's edit set names it
            for m, path in zip(metadata, toy_edit_sources(items, spec)):
                m[conditions.KEY] = [path]
    else:
        if spec in TRAINING_PROMPT_SETS:  # an official run's training set: shipped, fetched, or fetched now
            path = prompt_set_file(spec)
        else:
            path = evaluation_prompt_file(spec) if spec in EVALUATION_PROMPT_SETS else Path(spec)
        if not path.is_file():
            names = [*BUILTIN_PROMPT_SETS, *EVALUATION_PROMPT_SETS, *TRAINING_PROMPT_SETS]
            raise PromptFileError(
                f"prompts {spec!r} is neither a built-in set ({', '.join(names)}) "
                "nor an existing "
                '.txt (one prompt a line) or .jsonl ({"prompt": ..., "metadata": {...}} a line) file'
            )
        try:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                raise PromptFileError(f"prompts {spec!r} is {size / 2**30:.1f} GiB, more than the {MAX_FILE_BYTES >> 30} "
                                      "GiB a prompt set may be (it is read whole into memory): split it, or sample "
                                      "the prompts you train on into a smaller file")
            numbered = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                        if line.strip()]
        except UnicodeDecodeError as exc:
            raise PromptFileError(f"prompts {spec!r} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as "
                                  "UTF-8 (one prompt a line, or JSON lines)") from None
        except OSError as exc:
            raise PromptFileError(f"prompts {spec!r} cannot be read ({exc.strerror}); check its permissions") from None
        if path.suffix == ".jsonl":
            rows = []
            for number, line in numbered:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise PromptFileError(f"{path}:{number} is not valid JSON ({exc})") from exc
            prompts = [r.get("prompt", r.get("text")) if isinstance(r, dict) else None for r in rows]
            if any(not isinstance(p, str) for p in prompts):
                raise PromptFileError(f"every line of {path} needs a string 'prompt' (or 'text') field")
            metadata = [r.get("metadata", r) for r in rows]
            for m in metadata:  # GenEval's "tag" is its task: per-task means and balancing read "task"
                if isinstance(m, dict) and "tag" in m and "task" not in m:
                    m["task"] = m["tag"]
            for (number, _), row, m in zip(numbered, rows, metadata):  # condition images: checked now, kept absolute
                if "image" in row or conditions.KEY in row:
                    if not isinstance(m, dict):
                        raise PromptFileError(f"{path}:{number}: 'metadata' must be a JSON object when the row has images")
                    conditions.resolve_row(row, m, path.parent, f"{path}:{number}")
            conditions.check_counts(metadata, spec)
        else:
            prompts, metadata = [line.strip() for _, line in numbered], [{} for _ in numbered]
        for (number, _), prompt in zip(numbered, prompts):
            _check_prompt(prompt, f"{path}:{number}")
    if limit:
        prompts, metadata = prompts[:limit], metadata[:limit]
    if not prompts:
        raise PromptFileError(f"no prompts in {spec!r}; write one prompt a line (.txt) or one "
                              '{"prompt": ...} a line (.jsonl)')
    return prompts, metadata


REAL_MODEL_PARAMETERS = 100_000_000  # a network this large is no tiny world's (tiny-sd3, tiny-wan: a few million)


def toy_prompts_warning(spec: str, model) -> str:
    """The start-up warning of a real model trained on a tiny world's prompts (a built-in toy or analytic set: the
    schema's default, which a run on a real model keeps unless its preset's recipe or the user names a set), else ""."""
    if spec not in BUILTIN_PROMPT_SETS:
        return ""
    network = getattr(model, "transformer", None)
    size = sum(p.numel() for p in network.parameters()) if network is not None else 0
    if size < REAL_MODEL_PARAMETERS:
        return ""
    return (f"prompts={spec!r} is the tiny world's prompt set, and this model has {size / 1e9:.1f}B parameters: a real "
            "model trains on the prompts of its task, e.g. an official run's (`flowgrpo prompts list`: geneval-train, "
            "ocr-train, pickscore-train, hpd-train; a preset's recipe names its launch's) or your own .txt/.jsonl file")


def report_training_prompts(writer, cfg, count: int, groups: dict | None, model) -> None:
    """The start-up lines about the training prompts: how a balanced draw splits them (train.balance_by), and the
    warning of a real model trained on the tiny world's prompts (``toy_prompts_warning``)."""
    if cfg.train.balance_by:
        key = cfg.train.balance_by
        writer.info(f"training prompts: {count}, drawn uniformly (none carries metadata {key!r})" if groups is None else
                    f"training prompts: {count} in {len(groups)} groups of {key!r} "
                    f"({', '.join(f'{v} {len(g)}' for v, g in groups.items())}), each group drawn equally often")
    warning = toy_prompts_warning(cfg.prompts, model)
    if warning:
        writer.warn(warning)


def strata(metadata: list[dict], key: str, spec: str = "prompts") -> dict[str, list[int]] | None:
    """The prompt indices grouped by ``metadata[i][key]`` (train.balance_by), {value: indices} ordered by value;
    None when no prompt carries the key (a plain .txt file: every prompt is drawn uniformly).

    A set where some prompts carry the key and others do not is refused with the fix: balancing it would
    silently leave the unlabelled prompts out or lump them together."""
    labelled = [isinstance(m, dict) and key in m for m in metadata]
    if not any(labelled):
        return None
    if not all(labelled):
        i = labelled.index(False)
        raise PromptFileError(
            f"train.balance_by={key!r} but prompt {i} of {spec!r} has no metadata {key!r} while others do; give every "
            f'line of the .jsonl file {{"prompt": ..., "metadata": {{"{key}": ...}}}}, or set train.balance_by=\'\' to '
            "draw prompts uniformly")
    groups: dict[str, list[int]] = {}
    for i, m in enumerate(metadata):
        groups.setdefault(str(m[key]), []).append(i)
    return {v: groups[v] for v in sorted(groups)}


def draw_prompt(position: int, count: int, seed: int, groups: list[list[int]] | None = None) -> int:
    """The prompt index of the ``position``-th training slot of a run (iteration × prompts per iteration + slot).

    Without groups: a seeded permutation of the ``count`` prompts per pass, so each pass draws every
    prompt once. With groups (the values of ``strata``): each run of len(groups) slots holds one prompt of every
    group in a seeded order, and each group's prompts come in their own seeded permutation per pass
    over that group, so a group of 2 prompts and one of 744 are drawn equally often. A pure function
    of its arguments (resume, processes and batch sizes draw the same prompts)."""
    def permutation(n: int, *parts: int) -> torch.Tensor:
        return torch.randperm(n, generator=samplers.make_generator(seed, *parts))

    if groups is None:
        epoch, offset = divmod(position, count)
        return int(permutation(count, STREAM_PROMPT_PASS, epoch)[offset])
    cycle, k = divmod(position, len(groups))
    group = int(permutation(len(groups), STREAM_PROMPT_GROUPS, cycle)[k])
    members = groups[group]
    epoch, offset = divmod(cycle, len(members))
    return members[int(permutation(len(members), STREAM_PROMPT_IN_GROUP, group, epoch)[offset])]


def draw_batch_prompts(iteration: int, batch: int, size: int, count: int, seed: int) -> list[int]:
    """train.prompt_draw=batch: the prompt indices of rollout batch ``batch`` of ``iteration``, ``size`` distinct
    prompts of the ``count`` chosen at random, independently of every other batch (the Flow-GRPO-family codes'
    DistributedKRepeatSampler draws a fresh permutation per batch and keeps its first prompts). A prompt can come
    back in the next batch before others were ever drawn. A pure function of its arguments."""
    if size > count:
        raise PromptFileError(f"train.prompt_draw=batch draws {size} distinct prompts a rollout batch from a set of "
                              f"{count}: use a larger prompt set, fewer train.prompts_per_iteration (or more "
                              "sampling.batches_per_iteration), or train.prompt_draw=pass")
    generator = samplers.make_generator(seed, STREAM_PROMPT_BATCH, iteration, batch)
    return torch.randperm(count, generator=generator)[:size].tolist()
