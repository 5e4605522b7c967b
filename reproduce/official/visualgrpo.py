"""E-GRPO's launch (shengjun-zhang/VisualGRPO, the code of arXiv 2601.00423): the FLUX.1-dev HPS run,
scripts/finetune/train_grpo_merge.sh, a ``torchrun`` of fastvideo/train.py with hydra overrides over the hydra config
fastvideo/config/config.yaml, and the constants of the classes it builds: fastvideo/workers/sampler/flux_sampler.py
(the rollout), fastvideo/workers/rollout_buffer.py (the advantage) and fastvideo/trainer/grpo_trainer.py (the update).
Its code is a refactor of G²RPO's FLUX code (bcmi/Granular-GRPO, a fork of DanceGRPO's).

The run's configuration is hydra's composition, read the way hydra composes it: the defaults list of config.yaml
(``model: flux``, ``reward: hps``, ``algorithm: grpo_merge``, then ``_self_``) puts each group file's leaves under its
group's name (``algorithm.eta``), config.yaml's own leaves follow (``sampling.eta``, ``grpo.eta_step_list``), and the
launch's ``key=value`` overrides replace leaves (a group's choice, ``algorithm=grpo_merge``, picks its file). Every
leaf is read with its line, the YAML as OmegaConf reads it (``1e-5`` a float); an override of a key the composition
does not have fails the extraction, as hydra refuses it. config.yaml's ``hydra`` section (hydra's own output folders)
is not part of the composed config and is not read; the group choices are the ``defaults.*`` keys. train.py's
``build_trainer_config`` passes the trainer every value it reads (``sampling.*``, ``grpo.*``, ``training.*``), so the
trainer's and sampler's ``config.get`` defaults never apply.

``code.*`` keys are the constants the code fixes, each found by a regular expression that must match exactly once:
the σ grid (``torch.linspace(1, 0, T + 1)`` in float32, then the time shift), the Flow-GRPO SDE step (its std
η·sqrt(σ/(1 − σ)) with σ_1 at σ = 1, its mean, the noise s·sqrt(−Δ) and the merged step's target σ_{i+m}), the
Gaussian log-prob and its mean over the latent, the ODE anchor and the ODE lanes (the same step at η = 0), where a
child starts (the anchor's latent at the branch step), each lane's σ list (the prefix σ[:e+m+1], then every g-th
point) and where its loop starts and stops, the reward's sample (the lane's last x0-prediction), the integer
timesteps of every forward, the bfloat16 autocast, the stored latents' dtype, x_T's dtype, the advantage (each
granularity's rewards z-scored among a branch step's siblings with torch.std + 1e-8, the granularities summed, then
clipped), the PPO loss, one optimizer step per branch step, the gradient clip, the optimizer and the float32
weights, and the T5 length of the prompt embeddings (the preprocessing script leaves diffusers' default).

``launch.processes`` is the ``torchrun --nproc_per_node`` of the launch.
"""

from __future__ import annotations

import ast

from official import (Checkout, ExtractionError, Launch, Value, code_fact, hydra_overrides, omegaconf_scalar,
                      yaml_values)
from official.dancegrpo import _library_default_text_length, torchrun_processes

REPOSITORY = "shengjun-zhang/VisualGRPO"
ENV = "VISUALGRPO_PATH"
PRESETS = ("egrpo",)

LAUNCHER = "scripts/finetune/train_grpo_merge.sh"
ENTRY = "fastvideo/train.py"
CONFIG_DIR = "fastvideo/config"
CONFIG = f"{CONFIG_DIR}/config.yaml"
SAMPLER = "fastvideo/workers/sampler/flux_sampler.py"
BUFFER = "fastvideo/workers/rollout_buffer.py"
TRAINER = "fastvideo/trainer/grpo_trainer.py"
# the prompt embeddings' script (scripts/preprocess/preprocess_prompts.sh runs it; README's data preparation)
EMBED = "fastvideo/data_preprocess/preprocess_flux_embedding.py"

# the launch -> (flowgrpo model config, flowgrpo rewards): FLUX.1-dev (the run passes the embedded guidance 3.5, which
# only a guidance-distilled FLUX takes) on HPS (reward=hps; its hps.yaml names HPS_v2_compressed.pt, HPS v2.0)
RUNS = {LAUNCHER: ("flux_dev", ["hpsv2"])}

