"""Flow-DPPO's launch (Tencent-Hunyuan/UniRL): the paper's SD3.5-Medium PickScore run, the hydra config
examples/diffusion/sd3_flowdppo.yaml (FlowDPPO/README.md's "Run it": ``python -m unirl.train_diffusion
--config-name=diffusion/sd3_flowdppo num_devices=8``) over unirl/train_diffusion.py and the classes it instantiates.

The config is ``# @package _global_`` with no defaults list, so it is the whole run: every leaf is read with its line
(``yaml_values``; its interpolations resolved as a run without environment variables resolves them, the README's
PRETRAINED_MODEL being the default it names). What it leaves in place is read too: the ``cfg.get(name, default)``
defaults of train_diffusion.py's ``main()`` (top-level keys), and the defaults of the targets it instantiates where
the YAML does not set a field: the dataclasses (DiffusionSamplingParams, SD3PipelineConfig, FSDPConfig, LoraConfig,
OptimizerConfig, LrSchedulerConfig, PickScoreSpec) whole, and the constructor parameters of FlowDPPO, FSDPBackend and
RewardService that the trainer does not pass itself.

``code.*`` keys are the constants the code fixes, each found by a regular expression that must match exactly once:
the σ grid (linspace(1, 0, T + 1) in float32, then the static shift), the Flow-SDE step (its std, with σ_1 in the
denominator at σ = 1, and mean), the log-prob and its mean over the latent, the Euler steps outside the SDE steps,
the timestep the transformer is told, how the 3 SDE steps are drawn (``rng.choice`` of distinct indices of the pool,
one draw per rollout for every sample) and that every SDE step is trained, the Flow-DPPO loss (the ratio, the KL
between the current and pre-update transition means, its mean over the latent and σ_t with σ capped at 0.99, the
mask rule, ``where(keep, −A·ρ, 0)`` and its plain mean), the advantage (group mean, one batch-wide Bessel std + 1e-8,
no clip), how the two optimizer steps split each process's shard, the LoRA (peft's default initialisation) and the
optimizer.
"""

from __future__ import annotations

import ast
import re

from official import Checkout, ExtractionError, Launch, Value, code_fact, dataclass_defaults, yaml_values

REPOSITORY = "Tencent-Hunyuan/UniRL"
ENV = "UNIRL_PATH"
PRESETS = ("flow_dppo",)

LAUNCH = "examples/diffusion/sd3_flowdppo.yaml"
ENTRY = "unirl/train_diffusion.py"
TRAINER = "unirl/trainer/diffusion.py"
STACK = "unirl/train/stack.py"
ALGORITHM = "unirl/algorithms/flowdppo.py"
KERNELS = "unirl/sde/kernels.py"
RUNTIME = "unirl/sde/runtime.py"
SCHEDULER = "unirl/utils/scheduler_utils.py"
STAGE = "unirl/models/sd3/diffusion.py"
TEXT = "unirl/models/sd3/text_embed.py"
ENGINE = "unirl/rollout/engine/trainside/engine.py"
TRACK = "unirl/types/rollout_resp.py"
INJECT = "unirl/train/inject.py"
FACTORIES = "unirl/train/factories.py"

# the launch -> (flowgrpo model config, flowgrpo rewards)
RUNS = {LAUNCH: ("sd3_5_medium", ["pickscore"])}

# the sections whose instantiated target's defaults the YAML leaves in place: YAML section -> the constructor
# parameters read (None: a dataclass, every field); a parameter the trainer passes itself (the bundle, the pipeline,
# the stage, a device) is not a default of the run
DEFAULTS_OF = {
    "sampling": None,
    "bundle.config": None,
    "backend.fsdp_cfg": None,
    "backend.lora_cfg": None,
    "backend.optimizer_cfg": None,
    "backend.scheduler_cfg": None,
    "reward.backend.config": None,
    "algorithm": ("old_logp_source",),
    "backend": ("ema_lora_cfg", "ema_cfg", "with_aux"),
    "reward": ("truncated_reward", "overlong_buffer_len", "overlong_penalty_factor"),
}

NOTES = {"flow_dppo": "The paper's SD3.5-Medium PickScore run: examples/diffusion/sd3_flowdppo.yaml (a hydra config, "
                      "# @package _global_ with no defaults list) over unirl/train_diffusion.py, 8 processes "
                      "(FlowDPPO/README.md's launch). Keys without a `code.` prefix are the YAML's leaves (dotted), "
                      "the cfg.get defaults of train_diffusion.py's main() and the defaults of the dataclasses and "
                      "constructors it instantiates that the YAML leaves in place; `code.*` keys are constants of the "
                      "loss (unirl/algorithms/flowdppo.py), the SDE kernel, σ schedule and SDE-step scheduler, the "
                      "SD3 stage, the advantage, the train stack, the LoRA injection and the optimizer factory."}


