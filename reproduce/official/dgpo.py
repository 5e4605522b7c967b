"""DGPO's launches (Luo-Yihong/DGPO): the ml_collections configs of config/dgpo.py, each run whole, and the constants
scripts/train_sd3_dgpo.py, its stat tracker and its reward combination hard-code.

Which runs: the paper's three SD3.5-Medium tables (GenEval, OCR, PickScore) are its README's "Mode 1" (rollouts with
CFG, training without it, a frozen reference without CFG), the configs of config/dgpo.py: ``geneval_sd3_4gpu``
(scripts/single_node/sd3_dgpo_geneval.sh), ``general_ocr_sd3_4gpu`` (scripts/single_node/sd3_dgpo_ocr.sh, the
README's "Start Training") and ``pickscore_sd3_4gpu`` (no launch script; the same file's PickScore run). The configs
of config/dgpo_wocfg.py and config/dgpo_wocfg_emaref.py (Modes 2a/2b, CFG-free) came after the paper and are not
launches of the preset. Each is traced whole (config/base.py's leaves it leaves in place too), with
``gpu_number`` and ``num_groups``, locals of the config function that size the epoch.

``code.*`` keys are the constants the code fixes, each found by a regular expression that must match exactly once:
the rollout's scheduler (a DPMSolverMultistepScheduler from Sana's hub config, its flow_shift overwritten to 3; the
config's ``use_dpm`` and ``flow_shift`` are never read), the σ grid left to it (the pipeline's ``sigmas`` default),
the LoRA, the evaluation EMA and ema_ref (its decay schedule, counted before the step's increment), the T5 length,
how the training times and noise are drawn (one ``random.sample`` of grid indices per inner epoch for every sample,
the noise shared within a group), the training σ (the scheduler's integer timestep / 1000), the training guidance
(``predict_v(..., cfg=False)``), that every sample is trained (the filter is commented out), the stat tracker's std
epsilon and the multi-reward rule.
"""

from __future__ import annotations

import copy
from official import (Checkout, Launch, Value, code_fact, flow_grpo_reward_facts,
                      k_repeat_sampler_facts, trace_ml_collections)

REPOSITORY = "Luo-Yihong/DGPO"
ENV = "DGPO_PATH"
PRESETS = ("dgpo",)

# config function -> (flowgrpo model config, flowgrpo rewards): the paper's Mode 1 runs
RUNS = {
    "geneval_sd3_4gpu": ("sd3_5_medium", ["geneval"]),
    "general_ocr_sd3_4gpu": ("sd3_5_medium", ["ocr"]),
    "pickscore_sd3_4gpu": ("sd3_5_medium", ["pickscore"]),
}
CONFIG = "config/dgpo.py"
SCRIPT = "scripts/train_sd3_dgpo.py"
PIPELINE = "flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py"
STATS = "flow_grpo/stat_tracking.py"
REWARDS = "flow_grpo/rewards.py"
NOTES = {"dgpo": "config/dgpo.py's three SD3.5-Medium runs (Mode 1 of its README: the paper's GenEval, OCR and "
                 "PickScore tables), 4 GPUs each; code.* keys are constants of the training script, its pipeline, stat "
                 "tracker and reward combination"}


def _dpm_timestep_dtype(_: str) -> str:
    """The dtype of diffusers' DPMSolverMultistepScheduler's timesteps with flow sigmas (Sana's scheduler config, as
    diffusers' scripts/convert_sana_to_diffusers.py writes it): what the DGPO pipeline's t is."""
    from diffusers import DPMSolverMultistepScheduler

    scheduler = DPMSolverMultistepScheduler(flow_shift=3.0, use_flow_sigmas=True, prediction_type="flow_prediction")
    scheduler.set_timesteps(10)
    return str(scheduler.timesteps.dtype)


def _annotated(value: Value, note: str) -> Value:
    return Value(value.value, f"{value.source} ({note})")


