"""The ``flowgrpo`` command: the jobs that are not training (training is ``accelerate launch train_t2i.py``).

  flowgrpo eval          a papers' benchmark (--benchmark geneval|ocr|pickscore: its prompts, images, seeds,
                         settings, scorer and table, docs/evaluation.md), or sample a prompt set with a model
                         (or a trained checkpoint), score it with a reward and print a JSON summary: mean
                         score, strict accuracy, per-task means, number of images, seconds
  flowgrpo gallery       build (or --serve) the sample review site of a run directory (the same as
                         ``python -m gallery`` and ``flowgrpo-gallery``)
  flowgrpo pretrain-toy  (re)build the embedded tiny SD3 model on the toy world (resumable)
  flowgrpo pretrain-toy-video  (re)build the embedded tiny Wan2.1 model on the toy video world (resumable)
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
from pathlib import Path


class UserExit(SystemExit):
    """Bad input, after its one line was printed: exit status 2 (as argparse's usage errors), and the
    line as the exception's text for callers of main()."""

    def __init__(self, line: str):
        super().__init__(line)
        self.code = 2


def _read_prompts(spec: str, limit: int | None) -> tuple[list[str], list[dict] | None]:
    from flowgrpo.data import read_prompts

    prompts, metadata = read_prompts(spec, limit or 0)  # a PromptFileError names the fix
    return prompts, (metadata if any(metadata) else None)


def _step(path: Path) -> tuple[str, int]:
    number = path.name.removeprefix("step_")
    return str(path.parent), int(number) if number.isdigit() else -1


def _checkpoint_folder(spec: str) -> Path:
    """The folder of --checkpoint whose weights load: a training checkpoint's model/ or the folder itself."""
    from flowgrpo.run.errors import UserError

    folder = Path(spec)
    if not folder.is_dir():  # name the checkpoints that do exist: beside it, or else in ./runs
        found = sorted(folder.parent.glob("step_*") if folder.parent.is_dir() else Path("runs").glob("*/checkpoints/step_*"),
                       key=_step)
        where = f" (found: {', '.join(str(p) for p in found[-6:])})" if found else ""
        raise UserError(f"--checkpoint {spec!r} does not exist; pass a checkpoint folder such as "
                        f"runs/<name>/checkpoints/step_<n>{where}")
    weights = folder / "model" if (folder / "model").is_dir() else folder
    if not any(weights.glob("*.safetensors")):
        raise UserError(f"--checkpoint {spec!r} holds no model weights (no model/ folder and no *.safetensors); pass "
                        "runs/<name>/checkpoints/step_<n> or a folder written by save_trainable (LoRA or full weights)")
    return weights


def _model_yaml(spec: str) -> Path:
    """The model config file of --model: a YAML file, or a name in configs/models/."""
    from flowgrpo.run.paths import configs_dir

    path = Path(spec)
    if not path.is_file():
        path = configs_dir() / "models" / f"{spec.removesuffix('.yaml')}.yaml"
    if not path.is_file():
        from flowgrpo.run.errors import UserError

        names = sorted(p.stem for p in (configs_dir() / "models").glob("*.yaml"))
        raise UserError(f"--model {spec!r} is not a YAML file nor one of {names} (configs/models/)")
    return path


def _model_config(args) -> dict:
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(_model_yaml(args.model)), resolve=True)
    saved = _run_config(args.checkpoint)
    if saved:  # a training checkpoint: its run's model section (base model, LoRA rank and targets, settings)
        theirs = saved["model"]
        if args.model != "tiny_sd3" and cfg.get("family") != theirs.get("family"):  # --model given, another family
            from flowgrpo.run.errors import UserError

            raise UserError(f"--checkpoint {args.checkpoint!r} was trained on {theirs.get('pretrained')!r} (family "
                            f"{theirs.get('family')}) but --model {args.model!r} is family {cfg.get('family')}; leave "
                            "out --model: a checkpoint's run names its model")
        cfg = theirs
    if args.pretrained:
        cfg["pretrained"] = args.pretrained
    if args.device:
        cfg["device"] = args.device
    if args.resolution:
        cfg["resolution"] = args.resolution
    return cfg


def _load(model_config: dict, weights: Path | None, args):
    """The model of ``model_config`` with a checkpoint's weights; weights that do not fit it (another LoRA rank, other
    targets, another network) or do not read (a damaged file) are one line, not a traceback."""
    from safetensors import SafetensorError

    from flowgrpo.models import load_model
    from flowgrpo.run.errors import UserError
    from rewards.common import first_line

    model = load_model(model_config)
    if weights is not None:
        try:
            model.load_trainable(weights)
        except (ValueError, RuntimeError, KeyError, OSError, SafetensorError) as exc:  # a damaged file too
            raise UserError(f"--checkpoint {args.checkpoint!r} does not load into --model {args.model!r} "
                            f"({first_line(exc, 240)}); a checkpoint of a run loads into the model its run trained "
                            "(leave out --model), other weights into a model config of their rank and targets") from None
    return model


