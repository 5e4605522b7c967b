"""DGPO's rollout against flowgrpo's ``dgpo`` preset, step by step (Luo-Yihong/DGPO).

The official side is loaded from the checkout at run time (``DGPO_PATH``, the repository's root): its
``pipeline_with_logprob`` (flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py), imported under a private package
name (every Flow-GRPO fork calls its package ``flow_grpo``), its launch config (config/dgpo.py, run by
reproduce/official's ml_collections reader) for the values it passes (steps, guidance, noise level), and the
statements of scripts/train_sd3_dgpo.py's main() that set ``pipeline.scheduler`` (read by AST and executed): a
``DPMSolverMultistepScheduler.from_pretrained("Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers",
subfolder="scheduler")`` whose config's flow_shift is then overwritten (3) and rebuilt ``from_config``. That hub file
is not fetched: ``from_pretrained`` is answered with the scheduler diffusers' scripts/convert_sana_to_diffusers.py
saves for Sana's 1024px models, ``DPMSolverMultistepScheduler(flow_shift=3.0, use_flow_sigmas=True,
prediction_type="flow_prediction")`` (every other setting the class default: dpmsolver++, solver_order 2, midpoint,
lower_order_final, final_sigmas_type "zero"). Nothing of the checkout is copied.

The three Mode-1 launches (GenEval, OCR, PickScore) roll out alike (10 steps, CFG 4.5, that scheduler; PickScore's
group of 24 changes nothing step by step), so one rollout is compared: flowgrpo's plan as the preset's recipe resolves
on sd3_5_medium (the ``ode`` plan: DPM-Solver++(2M), ``sampling.plan.grid=dpmsolver``, CFG 4.5,
``sampling.integer_timesteps``), with the shipped tiny SD3's weights swapped in (a perturbed LoRA).

Both sides run the same transformer on the same text embeddings ([empty prompt; prompt] for CFG) from the same x_T;
the official pipeline computes its own grid (``retrieve_timesteps(scheduler, T, sigmas=None)``) and steps with
``scheduler.step`` (no noise). Per step: σ → σ', stochastic (neither), trained (neither) and x' = the state the next
transformer call evaluates (the last step: the returned sample). No log-probs (the official pipeline's are the
latents' means, not densities). The official rollout tells the model its scheduler's int64 timesteps (⌊1000·σ⌋ of
its float64 σ) while stepping the float σ; flowgrpo's rollout runs inside
``model.integer_timesteps(cfg.sampling.integer_timesteps)`` as flowgrpo/engine/rollout.py does, and the notes give
the timesteps both sides told the model.

``training_times`` (in the notes for the three launches): the times the official training mixes x_t at (its stored
int64 timesteps / 1000) against those flowgrpo's forward learner draws (the grid's own σ), the one difference left
(reproduce/official/map/dgpo.yaml code.train_sigma, kind unsupported).
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import torch

from parity import MethodReport, StepRow, import_folder, tolerance
from parity.diffusion_nft import (PROMPTS, flowgrpo_rollout, flowgrpo_side, in_root_order, official_config, state,
                                  steps_of, transformer_inputs)

PATCH = "flow_grpo/diffusers_patch"
CONFIG = "config/dgpo.py"
SCRIPT = "scripts/train_sd3_dgpo.py"
REPOSITORY = "Luo-Yihong/DGPO"
LAUNCH = ("geneval", ["geneval"], "geneval_sd3_4gpu")  # (label, flowgrpo rewards, official config function)
# the scheduler diffusers' scripts/convert_sana_to_diffusers.py saves for Sana's 1024px checkpoints ("flow-dpm_solver")
SANA_SCHEDULER = dict(flow_shift=3.0, use_flow_sigmas=True, prediction_type="flow_prediction")


# ---------------------------------------------------------------------------------------------------- the checkout
def load_official(checkout) -> SimpleNamespace:
    """The checkout's pipeline module, imported as a private package (``_dgpo_official_<n>``)."""
    folder = Path(checkout.path) / PATCH
    if not (folder / "sd3_pipeline_with_logprob.py").is_file() or not (Path(checkout.path) / SCRIPT).is_file():
        raise FileNotFoundError(f"{checkout.path} is not a checkout of {REPOSITORY} (no {PATCH}/"
                                f"sd3_pipeline_with_logprob.py or {SCRIPT})")
    (pipeline,) = import_folder(folder, "dgpo", "sd3_pipeline_with_logprob")
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


