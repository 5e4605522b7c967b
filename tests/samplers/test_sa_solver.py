"""SA-Solver rollouts (samplers/solvers.py: sa_solver_step; docs/math.md §1), AWM's grid edits (samplers/compose.py:
edit_grid_ends) and their plan options.

The reference is diffusers' SASolverScheduler (flow sigmas, flow prediction, data prediction, predictor and corrector
order 2), stepped by hand on the same float32 grid with the same noise: its ``randn_tensor`` is patched to hand out
the draws of the executor's documented step-noise streams, and its ``last_sample`` is cleared after the first step,
which is how AWM's own sampler runs (``disable_first_corrector``). Both run in float64, and every state the model
is called at (the predicted points, PEC) and the final x_0 are compared. The velocity is a closed-form nonlinear
field, so the multistep terms matter.
Run: pytest tests/samplers/test_sa_solver.py -q
"""

import math

import pytest
import torch

from samplers import compose_plan, make_generator, rollout, sample_ode, time_grid
from samplers.grids import STREAM_STEP_NOISE
from samplers.compose import AWM_FIRST_SIGMA, edit_grid_ends
from samplers.solvers import sa_corrector_coefficients, sa_predictor_coefficients, sa_solver_step

SEED, ITERATION, PROMPTS, LATENT = 4, 2, [3, 8], (2, 3)
M, S0 = 0.5, 0.6


def field(x, sigma, cond_index):
    """A nonlinear velocity, the same for every row (closed form, elementwise: batch-invariant)."""
    s = sigma.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
    return x * (0.5 + s) - 0.3 * torch.sin(2.0 * x) + s * s - 0.2


def recording(velocity):
    """The velocity, and the list of the states it is called at (one entry per level)."""
    calls = []

    def wrapped(x, sigma, cond_index):
        calls.append(x.clone())
        return velocity(x, sigma, cond_index)

    return wrapped, calls


def awm_plan(tau, steps=10, grid="scheduler", **options):
    return compose_plan(steps, kernel="ode", solver="sa_solver", grid=grid, sa_tau=tau, sa_tau_window=(0.3, 0.9),
                        grid_ends="awm", group_size=1, **options)


def step_noise(plan, level):
    """The executor's ε for the step out of ``level`` in a one-root chain: stream 2 of the node at that level."""
    rows = [torch.randn((1,) + LATENT, generator=make_generator(STREAM_STEP_NOISE, SEED, ITERATION, pid, level))[0]
            for pid in PROMPTS]
    return torch.stack(rows).to(torch.float64)


def diffusers_states(plan, x_T, monkeypatch):
    """The states diffusers' SASolverScheduler calls the model at, and its x_0 (x̂0 at the last point)."""
    diffusers = pytest.importorskip("diffusers")
    import diffusers.schedulers.scheduling_sasolver as module

    sig = plan.sigmas.to(torch.float32).to(torch.float64)
    T = plan.num_steps
    taus = [s.sa_tau for s in plan.steps]
    scheduler = diffusers.SASolverScheduler(
        use_flow_sigmas=True, prediction_type="flow_prediction", algorithm_type="data_prediction",
        predictor_order=2, corrector_order=2, lower_order_final=True, tau_func=lambda i: taus[i],
    )
    scheduler.set_timesteps(T)
    scheduler.sigmas = sig.clone()  # the plan's float32 grid, held in float64
    scheduler.timesteps = torch.arange(T)  # the "timestep" handed to step() is the step index: tau_func reads it
    scheduler.set_begin_index(0)
    draws = [step_noise(plan, i) if taus[i] > 0 else torch.zeros((len(PROMPTS),) + LATENT, dtype=torch.float64)
             for i in range(T)]
    monkeypatch.setattr(module, "randn_tensor", lambda shape, **kwargs: draws.pop(0))

    x, states = x_T.clone(), []
    cond = torch.zeros(len(PROMPTS), dtype=torch.long)
    for i in range(T - 1):
        states.append(x)
        v = field(x, torch.full((len(PROMPTS),), float(sig[i]), dtype=torch.float32), cond)
        x = scheduler.step(v, i, x).prev_sample
        if i == 0:
            scheduler.last_sample = None  # AWM's sampler never corrects the first step
    states.append(x)
    v = field(x, torch.full((len(PROMPTS),), float(sig[T - 1]), dtype=torch.float32), cond)
    return states, x - sig[T - 1] * v  # the last step returns x̂0 (diffusers' own would divide by λ = +inf)


