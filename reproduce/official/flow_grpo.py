"""Flow-GRPO's launches (yifan123/flow_grpo): the ml_collections configs of config/grpo.py and config/grpo_guard.py,
each run whole, and the constants their training scripts, pipelines and SDE step hard-code.

The checkout is the repository at 9745241 (2025-11-04, the merge of GRPO-Guard, PR #175): the newest commit whose
files agree with one another (Flow-GRPO-Fast's CPS refactor of 2025-10-14, FLUX Fast of 2025-10-27, GRPO-Guard of
2025-10-31). Later commits the stored index holds (54809b5) rewrite the SD3 pipeline around a solver module and make
train_sd3.py score ODE steps against the reference model: not the published runs.

Runs (the paper's tables and the README's launch scripts):

- ``flow_grpo``: geneval_sd3 (scripts/multi_node/sd3.sh), general_ocr_sd3, pickscore_sd3 (the paper's three SD3.5-M
  tasks, scripts/train_sd3.py), clipscore_sd3 (the repository's CLIPScore run), pickscore_flux (scripts/multi_node/
  flux.sh, scripts/train_flux.py); and its two editing runs, the README's counting-edit task (dataset/counting_edit:
  an instruction to change an object count and the source image it applies to, scored by GenEval's counting and the
  CLIP image similarity to the source): counting_flux_kontext (scripts/multi_node/flux_kontext.sh,
  scripts/train_flux_kontext.py, FLUX.1-Kontext-dev) and counting_qwenimage_edit (scripts/multi_node/qwenimage_edit.sh,
  scripts/train_qwenimage_edit.py, the first Qwen-Image-Edit through QwenImageEditPipeline). The Qwen-Image-Edit-2509
  trainer (scripts/train_qwenimage_edit_plus.py, config dual_ref_qwenimage_edit_plus_fast of
  scripts/single_node/grpo_qwenimage_edit_plus.sh) is on another line of the repository (9dcdc35, c7bb5fe: neither is
  an ancestor of 9745241, and neither 9745241's config/grpo.py nor the later main line's, 74db691, defines that
  config): one data file holds one commit per file, so it is not read here;
- ``flow_grpo_fast``: geneval_sd3_fast_nocfg and pickscore_sd3_fast_nocfg (the README's Fast figures,
  scripts/multi_node/sd3_fast.sh, scripts/train_sd3_fast.py), geneval_flux_fast and pickscore_flux_fast (the README's
  FLUX Fast W&B runs, scripts/multi_node/flux_fast.sh, scripts/train_flux_fast.py);
- ``grpo_guard``: config/grpo_guard.py's three SD3.5-M runs (scripts/multi_node/sd3_grpo_guard.sh,
  scripts/train_sd3_GRPO_Guard.py): GRPO-Guard's code is in this repository;
- ``tempflow``: TempFlow-GRPO has no public code; its paper builds on Flow-GRPO's SD3.5-M training, so its launches
  are Flow-GRPO's three SD3 runs, and the keys of its own method are listed as differences in the map;
- ``op_grpo``: OP-GRPO (arXiv 2604.04142) has no public code; its paper builds on Flow-GRPO's SD3.5-M training, so its
  launches are Flow-GRPO's three SD3 runs; its own method (off-policy replay, flowgrpo's ``learner.replay``) has no
  Flow-GRPO key.

Every config's batch arithmetic uses a local ``gpu_number`` (its value is recorded as the ``gpu_number`` key).
"""

from __future__ import annotations

import ast
import re

from official import (Checkout, ExtractionError, Launch, Value, code_fact, flow_grpo_reward_facts,
                      k_repeat_sampler_facts, trace_ml_collections)

REPOSITORY = "yifan123/flow_grpo"
ENV = "FLOW_GRPO_PATH"
PRESETS = ("flow_grpo", "flow_grpo_fast", "grpo_guard", "tempflow", "op_grpo")

SDE = "flow_grpo/diffusers_patch/sd3_sde_with_logprob.py"
TRACKER = "flow_grpo/stat_tracking.py"


class Script:
    """A training script and the pipeline it samples with; ``edit``: an editing script ("kontext": FLUX.1-Kontext on
    the FLUX script's loop; "qwen": Qwen-Image-Edit on its FSDP loop), whose prompts come with a source image."""

    def __init__(self, path: str, pipeline: str, family: str, fast: bool = False, guard: bool = False,
                 edit: str | None = None):
        self.path, self.pipeline, self.family, self.fast, self.guard = path, pipeline, family, fast, guard
        self.edit = edit


