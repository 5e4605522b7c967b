"""Checking a merged configuration before anything loads: every key against its rule, the choices that must go
together, the batch arithmetic, and the rollout plan built at its window's extreme positions; each refusal a
ConfigError naming the key, the value and the fix (docs/errors.md)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from flowgrpo.config.schema import LEARNERS, Config, rules_of
from flowgrpo.run.errors import ConfigError


def resolved_plan(cfg: Config) -> tuple[dict, dict | None]:
    """The run's whole plan and window arguments: the builders' defaults (``compose_plan``, ``WindowSchedule``) under
    ``sampling.plan`` / ``sampling.window``. The window is None when sampling.window is empty (no moving window). The
    grid's time shift is the model's unless the config sets one (None here)."""
    import inspect

    import samplers

    builder = {k: (None if p.default is inspect.Parameter.empty else p.default)
               for k, p in inspect.signature(samplers.compose_plan).parameters.items() if k not in ("name", "window")}
    builder["shift"] = cfg.sampling.shift  # None: the model's, for the plan's number of steps (plan_schedule)
    plan = {**builder, **dict(cfg.sampling.plan)}
    if not cfg.sampling.window:
        return plan, None
    window_builder = {k: (None if p.default is inspect.Parameter.empty else p.default)
                      for k, p in inspect.signature(samplers.WindowSchedule).parameters.items()
                      if k not in ("num_steps", "seed")}
    return plan, {**window_builder, **dict(cfg.sampling.window)}


def check_rules(section: Any, prefix: str = "") -> None:
    """Every key against its rule (``key``; recursively; ``rewards`` item by item; the model config has its own
    validator): a value outside is a ConfigError naming the key, the value and what is allowed."""
    rules = rules_of(type(section))
    for f in fields(section):
        value, key = getattr(section, f.name), f"{prefix}{f.name}"
        if f.name == "model":
            continue
        if is_dataclass(value):
            check_rules(value, f"{key}.")
        elif f.name == "rewards" and isinstance(value, list):
            for i, spec in enumerate(value):
                check_rules(spec, f"{key}[{i}].")
        elif f.name in rules and not rules[f.name].ok(value):
            raise ConfigError(f"{key}={value!r} is not allowed; use {rules[f.name].allowed}")


def validate(cfg: Config) -> None:
    """Check choices and batch arithmetic; errors print the numbers involved."""
    check_rules(cfg)
    if cfg.learner.name not in LEARNERS:
        raise ConfigError(f"learner.name={cfg.learner.name!r} is unknown; use one of {sorted(LEARNERS)}")
    if not cfg.rewards:
        raise ConfigError("rewards is empty; give at least one, e.g. rewards=[{name: toy}]")
    plan = check_plan(cfg)
    if cfg.learner.name == "transition" and plan.get("kernel") == "ode" and not plan.get("side_steps"):
        raise ConfigError(
            "sampling.plan.kernel=ode rolls out with ODE steps only (no side_steps), which leaves the transition learner "
            "nothing to train; use an SDE plan (e.g. --preset flow_grpo) or a forward-process learner "
            "(--preset diffusion_nft, awm or dgpo)"
        )
    if cfg.learner.replay.per_group > 0:
        if cfg.learner.name != "transition":
            raise ConfigError(f"learner.replay replays stored SDE transitions, which learner.name={cfg.learner.name} "
                              "does not train on; use the transition learner or set learner.replay.per_group=0")
        if plan.get("splits") or plan.get("side_steps") or plan.get("branch_window"):
            raise ConfigError("learner.replay keeps whole samples with their own transitions, and a tree's (splits, "
                              "side_steps, branch_window) share theirs; use a chain plan or set learner.replay.per_group=0")
    solvers = {plan.get("solver"), plan.get("post_window_solver") if plan.get("post_window_ratio") else None}
    if cfg.learner.name == "transition" and "sa_solver" in solvers and plan.get("sa_tau", 0) > 0:
        raise ConfigError(
            f"sampling.plan.sa_tau={plan['sa_tau']} draws SA-Solver noise on untrained steps, whose log-probs the "
            "transition learner does not have; set sampling.plan.sa_tau=0 (or another solver), or use a "
            "forward-process learner (--preset awm, diffusion_nft or dgpo)"
        )
    if cfg.model.family == "analytic" and (cfg.sampling.integer_timesteps or cfg.learner.integer_times):
        raise ConfigError("sampling.integer_timesteps and learner.integer_times tell a diffusers network an integer "
                          "timestep; the analytic world's network takes σ itself: set them to false")
    if cfg.sampling.merge_lora and cfg.model.finetune != "lora":
        raise ConfigError("sampling.merge_lora merges a LoRA adapter into the weights, and model.finetune=full trains "
                          "them without one: set sampling.merge_lora=false")
    if cfg.model.compile and cfg.model.family == "analytic":
        raise ConfigError("model.compile compiles the blocks of a diffusers transformer; the analytic world's network has "
                          "none: set model.compile=false")
    if cfg.train.context_parallel > 1 and cfg.model.family == "analytic":
        raise ConfigError("train.context_parallel splits a diffusers transformer's token sequence; the analytic world's "
                          "samples are vectors: set train.context_parallel=1")
    if cfg.train.context_parallel % cfg.train.context_parallel_ring:
        raise ConfigError(f"train.context_parallel_ring={cfg.train.context_parallel_ring} must divide "
                          f"train.context_parallel={cfg.train.context_parallel} (a context group is ring x ulysses "
                          "processes)")
    if cfg.train.context_parallel_ring > 1 and cfg.model.attention_backend == "native":
        raise ConfigError(f"train.context_parallel_ring={cfg.train.context_parallel_ring}: ring attention merges partial "
                          "attentions by their log-sum-exp, which PyTorch's native backend does not return; set "
                          "model.attention_backend to flash, _native_flash or _native_cudnn (GPUs), or "
                          "train.context_parallel_ring=1 (Ulysses alone)")
    if cfg.sampling.log_prob != "gaussian" and cfg.loss.likelihood_backend == "fused":
        raise ConfigError(f"sampling.log_prob={cfg.sampling.log_prob} is scored by the PyTorch likelihood terms only (the "
                          "fused op scores the Gaussian form); set loss.likelihood_backend=reference (or auto)")
    group = plan.get("group_size", 1)
    branches = plan.get("branch_factor", 2) > 1
    tree = bool(plan.get("splits")) or bool(plan.get("side_steps")) or (bool(plan.get("branch_window")) and branches)
    if not tree and group < 2:
        raise ConfigError(
            f"sampling.plan.group_size={group}: GRPO needs at least 2 samples per prompt to compare "
            "(a group of 1 has zero advantage); set sampling.plan.group_size=2 or more"
        )
    t = cfg.train
    if t.prompt_draw == "batch" and t.balance_by:
        raise ConfigError(f"train.balance_by={t.balance_by!r} balances the passes over the prompt set, and "
                          "train.prompt_draw=batch draws each batch at random, with no passes: set train.balance_by='' "
                          "or train.prompt_draw=pass")
    if t.prompts_per_iteration % cfg.sampling.batches_per_iteration:
        raise ConfigError(
            f"train.prompts_per_iteration={t.prompts_per_iteration} is not divisible by "
            f"sampling.batches_per_iteration={cfg.sampling.batches_per_iteration}"
        )
    kl = cfg.loss.kl_coef if cfg.learner.name == "transition" else cfg.learner.kl_coef
    if cfg.model.reference == "none" and (kl > 0 or cfg.learner.name == "dgpo"):
        what = "DGPO's preference term" if cfg.learner.name == "dgpo" else f"a KL coefficient of {kl}"
        raise ConfigError(f"{what} needs the reference policy, and model.reference='none' loads none; set "
                          "model.reference=auto (a LoRA's disabled adapter, or a frozen copy for full fine-tuning)")
    if t.updates_per_epoch > t.prompts_per_iteration and t.update_split == "groups":
        raise ConfigError(
            f"train.updates_per_epoch={t.updates_per_epoch} > train.prompts_per_iteration={t.prompts_per_iteration}: "
            "each update needs at least one whole group; lower updates_per_epoch (or split updates by transitions: "
            "train.update_split=transitions)"
        )
    lo = cfg.loss
    if lo.anchor_kl_schedule == "sage" and not 0 < lo.anchor_kl_min <= lo.anchor_kl_coef:
        raise ConfigError(f"loss.anchor_kl_schedule=sage moves the KL weight between loss.anchor_kl_min="
                          f"{lo.anchor_kl_min} and loss.anchor_kl_coef={lo.anchor_kl_coef}: it needs 0 < min <= coef")
    if t.update_split == "transitions" and cfg.learner.name != "transition":
        raise ConfigError(f"train.update_split=transitions shuffles stored transitions, which learner.name="
                          f"{cfg.learner.name!r} does not train on; use train.update_split=groups or samples")
    if t.update_split == "samples":
        if tree:
            raise ConfigError("train.update_split=samples deals a group's chains to the updates, and a tree's samples share "
                              "their trunk; use train.update_split=groups or transitions with a tree plan")
        if cfg.learner.name == "dgpo":
            raise ConfigError("train.update_split=samples splits a group over optimizer steps, and DGPO's preference "
                              "compares a whole group; use train.update_split=groups")
        if t.updates_per_epoch > group:
            raise ConfigError(f"train.update_split=samples deals each group's {group} samples to train.updates_per_epoch="
                              f"{t.updates_per_epoch} updates: some would train none of a group; lower updates_per_epoch")
    lc = cfg.learner
    if not lc.time_min < lc.time_max:
        raise ConfigError(f"learner.time_min={lc.time_min} < learner.time_max={lc.time_max} is needed: training times are "
                          "drawn between them")
    if lc.name == "dgpo" and lc.share_draws != "group":
        raise ConfigError("learner.name=dgpo compares the members of a group on the same (t, ε): set learner.share_draws=group")


MAX_ROLLOUT_NODES = 2**20  # states one rollout batch may hold: a million network calls per batch is days at real size


def check_plan(cfg: Config) -> dict:
    """sampling.plan and sampling.window under the rules of every other key, before anything loads: each key one
    that the plan builder or the window schedule takes (samplers' PLAN_RULES, WINDOW_RULES, declared beside them),
    each value allowed by its rule, then the schedule built and its plan at the window's first and last position,
    so that arguments which do not fit together are refused in the builder's own words. Returns the plan's
    arguments (``plan_arguments``)."""
    import samplers
    from samplers.compose import PLAN_RULES
    from samplers.rules import refusal
    from samplers.schedules import WINDOW_RULES

    s = cfg.sampling
    for section, given, rules in (("plan", s.plan, PLAN_RULES), ("window", s.window, WINDOW_RULES)):
        unknown = sorted(set(given) - set(rules))
        if unknown:
            raise ConfigError(f"sampling.{section}.{unknown[0]} is not a key of the {section}; it takes {sorted(rules)}")
    if "num_steps" not in s.plan:
        raise ConfigError("sampling.plan.num_steps is not set: a preset writes its method's whole plan (--preset NAME), "
                          "or give the plan's arguments, e.g. sampling.plan='{num_steps: 10, kernel: flow_sde, eta: 0.7}'")
    plan = plan_arguments(cfg)
    window = dict(s.window)
    if window and "size" not in window:
        raise ConfigError(f"sampling.window.{sorted(window)[0]} is given but sampling.window.size is not: a moving SDE "
                          "window needs its size (e.g. sampling.window.size=2), or use a preset with one (flow_grpo_fast, "
                          "mixgrpo, mixgrpo_flash, mixgrpo_flash_star, branchgrpo_mix)")
    for section, values, rules in (("plan", plan, PLAN_RULES), ("window", window, WINDOW_RULES)):
        for key, value in values.items():
            message = refusal(f"sampling.{section}.{key}", value, rules[key])
            if message:
                raise ConfigError(message)
    shift = plan.get("shift") or s.shift or 3.0  # the model's shift is known once it loads; any shift builds alike
    try:
        schedule = samplers.build_schedule({**plan, "shift": shift}, window or None)
        plans = [schedule.plan_at(start) for start in
                 (schedule.window.extreme_starts() if schedule.window is not None else (None,))]
    except ValueError as exc:
        raise ConfigError(f"the rollout plan sampling.plan={plan}" + (f" with sampling.window={window}" if window else "")
                          + f" cannot be built: {exc}") from None
    per_batch = cfg.train.prompts_per_iteration // max(1, s.batches_per_iteration)
    nodes = max(p.node_count() for p in plans) * max(1, per_batch)
    if nodes > MAX_ROLLOUT_NODES:
        raise ConfigError(
            f"the rollout plan holds {nodes:,} states per rollout batch ({per_batch} prompts "
            f"x {nodes // max(1, per_batch):,} per prompt: group_size, branch_factor**len(splits), side_children), more "
            f"than {MAX_ROLLOUT_NODES:,}: it cannot finish in memory or in any sensible time; lower those, or "
            "train.prompts_per_iteration, or raise sampling.batches_per_iteration")
    return plan


def plan_arguments(cfg: Config) -> dict:
    """The compose_plan arguments the run gives (sampling.plan; validation reads them, the loop asks the plans of
    ``plan_schedule`` instead)."""
    return dict(cfg.sampling.plan)


def processes_check(cfg: Config, world_size: int) -> None:
    """Groups never split across ranks: every rank samples whole prompts (with their groups). ``world_size``: the
    launch's processes; with context parallelism, groups of train.context_parallel of them share their prompts."""
    context = cfg.train.context_parallel
    if world_size % context:
        raise ConfigError(f"train.context_parallel={context} must divide the launch's {world_size} processes (each "
                          f"context group is {context} of them); launch a multiple of {context} processes")
    ranks = (f"{world_size} processes" if context == 1 else
             f"{world_size // context} data-parallel ranks ({world_size} processes / train.context_parallel={context})")
    world_size //= context
    per_batch = cfg.train.prompts_per_iteration // cfg.sampling.batches_per_iteration
    if per_batch % world_size:
        raise ConfigError(
            f"train.prompts_per_iteration={cfg.train.prompts_per_iteration} / sampling.batches_per_iteration="
            f"{cfg.sampling.batches_per_iteration} = {per_batch} prompts per batch cannot be split evenly over "
            f"{ranks}; make it a multiple of {world_size}"
        )