def code_facts(checkout: Checkout) -> dict:
    """The constants the training script, pipeline, stat tracker and rewards fix, each at its line (``code.*``)."""
    return {
        **k_repeat_sampler_facts(checkout, SCRIPT),  # each rollout batch its own random prompts
        # the rollout scheduler: DPM-Solver++ from Sana's hub config, with flow_shift 3 written over it
        "code.scheduler": code_fact(
            checkout, SCRIPT, r"pipeline\.scheduler = (DPMSolverMultistepScheduler)\.from_pretrained\(", str),
        "code.scheduler_config": code_fact(
            checkout, SCRIPT, r"DPMSolverMultistepScheduler\.from_pretrained\(\"([^\"]+)\", subfolder=\"scheduler\"\)", str),
        "code.flow_shift": code_fact(checkout, SCRIPT, r"pipeline\.scheduler\.config\['flow_shift'\] = ([\d.]+)"),
        # the rollout's σ grid: the pipeline's sigmas default (the training loop passes none): the scheduler's own
        "code.pipeline_sigmas": code_fact(checkout, PIPELINE, r"sigmas: Optional\[List\[float\]\] = (None),", str),
        # the timestep the rollout tells the transformer: the scheduler's t, whose dtype is
        # DPMSolverMultistepScheduler's (int64: ⌊1000σ⌋), while scheduler.step steps the float σ
        "code.rollout_timestep": _annotated(
            code_fact(checkout, PIPELINE, r"timestep = (t)\.expand\(latent_model_input\.shape\[0\]\)",
                      _dpm_timestep_dtype, function="pipeline_with_logprob"),
            "t: diffusers DPMSolverMultistepScheduler.timesteps, its dtype"),
        # the LoRA
        "code.lora_rank": code_fact(checkout, SCRIPT, r"LoraConfig\(\s*r=(\d+)"),
        "code.lora_alpha": code_fact(checkout, SCRIPT, r"LoraConfig\([^)]*lora_alpha=(\d+)"),
        "code.lora_init": code_fact(checkout, SCRIPT, r"LoraConfig\([^)]*init_lora_weights=\"(\w+)\"", str),
        "code.lora_target_modules": code_fact(checkout, SCRIPT, r"target_modules = (\[[^\]]*\])"),
        # the evaluation (and saved) EMA
        "code.ema_decay": code_fact(checkout, SCRIPT, r"ema = EMAModuleWrapper\([^)]*decay=([\d.]+)"),
        "code.ema_update_step_interval": code_fact(checkout, SCRIPT, r"ema = EMAModuleWrapper\([^)]*update_step_interval=(\d+)"),
        # ema_ref (the clip's "old" policy, the sampler after switch_ema_ref): λ = min(max, rate·global_step), after
        # every optimizer step, with global_step counting the steps before this one (it is incremented after)
        "code.ema_ref_update_step_interval": code_fact(
            checkout, SCRIPT, r"ema_ref = EMAModuleWrapper\([^)]*update_step_interval=(\d+)"),
        "code.ema_ref_max": code_fact(checkout, SCRIPT, r"ema_ref_decay = min\(([\d.]+), [\d.]+ \* global_step\)"),
        "code.ema_ref_rate": code_fact(checkout, SCRIPT, r"ema_ref_decay = min\([\d.]+, ([\d.]+) \* global_step\)"),
        "code.ema_ref_delay": code_fact(
            checkout, SCRIPT, r"ema_ref\.step\(transformer_trainable_parameters, global_step, decay = ema_ref_decay\)"
            r"[\s\S]{0,2500}?global_step \+= (1)"),
        # T5 tokens of the training prompts' embeddings
        "code.max_sequence_length": code_fact(
            checkout, SCRIPT, r"compute_text_embeddings\(\s*prompts,\s*text_encoders,\s*tokenizers,\s*max_sequence_length=(\d+)",
            function="main"),
        # training times: M = num_train_timesteps grid indices among 0..trunc_steps, one random.sample per inner epoch
        # (rank 0's, broadcast) before the loop over the training batches, so every sample trains the same times
        "code.train_time_draw": code_fact(
            checkout, SCRIPT, r"sampled = random\.(sample)\(train_timesteps, M\)", str),
        "code.train_times_per": code_fact(
            checkout, SCRIPT, r"sampled_timesteps = (generate_shared_sampled_timesteps)\(accelerator, train_timesteps, M\)"
            r"\n\s*for i, sample in tqdm\(", str),
        # the training σ: the scheduler's (integer) timestep / 1000, the model called at that timestep
        "code.train_sigma": code_fact(checkout, SCRIPT, r"sigmas_t = \((t / 1000)\)", str),
        # the training velocity: the policy without CFG (predict_v(..., cfg=False))
        "code.train_cfg": code_fact(
            checkout, SCRIPT, r"model_v = predict_v\(transformer, xt, t, embeds, pooled_embeds, config, cfg = (\w+)\)"),
        # every sample is trained, tied groups (A = 0) included: the filter by advantage is commented out
        "code.trained_samples": code_fact(checkout, SCRIPT, r"^\s*samples = \{k: (v) for k, v in samples\.items\(\)\}", str),
        "code.optimizer": code_fact(checkout, SCRIPT, r"optimizer_cls = torch\.optim\.(\w+)", str),
        # advantages: (r − mean)/(std + eps), population std
        "code.adv_std_eps": code_fact(checkout, STATS, r"std = np\.std\(rewards, axis=0, keepdims=True\) \+ ([\d.e-]+)"),
        # several rewards: the weighted rewards summed
        "code.multi_reward": code_fact(
            checkout, REWARDS, r"total_scores = \[(total \+ weighted) for total, weighted in zip", str),
    }


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    facts = code_facts(checkout)
    out = []
    for function, (model, rewards) in RUNS.items():
        values, local = trace_ml_collections(checkout, CONFIG, function, {function: ["gpu_number", "num_groups"]})
        values.update({k.replace(function, "launch", 1): v for k, v in local.items()})
        values.update(copy.deepcopy(facts))  # each launch its own lists (no YAML anchors)
        values.update(flow_grpo_reward_facts(checkout, rewards, "flow_grpo"))  # PickScore ÷ 26, OCR, GenEval
        entry = code_fact(checkout, CONFIG, rf"^def ({function})\(", convert=str).source
        out.append(Launch(function, model, rewards, values, entry))
    return out
