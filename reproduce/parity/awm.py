"""AWM's rollout and training-time draw against flowgrpo's ``awm`` preset, step by step
(scxue/advantage_weighted_matching).

The official side is loaded from the checkout at run time (``AWM_PATH``, the repository's root): its pipeline
``pipeline_with_logprob`` (flow_grpo/diffusers_patch/sd3_pipeline_with_logprob.py) with its own SA-Solver
(sa_solver.py), imported under a private package name (the checkout's ``flow_grpo`` package would collide with
Flow-GRPO's), and its launch configs (config/dgx_awm.py, run by reproduce/official's ml_collections reader) for
the values it passes (steps, τ = sample.noise_level, guidance, use_sa_solver). Nothing of the checkout is copied.

- **Rollout** (GenEval's τ = 0.4 and PickScore's τ = 0): flowgrpo's plan is the ``awm`` preset's recipe as it
  resolves on sd3_5_medium for that reward (SA-Solver, the scheduler's 14-step grid, grid_ends awm, τ on the steps
  whose end point lies in sa_tau_window), with the shipped tiny SD3's weights swapped in (a perturbed LoRA, so the
  adapter acts). Both sides run the same transformer on the same text embeddings and the same x_T. The official
  SA-Solver computes its own grid from the pipeline's scheduler and its own edits; it draws ``torch.randn_like``
  at every step (and once before the first): each draw of a step where flowgrpo drew ε is flowgrpo's ε, every other
  one a fixed random filler, which moves x' only if the official code uses noise where flowgrpo drew none. Per
  step: σ → σ' of each side, which steps draw noise (flowgrpo: τ > 0 on the step; official: τ(t) its predictor is
  given), and x' = the state the next model call evaluates at (both sides' transformer inputs; the last step: the
  returned x̂0). AWM's rollout trains no transition and has no log-probs.
- **Training times**: the official draw of ``time_type`` (discrete / discrete_wo_init) is the branch of main() in
  scripts/train_sd3_awm.py, read by AST and executed with ``torch.rand`` returning each of 64 evenly spaced u, on
  the official rollout's ``pipeline.scheduler.timesteps`` (what its loop stores); flowgrpo's is
  ``ForwardLearner.draws`` on the rollout plan's DrawSpace, over 256 sample keys. One row per grid point: its t on
  each side, whether each side can draw it, and (dx) the difference of the stratum it is drawn in (−1: never).
"""

from __future__ import annotations

import ast
import contextlib
from pathlib import Path
from types import SimpleNamespace

import torch

from parity import MethodReport, StepRow, import_folder, nested, tiny_sd3_recipe, recorded_step_noise, tolerance

CODE = "advantage_weighted_matching"
PATCH = f"{CODE}/flow_grpo/diffusers_patch"
SCRIPT = f"{CODE}/scripts/train_sd3_awm.py"
CONFIG = f"{CODE}/config/dgx_awm.py"
REPOSITORY = "scxue/advantage_weighted_matching"

# (reward, official config function): the settings compared
ROLLOUTS = (("geneval", "geneval_sd3_no_cfg_1node"), ("pickscore", "pickscore_sd3_no_cfg_1node"))
TIME_DRAWS = (("geneval", "geneval_sd3_no_cfg_1node"), ("ocr", "ocr_sd3_no_cfg_1node"),
              ("pickscore", "pickscore_sd3_no_cfg_1node"))
PROMPTS = ("a red cube", "two green cones")
U_GRID = 64  # evenly spaced u for the official draw's torch.rand
KEYS = 256  # sample keys of flowgrpo's draw


