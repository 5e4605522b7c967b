"""AWM's launches (scxue/advantage_weighted_matching): the six launch scripts of the paper's SD3.5-Medium runs
(train_awm_scripts_{geneval,ocr,pickscore}/train_{single_node,multi_nodes}.sh), each the ml_collections config
function of config/dgx_awm.py it names run whole, its accelerate process count, and the constants the training
script, its pipeline, SA-Solver, EMA and advantage tracker hard-code.

The checkout (``AWM_PATH``) is the repository's root: the code lives under advantage_weighted_matching/, where the
launch scripts ``cd`` before training (the configs call ``os.getcwd()`` for their datasets there).
"""

from __future__ import annotations

import copy
import re

from official import (Checkout, ExtractionError, Launch, Value, code_fact, flow_grpo_reward_facts,
                      k_repeat_sampler_facts, trace_ml_collections)

REPOSITORY = "scxue/advantage_weighted_matching"
ENV = "AWM_PATH"
PRESETS = ("awm",)

CODE = "advantage_weighted_matching"
CONFIG = f"{CODE}/config/dgx_awm.py"
SCRIPT = f"{CODE}/scripts/train_sd3_awm.py"
PIPELINE = f"{CODE}/flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py"
SOLVER = f"{CODE}/flow_grpo/diffusers_patch/sa_solver.py"
EMA = f"{CODE}/flow_grpo/ema.py"
STATS = f"{CODE}/flow_grpo/stat_tracking.py"

# launch script -> (flowgrpo model config, flowgrpo rewards): the runs of the paper's tables; the config function
# each script trains with is read from the script itself
RUNS = {
    "train_awm_scripts_geneval/train_single_node.sh": ("sd3_5_medium", ["geneval"]),
    "train_awm_scripts_geneval/train_multi_nodes.sh": ("sd3_5_medium", ["geneval"]),
    "train_awm_scripts_ocr/train_single_node.sh": ("sd3_5_medium", ["ocr"]),
    "train_awm_scripts_ocr/train_multi_nodes.sh": ("sd3_5_medium", ["ocr"]),
    "train_awm_scripts_pickscore/train_single_node.sh": ("sd3_5_medium", ["pickscore"]),
    "train_awm_scripts_pickscore/train_multi_nodes.sh": ("sd3_5_medium", ["pickscore"]),
}

NOTES = {"awm": "Each config function of config/dgx_awm.py as its launch script runs it (1 node of 8 GPUs, or 4 nodes "
                 "of 8: the same 72 prompts x 24 samples an epoch, 24 x 24 for PickScore). `launch.*` keys come from "
                 "the launch script, `code.*` keys are constants of the training script, its pipeline, SA-Solver, "
                 "EMA and advantage tracker. `save_dir` is kept as the f-string the config writes (its value holds "
                 "the time of the extraction)."}


