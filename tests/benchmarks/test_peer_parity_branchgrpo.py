"""BranchGRPO and BranchGRPO-Mix step by step against Fredreic1849/BranchGRPO's tree sampler
(benchmarks/parity/branchgrpo.py) on a tiny FLUX, where BRANCHGRPO_PATH names a checkout of it (the comparison reads
that code at run time; the project ships none of it). With flowgrpo's split_noise=scaled_compat (the code's form):
the σ grid, which steps are stochastic and trained, x' of every node and the log-prob of every SDE edge, within
float32 ulps of the values. The one step where the official run differs (BranchGRPO trains its last step, flowgrpo
never does) differs in that alone; the measured differences (the advantages' std, the default split noise, the
rewarded sample, the -Mix window) are what the map says; independent split noise fails."""

import math
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from official import Checkout  # noqa: E402
from official.branchgrpo import ENV, REPOSITORY  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not os.environ.get(ENV), reason=f"set {ENV} to a checkout of {REPOSITORY}")]


@pytest.fixture(scope="module")
def checkout():
    return Checkout.from_env(REPOSITORY, ENV)


@pytest.fixture(scope="module")
def reports(checkout):
    from parity import branchgrpo

    return {r.method.split(" ")[0]: r for r in branchgrpo.run(checkout)}


def note(report, start: str) -> str:
    found = [n for n in report.notes if n.startswith(start)]
    assert len(found) == 1, (start, report.notes)
    return found[0]


def test_the_tree_follows_the_official_sampler_step_by_step(reports):
    mix = reports["branchgrpo_mix"]
    assert mix.ok, f"{[s for s in mix.steps if not s.ok][:1]}; {mix.notes}"
    assert [s.step for s in mix.steps if s.stochastic[1]] == [0, 1, 2, 3, 6, 9]
    assert [s.step for s in mix.steps if s.trained[1]] == [0, 1, 2, 3, 6, 9]
    tree = reports["branchgrpo"]
    bad = [s for s in tree.steps if not s.ok]
    assert [s.step for s in bad] == [19], bad  # the official trains its last step; flowgrpo never does
    last = bad[0]
    assert last.trained == (False, True) and last.stochastic == (True, True)
    assert last.dx <= last.tol_x and last.dlogp <= last.tol_logp
    assert all(s.stochastic == (True, True) and s.dlogp is not None for s in tree.steps)
    assert "official code's 218" in note(tree, "trained transitions per tree") and "flowgrpo's 202" in note(
        tree, "trained transitions per tree")
    assert "official code's 34" in note(mix, "trained transitions per tree")


def test_the_measured_differences_are_the_maps(reports):
    for report in reports.values():
        ratios = note(report, "depth-wise advantages").split(": ")[1].split(" =")[0]
        for n, ratio in eval(ratios):  # noqa: S307 (the report's own list of (nodes, ratio))
            assert ratio == pytest.approx(math.sqrt(n / (n - 1)), rel=1e-3)
        split = note(report, "split noise")
        code = float(split.split("the code's ")[1].split(" ")[0])
        default = float(split.split("(correlated) ")[1].split(" ")[0])
        assert 12 < code < 20 and 0.7 < default < 1.3, split  # c² = 16 against the Gaussian's 1
        drift = note(report, "without the timestep's truncation")
        assert float(drift.rsplit(", ", 1)[1].split(" of")[0]) > 1e-4, drift
    assert float(note(reports["branchgrpo"], "the rewarded sample").split("RMS ")[1].split(" ")[0]) > 0.05
    window = note(reports["branchgrpo_mix"], "the window")
    assert "official's [1, 2] in every iteration" in window and "25: [1, 2, 4]" in window


def test_independent_split_noise_fails(checkout):
    from parity import branchgrpo

    changed = branchgrpo.run(checkout, ("branchgrpo_mix",), split_noise="independent")[0]
    bad = [s.step for s in changed.steps if not s.ok]
    assert bad and bad[0] == 0  # the first split step
