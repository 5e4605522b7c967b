"""Trajectory parity with Flow-GRPO's samplers (yifan123/flow_grpo, the checkout FLOW_GRPO_PATH names).

Compared, on the shipped tiny SD3 and a tiny FLUX.1 (random weights, FLUX.1-dev's scheduler config):

- ``flow_grpo`` on SD3: the official ``pipeline_with_logprob`` (flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py,
  Flow-SDE at every step through ``sde_step_with_logprob``, its σ grid from its own ``retrieve_timesteps(...,
  sigmas=None)``) against flowgrpo's ``flow_grpo`` plan as the preset resolves on ``sd3_5_medium``;
- ``flow_grpo_fast`` on SD3, once per window start the official code can draw: the official
  ``sd3_pipeline_with_logprob_fast`` (its window ``random.randint(lo, hi − w)`` answered with that start, the CPS
  kernel, ODE steps at noise level 0) against the preset's random window at an iteration that draws the same start;
- the same two on FLUX (``flux_pipeline_with_logprob`` / ``_fast``: linspace(1, 1/T, T) with the resolution's
  dynamic shift) against the presets on ``flux_dev``.
- ``flow_grpo`` on FLUX.1-Kontext, its editing run (counting_flux_kontext): the official
  ``flux_kontext_pipeline_with_logprob`` (the source image resized to the output size, VAE-encoded, its tokens after
  the latent's, ids frame 1; Flow-SDE at every step on FLUX's grid) against the preset on ``flux1_kontext_dev``, on a
  tiny random FLUX.1-Kontext (flowgrpo.tiny.build_tiny_kontext_pipeline's, its transformer guidance-embedded as
  FLUX.1-Kontext-dev's, FLUX.1-dev's scheduler config); both sides encode the same source images, given at the output
  size (the official script's bicubic squash to resolution x resolution is a mapped difference, not the sampler's).

Every official value that sets a run (steps, noise level, CFG scale, window size and range, sde_type, timestep
fraction) is read from the official config function of the launch (config/grpo.py, by ``trace_ml_collections``);
which steps are trained is the official training script's own code: its ``num_train_timesteps = ...`` statement
(the Fast scripts' ``if sde_window_size > 0`` block) and its ``train_timesteps = [...]`` line, read from ``main`` by
``ast`` and executed with the launch's config, indexing the timesteps the pipeline returns (the Fast pipelines return
their window's). flowgrpo's side is the preset on the real model config with the tiny weights swapped in (model keys
only; the group size is 2 to keep the CPU run short), rolled out by ``samplers.rollout`` as the trainer calls it.
Both sides get the same text embeddings (flowgrpo's), x_T and per-step ε (the official ``randn_tensor`` is fed
flowgrpo's draws in order; its draws at noise level 0 get zeros, which it multiplies by 0).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

from official import Checkout, ExtractionError, trace_ml_collections
from parity import MethodReport, StepRow, fed_draws, max_diff, recorded_step_noise, tolerance

CODE = "flow_grpo"
GROUP = 2  # roots per prompt on both sides (the recipe's 24 changes nothing per step)
PROMPTS = ["a red cube on a table", "two cats"]
TINY_SD3 = ["model.pretrained=tiny-sd3", "model.resolution=32", "model.max_sequence_length=16", "model.device=cpu",
            "model.dtype=float32", "model.lora_rank=4", "model.lora_alpha=8.0", "model.gradient_checkpointing=false",
            f"sampling.plan.group_size={GROUP}"]
PATCH = "flow_grpo/diffusers_patch"

# family -> [(preset, official config function, training script, pipeline module)]
RUNS = {
    "sd3": [("flow_grpo", "geneval_sd3", "scripts/train_sd3.py", "sd3_pipeline_with_logprob"),
            ("flow_grpo_fast", "geneval_sd3_fast_nocfg", "scripts/train_sd3_fast.py", "sd3_pipeline_with_logprob_fast")],
    "flux": [("flow_grpo", "pickscore_flux", "scripts/train_flux.py", "flux_pipeline_with_logprob"),
             ("flow_grpo_fast", "pickscore_flux_fast", "scripts/train_flux_fast.py", "flux_pipeline_with_logprob_fast")],
    "flux_kontext": [("flow_grpo", "counting_flux_kontext", "scripts/train_flux_kontext.py",
                      "flux_kontext_pipeline_with_logprob")],
}
MODEL = {"sd3": "sd3_5_medium", "flux": "flux_dev", "flux_kontext": "flux1_kontext_dev"}
REWARD = {"geneval_sd3": "geneval", "geneval_sd3_fast_nocfg": "geneval", "pickscore_flux": "pickscore",
          "pickscore_flux_fast": "pickscore", "counting_flux_kontext": "geneval"}


def sources(size: int) -> list:
    """One source image per prompt of PROMPTS (the editing run's), RGB at ``size`` x ``size``: smooth seeded colour
    fields, so the VAE sees structure rather than noise."""
    from PIL import Image

    generator = torch.Generator().manual_seed(7)
    out = []
    for _ in PROMPTS:
        coarse = torch.rand(1, 3, 4, 4, generator=generator)
        field = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)[0]
        out.append(Image.fromarray((field.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy(), mode="RGB"))
    return out


# ------------------------------------------------------------------------------------------------ the official code
@contextlib.contextmanager
def _on_path(path: Path):
    sys.path.insert(0, str(path))
    try:
        yield
    finally:
        sys.path.remove(str(path))


def load_modules(checkout: Checkout) -> SimpleNamespace:
    """The checkout's pipelines and SDE step, imported from its folder (nothing of it is kept in this project)."""
    names = {n for runs in RUNS.values() for *_, n in runs} | {"sd3_sde_with_logprob"}
    for name in names:
        checkout.file(f"{PATCH}/{name}.py")
    for name in [m for m in sys.modules if m == "flow_grpo" or m.startswith("flow_grpo.")]:
        del sys.modules[name]  # another checkout's modules, imported earlier in this process
    with _on_path(checkout.path):
        return SimpleNamespace(**{n: importlib.import_module(f"flow_grpo.diffusers_patch.{n}") for n in names})


def _main_statements(checkout: Checkout, script: str) -> tuple[ast.stmt, ast.stmt]:
    """From ``main`` of ``script``: the statement that sets ``num_train_timesteps`` (an assignment, or the Fast
    scripts' if/else around two) and the ``train_timesteps = [...]`` assignment of the training loop."""
    tree = ast.parse(checkout.file(script).read_text())
    main = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    if len(main) != 1:
        raise ExtractionError(f"{script}: no single main()")

    def assigns(node, name):
        return any(isinstance(t, ast.Name) and t.id == name for a in ast.walk(node) if isinstance(a, ast.Assign)
                   for t in a.targets)

    count = [s for s in main[0].body if assigns(s, "num_train_timesteps")]
    trained = [n for n in ast.walk(main[0]) if isinstance(n, ast.Assign) and assigns(n, "train_timesteps")]
    if len(count) != 1 or len(trained) != 1:
        raise ExtractionError(f"{script}: main() sets num_train_timesteps in {len(count)} statements and "
                              f"train_timesteps in {len(trained)} (expected one each)")
    return count[0], trained[0]


def official_trained(checkout: Checkout, script: str, config: SimpleNamespace) -> list[int]:
    """The indices j of the stored timesteps the official training loop trains, by its own statements."""
    count, trained = _main_statements(checkout, script)
    namespace = {"config": config}
    exec(compile(ast.Module(body=[count, trained], type_ignores=[]), script, "exec"), namespace)  # noqa: S102
    return list(namespace["train_timesteps"])


def official_config(checkout: Checkout, function: str) -> tuple[SimpleNamespace, dict]:
    """The launch's config (config/grpo.py) as the scripts read it (config.sample.x, config.train.y), and its flat
    values."""
    return official_config_of(checkout, "config/grpo.py", function)


def official_config_of(checkout: Checkout, config_file: str, function: str) -> tuple[SimpleNamespace, dict]:
    values, _ = trace_ml_collections(checkout, config_file, function)
    flat = {k: v.value for k, v in values.items()}
    sections: dict = {}
    for key, value in flat.items():
        head, _, leaf = key.rpartition(".")
        sections.setdefault(head, {})[leaf] = value
    config = SimpleNamespace(**{k: SimpleNamespace(**v) for k, v in sections.items() if k},
                             **sections.get("", {}))
    return config, flat


# ------------------------------------------------------------------------------------------------ flowgrpo's side
def load_flowgrpo(preset: str, family: str, reward: str, folder: str | None, extra: tuple[str, ...] = ()):
    """The preset as it resolves on the family's real model config (its recipe), the tiny weights swapped in:
    (config, model, plan schedule). ``extra``: overrides of flowgrpo's side (the tests' negative controls)."""
    from flowgrpo.config import resolve
    from flowgrpo.engine.rollout import plan_schedule
    from flowgrpo.models import load_model

    tiny = list(TINY_SD3)
    if family != "sd3":
        tiny[0] = f"model.pretrained={folder}"
    cfg = resolve(preset, MODEL[family], [f"rewards=[{{name: {reward}}}]", *tiny, *extra]).config
    model = load_model(cfg.model)
    model.pipeline.set_progress_bar_config(disable=True)
    return cfg, model, plan_schedule(cfg, model)


def ours(cfg, model, plan, iteration: int, cond) -> dict:
    """flowgrpo's rollout of ``plan`` (as flowgrpo/engine/rollout.py calls it): x at every step (the velocity's
    inputs), x_0, the ε of every stochastic step (in the order drawn), the record."""
    import samplers

    inputs = []
    velocity = model.velocity_fn(cond, cfg.sampling.guidance_scale)

    def recording(x, sigma, cond_index):
        inputs.append((x.detach().clone(), sigma.detach().clone()))
        return velocity(x, sigma, cond_index)

    # as flowgrpo/engine/rollout.py: the network told the recipe's timesteps (σ·1000, or ⌊1000σ⌋ with
    # sampling.integer_timesteps; Flow-GRPO's pipelines give it the scheduler's float t)
    with recorded_step_noise() as draws, model.integer_timesteps(cfg.sampling.integer_timesteps):
        rec = samplers.rollout(recording, plan, prompt_ids=list(range(len(PROMPTS))), latent_shape=model.latent_shape(),
                               seed=cfg.train.seed, iteration=iteration, dtype=model.dtype, device=model.device,
                               max_batch=cfg.sampling.chunk or None, reduce=cfg.sampling.reduce,
                               log_prob_form=cfg.sampling.log_prob)
    order = torch.argsort(rec.leaf_root)  # leaves in root order (chains: one leaf a root)
    if len(inputs) != len(plan.steps) or not torch.equal(inputs[0][0], rec.root_state):
        raise RuntimeError("flowgrpo's rollout did not call the velocity once per step on the roots in order")
    states = [x for x, _ in inputs] + [rec.leaf_state[order]]
    return {"rec": rec, "states": states, "draws": draws, "order": order}


def per_root_step(rec, values: torch.Tensor, num_steps: int) -> torch.Tensor:
    """Transition values [M] of a chain record as [roots, steps] (NaN where a step is not a trained transition)."""
    leaf = rec.transition_values(torch.arange(rec.num_leaves, dtype=torch.float64)).round().long()
    root = rec.leaf_root[leaf]
    out = torch.full((rec.root_state.shape[0], num_steps), float("nan"), dtype=torch.float64)
    out[root, rec.step] = values.double()
    return out


# ------------------------------------------------------------------------------------------------ one comparison
def compare(checkout: Checkout, modules, family: str, preset: str, function: str, script: str, pipeline_name: str,
            loaded, start: int | None) -> MethodReport:
    cfg, model, schedule = loaded
    config, flat = official_config(checkout, function)
    pipeline_module = getattr(modules, pipeline_name)
    sde = modules.sd3_sde_with_logprob
    fast = pipeline_name.endswith("_fast")
    iteration, notes = 0, []
    if fast:  # an iteration whose random window starts where the official draw is answered
        iteration = next((n for n in range(1000) if schedule.window_start(n) == start), None)
        if iteration is None:
            raise RuntimeError(f"{preset}: no iteration below 1000 draws window start {start}")
    plan = schedule.plan(iteration)
    T = len(plan.steps)
    edit = family == "flux_kontext"
    images = sources(cfg.model.resolution) if edit else None
    cond = model.encode_prompts(PROMPTS, images=[[image] for image in images] if edit else None)
    mine = ours(cfg, model, plan, iteration, cond)
    rec, n = mine["rec"], mine["rec"].root_state.shape[0]
    shape = (n,) + tuple(model.latent_shape())
    stochastic = [s.kernel != "ode" for s in plan.steps]
    draws = iter(mine["draws"])
    eps = [next(draws).reshape(shape) if s else torch.zeros(shape) for s in stochastic]
    index = rec.leaf_prompt[mine["order"]]  # the prompt of every root
    kwargs = dict(num_inference_steps=config.sample.num_steps, guidance_scale=config.sample.guidance_scale,
                  output_type="pt", height=cfg.model.resolution, width=cfg.model.resolution,
                  noise_level=config.sample.noise_level, max_sequence_length=cfg.model.max_sequence_length)
    if fast:
        kwargs.update(sde_window_size=config.sample.sde_window_size, sde_window_range=config.sample.sde_window_range,
                      sde_type=config.sample.sde_type)
    cond_rows = cond.select(index)
    if family == "sd3":
        unc = cond_rows.unconditional()
        kwargs.update(prompt_embeds=cond_rows.prompt_embeds, pooled_prompt_embeds=cond_rows.pooled_prompt_embeds,
                      negative_prompt_embeds=unc.prompt_embeds, negative_pooled_prompt_embeds=unc.pooled_prompt_embeds,
                      latents=rec.root_state.clone())
        pack = unpack = lambda t: t  # noqa: E731
    else:
        from diffusers import FluxPipeline

        c, h, w = model.latent_shape()
        pack = lambda t: FluxPipeline._pack_latents(t, t.shape[0], c, h, w)  # noqa: E731
        vae_factor = model.pipeline.vae_scale_factor
        unpack = lambda t: FluxPipeline._unpack_latents(t, cfg.model.resolution, cfg.model.resolution, vae_factor)  # noqa: E731
        kwargs.update(prompt_embeds=cond_rows.prompt_embeds, pooled_prompt_embeds=cond_rows.pooled_prompt_embeds,
                      latents=pack(rec.root_state.clone()))
        if edit:  # as train_flux_kontext.py calls it: each root's source, max_area = resolution²
            kwargs.update(image=[images[int(i)] for i in index], max_area=cfg.model.resolution ** 2)
        eps = [pack(e) for e in eps]
    steps, asked = [], []
    original = pipeline_module.sde_step_with_logprob

    def recording_step(*args, **kw):  # every official step: x', its log-prob, the noise level it ran at
        out = original(*args, **kw)
        steps.append((out[0].detach().clone(), out[1].detach().clone(), float(kw.get("noise_level", 0.0))))
        return out

    class WindowDraw:  # the official random.randint of the window, answered with ``start``
        @staticmethod
        def randint(a, b):
            asked.append((a, b))
            return start

    pipeline_module.sde_step_with_logprob = recording_step
    saved_random = getattr(pipeline_module, "random", None)
    if fast:
        pipeline_module.random = WindowDraw
    try:
        with torch.no_grad(), fed_draws(sde, "randn_tensor", eps):
            out = pipeline_module.pipeline_with_logprob(model.pipeline, **kwargs)
    finally:
        pipeline_module.sde_step_with_logprob = original
        if fast:
            pipeline_module.random = saved_random
    theirs_sigmas = model.pipeline.scheduler.sigmas.float().tolist()
    all_timesteps = model.pipeline.scheduler.timesteps.tolist()
    # the timesteps the loop stores and trains: the Fast pipelines return their window's, the others store them all
    stored = [float(t) for t in out[-1]] if fast else all_timesteps
    stored_index = [all_timesteps.index(t) for t in stored]
    trained_theirs = {stored_index[j] for j in official_trained(checkout, script, config)}
    if fast:
        lo, hi = asked[0]
        notes.append(f"official window draw randint({lo}, {hi}) answered {start}; flowgrpo's random window "
                     f"[{schedule.window.low}, {schedule.window.high}] draws {start} at iteration {iteration}")
        if (lo, hi) != (schedule.window.low, schedule.window.high):
            notes.append(f"WINDOW RANGE DIFFERS: official [{lo}, {hi}], flowgrpo [{schedule.window.low}, "
                         f"{schedule.window.high}]")
    if len(steps) != T or len(theirs_sigmas) != T + 1:
        raise RuntimeError(f"the official pipeline ran {len(steps)} steps on {len(theirs_sigmas)} sigmas; flowgrpo {T}")
    ours_sigmas = plan.sigmas.to(torch.float32).tolist()
    lp_ours = per_root_step(rec, rec.log_prob, T)
    report = MethodReport(CODE, f"{preset} {family}" + (f" window {start}" if fast else ""), checkout.repository,
                          checkout.commit_of(f"{PATCH}/{pipeline_name}.py"),
                          f"{checkout.cite(f'{PATCH}/{pipeline_name}.py')} pipeline_with_logprob; "
                          f"{checkout.cite(f'{PATCH}/sd3_sde_with_logprob.py')} sde_step_with_logprob; "
                          f"{checkout.cite(script)} main (num_train_timesteps, train_timesteps); "
                          f"{checkout.cite('config/grpo.py')} {function}", notes=notes)
    for i in range(T):
        x_ours = mine["states"][i + 1]
        x_theirs = unpack(steps[i][0]).to(x_ours)
        trained_ours = bool(plan.steps[i].trained)
        row = StepRow(i, (ours_sigmas[i], theirs_sigmas[i]), (ours_sigmas[i + 1], theirs_sigmas[i + 1]),
                      (stochastic[i], steps[i][2] > 0), (trained_ours, i in trained_theirs),
                      max_diff(x_ours, x_theirs, f"x' of step {i}"), tolerance(x_ours))
        if trained_ours and i in trained_theirs:
            theirs_lp = steps[i][1].double()
            row.dlogp = max_diff(lp_ours[:, i], theirs_lp, f"log-prob of step {i}")
            row.tol_logp = tolerance(lp_ours[:, i])
        report.steps.append(row)
    untrained = [i for i in range(T) if stochastic[i] and not plan.steps[i].trained]
    if untrained:
        notes.append(f"stochastic, untrained steps {untrained}: their log-probs are not stored by flowgrpo (x' compared)")
    notes.append(f"log-prob form: flowgrpo sampling.log_prob={cfg.sampling.log_prob}, official sde_type="
                 f"{flat.get('sample.sde_type', 'sde (sde_step_with_logprob default)')}")
    return report


def _tiny_flux(folder: str) -> str:
    """A tiny FLUX.1 of the real classes (guidance embedded, FLUX.1-dev's scheduler config) saved to ``folder``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

    from flowgrpo.tiny import build_clip_tokenizer, build_tiny_flux_pipeline
    from flowgrpo.tiny.builders import FLUX_DEV_SCHEDULER

    pipe = build_tiny_flux_pipeline(build_clip_tokenizer(PROMPTS, max_length=16), seed=0, image_size=32)
    FluxPipeline(**dict(pipe.components, scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER))
                 ).save_pretrained(folder)
    return folder


def _tiny_kontext(folder: str) -> str:
    """A tiny FLUX.1-Kontext of the real classes saved to ``folder``: flowgrpo.tiny's random one
    (build_tiny_kontext_pipeline), its transformer rebuilt guidance-embedded (FLUX.1-Kontext-dev's
    ``guidance_embeds``: the official pipeline's only guidance) and FLUX.1-dev's scheduler config (FLUX.1-Kontext-dev's:
    dynamic shifting, base 0.5 at 256 tokens, max 1.15 at 4096)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxTransformer2DModel

    from flowgrpo.tiny import build_clip_tokenizer
    from flowgrpo.tiny.builders import FLUX_DEV_SCHEDULER, build_tiny_kontext_pipeline

    pipe = build_tiny_kontext_pipeline(build_clip_tokenizer(PROMPTS, max_length=16), seed=0)
    torch.manual_seed(1)
    transformer = FluxTransformer2DModel.from_config({**pipe.transformer.config, "guidance_embeds": True}).eval()
    FluxKontextPipeline(**dict(pipe.components, transformer=transformer,
                               scheduler=FlowMatchEulerDiscreteScheduler(**FLUX_DEV_SCHEDULER))).save_pretrained(folder)
    return folder


def window_starts(checkout: Checkout, function: str) -> list[int | None]:
    """Every start the official Fast window can take (randint's whole range), or [None] without a window."""
    config, flat = official_config(checkout, function)
    if "sample.sde_type" not in flat:
        return [None]
    lo, hi = config.sample.sde_window_range
    return list(range(lo, hi - config.sample.sde_window_size + 1))


def run(checkout: Checkout, families: tuple[str, ...] = ("sd3", "flux", "flux_kontext"),
        presets: tuple[str, ...] | None = None, extra: tuple[str, ...] = ()) -> list[MethodReport]:
    """Every compared method of ``families`` (every window start of the Fast runs); ``presets`` limits them."""
    modules = load_modules(checkout)
    reports = []
    tiny = {"flux": _tiny_flux, "flux_kontext": _tiny_kontext}
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            folder = tiny[family](str(Path(tmp) / f"tiny-{family}")) if family in tiny else None
            for preset, function, script, pipeline_name in RUNS[family]:
                if presets is not None and preset not in presets:
                    continue
                loaded = load_flowgrpo(preset, family, REWARD[function], folder, extra)
                for start in window_starts(checkout, function):
                    reports.append(compare(checkout, modules, family, preset, function, script, pipeline_name,
                                           loaded, start))
    return reports


# ------------------------------------------------------------------------------------------------ GRPO-Guard's ratio
GUARD_SCRIPT = "scripts/train_sd3_GRPO_Guard.py"


def _guard_code(checkout: Checkout):
    """``compute_log_prob`` of train_sd3_GRPO_Guard.py (its definition, executed with the names it uses) and, from its
    ``main``, the ``if config.rationorm:`` statement that computes the ratio (the loop's own lines, by ``ast``)."""
    tree = ast.parse(checkout.file(GUARD_SCRIPT).read_text())
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "compute_log_prob"]
    main = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    ratio = [n for n in ast.walk(main[0]) if isinstance(n, ast.If) and ast.unparse(n.test) == "config.rationorm"
             and any(isinstance(t, ast.Name) and t.id == "ratio" for s in n.body if isinstance(s, ast.Assign)
                     for t in s.targets)] if main else []
    if len(defs) != 1 or len(ratio) != 1:
        raise ExtractionError(f"{GUARD_SCRIPT}: {len(defs)} compute_log_prob definitions and {len(ratio)} ratio "
                              "statements under `if config.rationorm:` (expected one each)")
    return defs[0], ratio[0]


def guard_ratio(checkout: Checkout, step: int = 3, perturb: float = 0.05) -> dict:
    """GRPO-Guard's regulated log-ratio, official against flowgrpo's ``loss.ratio=guard``, on one trained step of a
    ``grpo_guard`` rollout on the tiny SD3 (the preset on sd3_5_medium, OCR), after the LoRA moved off the rollout's
    weights (θ ≠ θ_old, so δ = μ_θ − μ_old ≠ 0).

    The official training batch here is the step's samples (as its loop computes ``ratio`` for one batch at one step
    j). Its exponent (read by executing its statement with ``torch.exp`` the identity) against flowgrpo's per-sample
    mean_D(ε_s·δ), and against flowgrpo's plus (⟨δ²⟩_batch − mean_D δ²_i)/(2s), the term its mean over the batch
    adds. Returns the three largest differences and the tolerance (TOLERANCE_ULPS float32 ulps of the log-probs the
    official exponent is computed from, times s)."""
    from flowgrpo import likelihood

    modules = load_modules(checkout)
    compute_def, ratio_stmt = _guard_code(checkout)
    config, _ = official_config_of(checkout, "config/grpo_guard.py", "general_ocr_sd3_rationorm")
    namespace = {"torch": torch, "sde_step_with_logprob": modules.sd3_sde_with_logprob.sde_step_with_logprob}
    exec(compile(ast.Module(body=[compute_def], type_ignores=[]), GUARD_SCRIPT, "exec"), namespace)  # noqa: S102
    compute_log_prob = namespace["compute_log_prob"]

    import samplers
    from flowgrpo.config import resolve
    from flowgrpo.engine.rollout import plan_schedule
    from flowgrpo.models import load_model

    cfg = resolve("grpo_guard", "sd3_5_medium", ["rewards=[{name: ocr}]", *TINY_SD3]).config
    model = load_model(cfg.model)
    plan = plan_schedule(cfg, model).plan(0)
    cond = model.encode_prompts(PROMPTS)
    with torch.no_grad(), model.integer_timesteps(cfg.sampling.integer_timesteps):
        rec = samplers.rollout(model.velocity_fn(cond, cfg.sampling.guidance_scale), plan,
                               prompt_ids=list(range(len(PROMPTS))), latent_shape=model.latent_shape(),
                               seed=cfg.train.seed, dtype=model.dtype, device=model.device, store_mean=True,
                               reduce=cfg.sampling.reduce, log_prob_form=cfg.sampling.log_prob)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(perturb * torch.randn(p.shape, generator=generator))
    rows = torch.nonzero(rec.step == step).flatten()
    x, x_next, mu_old = rec.state[rows], rec.next_state[rows], rec.mean[rows]
    sigma, sigma_next = rec.sigma[rows], rec.sigma_next[rows]
    rows_cond = cond.select(rec.cond_index[rows])
    with torch.no_grad():
        v = model.velocity(x, sigma, rows_cond, cfg.sampling.guidance_scale)
        a, b, std = likelihood.transition_coefficients(rec.kernel[rows], sigma, sigma_next, rec.eta[rows])
        ours = likelihood.transition_terms(x, v, x_next, a, b, std.float(), mu_old=mu_old, reduce=cfg.sampling.reduce,
                                           backend="reference").guard.double()
    # the official side: the scheduler's grid as its pipeline sets it, the step's samples as one training batch
    scheduler = model.pipeline.scheduler
    scheduler.set_timesteps(len(plan.steps))
    n = rows.numel()
    sample = {"latents": x.unsqueeze(1), "next_latents": x_next.unsqueeze(1), "prev_sample_mean": mu_old.unsqueeze(1),
              "timesteps": scheduler.timesteps[step].repeat(n, 1), "log_probs": rec.log_prob[rows].unsqueeze(1)}
    unc = rows_cond.unconditional()
    embeds = torch.cat([unc.prompt_embeds, rows_cond.prompt_embeds])
    pooled = torch.cat([unc.pooled_prompt_embeds, rows_cond.pooled_prompt_embeds])
    with torch.no_grad():
        _, log_prob, prev_sample_mean, std_dev_t, sqrt_dt = compute_log_prob(
            model.transformer, model.pipeline, sample, 0, embeds, pooled, config)
    scope = {"config": config, "log_prob": log_prob, "sample": sample, "j": 0, "prev_sample_mean": prev_sample_mean,
             "std_dev_t": std_dev_t, "sqrt_dt": sqrt_dt, "torch": SimpleNamespace(exp=lambda t: t)}
    exec(compile(ast.Module(body=[ratio_stmt], type_ignores=[]), GUARD_SCRIPT, "exec"), scope)  # noqa: S102
    theirs = scope["ratio"].double()  # the exponent: torch.exp taken as the identity
    s = float(sqrt_dt.mean() * std_dev_t.mean())
    delta2 = (prev_sample_mean.double() - mu_old.double()).pow(2).flatten(1).mean(1)
    predicted = (delta2.mean() - delta2) / (2 * s)
    tol = tolerance(torch.cat([log_prob, sample["log_probs"][:, 0]])) * s
    return {"step": step, "samples": n, "s": s, "official": theirs.tolist(), "flowgrpo": ours.tolist(),
            "max_diff": max_diff(ours, theirs, "guard log-ratio"),
            "max_diff_with_batch_mean_term": max_diff(ours + predicted, theirs, "guard log-ratio + batch term"),
            "max_batch_term": float(predicted.abs().max()), "max_abs_log_ratio": float(theirs.abs().max()),
            "tolerance": tol, "official_function": f"{checkout.cite(GUARD_SCRIPT)} compute_log_prob, main "
                                                    "(`if config.rationorm:` ratio)"}