# ----------------------------------------------------------------------------------------------- the launch
def _module_file(checkout: Checkout, target: str) -> tuple[str, str]:
    """(file, class) of a hydra ``_target_`` ``package.module.Class`` in the checkout."""
    module, _, name = target.rpartition(".")
    relpath = module.replace(".", "/") + ".py"
    checkout.file(relpath)
    return relpath, name


def _init_defaults(checkout: Checkout, relpath: str, class_name: str, names) -> dict[str, tuple[object, int]]:
    """{parameter: (default, line)} of ``class_name.__init__``'s ``names`` in ``relpath``, by AST."""
    tree = ast.parse(checkout.file(relpath).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            inits = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
            if len(inits) != 1:
                raise ExtractionError(f"{relpath}: {class_name} has {len(inits)} __init__")
            args = inits[0].args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            found = {}
            for arg, default in pairs:
                if arg.arg in names:
                    try:
                        value = ast.literal_eval(default)
                    except ValueError:
                        value = ast.unparse(default)
                    found[arg.arg] = (value, arg.lineno)
            missing = set(names) - set(found)
            if missing:
                raise ExtractionError(f"{relpath}: {class_name}.__init__ has no defaults for {sorted(missing)}")
            return found
    raise ExtractionError(f"{relpath} has no class {class_name}")


def _target_defaults(checkout: Checkout, values: dict[str, Value]) -> dict[str, Value]:
    """The defaults of each DEFAULTS_OF section's target that the YAML does not set, keyed under the section."""
    out = {}
    for section, names in DEFAULTS_OF.items():
        target = values.get(f"{section}._target_")
        if target is None:
            raise ExtractionError(f"{LAUNCH} has no {section}._target_")
        relpath, name = _module_file(checkout, target.value)
        if names is None:
            fields = {k: (a.default, a.line) for k, a in dataclass_defaults(checkout, relpath, name).items()}
        else:
            fields = _init_defaults(checkout, relpath, name, names)
        for field, (default, line) in fields.items():
            key = f"{section}.{field}"
            if not any(k == key or k.startswith(key + ".") for k in values):  # set, or a section of its own
                out[key] = Value(default, f"{relpath}:{line} (default)")
    return out


def _entry_defaults(checkout: Checkout, values: dict[str, Value]) -> dict[str, Value]:
    """The ``cfg.get(name[, default])`` calls of train_diffusion.py's ``main()`` for top-level keys the YAML does not
    set: their defaults (None without one), at the call's line."""
    tree = ast.parse(checkout.file(ENTRY).read_text())
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    if len(mains) != 1:
        raise ExtractionError(f"{ENTRY}: {len(mains)} functions main")
    out = {}
    for node in ast.walk(mains[0]):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "cfg" and node.args
                and isinstance(node.args[0], ast.Constant)):
            name = node.args[0].value
            if any(k == name or k.startswith(name + ".") for k in values):
                continue
            default = ast.literal_eval(node.args[1]) if len(node.args) > 1 else None
            out[name] = Value(default, f"{ENTRY}:{node.lineno} (default)")
    return out


def _launch_values(checkout: Checkout) -> dict[str, Value]:
    text = checkout.file(LAUNCH).read_text()
    if not text.startswith("# @package _global_"):
        raise ExtractionError(f"{LAUNCH} is no longer a `# @package _global_` config")
    values = yaml_values(checkout, LAUNCH)
    if any(k == "defaults" or k.startswith("defaults.") for k in values):
        raise ExtractionError(f"{LAUNCH} has a defaults list now: read what it pulls in")
    values.update(_target_defaults(checkout, values))
    values.update(_entry_defaults(checkout, values))
    return values