# ---------------------------------------------------------------------------------------------------- the rollout
def compare_rollout(checkout, official, extra: tuple[str, ...] = ()) -> MethodReport:
    """The Mode-1 rollout with flowgrpo's plan as the recipe resolves it (``extra``: further overrides of flowgrpo's
    side, for negative controls); see the module docstring."""
    label, rewards, function = LAUNCH
    config = official_config(checkout, function, CONFIG)
    cfg, model, plan = flowgrpo_side("dgpo", rewards, extra)
    G, T = plan.roots_per_prompt, plan.num_steps
    cond = model.encode_prompts(list(PROMPTS))
    rec, ours_calls = flowgrpo_rollout(cfg, model, plan, cond)
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
    theirs = [all_latents[i + 1] for i in range(T)]
    for i in range(T - 1):
        if not torch.equal(state(theirs_calls[i + 1], n), theirs[i].to(x_T)):
            raise RuntimeError(f"official step {i}: the stored state is not the next call's input")
    grid = cfg.sampling.plan.get("grid", "linear")
    report = MethodReport(
        "dgpo", f"dgpo rollout [{label}] ({type(scheduler).__name__}, {T} steps)", REPOSITORY,
        checkout.commit_of(SCRIPT),
        f"{PATCH}/sd3_pipeline_with_logprob.py pipeline_with_logprob; {SCRIPT}:{','.join(map(str, lines))} "
        f"(main(): the DPMSolverMultistepScheduler, flow_shift); config {CONFIG}:{function}")
    for i in range(T):
        report.steps.append(StepRow(
            step=i, sigma=(sig[i], theirs_grid[i]), sigma_next=(sig[i + 1], theirs_grid[i + 1]),
            stochastic=(plan.steps[i].stochastic, False), trained=(plan.steps[i].trained, False),
            dx=(ours[i].double() - theirs[i].double()).abs().max().item(), tol_x=tolerance(ours[i])))
    ours_t = [float(c[1].reshape(-1)[0]) for c in ours_calls]
    model_t = [float(c[1].reshape(-1)[0]) for c in theirs_calls]
    report.notes += [
        f"flowgrpo plan: {plan.name}, {T} steps, grid {grid} (shift {plan.shift:g}), solver {plan.steps[0].solver}, "
        f"guidance {cfg.sampling.guidance_scale}, {G} samples x {len(PROMPTS)} prompts; official guidance "
        f"{config.sample.guidance_scale}, noise_level "
        f"{config.sample.noise_level} (unused by scheduler.step)",
        f"official scheduler {type(scheduler).__name__} flow_shift {scheduler.config.flow_shift:g}, grid "
        f"{[round(g, 6) for g in theirs_grid]}, timesteps {theirs_t}",
        f"timesteps the transformer gets: flowgrpo {ours_t} (sampling.integer_timesteps="
        f"{cfg.sampling.integer_timesteps}), official {model_t}",
    ]
    return report


# ---------------------------------------------------------------------------------------------------- training times
LAUNCHES = {"geneval": ("geneval_sd3_4gpu", ["geneval"]), "ocr": ("general_ocr_sd3_4gpu", ["ocr"]),
            "pickscore": ("pickscore_sd3_4gpu", ["pickscore"])}


def training_times(checkout, launch: str, epochs: int = 64) -> dict:
    """The times a launch trains at, official against flowgrpo's (reproduce/official/map/dgpo.yaml code.train_sigma,
    learner.integer_times). Official: its scheduler's stored int64 timesteps of the grid indices 0..trunc_steps (its
    training loop's ``range(config.trunc_steps + 1)``), divided by 1000 (``sigmas_t = t / 1000``; the model is told t).
    flowgrpo: every time its forward learner draws (``ForwardLearner.draws`` over ``epochs`` inner epochs, on the
    ``DrawSpace`` of the recipe's plan), the model told the nearest integer to 1000·t. Returns both lists
    (descending) and their gaps."""
    from flowgrpo.engine.learners.forward import DrawSpace, ForwardLearner

    function, rewards = LAUNCHES[launch]
    config = official_config(checkout, function, CONFIG)
    scheduler, _ = official_scheduler(checkout)
    scheduler.set_timesteps(config.sample.num_steps)
    theirs_t = scheduler.timesteps[: config.trunc_steps + 1]
    cfg, model, plan = flowgrpo_side("dgpo", rewards)
    space = DrawSpace.of(SimpleNamespace(plan=plan, iteration=0), tuple(model.latent_shape()))
    learner, drawn = SimpleNamespace(cfg=cfg), set()
    for epoch in range(epochs):
        t, _ = ForwardLearner.draws(learner, SimpleNamespace(key=(0, 0)), epoch, space)
        drawn |= {float(x) for x in t}
    ours = sorted(drawn, reverse=True)
    theirs = [float(t) / 1000 for t in theirs_t.double()]
    gaps = [a - b for a, b in zip(ours, theirs)] if len(ours) == len(theirs) else None
    return {"launch": function, "official_timesteps": [int(t) for t in theirs_t], "official": theirs,
            "flowgrpo": ours, "flowgrpo_model_time": [round(1000 * t) if cfg.learner.integer_times else 1000 * t
                                                      for t in ours], "gaps": gaps,
            "integer_timesteps": cfg.sampling.integer_timesteps}


def run(checkout) -> list[MethodReport]:
    report = compare_rollout(checkout, load_official(checkout))
    for launch in LAUNCHES:
        times = training_times(checkout, launch)
        gaps = times["gaps"]
        report.notes.append(
            f"training times [{launch}] (map: code.train_sigma, learner.integer_times): official t/1000 "
            f"{[round(t, 6) for t in times['official']]}, flowgrpo's forward learner "
            f"{[round(t, 6) for t in times['flowgrpo']]}"
            + (f", largest gap {max(abs(g) for g in gaps):.2g}" if gaps else ", not the same grid points"))
    return [report]


__all__ = ["LAUNCHES", "compare_rollout", "load_official", "official_scheduler", "run", "training_times"]