SD3 = Script("scripts/train_sd3.py", "flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py", "sd3")
SD3_FAST = Script("scripts/train_sd3_fast.py", "flow_grpo/diffusers_patch/sd3_pipeline_with_logprob_fast.py", "sd3",
                  fast=True)
FLUX = Script("scripts/train_flux.py", "flow_grpo/diffusers_patch/flux_pipeline_with_logprob.py", "flux")
FLUX_FAST = Script("scripts/train_flux_fast.py", "flow_grpo/diffusers_patch/flux_pipeline_with_logprob_fast.py", "flux",
                   fast=True)
GUARD = Script("scripts/train_sd3_GRPO_Guard.py", "flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py", "sd3",
               guard=True)
KONTEXT = Script("scripts/train_flux_kontext.py", "flow_grpo/diffusers_patch/flux_kontext_pipeline_with_logprob.py",
                 "flux", edit="kontext")
QWEN_EDIT = Script("scripts/train_qwenimage_edit.py", "flow_grpo/diffusers_patch/qwenimage_edit_pipeline_with_logprob.py",
                   "qwen_image", edit="qwen")

# config function -> (config file, training script, flowgrpo model config, flowgrpo rewards)
FLOW_GRPO_RUNS = {
    "geneval_sd3": ("config/grpo.py", SD3, "sd3_5_medium", ["geneval"]),
    "general_ocr_sd3": ("config/grpo.py", SD3, "sd3_5_medium", ["ocr"]),
    "pickscore_sd3": ("config/grpo.py", SD3, "sd3_5_medium", ["pickscore"]),
    "clipscore_sd3": ("config/grpo.py", SD3, "sd3_5_medium", ["clipscore"]),
    "pickscore_flux": ("config/grpo.py", FLUX, "flux_dev", ["pickscore"]),
    # the editing runs: reward_fn weighs GenEval (the edit's object count from the row's GenEval metadata) and the
    # CLIP image similarity to the source (flowgrpo's clip_image_similarity); their weights are reward_fn's values
    "counting_flux_kontext": ("config/grpo.py", KONTEXT, "flux1_kontext_dev", ["geneval", "clip_image_similarity"]),
    "counting_qwenimage_edit": ("config/grpo.py", QWEN_EDIT, "qwen_image_edit_2511", ["geneval", "clip_image_similarity"]),
}
RUNS = {
    "flow_grpo": FLOW_GRPO_RUNS,
    "flow_grpo_fast": {
        "geneval_sd3_fast_nocfg": ("config/grpo.py", SD3_FAST, "sd3_5_medium", ["geneval"]),
        "pickscore_sd3_fast_nocfg": ("config/grpo.py", SD3_FAST, "sd3_5_medium", ["pickscore"]),
        "geneval_flux_fast": ("config/grpo.py", FLUX_FAST, "flux_dev", ["geneval"]),
        "pickscore_flux_fast": ("config/grpo.py", FLUX_FAST, "flux_dev", ["pickscore"]),
    },
    # reward_fn also lists pickscore at weight 0.0 for the OCR and GenEval runs: scored, never trained on
    "grpo_guard": {
        "general_ocr_sd3_rationorm": ("config/grpo_guard.py", GUARD, "sd3_5_medium", ["ocr"]),
        "pickscore_hps_sd3_ratio_norm": ("config/grpo_guard.py", GUARD, "sd3_5_medium", ["pickscore"]),
        "geneval_sd3_rationorm": ("config/grpo_guard.py", GUARD, "sd3_5_medium", ["geneval"]),
    },
    "tempflow": {k: FLOW_GRPO_RUNS[k] for k in ("geneval_sd3", "general_ocr_sd3", "pickscore_sd3")},
    "op_grpo": {k: FLOW_GRPO_RUNS[k] for k in ("geneval_sd3", "general_ocr_sd3", "pickscore_sd3")},
}

