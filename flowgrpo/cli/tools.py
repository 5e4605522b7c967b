"""The ``flowgrpo`` command: the jobs that are not training (training is ``accelerate launch train_t2i.py``).

  flowgrpo eval          a papers' benchmark (--benchmark geneval|ocr|pickscore: its prompts, images, seeds,
                         settings, scorer and table, docs/evaluation.md), or sample a prompt set with a model
                         (or a trained checkpoint), score it with a reward and print a JSON summary: mean
                         score, strict accuracy, per-task means, number of images, seconds
  flowgrpo gallery       build (or --serve) the sample review site of a run directory (the same as
                         ``python -m gallery`` and ``flowgrpo-gallery``)
  flowgrpo pretrain-toy  (re)build the embedded tiny SD3 model on the toy world (resumable)
  flowgrpo pretrain-toy-video  (re)build the embedded tiny Wan2.1 model on the toy video world (resumable)
  flowgrpo pretrain-toy-edit   (re)build the embedded tiny FLUX.1-Kontext edit model on the toy editing world
  flowgrpo plan          GPU memory per process of training a model (weights, gradients, optimizer, weight
                         copies, frozen encoders, rollout latents, activations) and the largest group and
                         micro-batch that fit, from the architecture alone (docs/memory.md)
  flowgrpo config        the fully resolved configuration of a run as YAML (the method's whole sampler plan
                         included), each key with the layer that set it: what will run, before GPU time is spent

Run ``flowgrpo <command> --help`` for the options.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from flowgrpo.cli.evaluation import cmd_eval, model_yaml


class UserExit(SystemExit):
    """Bad input, after its one line was printed: exit status 2 (as argparse's usage errors), and the
    line as the exception's text for callers of main()."""

    def __init__(self, line: str):
        super().__init__(line)
        self.code = 2


def cmd_plan(args) -> int:
    """Print the memory plan of --model (flowgrpo/memory/; docs/memory.md)."""
    from omegaconf import OmegaConf

    from flowgrpo.models.config import validate_model_config
    from flowgrpo.memory import (DEFAULT_COPIES, chunk_that_fits, context_parallel_refusal, format_plan, plan,
                                 planned_families, read_architecture)
    from flowgrpo.run.errors import UserError
    from flowgrpo.run.paths import configs_dir

    path = model_yaml(args.model)
    for option, value in (("--processes", args.processes), ("--group", args.group), ("--micro-batch", args.micro_batch),
                          ("--steps", args.steps), ("--context-parallel", args.context_parallel),
                          ("--height", args.height), ("--width", args.width), ("--frames", args.frames)):
        if value is not None and value < 1:
            raise UserError(f"{option} must be >= 1, got {value}")
    if args.chunk is not None and args.chunk < 0:
        raise UserError(f"--chunk must be >= 0 (0: the plan's choice), got {args.chunk}")
    if args.references is not None and args.references < 0:
        raise UserError(f"--references must be >= 0 (condition images per prompt), got {args.references}")
    size = {k: v for k, v in (("resolution", args.height), ("width", args.width), ("num_frames", args.frames))
            if v is not None}
    model_config = validate_model_config({**OmegaConf.to_container(OmegaConf.load(path), resolve=True), **size})
    if model_config.family not in planned_families():
        raise UserError(f"--model {args.model!r} is of the {model_config.family!r} family, which has no architecture "
                        f"to plan; flowgrpo plan covers the {', '.join(planned_families())} families")
    if not args.gpu_memory > 0:
        raise UserError(f"--gpu-memory must be > 0 GiB, got {args.gpu_memory}")
    if args.fsdp and args.processes is None:
        raise UserError("--fsdp shards over the processes: give --processes N")
    processes = args.processes or 1
    if processes % args.context_parallel:
        raise UserError(f"--context-parallel {args.context_parallel} splits each sample over that many of the "
                        f"processes: give --processes a multiple of it (got {processes})")
    group = args.group
    if group is None:  # the default run config's group size (the video default for video families)
        default = "default_t2v.yaml" if model_config.family == "wan" else "default.yaml"
        group = int(OmegaConf.load(configs_dir() / default).sampling.plan.group_size)
    copies = DEFAULT_COPIES if args.copies is None else tuple(c for c in args.copies.split(",") if c)
    arch = read_architecture(model_config, name=path.stem)
    refusal = context_parallel_refusal(arch, args.context_parallel)
    if refusal:
        raise UserError(refusal)

    def planned(chunk):
        return plan(arch, model_config, processes, args.fsdp, args.finetune, args.gpu_memory, group=group,
                    micro_batch=args.micro_batch, steps=args.steps, checkpointing=False if args.no_checkpointing else None,
                    copies=copies, master_dtype="float32" if args.master_weights == "float32" else None,
                    train_cfg=args.train_cfg, name=path.stem, context_parallel=args.context_parallel, chunk=chunk,
                    latents=args.latents, offload_text_encoders=args.offload_text_encoders,
                    activation_offload=args.activation_offload, references=args.references)

    result = planned(args.chunk or None)
    if args.chunk == 0:  # the plan's choice: the largest chunk whose rollout call fits beside the rest
        result = planned(chunk_that_fits(result, result.usable))
    print(format_plan(result))
    return 0


def _sizes_class(config_class):
    """The model-size dataclass of a pretraining config (its ``sizes`` field: TinySD3Sizes, TinyWanSizes)."""
    return next(f.default_factory for f in dataclasses.fields(config_class) if f.name == "sizes")


def _pretrain_config(config_class, args):
    given = {k: v for k, v in vars(args).items() if v is not None}
    sizes = {f.name: given[f.name] for f in dataclasses.fields(_sizes_class(config_class)) if f.name in given}
    fields = {f.name for f in dataclasses.fields(config_class)} - {"sizes"}
    extra = {"sizes": _sizes_class(config_class)(**sizes)} if sizes else {}
    return config_class(**{k: v for k, v in given.items() if k in fields}, **extra)


def cmd_pretrain_toy(args) -> int:
    from flowgrpo.tiny.pretrain import PretrainConfig, pretrain_toy

    print(json.dumps(pretrain_toy(_pretrain_config(PretrainConfig, args)), indent=2))
    return 0


def cmd_pretrain_toy_video(args) -> int:
    from flowgrpo.tiny.pretrain_video import PretrainVideoConfig, pretrain_toy_video

    print(json.dumps(pretrain_toy_video(_pretrain_config(PretrainVideoConfig, args)), indent=2))
    return 0


def cmd_pretrain_toy_edit(args) -> int:
    from flowgrpo.tiny.pretrain_edit import PretrainEditConfig, pretrain_toy_edit

    print(json.dumps(pretrain_toy_edit(_pretrain_config(PretrainEditConfig, args)), indent=2))
    return 0


def _add_pretrain_options(parser: argparse.ArgumentParser, config_class=None) -> None:
    if config_class is None:
        from flowgrpo.tiny.pretrain import PretrainConfig as config_class

    sizes = _sizes_class(config_class)()  # the model's architecture: one option per number (--num-layers 8)
    for owner, default in ((config_class, None), (type(sizes), sizes)):
        for f in dataclasses.fields(owner):
            if f.type in ("int", "float", "str", int, float, str):
                kind = {"int": int, "float": float, "str": str}.get(f.type, f.type)
                value = f.default if default is None else getattr(default, f.name)
                parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind, default=None,
                                    help=f"{'' if default is None else 'model size; '}default: {value}")


