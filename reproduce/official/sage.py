"""SAGE-GRPO's launch (Tencent-Hunyuan/SAGE-GRPO): the paper's HunyuanVideo-1.5 run, scripts/post_train/train_grpo.sh
over post_train.py (its argparse flags feed the ``TrainingConfig`` dataclass, whose other fields keep their defaults),
at the 64 processes of the README's recommended setting, and the constants its GRPO loop (hyvideo/utils/grpo_utils.py),
scheduler and pipeline hard-code. Its optimizer is HunyuanVideo-1.5's Muon (``get_muon_optimizer`` called with the
learning rate and weight decay alone, every other argument at its default): read from a second checkout,
Tencent-Hunyuan/HunyuanVideo-1.5 (``HUNYUANVIDEO_1_5_PATH``), cited as ``<repository>@<commit> <file>:<line>``.

The code trains HunyuanVideo-1.5 only; flowgrpo ships no HunyuanVideo config, so the launch is composed with
wan2_1_t2v_14b (a single video transformer at the same flow shift 5 and 81 frames; Wan2.2-A14B's two experts run at
shift 12 with two guidance scales). Its keys of HunyuanVideo's own (resolution bucket, VAE, text encoders, input
layout) are listed as such in reproduce/official/map/sage.yaml.
"""

from __future__ import annotations

import ast
import re

from official import (Argument, Checkout, ExtractionError, Launch, Value, argparse_defaults, code_fact,
                      dataclass_defaults, shell_arguments)

REPOSITORY = "Tencent-Hunyuan/SAGE-GRPO"
ENV = "SAGE_GRPO_PATH"
PRESETS = ("sage",)

# HunyuanVideo-1.5, whose hyvideo/optim/muon.py SAGE-GRPO imports (its own copy of the file is not in the checkout)
MUON_REPOSITORY = "Tencent-Hunyuan/HunyuanVideo-1.5"
MUON_ENV = "HUNYUANVIDEO_1_5_PATH"
MUON = "hyvideo/optim/muon.py"

SCRIPT = "post_train.py"
GRPO = "hyvideo/utils/grpo_utils.py"
SCHEDULER = "hyvideo/schedulers/scheduling_flow_match_discrete.py"
PIPELINE = "hyvideo/pipelines/hunyuan_video_grpo_pipeline.py"
README = "README.md"
LAUNCHER = "scripts/post_train/train_grpo.sh"   # the multi-node run (run_post_train_multinode.sh -> pdsh_train.sh)
SINGLE_NODE = "run_post_train.sh"               # the same flags on one node of 8 GPUs
RUNS = {LAUNCHER: ("wan2_1_t2v_14b", ["videoalign"])}

NOTES = {"sage": "The paper's run: scripts/post_train/train_grpo.sh (the same flags as run_post_train.sh) over "
                 "post_train.py's argparse defaults and TrainingConfig dataclass defaults (a field main() does not "
                 "pass keeps its dataclass default), at the 64 processes of the README's recommended setting "
                 "(`launch.processes`). `code.*` keys are constants of post_train.py, hyvideo/utils/grpo_utils.py, "
                 "the scheduler and the GRPO pipeline, and of HunyuanVideo-1.5's hyvideo/optim/muon.py (the Muon "
                 "SAGE-GRPO trains with; cited with that repository and commit). Not in the checkout: "
                 "hyvideo/commons/grpo_commons.py (its AdaptiveKLController's ramp and thresholds, the group "
                 "z-score's std), which no stored copy of the repository holds."}


# ----------------------------------------------------------------------------------------------- the launch
def _official_function(checkout: Checkout, relpath: str, name: str):
    """A module-level function of the checkout, defined from its own source (ast; nothing else of the file runs)."""
    text = checkout.file(relpath).read_text()
    nodes = [n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(nodes) != 1:
        raise ExtractionError(f"{relpath}: {len(nodes)} module-level functions named {name}")
    import argparse

    namespace: dict = {"argparse": argparse}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), relpath, "exec"), namespace)  # noqa: S102 (the checkout's)
    return namespace[name]


def _parsed(text: str | None, arg: Argument, str_to_bool):
    """A launch-script value as post_train.py's argparse parses it (``type=str_to_bool`` with ``nargs='?'``,
    ``const=True``: a bare flag is True)."""
    if arg.type == "str_to_bool":
        return str_to_bool(text)
    if text is None:
        raise ExtractionError(f"--{arg.dest} has no value (type {arg.type})")
    return {"int": int, "float": float}.get(arg.type, str)(text)