# ---------------------------------------------------------------------------------------------------- the checkout
def load_official(checkout) -> SimpleNamespace:
    """The checkout's pipeline and SA-Solver modules, imported as a private package (``_awm_official_<n>``)."""
    folder = Path(checkout.path) / PATCH
    if not (folder / "sd3_pipeline_with_logprob.py").is_file() or not (checkout.path / SCRIPT).is_file():
        raise FileNotFoundError(f"{checkout.path} is not a checkout of {REPOSITORY} (no {PATCH}/"
                                "sd3_pipeline_with_logprob.py or {SCRIPT})")
    pipeline, solver = import_folder(folder, "awm", "sd3_pipeline_with_logprob", "sa_solver")
    return SimpleNamespace(pipeline_with_logprob=pipeline.pipeline_with_logprob, solver=solver)


def official_config(checkout, function: str) -> SimpleNamespace:
    """The launch config ``function`` of config/dgx_awm.py, run by the ml_collections reader: {dotted key: value}
    as nested namespaces (config.sample.num_steps ...)."""
    from official import trace_ml_collections

    values, _ = trace_ml_collections(checkout, CONFIG, function, cwd=str(Path(checkout.path) / CODE))
    return nested({k: v.value for k, v in values.items()})


def time_branch(checkout, time_type: str):
    """The statements of main()'s ``elif config.time_type == '<time_type>':`` branch, compiled (read by AST)."""
    path = Path(checkout.path) / SCRIPT
    tree = ast.parse(path.read_text(), str(path))
    main = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    found = []
    for node in ast.walk(main[0]) if main else []:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and \
                ast.unparse(node.test) == f"config.time_type == '{time_type}'":
            found.append(node)
    if len(found) != 1:
        raise LookupError(f"{SCRIPT}: {len(found)} branches `config.time_type == '{time_type}'` in main()")
    return compile(ast.Module(body=found[0].body, type_ignores=[]), str(path), "exec"), found[0].lineno


# ---------------------------------------------------------------------------------------------------- flowgrpo
def flowgrpo_side(reward: str, extra: tuple[str, ...] = ()):
    """The awm preset trained on ``reward`` on the tiny SD3 (``parity.tiny_sd3_recipe``)."""
    return tiny_sd3_recipe("awm", [reward], extra)


@contextlib.contextmanager
def transformer_inputs(transformer):
    """Inside, every transformer call's (hidden_states, timestep) is kept, in order."""
    calls = []

    def hook(module, args, kwargs):
        x = kwargs.get("hidden_states", args[0] if args else None)
        calls.append((x.detach().clone(), kwargs["timestep"].detach().clone()))

    handle = transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


class _FedTorch:
    """``torch`` for the official SA-Solver module, whose ``randn_like`` returns the queued draws in order."""

    def __init__(self, queue: list):
        self._queue = queue

    def __getattr__(self, name):
        return getattr(torch, name)

    def randn_like(self, x, *args, **kwargs):
        if not self._queue:
            raise RuntimeError("the official SA-Solver asked for more noise than was queued")
        eps = self._queue.pop(0)
        if tuple(eps.shape) != tuple(x.shape):
            raise RuntimeError(f"the official SA-Solver asked for noise like {tuple(x.shape)}, got {tuple(eps.shape)}")
        return eps.to(device=x.device, dtype=x.dtype)


@contextlib.contextmanager
def official_solver_watched(solver_module, queue: list):
    """Inside, the official SA-Solver draws ``queue`` and records its grid (``sample``'s timesteps) and the τ its
    predictor gets at each step (0 at the final ``denoise_to_zero``)."""
    cls = solver_module.SASolver
    originals = {n: getattr(cls, n) for n in ("sample", "adams_bashforth_update_few_steps", "denoise_to_zero")}
    seen = {"grid": None, "tau": []}

    def sample(self, x, tau, total_timesteps, *args, **kwargs):
        seen["grid"] = total_timesteps.detach().clone()
        return originals["sample"](self, x, tau, total_timesteps, *args, **kwargs)

    def predictor(self, *args, **kwargs):
        seen["tau"].append(float(kwargs["tau"]))
        return originals["adams_bashforth_update_few_steps"](self, *args, **kwargs)

    def final(self, *args, **kwargs):
        seen["tau"].append(float(kwargs["tau"]))
        return originals["denoise_to_zero"](self, *args, **kwargs)

    torch_module = solver_module.torch
    cls.sample, cls.adams_bashforth_update_few_steps, cls.denoise_to_zero = sample, predictor, final
    solver_module.torch = _FedTorch(queue)
    try:
        yield seen
    finally:
        solver_module.torch = torch_module
        for n, f in originals.items():
            setattr(cls, n, f)


