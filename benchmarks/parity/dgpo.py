"""DGPO's rollout against flowgrpo's ``dgpo`` preset, step by step (Luo-Yihong/DGPO).

The official side is loaded from the checkout at run time (``DGPO_PATH``, the repository's root): its
``pipeline_with_logprob`` (flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py), imported under a private package
name (every Flow-GRPO fork calls its package ``flow_grpo``), its launch config (config/dgpo.py, run by
benchmarks/official's ml_collections reader) for the values it passes (steps, guidance, noise level), and the
statements of scripts/train_sd3_dgpo.py's main() that set ``pipeline.scheduler`` (read by AST and executed): a
``DPMSolverMultistepScheduler.from_pretrained("Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers",
subfolder="scheduler")`` whose config's flow_shift is then overwritten (3) and rebuilt ``from_config``. That hub file
is not fetched: ``from_pretrained`` is answered with the scheduler diffusers' scripts/convert_sana_to_diffusers.py
saves for Sana's 1024px models, ``DPMSolverMultistepScheduler(flow_shift=3.0, use_flow_sigmas=True,
prediction_type="flow_prediction")`` (every other setting the class default: dpmsolver++, solver_order 2, midpoint,
lower_order_final, final_sigmas_type "zero"). Nothing of the checkout is copied.

The three Mode-1 launches (GenEval, OCR, PickScore) roll out alike (10 steps, CFG 4.5, that scheduler; PickScore's
group of 24 changes nothing step by step), so one rollout is compared, twice:

- ``recipe``: flowgrpo's plan as the preset's recipe resolves on sd3_5_medium (the ``ode`` plan: DPM-Solver++(2M),
  the linear grid, CFG 4.5), with the shipped tiny SD3's weights swapped in (a perturbed LoRA);
- ``proposed grid``: the same plan on the grid the official scheduler computes, built here from its definition
  (``dpmsolver_flow_grid``: t = 1 − linspace(1, 1/1000, T + 1), flipped, the last point dropped, shifted, 0
  appended): what samplers/grids.py would give with the spacing docs/official/map/dgpo.yaml proposes.

Both sides run the same transformer on the same text embeddings ([empty prompt; prompt] for CFG) from the same x_T;
the official pipeline computes its own grid (``retrieve_timesteps(scheduler, T, sigmas=None)``) and steps with
``scheduler.step`` (no noise). Per step: σ → σ', stochastic (neither), trained (neither) and x' = the state the next
transformer call evaluates (the last step: the returned sample). No log-probs (the official pipeline's are the
latents' means, not densities). As DiffusionNFT's, the official rollout calls the model at integer timesteps (the
scheduler's int64 timesteps, ⌊1000·σ⌋ of its float64 σ) where flowgrpo passes σ·1000: the compared flowgrpo rollout
floors them (``integer_timesteps``), and the notes give the difference without it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import torch

from parity import MethodReport, StepRow, tolerance
from parity.diffusion_nft import (PROMPTS, flowgrpo_rollout, flowgrpo_side, in_root_order, official_config, state,
                                  steps_of, transformer_inputs)

PATCH = "flow_grpo/diffusers_patch"
CONFIG = "config/dgpo.py"
SCRIPT = "scripts/train_sd3_dgpo.py"
REPOSITORY = "Luo-Yihong/DGPO"
LAUNCH = ("geneval", ["geneval"], "geneval_sd3_4gpu")  # (label, flowgrpo rewards, official config function)
# the scheduler diffusers' scripts/convert_sana_to_diffusers.py saves for Sana's 1024px checkpoints ("flow-dpm_solver")
SANA_SCHEDULER = dict(flow_shift=3.0, use_flow_sigmas=True, prediction_type="flow_prediction")
TRAIN_TIMESTEPS = 1000


# ---------------------------------------------------------------------------------------------------- the checkout
def load_official(checkout) -> SimpleNamespace:
    """The checkout's pipeline module, imported as a private package (``_dgpo_official_<n>``)."""
    folder = Path(checkout.path) / PATCH
    if not (folder / "sd3_pipeline_with_logprob.py").is_file() or not (Path(checkout.path) / SCRIPT).is_file():
        raise FileNotFoundError(f"{checkout.path} is not a checkout of {REPOSITORY} (no {PATCH}/"
                                f"sd3_pipeline_with_logprob.py or {SCRIPT})")
    name = f"_dgpo_official_{abs(hash(str(folder.resolve())))}"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    pipeline = importlib.import_module(f"{name}.sd3_pipeline_with_logprob")
    return SimpleNamespace(pipeline_with_logprob=pipeline.pipeline_with_logprob)


