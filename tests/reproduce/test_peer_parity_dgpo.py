"""reproduce/parity/dgpo.py: DGPO's own rollout (its pipeline with the DPMSolverMultistepScheduler its training
script installs, on that scheduler's own grid, CFG 4.5) against flowgrpo's ``dgpo`` preset on the real-model recipe,
step by step, when DGPO_PATH names a checkout of Luo-Yihong/DGPO (its code is loaded from there at run time; the
project ships none of it)."""

import sys
from pathlib import Path

import pytest
from official_checkouts import needs_checkout

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reproduce"))

CODE = "dgpo"
pytestmark = [pytest.mark.usefixtures("one_thread"), needs_checkout(CODE)]

RECIPE = "dgpo rollout [geneval] (DPMSolverMultistepScheduler, 10 steps)"


def test_every_dgpo_rollout_equals_the_official_code_step_by_step(reports):
    """The recipe (grid dpmsolver, integer model timesteps, DPM-Solver++(2M) with CFG 4.5) is the official rollout at
    every step: second order from the second step on (σ_0 = shift(0.999) < 1), deterministic, nothing stored."""
    assert sorted(reports) == [RECIPE]
    for r in reports.values():
        print(r.line())
    bad = {name: [s for s in r.steps if not s.ok] for name, r in reports.items() if not r.ok}
    assert not bad, bad
    r = reports[RECIPE]
    assert not any(any(s.stochastic) or any(s.trained) for s in r.steps)
    first = 3 * 0.999 / (1 + 2 * 0.999)  # shift(0.999) = 0.99967
    assert r.steps[0].sigma[0] == r.steps[0].sigma[1] == pytest.approx(first, rel=1e-7) and first < 1.0


def test_the_recipe_tells_the_model_the_schedulers_integer_timesteps(reports):
    """The official rollout calls the model at its scheduler's int64 timesteps (999, 963, ...); the recipe's
    sampling.integer_timesteps makes flowgrpo's calls the same integers."""
    note = next(n for n in reports[RECIPE].notes if n.startswith("timesteps the transformer gets"))
    assert "sampling.integer_timesteps=True" in note
    ours = note.split("flowgrpo ")[1].split(" (sampling")[0]
    theirs = note.split("official ")[1]
    assert ours == theirs and ours.startswith("[999.0, 963.0, 922.0")


def test_the_dpmsolver_grid_is_the_official_schedulers():
    """samplers.grids' dpmsolver spacing (the recipe's grid) is DPMSolverMultistepScheduler's flow sigmas."""
    import torch
    from diffusers import DPMSolverMultistepScheduler

    from samplers.grids import time_grid

    for steps, shift in ((10, 3.0), (14, 3.0), (25, 1.0)):
        scheduler = DPMSolverMultistepScheduler(flow_shift=shift, use_flow_sigmas=True,
                                                prediction_type="flow_prediction")
        scheduler.set_timesteps(steps)
        assert torch.equal(time_grid(steps, shift, spacing="dpmsolver").to(torch.float32), scheduler.sigmas.float())


@pytest.mark.parametrize("override, broken", [
    ("sampling.plan.grid=linear", "sigma"),  # the linear grid: every σ but the last 2e-4 to 3.8e-4 above the official
    ("sampling.integer_timesteps=false", "x"),  # the model told σ·1000: x' differs from the first step on
])
def test_a_changed_plan_is_caught(checkout, override, broken):
    """Negative controls: the comparison with one option of the recipe turned off fails where it should."""
    from parity import dgpo

    report = dgpo.compare_rollout(checkout, dgpo.load_official(checkout), extra=(override,))
    assert not report.ok
    if broken == "sigma":
        gaps = [s.sigma[0] - s.sigma[1] for s in report.steps]
        assert all(2e-4 < g < 3.8e-4 for g in gaps) and report.steps[-1].sigma_next == (0.0, 0.0)
    else:
        assert all(s.sigma[0] == s.sigma[1] and s.sigma_next[0] == s.sigma_next[1] for s in report.steps)
        assert not report.steps[0].ok  # σ_0 = 0.99967: 999.67, not 999
        assert max(s.dx for s in report.steps) > 100 * max(s.tol_x for s in report.steps)


@pytest.mark.parametrize("launch, indices", [("geneval", 5), ("ocr", 7), ("pickscore", 7)])
def test_the_training_times_are_the_official_integer_timesteps(checkout, launch, indices):
    """DGPO trains at t/1000 of its scheduler's int64 timesteps (0.999, 0.963, ...) and tells the model t; flowgrpo's
    forward learner with learner.integer_times (the recipe's) draws exactly those times from the same grid indices
    0..trunc_steps and tells the model the same integers (reproduce/official/map/dgpo.yaml code.train_sigma)."""
    from parity import dgpo

    times = dgpo.training_times(checkout, launch)
    assert len(times["official"]) == len(times["flowgrpo"]) == indices
    assert times["official_timesteps"][:5] == [999, 963, 922, 874, 817]
    assert all(abs(g) <= 1e-7 for g in times["gaps"]), times
    assert times["flowgrpo_model_time"] == times["official_timesteps"]
