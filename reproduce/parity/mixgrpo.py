"""MixGRPO, MixGRPO-Flash and Flash* against Tencent-Hunyuan/MixGRPO's own sampler, step by step, on a tiny FLUX.

The official side runs the checkout's code, loaded at run time from ``MIXGRPO_PATH`` (nothing of it is part of this
project): ``run_sample_step`` with its ``flow_grpo_step`` (the window's SDE steps and the Euler steps around them)
and ``dpm_step`` (Flash's DPM-Solver++ tail) from fastvideo/utils/sampling_utils.py, and ``GRPOTrainingStates`` from
fastvideo/utils/grpo_states.py, each module imported from its file; from fastvideo/train_grpo_flux.py, whose
module-level imports (wandb, its reward models, FSDP utilities) it does not need, the definitions of ``pack_latents``
and ``prepare_latent_image_ids``, the window states' construction in ``main`` and, in ``sample_reference_model``, the
statements that build the σ grid (linspace, time shift) and the per-step ``determistic`` list, are read with ``ast``
and executed with the launch's arguments (the launch script over the argparse defaults, as
reproduce/official/mixgrpo.py reads them). So the official side computes its own grid, window, Flash tail and
solver; ``sample_reference_model`` itself cannot run on a tiny model (it hard-codes FLUX's 16 latent channels and
8x VAE, decodes and scores every sample).

flowgrpo's side is the preset's plan as its recipe resolves on FLUX.1-dev (``resolve(preset, "flux_dev", rewards)``,
then the tiny weights swapped in: model.pretrained, resolution, device, text length), rolled out by
``samplers.rollout`` through the FLUX adapter. Both sides share the tiny FLUX (``flowgrpo.tiny.build_tiny_flux_pipeline``
with FLUX.1-dev's scheduler config, as tests/models/test_flux.py saves it), the prompt's text embeddings (flowgrpo's
``encode_prompts``; the official code reads precomputed ones), x_T (one per prompt, its group's: --init_same_noise) and
every window step's ε: the official code draws noise at every step it takes with ``flow_grpo_step`` and keeps it only
at the window's steps, so it is fed flowgrpo's ε there and zeros at the others (which it discards). The comparison
runs in the official code's packed token layout (its own ``pack_latents`` of flowgrpo's latents).

flowgrpo's rollout runs as its trainer runs it: inside ``model.integer_timesteps(sampling.integer_timesteps)``, the
recipe's true, so its FLUX adapter tells the network ⌊1000σ⌋/1000 as the official int(σ·1000)/1000; the timestep
each side's transformer is told at every step is recorded (a hook on the shared transformer) and compared: on
MixGRPO's float32 grid (grid linear_float32) and on Flash's float64 flash_grid alike they are the official ones at
every compared window position. The first position of each preset also carries: the advantages of one set of three
rewards (flowgrpo's ``credit.assign`` with the recipe's advantage section, zsum with std_correction 1, against the
official statements of train_one_step and main's weight normalisation), the optimizer steps' composition (flowgrpo's
TransitionLearner split, train.update_split=samples, against the official step every gradient_accumulation_steps
samples), and controls with each option off (sampling.integer_timesteps=false: a whole rollout; std_correction 0;
update_split=groups).

Compared per preset at several window positions: MixGRPO at starts 0, 10 and 19 (the last start whose official
window has all 4 steps: from 20 on it is cut at T − 2 = 23, where flowgrpo keeps 4 steps, code.window_clip);
MixGRPO-Flash at 0, 9 and 17 (the last start whose official tail reaches σ = 0: from 18 on it has one point and the
official rollout stops at σ_{l+4}, code.flash_tail_min_points); Flash* at iterations 0 and 460 (its window never
moves). Each side reaches its position through its own schedule from iteration 0 (the official states' update per
iteration, flowgrpo's WindowSchedule), at the iteration start × interval.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib.util
import math
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # reproduce/: official, parity
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project: flowgrpo, samplers

from official import Checkout, argparse_launch  # noqa: E402
from official.mixgrpo import LAUNCHERS, MODEL, REWARDS, SCRIPT  # noqa: E402
from parity import MethodReport, StepRow, fed_draws, max_diff, recorded_step_noise, tolerance  # noqa: E402
from parity.dancegrpo import advantages, composition_note  # noqa: E402
from samplers.kernels import HALF_LOG_2PI, kernel_coefficients  # noqa: E402

SAMPLING = "fastvideo/utils/sampling_utils.py"
STATES = "fastvideo/utils/grpo_states.py"
PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a yellow star"]
PROMPT = "a green triangle left of a yellow star"
RESOLUTION = 32  # px: the tiny FLUX's latents are 4 x 16 x 16, packed to 64 tokens of 16
MEMBERS = 4  # the group's first members the official sampler runs (each its own batch of 1, as its loop does)
# preset -> (window start, iteration) compared (the iteration: start × interval; Flash*'s window is frozen)
SETTINGS = {
    "mixgrpo": [(0, 0), (10, 250), (19, 475)],
    "mixgrpo_flash": [(0, 0), (9, 180), (17, 340)],
    "mixgrpo_flash_star": [(0, 0), (0, 460)],
}
# the positions where the official run differs (reproduce/official/map/mixgrpo.yaml): MixGRPO's window at start 21 is cut to
# {21, 22} (flowgrpo: SDE on 21-24, trained 21-22), Flash's tail at start 18 has one point (the official rollout stops
# at σ_22, flowgrpo steps on to 0)
KNOWN_DIFFERENCES = {
    "mixgrpo": [(21, 525)],
    "mixgrpo_flash": [(18, 360)],
}


# ---------------------------------------------------------------------------------------------------- the official code
def _module(checkout: Checkout, relpath: str, name: str):
    """A module of the checkout imported from its file under a name of its own (DanceGRPO's checkout has the same
    fastvideo/ paths)."""
    spec = importlib.util.spec_from_file_location(name, checkout.file(relpath))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(found) != 1:
        raise RuntimeError(f"{SCRIPT} defines {len(found)} functions {name}()")
    return found[0]


def _statements(function: ast.FunctionDef, wanted) -> list[ast.stmt]:
    """The statements anywhere in ``function`` (nested in loops and ifs included) whose source ``wanted`` accepts."""
    return [node for node in ast.walk(function) if isinstance(node, ast.stmt) and wanted(ast.unparse(node))]


class Official:
    """The checkout's sampler, window states and the pieces of its training script this comparison runs."""

    def __init__(self, checkout: Checkout, preset: str):
        self.checkout = checkout
        self.sampling = _module(checkout, SAMPLING, "_mixgrpo_sampling_utils")
        self.states_module = _module(checkout, STATES, "_mixgrpo_grpo_states")
        values, _ = argparse_launch(checkout, SCRIPT, LAUNCHERS[preset], SCRIPT)
        self.args = SimpleNamespace(**{k: v.value for k, v in values.items()})
        path = checkout.file(SCRIPT)
        tree = ast.parse(path.read_text(), str(path))
        helpers = [_function(tree, "pack_latents"), _function(tree, "prepare_latent_image_ids")]
        sample = _function(tree, "sample_reference_model")
        grid = _statements(sample, lambda s: s.startswith(("sample_steps = args.sampling_steps",
                                                           "sigma_schedule = torch.linspace(",
                                                           "sigma_schedule = sd3_time_shift(")))
        steps = _statements(sample, lambda s: s.startswith("if args.training_strategy == 'part':\n    determistic"))
        states = _statements(_function(tree, "main"), lambda s: s.startswith("grpo_states = GRPOTrainingStates("))
        # the reward weights (main: each model's weight by its class name, normalised to sum 1) and the advantages
        # (train_one_step: each reward's group z-score, weighted and summed)
        weights = _statements(_function(tree, "main"), lambda s: s.startswith((
            "reward_weights = {}", "for model in reward_models:\n    model_name = type(model).__name__",
            "total_weight = sum(reward_weights.values())", "if total_weight > 0:")))
        advantage = _statements(_function(tree, "train_one_step"),
                                lambda s: s.startswith("if args.use_group:\n    if args.multi_reward_mix =="))
        if len(grid) != 3 or len(steps) != 1 or len(states) != 1 or len(weights) != 4 or len(advantage) != 1:
            raise RuntimeError(f"{SCRIPT}: the grid ({len(grid)} of 3 statements), the deterministic steps "
                               f"({len(steps)}), the window states ({len(states)}), the reward weights ({len(weights)} of "
                               f"4) or the advantages ({len(advantage)}) are no longer where this reads them")
        self.namespace = {"torch": torch, "sd3_time_shift": self.sampling.sd3_time_shift,
                          "GRPOTrainingStates": self.states_module.GRPOTrainingStates, "args": self.args}
        exec(compile(ast.Module(body=helpers, type_ignores=[]), str(path), "exec"), self.namespace)
        self.grid_code = compile(ast.Module(body=grid, type_ignores=[]), str(path), "exec")
        self.steps_code = compile(ast.Module(body=steps, type_ignores=[]), str(path), "exec")
        self.states_code = compile(ast.Module(body=states, type_ignores=[]), str(path), "exec")
        self.weights_code = compile(ast.Module(body=weights, type_ignores=[]), str(path), "exec")
        self.advantage_code = compile(ast.Module(body=advantage, type_ignores=[]), str(path), "exec")
        self.where = (f"{SAMPLING} run_sample_step, flow_grpo_step, dpm_step; {STATES} GRPOTrainingStates; {SCRIPT} "
                      f"sample_reference_model (grid, deterministic steps), main (window states), pack_latents, "
                      f"prepare_latent_image_ids; {LAUNCHERS[preset]}")

    def window(self, iteration: int) -> list[int]:
        """``timesteps_train`` of ``iteration``: main()'s states, read then advanced once per iteration."""
        scope = dict(self.namespace)
        exec(self.states_code, scope)
        states = scope["grpo_states"]
        for _ in range(iteration + 1):
            train = states.get_current_timesteps()
            states.update_iteration()
        return list(train)

    def advantages(self, rewards: dict[str, torch.Tensor]) -> torch.Tensor:
        """The official advantages of one group: main()'s reward weights for the launch's reward models (stand-ins of
        their class names, in ``rewards``' order), then train_one_step's advantage statements."""
        models = [type(name, (), {})() for name in rewards]
        scope = dict(self.namespace, reward_models=models, print=lambda *a, **k: None)
        exec(self.weights_code, scope)
        scope["samples"] = {"rewards": dict(rewards)}
        exec(self.advantage_code, scope)
        return scope["samples"]["advantages"]

    def grid_and_steps(self, timesteps_train: list[int]) -> tuple[torch.Tensor, list[bool]]:
        """sample_reference_model's σ grid and per-step ``determistic`` list."""
        scope = dict(self.namespace, device=torch.device("cpu"), timesteps_train=timesteps_train)
        exec(self.grid_code, scope)
        exec(self.steps_code, scope)
        return scope["sigma_schedule"], scope["determistic"]

    def sample(self, transformer, z: torch.Tensor, cond: tuple, timesteps_train: list[int], draws: list[torch.Tensor]):
        """run_sample_step for one sample (its batch of 1), recording every step's (index, σ, σ'). ``draws`` feed the
        randn_tensor of each flow_grpo_step call in order. Returns (states [steps + 1, tokens, channels], log-probs
        [steps], steps [(σ, σ')], the determistic list)."""
        sigma_schedule, determistic = self.grid_and_steps(timesteps_train)
        embeds, pooled, text_ids, image_ids = cond
        steps: list[tuple[int, float, float]] = []
        module = self.sampling
        originals = {name: getattr(module, name) for name in ("flow_grpo_step", "dpm_step")}

        def recording(name):
            def call(*args, **kwargs):
                index = kwargs["index"] if name == "flow_grpo_step" else kwargs["step_index"]
                sigmas = kwargs["sigmas"]
                steps.append((index, float(sigmas[index]), float(sigmas[index + 1])))
                return originals[name](*args, **kwargs)
            return call

        for name in originals:
            setattr(module, name, recording(name))
        try:
            with fed_draws(module, "randn_tensor", draws), torch.no_grad():
                _, _, latents, log_probs = module.run_sample_step(
                    self.args, z, range(0, self.args.sampling_steps), sigma_schedule, transformer, embeds, pooled,
                    text_ids, image_ids, True, determistic=determistic)
        finally:
            for name, fn in originals.items():
                setattr(module, name, fn)
        if [i for i, _, _ in steps] != list(range(len(steps))):
            raise RuntimeError(f"the official steps ran out of order: {[i for i, _, _ in steps]}")
        return latents[0], log_probs[0], [(s, t) for _, s, t in steps], determistic