# ---------------------------------------------------------------------------------------------------- rollout
def compare_rollout(checkout, official, reward: str, function: str,
                    extra: tuple[str, ...] = ()) -> tuple[MethodReport, object]:
    """One rollout setting (see the module docstring); returns the report and the official pipeline's scheduler
    timesteps after the rollout (what its training loop stores)."""
    import samplers
    from samplers.solvers import sa_predictor_coefficients

    config = official_config(checkout, function)
    cfg, model, plan = flowgrpo_side(reward, extra)
    G = plan.roots_per_prompt
    cond = model.encode_prompts(list(PROMPTS))
    velocity = model.velocity_fn(cond, cfg.sampling.guidance_scale)
    with torch.no_grad(), recorded_step_noise() as draws, transformer_inputs(model.transformer) as ours_calls:
        rec = samplers.rollout(velocity, plan, prompt_ids=list(range(len(PROMPTS))), latent_shape=model.latent_shape(),
                               seed=cfg.train.seed, iteration=0, transitions=False)
    x_T = rec.root_state  # [P·G, *latent], prompt-major
    n = x_T.shape[0]
    root_prompt = torch.arange(n) // G
    leaves = torch.empty_like(rec.leaf_state)
    leaves[rec.leaf_root] = rec.leaf_state  # x_0 in root order
    sig = [float(s) for s in plan.sigmas.to(torch.float32)]
    T = plan.num_steps
    noisy = [i for i, st in enumerate(plan.steps)
             if sig[i + 1] > 0 and sa_predictor_coefficients(sig[i], sig[i + 1], st.sa_tau)[3] > 0]
    if len(draws) != len(noisy):
        raise RuntimeError(f"flowgrpo drew noise {len(draws)} times for {len(noisy)} noisy steps")
    eps = {i: d.reshape(x_T.shape) for i, d in zip(noisy, draws)}
    filler = torch.Generator().manual_seed(7)
    # official draws: one before the first step (unused there), then one at each step k = 1..T (flowgrpo's step k − 1)
    queue = [torch.randn(x_T.shape, generator=filler)]
    queue += [eps[k - 1] if (k - 1) in eps else torch.randn(x_T.shape, generator=filler) for k in range(1, T + 1)]
    used = list(queue)
    pipeline = model.pipeline
    with torch.no_grad(), official_solver_watched(official.solver, queue) as seen, \
            transformer_inputs(model.transformer) as theirs_calls:
        _, all_latents = official.pipeline_with_logprob(
            pipeline, prompt_embeds=cond.prompt_embeds[root_prompt],
            pooled_prompt_embeds=cond.pooled_prompt_embeds[root_prompt],
            num_inference_steps=config.sample.num_steps, guidance_scale=config.sample.guidance_scale, output_type="pt",
            return_dict=False, height=cfg.model.resolution, width=cfg.model.resolution, latents=x_T.clone(),
            noise_level=config.sample.noise_level, sde_frac=config.sample.sde_frac,
            use_sa_solver=config.train.use_sa_solver)
    if queue:
        raise RuntimeError(f"the official SA-Solver used {len(used) - len(queue)} of {len(used)} queued draws")
    grid = [float(s) for s in seen["grid"]]
    if len(ours_calls) != T or len(theirs_calls) != T or len(grid) != T + 1 or len(seen["tau"]) != T:
        raise RuntimeError(f"model calls ours {len(ours_calls)}, theirs {len(theirs_calls)}, official grid {len(grid)}"
                           f" points, official steps {len(seen['tau'])}; expected {T}, {T}, {T + 1}, {T}")
    first = ours_calls[0][0]
    if not torch.equal(first, x_T.to(first)):
        raise RuntimeError("flowgrpo's first model call is not at x_T in root order")
    report = MethodReport("awm", f"awm rollout [{reward}] (SA-Solver, tau {config.sample.noise_level:g})", REPOSITORY,
                          checkout.commit_of(f"{PATCH}/sa_solver.py"),
                          f"{PATCH}/sd3_pipeline_with_logprob.py pipeline_with_logprob (use_sa_solver=True), "
                          f"{PATCH}/sa_solver.py SASolver.sample; config {CONFIG}:{function}")
    final_theirs = all_latents[-1]
    for i in range(T):
        ours_x = ours_calls[i + 1][0] if i + 1 < T else leaves
        theirs_x = theirs_calls[i + 1][0] if i + 1 < T else final_theirs
        dx = (ours_x.double() - theirs_x.double()).abs().max().item()
        report.steps.append(StepRow(
            step=i, sigma=(sig[i], grid[i]), sigma_next=(sig[i + 1], grid[i + 1]),
            stochastic=(i in eps, seen["tau"][i] > 0), trained=(plan.steps[i].trained, False),
            dx=dx, tol_x=tolerance(ours_x)))
    timesteps = pipeline.scheduler.timesteps.detach().clone()
    sigmas_after = pipeline.scheduler.sigmas.detach().clone()
    report.notes += [
        f"flowgrpo plan: {plan.name}, {T} steps, {G} samples x {len(PROMPTS)} prompts; noisy steps {sorted(eps)}",
        f"official: tau {config.sample.noise_level:g} on steps {[i for i in range(T) if seen['tau'][i] > 0]}; its grid "
        f"{[round(g, 6) for g in grid]}",
        "x' is each side's next transformer input (SA-Solver's predicted state; the corrector is applied before the "
        "next prediction on both sides); the last step is the returned x̂0",
        f"official scheduler after the rollout: sigmas[0] = {float(sigmas_after[0]):.6g} (its edits are written into "
        f"the scheduler's own sigmas: .float() of a float32 tensor is that tensor), timesteps[0] = "
        f"{float(timesteps[0]):.6g} (unedited: what its training draws times from)",
    ]
    return report, timesteps