def official_scheduler(checkout):
    """The scheduler main() of scripts/train_sd3_dgpo.py installs: its ``pipeline.scheduler`` statements, executed
    with ``from_pretrained`` answered by SANA_SCHEDULER (see the module docstring); (scheduler, the source lines)."""
    from diffusers import DPMSolverMultistepScheduler

    path = Path(checkout.path) / SCRIPT
    tree = ast.parse(path.read_text(), str(path))
    main = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    statements = [s for s in (main[0].body if main else []) if isinstance(s, ast.Assign)
                  and any(ast.unparse(t).startswith("pipeline.scheduler") for t in s.targets)]
    if len(statements) != 3:
        raise LookupError(f"{SCRIPT}: {len(statements)} assignments to pipeline.scheduler in main() (expected 3: "
                          "from_pretrained, the flow_shift, from_config)")
    asked = []

    class Scheduler:
        @staticmethod
        def from_pretrained(repo, subfolder=None, **_):
            asked.append((repo, subfolder))
            return DPMSolverMultistepScheduler(**SANA_SCHEDULER)

        from_config = staticmethod(DPMSolverMultistepScheduler.from_config)

    space = {"pipeline": SimpleNamespace(scheduler=None), "DPMSolverMultistepScheduler": Scheduler}
    exec(compile(ast.Module(body=statements, type_ignores=[]), str(path), "exec"), space)  # noqa: S102
    if asked != [("Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers", "scheduler")]:
        raise LookupError(f"{SCRIPT}: the scheduler comes from {asked}, not Sana's 1024px scheduler config")
    return space["pipeline"].scheduler, [s.lineno for s in statements]


def dpmsolver_flow_grid(num_steps: int, shift: float) -> torch.Tensor:
    """σ [T + 1] float64 of DPMSolverMultistepScheduler with flow sigmas (the proposed samplers/grids.py spacing):
    t_i = 1 − a_i with a = linspace(1, 1/1000, T + 1), flipped so t runs from 0.999 down, its last point (t = 0)
    dropped, shifted σ = k·t/(1 + (k − 1)·t), then 0 appended; σ_0 = shift(0.999) < 1."""
    a = torch.linspace(1.0, 1.0 / TRAIN_TIMESTEPS, num_steps + 1, dtype=torch.float64)
    t = torch.flip(1.0 - a, [0])[:-1]
    sigmas = shift * t / (1.0 + (shift - 1.0) * t)
    return torch.cat([sigmas, torch.zeros(1, dtype=torch.float64)])


