"""``flowgrpo eval``: a papers' benchmark (flowgrpo/protocols.py, docs/evaluation.md) or a prompt set scored with a
reward, for a model config or a training checkpoint. Every input is checked before anything loads (the numbers, the
checkpoint and the run it came from, the reward and what it scores against what the model makes, the scorer's
packages and downloads); what an evaluation samples with is the command line's, else a checkpoint's run's held-out
settings, else the model config's (flowgrpo.protocols.sampling_settings).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


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


def model_yaml(spec: str) -> Path:
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


def _model_config(args, saved: dict | None) -> dict:
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(OmegaConf.load(model_yaml(args.model)), resolve=True)
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
                            "(leave out --model), other weights into a model config of their rank and "
                            "targets") from None
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


def _settings(args, model_config: dict, run: dict | None) -> dict:
    """What an evaluation samples with (flowgrpo.protocols.sampling_settings): the command line's, else a
    checkpoint's run's held-out evaluation, else the model config's; the model config takes the resolution."""
    from flowgrpo.protocols import sampling_settings

    settings = sampling_settings(model_config, run, steps=args.steps,
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


def _check_files(args) -> None:
    """--output and --save-images before anything samples: the summary's path is not a folder, and the folders they
    write to can be created (an hour's evaluation is not lost to a typo at its end)."""
    from flowgrpo.run.errors import UserError

    wanted = []
    if args.output:
        if Path(args.output).is_dir():
            raise UserError(f"--output {args.output!r} is a folder; pass a file for the JSON summary, e.g. "
                            f"{str(Path(args.output) / 'summary.json')!r}")
        wanted.append(("--output", args.output, Path(args.output).parent))
    if args.save_images:
        wanted.append(("--save-images", args.save_images, Path(args.save_images)))
    for option, given, folder in wanted:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(f"{option} {given!r}: the folder {str(folder)!r} cannot be created ({exc.strerror}); "
                            "pass a path you can write") from None


def cmd_eval(args) -> int:
    import torch

    from flowgrpo.evaluate import NonFiniteSamples
    from flowgrpo.run.errors import UserError, reward_class
    from flowgrpo.run.paths import resolve_pretrained
    from flowgrpo.run.threads import set_threads

    _check_numbers(args)
    _check_files(args)
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
    run = _run_config(args.checkpoint)  # a training checkpoint's run: its model section and evaluation settings
    model_config = _model_config(args, run)
    _check_modality(protocol.reward["name"] if protocol else args.reward, model_config, args)
    settings = _settings(args, model_config, run)  # what it samples with: command line, run, model
    try:
        resolve_pretrained(model_config["pretrained"])
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    threads_before = torch.get_num_threads()
    set_threads(args.threads)  # printed once the model is loaded
    try:
        if protocol is not None:
            return _run_benchmark(args, protocol, model_config, weights, settings)
        return _evaluate_and_print(args, prompts, metadata, model_config, weights, options, settings)
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


def _run_benchmark(args, protocol, model_config, weights, settings) -> int:
    """flowgrpo eval --benchmark: the protocol's prompts, images, seeds, settings, scorer and report."""
    import inspect

    from flowgrpo.models.loading import resolve_device
    from flowgrpo.protocols import iteration_of, label_of, run_protocol, write_report
    from flowgrpo.run.errors import build_reward, reward_class
    from flowgrpo.run.threads import startup_line

    processes, device = _processes()
    if device is not None and not args.device:
        model_config["device"] = str(device)  # each process its own accelerator
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


def _evaluate_and_print(args, prompts, metadata, model_config, weights, options, settings) -> int:
    import torch

    from flowgrpo.evaluate import best_of_k, evaluate
    from flowgrpo.run.errors import build_reward
    from flowgrpo.run.threads import startup_line

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
                         images, prompts, metadata)
    if args.samples_per_prompt > 1:
        summary["headroom"] = best_of_k(torch.stack(all_scores))
    summary = {"model": model.config.pretrained, "checkpoint": args.checkpoint, "prompts": args.prompts,
               "reward": args.reward, **summary}
    text = json.dumps(summary, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    print(text)
    return 0


def _save_images(folder: Path, images, prompts: list[str], metadata: list[dict] | None = None) -> None:
    """Each sample as a PNG (a video: a GIF) and a manifest line; an edit's source beside it (``sources``)."""
    from PIL import Image

    from flowgrpo.run.run_dir import _save_sources, to_uint8

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
        rows.append(json.dumps({"file": name, "prompt": prompt,
                                **_save_sources(folder, metadata[i] if metadata else None)}))
    (folder / "manifest.jsonl").write_text("\n".join(rows) + "\n")
