"""DanceGRPO's launches (XueZeyue/DanceGRPO): the paper's FLUX.1-dev run, scripts/finetune/finetune_flux_grpo.sh over
fastvideo/train_grpo_flux.py's argparse defaults, the processes its torchrun starts, and the constants the training
script (and the prompt-embedding script it reads its text embeddings from) hard-code.

- ``dancegrpo``: that run;
- ``g2rpo``: G²RPO (bcmi/Granular-GRPO) is a fork of this FLUX training code that could only be read file by file
  here, not checked out, so its launches are DanceGRPO's, and the keys where its run differs are listed in the map.
"""

from __future__ import annotations

import ast
import inspect
import re

from official import Checkout, ExtractionError, Launch, epoch_sampler_facts, ShellCommand, Value, argparse_launch, code_fact

REPOSITORY = "XueZeyue/DanceGRPO"
ENV = "DANCEGRPO_PATH"
PRESETS = ("dancegrpo", "g2rpo")
NOTES = {
    "g2rpo": "G²RPO (Granular-GRPO, bcmi/Granular-GRPO) builds on DanceGRPO's FLUX training code (its "
             "fastvideo/train_g2rpo_hps.py is a fork of fastvideo/train_grpo_flux.py); its repository could only be "
             "read file by file here, not checked out, so these are DanceGRPO's launches. Where G²RPO's run "
             "(scripts/finetune/finetune_g2rpo_hps.sh) differs (an ODE trunk with one-step Flow-GRPO SDE branches at "
             "steps 0-7, 12 children each, lr 2e-6, an optimizer step per branch step) is listed in "
             "reproduce/official/map/dancegrpo.yaml; its multi-granularity advantage (each child finished by ODE at "
             "strides 1 and 2, each stride's rewards z-scored among the siblings and summed), which no DanceGRPO key "
             "carries, is built (the preset's sampling.plan.side_strides [1, 2]).",
}

SCRIPT = "fastvideo/train_grpo_flux.py"
EMBED = "fastvideo/data_preprocess/preprocess_flux_embedding.py"
# launch script -> (flowgrpo model config, flowgrpo rewards): the paper's FLUX.1-dev run (HPS-v2.1; the script passes
# --use_hpsv2 and the training script knows no CLIP reward). finetune_flux_grpo_8gpus.sh is the same run at 8 GPUs
# (2 prompts a GPU, 12 accumulation steps, gradient norm 0.01, EMA 0.995), not the paper's table.
RUNS = {"scripts/finetune/finetune_flux_grpo.sh": ("flux_dev", ["hpsv2"])}


def torchrun_processes(checkout: Checkout, launcher: str, command: ShellCommand) -> Value:
    """The processes ``torchrun`` starts: --nnodes x --nproc_per_node of the launch command (1 node when absent)."""
    flags = {}
    for token in command.program:
        match = re.match(r"^--(nnodes|nproc_per_node)=(\d+)$", token)
        if match:
            flags[match.group(1)] = int(match.group(2))
    if command.program[:1] != ["torchrun"] or "nproc_per_node" not in flags:
        raise ExtractionError(f"{launcher}:{command.line}: no torchrun --nproc_per_node in {command.program}")
    return Value(flags.get("nnodes", 1) * flags["nproc_per_node"],
                 f"{launcher}:{command.line} (torchrun --nnodes={flags.get('nnodes', 1)} "
                 f"--nproc_per_node={flags['nproc_per_node']})")


def _library_default_text_length(_: str) -> int:
    """FluxPipeline.encode_prompt's max_sequence_length default (the embedding script passes none)."""
    from diffusers import FluxPipeline

    return int(inspect.signature(FluxPipeline.encode_prompt).parameters["max_sequence_length"].default)


