"""CRD's launch (X-GenGroup/Flow-Factory, the trainer of the paper's first author): the SD3.5-Medium OCR run,
examples/crd/lora/sd3_5/default.yaml over src/flow_factory/trainers/crd.py (``flow_factory-train`` reads the YAML into
``Arguments.from_dict``: each section a dataclass, ``train`` the trainer type's ``CRDTrainingArguments``).

Every leaf of the YAML is read with its line (``yaml_values``); the two reward lists are read item by item
(``rewards.0.weight``). What the YAML leaves in place is read too: the defaults of the dataclass fields each section
does not set (``Arguments``' top-level fields, ``DataArguments``, ``ModelArguments``, ``SchedulerArguments``,
``CRDTrainingArguments`` over ``TrainingArguments``, ``EvaluationArguments``, ``LogArguments``, and
``RewardArguments`` for each reward), each at its field's line.

``code.*`` keys are the constants the code fixes, each found by a regular expression that must match exactly once:
the implicit reward (the current and old errors, each over its own detached mean |v − u| floored at 1e-5), its mean
over the latent, where it is centred (gathered over every process's micro-batch: 8 prompts' samples, not a group),
the MSE loss and its scale A_max/β, the advantage's map into [0, 1], the v-space KL, its reward-adaptive weight
(floor 1e-4/kl_beta) and its reference (the LoRA disabled, at CFG kl_cfg when kl_cfg > 1), the old and sampling
snapshots' decay rule, its counter (optimizer steps) and when they follow (after each epoch's update), the training
draws (x_t = (1 − σ)·x0 + σ·ε, σ = t/1000, fresh ε per sample and time, the times of the ``discrete`` strategy:
strata of the grid's index span cast to integers), the rollout (the sampling snapshot, Euler ODE steps on
linspace(1, 1/T, T) shifted by the model's scheduler, no generator: x_T per sample, drawn in the transformer's dtype;
the transformer told t in the stored latents' dtype), the LoRA (gaussian init, SD3's default targets), the T5 length
(the diffusers default the call leaves), the advantage's std (population, floored at 1e-6), which samples train and
how the epoch's batches split into its optimizer steps, and the optimizer.

``launch.train_time_indices`` is derived: the checkout's own ``TimeSampler.discrete`` (src/flow_factory/utils/
noise_schedule.py, executed from the checkout; it imports only torch) run with the launch's values on the rollout's
10 scheduler timesteps (diffusers' FlowMatchEulerDiscreteScheduler at SD3.5-Medium's shift 3, given the pipeline's
sigmas), as grid indices. It is the same list at every call (the stratum widths are at most one index), and the
extraction fails if it is not.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re

from official import Checkout, ExtractionError, Launch, Value, code_fact, dataclass_defaults, yaml_values

REPOSITORY = "X-GenGroup/Flow-Factory"
ENV = "FLOW_FACTORY_PATH"
PRESETS = ("crd",)

LAUNCH = "examples/crd/lora/sd3_5/default.yaml"
HPARAMS = "src/flow_factory/hparams"
TRAINER = "src/flow_factory/trainers/crd.py"
TRAINER_BASE = "src/flow_factory/trainers/abc.py"
TRAINING_ARGS = f"{HPARAMS}/training_args.py"
ARGS = f"{HPARAMS}/args.py"
NOISE = "src/flow_factory/utils/noise_schedule.py"
SCHEDULER = "src/flow_factory/scheduler/flow_match_euler_discrete.py"
SD3 = "src/flow_factory/models/stable_diffusion/sd3_5.py"
ADAPTER = "src/flow_factory/models/abc.py"
ADVANTAGE = "src/flow_factory/advantage/advantage_processor.py"

# the launch -> (flowgrpo model config, flowgrpo rewards)
RUNS = {LAUNCH: ("sd3_5_medium", ["ocr"])}

# YAML section -> [(dataclass file, class)], base classes first: the fields the section leaves in place
SECTIONS = {
    "": [(ARGS, "Arguments")],
    "data": [(f"{HPARAMS}/data_args.py", "DataArguments")],
    "model": [(f"{HPARAMS}/model_args.py", "ModelArguments")],
    "scheduler": [(f"{HPARAMS}/scheduler_args.py", "SchedulerArguments")],
    "train": [(TRAINING_ARGS, "TrainingArguments"), (TRAINING_ARGS, "CRDTrainingArguments")],
    "eval": [(TRAINING_ARGS, "EvaluationArguments")],
    "log": [(f"{HPARAMS}/log_args.py", "LogArguments")],
}
REWARD_LISTS = {"rewards": (f"{HPARAMS}/reward_args.py", "RewardArguments"),
                "eval_rewards": (f"{HPARAMS}/reward_args.py", "RewardArguments")}

SD35_SHIFT = 3.0  # SD3.5-Medium's scheduler config (stabilityai/stable-diffusion-3.5-medium), which the pipeline loads

NOTES = {"crd": "The paper's SD3.5-Medium OCR run (its Table 3 OCR settings): examples/crd/lora/sd3_5/default.yaml "
                "over src/flow_factory/trainers/crd.py, 8 processes (num_processes). Keys without a `code.` or "
                "`launch.` prefix are the YAML's leaves (dotted; the reward lists item by item) and the defaults of "
                "the hparams dataclass fields it leaves in place; `code.*` keys are constants of the CRD trainer, "
                "its time sampler, the scheduler's ODE step and grid, the SD3.5 adapter, the LoRA, the advantage "
                "processor, the batch geometry and the optimizer; launch.train_time_indices is the checkout's "
                "TimeSampler.discrete run on the rollout's grid."}


# ----------------------------------------------------------------------------------------------- the launch
def _field_defaults(checkout: Checkout, relpath: str, class_name: str) -> dict[str, tuple[object, int]]:
    """{field: (default, line)} of a dataclass whose fields are ``name: T = field(default=..., metadata=...)`` (or a
    plain default): ``default_factory`` fields (nested argument groups) and ``init=False`` fields are not defaults of
    the run and are left out."""
    out = {}
    for name, arg in dataclass_defaults(checkout, relpath, class_name).items():
        default = arg.default
        if isinstance(default, str) and default.startswith("field("):
            call = ast.parse(default, mode="eval").body
            keywords = {k.arg: k.value for k in call.keywords}
            if "default_factory" in keywords or (
                    "init" in keywords and isinstance(keywords["init"], ast.Constant) and keywords["init"].value is False):
                continue
            if "default" not in keywords:
                raise ExtractionError(f"{relpath}:{arg.line}: {class_name}.{name} has no default")
            try:
                default = ast.literal_eval(keywords["default"])
            except ValueError:
                default = ast.unparse(keywords["default"])
        out[name] = (default, arg.line)
    return out


def _list_item_lines(checkout: Checkout, section: str) -> list[dict[str, int]]:
    """{field: line} of each mapping in the YAML's top-level list ``section`` (yaml_values keeps a list whole)."""
    import yaml

    root = yaml.compose(checkout.file(LAUNCH).read_text(), Loader=yaml.SafeLoader)
    for key, node in root.value:
        if key.value == section:
            return [{k.value: k.start_mark.line + 1 for k, _ in item.value} for item in node.value]
    raise ExtractionError(f"{LAUNCH} has no {section}")


