"""BranchGRPO and BranchGRPO-Mix against Fredreic1849/BranchGRPO's own tree sampler, step by step, on a tiny FLUX.

The official side runs the checkout's code, loaded at run time from ``BRANCHGRPO_PATH`` (nothing of it is part of this
project): from fastvideo/train_branchgrpo_flux.py the definitions of ``sample_reference_model_tree`` (the σ grid, x_T,
the tree of one prompt through ``run_tree_sample_step``: split steps, split noise, the -Mix window's ODE steps; the
decode of every leaf for its reward), ``flux_step_with_split``, ``TreeNode``, ``parse_split_points``, the depth-wise
advantages (``compute_node_rewards_from_leaves``, ``compute_hierarchical_advantages_by_depth``) and the helpers are
read with ``ast`` and executed with each launch's arguments (reproduce/official/branchgrpo.py: the launch script as it
runs, and with MIX_ODE_SDE_TREE=true), then the statements of ``train_one_step_tree`` from ``root_nodes = []`` to
``num_samples_per_step = ...``: the advantages of every node, the trained transitions (the -Mix filter, the pruning
switches), their shuffle and the loss's per-tree count. Its reward model is a stand-in; the advantages are compared
on one set of leaf rewards fed to both sides.

As in reproduce/parity/dancegrpo.py (whose tiny FLUX with FLUX's 16 latent channels, draw feeder, ``torch``
stand-in and rollout this uses): the same model, text embeddings, x_T and every SDE edge's ε on both sides (the
official ``randn_like`` of each node and child, in its order: node by node, child by child); the official bfloat16
casts (it stores every node's latent in bfloat16) run at float32.

flowgrpo's side is the preset's plan as its recipe resolves on FLUX.1-dev with ``sampling.plan.split_noise=
scaled_compat``, the code's split noise (each child μ + s·c·η_b with its own η_b, scored with s): flowgrpo's default is
the paper's correlated form, a deliberate difference (reproduce/official/map/branchgrpo.yaml, code.split_noise) that the
notes measure on flowgrpo's own default rollout. The rest is the recipe's: the float32 grid (grid linear_float32, whose
σ_6 = 0.87499994 as the official's), the network told ⌊1000σ⌋ (sampling.integer_timesteps, inside
``model.integer_timesteps`` as flowgrpo's rollout runs it), the last step trained (sampling.plan.train_last) and the
leaves' samples the last step's x̂0 (sampling.plan.leaf=predicted). Rows: one per step: σ → σ', whether each side draws
noise there and trains the step's edges, the largest |Δx'| over the level's nodes and |Δlog p| over its edges. Notes:
the rewarded samples, the depth-wise advantages of one set of leaf rewards (flowgrpo's ``credit.assign``,
advantage.std_correction), the trained transitions per tree, and controls with each option off (integer timesteps,
the float32 grid, the last step's training, the leaf rule, the std correction), each computed in the same run.
"""

from __future__ import annotations

import ast
import math
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Tuple

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # reproduce/: official, parity
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project: flowgrpo, samplers

from official import Checkout  # noqa: E402
from parity import MethodReport, StepRow, max_diff, tolerance  # noqa: E402
from parity.dancegrpo import (  # noqa: E402
    PROMPT, Feeder, VaeProbe, advantages, body_slice, launch_args, log_prob_tolerance, official_workdir, ours, progress,
    resolved, reward_standin, scored, tiny_flux, torch_standin,
)

SCRIPT = "fastvideo/train_branchgrpo_flux.py"
PRESETS = ("branchgrpo", "branchgrpo_mix")


