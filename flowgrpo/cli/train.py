"""The command line of the training scripts (train_t2i.py, train_t2v.py): one parser, one config
path, clear errors. Each script only names its embedded default config."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
from pathlib import Path

import torch

from flowgrpo.config import load_config
from flowgrpo.data import PromptFileError, draw_batch_prompts, read_prompts, strata
from flowgrpo.run.errors import EXIT_USER_ERROR, UserError, reward_class
from flowgrpo.run.interrupts import Interrupted, follow_launcher, hold_signals, resume_command
from flowgrpo.run.paths import configs_dir, resolve_pretrained
from flowgrpo.run.threads import set_threads


def _names(folder: str) -> list[str]:
    """The YAML files of configs/<folder>/, by name (read at run time: a new preset file is listed at once)."""
    try:
        root = configs_dir() / folder
    except FileNotFoundError:
        return []
    return sorted(p.stem for p in root.glob("*.yaml"))


def _epilog(prog: str, default: str) -> str:
    """What --help shows after the options: every preset and model config, and where each key is explained."""
    here = Path(__file__).resolve().parent
    full = [n for n in _names(".") if not n.startswith("default")]
    wrap = lambda text: textwrap.fill(text, width=100, subsequent_indent="    ", break_on_hyphens=False)  # noqa: E731
    lines = [
        wrap(f"presets (--preset NAME, configs/presets/): {', '.join(_names('presets'))}"),
        wrap(f"models (--model NAME, configs/models/): {', '.join(_names('models'))}"),
        wrap(f"full configs (--config FILE, configs/): {', '.join(f'configs/{n}.yaml' for n in full)}"),
        wrap(f"defaults: configs/{default}.yaml; every key (for key=value and the YAML files) is commented in "
             f"flowgrpo/config/schema.py ({here / 'config' / 'schema.py'}); methods: docs/learner.md; bad input and its messages: "
             "docs/errors.md"),
        "",
        "examples:",
        f"  accelerate launch {prog} --preset mixgrpo",
        f"  accelerate launch {prog} --preset grpo_guard train.iterations=100 sampling.plan.group_size=12",
    ]
    if prog == "train_t2i.py":
        lines.append(f"  accelerate launch {prog} --config configs/analytic.yaml      # the analytic world, seconds on CPU")
    return "\n".join(lines)


def preflight(cfg) -> None:
    """Check what the config names before anything heavy loads (seconds, not a model load later): the
    model folder or built-in model, the training and evaluation prompt sets, and every reward name.
    Raises a UserError naming the fix."""
    try:
        resolve_pretrained(cfg.model.pretrained)  # a missing built-in model names the command that builds it
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    _, metadata = read_prompts(cfg.prompts)
    if cfg.train.balance_by:
        strata(metadata, cfg.train.balance_by, cfg.prompts)
    if cfg.train.prompt_draw == "batch":  # each batch's distinct prompts must fit in the set
        draw_batch_prompts(0, 0, cfg.train.prompts_per_iteration // cfg.sampling.batches_per_iteration, len(metadata), 0)
    try:
        _, eval_metadata = read_prompts(cfg.eval.prompts, cfg.eval.limit)
    except PromptFileError as exc:
        raise PromptFileError(f"eval.prompts: {exc}") from None
    rewards = [(reward_class(spec.name, f"rewards[{i}].name"), f"rewards[{i}].name", "prompts", cfg.prompts, metadata)
               for i, spec in enumerate(cfg.rewards)]
    rewards.append((reward_class(cfg.eval.reward, "eval.reward"), "eval.reward", "eval.prompts", cfg.eval.prompts,
                    eval_metadata))
    check_conditions(cfg, [("prompts", cfg.prompts, metadata), ("eval.prompts", cfg.eval.prompts, eval_metadata)], rewards)


def check_conditions(cfg, sets: list[tuple], rewards: list[tuple]) -> None:
    """Condition images where they can go (flowgrpo/conditions.py): a set that carries them needs a family that takes
    that many (an editing family), and a reward that judges a result against its source needs a set that carries them;
    both sets carry the same number."""
    from flowgrpo.conditions import count
    from flowgrpo.models.families import FAMILIES

    family = FAMILIES.get(cfg.model.family)
    limit = family.max_references if family is not None else 0
    counts = {}
    for key, spec, rows in sets:
        counts[key] = n = count(rows)
        if n and not limit:
            editing = ", ".join(sorted(name for name, f in FAMILIES.items() if f.max_references))
            raise UserError(f"{key}={spec!r} carries {n} condition image(s) per prompt but model.family="
                            f"{cfg.model.family} generates from text alone; train an editing family ({editing}: "
                            "e.g. --config configs/edit.yaml or --model flux1_kontext_dev) or use a set without 'image'")
        if n > limit:
            raise UserError(f"{key}={spec!r} carries {n} condition images per prompt; model.family={cfg.model.family} "
                            f"takes at most {limit}")
    if len(set(counts.values())) > 1:
        raise UserError(f"prompts carry {counts['prompts']} condition image(s) per prompt and eval.prompts "
                        f"{counts['eval.prompts']}; evaluate on the same kind of prompts as the run trains on")
    for cls, key, set_key, spec, rows in rewards:
        if getattr(cls, "sees_condition", False) and not count(rows):
            raise UserError(f"{key}: reward {cls.name!r} judges a result against its source image, and {set_key}="
                            f"{spec!r} carries none; give it an editing set whose rows carry 'image' (docs/editing.md) "
                            "or a reward that scores the result alone")


def build_gallery(cfg) -> None:
    """The run's review site (gallery/, ``log.gallery``), built by the main process once the run has finished;
    a finished run never fails because of it (a warning names the command that builds it)."""
    from accelerate import PartialState

    if not (cfg.log.gallery and PartialState().is_main_process and (cfg.run_dir / "samples").is_dir()):
        return
    from flowgrpo.run.run_dir import RunWriter
    from gallery.build import build_site

    writer = RunWriter(cfg.run_dir, tensorboard=False)
    try:
        site = build_site(writer.dir)
        writer.info(f"gallery: {site} (serve it with: python -m gallery {writer.dir} --serve)")
        writer.info(f"compare the base model with the last step: open {site}#view=compare (or, served, "
                    "http://127.0.0.1:8000/#view=compare)")
    except Exception as err:
        writer.warn(f"the gallery could not be built ({err!r}); run: python -m gallery {writer.dir}")


def leave_processes() -> None:
    """End a multi-process run together: every process waits for the others (rank 0 may still be building the
    gallery), then the process group is destroyed. Left to the interpreter's exit, gloo's worker threads can be
    torn down while still joinable, which aborts a finished process ("terminate called without an active
    exception") and makes the launcher report a failed run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def main(argv: list[str] | None, *, prog: str, description: str, default: str) -> int:
    """Parse ``[--preset NAME] [--model NAME] [--config YAML] [key=value ...]``, build the config on
    top of configs/<default>.yaml and train. Bad input (a UserError: config, prompts, rewards, model
    path) prints one line naming the fix and returns 2; ``--debug`` raises it with its traceback. SIGINT or
    SIGTERM stops the run with a checkpoint and one line saying how to resume (flowgrpo/run/interrupts.py), and
    returns 130 or 143."""
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=_epilog(prog, default),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", help="a method preset: a name in configs/presets (listed below) or a YAML file")
    parser.add_argument("--model", help="a model config: a name in configs/models (listed below) or a YAML file")
    parser.add_argument("--config", help="a full config YAML (e.g. configs/analytic.yaml) merged before the preset")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="torch CPU threads per process (the config key threads=N); default: automatic, "
                             "printed at start-up (flowgrpo/run/threads.py)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error in the input too")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of any config key (flowgrpo/config/schema.py)")
    args = parser.parse_intermixed_args(argv)  # options and key=value overrides in any order
    restore_handlers = lambda: None  # noqa: E731
    if argv is None:  # the script itself: under a launcher, stop when it dies (no orphan) and name it in the resume line
        follow_launcher()
        restore_handlers = hold_signals()
    command = resume_command(sys.argv[0] if argv is None else prog, sys.argv[1:] if argv is None else list(argv))
    overrides = list(args.overrides) + ([f"threads={args.threads}"] if args.threads is not None else [])
    threads_before = torch.get_num_threads()
    try:
        cfg = load_config(args.preset, args.model, overrides, base=args.config, default=default)
        preflight(cfg)
        set_threads(cfg.threads)  # printed by the trainer when the run starts
        from flowgrpo.engine.trainer import train  # after parsing: --help and bad arguments answer fast

        train(cfg)
        build_gallery(cfg)
        leave_processes()
    except UserError as exc:
        if args.debug:
            raise
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Interrupted as stop:  # a checkpoint is saved (or there was nothing to save): one line, 128 + signal
        if os.environ.get("RANK", "0") == "0":
            print(stop.line(command), file=sys.stderr)
        return stop.exit_status
    except KeyboardInterrupt:  # main() called in process (no hold_signals), or a second Ctrl-C
        print(Interrupted(signal.SIGINT).line(command), file=sys.stderr)
        return 128 + int(signal.SIGINT)
    finally:
        restore_handlers()
        torch.set_num_threads(threads_before)  # main() called in a process that goes on (tests) leaves it as it was
    return 0
