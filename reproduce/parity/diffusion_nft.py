"""DiffusionNFT's rollout against flowgrpo's ``diffusion_nft`` preset, step by step (NVlabs/DiffusionNFT).

The official side is loaded from the checkout at run time (``DIFFUSION_NFT_PATH``, the repository's root): its
``pipeline_with_logprob`` (flow_grpo/diffusers_patch/pipeline_with_logprob.py) with its solver module (solver.py:
``run_sampling``, ``dpm_step``), imported under a private package name (every Flow-GRPO fork calls its package
``flow_grpo``), and its launch configs (config/nft.py, run by reproduce/official's ml_collections reader) for the
values it passes (steps, guidance, noise level, deterministic, solver). Nothing of the checkout is copied.

For each compared launch (the GenEval/OCR/PickScore/HPSv2 runs share one rollout: 10 steps; the multi-reward run
takes 25), flowgrpo's plan is the preset's recipe as it resolves on sd3_5_medium for that launch's rewards (the ``ode``
plan: DPM-Solver++(2M), the scheduler's grid, no CFG), with the shipped tiny SD3's weights swapped in (a perturbed
LoRA, so the adapter acts; its scheduler is FlowMatchEulerDiscreteScheduler with shift 3, as SD3.5's). Both sides run
the same transformer on the same text embeddings from the same x_T; the official pipeline computes its own grid
(``retrieve_timesteps(scheduler, T, sigmas=None)``) and steps with ``dpm_step`` (deterministic=True: the two
``torch.randn_like`` draws of its first and last DDIM steps are multiplied by 0; its second step takes the
second-order formula with the previous σ = 1, whose λ is −∞, so D1 = 0: first order, as flowgrpo's dpmpp_2m falls
back to there). Per step: σ → σ' of each side,
stochastic (neither), trained (neither: the rollout stores no transition; DiffusionNFT trains the clean samples) and
x' = the state the next transformer call evaluates (the last step: the returned sample). No log-probs.

The official ``v_pred_fn`` gives the transformer ``torch.full(.., sigma * 1000, dtype=torch.long)``, the timestep
truncated to an integer, while ``dpm_step`` steps the float σ: the recipe's ``sampling.integer_timesteps`` (true on
SD3, reproduce/official/map/diffusion_nft.yaml code.rollout_timestep_dtype), which flowgrpo's rollout applies here as
flowgrpo/engine/rollout.py does (``model.integer_timesteps(cfg.sampling.integer_timesteps)`` around the rollout).
The notes give the timesteps both sides told the model.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import torch

from parity import MethodReport, StepRow, import_folder, nested, tiny_sd3_recipe, tolerance

PATCH = "flow_grpo/diffusers_patch"
CONFIG = "config/nft.py"
REPOSITORY = "NVlabs/DiffusionNFT"
# (label, flowgrpo rewards, official config function): the rollouts compared
ROLLOUTS = (("geneval", ["geneval"], "sd3_geneval"), ("several", ["pickscore", "hpsv2", "clipscore"], "sd3_multi_reward"))
PROMPTS = ("a red cube", "two green cones")
GROUP = 2  # samples per prompt on both sides (the recipe's 24 changes nothing step by step)


# ---------------------------------------------------------------------------------------------------- the checkout
def load_official(checkout) -> SimpleNamespace:
    """The checkout's pipeline and solver modules, imported as a private package (``_nft_official_<n>``)."""
    folder = Path(checkout.path) / PATCH
    if not (folder / "pipeline_with_logprob.py").is_file() or not (folder / "solver.py").is_file():
        raise FileNotFoundError(f"{checkout.path} is not a checkout of {REPOSITORY} (no {PATCH}/pipeline_with_logprob.py "
                                "or solver.py)")
    pipeline, solver = import_folder(folder, "nft", "pipeline_with_logprob", "solver")
    return SimpleNamespace(pipeline_with_logprob=pipeline.pipeline_with_logprob, solver=solver)


def official_config(checkout, function: str, config_file: str = CONFIG) -> SimpleNamespace:
    """The launch config ``function`` of ``config_file`` (config/nft.py), run by the ml_collections reader, as nested
    namespaces (config.sample.num_steps ...)."""
    from official import trace_ml_collections

    values, _ = trace_ml_collections(checkout, config_file, function)
    return nested({k: v.value for k, v in values.items()})


# ---------------------------------------------------------------------------------------------------- both sides
def flowgrpo_side(preset: str, rewards: list[str], extra: tuple[str, ...] = ()):
    """``preset``'s recipe for ``rewards`` on the tiny SD3 (``parity.tiny_sd3_recipe``), groups of GROUP."""
    return tiny_sd3_recipe(preset, rewards, (f"sampling.plan.group_size={GROUP}", *extra))


@contextlib.contextmanager
def transformer_inputs(transformer):
    """Inside, every transformer call's (hidden_states, timestep) is kept, in order (a CFG call's [uncond; cond]
    halves both: ``first_half`` takes the state)."""
    calls = []

    def hook(module, args, kwargs):
        x = kwargs.get("hidden_states", args[0] if args else None)
        calls.append((x.detach().clone(), torch.as_tensor(kwargs["timestep"]).detach().clone()))

    handle = transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def state(call, n: int) -> torch.Tensor:
    """The state a transformer call evaluates: its hidden states' first n rows (a CFG call repeats them)."""
    return call[0][:n]