def _words(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def _uncommented(text: str) -> bool:
    """True where the captured prefix of a statement has no ``#``: the statement runs."""
    return "#" not in text


def code_facts(checkout: Checkout) -> dict[str, Value]:
    """The constants the training script, the pipeline, SA-Solver, the EMA and the advantage tracker fix, each at
    its line (``code.*`` keys)."""
    s, p, v = SCRIPT, PIPELINE, SOLVER
    text = str
    return {
        **k_repeat_sampler_facts(checkout, s),  # each rollout batch its own random prompts
        # the model and its LoRA (lora_type "attn" picks the first list)
        "code.pipeline_from_pretrained": code_fact(checkout, s, r"StableDiffusion3Pipeline\.from_pretrained\(\s*"
                                                   r"([\w.]+)\s*\)", text),
        "code.lora_rank": code_fact(checkout, s, r"LoraConfig\(\s*r=(\d+)"),
        "code.lora_alpha": code_fact(checkout, s, r"LoraConfig\([^)]*lora_alpha=(\d+)"),
        "code.lora_init": code_fact(checkout, s, r"LoraConfig\([^)]*init_lora_weights=\"(\w+)\"", text),
        "code.lora_target_modules_attn": code_fact(checkout, s, r"if config\.lora_type == \"attn\":\s*"
                                                   r"target_modules = (\[[^\]]*\])"),
        "code.kl_reference": code_fact(checkout, s, r"with transformer\.module\.(\w+)\(\):\s*log_prob_ref", text),
        "code.max_sequence_length": code_fact(checkout, s, r"compute_text_embeddings\(\s*prompts,\s*text_encoders,"
                                              r"\s*tokenizers,\s*max_sequence_length=(\d+)", function="main"),
        # the rollout: SA-Solver on the scheduler's sigmas, two end points edited, τ in a window of t
        "code.sa_grid_source": code_fact(checkout, p, r"t = (self\.scheduler\.sigmas)\.float\(\)", text),
        "code.sa_grid_last_divisor": code_fact(checkout, p, r"t\[-2\] = t\[-3\] / (\d+)"),
        "code.sa_grid_first_offset": code_fact(checkout, p, r"t\[0\] = 1 - ([\d.e-]+)"),
        "code.sa_tau_window_low": code_fact(checkout, p, r"lambda t: noise_level if ([\d.]+) <= t <= [\d.]+ else 0"),
        "code.sa_tau_window_high": code_fact(checkout, p, r"lambda t: noise_level if [\d.]+ <= t <= ([\d.]+) else 0"),
        "code.sa_predictor_order": code_fact(checkout, p, r"predictor_order=(\d+)"),
        "code.sa_corrector_order": code_fact(checkout, p, r"corrector_order=(\d+)"),
        "code.sa_pc_mode": code_fact(checkout, p, r"pc_mode='(\w+)'", text),
        "code.sa_algorithm_type": code_fact(checkout, v, r"algorithm_type=\"(\w+)\",\s*\):", text),
        "code.sa_disable_first_corrector": code_fact(checkout, v, r"disable_first_corrector = (True|False)"),
        "code.sa_skip_final_step": code_fact(checkout, v, r"skip_final_step = (True|False)"),
        "code.sa_lower_order_final": code_fact(checkout, v, r"lower_order_final = (True|False)"),
        "code.initial_noise_rows": code_fact(checkout, p, r"latents = self\.prepare_latents\(\s*"
                                             r"(batch_size \* num_images_per_prompt),", text),
        # what is trained: the first epochs, the training times, zero-advantage samples
        "code.skipped_epochs": code_fact(checkout, s, r"if epoch < (\d+):\s*continue\s*# sample"),
        "code.time_index_start_discrete": code_fact(checkout, s, r"elif config\.time_type == 'discrete':\s*"
                                                    r"boundaries = torch\.linspace\((\d+),"),
        "code.time_index_start_discrete_wo_init": code_fact(
            checkout, s, r"elif config\.time_type == 'discrete_wo_init':\s*boundaries = torch\.linspace\((\d+),"),
        "code.zero_advantage_samples_filtered": code_fact(
            checkout, s, r"^([ \t]*#?)[ \t]*samples = \{k: v\[mask\] for k, v in samples\.items\(\)\}", _uncommented),
        # the surrogate likelihood and its KL terms
        "code.ghuber_eps": code_fact(checkout, s, r"torch\.pow\(-log_prob \+ ([\d.e-]+), "
                                     r"config\.train\.ghuber_power\)"),
        "code.kl_ema_rate": code_fact(checkout, s, r"decay = min\(config\.train\.kl_ema_decay, "
                                      r"([\d.]+) \* global_step\)"),
        # the optimizer's learning-rate schedule and the evaluation EMA's warm-up
        "code.lr_eta_min_divisor": code_fact(checkout, s, r"eta_min=config\.train\.learning_rate / (\d+)"),
        "code.ema_warmup": code_fact(checkout, EMA, r"return min\(\s*(\(\d+ \+ optimization_step\) / "
                                     r"\(\d+ \+ optimization_step\)),\s*self\.decay", _words),
        # advantages: per-prompt mean over the global std plus this
        "code.advantage_std_eps": code_fact(checkout, STATS, r"std = np\.std\(rewards, axis=0, keepdims=True\) "
                                            r"\+ ([\d.e-]+)"),
    }


def launch_facts(checkout: Checkout, script: str) -> tuple[str, dict[str, Value]]:
    """(the config function the launch script trains with, its ``launch.*`` values: accelerate's process count,
    machine count where it passes one, and config file)."""
    function = code_fact(checkout, script, r"config/dgx_awm\.py:(\w+)\"", str).value
    values = {
        "launch.num_processes": code_fact(checkout, script, r"--num_processes[= ](\d+)"),
        "launch.accelerate_config": code_fact(checkout, script, r"--config_file \"\$\{PROJECT_ROOT\}/([^\"]+)\"", str),
    }
    if re.search(r"--num_machines", checkout.file(script).read_text()):
        values["launch.num_machines"] = code_fact(checkout, script, r"--num_machines (\d+)")
    return function, values


def _function_line(checkout: Checkout, function: str) -> str:
    return code_fact(checkout, CONFIG, rf"^def ({function})\(", str).source


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    facts = code_facts(checkout)
    out = []
    for script, (model, rewards) in RUNS.items():
        function, launch_values = launch_facts(checkout, script)
        values, found = trace_ml_collections(checkout, CONFIG, function, {function: ["gpu_numbers"]},
                                             cwd=str(checkout.path / CODE))
        gpus = found[f"{function}.gpu_numbers"]
        if gpus.value != launch_values["launch.num_processes"].value:
            raise ExtractionError(f"{CONFIG}: {function}() sizes its epoch for {gpus.value} GPUs, {script} runs "
                                  f"{launch_values['launch.num_processes'].value} processes")
        values["local.gpu_numbers"] = gpus
        # the save folder holds the time of the extraction: keep the f-string the config writes instead
        values["save_dir"] = code_fact(checkout, CONFIG, r"config\.save_dir = (f'[^']*')", str, function=function)
        values.update(launch_values)
        values.update(copy.deepcopy(facts))  # one object per launch: the data file has no YAML aliases
        values.update(flow_grpo_reward_facts(checkout, rewards, f"{CODE}/flow_grpo"))  # PickScore ÷ 26, OCR, GenEval
        out.append(Launch(function, model, rewards, values, _function_line(checkout, function)))
    return out


__all__ = ["ENV", "NOTES", "PRESETS", "REPOSITORY", "RUNS", "code_facts", "launches"]