def _argparse_values(checkout: Checkout, fields: dict[str, Argument]) -> tuple[dict[str, Value], object]:
    """Every argparse dest of post_train.py as the launcher runs it: its flag there, else the add_argument default
    (a default that is a TrainingConfig field's default resolved to it)."""
    arguments = argparse_defaults(checkout, SCRIPT)
    command = shell_arguments(checkout, LAUNCHER, SCRIPT)
    unknown = sorted(set(command.flags) - set(arguments))
    if unknown:
        raise ExtractionError(f"{LAUNCHER} passes {unknown}, which {SCRIPT} does not define")
    single = shell_arguments(checkout, SINGLE_NODE, SCRIPT)
    if {k: v for k, (v, _) in single.flags.items()} != {k: v for k, (v, _) in command.flags.items()}:
        raise ExtractionError(f"{SINGLE_NODE} and {LAUNCHER} pass different flags to {SCRIPT}")
    str_to_bool = _official_function(checkout, SCRIPT, "str_to_bool")
    values = {}
    for dest, arg in arguments.items():
        if dest in command.flags:
            text, line = command.flags[dest]
            values[dest] = Value(_parsed(text, arg, str_to_bool), f"{LAUNCHER}:{line}")
            continue
        default, source = arg.default, f"{SCRIPT}:{arg.line} (default)"
        match = re.fullmatch(r"TrainingConfig\.__dataclass_fields__\[['\"](\w+)['\"]\]\.default", str(default))
        if match:
            field = fields[match.group(1)]
            default, source = field.default, f"{SCRIPT}:{field.line} (TrainingConfig default, via {SCRIPT}:{arg.line})"
        values[dest] = Value(default, source)
    return values, command


