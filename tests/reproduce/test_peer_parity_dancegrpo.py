"""DanceGRPO step by step against XueZeyue/DanceGRPO's sampler (reproduce/parity/dancegrpo.py) on a tiny FLUX, where
DANCEGRPO_PATH names a checkout of it (the comparison reads that code at run time; the project ships none of it): the
σ grid, every step stochastic, which steps each sample trains (the same permutation fed to both: 9 of the first 15),
x' and the log-prob of every step of every sample of the group, within float32 ulps of the values, with the recipe's
options as it resolves them (integer timesteps, the float32 grid). Beside the rows, the rewarded sample (leaf
predicted), the advantages (std_correction 1) and the optimizer steps' composition (update_split samples) equal the
official ones; each with its option off differs (the report's controls), and a changed η fails."""

import math
import sys
from pathlib import Path

import pytest
from official_checkouts import needs_checkout, note, number

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "reproduce"))


CODE = "dancegrpo"
pytestmark = [pytest.mark.usefixtures("one_thread"), needs_checkout(CODE)]


@pytest.fixture(scope="module")
def report(checkout):
    from parity import dancegrpo

    reports = dancegrpo.run(checkout)
    assert len(reports) == 1
    return reports[0]


def test_the_plan_follows_the_official_sampler_step_by_step(report):
    bad = [s for s in report.steps if not s.ok]
    assert report.ok, f"{len(bad)} of {len(report.steps)} rows differ, first {bad[:1]}; {report.notes}"
    assert len(report.steps) == 12 * 16  # every sample of the group, every step
    assert all(s.stochastic == (True, True) and s.dlogp is not None for s in report.steps)
    for g in range(12):
        rows = report.steps[16 * g: 16 * (g + 1)]
        trained = [s.step for s in rows if s.trained[1]]
        assert len(trained) == 9 and max(trained) < 15  # int(15 x 0.6) of all steps but the last, per sample
    assert len({tuple(s.trained[1] for s in report.steps[16 * g: 16 * (g + 1)]) for g in range(12)}) > 1
    assert "told: True (sampling.integer_timesteps=True, grid linear_float32" in note(report, "timesteps")


def test_the_rewarded_sample_the_advantages_and_the_steps_are_the_officials(report):
    """leaf=predicted: the samples are the official decoded x̂0 within tolerance (the last x', leaf=sample, keeps the
    last step's noise); std_correction=1: the official advantages (0: sqrt(12/11) times them); update_split=samples: 4
    whole samples a step as the official (groups: one step takes all 12)."""
    sample = note(report, "the rewarded sample")
    assert number(sample, "max |Δ| ") <= number(sample, "(tolerance "), sample
    rms, std = number(sample, "RMS "), number(sample, "std ")
    assert 0.5 * std < rms < 2 * std, sample
    adv = note(report, "advantages of rewards")
    assert number(adv, "max |Δ| ") <= number(adv, "(tolerance "), adv
    assert number(adv, "the official = ") == pytest.approx(math.sqrt(12 / 11), rel=1e-4)
    steps = note(report, "optimizer steps")
    assert "the official [4, 4, 4] samples a step" in steps and "(train.update_split=samples) [4, 4, 4]" in steps
    assert "transitions per sample [9]" in steps and "update_split=groups: [12, 0, 0]" in steps


def test_the_integer_timesteps_off_fails(report):
    """The network told 1000σ instead of ⌊1000σ⌋ moves x' far beyond the tolerance (the report's control)."""
    drift = note(report, "control, sampling.integer_timesteps=false")
    worst_tol = max(s.tol_x for s in report.steps)
    assert number(drift, "max |Δx'| ") > 10 * worst_tol, drift


def test_another_eta_fails(checkout):
    from parity import dancegrpo

    changed = dancegrpo.run(checkout, ("sampling.plan.eta=0.31",))[0]
    assert not changed.ok and all(s.trained[0] == s.trained[1] for s in changed.steps)
    assert max(s.dx / s.tol_x for s in changed.steps) > 10