# ---------------------------------------------------------------------------------------------------- flowgrpo
def tiny_flux(folder: Path) -> str:
    """The tiny FLUX of tests/models/test_flux.py (guidance-distilled, FLUX.1-dev's scheduler config), saved once."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    from flowgrpo.tiny import build_clip_tokenizer, build_tiny_flux_pipeline
    from flowgrpo.tiny.builders import FLUX_DEV_SCHEDULER

    pipe = build_tiny_flux_pipeline(build_clip_tokenizer(PROMPTS, max_length=16), seed=0, image_size=RESOLUTION)
    FluxPipeline(**dict(pipe.components, scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER))).save_pretrained(folder)
    return str(folder)


def resolved(preset: str, folder: str, more: tuple[str, ...] = ()):
    """The preset's run on FLUX.1-dev with its launch's rewards, the tiny weights swapped in (``more``: overrides after
    those, a negative control)."""
    from flowgrpo.config import resolve

    names = REWARDS["multi_reward"]
    overrides = ["rewards=[" + ", ".join(f"{{name: {n}}}" for n in names) + "]", f"model.pretrained={folder}",
                 f"model.resolution={RESOLUTION}", "model.device=cpu", "model.max_sequence_length=16",
                 "model.dtype=float32", "model.gradient_checkpointing=false"] + list(more)
    return resolve(preset, MODEL, overrides).config


# the official reward models' class names (main() weighs them by name), for flowgrpo's rewards of --reward_model
# multi_reward in their order
REWARD_CLASSES = {"hpsv2": "HPSClipRewardModel", "imagereward": "ImageRewardModel", "pickscore": "PickScoreRewardModel"}


@contextlib.contextmanager
def told_timesteps(transformer):
    """Inside, every call of ``transformer`` records the timestep it is told (its first row, as the float it gets)."""
    seen: list[float] = []

    def hook(module, args, kwargs):
        seen.append(float(kwargs["timestep"].reshape(-1)[0]))

    handle = transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def ours(cfg, model, cond, iteration: int):
    """flowgrpo's rollout of the preset's plan at ``iteration`` as its trainer runs it (the network told ⌊1000σ⌋ with
    sampling.integer_timesteps): (plan, record, states per level [T + 1, G, ...], ε's, the timesteps told)."""
    import samplers
    from flowgrpo.engine.rollout import plan_schedule

    plan = plan_schedule(cfg, model).plan(iteration)
    base = model.velocity_fn(cond, cfg.sampling.guidance_scale)
    levels = []

    def velocity(x, sigma, cond_index):
        levels.append(x.detach().clone())
        return base(x, sigma, cond_index)

    with recorded_step_noise() as draws, told_timesteps(model.transformer) as told, torch.no_grad(), \
            model.integer_timesteps(cfg.sampling.integer_timesteps):
        record = samplers.rollout(
            velocity, plan, prompt_ids=[0], latent_shape=model.latent_shape(), seed=cfg.train.seed, iteration=iteration,
            dtype=model.dtype, device=model.device, max_batch=cfg.sampling.chunk or None, reduce=cfg.sampling.reduce,
            log_prob_form=cfg.sampling.log_prob)
    states = torch.stack(levels + [record.leaf_state])
    return plan, record, states, draws, told


# ---------------------------------------------------------------------------------------------------- the comparison
def compare(preset: str, start: int, iteration: int, official: Official, cfg, model, cond, commit: str,
            first: bool = False) -> MethodReport:
    """One window position: the first ``MEMBERS`` samples of the group, every step, and the timesteps each side's
    network is told; with ``first``, also the advantages, the optimizer steps and the controls (notes)."""
    report = MethodReport("mixgrpo", f"{preset} window start {start} (iteration {iteration})", official.checkout.repository,
                          commit, official.where)
    plan, record, states, draws, told = ours(cfg, model, cond, iteration)
    G, T = min(MEMBERS, plan.roots_per_prompt), plan.num_steps
    window = official.window(iteration)
    pack = official.namespace["pack_latents"]
    channels, h, w = model.latent_shape()

    def packed(x):  # [N, C, h, w] -> the official [N, tokens, 4C]
        return pack(x.to(torch.float32), x.shape[0], channels, h, w)

    embeds, pooled = cond.prompt_embeds[:1], cond.pooled_prompt_embeds[:1]
    text_ids = torch.zeros(1, 3)  # the official embeddings' text ids (encode_prompt's, all zero)
    image_ids = official.namespace["prepare_latent_image_ids"](1, h // 2, w // 2, torch.device("cpu"), torch.bfloat16)
    stochastic_ours = [s.stochastic for s in plan.steps]
    sde_steps = [i for i, s in enumerate(stochastic_ours) if s]
    theirs_states, theirs_lp, theirs_steps, determistic = [], [], None, None
    for g in range(G):
        eps = {i: packed(d[g : g + 1, 0]) for i, d in zip(sde_steps, draws)}  # chains: one child per node
        calls = window[-1] + 1 if official.args.dpm_algorithm_type != "null" and window else official.args.sampling_steps
        zero = torch.zeros_like(packed(states[0, :1]))
        feed = [eps.get(i, zero) for i in range(calls)]
        with told_timesteps(model.transformer) as told_theirs:
            x, lp, steps, determistic = official.sample(model.transformer, packed(states[0, g : g + 1]),
                                                        (embeds, pooled, text_ids, image_ids), window, feed)
        if g == 0:
            report.notes.append(
                f"timesteps told (x1000): the official {[round(t * 1000) for t in told_theirs]}; flowgrpo's equal: "
                f"{told == told_theirs} (sampling.integer_timesteps={cfg.sampling.integer_timesteps}, grid "
                f"{resolved_grid(cfg)})")
        theirs_states.append(x)
        theirs_lp.append(lp)
        theirs_steps = steps
    theirs_states, theirs_lp = torch.stack(theirs_states, 1), torch.stack(theirs_lp, 1)  # [steps + 1, G, ...], [steps, G]
    ours_states = torch.stack([packed(s[:G]) for s in states])
    report.notes.append(f"official window {window}; official steps {len(theirs_steps)}, flowgrpo's {T}")
    if len(theirs_steps) != T:
        report.notes.append("the two sides take different numbers of steps; rows compare the first ones")
    lp_ours = torch.full((T, plan.roots_per_prompt), float("nan"))
    roots = record.node % plan.roots_per_prompt  # chains: node id d·G + root
    lp_ours[record.step, roots] = record.log_prob.to(torch.float32)
    lp_ours = lp_ours[:, :G]
    sig = plan.sigmas.to(torch.float32).tolist()
    for i in range(len(theirs_steps), T):  # steps only flowgrpo takes: no official counterpart
        nan = float("nan")
        report.steps.append(StepRow(i, (sig[i], nan), (sig[i + 1], nan), (stochastic_ours[i], False),
                                    (plan.steps[i].trained, False), math.inf, 0.0))
    for i in range(min(T, len(theirs_steps))):
        theirs_stochastic = i < len(determistic) and not determistic[i]
        trained_ours = plan.steps[i].trained
        x_ours, x_theirs = ours_states[i + 1], theirs_states[i + 1]
        row = StepRow(i, (sig[i], theirs_steps[i][0]), (sig[i + 1], theirs_steps[i][1]),
                      (stochastic_ours[i], theirs_stochastic), (trained_ours, i in window),
                      max_diff(x_ours, x_theirs, f"x' of step {i}"), tolerance(torch.cat([x_ours, x_theirs])))
        if trained_ours or i in window:
            # the log-prob is a sum of terms (−(x' − μ)²/(2s²), −log s, −½ log 2π) that nearly cancel: its float32
            # error is ulps of the terms, not of the sum (a 1-ulp difference of σ' moves log s by ~ulp/(2Δ))
            a, b = lp_ours[i], theirs_lp[i].to(torch.float32)
            std = float(kernel_coefficients(plan.steps[i].kernel, sig[i], sig[i + 1], plan.steps[i].eta)[2][0]) \
                if plan.steps[i].stochastic else 1.0
            terms = torch.tensor([abs(math.log(std)) + HALF_LOG_2PI])
            row.dlogp = max_diff(a, b, f"log-prob of step {i}") if trained_ours else math.inf
            row.tol_logp = tolerance(torch.cat([a[~a.isnan()], b, terms]))
        report.steps.append(row)
    report.notes.append(f"the group's first {G} of {plan.roots_per_prompt} samples")
    if first:
        credit_and_steps(report, official, cfg, plan, record)
        # the integer timesteps off: the network told 1000σ (the same draws: they depend on the seeds alone)
        exact = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, integer_timesteps=False))
        _, _, plain, _, _ = ours(exact, model, cond, iteration)
        plain = torch.stack([packed(s[:G]) for s in plain])
        n = min(len(plain), len(theirs_states))
        most = float((plain[:n].double() - theirs_states[:n].double()).abs().max())
        report.notes.append(f"control, sampling.integer_timesteps=false (the network told 1000σ): max |Δx'| {most:.3g}, "
                            f"{most / float(theirs_states.abs().max()):.2g} of max |x'|")
    return report