# ---------------------------------------------------------------------------------------------------- training times
def official_time_support(checkout, config, timesteps: torch.Tensor) -> tuple[list[dict[int, float]], int]:
    """[K] {grid index: probability} of the official draw of each stratum, over ``U_GRID`` evenly spaced u."""
    code, line = time_branch(checkout, config.time_type)
    K, B = config.train.train_timesteps, config.train.batch_size
    support: list[dict[int, float]] = [{} for _ in range(K)]
    for j in range(U_GRID):
        u = (j + 0.5) / U_GRID

        class Rand(_FedTorch):
            def rand(self, *size, device=None, **kwargs):
                shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
                return torch.full(tuple(shape), u, device=device)

        space = {"torch": Rand([]), "config": config, "accelerator": SimpleNamespace(device="cpu"),
                 "sample": {"timesteps": timesteps.repeat(B, 1)}}
        exec(code, space)  # noqa: S102 (the official branch, read from the checkout)
        drawn = space["timesteps"].reshape(-1)
        if drawn.numel() != K * B:
            raise RuntimeError(f"{SCRIPT}:{line}: {drawn.numel()} times for K={K} x B={B}")
        for k in range(K):
            t = drawn[k * B]
            if not bool((drawn[k * B:(k + 1) * B] == t).all()):
                raise RuntimeError(f"{SCRIPT}:{line}: stratum {k} is not one time for the micro-batch")
            index = int(space["t_indices"][k])
            if float(timesteps[index] / 1000) != float(t):  # float32, as the official division
                raise RuntimeError(f"{SCRIPT}:{line}: time {float(t)} is not timesteps[{index}] / 1000")
            support[k][index] = support[k].get(index, 0.0) + 1.0 / U_GRID
    return support, line