def flowgrpo_rollout(cfg, model, plan, cond):
    """flowgrpo's rollout of ``plan`` for PROMPTS: (record, the transformer calls). As flowgrpo/engine/rollout.py runs
    it: inside ``model.integer_timesteps(cfg.sampling.integer_timesteps)`` (the recipe's integer model timesteps)."""
    import samplers

    velocity = model.velocity_fn(cond, cfg.sampling.guidance_scale)
    with torch.no_grad(), model.integer_timesteps(cfg.sampling.integer_timesteps), \
            transformer_inputs(model.transformer) as calls:
        rec = samplers.rollout(velocity, plan, prompt_ids=list(range(len(PROMPTS))), latent_shape=model.latent_shape(),
                               seed=cfg.train.seed, iteration=0, transitions=False)
    return rec, calls


def in_root_order(rec) -> torch.Tensor:
    leaves = torch.empty_like(rec.leaf_state)
    leaves[rec.leaf_root] = rec.leaf_state
    return leaves


def steps_of(calls, final: torch.Tensor, n: int, T: int) -> list[torch.Tensor]:
    """x' of every step: the next call's state, the returned sample after the last."""
    if len(calls) != T:
        raise RuntimeError(f"{len(calls)} transformer calls for {T} steps")
    return [state(calls[i + 1], n) if i + 1 < T else final for i in range(T)]


def compare_rollout(checkout, official, label: str, rewards: list[str], function: str,
                    extra: tuple[str, ...] = ()) -> MethodReport:
    """One launch's rollout (see the module docstring)."""
    config = official_config(checkout, function)
    cfg, model, plan = flowgrpo_side("diffusion_nft", rewards, extra)
    G, T = plan.roots_per_prompt, plan.num_steps
    cond = model.encode_prompts(list(PROMPTS))
    rec, ours_calls = flowgrpo_rollout(cfg, model, plan, cond)
    x_T = rec.root_state  # [P·G, *latent], prompt-major
    n = x_T.shape[0]
    root_prompt = torch.arange(n) // G
    if not torch.equal(state(ours_calls[0], n), x_T):
        raise RuntimeError("flowgrpo's first model call is not at x_T in root order")
    pipeline = model.pipeline
    with torch.no_grad(), transformer_inputs(model.transformer) as theirs_calls:
        _, all_latents, _ = official.pipeline_with_logprob(
            pipeline, prompt_embeds=cond.prompt_embeds[root_prompt], pooled_prompt_embeds=cond.pooled_prompt_embeds[root_prompt],
            negative_prompt_embeds=cond.unconditional().prompt_embeds[root_prompt],
            negative_pooled_prompt_embeds=cond.unconditional().pooled_prompt_embeds[root_prompt],
            num_inference_steps=config.sample.num_steps, guidance_scale=config.sample.guidance_scale, output_type="pt",
            height=cfg.model.resolution, width=cfg.model.resolution, latents=x_T.clone(),
            noise_level=config.sample.noise_level, deterministic=config.sample.deterministic,
            solver=config.sample.solver, model_type="sd3")
    grid = [float(s) for s in pipeline.scheduler.sigmas.float()]
    sig = [float(s) for s in plan.sigmas.to(torch.float32)]
    if len(theirs_calls) != T or len(all_latents) != T + 1 or len(grid) != T + 1:
        raise RuntimeError(f"official: {len(theirs_calls)} model calls, {len(all_latents)} states, {len(grid)} grid "
                           f"points for flowgrpo's {T} steps")
    ours = steps_of(ours_calls, in_root_order(rec), n, T)
    theirs = [all_latents[i + 1] for i in range(T)]
    for i in range(T - 1):  # the official list of states is what its next call evaluates
        if not torch.equal(state(theirs_calls[i + 1], n), theirs[i].to(x_T)):
            raise RuntimeError(f"official step {i}: the stored state is not the next call's input")
    report = MethodReport(
        "diffusion_nft", f"diffusion_nft rollout [{label}] ({config.sample.solver}, {T} steps)", REPOSITORY,
        checkout.commit_of(f"{PATCH}/solver.py"),
        f"{PATCH}/pipeline_with_logprob.py pipeline_with_logprob (deterministic={config.sample.deterministic}, "
        f"solver={config.sample.solver!r}), {PATCH}/solver.py run_sampling/dpm_step; config {CONFIG}:{function}")
    for i in range(T):
        report.steps.append(StepRow(
            step=i, sigma=(sig[i], grid[i]), sigma_next=(sig[i + 1], grid[i + 1]),
            stochastic=(plan.steps[i].stochastic, not config.sample.deterministic),
            trained=(plan.steps[i].trained, False),
            dx=(ours[i].double() - theirs[i].double()).abs().max().item(), tol_x=tolerance(ours[i])))
    ours_t = [float(c[1].reshape(-1)[0]) for c in ours_calls]
    theirs_t = [float(c[1].reshape(-1)[0]) for c in theirs_calls]
    guidance = cfg.sampling.guidance_scale
    report.notes += [
        f"flowgrpo plan: {plan.name}, {T} steps, grid {cfg.sampling.plan.get('grid', 'linear')}, solver "
        f"{plan.steps[0].solver}, guidance {guidance}, {G} samples x {len(PROMPTS)} prompts; official guidance "
        f"{config.sample.guidance_scale}, noise_level {config.sample.noise_level} (unused: deterministic)",
        f"official grid {[round(g, 6) for g in grid]}",
        f"timesteps the transformer gets: flowgrpo {[round(t, 3) for t in ours_t]} (sampling.integer_timesteps="
        f"{cfg.sampling.integer_timesteps}), official {theirs_t} (torch.long)",
    ]
    return report


def run(checkout) -> list[MethodReport]:
    official = load_official(checkout)
    return [compare_rollout(checkout, official, label, rewards, function) for label, rewards, function in ROLLOUTS]
