"""reproduce/parity/awm.py: AWM's own rollout (its pipeline with its SA-Solver, grid and edits) and training-time draw
against flowgrpo's ``awm`` preset, step by step, when AWM_PATH names a checkout of scxue/advantage_weighted_matching
(its code is loaded from there at run time; the project ships none of it)."""

import sys
from pathlib import Path

import pytest
from official_checkouts import needs_checkout

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "reproduce"))

CODE = "awm"
pytestmark = [pytest.mark.usefixtures("one_thread"), needs_checkout(CODE)]


def test_every_awm_setting_equals_the_official_code_step_by_step(reports):
    assert len(reports) == 5
    bad = {name: [s for s in r.steps if not s.ok] for name, r in reports.items() if not r.ok}
    assert not bad, bad
    for r in reports.values():
        print(r.line())


def test_the_rollouts_draw_noise_where_the_official_tau_window_does(reports):
    geneval = reports["awm rollout [geneval] (SA-Solver, tau 0.4)"]
    pickscore = reports["awm rollout [pickscore] (SA-Solver, tau 0)"]
    # τ = 0.4 on the steps landing in [0.3, 0.9] of the edited 14-step grid: σ' = 0.871 ... 0.357
    assert [s.step for s in geneval.steps if s.stochastic[1]] == list(range(3, 11))
    assert not any(s.stochastic[1] for s in pickscore.steps)
    for r in (geneval, pickscore):  # the edited ends: σ_0 = 1 − 1e-3, σ_12 = σ_11 / 2
        assert r.steps[0].sigma[1] == pytest.approx(0.999, abs=1e-7)
        assert r.steps[12].sigma_next[1] == pytest.approx(r.steps[11].sigma_next[1] / 2, rel=1e-7)
        assert not any(any(s.trained) for s in r.steps)


def test_training_times_come_from_the_unedited_grid_t1_only_for_pickscore(reports):
    drawn = {name: [s.step for s in r.steps if s.trained[1]] for name, r in reports.items() if "training times" in name}
    assert drawn["awm training times [geneval] (discrete_wo_init)"] == list(range(1, 12))
    assert drawn["awm training times [ocr] (discrete_wo_init)"] == list(range(1, 12))
    assert drawn["awm training times [pickscore] (discrete)"] == list(range(0, 12))
    assert reports["awm training times [pickscore] (discrete)"].steps[0].sigma == (1.0, 1.0)


@pytest.mark.parametrize("override, broken", [
    ("sampling.plan.grid_ends=exact", "sigma"),  # flowgrpo's grid without AWM's edits
    ("sampling.plan.sa_tau_window=[0.3,1.0]", "stochastic"),  # noise on three more steps than the official code
])
def test_a_changed_plan_is_caught(checkout, override, broken):
    """Negative controls: the same comparison with one setting of flowgrpo's plan changed fails where it should."""
    from parity import awm

    report, _ = awm.compare_rollout(checkout, awm.load_official(checkout), "geneval", "geneval_sd3_no_cfg_1node",
                                    extra=(override,))
    assert not report.ok
    wrong = [s for s in report.steps if not s.ok]
    if broken == "sigma":
        assert wrong[0].step == 0 and wrong[0].sigma == (1.0, pytest.approx(0.999, abs=1e-7))
    else:
        assert [s.step for s in report.steps if s.stochastic[0] != s.stochastic[1]] == [0, 1, 2]
        assert all(s.dx > s.tol_x for s in report.steps[:3])  # the fed ε moves flowgrpo's states there
