"""DiffusionNFT's launches (NVlabs/DiffusionNFT): the ml_collections configs of config/nft.py, each run whole, and the
constants scripts/train_nft_sd3.py, its rollout pipeline and solver, its stat tracker and its reward combination
hard-code.

The five SD3.5-Medium runs of the paper's tables are config/nft.py's sd3_geneval, sd3_ocr, sd3_pickscore, sd3_hpsv2
and sd3_multi_reward. Each is traced whole (every leaf of config/base.py it leaves in place too); the arguments its
function passes to ``_get_config`` that no leaf keeps (the number of GPUs, the optimizer steps per epoch) are read
from the call (``launch.*``), and ``_get_config``'s local ``num_groups`` (``launch.num_groups``). ``code.*`` keys are
the constants the code fixes, each found by a regular expression that must match exactly once:

- the training script: the evaluation EMA, the LoRA (rank, alpha, initialisation, target modules), the T5 length of
  the training prompts, the sampling policy's soft-update schedule of every ``decay_type`` (``return_decay``), which
  adapter rolls out and the rollout call's keyword arguments (no generator, no latents: x_T per sample), how the
  training times and noise are drawn (a per-sample permutation of the rollout's grid timesteps, fresh noise per
  sample and time), the shuffle of the samples across groups before the epoch's updates, that every sample is
  trained (no filter of tied groups), the pipeline class (its scheduler, hence its shift), the optimizer;
- the pipeline (flow_grpo/diffusers_patch/pipeline_with_logprob.py): the σ grid left to the scheduler
  (``sigmas=None``) and the timestep the transformer is given in the rollout (σ·1000 cast to an integer), where
  training gives it the scheduler's float timesteps (``code.train_timesteps``, their dtype read from diffusers);
- the stat tracker's std epsilon and the multi-reward rule (weighted rewards summed).
"""

from __future__ import annotations

import ast
import copy
import re

from official import (Checkout, Launch, Value, code_fact, flow_grpo_reward_facts, k_repeat_sampler_facts,
                      trace_ml_collections)

REPOSITORY = "NVlabs/DiffusionNFT"
ENV = "DIFFUSION_NFT_PATH"
PRESETS = ("diffusion_nft",)

# config function -> (flowgrpo model config, flowgrpo rewards): the runs of the paper's tables
RUNS = {
    "sd3_geneval": ("sd3_5_medium", ["geneval"]),
    "sd3_ocr": ("sd3_5_medium", ["ocr"]),
    "sd3_pickscore": ("sd3_5_medium", ["pickscore"]),
    "sd3_hpsv2": ("sd3_5_medium", ["hpsv2"]),
    "sd3_multi_reward": ("sd3_5_medium", ["pickscore", "hpsv2", "clipscore"]),
}
CONFIG = "config/nft.py"
SCRIPT = "scripts/train_nft_sd3.py"
PIPELINE = "flow_grpo/diffusers_patch/pipeline_with_logprob.py"
STATS = "flow_grpo/stat_tracking.py"
REWARDS = "flow_grpo/rewards.py"
CLIPSCORE = "flow_grpo/clip_scorer.py"
NOTES = {"diffusion_nft": "config/nft.py's five SD3.5-Medium runs (the paper's GenEval, OCR, PickScore, HPSv2 and "
                          "multi-reward tables), 8 GPUs each; code.* keys are constants of the training script, its "
                          "pipeline, stat tracker and reward combination"}


