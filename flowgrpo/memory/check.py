"""Before the first rollout: the run's own iteration planned against the memory its device has.

The trainer calls :func:`check_before_rollout` once the model is loaded: the plan (flowgrpo/memory/plan.py) of the
loaded pipeline's own configurations and the run's settings, against a GPU's memory or, on the CPU, the host's. A
run that cannot fit is refused with the numbers; one that fits only by the plan's overestimate is a warning.
"""

from __future__ import annotations

from pathlib import Path

from flowgrpo.memory.architecture import architecture_from_configs
from flowgrpo.memory.plan import GIB, SAFETY_MARGIN, chunk_that_fits, gib, plan, planned_families

# the largest ratio of the plan to the measured peak on an H100 (docs/results/scaling.md): the plan errs on the
# safe side, so a run is refused only when even the plan divided by it does not fit
PLAN_OVER_MEASURED = 1.45


def pipeline_configs(pipeline) -> dict[str, dict]:
    """The component configurations of a loaded pipeline, as :func:`architecture_from_configs` reads them."""
    import torch

    configs = {}
    for name, module in pipeline.components.items():
        config = getattr(module, "config", None)
        if not isinstance(module, torch.nn.Module):  # schedulers, tokenizers
            continue
        if isinstance(config, dict) and "_class_name" in config:  # a diffusers model
            configs[name] = dict(config)
        elif hasattr(config, "to_dict"):  # a transformers model
            configs[name] = {**config.to_dict(), "architectures": [type(module).__name__]}
    return configs


def memory_verdict(planned: int, available: int) -> str:
    """'fits' (the plan fits), 'tight' (only the plan's measured overestimate makes it fit) or 'no'."""
    if planned <= available:
        return "fits"
    return "tight" if planned / PLAN_OVER_MEASURED <= available else "no"