class Official:
    """The checkout's tree sampler and the training step's selection of what trains, as the module docstring says."""

    DEFINITIONS = ["TreeNode", "sd3_time_shift", "flux_step_with_split", "assert_eq", "prepare_latent_image_ids",
                   "pack_latents", "unpack_latents", "parse_split_points", "run_tree_sample_step",
                   "compute_node_rewards_from_leaves", "compute_hierarchical_advantages_by_depth",
                   "sample_reference_model_tree"]

    def __init__(self, checkout: Checkout, args: SimpleNamespace):
        self.checkout, self.args = checkout, args
        path = checkout.file(SCRIPT)
        tree = ast.parse(path.read_text(), str(path))
        found = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        missing = sorted(set(self.DEFINITIONS + ["train_one_step_tree"]) - set(found))
        if missing:
            raise RuntimeError(f"{SCRIPT} no longer defines {missing}; this comparison reads them from there")
        self.definitions = ast.Module(body=[found[n] for n in self.DEFINITIONS], type_ignores=[])
        self.selection = ast.Module(body=body_slice(found["train_one_step_tree"], "root_nodes = []",
                                                    "num_samples_per_step = avg_samples_per_tree"), type_ignores=[])
        self.where = (f"{SCRIPT} sample_reference_model_tree, run_tree_sample_step, flux_step_with_split, TreeNode, "
                      "parse_split_points, compute_node_rewards_from_leaves, compute_hierarchical_advantages_by_depth; "
                      "train_one_step_tree from 'root_nodes = []' to 'num_samples_per_step = ...'")

    def namespace(self, feeder: Feeder) -> dict:
        from diffusers.image_processor import VaeImageProcessor
        from PIL import Image

        scope = {"torch": torch_standin(feeder), "math": math, "np": np, "os": __import__("os"), "tqdm": progress(feeder),
                 "VaeImageProcessor": VaeImageProcessor, "Image": Image, "List": List, "Dict": Dict, "Tuple": Tuple,
                 "main_print": lambda *args, **kwargs: None, "dist": SimpleNamespace(get_rank=lambda: 0),
                 "time": __import__("time")}
        exec(compile(self.definitions, str(self.checkout.file(SCRIPT)), "exec"), scope)
        return scope

    def sample(self, feeder: Feeder, transformer, vae, cond, caption: str):
        """sample_reference_model_tree for one prompt (use_group off: one tree per prompt, a batch of one)."""
        scope = self.namespace(feeder)
        model, tokenizer, preprocess = reward_standin()
        probe = VaeProbe(vae)
        with official_workdir(), torch.no_grad():
            rewards, path_log_probs, leaves, sigmas, _ = scope["sample_reference_model_tree"](
                self.args, "cpu", transformer, probe, cond.prompt_embeds[:1], cond.pooled_prompt_embeds[:1],
                torch.zeros(1, 3), model, tokenizer, [caption], preprocess)
        return SimpleNamespace(scope=scope, leaves=leaves, sigmas=sigmas, decoded=probe.decoded)

    def select(self, run, rewards: torch.Tensor) -> dict:
        """train_one_step_tree's statements on the tree: node advantages, the trained transitions, the per-tree count."""
        scope = dict(run.scope, args=self.args, leaf_nodes=run.leaves, rewards=rewards, current_step=1,
                     max_steps=self.args.max_train_steps, device="cpu")
        with torch.no_grad():
            exec(compile(self.selection, str(self.checkout.file(SCRIPT)), "exec"), scope)
        return scope


def levels_of(leaves: list) -> list[list]:
    """The official tree's nodes level by level, each level in creation order (parent order, then child order)."""
    root = leaves[0].get_path_from_root()[0]
    levels, level = [], [root]
    while level:
        levels.append(level)
        level = [child for node in level for child in node.children]
    return levels


