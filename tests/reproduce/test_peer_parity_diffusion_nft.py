"""reproduce/parity/diffusion_nft.py: DiffusionNFT's own rollout (its pipeline with its dpm2 solver, on the grid its
scheduler computes) against flowgrpo's ``diffusion_nft`` preset on the real-model recipe, step by step, when
DIFFUSION_NFT_PATH names a checkout of NVlabs/DiffusionNFT (its code is loaded from there at run time; the project
ships none of it)."""

import sys
from pathlib import Path

import pytest
from official_checkouts import needs_checkout

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reproduce"))

CODE = "diffusion_nft"
pytestmark = [pytest.mark.usefixtures("one_thread"), needs_checkout(CODE)]


def test_every_diffusion_nft_rollout_equals_the_official_code_step_by_step(reports):
    assert sorted(reports) == ["diffusion_nft rollout [geneval] (dpm2, 10 steps)",
                               "diffusion_nft rollout [several] (dpm2, 25 steps)"]
    bad = {name: [s for s in r.steps if not s.ok] for name, r in reports.items() if not r.ok}
    assert not bad, bad
    for r in reports.values():
        print(r.line())
        assert not any(any(s.stochastic) or any(s.trained) for s in r.steps)  # deterministic, nothing stored


def test_the_grid_is_the_schedulers_own_down_to_0_0089(reports):
    """The pipeline's sigmas=None: FlowMatchEulerDiscreteScheduler's spacing (shift 3), not the linear grid."""
    import torch

    from samplers.grids import time_grid

    for name, steps in (("geneval", 10), ("several", 25)):
        r = next(r for n, r in reports.items() if f"[{name}]" in n)
        theirs = [s.sigma[1] for s in r.steps] + [r.steps[-1].sigma_next[1]]
        assert theirs == time_grid(steps, 3.0, spacing="scheduler").to(torch.float32).tolist()
        assert 0.0089 < theirs[-2] < 0.009 and theirs[0] == 1.0  # shift(shift(1/1000)), not the linear 1/T's


def test_the_recipe_tells_the_model_the_official_integer_timesteps(reports):
    """The official rollout calls the model at int(σ·1000) (torch.long); the recipe's sampling.integer_timesteps makes
    flowgrpo's calls the same integers (960, not 960.13), the kernels stepping the float σ."""
    for r in reports.values():
        note = next(n for n in r.notes if n.startswith("timesteps the transformer gets"))
        assert "sampling.integer_timesteps=True" in note
        ours, theirs = note.split("flowgrpo ")[1].split(" (sampling")[0], note.split("official ")[1].split(" (torch")[0]
        assert [float(t) for t in ours.strip("[]").split(", ")] == [float(t) for t in theirs.strip("[]").split(", ")]


@pytest.mark.parametrize("override, broken", [
    ("sampling.plan.grid=linear", "sigma"),  # the linear grid: every interior σ differs
    ("sampling.plan.solver=euler", "x"),  # the same grid, first-order steps: x' differs from the third step on
    ("sampling.integer_timesteps=false", "timesteps"),  # the model told σ·1000: x' differs from the second step on
])
def test_a_changed_plan_is_caught(checkout, override, broken):
    """Negative controls: the same comparison with one setting of flowgrpo's plan changed fails where it should."""
    from parity import diffusion_nft

    report = diffusion_nft.compare_rollout(checkout, diffusion_nft.load_official(checkout), "geneval", ["geneval"],
                                           "sd3_geneval", extra=(override,))
    assert not report.ok
    wrong = [s for s in report.steps if not s.ok]
    if broken == "sigma":
        assert wrong[0].step == 0 and wrong[0].sigma_next[0] != wrong[0].sigma_next[1]
    elif broken == "timesteps":
        # step 0 is at σ = 1 (timestep 1000 on both sides); from σ_1 = 0.96013 on the model is told 960.13, not 960
        assert all(s.sigma[0] == s.sigma[1] for s in report.steps)
        assert report.steps[0].dx == 0.0 and report.steps[1].dx > 0.0
        assert max(s.dx for s in wrong) > 100 * max(s.tol_x for s in wrong)
    else:
        assert all(s.sigma[0] == s.sigma[1] for s in report.steps)
        # steps 0 and 1 are first order on both sides: at step 1 the previous σ is 1, whose λ is −∞ (the official
        # dpm_step's D1 = (1/r0)·(m0 − m1) = 0, flowgrpo's dpmpp_2m falls back to first order)
        assert report.steps[0].ok and report.steps[1].ok and wrong[0].step == 2