_EPILOG = """training (not a flowgrpo command):
  accelerate launch train_t2i.py [--preset NAME] [--model NAME] [key=value ...]   text-to-image
  accelerate launch train_t2v.py [--preset NAME] [--model NAME] [key=value ...]   text-to-video
  (train_t2i.py --help lists the presets and model configs)
config keys: flowgrpo/config/schema.py; bad input and its messages: docs/errors.md"""


def _yaml_value(value) -> str:
    import yaml

    text = yaml.safe_dump(list(value) if isinstance(value, tuple) else value, default_flow_style=True, width=10**6,
                          allow_unicode=True).strip()
    return text.removesuffix("\n...").removesuffix(" ...").strip()


def render_config(resolved) -> str:
    """The resolved config as YAML, each leaf followed by ``# <layer>`` (flowgrpo.config.Resolved.provenance);
    ``sampling.plan`` and ``sampling.window`` are the method's whole plan and window (flowgrpo.config.resolved_plan)."""
    import yaml

    from flowgrpo.config import resolved_plan, to_yaml

    tree = yaml.safe_load(to_yaml(resolved.config))
    plan, window = resolved_plan(resolved.config)
    tree["sampling"]["plan"] = plan
    tree["sampling"]["window"] = window or {}
    lines: list[tuple[str, str]] = []

    def walk(node: dict, prefix: str, indent: int) -> None:
        for key, value in node.items():
            dotted = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                lines.append((" " * indent + f"{key}:", ""))
                walk(value, dotted + ".", indent + 2)
            else:
                lines.append((" " * indent + f"{key}: {_yaml_value(value)}", resolved.provenance.get(dotted, "")))

    walk(tree, "", 0)
    width = min(64, max(len(text) for text, _ in lines) + 2)
    head = ["# the layers, first to last (a later one wins), and the plan's builders:", "#   schema default"]
    head += [f"#   {name}" + (f" [{_short_path(where)}]" if where else "") for name, where in resolved.layers]
    head += ["#   plan builder default (sampling.plan / sampling.window: their builders' arguments no layer sets)"]
    body = [text if not origin else f"{text:<{width}}# {origin}" if len(text) < width else f"{text}  # {origin}"
            for text, origin in lines]
    return "\n".join(head + body) + "\n"