def _training_config(checkout: Checkout) -> tuple[dict[str, Value], object]:
    """Every TrainingConfig field as main() builds it: ``field=args.x`` takes the argparse value, ``args.x if args.x is
    not None else <the field's default>`` the argparse value unless it is None, ``SNRType(args.x)`` the argparse value,
    anything else (a path built at run time) its source text; a field main() does not pass keeps its default."""
    fields = dataclass_defaults(checkout, SCRIPT, "TrainingConfig")
    args, command = _argparse_values(checkout, fields)
    tree = ast.parse(checkout.file(SCRIPT).read_text())
    calls = [n for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main" for n in ast.walk(f)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "TrainingConfig"]
    if len(calls) != 1:
        raise ExtractionError(f"{SCRIPT}: main() builds TrainingConfig {len(calls)} times (expected once)")

    def arg_of(node):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args":
            return node.attr
        return None

    values, used = {}, set()
    for keyword in calls[0].keywords:
        name, node = keyword.arg, keyword.value
        if name not in fields:
            raise ExtractionError(f"{SCRIPT}:{node.lineno}: TrainingConfig has no field {name}")
        dest = arg_of(node)
        if dest is None and isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "SNRType":
            dest = arg_of(node.args[0])
        if dest is None and isinstance(node, ast.IfExp) and arg_of(node.body):
            dest = arg_of(node.body)
            if args[dest].value is None:  # args.x if args.x is not None else TrainingConfig's default
                values[name] = Value(fields[name].default, f"{SCRIPT}:{fields[name].line} (TrainingConfig default, "
                                                           f"{SCRIPT}:{node.lineno} passes --{dest} None)")
                used.add(dest)
                continue
        if dest is not None:
            values[name] = args[dest]
            used.add(dest)
        else:
            values[name] = Value(ast.unparse(node), f"{SCRIPT}:{node.lineno}")
    for name, field in fields.items():
        if name not in values:
            values[name] = Value(field.default, f"{SCRIPT}:{field.line} (TrainingConfig default)")
    # an argument main() parses and never hands to TrainingConfig (--output_dir: the run folder is built from the
    # time instead) keeps its own key
    for dest in sorted(set(args) - used):
        values[f"args.{dest}"] = args[dest]
    return values, command


# --------------------------------------------------------------------------------------------- code facts
def _names(text: str) -> list[str]:
    return re.findall(r"self\.config\.(\w+)", text)


def _keywords(text: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, v in (part.split("=", 1) for part in text.split(",") if "=" in part)}


def code_facts(checkout: Checkout) -> dict[str, Value]:
    """The constants the training loop, the scheduler, the pipeline and the README fix, each at its line."""

    def fact(relpath, pattern, convert=str, function=None):
        return code_fact(checkout, relpath, pattern, convert, function)

    return {
        # the world of the paper's run: the README's recommended setting (64 GPUs; the launcher takes them from env)
        "launch.processes": fact(README, r"^world_size = (\d+)\s+sp_size = \d+", int),
        # one optimizer step per (batch_size x grpo_sampling_steps) accumulated transitions, the loss divided by it
        "code.grad_accumulation": fact(SCRIPT, r"self\.grpo_args\.gradient_accumulation_steps = \(\s*"
                                               r"(int\(self\.config\.gradient_accumulation_steps\)\s*\*\s*"
                                               r"int\(self\.config\.grpo_sampling_steps\)\s*\*\s*"
                                               r"int\(max\(self\.config\.batch_size, 1\)\))\s*\)", _names, "_train_grpo"),
        "code.loss_normalizer": fact(GRPO, r"final_loss = loss / (args\.gradient_accumulation_steps)",
                                     function="train_one_step"),
        "code.lr_scheduler": fact(SCRIPT, r'self\.lr_scheduler = get_scheduler\(\s*"(\w+)"', function="_build_optimizer"),
        "code.muon_call": fact(SCRIPT, r"self\.optimizer = get_muon_optimizer\(\s*(model=self\.transformer,\s*"
                                       r"lr=self\.config\.learning_rate,\s*weight_decay=self\.config\.weight_decay,)\s*\)",
                               lambda t: sorted(_keywords(t)), "_build_optimizer"),
        # the global RNG the SDE steps draw from (sde_step_with_logprob's generator=None): seeded seed + dp_rank
        "code.step_noise_seed": fact(SCRIPT, r"self\._set_seed\((config\.seed \+ self\.dp_rank)\)"),
        # the rollout: the grid (linspace(1, 0, T + 1), then the time shift), every step SDE ('all')
        "code.sigma_grid": fact(SCHEDULER, r"sigmas = torch\.(linspace)\(1, 0, num_inference_steps \+ 1\)",
                                lambda _: "linear", "set_timesteps"),
        "code.time_shift": fact(SCHEDULER, r"return (\(self\.config\.shift \* t\) / "
                                           r"\(1 \+ \(self\.config\.shift - 1\) \* t\))", function="sd3_time_shift"),
        "code.training_strategy": fact(GRPO, r"training_strategy = getattr\(args, 'training_strategy', '(\w+)'\)",
                                       function="prepare_samples_online"),
        # the sage_grpo step: s² = η²(ln((1 − σ')/(1 − min(σ, 1 − 3e-3))) − Δ), μ = x − Δ·v + ½·s²·score
        "code.sde_std": fact(SCHEDULER, r"std_dev_t_sq = (eta\*\*2 \* \(-delta_t \+ torch\.log\(\(1 - next_sigma\) / "
                                        r"\(1 - _sigma\)\)\))", function="sde_step_with_logprob"),
        "code.sde_sigma_cap": fact(SCHEDULER, r"_sigma = torch\.clamp\(sigma, max=1-([\d.e-]+)\)", float,
                                   "sde_step_with_logprob"),
        "code.sde_score": fact(SCHEDULER, r"score_estimate = (-\(sample - pred_original_sample \* \(1 - sigma\)\) / "
                                          r"\(sigma \*\* 2\))\s*\n\s*prev_sample_mean = prev_sample_mean \+ 0\.5",
                               function="sde_step_with_logprob"),
        "code.sde_drift": fact(SCHEDULER, r"prev_sample_mean = prev_sample_mean \+ "
                                          r"(0\.5 \* std_dev_t_sq \* score_estimate)", function="sde_step_with_logprob"),
        "code.sde_solver_rollout": fact(PIPELINE, r"prev_sample=None, grpo=True, sde_solver=(True), sde_type=sde_type",
                                        lambda v: v == "True", "__call__"),
        "code.sde_solver_training": fact(GRPO, r"prev_sample=pre_latents\.to\(torch\.float32\) if pre_latents is not None "
                                               r"else None,\s*grpo=True,\s*sde_solver=(True),",
                                         lambda v: v == "True", "grpo_one_step"),
        "code.log_prob": fact(SCHEDULER, r"sde_type == 'sage_grpo':(?:(?!elif sde_type)[\s\S])*?log_prob = \(\s*"
                                         r"(-\(\(prev_sample\.detach\(\)[^\n]*\(2 \* \(std_dev_t \*\* 2\)\)\s*\n\s*"
                                         r"- torch\.log\(std_dev_t\)\s*\n\s*- torch\.log\(torch\.sqrt\(2 \* "
                                         r"torch\.as_tensor\(math\.pi\)\)\))", lambda _: "gaussian",
                              "sde_step_with_logprob"),
        "code.log_prob_reduce": fact(SCHEDULER, r"log_prob = log_prob\.(mean)\(dim=tuple\(range\(1, log_prob\.ndim\)\)\)",
                                     function="sde_step_with_logprob"),
        # x_T: a generator per sample seeded base_seed + its index in the group, the base seed the prompt's CSV seed
        # or VideoPromptDataset's default 42; drawn in the autocast dtype (precision)
        "code.initial_noise_seed": fact(GRPO, r"processed_seeds\.append\((base_seed \+ sample_idx_in_group)\)",
                                        function="prepare_samples_online"),
        "code.initial_noise_generator": fact(GRPO, r"batch_generators\.append\(torch\.Generator\(device=device\)"
                                                   r"\.manual_seed\((seed_value)\)\)", function="prepare_samples_online"),
        "code.dataset_seed": fact(PIPELINE, r"byt5_tokenizer=None, \s*\n\s*seed=(\d+)\s*\n\s*\):", int),
        "code.initial_noise_dtype": fact(PIPELINE, r"# prompt_embeds\.dtype,\s*\n\s*(target_dtype),", function="__call__"),
        # the transformer's inputs: HunyuanVideo-1.5's 480 bucket, classifier-free guidance in rollout and training
        "code.target_size": fact(GRPO, r"target_size = (\{[^}]*\})", ast.literal_eval, "_resolve_target_size"),
        "code.cfg_training": fact(GRPO, r'guidance_scale = getattr\(args, "(cfg_scale)", 1\.0\)', function="grpo_one_step"),
        "code.guidance_rescale": fact(GRPO, r'guidance_rescale=getattr\(args, "guidance_rescale", ([\d.]+)\)', float,
                                      "grpo_one_step"),
        "code.cfg_formula": fact(PIPELINE, r"noise_pred = (noise_pred_uncond \+ current_guidance_scale \* \(\s*"
                                           r"noise_pred_text - noise_pred_uncond\s*\))", lambda t: " ".join(t.split()),
                                 "denoise_step"),
        "code.text_len": fact(SCRIPT, r'"text_len": (\d+),', int, "_build_video_dataset"),
        # which steps train: the first max(int(T · timestep_fraction), 1), the last step (σ → 0) included
        "code.train_timesteps": fact(GRPO, r'train_timesteps = (max\(int\(len\(samples\["timesteps"\]\[0\]\) \* '
                                           r'args\.timestep_fraction\), 1\))', function="train_one_step"),
        # advantages: the group's z-score (grpo_commons._normalize_group), clipped at adv_clip_max
        "code.advantage_grouping": fact(GRPO, r"advantages = (_normalize_group)\(rewards, ranks_per_group, num_groups, "
                                              r"samples_per_grp\)", function="train_one_step"),
        # the loss: PPO's clipped ratio, times the equaliser median(g)/g_k of the step, plus the adaptive KL terms
        "code.ppo_loss": fact(GRPO, r"policy_loss_per = torch\.(maximum)\(unclipped_loss, clipped_loss\)",
                              lambda _: "plain", "train_one_step"),
        "code.grad_balancing_center": fact(SCHEDULER, r"median_norm = torch\.(median)\(grad_norms\)",
                                           function="compute_grad_balancing_factors"),
        "code.grad_balancing_jacobian": fact(SCHEDULER, r"(mean_jac -= 0\.5 \* std_sq \* \(\(1 - sigma\) / sigma\))",
                                             function="compute_log_prob_grad_norms"),
        "code.kl_form": fact(GRPO, r"kl_step = (mu_diff_sq_mean / \(2 \* std_dev_t_sq\))", function="train_one_step"),
        "code.kl_reduce": fact(GRPO, r"mu_diff_sq_mean = mu_diff_sq\.(mean)\(dim=spatial_dims, keepdim=True\)",
                               function="train_one_step"),
        "code.kl_std_eps": fact(GRPO, r"std_dev_t_sq = std_devs\.to\(device=device, dtype=torch\.float32\) \*\* 2 \+ "
                                      r"([\d.e-]+)", float, "train_one_step"),
        "code.kl_stepwise": fact(GRPO, r"kl_stepwise = (torch\.mean\(old_logp - new_log_probs\))",
                                 function="train_one_step"),
        "code.kl_effective": fact(GRPO, r"effective_kl = (dual_moving_weight \* kl_loss \+ dual_step_weight \* "
                                        r"kl_stepwise)", function="train_one_step"),
        "code.kl_total": fact(GRPO, r"loss = (policy_loss \+ kl_beta \* effective_kl) if", function="train_one_step"),
        "code.kl_controller": fact(GRPO, r"args\._kl_controller = (AdaptiveKLController)\(", function="train_one_step"),
        "code.kl_controller_arguments": fact(GRPO, r"AdaptiveKLController\(\s*(target_kl=kl_w_base,\s*"
                                                   r"init_kl_coef=init_kl_coef,\s*min_kl_coef=min_kl_coef,\s*"
                                                   r"max_kl_coef=kl_w_base)\s*\)", _keywords, "train_one_step"),
        "code.kl_controller_init": fact(GRPO, r"init_kl_coef = (max\(min_kl_coef, min\(kl_coef, kl_w_base\)\))",
                                        function="train_one_step"),
        "code.kl_controller_report": fact(GRPO, r"args\._kl_controller\.update\((effective_kl)\)",
                                          function="train_one_step"),
    }


def muon_facts(checkout: Checkout) -> tuple[dict[str, Value], Checkout]:
    """HunyuanVideo-1.5's Muon (``get_muon_optimizer``'s defaults and the update), from its own checkout: every value
    cited ``Tencent-Hunyuan/HunyuanVideo-1.5@<commit7> hyvideo/optim/muon.py:<line>``."""
    muon = Checkout.from_env(MUON_REPOSITORY, MUON_ENV)
    commit = muon.commit_of(MUON)
    prefix = f"{MUON_REPOSITORY}@{commit[:7]} "

    def fact(pattern, convert=ast.literal_eval, function=None):
        found = code_fact(muon, MUON, pattern, convert, function)
        return Value(found.value, prefix + found.source)

    facts = {
        "code.muon_momentum": fact(r"def get_muon_optimizer\([^)]*momentum=([\d.]+)"),
        "code.muon_nesterov": fact(r"nesterov=(True|False),"),
        "code.muon_ns_steps": fact(r"ns_steps=(\d+),\s*\n\s*adamw_params=None"),
        "code.muon_ns_coefficients": fact(r"a, b, c = (\([-\d., ]+\))", lambda t: list(ast.literal_eval(t))),
        "code.muon_ns_eps": fact(r"X = X / \(X\.norm\(dim=\(-2, -1\), keepdim=True\) \+ ([\d.e-]+)\)", float),
        "code.muon_dtype": fact(r"g = g\.(bfloat16)\(\)", str),
        "code.muon_lr_scale": fact(r"adjusted_ratio = (0\.2 \* math\.sqrt\(max\(A, B\)\))", str),
        "code.muon_weight_decay": fact(r"p\.data\.mul_\((1 - lr \* wd)\)", str),
        "code.muon_params": fact(r"if p\.requires_grad and (p\.ndim >= 2)", str, "get_muon_optimizer"),
        "code.adamw_betas": fact(r"def get_muon_optimizer\([^)]*adamw_betas=(\([\d., ]+\))",
                                 lambda t: list(ast.literal_eval(t))),
        "code.adamw_eps": fact(r"def get_muon_optimizer\([^\n]*adamw_eps=([\d.e-]+)\)", float),
        "code.adamw_bias_correction": fact(r"scale = (bias_correction1 / bias_correction2\*\*0\.5)", str),
    }
    return facts, muon


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    values, command = _training_config(checkout)
    values.update(code_facts(checkout))
    muon, muon_checkout = muon_facts(checkout)
    values.update(muon)
    # write_data names each cited file's commit: the Muon's file is HunyuanVideo-1.5's, at its own commit
    for value in muon.values():
        checkout.commits[value.source.rsplit(":", 1)[0]] = muon_checkout.commit_of(MUON)
    out = []
    for launcher, (model, rewards) in RUNS.items():
        out.append(Launch(launcher.rsplit("/", 1)[-1], model, rewards, dict(values), f"{launcher}:{command.line}"))
    return out