def compare(checkout: Checkout, preset: str, folder: str, split_noise: str = "scaled_compat",
            overrides: tuple[str, ...] = ()) -> MethodReport:
    import official.branchgrpo as code

    from flowgrpo.engine.rollout import plan_schedule
    from flowgrpo.models.base import load_model

    name, _, model_name, rewards = code.RUNS[preset]
    more = "".join(f", {o}" for o in overrides)
    report = MethodReport("branchgrpo", f"{preset} (flux_dev recipe, split_noise={split_noise}{more})",
                          checkout.repository, checkout.commit_of(SCRIPT), "")
    cfg = resolved(preset, folder, rewards, (f"sampling.plan.split_noise={split_noise}",) + tuple(overrides), model_name)
    model = load_model(cfg.model)
    model.transformer.eval()
    cond = model.encode_prompts([PROMPT])
    channels, h, w = model.latent_shape()
    args = launch_args(checkout, code, preset, (h, w))
    official = Official(checkout, args)
    report.official = official.where + f"; {name} (h, w = {args.h}: the tiny latents)"

    mine = ours(cfg, model, cond)  # flowgrpo as its rollout runs: its draws are fed to the official code
    plan, record, T = mine.plan, mine.record, mine.plan.num_steps
    pack = official.namespace(Feeder([], []))["pack_latents"]

    def packed(x):  # [N, C, h, w] -> the official [N, tokens, 4C]
        return pack(x.to(torch.float32), x.shape[0], channels, h, w)

    # the official draw order: x_T, then step by step, node by node, child by child; scaled_compat's recorded ε is c·η
    stochastic = [i for i, s in enumerate(plan.steps) if s.stochastic]
    noise = []
    for i, eps in zip(stochastic, mine.draws):
        compat = plan.steps[i].branch > 1 and plan.steps[i].split_noise == "scaled_compat"
        scale = plan.steps[i].split_noise_scale if compat else 1.0
        noise += [packed(eps[e, f:f + 1] / scale) for e in range(eps.shape[0]) for f in range(eps.shape[1])]
    feeder = Feeder([record.root_state[:1].to(torch.float32)], noise)
    theirs = official.sample(feeder, model.transformer, model.vae, cond, PROMPT)
    levels = levels_of(theirs.leaves)
    leaf_rewards = torch.linspace(0.20, 0.31, len(levels[-1]))[
        torch.randperm(len(levels[-1]), generator=torch.Generator().manual_seed(0))]
    selection = official.select(theirs, leaf_rewards)
    feeder.used_up()

    sig = plan.sigmas.to(torch.float32).tolist()
    theirs_sig = theirs.sigmas.to(torch.float32).tolist()
    drawn = {step for _, step in feeder.tags}
    trained_theirs = {s["step"] for s in selection["training_samples"]}
    stored = {}  # flowgrpo's node id -> (step, stored log-prob) of every trained edge
    for node, step, lp in zip(record.node.tolist(), record.step.tolist(), record.log_prob.tolist()):
        stored[node] = (step, lp)
    first_id = [0]
    for i in range(T):
        first_id.append(first_id[-1] + (mine.states[i].shape[0]))
    restored = 0.0
    for i in range(T):
        x_ours = packed(mine.states[i + 1])
        x_theirs = torch.cat([n.latent.to(torch.float32) for n in levels[i + 1]])
        branch = plan.steps[i].branch
        row = StepRow(i, (sig[i], theirs_sig[i]), (sig[i + 1], theirs_sig[i + 1]),
                      (plan.steps[i].stochastic, i in drawn), (plan.steps[i].trained, i in trained_theirs),
                      max_diff(x_ours, x_theirs, f"x' of step {i}"), tolerance(torch.cat([x_ours, x_theirs])))
        if plan.steps[i].stochastic:
            parents = torch.arange(mine.states[i].shape[0]).repeat_interleave(branch)
            lp = scored(plan, cfg, i, mine.states[i][parents], mine.velocities[i][parents], mine.states[i + 1])
            lp_theirs = torch.cat([n.log_prob.reshape(1).to(torch.float32) for n in levels[i + 1]])
            for k in range(lp.shape[0]):
                node = first_id[i + 1] + k
                if node in stored:
                    restored = max(restored, abs(stored[node][1] - float(lp[k])))
            row.dlogp = max_diff(lp, lp_theirs, f"log p of step {i}")
            row.tol_logp = log_prob_tolerance(torch.cat([lp, lp_theirs]), plan, i)
        report.steps.append(row)
    report.notes.append(f"leaves: flowgrpo {mine.states[-1].shape[0]}, official {len(levels[-1])}; flowgrpo's log-prob of "
                        "every SDE edge by samplers.kernels.transition, the trained ones also as stored (largest stored - "
                        f"recomputed: {restored:.3g}); the official ODE edges' log-prob is a placeholder 0, not compared")
    per_tree = int(selection["num_samples_per_step"])
    report.notes.append(f"trained transitions per tree: the official code's {len(selection['training_samples'])} "
                        f"(its loss divides by GA x {per_tree}; the extraction derives "
                        f"{code.trained_transitions_per_tree(code.launches(checkout, preset)[0].values).value}), "
                        f"flowgrpo's {record.num_transitions}")
    no_last = plan_schedule(changed(cfg, train_last=False), model).plan(0)
    report.notes.append(f"control, sampling.plan.train_last=false: flowgrpo trains steps "
                        f"{[i for i, s in enumerate(no_last.steps) if s.trained]} (the official "
                        f"{sorted(trained_theirs)})")

    # the depth-wise advantages of one set of leaf rewards, as the trainer assigns them (each edge its child's)
    theirs_adv = selection["node_advantages"]
    node_of = {first_id[depth] + k: node.node_id for depth, nodes in enumerate(levels) for k, node in enumerate(nodes)}
    size_of = {first_id[depth] + k: len(nodes) for depth, nodes in enumerate(levels) for k, _ in enumerate(nodes)}
    _, edge_adv = advantages(cfg, record, plan, leaf_rewards)  # leaves in level order on both sides
    official_edge = torch.tensor([float(theirs_adv[node_of[n]]) for n in record.node.tolist()])
    report.notes.append(
        f"depth-wise advantages of one set of leaf rewards (credit.assign, advantage.std_correction="
        f"{cfg.advantage.std_correction}) of every trained edge: max |Δ| {max_diff(edge_adv, official_edge, 'adv'):.3g} "
        f"(tolerance {tolerance(torch.cat([edge_adv, official_edge])):.3g})")
    _, control = advantages(cfg, record, plan, leaf_rewards, std_correction=0)
    ratios = {}
    for n, a, b in zip(record.node.tolist(), control.tolist(), official_edge.tolist()):
        if abs(b) > 1e-6:
            ratios.setdefault(size_of[n], []).append(a / b)
    summary = sorted((n, round(sum(r) / len(r), 4)) for n, r in ratios.items())
    report.notes.append("control, std_correction=0: flowgrpo's / the official advantages per depth size "
                        f"(nodes, ratio): {summary} = sqrt(n/(n-1)): the population std")

    # the reward's samples: each leaf's last-step x̂0
    shift, scale = (code.code_facts(checkout)[k].value for k in ("code.vae_shift_factor", "code.vae_scaling_factor"))
    x0 = torch.cat([pack((d - shift) * scale, 1, channels, h, w) for d in theirs.decoded])
    leaves, last_x = packed(mine.leaf), packed(mine.states[-1])
    report.notes.append(
        f"the rewarded sample: flowgrpo's samples (sampling.plan.leaf={plan.leaf}) against the latents the official "
        f"code decodes (each leaf's last-step x̂0): max |Δ| {max_diff(leaves, x0, 'leaf'):.3g} (tolerance "
        f"{tolerance(torch.cat([leaves, x0])):.3g}); control, the leaf x' (leaf=sample): RMS "
        f"{float((last_x.double() - x0.double()).pow(2).mean().sqrt()):.3g} away"
        + (" (the last step is an ODE step here: the same up to rounding)" if not plan.steps[T - 1].stochastic else ""))

    # flowgrpo's default split noise (correlated, the paper's) on its own rollout, against the code's form
    default = ours(resolved(preset, folder, rewards, tuple(overrides), model_name), model, cond)
    splits = [i for i, s in enumerate(plan.steps) if s.branch > 1]

    def second_moment(run, lp_of):
        out = []
        for i in splits:
            step = run.plan.steps[i]
            std = float(kernel_std(step, sig[i], sig[i + 1]))
            lp = lp_of(run, i)
            out.append(float((-2 * (lp.double() + math.log(std) + 0.5 * math.log(2 * math.pi))).mean()))
        return sum(out) / len(out)

    def lp_run(run, i):
        parents = torch.arange(run.states[i].shape[0]).repeat_interleave(run.plan.steps[i].branch)
        return scored(run.plan, cfg, i, run.states[i][parents], run.velocities[i][parents], run.states[i + 1])

    theirs_m = second_moment(mine, lambda run, i: torch.cat([n.log_prob.reshape(1).float() for n in levels[i + 1]]))
    corr = []
    for i, eps in zip([j for j, s in enumerate(default.plan.steps) if s.stochastic], default.draws):
        if default.plan.steps[i].branch > 1:
            corr.append(float(torch.corrcoef(eps[:, :2].reshape(eps.shape[0], 2, -1).transpose(0, 1).reshape(2, -1))[0, 1]))
    c = plan.steps[splits[0]].split_noise_scale
    report.notes.append(
        f"split noise: E[((x' - μ)/s)²] over the split edges: the code's {theirs_m:.2f} (c² = {c * c:g}), flowgrpo's "
        f"default (correlated) {second_moment(default, lp_run):.2f} (1); siblings' noise correlation of flowgrpo's default "
        f"{sum(corr) / len(corr):.3f} (1/(1 + c²) = {1 / (1 + c * c):.3f}), the code's 0")
    if preset == "branchgrpo_mix":
        from flowgrpo.engine.rollout import plan_schedule

        schedule = plan_schedule(cfg, model)
        later = {it: [i for i, s in enumerate(schedule.plan(it).steps) if s.stochastic and s.branch == 1] for it in (0, 25, 50)}
        report.notes.append(f"the window (non-split SDE steps): the official's {sorted(drawn - set(splits))} in every "
                            f"iteration; flowgrpo's by iteration {later} (progressive, code.mix_window_start)")

    # the options off, one at a time: the network told 1000σ; the float64 linear grid (σ_6 = 0.875: timestep 875)
    top = max(float(torch.cat([n.latent.float() for n in level]).abs().max()) for level in levels)
    for what, change in (("sampling.integer_timesteps=false", dict(integer_timesteps=False)),
                         ("sampling.plan.grid=linear", dict(grid="linear"))):
        other = ours(changed(cfg, **change), model, cond)
        gaps = [max_diff(packed(other.states[i + 1]), torch.cat([n.latent.float() for n in levels[i + 1]]), "x'")
                for i in range(T)]
        tols = [tolerance(torch.cat([n.latent.float() for n in levels[i + 1]])) for i in range(T)]
        first = next((i for i in range(T) if gaps[i] > tols[i]), None)
        report.notes.append(f"control, {what}: max |Δx'| {max(gaps):.3g}, {max(gaps) / top:.2g} of max |x'|; first step "
                            f"beyond tolerance {first}")
    return report