def _launch_values(checkout: Checkout) -> dict[str, Value]:
    values = yaml_values(checkout, LAUNCH)
    # the reward lists, item by item, each RewardArguments field the item leaves in place at its default
    for section, (relpath, class_name) in REWARD_LISTS.items():
        entry = values.pop(section, None)
        if entry is None:
            continue
        fields = _field_defaults(checkout, relpath, class_name)
        lines = _list_item_lines(checkout, section)
        for i, item in enumerate(entry.value):
            for name, value in item.items():
                if name not in fields:
                    raise ExtractionError(f"{entry.source}: {section}[{i}].{name} is no field of {class_name}")
                values[f"{section}.{i}.{name}"] = Value(value, f"{LAUNCH}:{lines[i][name]}")
            for name, (default, line) in fields.items():
                if name not in item:
                    values[f"{section}.{i}.{name}"] = Value(default, f"{relpath}:{line} ({class_name} default)")
    # every other section's fields the YAML leaves in place
    for section, classes in SECTIONS.items():
        prefix = f"{section}." if section else ""
        fields: dict[str, tuple[object, str]] = {}
        for relpath, class_name in classes:
            for name, (default, line) in _field_defaults(checkout, relpath, class_name).items():
                if not section and name.endswith("_args"):
                    continue  # Arguments' nested groups (from_dict's nested_map: eval_rewards sets eval_reward_args)
                fields[name] = (default, f"{relpath}:{line} ({class_name} default)")
        set_here = {k[len(prefix):].split(".")[0] for k in values if k.startswith(prefix)} if prefix else \
            {k for k in values if "." not in k}
        unknown = sorted(k for k in set_here if k not in fields and (prefix or k not in REWARD_LISTS))
        if prefix and unknown:
            raise ExtractionError(f"{LAUNCH}: {section}.{unknown} are no fields of {[c for _, c in classes]} (they "
                                  "would reach the code as extra_kwargs: read where)")
        for name, (default, source) in fields.items():
            if name not in set_here:
                values[prefix + name] = Value(default, source)
    return values