NOTES = {"egrpo": "E-GRPO's FLUX.1-dev HPS run: scripts/finetune/train_grpo_merge.sh (torchrun of fastvideo/train.py "
                  "on 8 processes, hydra overrides algorithm=grpo_merge, training.max_train_steps=300, "
                  "grpo.eta_step_list=[1,2,3], grpo.eta_step_merge_list=[1,1,1], grpo.granular_list=[1,2]) over the "
                  "hydra config fastvideo/config/config.yaml and its groups model/flux, reward/hps and "
                  "algorithm/grpo_merge. Keys without a `code.` or `launch.` prefix are the composed config's leaves "
                  "(dotted; `defaults.*` the group choices); `code.*` keys are constants of the FLUX sampler, the "
                  "rollout buffer's advantage, the GRPO trainer, train.py's model and optimizer, and the prompt "
                  "embeddings. As released, the sampler's loop over each prompt's 12 samples runs the anchor, the "
                  "SDE children and their lanes only at the group's first sample (the branch-step loop is nested in "
                  "`if index % self.num_generations == 0`, flux_sampler.py:507), so the second sample's empty lists "
                  "make torch.stack raise (flux_sampler.py:583) and the launch stops in its first rollout; flowgrpo "
                  "runs the evident intent (G²RPO's loop: 12 children per branch step) and the keys are mapped to it "
                  "(reproduce/official/map/visualgrpo.yaml)."}


# ----------------------------------------------------------------------------------------------- the launch
def _defaults_list(checkout: Checkout) -> list[tuple[str, str, int]]:
    """[(group, option, line)] of config.yaml's defaults list, ``_self_`` last (the primary config's own leaves are
    merged after the groups')."""
    import yaml

    root = yaml.compose(checkout.file(CONFIG).read_text(), Loader=yaml.SafeLoader)
    nodes = [child for key, child in root.value if key.value == "defaults"]
    if len(nodes) != 1 or not isinstance(nodes[0], yaml.SequenceNode):
        raise ExtractionError(f"{CONFIG}: no defaults list")
    out, self_seen = [], False
    for item in nodes[0].value:
        if isinstance(item, yaml.ScalarNode) and item.value == "_self_":
            self_seen = True
            continue
        if self_seen:
            raise ExtractionError(f"{CONFIG}:{item.start_mark.line + 1}: a default after _self_ now: read its order")
        if not (isinstance(item, yaml.MappingNode) and len(item.value) == 1):
            raise ExtractionError(f"{CONFIG}:{item.start_mark.line + 1}: not a `group: option` default")
        key, value = item.value[0]
        if "@" in key.value or "/" in key.value or key.value.startswith(("override ", "optional ")):
            raise ExtractionError(f"{CONFIG}:{key.start_mark.line + 1}: {key.value!r}: a package or keyword default "
                                  "is not read")
        out.append((key.value, value.value, key.start_mark.line + 1))
    if not self_seen:
        raise ExtractionError(f"{CONFIG}: no _self_ in the defaults list (hydra would merge it first): read the order")
    return out


def _launch_values(checkout: Checkout) -> tuple[dict[str, Value], object]:
    """The composed config of the launch (every leaf, with its line) and the launch's command."""
    command = hydra_overrides(checkout, LAUNCHER, ENTRY)
    overrides = dict(command.overrides)
    values: dict[str, Value] = {}
    for group, option, line in _defaults_list(checkout):
        source = f"{CONFIG}:{line}"
        if group in overrides:
            option, at = overrides.pop(group)
            source = f"{LAUNCHER}:{at}"
        values[f"defaults.{group}"] = Value(option, source)
        relpath = f"{CONFIG_DIR}/{group}/{option}.yaml"
        if checkout.file(relpath).read_text().lstrip().startswith("# @package"):
            raise ExtractionError(f"{relpath}: a `# @package` header now: read where its leaves go")
        for key, value in yaml_values(checkout, relpath, omegaconf=True).items():
            values[f"{group}.{key}"] = value
    own = yaml_values(checkout, CONFIG, omegaconf=True, skip=("defaults", "hydra"))
    clash = sorted(set(own) & set(values))
    if clash:
        raise ExtractionError(f"{CONFIG} sets {clash}, which a group sets too: read the merge order")
    values.update(own)
    for key, (text, line) in overrides.items():
        if key not in values:
            raise ExtractionError(f"{LAUNCHER}:{line}: overrides {key}, which the composed config does not have "
                                  "(hydra refuses it without +)")
        values[key] = Value(omegaconf_scalar(text), f"{LAUNCHER}:{line}")
    return values, command


# --------------------------------------------------------------------------------------------- code facts
def _flat(text: str) -> str:
    """Source text on one line, runs of whitespace as one space."""
    return " ".join(text.split())