@pytest.mark.parametrize("tau", [0.4, 0.0])
def test_every_state_matches_diffusers_sa_solver_with_the_same_noise(tau, monkeypatch):
    plan = awm_plan(tau)
    if tau:
        assert 0 < sum(s.sa_tau > 0 for s in plan.steps) < plan.num_steps  # the window: some steps noisy, some not
    velocity, calls = recording(field)
    record = rollout(velocity, plan, prompt_ids=PROMPTS, latent_shape=LATENT, seed=SEED, iteration=ITERATION,
                     dtype=torch.float64)
    theirs, final = diffusers_states(plan, record.root_state, monkeypatch)
    assert len(calls) == len(theirs) == plan.num_steps
    # float64 both: 4 ulps of the states' scale per step (measured: at most 2 ulps after 10 steps)
    tolerance = 4 * plan.num_steps * torch.finfo(torch.float64).eps * max(float(t.abs().max()) for t in theirs)
    for i, (mine, ref) in enumerate(zip(calls, theirs)):
        torch.testing.assert_close(mine, ref, rtol=0, atol=tolerance,
                                   msg=lambda m, i=i: f"state at level {i} (σ = {float(plan.sigmas[i]):.4f}): {m}")
    torch.testing.assert_close(record.leaf_state, final, rtol=0, atol=tolerance)


def test_the_comparison_sees_the_corrector_and_the_noise(monkeypatch):
    """What the test above would catch: without the corrector (order 0) or without noise the states move by far more
    than its tolerance (here > 1e-4 of the values' scale; the tolerance is 40 float64 ulps, ~1e-14)."""
    theirs, final = None, None
    for options in ({"sa_corrector_order": 0}, {"tau": 0.0}, {"sa_predictor_order": 1}):
        tau = options.pop("tau", 0.4)
        plan = awm_plan(tau, **options)
        record = rollout(field, plan, prompt_ids=PROMPTS, latent_shape=LATENT, seed=SEED, iteration=ITERATION,
                         dtype=torch.float64)
        if final is None:
            _, final = diffusers_states(awm_plan(0.4), record.root_state, monkeypatch)
        gap = float((record.leaf_state - final).abs().max()) / float(final.abs().max())
        assert gap > 1e-4, (options, tau, gap)


def test_noise_is_a_pure_function_of_the_seed_parts():
    plan = compose_plan(8, kernel="ode", solver="sa_solver", sa_tau=0.7, grid_ends="awm", group_size=3)
    run = lambda ids, **kw: rollout(field, plan, prompt_ids=ids, latent_shape=LATENT, **{  # noqa: E731
        "seed": SEED, "iteration": ITERATION, **kw})
    first, again = run([5, 9]), run([5, 9])
    assert torch.equal(first.leaf_state, again.leaf_state)
    # shared x_T: a group's chains differ only by the SA noise, drawn per node
    leaves = first.leaf_state.view(2, 3, *LATENT)
    assert not torch.equal(leaves[0, 0], leaves[0, 1])
    # one prompt alone, or on another process, gets the same draws
    assert torch.equal(run([9]).leaf_state, first.leaf_state[3:])
    assert not torch.equal(run([5, 9], iteration=ITERATION + 1).leaf_state, first.leaf_state)
    assert not torch.equal(run([5, 9], seed=SEED + 1).leaf_state, first.leaf_state)


def test_tau_zero_is_deterministic_and_the_evaluation_rollout():
    plan = compose_plan(8, kernel="ode", solver="sa_solver", grid_ends="awm", group_size=2, initial_noise="shared")
    record = rollout(field, plan, prompt_ids=[1, 2], latent_shape=LATENT, seed=SEED)
    leaves = record.leaf_state.view(2, 2, *LATENT)
    assert torch.equal(leaves[:, 0], leaves[:, 1])  # no noise: a shared x_T gives one sample
    x0 = sample_ode(field, record.root_state, plan.sigmas, torch.tensor([0, 0, 1, 1]), "sa_solver")
    assert torch.equal(x0, record.leaf_state)


def gaussian_velocity(x, sigma, cond_index):
    s = sigma.to(torch.float64).view(-1, *([1] * (x.dim() - 1)))
    a = 1 - s
    var = a * a * S0 * S0 + s * s
    return ((s - a * S0 * S0) / var * (x.to(torch.float64) - a * M) - M).to(x.dtype)


