"""MixGRPO's launches (Tencent-Hunyuan/MixGRPO): the three FLUX.1-dev launch scripts of scripts/finetune/, each read
over fastvideo/train_grpo_flux.py's argparse defaults, and the constants the training script, its sampler
(fastvideo/utils/sampling_utils.py), its window schedule (fastvideo/utils/grpo_states.py) and its prompt
preprocessing hard-code.

The launches are the papers' multi-reward runs (``--reward_model multi_reward``: HPS-v2.1, ImageReward and PickScore;
the UnifiedReward model only joins with a URL, and the scripts pass "None") on 4 nodes of 8 GPUs, one prompt and its
12 samples per GPU. ``launch.processes`` is torchrun's process count, read from the same command.
"""

from __future__ import annotations

import inspect

from official import Checkout, ExtractionError, Launch, epoch_sampler_facts, Value, argparse_launch, code_fact

REPOSITORY = "Tencent-Hunyuan/MixGRPO"
ENV = "MIXGRPO_PATH"
PRESETS = ("mixgrpo", "mixgrpo_flash", "mixgrpo_flash_star")

SCRIPT = "fastvideo/train_grpo_flux.py"
PICKSCORE = "fastvideo/models/reward_model/pick_score.py"
SAMPLING = "fastvideo/utils/sampling_utils.py"
STATES = "fastvideo/utils/grpo_states.py"
PREPROCESS = "fastvideo/data_preprocess/preprocess_flux_embedding.py"
# preset -> the launch script of its paper run (MixGRPO, MixGRPO-Flash, MixGRPO-Flash*)
LAUNCHERS = {
    "mixgrpo": "scripts/finetune/finetune_flux_grpo_MixGRPO.sh",
    "mixgrpo_flash": "scripts/finetune/finetune_flux_grpo_MixGRPO_Flash.sh",
    "mixgrpo_flash_star": "scripts/finetune/finetune_flux_grpo_MixGRPO_Flash*.sh",
}
MODEL = "flux_dev"  # --pretrained_model_name_or_path ./data/flux: FLUX.1-dev (README's download)
# the code's --reward_model choices -> flowgrpo reward names, in the order its main() builds the models
REWARDS = {
    "hpsv2": ["hpsv2"],
    "image_reward": ["imagereward"],
    "clip_score": ["clipscore"],
    "pick_score": ["pickscore"],
    "hpsv2_clip_score": ["hpsv2", "clipscore"],
    "multi_reward": ["hpsv2", "imagereward", "pickscore"],
}


def _advantage_line(capture: str) -> str:
    """The group std line of the multi-reward (advantage_aggr), untrimmed branch: the only ``+=`` into the advantages."""
    return (r"else:\s*\n\s*group_mean = group_rewards\.mean\(\)\s*\n\s*group_std = group_rewards\.std\("
            + capture + r"\s*\n\s*advantages\[start_idx:end_idx\] \+=")


def _encode_prompt_default_length() -> int:
    """diffusers' FluxPipeline.encode_prompt default ``max_sequence_length`` (the preprocessing passes none)."""
    from diffusers import FluxPipeline

    return int(inspect.signature(FluxPipeline.encode_prompt).parameters["max_sequence_length"].default)


