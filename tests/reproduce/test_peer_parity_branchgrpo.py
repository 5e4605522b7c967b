"""BranchGRPO and BranchGRPO-Mix step by step against Fredreic1849/BranchGRPO's tree sampler
(reproduce/parity/branchgrpo.py) on a tiny FLUX, where BRANCHGRPO_PATH names a checkout of it (the comparison reads
that code at run time; the project ships none of it). With flowgrpo's split_noise=scaled_compat (the code's form) and
the recipe's options as it resolves them (the float32 grid, integer timesteps, the last step trained, the leaves' x̂0
rewarded): the σ grid, which steps are stochastic and trained, x' of every node and the log-prob of every SDE edge,
within float32 ulps of the values; the rewarded samples and the depth-wise advantages (std_correction 1) equal the
official ones. Each option off differs (the report's controls, and a whole run with train_last off); the measured
deliberate differences (the default split noise, the -Mix window) are what the map says; independent split noise
fails."""

import math
import sys
from pathlib import Path

import pytest
from official_checkouts import needs_checkout, note, number

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "reproduce"))


CODE = "branchgrpo"
pytestmark = [pytest.mark.usefixtures("one_thread"), needs_checkout(CODE)]


@pytest.fixture(scope="module")
def reports(checkout):
    from parity import branchgrpo

    return {r.method.split(" ")[0]: r for r in branchgrpo.run(checkout)}


def test_the_tree_follows_the_official_sampler_step_by_step(reports):
    for report in reports.values():
        bad = [s for s in report.steps if not s.ok]
        assert report.ok, f"{report.method}: {bad[:1]}; {report.notes}"
        assert max(max(abs(a - b) for a, b in (s.sigma, s.sigma_next)) for s in report.steps) == 0.0  # float32 grids
    mix = reports["branchgrpo_mix"]
    assert [s.step for s in mix.steps if s.stochastic[1]] == [0, 1, 2, 3, 6, 9]
    assert [s.step for s in mix.steps if s.trained[1]] == [0, 1, 2, 3, 6, 9]
    tree = reports["branchgrpo"]
    assert all(s.stochastic == (True, True) and s.trained == (True, True) and s.dlogp is not None for s in tree.steps)
    assert "official code's 218" in note(tree, "trained transitions per tree") and "flowgrpo's 218" in note(
        tree, "trained transitions per tree")
    assert "official code's 34" in note(mix, "trained transitions per tree") and "flowgrpo's 34" in note(
        mix, "trained transitions per tree")


def test_the_rewarded_samples_and_the_advantages_are_the_officials(reports):
    """leaf=predicted: each leaf's sample is the official decoded x̂0 (the leaf x' keeps the last step's noise where it is
    SDE); std_correction=1: the official depth-wise advantages (0: sqrt(n/(n-1)) times them at a depth of n nodes)."""
    for report in reports.values():
        sample = note(report, "the rewarded sample")
        assert number(sample, "max |Δ| ") <= number(sample, "(tolerance "), sample
        adv = note(report, "depth-wise advantages")
        assert number(adv, "max |Δ| ") <= number(adv, "(tolerance "), adv
        ratios = note(report, "control, std_correction=0").split("(nodes, ratio): ")[1].split(" =")[0]
        for n, ratio in eval(ratios):  # noqa: S307 (the report's own list of (nodes, ratio))
            assert ratio == pytest.approx(math.sqrt(n / (n - 1)), rel=1e-3)
    assert number(note(reports["branchgrpo"], "the rewarded sample"), "RMS ") > 0.05  # σ_19's noise in the leaf x'


def test_each_option_off_differs(reports):
    """The network told 1000σ, or the float64 grid (σ_6 = 0.875: timestep 875 where the official's 0.87499994 gives
    874), moves x' beyond the tolerance (from step 6 for the grid); without train_last the last step goes untrained."""
    for report in reports.values():
        integer = note(report, "control, sampling.integer_timesteps=false")
        assert number(integer, "max |Δx'| ") > 10 * max(s.tol_x for s in report.steps), integer
        grid = note(report, "control, sampling.plan.grid=linear")
        assert grid.endswith("first step beyond tolerance 6"), grid
    last = note(reports["branchgrpo"], "control, sampling.plan.train_last=false")
    assert "trains steps [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18] (the official" in last


def test_the_measured_differences_are_the_maps(reports):
    for report in reports.values():
        split = note(report, "split noise")
        code = float(split.split("the code's ")[1].split(" ")[0])
        default = float(split.split("(correlated) ")[1].split(" ")[0])
        assert 12 < code < 20 and 0.7 < default < 1.3, split  # c² = 16 against the Gaussian's 1
    window = note(reports["branchgrpo_mix"], "the window")
    assert "official's [1, 2] in every iteration" in window and "25: [1, 2, 4]" in window


def test_without_the_last_step_trained_the_last_row_differs(checkout):
    """A whole run with sampling.plan.train_last=false: only step 19's row differs, in 'trained' alone."""
    from parity import branchgrpo

    changed = branchgrpo.run(checkout, ("branchgrpo",), overrides=("sampling.plan.train_last=false",))[0]
    bad = [s for s in changed.steps if not s.ok]
    assert [s.step for s in bad] == [19] and bad[0].trained == (False, True), bad
    assert bad[0].dx <= bad[0].tol_x and bad[0].dlogp <= bad[0].tol_logp


def test_independent_split_noise_fails(checkout):
    from parity import branchgrpo

    changed = branchgrpo.run(checkout, ("branchgrpo_mix",), split_noise="independent")[0]
    bad = [s.step for s in changed.steps if not s.ok]
    assert bad and bad[0] == 0  # the first split step