def code_facts(checkout: Checkout) -> dict[str, Value]:
    """The constants train_grpo_flux.py (and the embedding script) hard-code that change the run (``code.*`` keys)."""
    s = SCRIPT

    def fact(pattern, convert=str, function=None, relpath=s):
        return code_fact(checkout, relpath, pattern, convert, function)

    return {
        # the prompts: one pass over the set at a time, from the file the embedding launch reads
        **epoch_sampler_facts(checkout, SCRIPT, "scripts/preprocess/preprocess_flux_rl_embeddings.sh", "--prompt_dir"),
        # the σ grid: linspace(1, 0, T + 1), then the time shift with --shift
        "code.sigma_grid": fact(r"sigma_schedule = torch\.(linspace)\(1, 0, args\.sampling_steps \+ 1\)\s*\n\s*\n?"
                                r"\s*sigma_schedule = sd3_time_shift\(args\.shift, sigma_schedule\)",
                                lambda _: "linear", "sample_reference_model"),
        "code.time_shift": fact(r"return (\(shift \* t\) / \(1 \+ \(shift - 1\) \* t\))", function="sd3_time_shift"),
        # the SDE step (flux_step with sde_solver=True): its std, the score it corrects the mean with, the log-prob
        "code.sde_std": fact(r"std_dev_t = (eta \* math\.sqrt\(delta_t\))", function="flux_step"),
        "code.sde_score": fact(r"score_estimate = (-\(latents-pred_original_sample\*\(1 - sigma\)\)/sigma\*\*2)",
                               function="flux_step"),
        "code.sde_drift": fact(r"log_term = (-0\.5 \* eta\*\*2 \* score_estimate)", function="flux_step"),
        "code.sde_solver": fact(r"flux_step\(pred, z\.to\(torch\.float32\), args\.eta, sigmas=sigma_schedule, index=i, "
                                r"prev_sample=None, grpo=True, sde_solver=(True)\)", lambda v: v == "True",
                                "run_sample_step"),
        "code.log_prob": fact(r"(- math\.log\(std_dev_t\)- torch\.log\(torch\.sqrt\(2 \* torch\.as_tensor\(math\.pi\)\)\))",
                              lambda _: "gaussian", "flux_step"),
        "code.log_prob_reduce": fact(r"log_prob = log_prob\.(mean)\(dim=tuple\(range\(1, log_prob\.ndim\)\)\)",
                                     function="flux_step"),
        # the transformer's inputs: the embedded guidance, the timestep (σ·1000 truncated to an integer)
        "code.guidance_rollout": fact(r"guidance=torch\.tensor\(\s*\[([\d.]+)\]", float, "run_sample_step"),
        "code.guidance_training": fact(r"guidance=torch\.tensor\(\s*\[([\d.]+)\]", float, "grpo_one_step"),
        "code.timestep": fact(r"timestep_value = (int\(sigma \* 1000\))", function="run_sample_step"),
        # the training forward's timestep: the same truncation of each step's σ (grpo_one_step divides it by 1000)
        "code.timestep_training": fact(r"timestep_value = \[(int\(sigma \* 1000\)) for sigma in sigma_schedule\]",
                                       function="train_one_step"),
        # the sample the reward scores: the last step's x̂0 (pred_original), not the SDE's last x'
        "code.rewarded_sample": fact(r"^\s*latents = (pred_original)$", function="run_sample_step"),
        "code.vae_scaling_factor": fact(r"latents = \(latents / ([\d.]+)\) \+ [\d.]+", float, "sample_reference_model"),
        "code.vae_shift_factor": fact(r"latents = \(latents / [\d.]+\) \+ ([\d.]+)", float, "sample_reference_model"),
        # x_T: drawn in bfloat16 (one draw per process batch when --init_same_noise)
        "code.initial_noise_dtype": fact(r"if args\.init_same_noise:\s*\n\s*input_latents = torch\.randn\(\s*\n[^\n]*\n"
                                         r"\s*device=device,\s*\n\s*dtype=torch\.(bfloat16),", function="sample_reference_model"),
        # which steps train: the last step never (the [:, :-1] cut), of the rest a random permutation per sample,
        # its first int(T_cut · timestep_fraction)
        "code.untrained_last_steps": fact(r'"timesteps": timesteps\.detach\(\)\.clone\(\)\[:, :(-\d+)\]',
                                          lambda v: -int(v), "train_one_step"),
        "code.train_subset_count": fact(r'train_timesteps = (int\(len\(samples\["timesteps"\]\[0\]\)\*args\.timestep_fraction\))',
                                        function="train_one_step"),
        "code.train_subset_draw": fact(r'(torch\.randperm)\(len\(samples\["timesteps"\]\[0\]\)\)\s*\n\s*for _ in range\(batch_size\)',
                                       lambda _: "a random permutation per sample", "train_one_step"),
        # advantages (--use_group): (r − group mean)/(group std + 1e-8), torch's std: Bessel-corrected (n − 1)
        "code.advantage_std": fact(r"group_std = group_rewards\.(std)\(\) \+ 1e-8",
                                   lambda _: "torch.std (unbiased, n - 1)", "train_one_step"),
        "code.advantage_eps": fact(r"group_std = group_rewards\.std\(\) \+ (1e-8)", float, "train_one_step"),
        # the update: PPO's clipped loss, a mean over each step's transitions, a step every GA samples in order
        "code.ppo_loss": fact(r"loss = torch\.mean\(torch\.(maximum)\(unclipped_loss, clipped_loss\)\)",
                              lambda _: "plain", "train_one_step"),
        "code.loss_normalizer": fact(r"loss = torch\.mean\(torch\.maximum\(unclipped_loss, clipped_loss\)\) / "
                                     r"\((args\.gradient_accumulation_steps \* train_timesteps)\)", function="train_one_step"),
        "code.update_order": fact(r"for i,sample in list\(enumerate\((samples_batched_list)\)\):",
                                  lambda _: "samples in rollout order, a step every gradient_accumulation_steps of them",
                                  "train_one_step"),
        # the loss is the clipped policy term alone (no KL term, no reference model); every transformer weight trains
        "code.loss_terms": fact(r"^\s*loss = (torch\.mean\(torch\.maximum\(unclipped_loss, clipped_loss\)\)) / ",
                                lambda _: "the clipped policy term alone (no KL)", "train_one_step"),
        "code.trained_parameters": fact(r"params_to_optimize = (transformer\.parameters\(\))", lambda _: "full", "main"),
        # the optimizer and the precision: float32 master weights (FSDP, master_weight_type), bfloat16 autocast
        "code.optimizer": fact(r"optimizer = torch\.optim\.(AdamW)\(", lambda v: v.lower(), "main"),
        "code.adam_betas": fact(r"betas=(\(0\.9, 0\.999\)),", lambda v: list(ast.literal_eval(v)), "main"),
        "code.adam_eps": fact(r"eps=(1e-8),", float, "main"),
        "code.weights_dtype": fact(r'subfolder="transformer",\s*\n\s*torch_dtype = torch\.(float32)', function="main"),
        "code.autocast_rollout": fact(r'with torch\.autocast\("cuda", torch\.(bfloat16)\):', function="run_sample_step"),
        "code.autocast_training": fact(r'with torch\.autocast\("cuda", torch\.(bfloat16)\):', function="grpo_one_step"),
        "code.allow_tf32": fact(r"torch\.backends\.cuda\.matmul\.allow_tf32 = (True)", lambda v: v == "True", "main"),
        # the reward model (--use_hpsv2): HPS-v2.1's checkpoint
        "code.hps_checkpoint": fact(r'^\s*cp = "\./hps_ckpt/(HPS_v2\.1_compressed\.pt)"', function="main"),
        # the text embeddings it trains on: FluxPipeline.encode_prompt with its default T5 length
        "code.max_sequence_length": fact(r'pipe\.(encode_prompt)\(\s*\n\s*prompt=data\["caption"\], prompt_2=data\["caption"\]\s*\n\s*\)',
                                         _library_default_text_length, relpath=EMBED),
    }


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    facts = code_facts(checkout)
    out = []
    for launcher, (model, rewards) in RUNS.items():
        values, command = argparse_launch(checkout, SCRIPT, launcher, SCRIPT)
        values["launch.processes"] = torchrun_processes(checkout, launcher, command)
        values.update(facts)
        out.append(Launch(launcher.rsplit("/", 1)[-1], model, rewards, values, f"{launcher}:{command.line}"))
    return out