def code_facts(checkout: Checkout) -> dict[str, Value]:
    """The constants the code fixes, each at its line (``code.*`` keys)."""
    def fact(relpath, pattern, convert=None, function=None):
        return code_fact(checkout, relpath, pattern, **({"convert": convert} if convert else {}), function=function)

    def const(value):  # a fact whose match is the evidence and whose value is a name for it
        return lambda _: value

    sequence = fact(PREPROCESS, r"pipe\.encode_prompt\(([^)]*)\)", str)
    if "max_sequence_length" in sequence.value:
        raise ExtractionError(f"{PREPROCESS}: encode_prompt now passes max_sequence_length ({sequence.value})")
    guidance = r"guidance=torch\.tensor\(\s*\[([\d.]+)\]"
    autocast = r"torch\.autocast\(\"cuda\", torch\.(\w+)\)"
    return {
        # the prompts: one pass over the set at a time, from the file the embedding launch reads
        **epoch_sampler_facts(checkout, SCRIPT, "scripts/preprocess/preprocess_flux_rl_embeddings.sh", "--prompt_path"),
        # the rollout and the training forward: FLUX.1-dev's embedded guidance, one conditional pass
        "code.guidance_rollout": fact(SAMPLING, guidance, function="run_sample_step"),
        "code.guidance_training": fact(SCRIPT, guidance, function="grpo_one_step"),
        # the model's timestep: int(σ·1000)/1000, floored to a multiple of 1/1000 (rollout and training alike)
        "code.timestep": fact(SAMPLING, r"timestep_value = int\(sigma \* (\d+)\)", function="run_sample_step"),
        # the training forward's timestep: the same truncation of each step's σ (grpo_one_step divides it by 1000)
        "code.timestep_training": fact(SCRIPT, r"timestep_value = \[int\(sigma \* (\d+)\) for sigma in sigma_schedule\]",
                                       function="train_one_step"),
        # the σ grid: T + 1 points linear in t from 1 to 0, then the time shift
        "code.sigma_grid": fact(SCRIPT, r"sigma_schedule = torch\.(linspace)\(1, 0, args\.sampling_steps \+ 1\)",
                                const("linear"), "sample_reference_model"),
        "code.time_shift": fact(SAMPLING, r"return (\(shift \* t\) / \(1 \+ \(shift - 1\) \* t\))", const("sd3"),
                                "sd3_time_shift"),
        # Flow-GRPO's SDE: at σ = 1 the ratio σ/(1 − σ) takes σ_1
        "code.sde_sigma_one": fact(SAMPLING, r"torch\.where\(sigma == 1, (sigma_max), sigma\)", const("sigma_1"),
                                   "flow_grpo_step"),
        # the log-prob: the Gaussian density (with log s and log √(2π)), averaged over the latent's elements
        "code.log_prob_reduce": fact(SAMPLING, r"log_prob = log_prob\.(mean)\(dim=tuple", str, "flow_grpo_step"),
        "code.log_prob": fact(SAMPLING, r"- (torch\.log\(std_dev_t \* torch\.sqrt\(-1\*dt\)\))", const("gaussian"),
                              "flow_grpo_step"),
        # the initial noise: one draw per prompt shared by its group (--init_same_noise), in bfloat16
        "code.initial_noise_dtype": fact(
            SCRIPT, r"if args\.init_same_noise:\s*\n\s*input_latents = torch\.randn\((?:[^\n]*\n){1,4}?\s*dtype=torch\.(\w+)",
            str, "sample_reference_model"),
        # MixGRPO-Flash: the tail after the window has int(max((T − last window index)·r, 1)) points, ends included,
        # linear in the unshifted t from the point after the window to 0, then shifted
        "code.flash_tail_min_points": fact(
            SAMPLING, r"num_post_steps = int\(max\(\(sigma_schedule\.size\(0\) - 1 - last_false_index\)"
                      r"\*args\.dpm_post_compress_ratio, (\d+)\)\)", function="run_sample_step"),
        "code.flash_tail_grid": fact(SAMPLING, r"post_sigma_schedule = torch\.(linspace)\(post_time_step, 0, num_post_steps\)",
                                     const("linear"), "run_sample_step"),
        # the window: its first start (Flash*'s frozen one: prog_overlap_step 0 never moves it), indices below
        # sampling_steps − 2 only, each window cut there, its start running on to T − 2 (an empty window) before the
        # roll-back (`>` max_timesteps)
        "code.window_first_start": fact(SCRIPT, r"GRPOTrainingStates\([^)]*cur_timestep=(\d+),", function="main"),
        "code.window_max_timesteps_offset": fact(SCRIPT, r"max_timesteps=args\.sampling_steps-(\d+)", function="main"),
        "code.window_clip": fact(STATES, r"min\(self\.cur_timestep \+ self\.group_size, self\.(max_timesteps)\)",
                                 const("T - 2"), "get_current_timesteps"),
        "code.window_last_start": fact(
            STATES, r"if self\.sample_strategy == \"progressive\":(?:[^\n]*\n){1,8}?\s*if self\.cur_timestep (>) "
                    r"self\.max_timesteps:", const("T - 2"), "update_iteration"),
        # the advantages: per reward, (r − group mean)/(group std + 1e-8) with torch's unbiased std, then the
        # weighted sum with the weights normalised to sum 1
        "code.advantage_eps": fact(SCRIPT, _advantage_line(r"\) \+ ([\d.e-]+)"), function="train_one_step"),
        "code.advantage_std": fact(SCRIPT, _advantage_line(r"(\)) \+ [\d.e-]+"), const("unbiased"), "train_one_step"),
        "code.reward_weights_normalised": fact(SCRIPT, r"reward_weights = \{k: (v/total_weight) for", const(True),
                                               "main"),
        # the loss: each sample's window steps in turn, an optimizer step every gradient_accumulation_steps samples
        # of the process's group, the loss divided by (gradient_accumulation_steps x window steps)
        "code.update_order": fact(SCRIPT, r"if \(i\+1\)%args\.(gradient_accumulation_steps)==0:",
                                  const("samples_in_order"), "train_one_step"),
        "code.ppo_loss": fact(SCRIPT, r"policy_loss = torch\.mean\(torch\.(maximum)\(unclipped_loss, clipped_loss\)\)",
                              const("plain"), "train_one_step"),
        "code.loss_normalizer": fact(
            SCRIPT, r"policy_loss = torch\.mean\([^\n]*\) / \((args\.gradient_accumulation_steps \* len\(train_timesteps\))\)",
            const("mean_over_update"), "train_one_step"),
        # the optimizer: AdamW over every transformer weight, master weights in float32, bf16 autocast
        "code.optimizer": fact(SCRIPT, r"torch\.optim\.(AdamW)\(", str, "main"),
        "code.adam_betas": fact(SCRIPT, r"betas=\((0\.9, 0\.999)\)", lambda s: [float(x) for x in s.split(",")], "main"),
        "code.adam_eps": fact(SCRIPT, r"\beps=([\d.e-]+),", function="main"),
        "code.trained_parameters": fact(SCRIPT, r"params_to_optimize = (transformer\.parameters\(\))", const("full"),
                                        "main"),
        "code.weights_dtype": fact(SCRIPT, r"subfolder=\"transformer\",\s*\n\s*torch_dtype = torch\.(\w+)", str, "main"),
        "code.autocast_rollout": fact(SAMPLING, autocast, str, "run_sample_step"),
        "code.autocast_training": fact(SCRIPT, autocast, str, "grpo_one_step"),
        "code.allow_tf32": fact(SCRIPT, r"torch\.backends\.cuda\.matmul\.allow_tf32 = (True|False)", function="main"),
        "code.epochs": fact(SCRIPT, r"for epoch in range\((\d+)\):", function="main"),
        # the decode: FLUX.1-dev's VAE scaling and shift factors, typed in
        "code.vae_scaling_factor": fact(SCRIPT, r"latents = \(latents / ([\d.]+)\) \+ [\d.]+", function="sample_reference_model"),
        "code.vae_shift_factor": fact(SCRIPT, r"latents = \(latents / [\d.]+\) \+ ([\d.]+)", function="sample_reference_model"),
        # the prompts' T5 embeddings, precomputed with FluxPipeline.encode_prompt's default length
        "code.max_sequence_length": Value(_encode_prompt_default_length(),
                                          f"{sequence.source} (diffusers FluxPipeline.encode_prompt's default)"),
    }


