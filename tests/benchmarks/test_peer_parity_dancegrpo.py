"""DanceGRPO step by step against XueZeyue/DanceGRPO's sampler (benchmarks/parity/dancegrpo.py) on a tiny FLUX, where
DANCEGRPO_PATH names a checkout of it (the comparison reads that code at run time; the project ships none of it): the
σ grid, every step stochastic, which steps each sample trains (the same permutation fed to both: 9 of the first 15),
x' and the log-prob of every step of every sample of the group, within float32 ulps of the values. The differences
the notes measure (the timestep's truncation, the rewarded sample, the advantages' std) are checked to be what the map
says, and a changed η fails."""

import math
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from official import Checkout  # noqa: E402
from official.dancegrpo import ENV, REPOSITORY  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not os.environ.get(ENV), reason=f"set {ENV} to a checkout of {REPOSITORY}")]


@pytest.fixture(scope="module")
def checkout():
    return Checkout.from_env(REPOSITORY, ENV)


@pytest.fixture(scope="module")
def report(checkout):
    from parity import dancegrpo

    reports = dancegrpo.run(checkout)
    assert len(reports) == 1
    return reports[0]


def note(report, start: str) -> str:
    found = [n for n in report.notes if n.startswith(start)]
    assert len(found) == 1, (start, report.notes)
    return found[0]


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


def test_the_measured_differences_are_the_maps(report):
    """The official timestep's truncation moves x' far beyond the tolerance; the reward scores the last step's x̂0 where
    flowgrpo decodes the last x' (noise of std 0.3·sqrt(σ_15)); flowgrpo's advantages are sqrt(12/11) the official's."""
    drift = note(report, "without the timestep's truncation")
    assert float(drift.rsplit(", ", 1)[1].split(" of")[0]) > 1e-4, drift
    sample = note(report, "the rewarded sample")
    within = float(sample.split("its last step within ")[1].split(")")[0])
    rms = float(sample.split("RMS ")[1].split(" ")[0])
    std = float(sample.split("std ")[1].rstrip(")"))
    assert within < 1e-4 and 0.5 * std < rms < 2 * std, sample
    ratio = float(note(report, "advantages of rewards").split("= ")[1].split(" ")[0])
    assert ratio == pytest.approx(math.sqrt(12 / 11), rel=1e-4)


def test_another_eta_fails(checkout):
    from parity import dancegrpo

    changed = dancegrpo.run(checkout, ("sampling.plan.eta=0.31",))[0]
    assert not changed.ok and all(s.trained[0] == s.trained[1] for s in changed.steps)
    assert max(s.dx / s.tol_x for s in changed.steps) > 10
