"""BranchGRPO's launches (Fredreic1849/BranchGRPO): scripts/finetune/finetune_flux_branchgrpo_8gpus.sh over
fastvideo/train_branchgrpo_flux.py's argparse defaults, as the script runs (BranchGRPO) and with its
``MIX_ODE_SDE_TREE`` switch on (BranchGRPO-Mix: the same script, ``--mix_ode_sde_tree --mix_sde_window_size 4``), the
processes its torchrun starts, and the constants the training script hard-codes.

The launch script builds its command with bash: variables, ``if`` blocks that set flag strings, ``$( [[ ... ]] &&
echo ... )`` substitutions, and a variable it never sets (``$PRUNING_STEP_RATIO``). ``launch_arguments`` evaluates
exactly those constructs (no line of the script runs) and parses the resulting command line as argparse would."""

from __future__ import annotations

import re
import shlex

from official import Checkout, ExtractionError, Launch, epoch_sampler_facts, Value, argparse_defaults, code_fact, typed
from official.dancegrpo import _library_default_text_length

REPOSITORY = "Fredreic1849/BranchGRPO"
ENV = "BRANCHGRPO_PATH"
PRESETS = ("branchgrpo", "branchgrpo_mix")

SCRIPT = "fastvideo/train_branchgrpo_flux.py"
EMBED = "fastvideo/data_preprocess/preprocess_flux_embedding.py"
LAUNCHER = "scripts/finetune/finetune_flux_branchgrpo_8gpus.sh"
# preset -> (launch name, the launch script's variables as that run sets them, flowgrpo model config, rewards)
RUNS = {
    "branchgrpo": ("finetune_flux_branchgrpo_8gpus.sh", {}, "flux_dev", ["hpsv2"]),
    "branchgrpo_mix": ("finetune_flux_branchgrpo_8gpus.sh MIX_ODE_SDE_TREE=true", {"MIX_ODE_SDE_TREE": "true"},
                       "flux_dev", ["hpsv2"]),
}
NOTES = {
    "branchgrpo_mix": "BranchGRPO-Mix: the launch script with its switch MIX_ODE_SDE_TREE=true (line 32).",
}


# ---------------------------------------------------------------------------------------------- the launch script
def _logical_lines(text: str) -> list[tuple[int, list[tuple[str, int]]]]:
    """(first line, [(physical line text without comments, its line number)]) per logical line (backslash continued)."""
    out, pending = [], []
    for number, raw in enumerate(text.splitlines(), 1):
        body = _uncommented(raw)
        continued = body.rstrip().endswith("\\")
        pending.append((body.rstrip()[:-1] if continued else body, number))
        if not continued:
            out.append((pending[0][1], pending))
            pending = []
    if pending:
        out.append((pending[0][1], pending))
    return out