def _run_config(checkpoint: str | None) -> dict | None:
    """The whole config of the run a training checkpoint (runs/<name>/checkpoints/step_<n>, or its model/) was
    saved by (its state.json), or None for weights without one."""
    from omegaconf import OmegaConf

    if not checkpoint:
        return None
    folder = Path(checkpoint)
    for state in (folder / "state.json", folder.parent / "state.json"):
        if state.is_file():
            saved = json.loads(state.read_text()).get("config")
            return OmegaConf.to_container(OmegaConf.create(saved), resolve=True) if saved else None
    return None


def _settings(args, model_config: dict) -> dict:
    """What an evaluation samples with (flowgrpo.protocols.sampling_settings): the command line's, else a
    checkpoint's run's held-out evaluation, else the model config's; the model config takes the resolution."""
    from flowgrpo.protocols import sampling_settings

    settings = sampling_settings(model_config, _run_config(args.checkpoint), steps=args.steps,
                                 guidance_scale=args.guidance, resolution=args.resolution)
    if settings["resolution"] is not None:
        model_config["resolution"] = settings["resolution"]
    return settings


INT_MAX = 2**31 - 1  # what torch's integer arguments (steps, sizes, threads) hold
SEED_MAX = 2**32 - 1  # as train.seed: an evaluation's noise seed is seed * 1,000,003 + prompt index, in 64 bits


def _check_numbers(args) -> None:
    """flowgrpo eval's numbers, before anything loads: counts from 1 (threads from 0) to INT_MAX, a seed in
    [0, SEED_MAX], a finite guidance scale >= 0 (one line naming the option and the range)."""
    import math

    from flowgrpo.run.errors import UserError

    counts = {"--samples-per-prompt": args.samples_per_prompt, "--limit": args.limit, "--batch-size": args.batch_size,
              "--steps": args.steps, "--resolution": args.resolution, "--images-per-prompt": args.images_per_prompt}
    for option, value in counts.items():
        if value is not None and not 1 <= value <= INT_MAX:
            raise UserError(f"{option} must be ≥ 1, got {value}" if value < 1 else
                            f"{option} must be at most {INT_MAX:,}, got {value}")
    if not args.threads <= INT_MAX:
        raise UserError(f"--threads must be at most {INT_MAX:,}, got {args.threads}")
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:
        raise UserError(f"--seed must be an integer in [0, {SEED_MAX}], got {args.seed}")
    if args.guidance is not None and not (math.isfinite(args.guidance) and args.guidance >= 0):
        raise UserError(f"--guidance must be a finite number >= 0 (<= 1 turns CFG off for most families), "
                        f"got {args.guidance}")


def cmd_eval(args) -> int:
    import torch

    from flowgrpo.evaluate import NonFiniteSamples
    from flowgrpo.run.errors import UserError, reward_class
    from flowgrpo.run.paths import resolve_pretrained
    from flowgrpo.run.threads import set_threads

    _check_numbers(args)
    args.batch_size = args.batch_size or (16 if args.benchmark else 64)
    # every input is checked before the model loads
    weights = _checkpoint_folder(args.checkpoint) if args.checkpoint else None
    options = _reward_options(args.reward_option)
    if args.benchmark:
        from flowgrpo.protocols import check_out, load_protocol

        protocol = load_protocol(args.benchmark)
        protocol.reward.update(options)
        check_out(Path(args.out or Path("evals") / args.benchmark), args.benchmark)  # before hours of sampling
        reward_class(protocol.reward["name"], f"configs/evaluation/{args.benchmark}.yaml")
        prompts, metadata = _read_prompts(protocol.prompts, args.limit)
    else:
        protocol = None
        reward_class(args.reward, "--reward")
        prompts, metadata = _read_prompts(args.prompts, args.limit)
    model_config = _model_config(args)
    _check_modality(protocol.reward["name"] if protocol else args.reward, model_config, args)
    try:
        resolve_pretrained(model_config["pretrained"])
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    threads_before = torch.get_num_threads()
    set_threads(args.threads)  # printed once the model is loaded
    try:
        if protocol is not None:
            return _run_benchmark(args, protocol, model_config, weights)
        return _evaluate_and_print(args, prompts, metadata, model_config, weights, options)
    except NonFiniteSamples as exc:  # diverged weights (a checkpoint of a run that blew up): what the input gives
        raise UserError(str(exc)) from None
    finally:
        torch.set_num_threads(threads_before)  # main() called in a process that goes on (tests) leaves it as it was