def resolved_grid(cfg) -> str:
    from flowgrpo.config import resolved_plan

    return resolved_plan(cfg)[0]["grid"]


def credit_and_steps(report: MethodReport, official: Official, cfg, plan, record) -> None:
    """Notes: the advantages of one set of the launch's rewards on both sides (and with std_correction 0), and the
    optimizer steps' composition (and with update_split=groups)."""
    G = plan.roots_per_prompt
    names = [spec.name for spec in cfg.rewards]
    generator = torch.Generator().manual_seed(0)
    by_sample = torch.rand(G, len(names), generator=generator) * torch.tensor([0.05, 1.0, 0.2])[: len(names)] \
        + torch.tensor([0.25, 0.5, 0.2])[: len(names)]  # HPS-, ImageReward- and PickScore-like spreads
    theirs = official.advantages({REWARD_CLASSES[n]: by_sample[:, k] for k, n in enumerate(names)}).to(torch.float32)
    by_root = [int(k) for k in torch.argsort(record.leaf_root)]
    fed = by_sample[record.leaf_root]  # flowgrpo's leaf order
    adv = advantages(cfg, record, plan, fed)[0][by_root]
    control = advantages(cfg, record, plan, fed, std_correction=0)[0][by_root]
    ratio = float((control.double() / theirs.double()).mean())
    report.notes.append(
        f"advantages of one set of {len(names)} rewards ({', '.join(names)}; credit.assign, advantage.multi_reward="
        f"{cfg.advantage.multi_reward}, std_correction={cfg.advantage.std_correction}, weights "
        f"{[spec.weight for spec in cfg.rewards]}): max |Δ| {max_diff(adv, theirs, 'advantages'):.3g} (tolerance "
        f"{tolerance(torch.cat([adv, theirs])):.3g}); control, std_correction=0: flowgrpo's / the official = {ratio:.4f} "
        f"(sqrt(G/(G-1)) = {math.sqrt(G / (G - 1)):.4f})")
    report.notes.append(composition_note(cfg, record, G, official.args.gradient_accumulation_steps,
                                         "its window steps"))