def host_memory() -> tuple[int, int] | None:
    """(bytes the kernel says are available, bytes this process holds) on Linux; None elsewhere."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    available = next((int(line.split()[1]) * 1024 for line in meminfo.splitlines() if line.startswith("MemAvailable:")), None)
    resident = next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return (available, resident) if available is not None else None


def run_options(cfg) -> dict:
    """The plan's options of a run's config: context parallelism, the rollout's chunk (0: the plan's choice), where
    the rollout latents are stored, and the text-encoder and activation offloading (read with defaults, so a config
    without these keys plans as before)."""
    return dict(context_parallel=int(getattr(cfg.train, "context_parallel", 1) or 1),
                chunk=int(getattr(cfg.sampling, "chunk", 0) or 0),
                latents=str(getattr(cfg.sampling, "latent_storage", "float32") or "float32"),
                offload_text_encoders=bool(getattr(cfg.model, "offload_text_encoders", False)),
                activation_offload=bool(getattr(cfg.train, "activation_offload", False)))


def run_plan(cfg, model, processes: int, sharded: bool, group: int, steps: int, available: float,
             margin: float = 0.0):
    """The memory plan (flowgrpo/memory/plan.py) of a run's own iteration: the loaded pipeline's configurations and the
    run's settings (:func:`run_options`), against ``available`` bytes per device (``benchmarks/bench_scale.py`` sets it
    beside the measured peak). The rollout call is ``sampling.chunk`` samples; 0 is the plan's choice, what
    :func:`rollout_chunk` gives the trainer: on a GPU the largest that fits ``available``, elsewhere the group (the
    trainer's 0 there, the whole level, is a group at the plan's one prompt per call)."""
    arch = architecture_from_configs(cfg.model.family, pipeline_configs(model.pipeline), "the loaded pipeline")
    options = run_options(cfg)
    chunk = options.pop("chunk")

    def planned(rows):
        return plan(arch, cfg.model, processes, sharded, gpu_memory=available / GIB, group=group,
                    micro_batch=cfg.train.micro_batch, steps=steps, margin=margin,
                    train_cfg=getattr(cfg.learner, "train_guidance", "conditional") != "conditional",
                    optimizer=cfg.train.optimizer, chunk=rows, **options)

    result = planned(chunk or None)
    if not chunk and _device_type(model) == "cuda":  # the trainer's choice (rollout_chunk), with the plan's margin
        result = planned(chunk_that_fits(result, available * (1 - SAFETY_MARGIN)))
    return result


def _device_type(model) -> str:
    import torch

    return torch.device(model.device).type


def _group_and_steps(cfg) -> tuple[int, int]:
    """The first iteration's samples per prompt (its plan's leaves) and steps, as the trainer's plan schedule makes
    them (flowgrpo.engine.rollout.plan_schedule; the time shift, which moves no count, left at the plan's or 1)."""
    import samplers

    arguments = dict(cfg.sampling.plan)
    arguments["shift"] = arguments.get("shift") or cfg.sampling.shift or 1.0
    first = samplers.build_schedule(arguments, dict(cfg.sampling.window) or None, seed=cfg.train.seed).plan(0)
    return int(first.counts()["leaves"]), int(first.num_steps)


def rollout_chunk(cfg, model, processes: int, sharded: bool) -> int:
    """The plan's choice of samples per rollout call (``sampling.chunk: 0``): on a GPU, the largest R <= the group
    whose no-grad call fits beside the rest of the rollout in the device's memory (free, plus what this process holds
    already), less the plan's 10 % margin (:func:`chunk_that_fits`), at least 1 (the plan's unit is one prompt's group,
    so a level of several prompts takes a call per group at most); on the CPU, or for a family without architecture
    numbers (the analytic world), 0: no cap, the rollout's whole level (every node of a step) in one call."""
    if _device_type(model) != "cuda" or cfg.model.family not in planned_families() or \
            getattr(model, "pipeline", None) is None:
        return 0
    group, steps = _group_and_steps(cfg)
    import torch

    device = torch.device(model.device)
    free, _ = torch.cuda.mem_get_info(device)
    available = free + torch.cuda.memory_allocated(device)
    return run_plan(cfg, model, processes, sharded, group, steps, available).chunk or group


def check_before_rollout(cfg, model, processes: int, sharded: bool, group: int, steps: int, warn) -> str | None:
    """Compare the iteration's planned memory per device with what the device has (free, plus what this process
    holds already: the loaded model), before the first rollout: a GPU's memory, or on the CPU the host's (Linux).
    A run that cannot fit is refused (a UserError with the numbers and the keys to change); one that fits only by
    the plan's overestimate is a warning. Families without architecture numbers (``planned_families``: the analytic
    world) are not checked. Returns the verdict (None: unchecked)."""
    import torch

    device = torch.device(model.device)
    if device.type not in ("cuda", "cpu") or cfg.model.family not in planned_families() or \
            getattr(model, "pipeline", None) is None:
        return None
    from flowgrpo.run.errors import UserError

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        available = free + torch.cuda.memory_allocated(device)
    else:
        host = host_memory()
        if host is None:
            return None
        available = host[0] + host[1]
    result = run_plan(cfg, model, processes, sharded, group, steps, available)
    verdict = memory_verdict(result.total, available)
    where = "GPU" if device.type == "cuda" else "process"
    numbers = (f"the memory plan puts this iteration at {gib(result.total)} GiB per {where} (weights and optimizer "
               f"{gib(result.fixed)} GiB, the group's rollout {gib(result.rollout_record + result.rollout_forward)} GiB, a "
               f"training micro-batch {gib(result.training_activations)} GiB) and "
               f"{'this GPU has' if device.type == 'cuda' else 'the host has'} {gib(available)} GiB")
    most = "any" if result.max_group is None else result.max_group
    # what a video sample holds, moved off the device (docs/scaling.md): the options this run does not use yet
    unused = [option for option, used in (
        ("sampling.latent_storage=host", cfg.sampling.latent_storage != "float32"),
        ("model.offload_text_encoders=true", cfg.model.offload_text_encoders),
        ("train.activation_offload=true", cfg.train.activation_offload)) if not used]
    fix = (f"lower sampling.plan.group_size (at most {most} fits) or train.micro_batch (at most "
           f"{result.max_micro_batch}), enable model.gradient_checkpointing, or shard over more GPUs (docs/memory.md)"
           + ("; or train a LoRA instead of every weight (model.finetune=lora model.reference=auto "
              "train.learning_rate=3e-4)" if cfg.model.finetune == "full" else "")
           + (f"; or move tensors off the GPU ({' '.join(unused)}) or split each sample over GPUs "
              "(train.context_parallel=N: docs/scaling.md)" if device.type == "cuda" else ""))
    if verdict == "no":
        raise UserError(f"this run cannot fit: {numbers}, less than the plan's {gib(result.total / PLAN_OVER_MEASURED)} GiB "
                        f"lower bound; {fix}")
    if verdict == "tight":
        warn(f"memory is tight: {numbers}; it fits only if the plan overestimates (it has by up to "
             f"{PLAN_OVER_MEASURED}x); if it runs out of memory, {fix}")
    return verdict