def _check_modality(reward: str, model_config: dict, args) -> None:
    """Refuse, before anything loads, a scorer that cannot take what the model makes (an image benchmark or reward
    on a video model, a video reward on an image model), naming the fix."""
    from flowgrpo.engine.scoring import EXAMPLE_REWARD, reward_takes
    from flowgrpo.models.families import FAMILIES
    from flowgrpo.run.errors import UserError, reward_class

    family = FAMILIES.get(model_config.get("family"))
    theirs = getattr(reward_class(reward, "--reward"), "modality", "both")
    if family is None or reward_takes(theirs, family.modality):
        return
    model = f"--model {args.model!r} (family {family.name}) makes {family.modality}s"
    if args.benchmark:
        own = {"video": "--reward toy_video --prompts toy-video-eval (or a video reward and your prompts)",
               "vector": "--reward analytic_hit --prompts analytic-eval"}.get(family.modality, "a reward of its kind")
        raise UserError(f"--benchmark {args.benchmark} scores images and {model}; the papers' benchmarks are for image "
                        f"models: evaluate this one with {own}")
    fix = ("--reward per_frame --reward-option reward=" + reward + " scores it frame by frame, or use a video reward "
           "such as toy_video") if family.modality == "video" and theirs == "image" else (
           f"use {'an' if family.modality == 'image' else 'a'} {family.modality} reward such as "
           f"{EXAMPLE_REWARD[family.modality]}, or a model that makes {theirs}s")
    raise UserError(f"--reward {reward!r} scores {theirs if theirs != 'both' else 'picture'}s but {model}; {fix}")


def _reward_options(pairs: list[str] | None) -> dict:
    """--reward-option key=value pairs as the reward's keyword arguments (values read as YAML: 0.5, true, null)."""
    import yaml

    from flowgrpo.run.errors import UserError

    options = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise UserError(f"--reward-option {pair!r} is not key=value (e.g. --reward-option device=cuda)")
        options[key] = yaml.safe_load(value) if value else ""
    return options


def _processes():
    """(rank, world, gather) when launched as several processes (accelerate launch / torchrun), else None."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None, None
    from accelerate import PartialState
    from accelerate.utils import gather

    state = PartialState()
    return (state.process_index, state.num_processes, lambda t: gather(t.to(state.device)).cpu()), state.device


def _settings_of(cls, kwargs: dict) -> dict:
    """Every plain keyword of a reward's constructor as it was built: the given ones and the defaults (a report
    names its detector even when the command did not)."""
    import inspect

    plain = (str, int, float, bool, type(None))
    defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty and isinstance(p.default, plain)}
    return {**defaults, **{k: v if isinstance(v, plain) else str(v) for k, v in kwargs.items()}}


def _run_benchmark(args, protocol, model_config, weights) -> int:
    """flowgrpo eval --benchmark: the protocol's prompts, images, seeds, settings, scorer and report."""
    import inspect

    from flowgrpo.models.loading import resolve_device
    from flowgrpo.protocols import iteration_of, label_of, run_protocol, write_report
    from flowgrpo.run.errors import build_reward, reward_class
    from flowgrpo.run.threads import startup_line

    processes, device = _processes()
    if device is not None and not args.device:
        model_config["device"] = str(device)  # each process its own accelerator
    settings = _settings(args, model_config)
    if args.images_per_prompt is not None:
        protocol.images_per_prompt = args.images_per_prompt
    if args.seed is not None:
        protocol.seed = args.seed
    kwargs = {k: v for k, v in protocol.reward.items() if k != "name"}
    if "device" in inspect.signature(reward_class(protocol.reward["name"], "--benchmark").__init__).parameters:
        kwargs.setdefault("device", str(resolve_device(model_config.get("device", "auto"))))  # beside the model
    # the scorer first: a missing package or download is named before the model loads
    reward = build_reward(protocol.reward["name"], kwargs, f"configs/evaluation/{protocol.name}.yaml")
    model = _load(model_config, weights, args)
    print(startup_line(how="--threads N"), file=sys.stderr)
    out = Path(args.out or Path("evals") / protocol.name)
    label = label_of(Path(args.model).stem, args.checkpoint)
    rank = processes[0] if processes else 0
    report = run_protocol(model, protocol, reward, label=label, limit=args.limit, batch_size=args.batch_size,
                          out=out if not args.no_images else None, processes=processes, progress=rank == 0,
                          steps=settings["steps"], guidance_scale=settings["guidance_scale"],
                          iteration=iteration_of(args.checkpoint))
    report["model"], report["checkpoint"] = model.config.pretrained, args.checkpoint
    report["settings_from"] = settings["from"]
    report["scorer"] = {"name": protocol.reward["name"], **_settings_of(reward_class(protocol.reward["name"], "--benchmark"), kwargs)}
    if rank == 0:
        table = write_report(out, report)
        print(json.dumps(report, indent=2))
        print(f"\n{table}\nreport: {out / 'report.md'} (every model evaluated into {out}); images: "
              f"flowgrpo gallery {out}", file=sys.stderr)
    return 0