NOTES = {
    "flow_grpo": "Its editing runs are the README's counting-edit task (dataset/counting_edit: an instruction to change "
                 "an object's count in a FLUX-generated source image, GenEval's count against the row's metadata "
                 "plus the CLIP image similarity to the source): counting_flux_kontext (scripts/multi_node/"
                 "flux_kontext.sh) and counting_qwenimage_edit (scripts/multi_node/qwenimage_edit.sh, the first "
                 "Qwen-Image-Edit). The repository's Qwen-Image-Edit-2509 trainer (scripts/train_qwenimage_edit_plus.py, "
                 "dual_ref_qwenimage_edit_plus_fast) is on another line of the repository (9dcdc35, c7bb5fe, not "
                 "ancestors of this commit), whose config/grpo.py is not this commit's, so it is not one of these "
                 "launches.",
    "tempflow": "TempFlow-GRPO has no public code (Shredded-Pork/TempFlow-GRPO holds its README only); its paper builds "
                "on Flow-GRPO's SD3.5-M training, whose launches these are. Its own method (ODE trunk, branch steps, "
                "noise-aware weights) is listed as differences in reproduce/official/map/flow_grpo.yaml.",
    "op_grpo": "OP-GRPO has no public code (its paper, arXiv 2604.04142, \"OP-GRPO: Efficient Off-Policy GRPO for "
               "Flow-Matching Models\", Zhejiang University / Huawei, is all there is); its paper builds on Flow-GRPO's "
               "SD3.5-M training (it reports results comparable to or better than Flow-GRPO's with 34.2% of the "
               "training steps), whose launches these are. Its own method (a replay buffer of selected high-quality "
               "trajectories, a sequence-level importance weight, late steps truncated: flowgrpo's learner.replay) "
               "has no Flow-GRPO key.",
    "grpo_guard": "GRPO-Guard's code: config/grpo_guard.py and scripts/train_sd3_GRPO_Guard.py (merged 2025-11-04).",
}