def run(checkout: Checkout, settings: dict | None = None, overrides: tuple[str, ...] = ()) -> list[MethodReport]:
    """One report per (preset, window position) of ``settings`` (default ``SETTINGS``); ``overrides``: flowgrpo's settings
    changed after the recipe (a negative control)."""
    from flowgrpo.models.base import load_model

    settings = SETTINGS if settings is None else settings

    commit = checkout.commit_of(SCRIPT)
    reports = []
    with tempfile.TemporaryDirectory(prefix="mixgrpo-parity-") as tmp:
        folder = tiny_flux(Path(tmp) / "tiny_flux_dev")
        for preset, positions in settings.items():
            cfg = resolved(preset, folder, tuple(overrides))
            model = load_model(cfg.model)
            model.transformer.eval()
            cond = model.encode_prompts([PROMPT])
            official = Official(checkout, preset)
            for k, (start, iteration) in enumerate(positions):
                reports.append(compare(preset, start, iteration, official, cfg, model, cond, commit, first=k == 0))
    return reports


if __name__ == "__main__":  # python reproduce/parity/mixgrpo.py (MIXGRPO_PATH set)
    from official.mixgrpo import ENV, REPOSITORY

    for r in run(Checkout.from_env(REPOSITORY, ENV)):
        print(r.line())
        for note in r.notes:
            print("    " + note)