# --------------------------------------------------------------------------------------------- code facts
def code_facts(checkout: Checkout) -> dict[str, Value]:
    """The constants the loss, the sampler, the scheduler, the advantage and the training stack fix, each at its
    line."""

    def fact(relpath, pattern, convert=str, function=None):
        return code_fact(checkout, relpath, pattern, convert, function)

    return {
        # ---- the rollout's σ grid: torch.linspace (float32, no dtype given), then the static shift; the engine's
        # policy takes the pipeline's shift (SD3Pipeline has no build_schedule_policy; SD3.5-Medium's scheduler config
        # has no dynamic shifting, and a hub name that is no local folder is the static policy outright)
        "code.sigma_grid": fact(RUNTIME, r"t = (torch\.linspace\(1\.0, 0\.0, num_steps \+ 1\))",
                                function="get_sigma_schedule"),
        "code.time_shift": fact(RUNTIME, r"sigmas = (\(shift \* t\) / \(1 \+ \(shift - 1\) \* t\))",
                                function="get_sigma_schedule"),
        "code.schedule_shift": fact(ENGINE, r"FlowMatchSchedulePolicy\.from_pretrained\([\s\S]{0,200}?"
                                            r"shift=float\((pipeline\.shift)\)"),
        # ---- the Flow-SDE step (FlowSDEStrategy): σ_t = η·√(σ/(1 − σ)), σ_1 in place of σ at σ = 1, s = σ_t·√Δ
        "code.sde_std": _flow_sde(checkout, r"std_dev_t = (torch\.sqrt\(sigma / \(1 - torch\.where\(sigma == 1, "
                                            r"sigma_max, sigma\)\)\) \* eta)"),
        "code.sde_mean": _flow_sde(checkout, r"prev_sample_mean = \(\s*(sample \* \(1 \+ std_dev_t\*\*2 / \(2 \* sigma\) "
                                             r"\* dt\)\s*\+ noise_pred \* \(1 \+ std_dev_t\*\*2 \* \(1 - sigma\) / "
                                             r"\(2 \* sigma\)\) \* dt)\s*\)", lambda t: " ".join(t.split())),
        "code.sde_noise_std": _flow_sde(checkout, r"std_var = (std_dev_t \* torch\.sqrt\(-dt\))"),
        "code.sigma_max": fact(STAGE, r"sigma_max = (schedule\[1\])\.float\(\) if", function="diffuse"),
        "code.log_prob": _flow_sde(checkout, r"log_prob = \(\s*(-\(\(prev_sample\.detach\(\) - prev_sample_mean\) "
                                             r"\*\* 2\) / \(2 \* std_var\*\*2\)\s*- torch\.log\(std_var\)\s*"
                                             r"- 0\.5 \* math\.log\(2 \* math\.pi\))\s*\)",
                                   lambda _: "gaussian", "compute_log_prob"),
        # SDEStrategy._finalize_logp, which every SDE strategy inherits
        "code.log_prob_reduce": fact(KERNELS, r"log_prob = log_prob\.(mean)\(dim=tuple\(range\(1, log_prob\.ndim\)\)\)"),
        # every step outside the SDE steps runs the same kernel at η = 0: μ = x + v·dt, Euler
        "code.ode_steps": fact(STAGE, r"step_eta = float\(params\.eta\) if i in sde_set else (0\.0)", float, "diffuse"),
        # the transformer is told σ·1000, a float
        "code.timestep": fact(STAGE, r"timestep = (sigma \* 1000\.0)", function="predict_noise"),
        "code.max_sequence_length": fact(TEXT, r"max_sequence_length: int = (\d+),", int),
        # ---- the SDE steps: num_sde_steps distinct indices of range(int(T·f0), int(T·f1)), one draw per rollout
        # (np.random.default_rng(rollout index)) for every sample of it
        "code.sde_pool": fact(SCHEDULER, r"pool = (list\(range\(self\._effective_start, self\._effective_end\)\))"),
        "code.sde_pool_bounds": fact(SCHEDULER,
                                     r"self\._effective_start = (int\(num_timesteps \* self\._fraction_start\))"),
        "code.sde_step_draw": fact(SCHEDULER, r"chosen = rng\.(choice)\(pool, size=self\.num_sde_steps, replace=False\)"),
        "code.sde_step_seed": fact(SCHEDULER, r"seed = (0 if step is None else int\(step\))"),
        # every SDE step is trained
        "code.trained_steps": fact(ALGORITHM, r"return (\[int\(i\) for i in segment\.sde_indices\.tolist\(\)\])",
                                   function="_resolve_target_steps"),
        # ---- the loss: ρ = exp(lp_θ − lp_old); KL = mean_D((μ_θ − μ_old)²/(2σ_t²)); dropped where KL ≥ δ and ρ moves
        # further on A's side; where(keep, −A·ρ, 0), its plain mean over the micro-batch's samples x steps
        "code.ratio": fact(ALGORITHM, r"log_diff = (new_logp - old_logp)\n\s*ratio = torch\.exp\(log_diff\)"),
        "code.policy_term": fact(ALGORITHM, r"unclipped_loss = (-adv \* ratio)"),
        "code.kl": fact(ALGORITHM, r"return (\(p - q\) \*\* 2 / \(2 \* sigma\*\*2\))", function="_gaussian_kl_div"),
        "code.kl_reduce": fact(ALGORITHM,
                               r"kl_per_sample = kl_per_elem\.(mean)\(dim=tuple\(range\(2, kl_per_elem\.ndim\)\)\)"),
        "code.kl_sigma": fact(ALGORITHM, r"sigma_t = (std_dev_t \* torch\.sqrt\(-dt\))", function="_compute_sigma_t"),
        "code.kl_sigma_cap": fact(ALGORITHM,
                                  r"std_dev_t = torch\.sqrt\(s / \(1\.0 - torch\.clamp\(s, max=([\d.]+)\)\)\) \* eta",
                                  float, "_compute_sigma_t"),
        "code.kl_keep": fact(ALGORITHM, r"kl_mask = (kl_per_sample < kl_mask_threshold)"),
        "code.mask_positive": fact(ALGORITHM, r"pos_rm_mask = (\(~kl_mask\) & \(ratio > 1\.0\) & \(adv > 0\))"),
        "code.mask_negative": fact(ALGORITHM, r"neg_rm_mask = (\(~kl_mask\) & \(ratio < 1\.0\) & \(adv < 0\))"),
        "code.masked_value": fact(ALGORITHM, r"loss_per_elem = torch\.where\(keep_adv_mask, unclipped_loss, (zero)\)"),
        "code.loss_reduce": fact(ALGORITHM, r"loss = (loss_per_elem\.mean\(\))",
                                 function="compute_loss_and_backward"),
        "code.micro_loss_scale": fact(STACK, r"loss_scale = (1\.0 / len\(micro_slices\))", function="train"),
        "code.loss_terms": fact(ALGORITHM, r"\((loss \* loss_scale)\)\.backward\(\)",
                                function="compute_loss_and_backward"),
        # π_old (its log-prob and its transition means) frozen once, before the optimizer steps
        "code.anchor_fields": fact(ALGORITHM, r"anchor_fields = (\(\"sde_logp\", \"sde_means\"\))",
                                   lambda t: list(ast.literal_eval(t))),
        # ---- the advantage: (r − group mean) / (batch-wide Bessel std + eps), not clipped
        "code.advantage": fact(TRACK, r"adv = (\(reshaped - mean\) / std)", function="compute_advantages"),
        "code.advantage_global_std": fact(TRACK, r"std = (rewards\.std\(\) \+ eps)", function="compute_advantages"),
        "code.advantage_eps": fact(TRACK, r"eps: float = ([\d.e-]+),", float, "compute_advantages"),
        "code.advantage_call": fact(TRAINER, r"track\.compute_advantages\((normalize=True), use_global_std=",
                                    function="train_step"),
        # ---- the optimizer steps: each process's contiguous shard cut into num_updates_per_batch contiguous slices
        "code.update_slices": fact(STACK, r"return tuple\((\(i \* mini_batch_size, \(i \+ 1\) \* mini_batch_size\)) "
                                          r"for i in range\(n\)\)", function="_build_mini_batch_slices"),
        # ---- the LoRA and the optimizer
        "code.lora_init": fact(INJECT, r"peft_cfg = LoraConfig\(([^)]*)\)",
                               lambda t: re.search(r"init_lora_weights=([^,]+)", t).group(1) if "init_lora_weights" in t
                               else "True (peft's default: A Kaiming-uniform, B = 0)", "inject_lora"),
        "code.optimizer": fact(FACTORIES, r"return torch\.optim\.(AdamW)\(", function="build_optimizer"),
        "code.lr_constant": fact(FACTORIES, r"if scheduler_type == \"constant\":\n\s*return (torch\.optim\.lr_scheduler\."
                                            r"LambdaLR\(optimizer, lambda step: 1\.0\))", function="build_lr_scheduler"),
    }