# --------------------------------------------------------------------------------------------- code facts
def _flat(text: str) -> str:
    """Source text on one line, runs of whitespace as one space (a wrapped expression as it reads)."""
    return " ".join(text.split())


def _diffusers_sequence_length(keywords: str) -> int:
    """The T5 length of SD3's prompt embeddings: the call passes no max_sequence_length, so diffusers'
    StableDiffusion3Pipeline.encode_prompt takes its own default."""
    if "max_sequence_length" in re.findall(r"(\w+)=", keywords):
        raise ExtractionError(f"{SD3}: encode_prompt now passes max_sequence_length: read it from the call")
    from diffusers import StableDiffusion3Pipeline

    return inspect.signature(StableDiffusion3Pipeline.encode_prompt).parameters["max_sequence_length"].default


def _annotated(value: Value, note: str) -> Value:
    return Value(value.value, f"{value.source} ({note})")


def code_facts(checkout: Checkout) -> dict[str, Value]:
    """The constants the trainer, the time sampler, the scheduler, the adapter, the advantage and the batch geometry
    fix, each at its line."""

    def fact(relpath, pattern, convert=str, function=None):
        return code_fact(checkout, relpath, pattern, convert, function)

    return {
        # ---- the implicit reward: each error over its own detached mean |v − u| (floored at 1e-5), old less current
        "code.implicit_reward": fact(TRAINER, r"r_theta = -\(\s*(\(forward_pred - v_target\) \*\* 2 / weight_theta\s*"
                                              r"- \(old_v_pred - v_target\) \*\* 2 / weight_old)\s*\)", _flat, "optimize"),
        "code.adaptive_weight": fact(TRAINER, r"weight_theta = \(\s*(torch\.abs\(forward_pred\.double\(\) - "
                                              r"v_target\.double\(\)\)\s*\.mean\(dim=tuple\(range\(1, forward_pred\.ndim\)\), "
                                              r"keepdim=True\)\s*\.clip\(min=1e-5\))\s*\)", _flat, "optimize"),
        "code.adaptive_weight_floor": fact(TRAINER, r"weight_old = \(\s*torch\.abs\(old_v_pred\.double\(\) - v_target\.double\(\)\)\s*"
                                                    r"\.mean\(dim=tuple\(range\(1, old_v_pred\.ndim\)\), keepdim=True\)\s*"
                                                    r"\.clip\(min=([\d.e-]+)\)", float, "optimize"),
        "code.implicit_reward_reduce": fact(TRAINER, r"r_theta_local = r_theta\.(mean)\(dim=tuple\(range\(1, r_theta\.ndim\)\)\)",
                                            function="optimize"),
        # ---- centring: over the micro-batch gathered from every process (per_device_batch_size x num_processes)
        "code.centring_scope": fact(TRAINER, r"r_theta_gathered = self\.accelerator\.(gather)\(r_theta_local\.detach\(\)\)",
                                    lambda _: "the gathered micro-batch", "optimize"),
        "code.centring_detach": fact(TRAINER, r"Rc = adv_cur_rank - adv_cur_avg\s*\n\s*R_theta_c = r_theta_local - "
                                              r"(r_theta_avg\.detach\(\))\s*\n\s*if self\.crd_loss_type",
                                     function="_compute_crd_loss"),
        # the uniform branch (weight_temp < 0): the squared error of β·(r − mean r) against a − mean a, mean over the
        # process's micro-batch
        "code.policy_loss": fact(TRAINER, r"diff = (self\.crd_beta \* R_theta_c - Rc)\s*\n\s*ori_policy_loss = "
                                          r"\(diff \*\* 2\)\.mean\(\)", function="_compute_crd_loss"),
        "code.loss_scale": fact(TRAINER, r"policy_loss = \(ori_policy_loss \* (adv_clip_range\[1\] / "
                                         r"max\(self\.crd_beta, 1e-8\))\)\.mean\(\)", _flat, "optimize"),
        # the advantage clipped to the clip range, then into [0, 1]
        "code.advantage_to_unit": fact(TRAINER, r"normalized_adv = (\(adv_clipped / max\(adv_clip_range\)\) / 2\.0 \+ 0\.5)"
                                                r"\s*\n\s*adv_cur_rank = torch\.clamp\(normalized_adv, 0, 1\)",
                                       function="optimize"),
        # ---- the KL: v-space, to the reference (the LoRA disabled) at CFG kl_cfg when kl_cfg > 1, weighed per sample
        "code.kl_form": fact(TRAINER, r"kl_div = (\(\(forward_pred - ref_pred\) \*\* 2\)\.mean)\(", function="optimize"),
        "code.kl_reference": fact(TRAINER, r"with torch\.no_grad\(\), self\.adapter\.(use_ref_parameters)\(\):\s*\n\s*"
                                           r"cfg = self\.kl_cfg", function="optimize"),
        "code.kl_cfg_rule": fact(TRAINER, r"cfg = (self\.kl_cfg if self\.kl_cfg > 1\.0 else None)", function="optimize"),
        "code.kl_floor": fact(TRAINER, r"base_beta = ([\d.e-]+)", float, "optimize"),
        "code.kl_adaptive_weight": fact(TRAINER, r"min_coef = (base_beta / max\(self\.kl_beta, 1e-8\))\s*\n\s*"
                                                 r"kl_loss = self\.kl_beta \* torch\.mean\(\(min_coef \+ raw_reward \* "
                                                 r"\(1 - min_coef\)\) \* kl_div\)", function="optimize"),
        # ---- the old and sampling snapshots: λ = start before start_step, then min(start + slope·(n − start_step),
        # end) with n = the optimizer steps so far, blended after each epoch's update (the EMA step first)
        "code.decay_rule": fact(TRAINER, r"if step < start_step:\s*\n\s*return start_value\s*\n\s*return "
                                         r"(min\(start_value \+ \(step - start_step\) \* slope, end_value\))",
                                function="compute_decay"),
        "code.decay_counter_old": fact(TRAINER, r"decay = compute_decay\((self\.step), self\.old_model_decay\)"),
        "code.decay_counter_sampling": fact(TRAINER, r"decay = compute_decay\((self\.step), self\.sampling_model_decay\)"),
        "code.optimizer_step_counter": fact(TRAINER, r"if self\.accelerator\.sync_gradients:[\s\S]*?self\.optimizer\.step\(\)"
                                                     r"[\s\S]*?(self\.step \+= 1)", function="optimize"),
        "code.snapshot_updates": fact(TRAINER, r"self\.optimize\(samples\)\s*\n(?:\s*#[^\n]*\n)*\s*"
                                               r"(self\.adapter\.ema_step\(step=self\.epoch\)\s*\n\s*"
                                               r"self\._update_old_model\(\)\s*\n\s*self\._update_sampling_model\(\))",
                                      _flat, "start"),
        "code.snapshot_blend": fact(TRAINER, r"ema_param\.data\.(mul_\(decay\)\.add_\(\s*param\.detach\(\)\.to\(ema_param\.device\), "
                                             r"alpha=\(1\.0 - decay\)\s*\))", _flat, "_blend_named_params"),
        "code.rollout_weights": fact(TRAINER, r"with self\.(sampling_context)\(\):\s*\n\s*samples = self\.sample\(\)",
                                     function="start"),
        # ---- the training draws: the times of the strategy, once per micro-batch; fresh ε per sample and time
        "code.discrete_flags": fact(TRAINER, r"'discrete':\s*(\(True, False\)),", lambda t: list(ast.literal_eval(t)),
                                    "_sample_timesteps"),
        "code.time_strata": fact(NOISE, r"boundaries = torch\.(linspace)\(start_idx, end_idx, num_samples \+ 1, "
                                        r"device=device\)\s*\n\s*lower, upper = boundaries\[:-1\]\.long\(\), "
                                        r"boundaries\[1:\]\.long\(\)",
                                 lambda _: "linspace(start_idx, end_idx, K + 1).long()", "_stratified_sample"),
        "code.time_draw": fact(TRAINER, r"all_timesteps = self\.(_sample_timesteps)\(batch_size\)",
                               lambda _: "once per micro-batch, every sample of it at the same times", "optimize"),
        "code.train_noise": fact(TRAINER, r"noise = (randn_tensor)\(\s*clean_latents\.shape,", function="optimize"),
        "code.interpolation": fact(TRAINER, r"noised_latents = (\(1 - sigma_broadcast\) \* clean_latents \+ sigma_broadcast "
                                            r"\* noise)\s*\n\s*old_v_pred = old_v_pred_list\[t_idx\]", function="optimize"),
        "code.velocity_target": fact(TRAINER, r"v_target = (noise - clean_latents)", function="optimize"),
        "code.sigma_of_t": fact(NOISE, r"return \((t_scheduler / TIMESTEP_MAX)\)\.clamp\(0\.0, 1\.0\)",
                                function="flow_match_sigma"),
        # ---- the rollout: the sampling snapshot's Euler ODE on linspace(1, 1/T, T), the pipeline's scheduler shift
        "code.sigma_grid": fact(SCHEDULER, r"sigmas = (np\.linspace\(1\.0, 1 / num_inference_steps, num_inference_steps\)) "
                                           r"if sigmas is None else sigmas", function="set_scheduler_timesteps"),
        "code.ode_step": fact(SCHEDULER, r"if dynamics_type == 'ODE':\s*\n\s*# ODE Sampling\s*\n\s*"
                                         r"next_latents_mean = (latents \+ noise_pred \* dt)", function="step"),
        "code.pipeline_class": fact(SD3, r"return (StableDiffusion3Pipeline)\.from_pretrained\(", function="load_pipeline"),
        # the rollout call's keyword arguments besides the training arguments and the batch: no generator, no latents
        "code.rollout_call_arguments": fact(TRAINER, r"sample_kwargs = \{\s*\*\*self\.training_args,((?:\s*'\w+': [^\n]*\n)+)"
                                                     r"\s*\*\*batch,\s*\}",
                                            lambda t: sorted(re.findall(r"'(\w+)':", t)), "sample"),
        "code.initial_noise_dtype": fact(SD3, r"dtype = (self\.pipeline\.transformer\.dtype)", function="inference"),
        "code.model_timestep_dtype": fact(SD3, r"timestep = t\.expand\(batch_size\)\.to\((latents\.dtype)\)",
                                          function="forward"),
        # ---- the model: the LoRA and the prompt embeddings
        "code.lora_default_targets": fact(SD3, r"return (\[\s*# Attention modules\s*\n\s*[^\]]*\])",
                                          lambda t: ast.literal_eval(re.sub(r"#[^\n]*", "", t)), "default_target_modules"),
        "code.lora_init": fact(ADAPTER, r"lora_config = LoraConfig\(\s*r=self\.model_args\.lora_rank,\s*"
                                        r"lora_alpha=self\.model_args\.lora_alpha,\s*init_lora_weights=\"(\w+)\",\s*"
                                        r"target_modules=modules,\s*\)\s*\n\s*model_component = get_peft_model",
                               function="apply_lora"),
        "code.max_sequence_length": _annotated(
            fact(SD3, r"\) = self\.pipeline\.encode_prompt\(((?:\s*\w+=\w+,?\n)+)\s*\)", _diffusers_sequence_length,
                 "encode_prompt"),
            "no max_sequence_length passed: diffusers StableDiffusion3Pipeline.encode_prompt's default"),
        # ---- advantages: group mean over one batch-wide population std floored at 1e-6
        "code.adv_std_population": fact(ADVANTAGE, r"std = max\((\(ss / n - mean \*\* 2\) \*\* 0\.5), [\d.e-]+\)",
                                        function="_global_mean_std"),
        "code.adv_std_floor": fact(ADVANTAGE, r"std = max\(\(ss / n - mean \*\* 2\) \*\* 0\.5, ([\d.e-]+)\)", float,
                                   "_global_mean_std"),
        # ---- the update: the epoch's samples in their order (each process's groups contiguous), cut into
        # per_device_batch_size micro-batches, every sample trained; GAS = batches / gradient_step_per_epoch x times
        "code.optimize_batches": fact(TRAINER, r"BaseSample\.stack\((samples\[i:i \+ self\.training_args\.per_device_batch_size\])\)"
                                               r"\s*\n\s*for i in range\(0, len\(samples\), self\.training_args\.per_device_batch_size\)",
                                      function="optimize"),
        "code.grad_accumulation_times": fact(ARGS, r"self\.training_args\.gradient_accumulation_steps \*= (num_train_timesteps)",
                                             function="_adjust_gradient_accumulation"),
        "code.optimizer": fact(TRAINER_BASE, r"self\.optimizer = torch\.optim\.(\w+)\(", function="_init_optimizer"),
    }