def _uncommented(line: str) -> str:
    """The line without its comment: from a ``#`` that starts a word outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def _expand(text: str, variables: dict, unset: set) -> str:
    """``$VAR`` / ``${VAR}`` replaced by their values; an unset variable expands to nothing (bash), and is noted."""
    def value(match):
        name = match.group(1) or match.group(2)
        if name not in variables:
            unset.add(name)
            return ""
        return variables[name][0]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)(?!\()", value, text)


def _condition(text: str, variables: dict, unset: set) -> bool:
    """A ``[[ ... ]]`` test of the forms the script uses: ``"$X" == "v"`` and ``-n "$X"``."""
    expanded = shlex.split(_expand(text, variables, unset))
    if len(expanded) == 3 and expanded[1] == "==":
        return expanded[0] == expanded[2]
    if len(expanded) == 2 and expanded[0] == "-n":
        return expanded[1] != ""
    if len(expanded) == 1 and text.strip().startswith("-n"):
        return False  # -n "" : the empty word vanished in the split
    raise ExtractionError(f"a [[ {text} ]] test this reader does not evaluate")


def launch_arguments(checkout: Checkout, launcher: str, marker: str, overrides: dict[str, str]):
    """The argv tokens after ``marker`` in ``launcher``'s training command as bash would build them, each with its line,
    the tokens before it (torchrun and its flags), the variables (name -> (value, line)) and the unset variables the
    command expands. ``overrides``: variables whose assignment takes another value (a run's switch)."""
    variables: dict[str, tuple[str, int]] = {}
    unset: set[str] = set()
    active = [True]  # the if-block stack: whether the current branch runs
    command = None
    for first, lines in _logical_lines(checkout.file(launcher).read_text()):
        text = " ".join(body for body, _ in lines).strip()
        branch = re.match(r'^if \[\[ (.+) \]\]; then$', text)
        if branch:
            active.append(active[-1] and _condition(branch.group(1), variables, unset))
            continue
        if text == "else":
            active[-1] = not active[-1] and active[-2]
            continue
        if text == "fi":
            active.pop()
            continue
        if not active[-1]:
            continue
        assignment = re.match(r'^(?:export\s+)?([A-Za-z_]\w*)=("[^"]*"|\S*)$', text)
        if assignment:
            name, raw = assignment.group(1), assignment.group(2)
            value = _expand(raw[1:-1] if raw.startswith('"') else raw, variables, unset)
            variables[name] = (overrides.get(name, value), first)
            continue
        if any(marker == token for body, _ in lines for token in body.split()):
            if command is not None:
                raise ExtractionError(f"{launcher}: two commands run {marker}")
            command = lines
    if command is None:
        raise ExtractionError(f"{launcher}: no command runs {marker}")
    missing = set(overrides) - set(variables)
    if missing:
        raise ExtractionError(f"{launcher} assigns no {sorted(missing)}")
    tokens: list[tuple[str, str]] = []  # (token, "line" or "line ($VAR = 'value', line n)")
    for body, number in command:
        def substitution(match):
            return match.group(2) if _condition(match.group(1), variables, unset) else ""

        body = re.sub(r"\$\(\s*\[\[ (.+?) \]\]\s*&&\s*echo (.+?)\s*\)", substitution, body)
        names = [a or b for a, b in re.findall(r"\$\{(\w+)\}|\$(\w+)", body)]
        where = str(number) + "".join(f" (${n} = {variables[n][0]!r}, line {variables[n][1]})" if n in variables
                                      else f" (${n} is never set)" for n in names)
        tokens += [(token, where) for token in shlex.split(_expand(body, variables, unset))]
    at = [i for i, (token, _) in enumerate(tokens) if token == marker][0]
    return tokens[:at], tokens[at + 1:], variables, unset


def argparse_run(checkout: Checkout, script: str, launcher: str, overrides: dict[str, str]):
    """Every argument of ``script`` as the launch runs it (the launcher's flag where it passes one, else the default),
    parsed as argparse parses the command line: a flag of a valued type takes the next token, a store_true flag none.
    A valued flag followed by nothing or by another flag (an unset variable) gets the default, its source saying so:
    argparse itself stops there ('expected one argument')."""
    arguments = argparse_defaults(checkout, script)
    launcher_tokens, argv, variables, unset = launch_arguments(checkout, launcher, script, overrides)
    passed: dict[str, Value] = {}
    k = 0
    while k < len(argv):
        flag, line = argv[k]
        if not flag.startswith("--"):
            raise ExtractionError(f"{launcher}:{line}: {flag!r} follows no flag")
        dest = flag[2:].replace("-", "_")
        if dest not in arguments:
            raise ExtractionError(f"{launcher}:{line} passes --{dest}, which {script} does not define")
        arg = arguments[dest]
        where = f"{launcher}:{line}"
        if arg.type == "bool":
            passed[dest] = Value(True, where)
            k += 1
            continue
        if k + 1 >= len(argv) or argv[k + 1][0].startswith("--"):
            passed[dest] = Value(arg.default, f"{where}: passed with no value, so argparse would stop with 'expected "
                                              f"one argument'; {script}:{arg.line} default")
            k += 1
            continue
        kind = arg.type if arg.type in ("int", "float") else "str"
        passed[dest] = Value(typed(argv[k + 1][0], kind), where)
        k += 2
    values = {}
    for dest, arg in sorted(arguments.items()):
        values[dest] = passed.get(dest, Value(arg.default, f"{script}:{arg.line} (default)"))
    processes = _torchrun_processes(launcher, launcher_tokens)
    return values, processes


def _torchrun_processes(launcher: str, tokens: list[tuple[str, str]]) -> Value:
    flags = {}
    for token, _ in tokens:
        match = re.match(r"^--(nnodes|nproc_per_node)=(\d+)$", token)
        if match:
            flags[match.group(1)] = int(match.group(2))
    if not tokens or tokens[0][0] != "torchrun" or "nproc_per_node" not in flags:
        raise ExtractionError(f"{launcher}: no torchrun --nproc_per_node in {[t for t, _ in tokens]}")
    return Value(flags.get("nnodes", 1) * flags["nproc_per_node"],
                 f"{launcher}:{tokens[0][1].split()[0]} (torchrun --nnodes={flags.get('nnodes', 1)} "
                 f"--nproc_per_node={flags['nproc_per_node']})")


# ---------------------------------------------------------------------------------------------------- code facts
def code_facts(checkout: Checkout) -> dict[str, Value]:
    """The constants train_branchgrpo_flux.py (and the embedding script) hard-code that change the run."""
    s = SCRIPT

    def fact(pattern, convert=str, function=None, relpath=s):
        return code_fact(checkout, relpath, pattern, convert, function)

    scored = r"# When prev_sample is not None, calculate log_prob for given prev_sample\n(?:.*\n){3}"
    return {
        # the prompts: one pass over the set at a time, from the file the embedding launch reads
        **epoch_sampler_facts(checkout, SCRIPT, "scripts/preprocess/preprocess_flux_rl_embeddings.sh", "--prompt_dir"),
        "code.sigma_grid": fact(r"sigma_schedule = torch\.(linspace)\(1, 0, args\.sampling_steps \+ 1\)\s*\n\s*\n?"
                                r"\s*sigma_schedule = sd3_time_shift\(args\.shift, sigma_schedule\)",
                                lambda _: "linear", "sample_reference_model_tree"),
        "code.time_shift": fact(r"return (\(shift \* t\) / \(1 \+ \(shift - 1\) \* t\))", function="sd3_time_shift"),
        # the SDE step (flux_step_with_split, sde_solver=True) and its log-prob
        "code.sde_std": fact(r"std_dev_t = (eta \* math\.sqrt\(delta_t\))", function="flux_step_with_split"),
        "code.sde_std_min": fact(r"std_dev_t = torch\.clamp\(.*, min=(1e-8)\)", float, "flux_step_with_split"),
        "code.sde_score": fact(r"score_estimate = (-\(latents-pred_original_sample\*\(1 - sigma\)\)/sigma\*\*2)",
                               function="flux_step_with_split"),
        "code.sde_drift": fact(r"log_term = (-0\.5 \* eta\*\*2 \* score_estimate)", function="flux_step_with_split"),
        "code.sde_solver": fact(r"grpo=True, sde_solver=(True), num_splits=num_splits,", lambda v: v == "True",
                                "run_tree_sample_step"),
        "code.log_prob": fact(scored + r"\s*\) (- torch\.log\(std_dev_t\) - 0\.5 \* torch\.log\(two_pi\))\n",
                              lambda _: "gaussian", "flux_step_with_split"),
        "code.log_prob_reduce": fact(scored + r".*\n\s*log_prob = log_prob\.(mean)\(dim=tuple\(range\(1, log_prob\.ndim\)\)\)",
                                     function="flux_step_with_split"),
        # the tree: K children at a split step, each drawn with its own noise times tree_split_noise_scale and scored
        # with the unscaled std
        "code.branch_factor": fact(r"num_splits = (\d+) if should_split else 1", int, "run_tree_sample_step"),
        "code.split_noise": fact(r"noise = torch\.randn_like\(prev_sample_mean\) \* (split_noise_scale)\n"
                                 r"\s*sample = prev_sample_mean \+ noise \* std_dev_t",
                                 lambda _: "independent draws times the scale, scored with the unscaled std",
                                 "flux_step_with_split"),
        # BranchGRPO-Mix: the SDE window's start is (i // stride) * stride of the step index i alone (stride =
        # depth_pruning_slide_interval), ODE (Euler) steps outside it and the split steps, only SDE edges trained
        "code.mix_window_start": fact(r"window_start = (\(i // stride\) \* stride)", function="run_tree_sample_step"),
        "code.mix_ode_step": fact(r"prev_sample_mean = node\.latent\.to\(torch\.float32\) \+ (dsigma \* pred)",
                                  lambda _: "euler", "run_tree_sample_step"),
        "code.mix_trained": fact(r'training_samples = \[s for s in training_samples if \(s\.get\("step", -1\) in (sde_steps)\)\]',
                                 lambda _: "edges of SDE steps only", "train_one_step_tree"),
        # which edges train: every edge of the tree, the last step's included
        "code.trained_edges": fact(r"def collect_all_transitions\(node\):\n\s*for child in node\.(children):",
                                   lambda _: "every edge, the last step's included", "train_one_step_tree"),
        # the transformer's inputs
        "code.guidance_rollout": fact(r"guidance=torch\.tensor\(\s*\[([\d.]+)\]", float, "run_tree_sample_step"),
        "code.guidance_training": fact(r"guidance=torch\.tensor\(\s*\[([\d.]+)\]", float, "grpo_one_step"),
        "code.timestep": fact(r"timestep_value = (int\(sigma \* 1000\))", function="run_tree_sample_step"),
        # the training forward's timestep: the same truncation of the edge's σ (grpo_one_step divides it by 1000)
        "code.timestep_training": fact(r"single_timestep = torch\.tensor\(\[(int\(sigma_schedule\[single_step\] \* 1000\))\]",
                                       lambda _: "int(sigma * 1000)", "train_one_step_tree"),
        "code.rewarded_sample": fact(r"latent = (pred_original)\[leaf_idx:leaf_idx\+1\]", function="sample_reference_model_tree"),
        "code.vae_scaling_factor": fact(r"unpacked_latent = \(unpacked_latent / ([\d.]+)\) \+ [\d.]+", float,
                                        "sample_reference_model_tree"),
        "code.vae_shift_factor": fact(r"unpacked_latent = \(unpacked_latent / [\d.]+\) \+ ([\d.]+)", float,
                                      "sample_reference_model_tree"),
        "code.initial_noise_dtype": fact(r"if args\.init_same_noise:\s*\n\s*input_latents = torch\.randn\(\s*\n[^\n]*\n"
                                         r"\s*device=device,\s*\n\s*dtype=torch\.(bfloat16),",
                                         function="sample_reference_model_tree"),
        # --init_same_noise with a process batch of several prompts: one x_T repeated for all of them
        "code.initial_noise_batch": fact(r"if len\(batch_idx\) > 1:\s*\n\s*input_latents = (input_latents\.repeat)"
                                         r"\(len\(batch_idx\), 1, 1, 1\)",
                                         lambda _: "one x_T for every prompt of a process's batch",
                                         "sample_reference_model_tree"),
        "code.node_latent_dtype": fact(r"child_latent = next_latents_for_node\[0:1\]\.to\(torch\.(bfloat16)\)",
                                       function="run_tree_sample_step"),
        # depth-wise advantages (use_group off): node value = mean of its leaves, z-scored over a tree's depth with
        # torch's (n - 1) std + 1e-8, 0 where that std is below 1e-6
        "code.node_value": fact(r"node\.reward = torch\.stack\(descendant_rewards\)\.(mean)\(\)",
                                function="compute_node_rewards_from_leaves"),
        "code.advantage_std": fact(r"std_reward = rewards\.(std)\(\)", lambda _: "torch.std (unbiased, n - 1)",
                                   "compute_hierarchical_advantages_by_depth"),
        "code.advantage_eps": fact(r"advantages = \(rewards - mean_reward\) / \(std_reward \+ (1e-8)\)", float,
                                   "compute_hierarchical_advantages_by_depth"),
        "code.advantage_zero_std": fact(r"if std_reward < (1e-6):", float, "compute_hierarchical_advantages_by_depth"),
        # the update: shuffled transitions, a step every gradient_accumulation_steps of them and one for the rest,
        # each transition's loss divided by GA x the mean trained transitions of a tree
        "code.update_split": fact(r"random\.(shuffle)\(training_samples\)", lambda _: "transitions", "train_one_step_tree"),
        "code.update_remainder": fact(r"if (len\(training_samples\) % args\.gradient_accumulation_steps != 0):",
                                      lambda _: "one more step for the remainder", "train_one_step_tree"),
        "code.loss_normalizer": fact(r"loss = torch\.mean\(torch\.maximum\(unclipped_loss, clipped_loss\)\) / "
                                     r"\((args\.gradient_accumulation_steps \* num_samples_per_step)\)",
                                     function="train_one_step_tree"),
        "code.ppo_loss": fact(r"^\s*loss = torch\.mean\(torch\.(maximum)\(unclipped_loss, clipped_loss\)\)",
                              lambda _: "plain", "train_one_step_tree"),
        # the loss is the clipped policy term alone (no KL term, no reference model); every transformer weight trains
        "code.loss_terms": fact(r"^\s*loss = (torch\.mean\(torch\.maximum\(unclipped_loss, clipped_loss\)\)) / ",
                                lambda _: "the clipped policy term alone (no KL)", "train_one_step_tree"),
        "code.trained_parameters": fact(r"params_to_optimize = (transformer\.parameters\(\))", lambda _: "full", "main"),
        # the optimizer and the precision
        "code.optimizer": fact(r"optimizer = torch\.optim\.(AdamW)\(", lambda v: v.lower(), "main"),
        "code.adam_betas": fact(r"betas=\((0\.9, 0\.999)\),", lambda v: [float(x) for x in v.split(",")], "main"),
        "code.adam_eps": fact(r"eps=(1e-8),", float, "main"),
        "code.weights_dtype": fact(r'subfolder="transformer",\s*\n\s*torch_dtype = torch\.(float32)', function="main"),
        "code.autocast_rollout": fact(r'with torch\.autocast\("cuda", torch\.(bfloat16)\):', function="run_tree_sample_step"),
        "code.autocast_training": fact(r'with torch\.autocast\("cuda", torch\.(bfloat16)\):', function="grpo_one_step"),
        "code.allow_tf32": fact(r"torch\.backends\.cuda\.matmul\.allow_tf32 = (True)", lambda v: v == "True", "main"),
        "code.hps_checkpoint": fact(r'^\s*cp = "\./hps_ckpt/(HPS_v2\.1_compressed\.pt)"', function="main"),
        "code.max_sequence_length": fact(r'pipe\.(encode_prompt)\(\s*\n\s*prompt=data\["caption"\], prompt_2=data\["caption"\]\s*\n\s*\)',
                                         _library_default_text_length, relpath=EMBED),
    }


def trained_transitions_per_tree(values: dict[str, Value]) -> Value:
    """The edges a tree trains: at step i every node of level i gets K children at a split step, else one; every edge
    trains (code.trained_edges), with --mix_ode_sde_tree only the edges of SDE steps (windows of mix_sde_window_size
    steps starting every depth_pruning_slide_interval steps, and the split steps: code.mix_trained). Derived from the
    launch's values, as the code counts them (len(training_samples) // trees)."""
    steps = int(values["sampling_steps"].value)
    splits = sorted({min(max(int(p), 0), steps - 1) for p in str(values["tree_split_points"].value).split(",")})
    branch = int(values["code.branch_factor"].value)
    trained = set(range(steps))
    if values["mix_ode_sde_tree"].value:
        stride = max(1, int(values["depth_pruning_slide_interval"].value))
        size = max(1, int(values["mix_sde_window_size"].value))
        trained = {s for start in range(0, steps, stride) for s in range(start, min(steps - 1, start + size - 1) + 1)}
        trained |= set(splits)
    nodes, edges = 1, 0
    for i in range(steps):
        nodes *= branch if i in splits else 1
        edges += nodes if i in trained else 0
    mix = " of its SDE steps" if values["mix_ode_sde_tree"].value else ""
    return Value(edges, f"derived: the edges{mix} of a {steps}-step tree split x{branch} at {splits} "
                        f"({values['tree_split_points'].source}, {values['code.trained_edges'].source})")


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    name, overrides, model, rewards = RUNS[preset]
    values, processes = argparse_run(checkout, SCRIPT, LAUNCHER, overrides)
    values["launch.processes"] = processes
    values.update(code_facts(checkout))
    values["launch.trained_transitions_per_tree"] = trained_transitions_per_tree(values)
    return [Launch(name, model, rewards, values, processes.source.split(" ")[0])]