def _short_path(where: str) -> str:
    from flowgrpo.run.paths import configs_dir

    return where.replace(str(configs_dir().parent) + "/", "")


def cmd_config(args) -> int:
    from flowgrpo.config import is_real_model, resolve
    from flowgrpo.models.families import FAMILIES
    from flowgrpo.run.errors import ConfigError

    default = "default_t2v" if args.t2v else "default"
    if args.model and not args.t2v:
        from omegaconf import OmegaConf

        from flowgrpo.config import _resolve_yaml

        family = OmegaConf.load(_resolve_yaml(args.model, "models")).get("family")
        default = "default_t2v" if family in FAMILIES and FAMILIES[family].modality == "video" else default
    for item in args.overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value (e.g. train.iterations=10)")
    resolved = resolve(args.preset, args.model, list(args.overrides), base=args.config, default=default)
    world = "a real model: the preset's paper recipe applies" if is_real_model(args.model) else \
        "the tiny world: its CPU settings apply, the recipes do not"
    print(f"# {default}.yaml, {world} (docs/presets.md)")
    print(render_config(resolved), end="")
    return 0


def cmd_prompts(args) -> int:
    """List the official training prompt sets, or fetch them (each checked against its git blob id)."""
    from flowgrpo.prompt_sets import TRAINING_PROMPT_SETS, describe, prompt_set_file
    from flowgrpo.run.errors import ConfigError

    if args.action == "list":
        print("\n".join(describe()))
        return 0
    names = list(TRAINING_PROMPT_SETS) if args.all or not args.names else args.names
    unknown = [n for n in names if n not in TRAINING_PROMPT_SETS]
    if unknown:
        raise ConfigError(f"no official prompt set {unknown[0]!r}; the sets: {', '.join(TRAINING_PROMPT_SETS)}")
    for name in names:
        print(f"{name}: {prompt_set_file(name)}")
    return 0