def test_tau_zero_is_second_order_on_an_interior_grid():
    """Gaussian data (exact flow map known, tests/samplers/test_solvers.py): the error falls towards 4x per halving
    (a large third-order term makes it 6x on coarse grids; DPM-Solver++(2M) sits at 4.0 there)."""
    x = torch.tensor([[1.3], [-0.7], [0.2]], dtype=torch.float64)

    def error(T):
        grid = torch.linspace(0.9, 0.1, T + 1, dtype=torch.float64)
        s32 = grid.to(torch.float32).double()
        lo, hi = float(s32[0]), float(s32[-1])
        std = lambda s: math.sqrt((1 - s) ** 2 * S0**2 + s**2)  # noqa: E731
        exact = (1 - hi) * M + std(hi) / std(lo) * (x - (1 - lo) * M)
        out = sample_ode(gaussian_velocity, x, grid, torch.zeros(3, dtype=torch.long), "sa_solver")
        return float((out - exact).abs().max())

    errors = [error(T) for T in (80, 160, 320, 640)]
    ratios = [a / b for a, b in zip(errors, errors[1:])]  # measured 5.06, 4.61, 4.33: down to 4 from above
    assert all(3.8 < r < 5.5 for r in ratios) and ratios == sorted(ratios, reverse=True), (errors, ratios)


def test_coefficients_reduce_to_the_ode_and_to_full_renoising():
    # τ = 0, first order: DDIM in flow form, x' = (σ'/σ)x + (α' − ασ'/σ)·x̂0
    a, b, c, s = sa_predictor_coefficients(0.7, 0.5, 0.0)
    assert (a, c, s) == (0.5 / 0.7, 0.0, 0.0) and b == pytest.approx(0.5 - 0.3 * 0.5 / 0.7, rel=1e-14)
    # from σ = 1 with τ > 0 the state is forgotten: x' = α'·x̂0 + σ'·ε
    a, b, c, s = sa_predictor_coefficients(1.0, 0.8, 0.5)
    assert a == 0.0 and b == pytest.approx(0.2, rel=1e-14) and s == pytest.approx(0.8, rel=1e-14)
    # after σ_prev = 1 the predictor is first order; the corrector refuses a step from σ = 1
    assert sa_predictor_coefficients(0.9, 0.8, 0.3, prev_sigma=1.0)[2] == 0.0
    with pytest.raises(ValueError, match="sigma = 1"):
        sa_corrector_coefficients(1.0, 0.8, 0.3)
    # the final step returns x̂0
    x, v = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    assert torch.equal(sa_solver_step(x, v, 0.2, 0.0, tau=0.4), x - 0.2 * v)
    with pytest.raises(ValueError, match="pass noise"):
        sa_solver_step(x, v, 0.6, 0.5, tau=0.4)


def test_awm_grid_ends_and_the_tau_window():
    base = time_grid(14, 3.0, spacing="scheduler")
    edited = edit_grid_ends(base, "awm")
    assert float(edited[0]) == AWM_FIRST_SIGMA == 1 - 1e-3
    assert float(edited[-2]) == float(base[-3]) / 2 and float(edited[-1]) == 0.0
    assert torch.equal(edited[1:-2], base[1:-2]) and torch.equal(edit_grid_ends(base, "exact"), base)
    plan = compose_plan(14, kernel="ode", solver="sa_solver", grid="scheduler", grid_ends="awm", sa_tau=0.4,
                        sa_tau_window=(0.3, 0.9))
    assert torch.equal(plan.sigmas, edited)
    s32 = plan.sigmas.to(torch.float32).tolist()
    assert [s.sa_tau for s in plan.steps] == [0.4 if 0.3 <= s32[i + 1] <= 0.9 else 0.0 for i in range(14)]
    assert [i for i, s in enumerate(plan.steps) if s.sa_tau] == list(range(3, 11))  # σ' from 0.87 down to 0.36
    with pytest.raises(ValueError, match="at least 2 steps"):
        compose_plan(1, kernel="ode", solver="sa_solver", grid_ends="awm")
    with pytest.raises(ValueError, match="grid_ends must be one of"):
        compose_plan(4, kernel="ode", grid_ends="awm_like")
    with pytest.raises(ValueError, match="sa_tau_window"):
        compose_plan(4, kernel="ode", solver="sa_solver", sa_tau_window=(0.9, 0.3))
    with pytest.raises(ValueError, match="side lanes"):
        compose_plan(4, kernel="ode", solver="sa_solver", side_steps=(0,), side_children=2)
    # τ is drawn only on SA-Solver steps: an SDE window keeps its kernel, the steps around it take τ
    mixed = compose_plan(8, kernel="flow_sde", window=(2, 2), solver="sa_solver", sa_tau=0.5)
    assert [s.sa_tau for s in mixed.steps] == [0.5, 0.5, 0, 0, 0.5, 0.5, 0.5, 0.5]