def flowgrpo_time_support(cfg, plan) -> tuple[list[dict[int, float]], torch.Tensor]:
    """[K] {grid index: frequency} of flowgrpo's draw over ``KEYS`` sample keys, and its grid [T]."""
    from flowgrpo.engine.learners.forward import DrawSpace, ForwardLearner

    space = DrawSpace.of(SimpleNamespace(plan=plan, iteration=0), (1,))
    learner = SimpleNamespace(cfg=cfg)
    K = cfg.learner.train_times
    support: list[dict[int, float]] = [{} for _ in range(K)]
    for key in range(KEYS):
        t, _ = ForwardLearner.draws(learner, SimpleNamespace(key=(key, 1_000_000)), 0, space)
        for k in range(K):
            index = int((space.grid == t[k]).nonzero().reshape(-1)[0])
            support[k][index] = support[k].get(index, 0.0) + 1.0 / KEYS
    return support, space.grid


def compare_times(checkout, reward: str, function: str, timesteps: torch.Tensor) -> MethodReport:
    config = official_config(checkout, function)
    cfg, _, plan = flowgrpo_side(reward)
    if timesteps.numel() != config.sample.num_steps:
        raise RuntimeError(f"{function} samples {config.sample.num_steps} steps; the official timesteps have "
                           f"{timesteps.numel()}")
    theirs, line = official_time_support(checkout, config, timesteps)
    ours, grid = flowgrpo_time_support(cfg, plan)
    stratum = lambda support, i: next((k for k, s in enumerate(support) if i in s), -1)  # noqa: E731
    report = MethodReport("awm", f"awm training times [{reward}] ({config.time_type})", REPOSITORY,
                          checkout.commit_of(SCRIPT), f"{SCRIPT}:{line} (main(), time_type {config.time_type!r}); "
                          f"config {CONFIG}:{function}")
    T = grid.numel()
    official = (timesteps / 1000).tolist()  # float32, as its training divides them
    for i in range(T):
        nxt = (float(grid[i + 1]), official[i + 1]) if i + 1 < T else (0.0, 0.0)
        report.steps.append(StepRow(
            step=i, sigma=(float(grid[i]), official[i]), sigma_next=nxt, stochastic=(False, False),
            trained=(stratum(ours, i) >= 0, stratum(theirs, i) >= 0),
            dx=float(abs(stratum(ours, i) - stratum(theirs, i))), tol_x=0.0))
    fmt = lambda support: [{i: round(p, 3) for i, p in sorted(s.items())} for s in support]  # noqa: E731
    report.notes += [
        f"official strata (grid index: probability over {U_GRID} evenly spaced u): {fmt(theirs)}",
        f"flowgrpo strata (grid index: frequency over {KEYS} sample keys): {fmt(ours)}",
        f"the official draw gives the {config.train.batch_size} samples of a micro-batch the same {len(theirs)} times; "
        "flowgrpo draws them per sample (learner.share_times=draw)",
        "rows: a grid point's t (flowgrpo: the plan's grid before grid_ends; official: scheduler.timesteps / 1000), "
        "whether each side can draw it, dx = the difference of the stratum it is drawn in (−1: never)",
    ]
    return report


def run(checkout) -> list[MethodReport]:
    official = load_official(checkout)
    reports, timesteps = [], None
    for reward, function in ROLLOUTS:
        report, timesteps = compare_rollout(checkout, official, reward, function)
        reports.append(report)
    for reward, function in TIME_DRAWS:
        reports.append(compare_times(checkout, reward, function, timesteps))
    return reports


__all__ = ["ROLLOUTS", "TIME_DRAWS", "compare_rollout", "compare_times", "load_official", "run"]