def _flow_match_timestep_dtype(_: str) -> str:
    """The dtype of diffusers' FlowMatchEulerDiscreteScheduler's timesteps (σ·1000), the script's stored timesteps."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(10)
    return str(scheduler.timesteps.dtype)


def _annotated(value: Value, note: str) -> Value:
    return Value(value.value, f"{value.source} ({note})")


def code_facts(checkout: Checkout) -> dict:
    """The constants the training script, pipeline, stat tracker and rewards fix, each at its line (``code.*``)."""
    facts = {
        # the evaluation (and saved) EMA of the trained LoRA weights
        "code.ema_decay": code_fact(checkout, SCRIPT, r"EMAModuleWrapper\([^)]*decay=([\d.]+)"),
        "code.ema_update_step_interval": code_fact(checkout, SCRIPT, r"EMAModuleWrapper\([^)]*update_step_interval=(\d+)"),
        # the LoRA
        "code.lora_rank": code_fact(checkout, SCRIPT, r"LoraConfig\(\s*r=(\d+)"),
        "code.lora_alpha": code_fact(checkout, SCRIPT, r"LoraConfig\([^)]*lora_alpha=(\d+)"),
        "code.lora_init": code_fact(checkout, SCRIPT, r"LoraConfig\([^)]*init_lora_weights=\"(\w+)\"", str),
        "code.lora_target_modules": code_fact(checkout, SCRIPT, r"target_modules = (\[[^\]]*\])"),
        # T5 tokens of the training prompts' embeddings (the sampling loop's compute_text_embeddings)
        "code.max_sequence_length": code_fact(
            checkout, SCRIPT, r"compute_text_embeddings\(\s*prompts, text_encoders, tokenizers, max_sequence_length=(\d+)",
            function="main"),
        # the rollout samples with the adapter "old" (θ_old), a second LoRA that starts as a copy of "default"
        "code.rollout_adapter": code_fact(
            checkout, SCRIPT, r"set_adapter\(\"(\w+)\"\)\n\s*with torch_autocast\(enabled=enable_amp, dtype=mixed_precision_dtype\):"
            r"\n\s*with torch.no_grad\(\):\n\s*images, latents, _ = pipeline_with_logprob", str),
        # training times: a per-sample permutation of the rollout's T grid timesteps, its first int(T·fraction) trained
        "code.train_time_draw": code_fact(
            checkout, SCRIPT, r"perms_time = torch\.stack\(\s*\[torch\.(randperm)\(num_timesteps_filtered", str),
        "code.train_times_rule": code_fact(
            checkout, SCRIPT, r"num_train_timesteps = (int\(config\.sample\.num_steps \* config\.train\.timestep_fraction\))",
            str),
        # the rollout call's keyword arguments: no generator and no latents, so every sample draws its own x_T
        "code.rollout_call_arguments": code_fact(
            checkout, SCRIPT, r"images, latents, _ = pipeline_with_logprob\(\s*pipeline,((?:\s*\w+=[^\n]*\n)+)\s*\)",
            lambda text: sorted(re.findall(r"(\w+)=", text)), function="main"),
        # the samples are shuffled across groups before they are cut into the epoch's accumulation batches
        "code.update_shuffle": code_fact(checkout, SCRIPT, r"perm = torch\.(randperm)\(total_batch_size_filtered", str),
        # fresh noise for every sample and training time
        "code.train_noise": code_fact(checkout, SCRIPT, r"noise = torch\.(randn_like)\(x0\.float\(\)\)", str),
        # every sample is trained, tied groups (A = 0) included: no filter between the advantages and the update
        "code.trained_samples": code_fact(checkout, SCRIPT, r"^\s*filtered_samples = (collated_samples)\s*$", str),
        # the pipeline is SD3's own, with its own scheduler (FlowMatchEulerDiscreteScheduler, the model's shift)
        "code.pipeline_class": code_fact(
            checkout, SCRIPT, r"pipeline = (StableDiffusion3Pipeline)\.from_pretrained\(config\.pretrained\.model\)", str),
        "code.optimizer": code_fact(checkout, SCRIPT, r"optimizer_cls = torch\.optim\.(\w+)", str),
        # the rollout's σ grid: the scheduler's own spacing (sigmas=None), for SD3
        "code.pipeline_sigmas": code_fact(
            checkout, PIPELINE, r"retrieve_timesteps\(\s*self\.scheduler,\s*num_inference_steps,\s*device,\s*sigmas=(None),",
            str),
        # the timestep the rollout gives the transformer: sigma * 1000 cast to an integer (truncated)
        "code.rollout_timestep_dtype": code_fact(
            checkout, PIPELINE, r"timesteps = torch\.full\(\[latent_model_input\.shape\[0\]\], sigma \* 1000, "
            r"device=z\.device, dtype=(torch\.long)\)", str),
        # the training times: the rollout scheduler's stored timesteps (FlowMatchEulerDiscreteScheduler's σ·1000,
        # float), the model told them as they are and x_t mixed at t/1000; integer only in the rollout (above)
        "code.train_timesteps": _annotated(
            code_fact(checkout, SCRIPT, r"timesteps = (pipeline\.scheduler\.timesteps)\.repeat\(len\(prompts\), 1\)",
                      _flow_match_timestep_dtype, function="main"),
            "diffusers FlowMatchEulerDiscreteScheduler.timesteps, its dtype"),
        # advantages: (r − mean)/(std + eps), population std
        "code.adv_std_eps": code_fact(checkout, STATS, r"std = np\.std\(rewards, axis=0, keepdims=True\) \+ ([\d.e-]+)"),
        # several rewards: the weighted rewards summed, then the advantage of the sum
        "code.multi_reward": code_fact(
            checkout, REWARDS, r"total_scores = \[(total \+ weighted) for total, weighted in zip", str),
    }
    # the sampling policy's soft update θ_old ← λ·θ_old + (1 − λ)·θ after each epoch, λ = return_decay(step, type)
    for kind in (0, 1, 2):
        for name, pattern in (("flat", r"(\d+)"), ("uprate", r"([\d.]+)"), ("uphold", r"([\d.]+)")):
            head = r"decay_type == %d:\s*" % kind
            before = {"flat": "", "uprate": r"flat = \d+\s*", "uphold": r"flat = \d+\s*uprate = [\d.]+\s*"}[name]
            facts[f"code.decay_type_{kind}.{name}"] = code_fact(
                checkout, SCRIPT, head + before + name + " = " + pattern, function="return_decay")
    facts.update(k_repeat_sampler_facts(checkout, SCRIPT))  # each rollout batch its own random prompts
    return facts


def reward_scale_facts(checkout: Checkout, rewards: list[str]) -> dict[str, Value]:
    """How its reward code scores the rewards a launch trains on (what enters the sum): PickScore's CLIP logit over 26;
    CLIPScore's logit (exp(logit_scale)·cos, unclamped) over 100 on torchvision's tensor transforms; CLIPScore and HPSv2
    handed the rollout's float images as they are (only a non-tensor is rounded); OCR's full credit for a prompt
    contained in the recognised text; GenEval scored in-process on PIL images (no JPEG)."""
    facts = flow_grpo_reward_facts(checkout, rewards, "flow_grpo")  # PickScore ÷ 26, OCR, GenEval
    if "clipscore" in rewards:
        facts["code.clipscore_score"] = code_fact(
            checkout, CLIPSCORE, r"^\s*return (outputs\.logits_per_image\.diagonal\(\) / \d+)$", str)
        facts["code.clipscore_transform"] = code_fact(checkout, CLIPSCORE, r"resize = (T\.Resize)\(get_size", str)
        facts["code.clipscore_images"] = code_fact(
            checkout, REWARDS, r"if not (isinstance\(images, torch\.Tensor\)):", str, function="clip_score")
    if "hpsv2" in rewards:
        facts["code.hpsv2_images"] = code_fact(
            checkout, REWARDS, r"if not (isinstance\(images, torch\.Tensor\)):", str, function="hpsv2_score")
    return facts


def _call_argument(checkout: Checkout, function: str, name: str):
    """The literal ``name=...`` argument ``function`` passes to ``_get_config`` (``launch.<name>``)."""
    return code_fact(checkout, CONFIG, rf"_get_config\([^)]*\b{name}=([^,)\s]+)", ast.literal_eval, function=function)


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    facts = code_facts(checkout)
    out = []
    for function, (model, rewards) in RUNS.items():
        values, local = trace_ml_collections(checkout, CONFIG, function, {"_get_config": ["num_groups"]})
        values.update({k.replace("_get_config", "launch", 1): v for k, v in local.items()})
        values.update(copy.deepcopy(facts))  # each launch its own lists (no YAML anchors)
        for name in ("n_gpus", "gradient_step_per_epoch"):
            values[f"launch.{name}"] = _call_argument(checkout, function, name)
        values.update(reward_scale_facts(checkout, rewards))
        entry = code_fact(checkout, CONFIG, rf"^def ({function})\(", convert=str).source
        out.append(Launch(function, model, rewards, values, entry))
    return out