def cmd_gallery(argv: list[str]) -> int:
    from gallery.cli import main as gallery_main

    return gallery_main(argv)  # its usage line says flowgrpo-gallery: the same command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowgrpo", description=__doc__.split("\n\nRun ")[0], epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{eval,gallery,pretrain-toy,pretrain-toy-video,pretrain-toy-edit,plan,prompts,config}")

    ev = sub.add_parser("eval", help="score a model or checkpoint on a papers' benchmark (--benchmark geneval|ocr|"
                        "pickscore: its prompts, images, seeds, settings, scorer and table) or on a prompt set with a reward")
    ev.add_argument("--benchmark", choices=["geneval", "ocr", "pickscore"],
                    help="a papers' protocol (configs/evaluation/<name>.yaml, docs/evaluation.md): its shipped prompt set, "
                         "images per prompt, seed, scorer and report (the inference settings are the model's); the "
                         "report is added to --out's report.md, a row per evaluated model, and the images kept for "
                         "the gallery")
    ev.add_argument("--model", default="tiny_sd3", help="model config: a YAML file or a name in configs/models (default tiny_sd3)")
    ev.add_argument("--pretrained", help="override the config's model: hub id, local folder or built-in name")
    ev.add_argument("--checkpoint", help="a training checkpoint (runs/<name>/checkpoints/step_<n>: its model config and its "
                    "evaluation weights, EMA if the run kept one) or a LoRA / full-weights folder to load on top")
    ev.add_argument("--prompts", default="toy-eval",
                    help="without --benchmark: 'toy-eval' (default), 'toy-train', 'toy-video-eval', 'toy-video-train', "
                         "'geneval', 'ocr-test', 'pickscore-test', a .txt or a .jsonl file")
    ev.add_argument("--reward", default="toy", help="without --benchmark: registered reward name or dotted path module:Class")
    ev.add_argument("--reward-option", action="append", metavar="KEY=VALUE",
                    help="a keyword of the reward (the benchmark's scorer), repeatable: --reward-option device=cuda "
                         "--reward-option detector=mmdetection (values read as YAML)")
    ev.add_argument("--steps", type=int, help="ODE steps (default: a checkpoint's run's eval.steps, else the model "
                    "config's sample_steps, which are the papers' for the models they evaluate)")
    ev.add_argument("--guidance", type=float, help="guidance scale (default: a checkpoint's run's, so a CFG-free run is "
                    "evaluated CFG-free, else the model config's)")
    ev.add_argument("--resolution", type=int, help="image size in pixels (default: the model config's)")
    ev.add_argument("--seed", type=int, help="noise seed (default: the benchmark's, else 0); image i uses a pure function "
                    "of (seed, i), image j of a prompt seed + j")
    ev.add_argument("--images-per-prompt", type=int, help="with --benchmark: override its images per prompt")
    ev.add_argument("--samples-per-prompt", type=int, default=1,
                    help="without --benchmark: K > 1 also samples seeds seed+1 .. seed+K-1 and reports the headroom: "
                         "the mean best of k samples per prompt for k = 1, 2, 4, .. K; the summary's "
                         "other numbers stay those of the first seed")
    ev.add_argument("--batch-size", type=int, help="images per model call (default: 16 with --benchmark, else 64)")
    ev.add_argument("--limit", type=int, help="score only the first N prompts")
    ev.add_argument("--device", help="override the config's device (cpu, cuda, cuda:1, auto)")
    ev.add_argument("--threads", type=int, default=0, metavar="N",
                    help="torch CPU threads; 0 (default) = automatic: OMP_NUM_THREADS if set, else the cores no other "
                         "process is busy on (flowgrpo/run/threads.py); printed at start-up")
    ev.add_argument("--out", help="with --benchmark: the folder of its reports and images (default evals/<benchmark>); "
                    "evaluate the base model and each checkpoint into the same one to get one table")
    ev.add_argument("--no-images", action="store_true", help="with --benchmark: do not keep the images")
    ev.add_argument("--save-images", help="without --benchmark: write the PNGs and a manifest.jsonl to this folder")
    ev.add_argument("--output", help="without --benchmark: also write the JSON summary to this file")
    ev.add_argument("--debug", action="store_true", help="show the traceback of an error in the input too")
    ev.set_defaults(func=cmd_eval)

    # listed here; its arguments are the gallery's own (main() hands them over before parsing)
    sub.add_parser("gallery", add_help=False, help="build (or --serve) the review site of a run directory: "
                   "flowgrpo gallery RUN_DIR [--serve] (= python -m gallery)")

    pre = sub.add_parser("pretrain-toy", help="build the embedded tiny SD3 model on the toy world (resumable)")
    _add_pretrain_options(pre)
    pre.add_argument("--debug", action="store_true", help="show the traceback of an error in the input too")
    pre.set_defaults(func=cmd_pretrain_toy)

    from flowgrpo.tiny.pretrain_video import PretrainVideoConfig

    pre_video = sub.add_parser("pretrain-toy-video",
                               help="build the embedded tiny Wan2.1 model on the toy video world (resumable)")
    _add_pretrain_options(pre_video, PretrainVideoConfig)
    pre_video.add_argument("--debug", action="store_true", help="show the traceback of an error in the input too")
    pre_video.set_defaults(func=cmd_pretrain_toy_video)

    from flowgrpo.tiny.pretrain_edit import PretrainEditConfig

    pre_edit = sub.add_parser("pretrain-toy-edit",
                              help="build the embedded tiny FLUX.1-Kontext edit model on the toy editing world (resumable)")
    _add_pretrain_options(pre_edit, PretrainEditConfig)
    pre_edit.add_argument("--debug", action="store_true", help="show the traceback of an error in the input too")
    pre_edit.set_defaults(func=cmd_pretrain_toy_edit)

    pl = sub.add_parser("plan", help="GPU memory per process of training a model, and the largest group and "
                        "micro-batch that fit (docs/memory.md)")
    pl.add_argument("--model", required=True, help="model config: a YAML file or a name in configs/models "
                    "(sd3_5_medium, flux_dev, wan2_1_t2v_14b, ...); hub models read configs/models/architectures/<name>/")
    pl.add_argument("--processes", type=int, metavar="N", help="GPUs (processes) of the launch (default 1)")
    pl.add_argument("--fsdp", action="store_true", help="shard the transformer, its gradients, optimizer state and "
                    "weight copies over the N processes (FSDP2, configs/accelerate/fsdp2.yaml)")
    pl.add_argument("--finetune", choices=["lora", "full"], help="default: the model config's finetune")
    pl.add_argument("--gpu-memory", type=float, default=80.0, metavar="GIB", help="memory of one GPU in GiB (default 80)")
    pl.add_argument("--group", type=int, help="samples per prompt group (default: configs/default.yaml's group_size)")
    pl.add_argument("--micro-batch", type=int, default=1, help="samples per training forward/backward (default 1)")
    pl.add_argument("--steps", type=int, help="rollout steps whose latents are kept (default: the model config's "
                    "sample_steps)")
    pl.add_argument("--no-checkpointing", action="store_true",
                    help="count activations without gradient checkpointing (default: the model config's)")
    pl.add_argument("--copies", metavar="NAMES", help="comma-separated extra copies of the trainable weights "
                    "(default: ema,old_policy; '' for none)")
    pl.add_argument("--master-weights", choices=["model", "float32"], default="model",
                    help="full fine-tuning: train the weights in the model dtype (default, as flowgrpo loads them) "
                         "or as float32 master weights")
    pl.add_argument("--train-cfg", action="store_true",
                    help="the training forward is the CFG pair (learner.train_guidance=cfg): two passes a sample")
    pl.add_argument("--height", type=int, help="image or frame height in pixels (default: the model config's resolution)")
    pl.add_argument("--width", type=int, help="image or frame width in pixels (default: the model config's width)")
    pl.add_argument("--frames", type=int, help="video frames (default: the model config's num_frames)")
    pl.add_argument("--references", type=int, metavar="K", help="condition images per prompt, whose tokens every call "
                    "appends (an edit's source; default: 1 for an editing family, else 0)")
    pl.add_argument("--context-parallel", type=int, default=1, metavar="C", help="split each sample's tokens over C of "
                    "the processes (train.context_parallel: diffusers' Ulysses/ring; Wan, FLUX.1, FLUX.2, Qwen-Image)")
    pl.add_argument("--chunk", type=int, metavar="R", help="the rollout's no-grad call R samples at a time "
                    "(sampling.chunk; 0: the largest that fits; default: the whole group in one call)")
    pl.add_argument("--latents", choices=["float32", "bfloat16", "host"], default="float32",
                    help="where the rollout's stored latents live (sampling.latent_storage; default float32)")
    pl.add_argument("--offload-text-encoders", action="store_true",
                    help="the text encoders leave the GPU once the prompts are encoded (model.offload_text_encoders)")
    pl.add_argument("--activation-offload", action="store_true",
                    help="the training forward's saved tensors in host memory (train.activation_offload)")
    pl.add_argument("--debug", action="store_true", help="show the traceback of an error in the input too")
    pl.set_defaults(func=cmd_plan)

    pr = sub.add_parser("prompts", help="the official runs' training prompt sets: list them, or fetch them into the "
                        "cache (each checked against its git blob id; configs/prompts/SOURCES.md)")
    pr.add_argument("action", choices=["list", "fetch"])
    pr.add_argument("names", nargs="*", help="fetch: the sets (default: every one)")
    pr.add_argument("--all", action="store_true", help="fetch: every set")
    pr.add_argument("--debug", action="store_true", help="show the traceback of an error in the input too")
    pr.set_defaults(func=cmd_prompts)

    co = sub.add_parser("config", help="the fully resolved configuration of a run as YAML, each key with the layer "
                        "that set it (schema default, embedded default, tiny block, preset method, model config, "
                        "recipe, recipe_by_reward, recipe_by_family, override)")
    co.add_argument("--preset", help="a method preset: a name in configs/presets or a YAML file")
    co.add_argument("--model", help="a model config: a name in configs/models or a YAML file (none: the tiny world)")
    co.add_argument("--config", help="a full config YAML merged before the preset (as train_t2i.py --config)")
    co.add_argument("--t2v", action="store_true", help="the text-to-video default (train_t2v.py's); automatic for a "
                    "video model config")
    co.add_argument("--debug", action="store_true", help="show the traceback of an error in the input too")
    co.add_argument("overrides", nargs="*", help="key=value overrides, as on the training command line")
    co.set_defaults(func=cmd_config)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with each command's options and its positional words (a config's key=value
    overrides, prompt set names) in any order: the command's own parser reads the rest intermixed (argparse's
    ``parse_intermixed_args``, which a parser with subcommands cannot use itself)."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if not argv or argv[0] not in commands:
        return parser.parse_args(argv)  # no command, an unknown one, or --help: the top parser's own message
    args = commands[argv[0]].parse_intermixed_args(argv[1:])
    args.command = argv[0]
    return args


def main(argv: list[str] | None = None) -> int:
    """Run a command. Bad input (a UserError) prints one line naming the fix and exits with status 2
    (UserExit); ``--debug`` shows its traceback instead."""
    from flowgrpo.run.errors import UserError

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gallery"]:
        return cmd_gallery(argv[1:])
    args = parse(build_parser(), argv)
    try:
        return args.func(args)
    except UserError as exc:
        if getattr(args, "debug", False):
            raise
        line = f"flowgrpo {args.command}: error: {exc}"
        print(line, file=sys.stderr)
        raise UserExit(line) from None


if __name__ == "__main__":
    sys.exit(main())