# ---------------------------------------------------------------------------------------------------- the rollout
def compare_rollout(checkout, official, grid: str, extra: tuple[str, ...] = ()) -> MethodReport:
    """The Mode-1 rollout with flowgrpo's plan on ``grid`` ("recipe" or "proposed"); see the module docstring."""
    label, rewards, function = LAUNCH
    config = official_config(checkout, function, CONFIG)
    cfg, model, plan = flowgrpo_side("dgpo", rewards, extra)
    if grid == "proposed":
        plan = dataclasses.replace(plan, sigmas=dpmsolver_flow_grid(plan.num_steps, plan.shift), unedited_sigmas=None)
    G, T = plan.roots_per_prompt, plan.num_steps
    cond = model.encode_prompts(list(PROMPTS))
    rec, ours_calls = flowgrpo_rollout(cfg, model, plan, cond, floor=True)
    rec_plain, plain_calls = flowgrpo_rollout(cfg, model, plan, cond, floor=False)
    x_T = rec.root_state
    n = x_T.shape[0]
    root_prompt = torch.arange(n) // G
    if not torch.equal(state(ours_calls[0], n), x_T):
        raise RuntimeError("flowgrpo's first model call is not at x_T in root order")
    scheduler, lines = official_scheduler(checkout)
    pipeline = model.pipeline
    own = pipeline.scheduler
    pipeline.scheduler = scheduler
    try:
        uncond = cond.unconditional()
        with torch.no_grad(), transformer_inputs(model.transformer) as theirs_calls:
            _, all_latents, _ = official.pipeline_with_logprob(
                pipeline, prompt_embeds=cond.prompt_embeds[root_prompt],
                pooled_prompt_embeds=cond.pooled_prompt_embeds[root_prompt],
                negative_prompt_embeds=uncond.prompt_embeds[root_prompt],
                negative_pooled_prompt_embeds=uncond.pooled_prompt_embeds[root_prompt],
                num_inference_steps=config.sample.num_steps, guidance_scale=config.sample.guidance_scale,
                output_type="pt", height=cfg.model.resolution, width=cfg.model.resolution, latents=x_T.clone(),
                noise_level=config.sample.noise_level, generator=None)
        theirs_grid = [float(s) for s in scheduler.sigmas.float()]
        theirs_t = [float(t) for t in scheduler.timesteps]
    finally:
        pipeline.scheduler = own
    sig = [float(s) for s in plan.sigmas.to(torch.float32)]
    if len(theirs_calls) != T or len(all_latents) != T + 1 or len(theirs_grid) != T + 1:
        raise RuntimeError(f"official: {len(theirs_calls)} model calls, {len(all_latents)} states, {len(theirs_grid)} "
                           f"grid points for flowgrpo's {T} steps")
    ours = steps_of(ours_calls, in_root_order(rec), n, T)
    plain = steps_of(plain_calls, in_root_order(rec_plain), n, T)
    theirs = [all_latents[i + 1] for i in range(T)]
    for i in range(T - 1):
        if not torch.equal(state(theirs_calls[i + 1], n), theirs[i].to(x_T)):
            raise RuntimeError(f"official step {i}: the stored state is not the next call's input")
    which = "recipe: linear grid" if grid == "recipe" else "proposed grid: DPM-Solver flow sigmas"
    report = MethodReport(
        "dgpo", f"dgpo rollout [{label}] ({which})", REPOSITORY, checkout.commit_of(SCRIPT),
        f"{PATCH}/sd3_pipeline_with_logprob.py pipeline_with_logprob; {SCRIPT}:{','.join(map(str, lines))} "
        f"(main(): the DPMSolverMultistepScheduler, flow_shift); config {CONFIG}:{function}")
    for i in range(T):
        report.steps.append(StepRow(
            step=i, sigma=(sig[i], theirs_grid[i]), sigma_next=(sig[i + 1], theirs_grid[i + 1]),
            stochastic=(plan.steps[i].stochastic, False), trained=(plan.steps[i].trained, False),
            dx=(ours[i].double() - theirs[i].double()).abs().max().item(), tol_x=tolerance(ours[i])))
    ours_t = [float(c[1].reshape(-1)[0]) for c in plain_calls]
    floored_t = [float(c[1].reshape(-1)[0]) for c in ours_calls]
    model_t = [float(c[1].reshape(-1)[0]) for c in theirs_calls]
    unfloored = max((p.double() - t.double()).abs().max().item() for p, t in zip(plain, theirs))
    spacing = "grid " + cfg.sampling.plan.get("grid", "linear") if grid == "recipe" else "dpmsolver_flow_grid"
    report.notes += [
        f"flowgrpo plan: {plan.name}, {T} steps, {spacing} (shift {plan.shift:g}), solver {plan.steps[0].solver}, "
        f"guidance {cfg.sampling.guidance_scale}, {G} samples x {len(PROMPTS)} prompts; official guidance "
        f"{config.sample.guidance_scale}, noise_level "
        f"{config.sample.noise_level} (unused by scheduler.step)",
        f"official scheduler {type(scheduler).__name__} flow_shift {scheduler.config.flow_shift:g}, grid "
        f"{[round(g, 6) for g in theirs_grid]}, timesteps {theirs_t}",
        f"timesteps the transformer gets: flowgrpo {[round(t, 3) for t in ours_t]} (floored for the comparison: "
        f"{floored_t}), official {model_t}",
        f"flowgrpo's rollout as it runs (timesteps not floored): max |x'_ours - x'_theirs| = {unfloored:.3g} over the "
        f"{T} steps (map: code.train_sigma, kind unsupported)",
    ]
    report.unfloored_dx = unfloored
    return report


def run(checkout) -> list[MethodReport]:
    official = load_official(checkout)
    return [compare_rollout(checkout, official, "recipe"), compare_rollout(checkout, official, "proposed")]


__all__ = ["compare_rollout", "dpmsolver_flow_grid", "load_official", "official_scheduler", "run"]