def changed(cfg, integer_timesteps: bool | None = None, **plan):
    """``cfg`` with sampling.integer_timesteps and sampling.plan entries changed (a control)."""
    import dataclasses

    sampling = cfg.sampling
    if integer_timesteps is not None:
        sampling = dataclasses.replace(sampling, integer_timesteps=integer_timesteps)
    sampling = dataclasses.replace(sampling, plan={**sampling.plan, **plan})
    return dataclasses.replace(cfg, sampling=sampling)


def kernel_std(step, sigma: float, sigma_next: float) -> float:
    from samplers.kernels import kernel_coefficients

    return float(kernel_coefficients(step.kernel, sigma, sigma_next, step.eta)[2][0])


def run(checkout: Checkout, presets: tuple[str, ...] = PRESETS, split_noise: str = "scaled_compat",
        overrides: tuple[str, ...] = ()) -> list[MethodReport]:
    """One report per preset (``split_noise``: flowgrpo's split noise, the code's form by default; ``overrides``:
    more of flowgrpo's settings changed, a negative control)."""
    with tempfile.TemporaryDirectory(prefix="branchgrpo-parity-") as tmp:
        folder = tiny_flux(Path(tmp) / "tiny_flux_dev")
        return [compare(checkout, preset, folder, split_noise, overrides) for preset in presets]


if __name__ == "__main__":  # python reproduce/parity/branchgrpo.py (BRANCHGRPO_PATH set)
    from official.branchgrpo import ENV, REPOSITORY

    for r in run(Checkout.from_env(REPOSITORY, ENV)):
        print(r.line())
        for s in r.steps:
            if not s.ok:
                print("    differs:", s)
        for note in r.notes:
            print("    " + note)