def _evaluate_and_print(args, prompts, metadata, model_config, weights, options) -> int:
    import torch

    from flowgrpo.evaluate import best_of_k, evaluate
    from flowgrpo.run.errors import build_reward
    from flowgrpo.run.threads import startup_line

    settings = _settings(args, model_config)
    reward = build_reward(args.reward, options, "--reward")  # first: a missing package or download before the model
    model = _load(model_config, weights, args)
    print(startup_line(how="--threads N"), file=sys.stderr)
    all_scores = []
    seed = args.seed or 0
    for j in range(args.samples_per_prompt):  # sample j of every prompt uses seed + j
        result, images, scores = evaluate(
            model, prompts, reward, metadata, seed=seed + j, steps=settings["steps"],
            guidance_scale=settings["guidance_scale"], batch_size=args.batch_size,
        )
        all_scores.append(scores)
        if j == 0:
            summary = result
        if args.save_images:
            _save_images(Path(args.save_images) / (f"seed_{seed + j}" if args.samples_per_prompt > 1 else ""),
                         images, prompts)
    if args.samples_per_prompt > 1:
        summary["headroom"] = best_of_k(torch.stack(all_scores))
    summary = {"model": model.config.pretrained, "checkpoint": args.checkpoint, "prompts": args.prompts,
               "reward": args.reward, **summary}
    text = json.dumps(summary, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(text)
    return 0


def _save_images(folder: Path, images, prompts: list[str]) -> None:
    from PIL import Image

    from flowgrpo.run.run_dir import to_uint8

    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (image, prompt) in enumerate(zip(images, prompts)):
        if image.ndim == 4:  # a video [F, 3, H, W]: an animated GIF
            name = f"{i:05d}.gif"
            frames = [Image.fromarray(a) for a in to_uint8(image)]
            frames[0].save(folder / name, save_all=True, append_images=frames[1:], duration=125, loop=0)
        else:
            name = f"{i:05d}.png"
            Image.fromarray(to_uint8(image)).save(folder / name)
        rows.append(json.dumps({"file": name, "prompt": prompt}))
    (folder / "manifest.jsonl").write_text("\n".join(rows) + "\n")


def cmd_plan(args) -> int:
    """Print the memory plan of --model (flowgrpo/memory/; docs/memory.md)."""
    from omegaconf import OmegaConf

    from flowgrpo.models.config import validate_model_config
    from flowgrpo.memory import (DEFAULT_COPIES, chunk_that_fits, context_parallel_refusal, format_plan, plan,
                                 planned_families, read_architecture)
    from flowgrpo.run.errors import UserError
    from flowgrpo.run.paths import configs_dir

    path = _model_yaml(args.model)
    for option, value in (("--processes", args.processes), ("--group", args.group), ("--micro-batch", args.micro_batch),
                          ("--steps", args.steps), ("--context-parallel", args.context_parallel),
                          ("--height", args.height), ("--width", args.width), ("--frames", args.frames)):
        if value is not None and value < 1:
            raise UserError(f"{option} must be >= 1, got {value}")
    if args.chunk is not None and args.chunk < 0:
        raise UserError(f"--chunk must be >= 0 (0: the plan's choice), got {args.chunk}")
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
                    activation_offload=args.activation_offload)

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


def cmd_gallery(argv: list[str]) -> int:
    from gallery.cli import main as gallery_main

    return gallery_main(argv)  # its usage line says flowgrpo-gallery: the same command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flowgrpo", description=__doc__.split("\n\nRun ")[0], epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{eval,gallery,pretrain-toy,pretrain-toy-video,plan,config}")

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


def main(argv: list[str] | None = None) -> int:
    """Run a command. Bad input (a UserError) prints one line naming the fix and exits with status 2
    (UserExit); ``--debug`` shows its traceback instead."""
    from flowgrpo.run.errors import UserError

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gallery"]:
        return cmd_gallery(argv[1:])
    args = build_parser().parse_args(argv)
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