def _processes(command, launcher: str) -> Value:
    """The processes torchrun starts: its --nnodes x --nproc_per_node, the script's variables substituted."""
    numbers, lines = [], []
    for flag in ("--nnodes", "--nproc_per_node"):
        if flag not in command.program:
            raise ExtractionError(f"{launcher}: the launch command passes no torchrun {flag}")
        text = command.program[command.program.index(flag) + 1]
        name = text.lstrip("$").strip("{}")
        if text.startswith("$"):
            if name not in command.variables:
                raise ExtractionError(f"{launcher}: torchrun {flag} {text} is not assigned in the script")
            text, line = command.variables[name]
            lines.append(line)
        numbers.append(int(text))
    return Value(numbers[0] * numbers[1], f"{launcher}:{command.line} (torchrun --nnodes {numbers[0]} --nproc_per_node "
                                          f"{numbers[1]}, set at lines {', '.join(map(str, lines))})")


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    launcher = LAUNCHERS[preset]
    values, command = argparse_launch(checkout, SCRIPT, launcher, SCRIPT)
    values["launch.processes"] = _processes(command, launcher)
    values.update(code_facts(checkout))
    rewards = list(REWARDS[values["reward_model"].value])
    if values["reward_model"].value == "multi_reward" and values["unified_reward_url"].value not in (None, "None"):
        raise ExtractionError(f"{launcher}: a UnifiedReward URL joins a reward flowgrpo has no counterpart for")
    if "pickscore" in rewards:  # its PickScore model standardises the CLIP logit: (x - mean) / std, defaults kept
        for name in ("mean", "std"):
            values[f"code.pickscore_{name}"] = code_fact(
                checkout, PICKSCORE, rf"def __init__\(self, device: str = \"cuda\", http_proxy=None, https_proxy=None,.*"
                rf"\b{name}=([\d.]+)")
        values["code.pickscore_constructed"] = code_fact(
            checkout, SCRIPT, r"https_proxy=args\.image_reward_https_proxy,\s*\)\)\s*"  # multi_reward's, after ImageReward's
            r"reward_models\.append\((PickScoreRewardModel)\(\s*device=device,\s*http_proxy=args\."
            r"pick_score_http_proxy,\s*https_proxy=args\.pick_score_https_proxy,\s*\)\)", str)
    name = launcher.rsplit("/", 1)[-1]
    return [Launch(name, MODEL, rewards, values, f"{launcher}:{command.line}")]