def _call_args(checkout: Checkout, script: str, function: str, callee: str) -> list[set[str]]:
    """The keyword names of every call of ``callee`` inside ``function`` of ``script``."""
    tree = ast.parse(checkout.file(script).read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == callee:
                    out.append({k.arg for k in call.keywords})
    if not out:
        raise ExtractionError(f"{script}: {function}() never calls {callee}")
    return out


def _presence(checkout: Checkout, relpath: str, pattern: str) -> Value:
    """Whether ``pattern`` occurs (once) in ``relpath``: True at its line, or False citing the file."""
    text = checkout.file(relpath).read_text()
    matches = list(re.finditer(pattern, text, re.MULTILINE))
    if len(matches) > 1:
        raise ExtractionError(f"{relpath}: {len(matches)} matches of {pattern!r} (expected at most one)")
    if matches:
        return Value(True, f"{relpath}:{text[: matches[0].start()].count(chr(10)) + 1}")
    return Value(False, f"{relpath} (no such line)")


def _flow_match_timestep_dtype(_: str) -> str:
    """The dtype of diffusers' FlowMatchEulerDiscreteScheduler's timesteps (σ·1000), what the pipelines' t is."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(10)
    return str(scheduler.timesteps.dtype)


def edit_facts(checkout: Checkout, script: Script, values: dict) -> dict:
    """What an editing script does with a prompt's source image, how it groups, draws and scores its rows: the
    constants of the editing loop beyond the text-to-image scripts' (``code.*`` keys)."""
    s, pipeline = script.path, script.pipeline
    facts = {
        # each row's source image is squashed to resolution x resolution by PIL's resize (its default filter)
        "code.condition_resize": code_fact(
            checkout, s, r"ref_images = \[ref_image\.(resize\(\(config\.resolution, config\.resolution\)\)) for ref_image in "
            r"ref_images\]", convert=str, function="main"),
        # a group is the k samples of one (instruction, source image) row: the stat tracker keys the advantages by the
        # instruction joined to the image's path
        "code.group_key": code_fact(checkout, s, r'item\["prompt_with_image_path"\] = (f"\{self\.prompts\[idx\]\}_\{image_path\}")',
                                    convert=str),
        # the scorer of the image similarity to the source: cosine of CLIP image embeddings
        "code.image_similarity": code_fact(checkout, "flow_grpo/clip_scorer.py",
                                           r'self\.model = CLIPModel\.from_pretrained\("([^"]+)"\)', convert=str),
        "code.image_similarity_score": code_fact(checkout, "flow_grpo/clip_scorer.py",
                                                 r"^\s*sim = (pixel_embeds @ ref_embeds\.T)$", convert=str),
        # how it preprocesses (torchvision's tensor Resize + CenterCrop + Normalize), what it is given: the sampler's
        # float images as they are, and the reward_fn's ref_images (the squashed PIL sources) as uint8 / 255
        "code.image_similarity_transform": code_fact(checkout, "flow_grpo/clip_scorer.py", r"resize = (T\.Resize)\(get_size",
                                                     convert=str),
        "code.image_similarity_images": code_fact(checkout, "flow_grpo/rewards.py", r"if not (isinstance\(images, torch\.Tensor\)):",
                                                  convert=str, function="image_similarity_score"),
        "code.image_similarity_reference": code_fact(
            checkout, "flow_grpo/rewards.py", r"^\s*ref_images = (torch\.tensor\(ref_images, dtype=torch\.uint8\)/255\.0)$",
            convert=str, function="image_similarity_score"),
    }
    facts.update(k_repeat_sampler_facts(checkout, s))
    rewarded = [name for name in ("pickscore", "ocr", "geneval") if values.get(f"reward_fn.{name}") is not None]
    facts.update(flow_grpo_reward_facts(checkout, rewarded, "flow_grpo"))
    if script.edit == "kontext":
        # the output is max_area = resolution² at the requested (square) aspect, and the pipeline resizes the source
        # to that output size (its _auto_resize to Kontext's preferred resolutions is never taken)
        facts["code.output_area"] = code_fact(checkout, s, r"max_area=(config\.resolution\*config\.resolution)", convert=str,
                                              function="main")
        facts["code.condition_size"] = code_fact(checkout, pipeline, r"image = self\.image_processor\.(resize\(image, height, width\))",
                                                 convert=str)
    else:
        # the source is resized to about 1024 x 1024 px of area at its aspect (calculate_dimensions), and that one
        # image is both the VAE's (the reference latents) and the VLM's
        facts["code.condition_size"] = code_fact(
            checkout, pipeline, r"calculated_width, calculated_height, _ = calculate_dimensions\((1024 \* 1024), image_size\[0\] / "
            r"image_size\[1\]\)", convert=str)
        # the VLM is given the VAE's preprocessed tensor of the source (prompt_image, in [-1, 1]), for the prompt and
        # the negative prompt alike
        facts["code.condition_vlm_input"] = code_fact(
            checkout, pipeline, r"image=(torch\.cat\(\[prompt_image, prompt_image\], dim=0\)),", convert=str)
        facts["code.negative_prompt"] = code_fact(checkout, s, r'negative_prompt=(\[" "\])\*len\(prompts\)', convert=str,
                                                  function="main")
        # true CFG rescaled to the conditional prediction's norm, as QwenImagePipeline does
        facts["code.cfg_rescale"] = code_fact(checkout, pipeline, r"noise_pred = (comb_pred \* \(cond_norm / noise_norm\))",
                                              convert=str)
    return facts


def code_facts(checkout: Checkout, script: Script, values: dict) -> dict:
    """The constants a launch's script, pipeline and SDE step fix, each at its line (``code.*`` keys)."""
    s = script.path
    qwen = script.edit == "qwen"  # Qwen-Image-Edit's FSDP script: no EMA, its own reference, its own encoding
    facts = {
        "code.lora_rank": code_fact(checkout, s, r"LoraConfig\(\s*r=(\d+)"),
        "code.lora_alpha": code_fact(checkout, s, r"LoraConfig\([^)]*lora_alpha=(\d+)"),
        "code.lora_init": code_fact(checkout, s, r"init_lora_weights=\"(\w+)\"", convert=str),
        "code.lora_target_modules": code_fact(checkout, s, r"target_modules = (\[[^\]]*\])"),
        "code.optimizer": code_fact(checkout, s, r"optimizer_cls = (torch\.optim\.AdamW)$", convert=str),
        # the pipeline (and its scheduler, with the model's own shift) the run loads
        "code.pipeline_class": code_fact(checkout, s, r"pipeline = (\w+Pipeline)\.from_pretrained\(", convert=str),
        # the KL to the reference (the LoRA disabled) divides by the SDE's std_dev_t, not by its step's std
        "code.kl_denominator": code_fact(checkout, s, r"kl_loss = .*/ \((2 \* std_dev_t \*\* 2)\)$", convert=str),
        # samples whose advantages are all zero are dropped before training (SD3 scripts; not FLUX's)
        "code.drops_zero_advantage": _presence(checkout, s, r"mask = \(samples\[\"advantages\"\]\.abs\(\)\.sum\(dim=1\) != 0\)"),
        # the samples are shuffled across groups before they are cut into training batches (not in the Fast scripts,
        # which train the sampling batches in the order drawn)
        "code.shuffles_samples": _presence(checkout, s, r"perm = torch\.randperm\(total_batch_size"),
        # each sampling batch (over all processes) is m = n·b/k prompts, each repeated k times: whole groups, so the
        # Fast scripts' optimizer steps (consecutive sampling batches) take whole groups
        "code.sampling_batch_groups": code_fact(checkout, s, r"(self\.m = self\.total_samples // self\.k)",
                                                convert=str),
        "code.trained_steps": code_fact(checkout, s, r"train_timesteps = \[step_index  for step_index in (range\(num_train_timesteps\))\]",
                                        convert=str),
        # the log-prob of a step: mean over every latent element (both kernels)
        "code.log_prob_reduce": code_fact(checkout, SDE, r"log_prob = log_prob\.(mean)\(dim=tuple\(range\(1, log_prob\.ndim\)\)\)",
                                          convert=str),
        # the advantage: (r − the prompt's mean) / (std + 1e-4), the std of all rewards (global_std) or the prompt's
        "code.adv_std_eps_global": code_fact(checkout, TRACKER, r"std = np\.std\(rewards, axis=0, keepdims=True\) \+ ([\d.e-]+)"),
        "code.adv_std_eps_group": code_fact(checkout, TRACKER, r"std = np\.std\(self\.stats\[prompt\], axis=0, keepdims=True\) \+ ([\d.e-]+)"),
        # several rewards: their weighted sum is the reward the advantage is computed from
        "code.multi_reward": code_fact(checkout, "flow_grpo/rewards.py",
                                       r"(weighted_scores) = \[weight \* score for score in scores\]", convert=str),
        # same_latent: one generator per sample seeded by (epoch·10000 + batch index + hash(prompt))
        "code.same_latent_seed": code_fact(checkout, s, r"generator = create_generator\(prompts, base_seed=(epoch\*10000\+i)\)",
                                           convert=str),
    }
    if qwen:
        # no evaluation EMA: the script's EMAModuleWrapper line is commented out and `ema = None`
        facts["code.ema"] = code_fact(checkout, s, r"^    ema = (None)$", convert=str, function="main")
        # the KL's reference is a second copy of the base transformer (the weights the LoRA starts from)
        facts["code.kl_reference"] = code_fact(checkout, s, r"transformer_ref = (QwenImageTransformer2DModel)\.from_pretrained\(",
                                               convert=str)
        # window size 0: the steps of the default window (0, T − 1) are SDE and trained, the last step is ODE
        facts["code.num_train_timesteps"] = code_fact(
            checkout, s, r"^    if config\.sample\.sde_window_size > 0:\n\s+num_train_timesteps = config\.sample\.sde_window_size\n"
            r"\s+else:\n\s+num_train_timesteps = (.+)$", convert=str)
        facts["code.sde_window_default"] = code_fact(
            checkout, script.pipeline, r"^        sde_window = (\(0, len\(timesteps\)-1\))$", convert=str)
        # a window start of size > 0 is drawn by Python's random seeded with the process index at every call
        facts["code.window_seed"] = code_fact(checkout, script.pipeline, r"random\.seed\((process_index)\)", convert=str)
    else:
        facts["code.ema_decay"] = code_fact(checkout, s, r"EMAModuleWrapper\([^)]*decay=([\d.]+)")
        facts["code.ema_update_step_interval"] = code_fact(checkout, s, r"EMAModuleWrapper\([^)]*update_step_interval=(\d+)")
        # the prompts of the sampling loop are encoded with this many T5 tokens (Qwen-Image-Edit's pipeline encodes
        # them itself, untruncated: no such number)
        facts["code.max_sequence_length"] = code_fact(
            checkout, s, r"compute_text_embeddings\(\s*prompts,\s*text_encoders,\s*tokenizers,\s*max_sequence_length=(\d+)",
            function="main")
        facts["code.kl_reference"] = code_fact(checkout, s, r"with transformer\.module\.(disable_adapter)\(\):", convert=str)
        facts["code.num_train_timesteps"] = code_fact(
            checkout, s, r"^    (?:if config\.sample\.sde_window_size > 0:\n\s+)?num_train_timesteps = (.+)$", convert=str)
    if script.edit:
        facts.update(edit_facts(checkout, script, values))
    # the σ grid: SD3's pipeline leaves it to the scheduler (sigmas=None); FLUX's passes linspace(1, 1/T, T) with the
    # resolution's dynamic shift mu
    if script.family == "sd3":
        passed = _call_args(checkout, s, "main", "pipeline_with_logprob")
        if any("sigmas" in keywords for keywords in passed):
            raise ExtractionError(f"{s} passes sigmas to pipeline_with_logprob: read the grid it passes")
        facts["code.sigmas"] = code_fact(checkout, script.pipeline, r"sigmas: Optional\[List\[float\]\] = (None),",
                                         function="pipeline_with_logprob")
    else:
        facts["code.sigmas"] = code_fact(
            checkout, script.pipeline,
            r"sigmas = (np\.linspace\(1\.0, 1 / num_inference_steps, num_inference_steps\)) if sigmas is None", convert=str)
        facts["code.time_shift"] = code_fact(checkout, script.pipeline, r"mu = (calculate_shift)\(", convert=str)
    # the timestep the rollout tells the transformer: the scheduler's t (FLUX's divided by 1000), whose dtype is
    # FlowMatchEulerDiscreteScheduler's (float: σ·1000, not an integer)
    rollout_t = code_fact(checkout, script.pipeline,
                          r"timestep = (t)\.expand\((?:latent_model_input|latents)\.shape\[0\]\)",
                          convert=_flow_match_timestep_dtype, function="pipeline_with_logprob")
    facts["code.rollout_timestep"] = Value(rollout_t.value, f"{rollout_t.source} (t: diffusers "
                                           "FlowMatchEulerDiscreteScheduler.timesteps, its dtype)")
    if "sample.sde_type" not in values:  # the script never passes sde_type: sde_step_with_logprob's default
        facts["code.sde_type"] = code_fact(checkout, SDE, r"sde_type: Optional\[str\] = '(\w+)'", convert=str,
                                          function="sde_step_with_logprob")
    if script.fast:
        # the SDE window: a new start per pipeline call (one sampling batch of one process), uniform in
        # [range[0], range[1] − size]; steps before and after it take noise level 0 (Euler)
        facts["code.window_draw"] = code_fact(checkout, script.pipeline, r"start = (random\.randint)\(", convert=str,
                                              function="pipeline_with_logprob")
        facts["code.window_start"] = code_fact(
            checkout, script.pipeline, r"start = (random\.randint\(sde_window_range\[0\], sde_window_range\[1\] - sde_window_size\))",
            convert=str)
    if script.guard:
        # GRPO-Guard's ratio: exp((lp − lp_old + mean(δ²)/(2s²))·s), s = mean √Δ · mean std_dev_t of the batch;
        # the bias term's mean(dim=tuple(range(1, log_prob.ndim))) is mean(dim=()) on the [B] log-prob: torch reduces
        # every dimension, so it is one number per training batch
        facts["code.guard_ratio"] = code_fact(
            checkout, s, r"ratio = torch\.exp\(\(log_prob - sample\[\"log_probs\"\]\[:, j\] \+ ratio_mean_bias\) \* \((sqrt_dt\.mean\(\) \* sigma_t)\)\)",
            convert=str)
        facts["code.guard_bias_reduce"] = code_fact(
            checkout, s, r"ratio_mean_bias = \(prev_sample_mean - sample\[\"prev_sample_mean\"\]\[:, j\]\)\.pow\(2\)\.mean\(dim=(tuple\(range\(1, log_prob\.ndim\)\))\)",
            convert=str)
        facts["code.guard_step_weight"] = code_fact(checkout, s, r"policy_loss = policy_loss / \((sqrt_dt\.mean\(\)\*\*2)\)",
                                                    convert=str)
    return facts


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    out = []
    for function, (config_file, script, model, rewards) in RUNS[preset].items():
        values, found = trace_ml_collections(checkout, config_file, function, locals_wanted={function: ["gpu_number"]})
        values["gpu_number"] = found[f"{function}.gpu_number"]
        values.update(code_facts(checkout, script, values))
        entry = code_fact(checkout, config_file, rf"^def ({function})\(", convert=str).source
        out.append(Launch(function, model, rewards, values, entry))
    return out