def _train_time_indices(checkout: Checkout, values: dict[str, Value], facts: dict[str, Value]) -> Value:
    """The grid indices of the launch's training times: the checkout's TimeSampler.discrete (executed from the
    checkout) on the rollout's scheduler timesteps, with the launch's K, timestep_range and the discrete flags."""
    import numpy as np
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler

    if values["train.time_sampling_strategy"].value != "discrete":
        raise ExtractionError(f"{LAUNCH}: time_sampling_strategy is not 'discrete' now: read its sampler")
    steps = values["train.num_inference_steps"].value
    # the pipeline's sigmas (code.sigma_grid's expression, evaluated), shifted by the scheduler as set_timesteps does
    grid_text = re.search(r"np\.linspace\([^)]*\)", code_fact(checkout, SCHEDULER, r"sigmas = (np\.linspace\([^)]*\))",
                                                              str, "set_scheduler_timesteps").value).group(0)
    sigmas = eval(grid_text, {"np": np, "num_inference_steps": steps})  # noqa: S307 (the checkout's one expression)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=SD35_SHIFT)
    scheduler.set_timesteps(sigmas=list(sigmas))
    timesteps = scheduler.timesteps.float()

    path = checkout.file(NOISE)
    spec = importlib.util.spec_from_file_location("_official_flow_factory_noise_schedule", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    include_init, force_init = facts["code.discrete_flags"].value
    drawn = set()
    for seed in range(8):
        torch.manual_seed(seed)
        t = module.TimeSampler.discrete(batch_size=1, num_train_timesteps=values["train.num_train_timesteps"].value,
                                        scheduler_timesteps=timesteps,
                                        timestep_range=values["train.timestep_range"].value,
                                        include_init=include_init, force_init=force_init)[:, 0]
        drawn.add(tuple(int((timesteps - x).abs().argmin()) for x in t.tolist()))
    if len(drawn) != 1:
        raise ExtractionError(f"{NOISE}: TimeSampler.discrete draws different indices from call to call now "
                              f"({len(drawn)} lists in 8 calls): record their distribution instead")
    line = code_fact(checkout, NOISE, r"def (discrete)\(", str).source
    return Value(list(drawn.pop()), f"{line} (run on the {steps} scheduler timesteps of {SCHEDULER} "
                                    f"set_scheduler_timesteps, SD3.5-Medium's shift {SD35_SHIFT:g})")


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    out = []
    for launch, (model, rewards) in RUNS.items():
        values = _launch_values(checkout)
        facts = code_facts(checkout)
        values.update(facts)
        values["launch.train_time_indices"] = _train_time_indices(checkout, values, facts)
        out.append(Launch(launch.removeprefix("examples/"), model, rewards, values, f"{LAUNCH}:1"))
    return out