def _flow_sde(checkout: Checkout, pattern: str, convert=str, function: str = "step") -> Value:
    """A constant of FlowSDEStrategy (``function`` of the class, found within the class's source)."""
    text = checkout.file(KERNELS).read_text()
    classes = [n for n in ast.parse(text).body if isinstance(n, ast.ClassDef) and n.name == "FlowSDEStrategy"]
    if len(classes) != 1:
        raise ExtractionError(f"{KERNELS}: {len(classes)} classes FlowSDEStrategy")
    methods = [f for f in classes[0].body if isinstance(f, ast.FunctionDef) and f.name == function]
    if len(methods) != 1:
        raise ExtractionError(f"{KERNELS}: FlowSDEStrategy has {len(methods)} methods {function}")
    lines = text.splitlines(keepends=True)
    start = sum(len(line) for line in lines[: methods[0].lineno - 1])
    scope = "".join(lines[methods[0].lineno - 1: methods[0].end_lineno])
    matches = list(re.finditer(pattern, scope, re.MULTILINE))
    if len(matches) != 1:
        raise ExtractionError(f"{KERNELS} (FlowSDEStrategy.{function}): {len(matches)} matches of {pattern!r}")
    line = text[: start + matches[0].start(1)].count("\n") + 1
    return Value(convert(matches[0].group(1)), f"{KERNELS}:{line}")


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    values = _launch_values(checkout)
    values.update(code_facts(checkout))
    out = []
    for launch, (model, rewards) in RUNS.items():
        out.append(Launch(launch.rsplit("/", 1)[-1].removesuffix(".yaml"), model, rewards, dict(values), f"{launch}:1"))
    return out