def code_facts(checkout: Checkout) -> dict[str, Value]:
    """The constants the sampler, the rollout buffer, the trainer and train.py fix, each at its line."""

    def fact(relpath, pattern, convert=str, function=None):
        return code_fact(checkout, relpath, pattern, convert, function)

    step = "_flow_grpo_step"
    return {
        # ---- the σ grid: torch.linspace(1, 0, T + 1) (float32: no dtype given), then the time shift with `shift`
        "code.sigma_grid": fact(SAMPLER, r"sigma_schedule = torch\.(linspace)\(1, 0, self\.sampling_steps \+ 1\)\s*\n"
                                         r"\s*sigma_schedule = sd3_time_shift\(self\.shift, sigma_schedule\)",
                                lambda _: "linear", "_create_sigma_schedule"),
        "code.time_shift": fact(SAMPLER, r"return (\(shift \* t\) / \(1 \+ \(shift - 1\) \* t\))",
                                function="sd3_time_shift"),
        # ---- the Flow-GRPO SDE step: s = η·sqrt(σ/(1 − σ)) with σ_1 in the denominator at σ = 1, the score-corrected
        # mean, the noise s·sqrt(−Δ); a merged step goes from σ_i to σ_{i+m} in one draw
        "code.sde_std": fact(SAMPLER, r"std_dev_t = (torch\.sqrt\(sigma / \(1 - torch\.where\(sigma == 1, sigma_max, "
                                      r"sigma\)\)\) \* eta)", function=step),
        "code.sigma_max": fact(SAMPLER, r"sigma_max = (sigmas\[1\])\.item\(\)", function=step),
        "code.sde_mean": fact(SAMPLER, r"prev_sample_mean = \(\s*(latents \* \(1 \+ std_dev_t\*\*2 / \(2 \* sigma\) \* dt\) "
                                       r"\+\s*model_output \* \(1 \+ std_dev_t\*\*2 \* \(1 - sigma\) / \(2 \* sigma\)\) "
                                       r"\* dt)\s*\)", _flat, step),
        "code.sde_noise_std": fact(SAMPLER, r"prev_sample = prev_sample_mean \+ (std_dev_t \* torch\.sqrt\(-1 \* dt\)) "
                                            r"\* variance_noise", function=step),
        "code.merged_step": fact(SAMPLER, r"sigma_prev = (sigmas\[index \+ merge_step\])\.to\(device\)", function=step),
        "code.log_prob": fact(SAMPLER, r"log_prob = \(\s*(-\(\(prev_sample\.detach\(\) - prev_sample_mean\) \*\* 2\) / "
                                       r"\(2 \* \(\(std_dev_t \* torch\.sqrt\(-1 \* dt\)\)\*\*2\)\)\s*"
                                       r"- torch\.log\(std_dev_t \* torch\.sqrt\(-1 \* dt\)\)\s*"
                                       r"- torch\.log\(torch\.sqrt\(2 \* torch\.as_tensor\(math\.pi\)\)\))\s*\)",
                              lambda _: "gaussian", step),
        "code.log_prob_reduce": fact(SAMPLER, r"log_prob = log_prob\.(mean)\(dim=tuple\(range\(1, log_prob\.ndim\)\)\)",
                                     function=step),
        # ---- the rollout: an ODE anchor (the SDE step at η = 0: x + v·Δ), each child's one SDE step (η = sampling.eta)
        # from the anchor's latent at the branch step, then its ODE lanes (η = 0), one per granularity g
        "code.anchor_eta": fact(SAMPLER, r"z, pred_original, _ = self\._flow_grpo_step\(\s*pred, z\.to\(torch\.float32\), "
                                         r"(\d+),", int, "_run_anchor_sample"),
        "code.child_eta": fact(SAMPLER, r"z, pred_original, log_prob = self\._flow_grpo_step\(\s*pred, "
                                        r"z\.to\(torch\.float32\), (self\.eta),", function="_run_sde_sample_step"),
        # one anchor per prompt: the first of its num_generations samples (the branch-step loop is nested in this
        # condition as released: the NOTES)
        "code.anchor_per_prompt": fact(SAMPLER, r"if (index % self\.num_generations == 0):", lambda _: "one per prompt",
                                       "sample"),
        "code.branch_input": fact(SAMPLER, r"input_sde_sample = (anchor_latents\[:, eta_step\])", function="sample"),
        "code.lane_eta": fact(SAMPLER, r"z, pred_original, _ = self\._flow_grpo_step\(\s*pred, z\.to\(torch\.float32\), "
                                       r"(\d+),", int, "_run_ode_sample"),
        "code.lane_prefix": fact(SAMPLER, r"prefix = (sigma_schedule\[:eta_step \+ merge_step \+ 1\])", function="sample"),
        "code.lane_suffix": fact(SAMPLER, r"suffix = (sigma_schedule\[eta_step \+ merge_step \+ 1::g\])",
                                 function="sample"),
        # the lane's loop: from index start_step + 1 (start_step = the branch step e: σ_{e+1}, which is where the child
        # is when m = 1) to the σ list's second-to-last point, its last step's x0-prediction returned
        "code.lane_start": fact(SAMPLER, r"progress_bar = tqdm\(range\((start_step \+ 1), sample_steps - 1\)",
                                function="_run_ode_sample"),
        "code.lane_start_argument": fact(SAMPLER, r"latents_j = self\._run_ode_sample\(\s*input_ode_latents, (eta_step),",
                                         function="sample"),
        "code.lane_stop": fact(SAMPLER, r"progress_bar = tqdm\(range\(start_step \+ 1, (sample_steps - 1)\)",
                               function="_run_ode_sample"),
        "code.rewarded_sample": fact(SAMPLER, r"^\s*return (pred_original)$", function="_run_ode_sample"),
        # the anchor's own sample is scored for the log only (eval_rewards: printed, hps_reward.txt, wandb)
        "code.anchor_reward": fact(SAMPLER, r"(eval_rewards)\.append\(torch\.tensor\(eval_reward, device=self\.device\)\)",
                                   lambda _: "logged only (eval_rewards)", "sample"),
        # ---- the transformer's inputs: the timestep int(1000 σ) of the float32 grid (then / 1000) in every forward
        "code.timestep_anchor": fact(SAMPLER, r"timestep_value = (int\(sigma \* 1000\))", function="_run_anchor_sample"),
        "code.timestep_child": fact(SAMPLER, r"timestep_value = (int\(sigma \* 1000\))", function="_run_sde_sample_step"),
        "code.timestep_lane": fact(SAMPLER, r"timestep_value = (int\(sigma \* 1000\))", function="_run_ode_sample"),
        "code.timestep_training": fact(SAMPLER, r"timestep_values = \[(int\(sigma \* 1000\)) for sigma in "
                                                r"train_sigma_schedule\]", function="sample"),
        # ---- precision: bfloat16 autocast around every forward; the stored branch latents in bfloat16; x_T drawn in
        # bfloat16 (one draw per process's batch: one prompt)
        "code.autocast": fact(SAMPLER, r'with torch\.autocast\("cuda", torch\.(bfloat16)\):',
                              function="_get_transformer_output"),
        "code.autocast_anchor": fact(SAMPLER, r'with torch\.autocast\("cuda", torch\.(bfloat16)\):',
                                     function="_run_anchor_sample"),
        "code.latent_storage": fact(SAMPLER, r"all_latents\.append\(z\.to\(torch\.(bfloat16)\)\)",
                                    function="_run_sde_sample_step"),
        "code.initial_noise_dtype": fact(SAMPLER, r"if self\.init_same_noise:\s*\n\s*input_latents = torch\.randn\(\s*\n"
                                                  r"[^\n]*\n\s*device=self\.device,\s*\n\s*dtype=torch\.(bfloat16),",
                                         function="sample"),
        "code.vae_scaling_factor": fact(SAMPLER, r"latents = \(latents / ([\d.]+)\) \+ [\d.]+", float, "decode_latents"),
        "code.vae_shift_factor": fact(SAMPLER, r"latents = \(latents / [\d.]+\) \+ ([\d.]+)", float, "decode_latents"),
        # ---- the advantage: per granularity, each branch step's siblings (one prompt's num_generations samples, a
        # column of the [B, steps] rewards) z-scored with torch.std (n − 1) + 1e-8, the granularities' z-scores summed
        "code.advantage_normalize": fact(TRAINER, r"rollout_buffer\.compute_advantages\(\s*num_generations=self\."
                                                  r"num_generations,\s*normalize=(True),", lambda v: v == "True",
                                         "_sample_and_compute_rewards"),
        "code.advantage_group": fact(BUFFER, r"group_rewards = (reward\[start_idx:end_idx\])\s*\n"
                                             r"\s*group_mean = group_rewards\.mean\(dim=0\)",
                                     lambda _: "a branch step's siblings", "compute_advantages"),
        "code.advantage_std": fact(BUFFER, r"group_std = group_rewards\.(std)\(dim=0\) \+ 1e-8",
                                   lambda _: "torch.std (unbiased, n - 1)", "compute_advantages"),
        "code.advantage_eps": fact(BUFFER, r"group_std = group_rewards\.std\(dim=0\) \+ (1e-8)", float,
                                   "compute_advantages"),
        "code.advantage_granularities": fact(BUFFER, r"^\s*(advantages \+= group_advantages)$",
                                             lambda _: "summed", "compute_advantages"),
        "code.advantage_clip": fact(TRAINER, r"advantages = torch\.clamp\(\s*batch\[\"advantages\"\], "
                                             r"(-self\.adv_clip_max, self\.adv_clip_max)\s*\)", function="_compute_grpo_loss"),
        # ---- the update: the PPO clipped loss, its plain mean over the process's siblings, no KL; for each branch step
        # in order a backward, the gradient clip and an optimizer step (len(eta_step_list) steps an iteration)
        "code.ppo_loss": fact(TRAINER, r"loss = torch\.mean\(torch\.(maximum)\(unclipped_loss, clipped_loss\)\)",
                              lambda _: "plain", "_compute_grpo_loss"),
        "code.loss_reduce": fact(TRAINER, r"loss = torch\.(mean)\(torch\.maximum\(unclipped_loss, clipped_loss\)\)",
                                 function="_compute_grpo_loss"),
        "code.loss_terms": fact(TRAINER, r"^\s*loss = (torch\.mean\(torch\.maximum\(unclipped_loss, clipped_loss\)\))$",
                                lambda _: "the clipped policy term alone (no KL)", "_compute_grpo_loss"),
        "code.shared_prediction": fact(TRAINER, r"pred_batch = (pred\.repeat\(self\.num_generations, 1, 1\))",
                                       function="train_step"),
        "code.buffer_steps": fact(SAMPLER, r"num_steps=(len\(self\.eta_step_list\)),", function="sample"),
        "code.optimizer_steps": fact(TRAINER, r"for t_idx in range\(train_timesteps\):[\s\S]*?(self\.optimizer\.step\(\))",
                                     lambda _: "one per branch step", "train_step"),
        "code.update_order": fact(TRAINER, r"loss, ratio, advantages = self\._compute_grpo_loss\(\s*"
                                           r"(pred_batch, rollout_buffer, t_idx)\s*\)",
                                  lambda _: "branch step k of every prompt in update k", "train_step"),
        "code.grad_clip": fact(TRAINER, r"grad_norm = self\.transformer\.(clip_grad_norm_)\(self\.max_grad_norm\)",
                               function="train_step"),
        # ---- train.py: every transformer weight, float32 (FSDP master weights), AdamW
        "code.trained_parameters": fact(ENTRY, r"params_to_optimize = list\(filter\(\s*\n\s*lambda p: p\.requires_grad,"
                                               r"\s*\n\s*(transformer\.parameters\(\))", lambda _: "full",
                                        "build_optimizer_and_scheduler"),
        "code.weights_dtype": fact(ENTRY, r'subfolder="transformer",\s*\n\s*torch_dtype=torch\.(float32),',
                                   function="build_model"),
        "code.optimizer": fact(ENTRY, r"optimizer = torch\.optim\.(AdamW)\(", lambda v: v.lower(),
                               "build_optimizer_and_scheduler"),
        "code.adam_betas": fact(ENTRY, r"betas=(\(0\.9, 0\.999\)),", lambda v: list(ast.literal_eval(v)),
                                "build_optimizer_and_scheduler"),
        "code.adam_eps": fact(ENTRY, r"eps=(1e-8),", float, "build_optimizer_and_scheduler"),
        "code.allow_tf32": fact(ENTRY, r"torch\.backends\.cuda\.matmul\.allow_tf32 = (True)", lambda v: v == "True", "main"),
        "code.seed": fact(ENTRY, r"set_seed\((cfg\.seed \+ rank)\)", function="main"),
        # ---- the text embeddings it trains on: FluxPipeline.encode_prompt with its default T5 length
        "code.max_sequence_length": fact(EMBED, r'pipe\.(encode_prompt)\(\s*\n\s*prompt=data\["caption"\], '
                                                r'prompt_2=data\["caption"\]\s*\n\s*\)', _library_default_text_length),
    }


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    out = []
    for launcher, (model, rewards) in RUNS.items():
        values, command = _launch_values(checkout)
        values["launch.processes"] = torchrun_processes(checkout, launcher, command)
        values.update(code_facts(checkout))
        out.append(Launch(launcher.rsplit("/", 1)[-1], model, rewards, values, f"{launcher}:{command.line}"))
    return out
